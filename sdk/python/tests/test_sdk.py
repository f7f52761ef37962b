"""Unit tests of the Python SDK, natively: `python -m unittest discover sdk/python/tests`."""

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import typing
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from switchyard_strategy import (  # noqa: E402
    Candidate,
    Decision,
    HedgeRequest,
    NoParams,
    ParamsError,
    PrefillPolicy,
    Request,
    Rng,
    Strategy,
    StrategyInfo,
    affinity_first,
    declared_order,
    export_strategy,
    params_schema,
    parse_params,
    prefill_aware_primary,
    primary_then_declared,
    priority_tiers,
    weighted_draw,
    weighted_shuffle,
)
from switchyard_strategy import types as sdk_types  # noqa: E402
from switchyard_strategy.stamp import (  # noqa: E402
    SECTION,
    declare_skips,
    declared_skips,
    stamp,
    stamped_version,
)


class RngTest(unittest.TestCase):
    def test_reference_sequence_same_as_rust_and_js(self):
        rng = Rng(0)
        self.assertEqual(rng.next_u64(), 0xE220A8397B1DCDAF)
        self.assertEqual(rng.next_u64(), 0x6E789E6AA1B965F4)
        self.assertEqual(rng.next_u64(), 0x06C45D188009454F)
        self.assertEqual(Rng.for_request(Request(seed=42)), Rng(42))
        bounded = Rng(3)
        self.assertTrue(all(bounded.below(5) < 5 for _ in range(1000)))
        self.assertEqual(bounded.below(0), 0)


class OrderTest(unittest.TestCase):
    def test_draw_follows_weights_and_skips_unusable(self):
        hits = sum(weighted_draw([0.7, 0.3], Rng(seed)) == 0 for seed in range(10_000))
        self.assertAlmostEqual(hits / 10_000, 0.7, delta=0.03)
        for seed in range(200):
            self.assertEqual(weighted_draw([0.0, -1.0, math.nan, math.inf, 2.0], Rng(seed)), 4)
        rng = Rng(9)
        self.assertIsNone(weighted_draw([0.0, 0.0], rng))
        self.assertEqual(rng, Rng(9), "no randomness consumed")

    def test_shuffle_is_a_permutation_with_unusable_last(self):
        weights = [0.0, 3.0, 1.0, math.nan, 2.0]
        for seed in range(200):
            order = weighted_shuffle(weights, Rng(seed))
            self.assertEqual(sorted(order), [0, 1, 2, 3, 4])
            self.assertEqual(order[3:], [0, 3])
            self.assertEqual(order[0], weighted_draw(weights, Rng(seed)))

    def test_declared_helpers_and_tiers(self):
        def c(index, priority=0):
            return Candidate(index=index, priority=priority)

        cands = [c(4), c(1), c(3)]
        self.assertEqual(declared_order(cands), [1, 3, 4])
        self.assertEqual(primary_then_declared(cands, 2), [3, 1, 4])
        tiered = [c(5, 1), c(0, -2), c(2, 10), c(1, 1), c(3, 10)]
        self.assertEqual(priority_tiers(tiered), [[2, 4], [3, 0], [1]])
        order = [2, 0, 1]
        affinity_first([c(0), Candidate(index=1, affinity_pinned=True), c(2)], order)
        self.assertEqual(order, [1, 2, 0])

    def test_prefill_threshold_makes_the_lighter_endpoint_win(self):
        cands = [Candidate(index=0, prefill_backlog_tokens=50_000), Candidate(index=1)]
        first = sum(
            prefill_aware_primary(cands, PrefillPolicy(), Rng(seed)) == 0 for seed in range(4000)
        )
        self.assertAlmostEqual(first / 4000, 0.25, delta=0.03)


@dataclasses.dataclass
class Nested:
    limit: int = 0


@dataclasses.dataclass
class Example:
    """Example params."""

    order: typing.Literal["declared", "weighted"] = dataclasses.field(
        default="declared", metadata={"description": "fallbacks"}
    )
    share: float = 0.5
    names: typing.List[str] = dataclasses.field(default_factory=list)
    cap: typing.Optional[int] = None
    nested: Nested = dataclasses.field(default_factory=Nested)
    flag: bool = True


class ParamsTest(unittest.TestCase):
    def test_schema(self):
        schema = params_schema(Example)
        self.assertFalse(schema["additionalProperties"])
        self.assertEqual(schema["properties"]["order"], {
            "enum": ["declared", "weighted"], "description": "fallbacks", "default": "declared"})
        self.assertEqual(schema["properties"]["nested"]["default"], {"limit": 0})
        self.assertFalse(schema["properties"]["nested"]["additionalProperties"])
        self.assertNotIn("required", schema)
        self.assertEqual(params_schema(NoParams)["properties"], {})

    def test_parse(self):
        self.assertEqual(parse_params(Example, ""), Example())
        parsed = parse_params(Example, '{"share": 1, "names": ["a"], "nested": {"limit": 3}}')
        self.assertEqual(parsed.share, 1.0)
        self.assertEqual(parsed.nested.limit, 3)
        for text, error in [
            ('{"weights": 1}', "unknown field `weights`"),
            ('{"order": "random"}', 'order: expected one of "declared", "weighted", got "random"'),
            ('{"flag": 1}', "flag: expected a boolean"),
            ('{"names": [1]}', "names[0]: expected a string"),
            ('{"nested": {"limit": "x"}}', "nested.limit: expected an integer"),
            ('{"nested": {"x": 1}}', "nested.unknown field `x`"),
            ("[]", "expected a JSON object"),
            ("{", "invalid router_params"),
        ]:
            with self.assertRaises(ParamsError) as caught:
                parse_params(Example, text)
            self.assertIn(error, str(caught.exception), text)


class StrategyTest(unittest.TestCase):
    def test_export_and_decision_builders(self):
        class First(Strategy):
            @staticmethod
            def info():
                return StrategyInfo("first", "1", "")

            @classmethod
            def create(cls, model_id, params):
                return cls()

            def select(self, request, candidates):
                return Decision(declared_order(candidates))

        self.assertIs(export_strategy(First), First)
        with self.assertRaises(TypeError):
            export_strategy(object)
        router = First.create("m", NoParams())
        decision = router.select(Request(seed=1), [Candidate(index=2), Candidate(index=0)])
        self.assertEqual(decision.order, [0, 2])
        hedged = Decision([1, 0]).with_hedge(250, 0).with_metadata("m")
        self.assertEqual(hedged.hedge, HedgeRequest(250, 0))
        self.assertEqual(hedged.strategy_metadata, "m")
        self.assertEqual(router.status(), "{}")


class StampTest(unittest.TestCase):
    def test_stamp_once(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.wasm")
            with open(path, "wb") as f:
                f.write(b"\0asm\x0d\x00\x01\x00")
            stamp(path, "0.2.0")
            stamp(path, "0.2.0")
            with open(path, "rb") as f:
                data = f.read()
            self.assertEqual(stamped_version(data), "0.2.0")
            self.assertEqual(data[8:11], bytes([0, 1 + len(SECTION) + 5, len(SECTION)]))
            with self.assertRaises(ValueError):
                stamp(path, "0.3.0")

    def test_skips_are_declared_once_and_only_known_words(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.wasm")
            with open(path, "wb") as f:
                f.write(b"\0asm\x0d\x00\x01\x00")
            declare_skips(path, [])
            with open(path, "rb") as f:
                self.assertIsNone(declared_skips(f.read()))
            declare_skips(path, ["observe", "tick", "observe"])
            declare_skips(path, ["observe", "tick"])
            with open(path, "rb") as f:
                data = f.read()
            self.assertEqual(declared_skips(data), ["observe", "tick"])
            self.assertEqual(data.count(b"switchyard-router-skips"), 1)
            with self.assertRaises(ValueError):
                declare_skips(path, ["select-single"])
            with self.assertRaisesRegex(ValueError, "known: observe, tick, select-single"):
                declare_skips(path, ["obsreve"])


class BindingsTest(unittest.TestCase):
    """The native records must have the generated classes' fields, in order."""

    def test_native_records_match_componentize_py(self):
        try:
            import componentize_py  # noqa: F401
        except ImportError:
            self.skipTest("componentize-py is not installed (pip install sdk/python)")
        wit = os.path.join(os.path.dirname(sdk_types.__file__), "wit")
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(
                [sys.executable, "-c", "import sys; from componentize_py import script; sys.exit(script())",
                 "-d", wit, "-w", "strategy-component", "bindings", out],
                check=True,
            )
            probe = (
                "import dataclasses, json, sys; sys.path.insert(0, sys.argv[1]);"
                "from wit_world.imports import types;"
                "print(json.dumps({n: [f.name for f in dataclasses.fields(getattr(types, n))]"
                " for n in sys.argv[2:]}))"
            )
            names = ["Pricing", "Upstream", "PrefillPolicy", "Request", "Candidate",
                     "HedgeRequest", "Decision", "Observation", "StrategyInfo"]
            generated = json.loads(subprocess.run(
                [sys.executable, "-c", probe, out, *names], check=True, capture_output=True, text=True
            ).stdout)
        for name in names:
            native = [f.name for f in dataclasses.fields(getattr(sdk_types, name))]
            self.assertEqual(native, generated[name], name)
        self.assertEqual([m.name for m in sdk_types.CircuitState], ["CLOSED", "OPEN", "HALF_OPEN"])


if __name__ == "__main__":
    unittest.main()
