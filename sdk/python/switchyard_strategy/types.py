"""The WIT records a strategy sees, under their Python names.

Inside a component these are componentize-py's generated classes (`wit_world.imports.types`), so
nothing is converted on the hot path. Natively (unit tests, no component) the same records are
defined here with test-friendly defaults: the field names and order are those of the generated
classes (`tests/test_bindings.py` compares them), so code written against one runs on the other.
"""

import dataclasses
from dataclasses import dataclass, field
from enum import Enum, Flag, auto
from typing import List, Optional

try:
    from wit_world.imports.types import (  # type: ignore[import-not-found]
        Candidate,
        CircuitState,
        HedgeRequest,
        Modalities,
        Observation,
        PrefillPolicy,
        Pricing,
        Request,
        StrategyInfo,
        Upstream,
    )
    from wit_world.imports.types import Decision as _WitDecision  # type: ignore[import-not-found]

    IN_COMPONENT = True
except ImportError:
    IN_COMPONENT = False

    @dataclass
    class Pricing:
        """Prices in USD per million tokens."""

        prompt: float = 0.0
        completion: float = 0.0
        input_cache_reads: float = 0.0
        input_cache_writes: float = 0.0

    @dataclass
    class Upstream:
        """One effective upstream of a model (its index in the model's `route:` list)."""

        index: int = 0
        endpoint_id: str = ""
        provider: str = ""
        base_url: str = ""
        provider_model_id: str = ""
        weight: float = 1.0
        priority: int = 0
        input_modalities: List[str] = field(default_factory=list)
        pricing: Optional[Pricing] = None
        metadata_json: str = "{}"

    class Modalities(Flag):
        """Non-text inputs a request carries."""

        IMAGE = auto()
        AUDIO = auto()
        VIDEO = auto()

    @dataclass
    class PrefillPolicy:
        """The host's prefill-aware routing knobs; the defaults are the host's."""

        enabled: bool = True
        intervene_tokens: int = 50_000
        elephant_tokens: int = 200_000
        elephant_limit: int = 1

    @dataclass
    class Request:
        """What the host knows about one request, reduced to numbers."""

        caller_hash: int = 0
        prompt_tokens: int = 0
        max_tokens: Optional[int] = None
        stream: bool = False
        modalities: Modalities = Modalities(0)
        seed: int = 0
        now_ms: int = 0
        prefill: PrefillPolicy = field(default_factory=PrefillPolicy)
        remaining_budget_usd: Optional[float] = None

    class CircuitState(Enum):
        CLOSED = 0
        OPEN = 1
        HALF_OPEN = 2

    @dataclass
    class Candidate:
        """An upstream the host admitted for this request, with its live signals. The defaults
        are a healthy candidate with no load: meant for tests."""

        index: int = 0
        weight: float = 1.0
        priority: int = 0
        availability: float = 1.0
        circuit: CircuitState = CircuitState.CLOSED
        prefill_backlog_tokens: int = 0
        inflight_elephants: int = 0
        uncached_prompt_tokens: int = 0
        ttft_ms: Optional[float] = None
        latency_ms: Optional[float] = None
        inflight_requests: int = 0
        affinity_pinned: bool = False

    @dataclass
    class HedgeRequest:
        after_ms: int
        backup: int

    @dataclass
    class _WitDecision:
        order: List[int]
        hedge: Optional[HedgeRequest]
        strategy_metadata: str

    @dataclass
    class Observation:
        """What happened to one attempt."""

        index: int = 0
        success: bool = True
        ttft_ms: Optional[float] = None
        latency_ms: float = 0.0
        prompt_tokens: int = 0
        completion_tokens: int = 0
        cached_prompt_tokens: int = 0
        status: int = 200
        strategy_metadata: str = ""
        now_ms: int = 0

    @dataclass
    class StrategyInfo:
        name: str
        version: str
        description: str


@dataclass
class Decision(_WitDecision):
    """The upstreams to try, primary first, as declared indexes of candidates."""

    order: List[int]
    hedge: Optional[HedgeRequest] = None
    strategy_metadata: str = ""

    def with_hedge(self, after_ms: int, backup: int) -> "Decision":
        """Asks the host to send the request to `backup` too when the primary has not answered
        `after_ms` milliseconds after it was sent; the first answer wins."""
        return dataclasses.replace(self, hedge=HedgeRequest(after_ms, backup))

    def with_metadata(self, metadata: str) -> "Decision":
        """Metadata the host hands back in this request's observations."""
        return dataclasses.replace(self, strategy_metadata=metadata)
