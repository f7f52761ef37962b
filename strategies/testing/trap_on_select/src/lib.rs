//! `test-trap-on-select`: a deliberately broken strategy whose `select` panics, which traps the guest.
//!
//! Everything else is valid, so the host loads it; it proves the host survives a trap, discards the
//! instance and falls back to declared order.

use switchyard_sdk::{
    Candidate, Decision, LogLevel, NoParams, Request, Strategy, StrategyInfo, log,
};

/// Panics in `select`.
#[derive(Debug)]
pub struct TrapOnSelect;

impl Strategy for TrapOnSelect {
    type Params = NoParams;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "test-trap-on-select",
            env!("CARGO_PKG_VERSION"),
            "Test only: select panics (a trap), to exercise the host's fallback.",
        )
    }

    fn create(_model_id: &str, _params: NoParams) -> Result<Self, String> {
        Ok(Self)
    }

    fn select(
        &mut self,
        _request: &Request,
        _candidates: &[Candidate],
    ) -> Result<Decision, String> {
        // Also the one built component that imports `host.log`, so the host's log plumbing is covered.
        log(LogLevel::Warn, "test-trap-on-select: about to trap");
        panic!("test-trap-on-select: select always traps");
    }
}

switchyard_sdk::export_strategy!(TrapOnSelect);
