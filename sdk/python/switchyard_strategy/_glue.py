"""What componentize-py calls: the exported `strategy` interface's functions on a class named
after the interface (`Strategy`, in the app module), and the `router` resource class (`Router`,
in a top-level module named after the interface). `switchyard-strategy build` writes both
modules; authors never see these names. Only imported inside a component."""

import json

from componentize_py_types import Err  # type: ignore[import-not-found]

from . import exported_strategy
from .params import params_schema, parse_params


def _strategy():
    cls = exported_strategy()
    if cls is None:
        raise RuntimeError("no strategy exported: call switchyard_strategy.export_strategy(...)")
    return cls


def _error(error: BaseException) -> Err:
    text = str(error) or type(error).__name__
    return Err(text if isinstance(error, ValueError) else f"{type(error).__name__}: {text}")


class Strategy:
    def info(self):
        return _strategy().info()

    def params_schema(self) -> str:
        return json.dumps(params_schema(_strategy().Params))


class Router:
    # No __slots__: componentize-py stores the resource handle on the instance.
    def __init__(self, inner) -> None:
        self._inner = inner

    @classmethod
    def create(cls, model_id: str, params_json: str) -> "Router":
        s = _strategy()
        try:
            return cls(s.create(model_id, parse_params(s.Params, params_json)))
        except Err:
            raise
        except Exception as error:
            raise _error(error) from None

    def refresh_upstreams(self, upstreams) -> None:
        self._inner.refresh_upstreams(upstreams)

    def select(self, request, candidates):
        try:
            return self._inner.select(request, candidates)
        except Err:
            raise
        except Exception as error:
            raise _error(error) from None

    def observe(self, observation) -> None:
        self._inner.observe(observation)

    def status(self) -> str:
        return self._inner.status()

    def tick(self, now_ms: int) -> None:
        self._inner.tick(now_ms)
