"""Write Switchyard routing strategies in Python, as WebAssembly components.

The same shape as the Rust SDK (`switchyard-sdk`): subclass `Strategy`, declare `Params` once as a
dataclass (the JSON Schema and the parser both come from it), implement `info`, `create` and
`select` (`refresh_upstreams`, `observe`, `status` and `tick` are optional), and call
`export_strategy` on the class. `switchyard-strategy build my_strategy.py -o my_strategy.wasm`
makes the component; everything also runs natively, so the logic is unit-tested with plain Python
(there `log` is a no-op).

    from dataclasses import dataclass
    from switchyard_strategy import Decision, Strategy, StrategyInfo, declared_order, export_strategy

    @dataclass
    class Params:
        pass

    class InOrder(Strategy):
        Params = Params

        @staticmethod
        def info():
            return StrategyInfo("in_order", "0.1.0", "Routes in declared order.")

        @classmethod
        def create(cls, model_id, params):
            return cls()

        def select(self, request, candidates):
            return Decision(declared_order(candidates))

    export_strategy(InOrder)
"""

from .order import (
    affinity_first,
    affinity_pinned,
    declared_order,
    declared_positions,
    order_of_positions,
    primary_then_declared,
    priority_tiers,
    usable_weight,
    weighted_draw,
    weighted_shuffle,
)
from .params import NoParams, ParamsError, params_schema, parse_params
from .prefill import least_loaded, p2c, prefill_aware_primary
from .rng import Rng
from .types import (
    IN_COMPONENT,
    Candidate,
    CircuitState,
    Decision,
    HedgeRequest,
    Modalities,
    Observation,
    PrefillPolicy,
    Pricing,
    Request,
    StrategyInfo,
    Upstream,
)

# Version of the `switchyard:router` WIT package this SDK implements; `switchyard-strategy build`
# stamps it into the component's `switchyard-router-api` section, which the host reads before
# compiling. The package version follows it.
API_VERSION = "0.2.0"

if IN_COMPONENT:
    from wit_world.imports.host import LogLevel  # type: ignore[import-not-found]
    from wit_world.imports.host import log as _host_log  # type: ignore[import-not-found]
else:
    from enum import Enum

    class LogLevel(Enum):
        TRACE = 0
        DEBUG = 1
        INFO = 2
        WARN = 3
        ERROR = 4

    _host_log = None


def log(level: "LogLevel", message: str) -> None:
    """Sends a message to the host's log, tagged with the strategy and model. A no-op natively."""
    if _host_log is not None:
        _host_log(level, message)


class Strategy:
    """A routing strategy: one instance per canonical model, owned by the host for the life of the
    model. Calls on one instance never overlap. An exception raised by `create` or `select` is
    reported to the host as the call's error (`select` then falls back to declared order)."""

    #: The model's `router_params`, as a dataclass (see `switchyard_strategy.params`).
    Params = NoParams

    @staticmethod
    def info() -> StrategyInfo:
        """Name, version and description, for discovery, logs and error messages."""
        raise NotImplementedError("Strategy.info")

    @classmethod
    def create(cls, model_id: str, params) -> "Strategy":
        """Builds the router for `model_id` from parsed params."""
        raise NotImplementedError("Strategy.create")

    def refresh_upstreams(self, upstreams) -> None:
        """The model's effective upstreams in declared order; called before the first `select`
        and after any change."""

    def select(self, request, candidates) -> Decision:
        """Orders the candidates: a `Decision` listing declared indexes, primary first. Use
        `Rng.for_request(request)` for randomness so a decision is reproducible."""
        raise NotImplementedError("Strategy.select")

    def observe(self, observation) -> None:
        """One call per finished attempt of a request this router ordered."""

    def status(self) -> str:
        """JSON shown in the host's health and routing endpoints."""
        return "{}"

    def tick(self, now_ms: int) -> None:
        """Called at the host's tick interval, for time-based state."""


_exported = None


def export_strategy(cls):
    """Makes `cls` the strategy of the component being built. Call it once, in the module
    passed to `switchyard-strategy build`; returns `cls`, so it also works as a decorator."""
    global _exported
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError("export_strategy expects a subclass of switchyard_strategy.Strategy")
    # Fail at build time, not in the host, when the params class cannot be described.
    params_schema(cls.Params)
    _exported = cls
    return cls


def exported_strategy():
    """The class passed to `export_strategy`, or None."""
    return _exported


__all__ = [
    "API_VERSION",
    "Candidate",
    "CircuitState",
    "Decision",
    "HedgeRequest",
    "LogLevel",
    "Modalities",
    "NoParams",
    "Observation",
    "ParamsError",
    "PrefillPolicy",
    "Pricing",
    "Request",
    "Rng",
    "Strategy",
    "StrategyInfo",
    "Upstream",
    "affinity_first",
    "affinity_pinned",
    "declared_order",
    "declared_positions",
    "export_strategy",
    "exported_strategy",
    "least_loaded",
    "log",
    "order_of_positions",
    "p2c",
    "params_schema",
    "parse_params",
    "prefill_aware_primary",
    "primary_then_declared",
    "priority_tiers",
    "usable_weight",
    "weighted_draw",
    "weighted_shuffle",
]
