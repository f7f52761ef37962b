#!/usr/bin/env python3
"""Differential test of RouteWise's budget LP against the published reference implementation.

The reference is the `llm-routewise` package on PyPI (0.2.x, MIT). It is *not* a dependency of
the project: install it into a throw-away virtualenv and run this script with that interpreter:

    python3 -m venv /tmp/rw && /tmp/rw/bin/pip install 'llm-routewise==0.2.*'
    CARGO_TARGET_DIR=... /tmp/rw/bin/python strategies/routewise/tests/oracle/differential.py

The script generates random LP cases (seeded), runs ours through the ignored Rust test
`tests/lp_oracle.rs` (JSON in, JSON out), runs the reference's public API
(`llm_routewise.core.cost_tiebroken_objective` and `solve_budget_lp`) on the same inputs, and
compares:

- the tie-broken objective vector (relative 1e-12);
- the budget: ours `c_min + a (c_max - c_min)` against the reference's `(1 - a) c_min + a c_max`;
- the LP weights, with the reference fed *our* budget so only the solvers are compared.

A weight mismatch where both solutions have the same objective value and expected cost is an
equivalent optimum (the tie-break orders differ: ours prefers the earlier declared route, the
reference the lexicographically smaller rounded weight vector) and is reported separately; any
other mismatch fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from llm_routewise.core import BudgetLPCandidate, cost_tiebroken_objective, solve_budget_lp
except ImportError:  # pragma: no cover - environment problem, not a test failure
    sys.exit(
        "llm_routewise is not importable: install llm-routewise==0.2.* into a virtualenv and run "
        "this script with its python (see the module docstring)"
    )

REPO = Path(__file__).resolve().parents[4]
TOLERANCE = 1e-9


def log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def alpha(rng: random.Random) -> float:
    return rng.choice([0.0, 1.0, 0.5, 0.75, rng.random(), rng.random(), rng.random()])


def case_continuous(rng: random.Random) -> dict:
    n = rng.randint(1, 8)
    return {
        "costs": [log_uniform(rng, 1e-6, 5e-2) for _ in range(n)],
        "ttft_ms": [rng.uniform(100.0, 20_000.0) for _ in range(n)],
        "alpha": alpha(rng),
    }


def case_zero_costs(rng: random.Random) -> dict:
    # Free concurrency slots and unpriced routes cost 0.
    n = rng.randint(2, 8)
    return {
        "costs": [0.0 if rng.random() < 0.4 else log_uniform(rng, 1e-5, 1e-2) for _ in range(n)],
        "ttft_ms": [rng.uniform(200.0, 8_000.0) for _ in range(n)],
        "alpha": alpha(rng),
    }


def case_unprofiled(rng: random.Random) -> dict:
    # Several endpoints at the unprofiled default of 5 000 ms: the cost tie-break decides.
    n = rng.randint(2, 8)
    return {
        "costs": [log_uniform(rng, 1e-5, 1e-1) for _ in range(n)],
        "ttft_ms": [5_000.0 if rng.random() < 0.6 else rng.uniform(100.0, 9_000.0) for _ in range(n)],
        "alpha": alpha(rng),
    }


def case_quota_shadow(rng: random.Random) -> dict:
    # Quota shadow prices L (U/L)^z next to on-demand costs inside [L, U].
    lower, upper = sorted(log_uniform(rng, 1e-5, 1e-1) for _ in range(2))
    n = rng.randint(2, 8)
    costs = []
    for _ in range(n):
        if rng.random() < 0.4:
            z = min(max(rng.random(), 0.0), 0.9999)
            costs.append(lower * (upper / lower) ** z)
        else:
            costs.append(rng.uniform(lower, upper))
    return {"costs": costs, "ttft_ms": [rng.uniform(100.0, 20_000.0) for _ in range(n)], "alpha": alpha(rng)}


def case_ties(rng: random.Random) -> dict:
    # Discrete values: equal costs, equal latencies, exact ties.
    n = rng.randint(2, 6)
    return {
        "costs": [rng.choice([0.0, 0.001, 0.002, 0.003]) for _ in range(n)],
        "ttft_ms": [rng.choice([500.0, 1_000.0, 5_000.0]) for _ in range(n)],
        "alpha": rng.choice([0.0, 0.25, 0.5, 1.0]),
    }


GENERATORS = {
    "continuous": case_continuous,
    "zero_costs": case_zero_costs,
    "unprofiled": case_unprofiled,
    "quota_shadow": case_quota_shadow,
    "ties": case_ties,
}


def run_ours(cases: list[dict], workspace: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cases_path = Path(tmp) / "cases.json"
        out_path = Path(tmp) / "results.json"
        cases_path.write_text(json.dumps(cases))
        env = dict(os.environ, ROUTEWISE_ORACLE_IN=str(cases_path), ROUTEWISE_ORACLE_OUT=str(out_path))
        cmd = [
            "cargo", "test", "-q", "-p", "strategy-routewise", "--test", "lp_oracle",
            "--", "--ignored", "--exact", "differential_oracle_io",
        ]
        done = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"cargo failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return json.loads(out_path.read_text())


def reference(case: dict, budget: float) -> tuple[list[float], list[float], str]:
    costs, ttft = case["costs"], case["ttft_ms"]
    objective = cost_tiebroken_objective(ttft, costs)
    names = [f"r{i}" for i in range(len(costs))]
    result = solve_budget_lp(
        [BudgetLPCandidate(name=n, objective=o, effective_cost=c) for n, o, c in zip(names, objective, costs)],
        budget=budget,
    )
    weights = [result.weights.get(n, 0.0) for n in names]
    return objective, weights, result.status


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def close(a: float, b: float, rel: float = 1e-12) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2_000, help="cases per generator")
    parser.add_argument("--seed", type=int, default=20260701)
    parser.add_argument("--workspace", type=Path, default=REPO, help="cargo workspace to run in")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    labelled = [(name, gen(rng)) for name, gen in GENERATORS.items() for _ in range(args.cases)]
    ours = run_ours([case for _, case in labelled], args.workspace)

    summary: dict[str, dict[str, int]] = {}
    failures: list[str] = []
    worst = {"objective": 0.0, "budget": 0.0, "weights": 0.0}
    failed_cases = 0
    for (name, case), mine in zip(labelled, ours):
        failures_before = len(failures)
        row = summary.setdefault(name, {"cases": 0, "equal": 0, "equivalent_optimum": 0, "mismatch": 0,
                                        "reference_budget_differs": 0})
        row["cases"] += 1
        costs = case["costs"]
        ref_objective, ref_weights, ref_status = reference(case, mine["budget"])
        obj_diff = max(abs(a - b) for a, b in zip(ref_objective, mine["objective"]))
        worst["objective"] = max(worst["objective"], obj_diff)
        if not all(close(a, b) for a, b in zip(ref_objective, mine["objective"])):
            failures.append(f"{name}: objective differs {case} ours={mine['objective']} ref={ref_objective}")

        a = case["alpha"]
        ref_budget = (1.0 - a) * min(costs) + a * max(costs)
        worst["budget"] = max(worst["budget"], abs(ref_budget - mine["budget"]))
        if not close(ref_budget, mine["budget"]):
            failures.append(f"{name}: budget differs {case} ours={mine['budget']} ref={ref_budget}")

        diff = max(abs(x - y) for x, y in zip(ref_weights, mine["weights"]))
        worst["weights"] = max(worst["weights"], diff)
        if ref_status != "feasible":
            row["mismatch"] += 1
            failures.append(f"{name}: reference status {ref_status} for {case}")
        elif diff <= TOLERANCE:
            row["equal"] += 1
        elif close(dot(ref_weights, ref_objective), dot(mine["weights"], ref_objective), 1e-9) and close(
            dot(ref_weights, costs), dot(mine["weights"], costs), 1e-9
        ):
            row["equivalent_optimum"] += 1
        else:
            row["mismatch"] += 1
            failures.append(f"{name}: weights differ {case} ours={mine['weights']} ref={ref_weights}")

        # The reference with its own budget formula: does the rounding difference ever matter?
        _, own_budget_weights, _ = reference(case, ref_budget)
        if max(abs(x - y) for x, y in zip(own_budget_weights, ref_weights)) > TOLERANCE:
            row["reference_budget_differs"] += 1
        failed_cases += len(failures) > failures_before

    print(f"{'generator':<14}{'cases':>7}{'equal':>7}{'equiv':>7}{'mismatch':>10}{'budget≠':>9}")
    for name, row in summary.items():
        print(f"{name:<14}{row['cases']:>7}{row['equal']:>7}{row['equivalent_optimum']:>7}"
              f"{row['mismatch']:>10}{row['reference_budget_differs']:>9}")
    print(f"max |diff|: objective {worst['objective']:.3g}, budget {worst['budget']:.3g}, "
          f"weights {worst['weights']:.3g}")
    for failure in failures[:20]:
        print("FAIL", failure)
    total = sum(r["cases"] for r in summary.values())
    print(f"{total - failed_cases} passed, {failed_cases} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
