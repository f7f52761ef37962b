//! Lowering `select`'s arguments into a strategy's memory in one pass per value.
//!
//! wasmtime's generic lowering (what `#[derive(Lower)]` and `bindgen!` produce) writes a record field
//! by field, and every field looks the guest's linear memory up again through the instance's
//! canonical options. For `select`, called once per request with a list of candidates of twelve
//! fields each, those lookups were most of the host's side of the call. [`Direct`] wraps a
//! bindgen-generated record and writes its canonical-ABI image, which the record's own
//! [`WriteImage`] impl provides, with one lookup per list; [`Layout`] computes the field offsets
//! from the same ABI facts wasmtime uses, so an image cannot disagree with the type it claims.
//!
//! This is the one crate of the host that implements wasmtime's `unsafe` lowering traits (the
//! daemon forbids `unsafe`). What makes them `unsafe` is the shape of `Lower` (a run of `ValRaw`s)
//! and the type check; [`Direct`] takes both from the wrapped type unchanged. A wrong image would
//! hand the guest wrong values, never write outside the slice wasmtime bounds-checked for it.
//! `switchyard`'s e2e test `select_arguments_reach_the_guest_exactly` pins every field.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use wasmtime::AsContext;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext,
};
use wasmtime::component::{
    ComponentNamedList, ComponentType, Func, Lift, Lower, ResourceAny, TypedFunc,
};

/// A record that can write its own canonical-ABI image.
pub trait WriteImage: Lower {
    /// Writes the value's image into `dst`, which is exactly `Self::ABI.size32` bytes. Bytes of
    /// padding, and of an absent option's payload, may be left as they are.
    fn write_image(&self, dst: &mut [u8]);
}

/// `T`, lowered through its image. Type-checks as `T`: a `Direct<T>` is accepted wherever the
/// component expects `T`'s WIT type.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(transparent)]
pub struct Direct<T>(pub T);

// SAFETY: `Lower`, the ABI and the type check are `T`'s own, which wasmtime's derive vouches for.
unsafe impl<T: WriteImage> ComponentType for Direct<T> {
    type Lower = T::Lower;
    const ABI: CanonicalAbiInfo = T::ABI;
    const MAY_REQUIRE_REALLOC: bool = T::MAY_REQUIRE_REALLOC;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        T::typecheck(ty, types)
    }
}

// SAFETY: flat lowering is `T`'s; the memory lowerings write inside the slice wasmtime checked.
unsafe impl<T: WriteImage> Lower for Direct<T> {
    fn linear_lower_to_flat<U>(
        &self,
        cx: &mut LowerContext<'_, U>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<Self::Lower>,
    ) -> wasmtime::Result<()> {
        self.0.linear_lower_to_flat(cx, ty, dst)
    }

    fn linear_lower_to_memory<U>(
        &self,
        cx: &mut LowerContext<'_, U>,
        _ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        let size = Self::SIZE32;
        self.0.write_image(&mut cx.as_slice_mut()[offset..][..size]);
        Ok(())
    }

    fn linear_store_list_to_memory<U>(
        cx: &mut LowerContext<'_, U>,
        _ty: InterfaceType,
        offset: usize,
        items: &[Self],
    ) -> wasmtime::Result<()> {
        let size = Self::SIZE32;
        let memory = &mut cx.as_slice_mut()[offset..][..items.len() * size];
        for (dst, item) in memory.chunks_exact_mut(size).zip(items) {
            item.0.write_image(dst);
        }
        Ok(())
    }
}

/// Field offsets of a record, computed like the canonical ABI does (each field aligned to its own
/// alignment), from wasmtime's ABI description of each field's type.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    end: u32,
    align: u32,
}

impl Layout {
    pub const fn new() -> Self {
        Self { end: 0, align: 1 }
    }

    /// Places a field of type `T`; returns the layout so far and the field's offset.
    pub const fn field<T: ComponentType>(self) -> (Self, usize) {
        self.place(T::ABI)
    }

    /// Places a field with the given ABI.
    pub const fn place(self, abi: CanonicalAbiInfo) -> (Self, usize) {
        let offset = self.end.next_multiple_of(abi.align32);
        let align = if abi.align32 > self.align {
            abi.align32
        } else {
            self.align
        };
        (
            Self {
                end: offset + abi.size32,
                align,
            },
            offset as usize,
        )
    }

    /// The record's size: the end of its last field rounded up to its alignment.
    pub const fn size(self) -> usize {
        self.end.next_multiple_of(self.align) as usize
    }
}

impl Default for Layout {
    fn default() -> Self {
        Self::new()
    }
}

/// Offset of the payload of an `option<T>`, after its one-byte discriminant.
pub const fn option_payload<T: ComponentType>() -> usize {
    1usize.next_multiple_of(T::ABI.align32 as usize)
}

/// Writes `option<T>` for a numeric `T` at `offset`: the discriminant, then the payload.
pub fn write_option<const N: usize>(
    dst: &mut [u8],
    offset: usize,
    payload_at: usize,
    value: Option<[u8; N]>,
) {
    match value {
        None => dst[offset] = 0,
        Some(bytes) => {
            dst[offset] = 1;
            dst[offset + payload_at..][..N].copy_from_slice(&bytes);
        }
    }
}

/// `select`'s arguments as a typed function sees them: the router, the request, the candidates.
pub type SelectArgs<'a, Request, Candidate> =
    (ResourceAny, &'a Direct<Request>, &'a [Direct<Candidate>]);

/// A `[method]router.select` export, checked once against the argument types `(ResourceAny,
/// &Direct<Request>, &[Direct<Candidate>])` and the result `Return`, then handed out per call with
/// the call's own lifetimes (a `TypedFunc` names its argument lifetimes; the check does not depend
/// on them).
pub struct SelectFunc<Request, Candidate, Return> {
    func: Func,
    _types: PhantomData<fn(Request, Candidate) -> Return>,
}

impl<Request, Candidate, Return> Clone for SelectFunc<Request, Candidate, Return> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Request, Candidate, Return> Copy for SelectFunc<Request, Candidate, Return> {}

impl<Request, Candidate, Return> SelectFunc<Request, Candidate, Return>
where
    Request: WriteImage + Sync,
    Candidate: WriteImage + Sync,
    Return: ComponentNamedList + Lift + 'static,
{
    /// Type-checks `func` against the arguments and result.
    pub fn new(store: impl AsContext, func: Func) -> wasmtime::Result<Self> {
        func.typed::<SelectArgs<'_, Request, Candidate>, Return>(store)?;
        Ok(Self {
            func,
            _types: PhantomData,
        })
    }

    /// The typed function for one call.
    pub fn typed<'a>(&self) -> TypedFunc<SelectArgs<'a, Request, Candidate>, Return> {
        // SAFETY: `new` checked this signature; it differs from the checked one only in lifetimes,
        // which the component type check does not see.
        unsafe { TypedFunc::new_unchecked(self.func) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_the_canonical_abi() {
        // record { a: u8, b: u64, c: u32, d: option<f64> }: 0, 8, 16, 24 (payload at 32), size 40.
        let l = Layout::new();
        let (l, a) = l.field::<u8>();
        let (l, b) = l.field::<u64>();
        let (l, c) = l.field::<u32>();
        let (l, d) = l.field::<Option<f64>>();
        assert_eq!((a, b, c, d), (0, 8, 16, 24));
        assert_eq!(option_payload::<f64>(), 8);
        assert_eq!(l.size(), 40);
        let (l, _) = Layout::new().field::<u32>();
        let (l, _) = l.field::<bool>();
        assert_eq!(l.size(), 8);
    }

    #[test]
    fn options_write_their_discriminant_and_payload() {
        let mut dst = [0xAAu8; 16];
        write_option(&mut dst, 0, 8, Some(2.5f64.to_le_bytes()));
        assert_eq!(dst[0], 1);
        assert_eq!(
            f64::from_le_bytes(dst[8..16].try_into().unwrap_or_default()),
            2.5
        );
        write_option::<8>(&mut dst, 0, 8, None);
        assert_eq!(dst[0], 0);
    }
}
