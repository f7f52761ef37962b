"""`{{name}}`: a weighted, prefill-aware primary, the rest in declared order, and (by default) the
caller's affinity-pinned upstream first. Scaffolded by `switchyard strategies new`; change
`select` to route your way."""

from dataclasses import dataclass, field

from switchyard_strategy import (
    Decision,
    Rng,
    Strategy,
    StrategyInfo,
    affinity_first,
    declared_order,
    export_strategy,
    prefill_aware_primary,
    primary_then_declared,
)


@dataclass
class Params:
    """`router_params` of `{{name}}`. Unknown keys are rejected."""

    honour_affinity: bool = field(
        default=True,
        metadata={"description": "Put the caller's affinity-pinned upstream (its warm prompt cache) first."},
    )


class Router(Strategy):
    Params = Params

    def __init__(self, honour_affinity: bool) -> None:
        self.honour_affinity = honour_affinity

    @staticmethod
    def info():
        return StrategyInfo("{{name}}", "0.1.0", "Weighted prefill-aware primary, declared fallbacks.")

    @classmethod
    def create(cls, model_id, params):
        return cls(params.honour_affinity)

    def select(self, request, candidates):
        primary = prefill_aware_primary(candidates, request.prefill, Rng.for_request(request))
        if primary is None:
            order = declared_order(candidates)
        else:
            order = primary_then_declared(candidates, primary)
        if self.honour_affinity:
            affinity_first(candidates, order)
        return Decision(order)


export_strategy(Router)
