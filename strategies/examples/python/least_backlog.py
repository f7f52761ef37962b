"""`least_backlog` in Python: the primary is the candidate with the least prefill backlog in the
highest priority tier; ties go to a weighted draw seeded by the request; the rest follow in
declared order. The same strategy is in `../js/` and (as a scaffold) in Rust, so the three SDKs
can be compared on one workload."""

from dataclasses import dataclass, field

from switchyard_strategy import (
    Decision,
    Rng,
    Strategy,
    StrategyInfo,
    export_strategy,
    primary_then_declared,
    priority_tiers,
    weighted_draw,
)


@dataclass
class Params:
    """`router_params` of `least_backlog_py`."""

    # Backlogs within this many tokens of the least count as tied.
    tolerance_tokens: int = field(
        default=0, metadata={"description": "Backlogs within this many tokens of the least tie."}
    )


class LeastBacklog(Strategy):
    Params = Params

    def __init__(self, tolerance_tokens: int) -> None:
        self.tolerance = tolerance_tokens
        self.selects = 0

    @staticmethod
    def info():
        return StrategyInfo(
            "least_backlog_py", "0.1.0", "Least prefill backlog in the top tier; weight breaks ties."
        )

    @classmethod
    def create(cls, model_id, params):
        if params.tolerance_tokens < 0:
            raise ValueError("tolerance_tokens must not be negative")
        return cls(params.tolerance_tokens)

    def select(self, request, candidates):
        self.selects += 1
        if not candidates:
            return Decision([])
        top = priority_tiers(candidates)[0]
        least = min(candidates[p].prefill_backlog_tokens for p in top)
        tied = [p for p in top if candidates[p].prefill_backlog_tokens <= least + self.tolerance]
        drawn = weighted_draw([candidates[p].weight for p in tied], Rng.for_request(request))
        primary = tied[drawn] if drawn is not None else tied[0]
        return Decision(primary_then_declared(candidates, primary))

    def status(self):
        return '{"selects": %d}' % self.selects


export_strategy(LeastBacklog)
