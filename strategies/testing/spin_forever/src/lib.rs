//! `test-spin-forever`: a deliberately broken strategy whose `select` never returns.
//!
//! Everything else is valid, so the host loads it; it proves the host's per-call deadline
//! (epoch interruption or fuel) stops a runaway guest and falls back to declared order.

use switchyard_sdk::{Candidate, Decision, NoParams, Request, Strategy, StrategyInfo};

/// Spins in `select`.
#[derive(Debug)]
pub struct SpinForever;

impl Strategy for SpinForever {
    type Params = NoParams;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "test-spin-forever",
            env!("CARGO_PKG_VERSION"),
            "Test only: select loops forever, to exercise the host's deadline.",
        )
    }

    fn create(_model_id: &str, _params: NoParams) -> Result<Self, String> {
        Ok(Self)
    }

    fn select(&mut self, request: &Request, _candidates: &[Candidate]) -> Result<Decision, String> {
        // `black_box` makes the counter opaque, so the optimiser can neither remove nor shortcut the loop.
        let mut counter = core::hint::black_box(request.seed);
        loop {
            counter = core::hint::black_box(counter.wrapping_add(1));
        }
    }
}

switchyard_sdk::export_strategy!(SpinForever);
