//! The canonical-ABI images of `select`'s arguments in 0.2.0 (`request`, `candidate`), written by
//! [`switchyard_select_abi::Direct`] in one pass instead of field by field (see that crate).
//!
//! Each field is written with its WIT type, in declaration order, and placed by that type's ABI;
//! e2e `select_arguments_reach_the_guest_exactly` reads every field back from a real guest.

use switchyard_select_abi::{Image, WriteImage};

use super::wit;

impl WriteImage for wit::Candidate {
    fn write_image(&self, image: &mut Image<'_>) {
        image
            .scalar::<u32, _>(self.index.to_le_bytes())
            .scalar::<f64, _>(self.weight.to_le_bytes())
            .scalar::<i32, _>(self.priority.to_le_bytes())
            .scalar::<f64, _>(self.availability.to_le_bytes())
            // Enum cases are numbered in declaration order.
            .scalar::<wit::CircuitState, _>([match self.circuit {
                wit::CircuitState::Closed => 0,
                wit::CircuitState::Open => 1,
                wit::CircuitState::HalfOpen => 2,
            }])
            .scalar::<u64, _>(self.prefill_backlog_tokens.to_le_bytes())
            .scalar::<u32, _>(self.inflight_elephants.to_le_bytes())
            .scalar::<u64, _>(self.uncached_prompt_tokens.to_le_bytes())
            .option::<f64, _>(self.ttft_ms.map(f64::to_le_bytes))
            .option::<f64, _>(self.latency_ms.map(f64::to_le_bytes))
            .scalar::<u32, _>(self.inflight_requests.to_le_bytes())
            .scalar::<bool, _>([u8::from(self.affinity_pinned)]);
    }
}

impl WriteImage for wit::Request {
    fn write_image(&self, image: &mut Image<'_>) {
        // Flags are bits in declaration order.
        let modalities = [
            wit::Modalities::IMAGE,
            wit::Modalities::AUDIO,
            wit::Modalities::VIDEO,
        ]
        .iter()
        .enumerate()
        .fold(0u8, |bits, (bit, flag)| {
            bits | (u8::from(self.modalities.contains(*flag)) << bit)
        });
        let prefill = &self.prefill;
        image
            .scalar::<u64, _>(self.caller_hash.to_le_bytes())
            .scalar::<u32, _>(self.prompt_tokens.to_le_bytes())
            .option::<u32, _>(self.max_tokens.map(u32::to_le_bytes))
            .scalar::<bool, _>([u8::from(self.stream)])
            .scalar::<wit::Modalities, _>([modalities])
            .scalar::<u64, _>(self.seed.to_le_bytes())
            .scalar::<u64, _>(self.now_ms.to_le_bytes())
            .record::<wit::PrefillPolicy>(|image| {
                image
                    .scalar::<bool, _>([u8::from(prefill.enabled)])
                    .scalar::<u64, _>(prefill.intervene_tokens.to_le_bytes())
                    .scalar::<u64, _>(prefill.elephant_tokens.to_le_bytes())
                    .scalar::<u32, _>(prefill.elephant_limit.to_le_bytes());
            })
            .option::<f64, _>(self.remaining_budget_usd.map(f64::to_le_bytes));
    }
}
