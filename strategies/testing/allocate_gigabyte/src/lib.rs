//! `test-allocate-gigabyte`: a deliberately broken strategy whose `select` allocates and touches 1 GiB.
//!
//! Everything else is valid, so the host loads it; it proves the host's memory cap turns the
//! allocation into a trap (the failed `memory.grow` aborts the guest) and falls back to declared order.

use switchyard_sdk::{
    Candidate, Decision, NoParams, Request, Strategy, StrategyInfo, declared_order,
};

/// Bytes `select` allocates.
pub const ALLOCATION: usize = 1 << 30;

/// Allocates a gigabyte in `select`.
#[derive(Debug)]
pub struct AllocateGigabyte;

impl Strategy for AllocateGigabyte {
    type Params = NoParams;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "test-allocate-gigabyte",
            env!("CARGO_PKG_VERSION"),
            "Test only: select allocates and touches 1 GiB, to exercise the host's memory cap.",
        )
    }

    fn create(_model_id: &str, _params: NoParams) -> Result<Self, String> {
        Ok(Self)
    }

    fn select(&mut self, _request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        // Non-zero fill writes every page; `black_box` keeps the buffer from being optimised away.
        let buffer = core::hint::black_box(vec![1u8; core::hint::black_box(ALLOCATION)]);
        let touched = buffer
            .iter()
            .step_by(4096)
            .map(|&b| u64::from(b))
            .sum::<u64>();
        core::hint::black_box(touched);
        Ok(Decision::new(declared_order(candidates)))
    }
}

switchyard_sdk::export_strategy!(AllocateGigabyte);
