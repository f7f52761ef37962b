//! The daemon's global allocator, and the call that returns what it has freed to the OS.
//!
//! mimalloc keeps memory that was freed committed for a while, so the next allocation need not
//! fault it in again, and gives it back only when the allocator runs again after that delay: a
//! process that goes quiet keeps whatever its last burst freed. Startup is such a burst (the
//! configuration parsed, the strategies compiled or loaded from the cache, an instance
//! created per model) followed by an idle gateway, which held 7 MiB of freed memory (10 on the
//! dev build) for as long as no request came. [`return_freed_memory`] is for those moments.
//!
//! This crate holds the daemon's one call into the allocator's C API (the daemon forbids
//! `unsafe`).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block of at least this size has (`MI_MAX_ALIGN_SIZE`): its size
/// classes above one word are multiples of it, and its pages start on it.
const NATURAL_ALIGN: usize = 16;

/// The allocator to install with `#[global_allocator]`: mimalloc, asked for an alignment only
/// when a type needs more than its blocks have anyway.
///
/// The `mimalloc` crate's allocator calls `mi_malloc_aligned` for every allocation, whose checks
/// of the alignment cost ~15 instructions more than `mi_malloc` on the ~80 allocations of a
/// request (callgrind); almost no type asks for more than 16 bytes.
pub struct GlobalAllocator;

/// Whether a block of `size` bytes from the plain entry points is aligned to `align` (the rule
/// the standard library's `System` allocator applies to `malloc`).
fn naturally_aligned(align: usize, size: usize) -> bool {
    align <= NATURAL_ALIGN && align <= size
}

// SAFETY: every entry point hands mimalloc back only pointers it returned; the plain ones are
// used only where their blocks meet the layout's alignment (`naturally_aligned`).
unsafe impl GlobalAlloc for GlobalAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation calls take any size and a power-of-two alignment.
        unsafe {
            if naturally_aligned(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if naturally_aligned(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the trait's contract), so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the block it moves to keeps the
        // alignment as `alloc` would give it for `new_size`.
        unsafe {
            if naturally_aligned(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// Gives the memory this thread's heap and the process's arenas hold freed back to the OS now,
/// instead of at the allocator's next use after its purge delay. Costs a walk of the thread's
/// heap (microseconds on an idle one); memory in use is not touched.
pub fn return_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers and only releases pages without a live allocation;
    // any thread may call it at any time.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOCATOR: GlobalAllocator = GlobalAllocator;

    const MIB: usize = 1 << 20;

    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: usize = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// Every layout gets a block aligned as it asks, through each entry point, and a block that
    /// grows or shrinks keeps its contents and its alignment.
    #[test]
    fn blocks_are_aligned_as_their_layouts_ask_and_keep_their_contents() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [align, 8, 16, 24, 48, 100, 1000, 70_000] {
                let Ok(layout) = Layout::from_size_align(size.max(align), align) else {
                    continue;
                };
                // SAFETY: non-zero sizes; each block is freed once, with the layout it has.
                unsafe {
                    let zeroed = GlobalAllocator.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0, "{layout:?}");
                    assert!(
                        (0..layout.size()).all(|i| *zeroed.add(i) == 0),
                        "{layout:?}"
                    );
                    GlobalAllocator.dealloc(zeroed, layout);

                    let block = GlobalAllocator.alloc(layout);
                    assert_eq!(block as usize % align, 0, "{layout:?}");
                    for i in 0..layout.size() {
                        *block.add(i) = i as u8;
                    }
                    let mut current = (block, layout);
                    for new_size in [layout.size() * 3, layout.size().div_ceil(2).max(align)] {
                        let (block, from) = current;
                        let moved = GlobalAllocator.realloc(block, from, new_size);
                        assert_eq!(moved as usize % align, 0, "{from:?} to {new_size}");
                        let kept = layout.size().min(new_size);
                        assert!((0..kept).all(|i| *moved.add(i) == i as u8), "{from:?}");
                        current = (moved, Layout::from_size_align_unchecked(new_size, align));
                    }
                    GlobalAllocator.dealloc(current.0, current.1);
                }
            }
        }
    }

    /// Without the call the freed 96 MiB stay resident (mimalloc purges them only when it next
    /// runs after its delay, and nothing here allocates again); with it they leave, and what is
    /// still in use keeps its contents.
    #[test]
    fn freed_memory_leaves_the_process_and_memory_in_use_stays() {
        let kept: Vec<Vec<u8>> = (0..16).map(|i| vec![i as u8 + 1; 64 * 1024]).collect();
        let freed: Vec<Vec<u8>> = (0..1536).map(|i| vec![i as u8 | 1; 64 * 1024]).collect();
        let with_both = resident_bytes();
        assert!(with_both > 96 * MIB, "resident: {with_both} bytes");
        drop(freed);
        return_freed_memory();
        let after = resident_bytes();
        assert!(
            after + 64 * MIB < with_both,
            "resident {with_both} bytes before, {after} after giving back 96 MiB"
        );
        for (i, block) in kept.iter().enumerate() {
            assert!(block.iter().all(|&b| b == i as u8 + 1));
        }
        let again = vec![7u8; MIB];
        assert_eq!(again.iter().map(|&b| b as usize).sum::<usize>(), 7 * MIB);
    }
}
