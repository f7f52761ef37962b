//! The canonical-ABI images of `select`'s arguments in 0.2.0 (`request`, `candidate`), written by
//! [`switchyard_select_abi::Direct`] in one pass instead of field by field (see that crate).
//!
//! Offsets come from [`Layout`], fed the fields' WIT types in declaration order; the sizes are
//! checked against the bindgen types' at compile time, and e2e `select_arguments_reach_the_guest_exactly`
//! reads every field back from a real guest.

use switchyard_select_abi::{Layout, WriteImage, option_payload, write_option};
use wasmtime::component::ComponentType;

use super::wit;

/// Offsets of `candidate`'s fields in declaration order, and its size.
const CANDIDATE: ([usize; 12], usize) = {
    let l = Layout::new();
    let (l, index) = l.field::<u32>();
    let (l, weight) = l.field::<f64>();
    let (l, priority) = l.field::<i32>();
    let (l, availability) = l.field::<f64>();
    let (l, circuit) = l.field::<wit::CircuitState>();
    let (l, backlog) = l.field::<u64>();
    let (l, elephants) = l.field::<u32>();
    let (l, uncached) = l.field::<u64>();
    let (l, ttft) = l.field::<Option<f64>>();
    let (l, latency) = l.field::<Option<f64>>();
    let (l, inflight) = l.field::<u32>();
    let (l, pinned) = l.field::<bool>();
    (
        [
            index,
            weight,
            priority,
            availability,
            circuit,
            backlog,
            elephants,
            uncached,
            ttft,
            latency,
            inflight,
            pinned,
        ],
        l.size(),
    )
};

/// Offsets of `request`'s fields in declaration order (the `prefill` record's four inlined), and
/// its size.
const REQUEST: ([usize; 12], usize) = {
    let l = Layout::new();
    let (l, caller_hash) = l.field::<u64>();
    let (l, prompt_tokens) = l.field::<u32>();
    let (l, max_tokens) = l.field::<Option<u32>>();
    let (l, stream) = l.field::<bool>();
    let (l, modalities) = l.field::<wit::Modalities>();
    let (l, seed) = l.field::<u64>();
    let (l, now_ms) = l.field::<u64>();
    let (l, prefill) = l.field::<wit::PrefillPolicy>();
    let (l, budget) = l.field::<Option<f64>>();
    let p = Layout::new();
    let (p, enabled) = p.field::<bool>();
    let (p, intervene) = p.field::<u64>();
    let (p, elephant_tokens) = p.field::<u64>();
    let (p, elephant_limit) = p.field::<u32>();
    assert!(p.size() == <wit::PrefillPolicy as ComponentType>::SIZE32);
    (
        [
            caller_hash,
            prompt_tokens,
            max_tokens,
            stream,
            modalities,
            seed,
            now_ms,
            prefill + enabled,
            prefill + intervene,
            prefill + elephant_tokens,
            prefill + elephant_limit,
            budget,
        ],
        l.size(),
    )
};

// The images below are only right for the types they were laid out from.
const _: () = {
    assert!(CANDIDATE.1 == <wit::Candidate as ComponentType>::SIZE32);
    assert!(REQUEST.1 == <wit::Request as ComponentType>::SIZE32);
    // One byte each: a three-case enum and three flags.
    assert!(<wit::CircuitState as ComponentType>::SIZE32 == 1);
    assert!(<wit::Modalities as ComponentType>::SIZE32 == 1);
};

fn put<const N: usize>(dst: &mut [u8], at: usize, bytes: [u8; N]) {
    dst[at..at + N].copy_from_slice(&bytes);
}

impl WriteImage for wit::Candidate {
    fn write_image(&self, dst: &mut [u8]) {
        let [
            index,
            weight,
            priority,
            availability,
            circuit,
            backlog,
            elephants,
            uncached,
            ttft,
            latency,
            inflight,
            pinned,
        ] = CANDIDATE.0;
        put(dst, index, self.index.to_le_bytes());
        put(dst, weight, self.weight.to_le_bytes());
        put(dst, priority, self.priority.to_le_bytes());
        put(dst, availability, self.availability.to_le_bytes());
        // Enum cases are numbered in declaration order.
        dst[circuit] = match self.circuit {
            wit::CircuitState::Closed => 0,
            wit::CircuitState::Open => 1,
            wit::CircuitState::HalfOpen => 2,
        };
        put(dst, backlog, self.prefill_backlog_tokens.to_le_bytes());
        put(dst, elephants, self.inflight_elephants.to_le_bytes());
        put(dst, uncached, self.uncached_prompt_tokens.to_le_bytes());
        let payload = option_payload::<f64>();
        write_option(dst, ttft, payload, self.ttft_ms.map(f64::to_le_bytes));
        write_option(dst, latency, payload, self.latency_ms.map(f64::to_le_bytes));
        put(dst, inflight, self.inflight_requests.to_le_bytes());
        dst[pinned] = u8::from(self.affinity_pinned);
    }
}

impl WriteImage for wit::Request {
    fn write_image(&self, dst: &mut [u8]) {
        let [
            caller_hash,
            prompt_tokens,
            max_tokens,
            stream,
            modalities,
            seed,
            now_ms,
            enabled,
            intervene,
            elephant_tokens,
            elephant_limit,
            budget,
        ] = REQUEST.0;
        put(dst, caller_hash, self.caller_hash.to_le_bytes());
        put(dst, prompt_tokens, self.prompt_tokens.to_le_bytes());
        write_option(
            dst,
            max_tokens,
            option_payload::<u32>(),
            self.max_tokens.map(u32::to_le_bytes),
        );
        dst[stream] = u8::from(self.stream);
        // Flags are bits in declaration order.
        dst[modalities] = [
            wit::Modalities::IMAGE,
            wit::Modalities::AUDIO,
            wit::Modalities::VIDEO,
        ]
        .iter()
        .enumerate()
        .fold(0u8, |bits, (bit, flag)| {
            bits | (u8::from(self.modalities.contains(*flag)) << bit)
        });
        put(dst, seed, self.seed.to_le_bytes());
        put(dst, now_ms, self.now_ms.to_le_bytes());
        dst[enabled] = u8::from(self.prefill.enabled);
        put(dst, intervene, self.prefill.intervene_tokens.to_le_bytes());
        put(
            dst,
            elephant_tokens,
            self.prefill.elephant_tokens.to_le_bytes(),
        );
        put(
            dst,
            elephant_limit,
            self.prefill.elephant_limit.to_le_bytes(),
        );
        write_option(
            dst,
            budget,
            option_payload::<f64>(),
            self.remaining_budget_usd.map(f64::to_le_bytes),
        );
    }
}
