//! Lowering `select`'s arguments into a strategy's memory in one pass per value.
//!
//! wasmtime's generic lowering (what `#[derive(Lower)]` and `bindgen!` produce) writes a record field
//! by field, and every field looks the guest's linear memory up again through the instance's
//! canonical options. For `select`, called once per request with a list of candidates of twelve
//! fields each, those lookups were most of the host's side of the call. [`Direct`] wraps a
//! bindgen-generated record and writes its canonical-ABI image, which the record's own
//! [`WriteImage`] impl provides, with one lookup per list; [`Image`] places each field from the
//! same ABI facts wasmtime uses (the field's WIT type), so an image cannot disagree with the type
//! it claims.
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
    /// Writes the value's fields, in declaration order, into `image`. Bytes of padding, and of an
    /// absent option's payload, may be left as they are.
    fn write_image(&self, image: &mut Image<'_>);
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
        write::<T>(&self.0, &mut cx.as_slice_mut()[offset..][..size]);
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
            write::<T>(&item.0, dst);
        }
        Ok(())
    }
}

/// Writes `value`'s image into `dst`, exactly `T`'s size.
fn write<T: WriteImage>(value: &T, dst: &mut [u8]) {
    let mut image = Image { dst, at: 0 };
    value.write_image(&mut image);
    // The fields placed by the WIT types they claim end where the record does.
    debug_assert_eq!(image.at.next_multiple_of(T::ALIGN32 as usize), T::SIZE32);
}

/// A record's image being written: each field goes at the next offset its WIT type's alignment
/// allows, as the canonical ABI lays records out, from wasmtime's own description of the type.
#[derive(Debug)]
pub struct Image<'a> {
    dst: &'a mut [u8],
    /// Where the last field placed ends.
    at: usize,
}

impl Image<'_> {
    /// Places a field of WIT type `T`; returns its offset.
    fn place<T: ComponentType>(&mut self) -> usize {
        let at = self.at.next_multiple_of(T::ALIGN32 as usize);
        self.at = at + T::SIZE32;
        at
    }

    /// A field of scalar WIT type `T` (an integer, a float, a `bool`, a one-byte enum or flags)
    /// holding the little-endian `bytes`.
    pub fn scalar<T: ComponentType, const N: usize>(&mut self, bytes: [u8; N]) -> &mut Self {
        const {
            assert!(
                T::ABI.size32 as usize == N,
                "the bytes are not the type's size"
            )
        };
        let at = self.place::<T>();
        self.dst[at..at + N].copy_from_slice(&bytes);
        self
    }

    /// A field of WIT type `option<T>`, `T` scalar: the discriminant, then the payload aligned
    /// for `T`.
    pub fn option<T: ComponentType, const N: usize>(
        &mut self,
        value: Option<[u8; N]>,
    ) -> &mut Self {
        const {
            assert!(
                T::ABI.size32 as usize == N,
                "the bytes are not the type's size"
            )
        };
        let at = self.place::<Option<T>>();
        match value {
            None => self.dst[at] = 0,
            Some(bytes) => {
                self.dst[at] = 1;
                let payload = at + 1usize.next_multiple_of(T::ALIGN32 as usize);
                self.dst[payload..payload + N].copy_from_slice(&bytes);
            }
        }
        self
    }

    /// A field of record type `T`, whose own fields `fields` writes. Its start is aligned for
    /// its widest field, so its fields land where they would in an image of their own.
    pub fn record<T: ComponentType>(&mut self, fields: impl FnOnce(&mut Self)) -> &mut Self {
        let start = self.place::<T>();
        self.at = start;
        fields(self);
        debug_assert_eq!(
            self.at.next_multiple_of(T::ALIGN32 as usize),
            start + T::SIZE32
        );
        self.at = start + T::SIZE32;
        self
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
    fn fields_are_placed_like_the_canonical_abi() {
        // record { a: u8, b: u64, c: u32, d: option<f64> }: 0, 8, 16, 24 (payload at 32), size 40.
        let mut dst = [0xAAu8; 40];
        let mut image = Image {
            dst: &mut dst,
            at: 0,
        };
        image
            .scalar::<u8, _>([7])
            .scalar::<u64, _>(9u64.to_le_bytes())
            .scalar::<u32, _>(11u32.to_le_bytes())
            .option::<f64, _>(Some(2.5f64.to_le_bytes()));
        assert_eq!(image.at, 40);
        assert_eq!(dst[0], 7);
        assert_eq!(dst[8..16], 9u64.to_le_bytes());
        assert_eq!(dst[16..20], 11u32.to_le_bytes());
        assert_eq!(dst[24], 1);
        assert_eq!(dst[32..40], 2.5f64.to_le_bytes());
        // record { a: u32, b: bool }: size 8 (5 rounded up to 4).
        let mut dst = [0u8; 8];
        let mut image = Image {
            dst: &mut dst,
            at: 0,
        };
        image.scalar::<u32, _>([0; 4]).scalar::<bool, _>([1]);
        assert_eq!(image.at.next_multiple_of(4), 8);
    }

    #[test]
    fn options_write_their_discriminant_and_payload() {
        let mut dst = [0xAAu8; 16];
        let mut image = Image {
            dst: &mut dst,
            at: 0,
        };
        image.option::<f64, _>(Some(2.5f64.to_le_bytes()));
        assert_eq!(dst[0], 1);
        assert_eq!(dst[8..16], 2.5f64.to_le_bytes());
        let mut image = Image {
            dst: &mut dst,
            at: 0,
        };
        image.option::<f64, 8>(None);
        assert_eq!(dst[0], 0);
        assert_eq!(
            dst[8..16],
            2.5f64.to_le_bytes(),
            "an absent payload is left alone"
        );
    }

    #[test]
    fn a_nested_record_keeps_its_own_layout() {
        // record { a: u8, r: record { x: bool, y: u64 } }: r at 8, y at 16, size 24.
        let mut dst = [0u8; 24];
        let mut image = Image {
            dst: &mut dst,
            at: 0,
        };
        image.scalar::<u8, _>([1]).record::<(bool, u64)>(|r| {
            r.scalar::<bool, _>([1])
                .scalar::<u64, _>(5u64.to_le_bytes());
        });
        assert_eq!(image.at, 24);
        assert_eq!(dst[8], 1);
        assert_eq!(dst[16..24], 5u64.to_le_bytes());
    }
}
