#!/usr/bin/env python3
"""Two (or more) builds of the gateway side by side: each serves the suite's config on its own port
behind one mock, and rounds alternate over builds and models, so a machine whose speed drifts moves
every build alike. For a before/after of one change, e.g. a build of main and one of a branch:

    python3 bench/ab.py base=PATH new=PATH [--models fixed,routewise] [--rounds N] [--seconds S]
                        [--clients C] [--port-base N]

Prints req/s and the gateway's CPU µs per non-streaming request (from /proc/<pid>/stat) per round,
then the medians per build and model. Strategies come from `$CARGO_TARGET_DIR/strategies` (else
`target/strategies`), as in bench/run.py, whose mock, config and wrk driver it reuses; the first
build also runs the mock. Extra environment for every gateway: `--gateway-env K=V,K=V`
(e.g. `SWITCHYARD_WORKER_THREADS=1`).
"""
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    # `label=path` arguments, except the value of `--gateway-env`.
    builds = [a.split("=", 1) for i, a in enumerate(sys.argv[1:], 1)
              if "=" in a and not a.startswith("-") and sys.argv[i - 1] != "--gateway-env"]
    if not builds:
        sys.exit(__doc__)
    models = arg("--models", "fixed,routewise").split(",")
    rounds, clients = arg("--rounds", 4), arg("--clients", 32)
    run.DURATION = arg("--seconds", 5)
    gateway_env = dict(kv.split("=", 1) for kv in arg("--gateway-env", "").split(",") if kv)
    port_base = arg("--port-base", 19801)
    run.PORTS["mock"] = port_base
    run.ensure_tools(redis=False)
    env = dict(os.environ, RUST_LOG="warn", ROUTING_AFFINITY_ENABLED="0", SWITCHYARD_DEFAULT_AUTH="disabled",
               SWITCHYARD_BUILTIN_STRATEGIES=str(run.target_dir() / "strategies"))
    work = Path(tempfile.mkdtemp(prefix="switchyard-ab-"))
    procs, gateways = [], {}
    try:
        procs.append(run.start_mock(builds[0][1], env))
        run.wait_http(f"http://127.0.0.1:{port_base}/health")
        for i, (label, binary) in enumerate(builds):
            port = port_base + 1 + i
            gateway = run.start_gateway(binary, work, label, port, dict(env, **gateway_env))
            procs.append(gateway)
            gateways[label] = (port, gateway.pid)
        results = {}
        for r in range(rounds):
            for label, (port, pid) in gateways.items():
                for model in models:
                    out = run.wrk_cpu(f"http://127.0.0.1:{port}/v1/chat/completions",
                                      run.body(f"bench-{model}"), clients, work, pid)
                    cpu_us = out["cpu_us_per_request"]
                    results.setdefault((label, model), []).append((out["rps"], cpu_us))
                    print(f"round {r + 1} {label:12} {model:12} {out['rps']:9.0f} req/s  cpu {cpu_us:6.1f} us/req"
                          + (f"  ERRORS {out['errors']}" if out["errors"] else ""), flush=True)
        print(f"\nmedians of {rounds} rounds, {run.DURATION} s each, {clients} clients, non-streaming:")
        for (label, model), rows in results.items():
            print(f"  {label:12} {model:12} {statistics.median(r[0] for r in rows):9.0f} req/s  "
                  f"cpu {statistics.median(r[1] for r in rows):6.1f} us/req")
    finally:
        run.stop_processes(procs)


if __name__ == "__main__":
    main()
