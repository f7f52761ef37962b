#!/usr/bin/env python3
"""The serving runtime's shape, measured alone: `--runtime per-core` (the default) against
`--runtime shared` at the same thread count, and one thread, behind the same mock, alternating
rounds so a machine whose speed drifts moves every shape alike.

    python3 bench/runtime_shape.py [--skip-build] [--binary PATH] [--rounds N] [--seconds S] [--clients C]

Prints req/s and the gateway's CPU µs per non-streaming request (from /proc/<pid>/stat) per round,
then the medians. Reuses bench/run.py's mock, config and wrk driver.
"""
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


def main():
    rounds, seconds, clients = run.arg("--rounds", 3), run.arg("--seconds", 5), run.arg("--clients", 32)
    run.DURATION = seconds
    run.ensure_tools()
    binary = Path(run.arg("--binary", "")) if "--binary" in sys.argv else run.build()
    env = run.gateway_env()
    work = Path(tempfile.mkdtemp(prefix="switchyard-shape-"))
    per_core, shared = ["--runtime", "per-core"], ["--runtime", "shared"]
    shapes = {"per-core (default)": (per_core, {}), "shared": (shared, {}),
              "one thread, per-core": (per_core, {"SWITCHYARD_WORKER_THREADS": "1"}),
              "one thread, shared": (shared, {"SWITCHYARD_WORKER_THREADS": "1"})}
    procs, gateways = [], {}
    try:
        mock = subprocess.Popen([binary, "mock-upstream", "--port", str(run.PORTS["mock"]),
                                 "--completion-tokens", str(run.COMPLETION_TOKENS)], stdout=subprocess.DEVNULL, env=env)
        procs.append(mock)
        run.wait_http(f"http://127.0.0.1:{run.PORTS['mock']}/health")
        for i, (name, (args, extra_env)) in enumerate(shapes.items()):
            port = 19120 + i
            (work / f"g{i}.yaml").write_text(run.gateway_config(work, f"g{i}.db"))
            gw = subprocess.Popen([binary, "serve", "--config", str(work / f"g{i}.yaml"),
                                   "--listen", f"127.0.0.1:{port}", *args],
                                  stdout=subprocess.DEVNULL, env=dict(env, **extra_env))
            procs.append(gw)
            run.wait_http(f"http://127.0.0.1:{port}/health")
            gateways[name] = (port, gw.pid)
        results = {name: [] for name in shapes}
        payload = run.body("bench-fixed")
        for r in range(rounds):
            for name, (port, pid) in gateways.items():
                out = run.wrk_cpu(f"http://127.0.0.1:{port}/v1/chat/completions", payload, clients, work, pid)
                cpu_us = out["cpu_us_per_request"]
                results[name].append((out["rps"], cpu_us, out["errors"]))
                print(f"round {r + 1} {name:22} {out['rps']:9.0f} req/s  cpu {cpu_us:6.1f} us/req"
                      + (f"  ERRORS {out['errors']}" if out["errors"] else ""), flush=True)
        print(f"\nmedians of {rounds} rounds, {seconds} s each, {clients} clients, non-streaming, `fixed`:")
        for name, rows in results.items():
            print(f"  {name:22} {statistics.median(r[0] for r in rows):9.0f} req/s  "
                  f"cpu {statistics.median(r[1] for r in rows):6.1f} us/req")
    finally:
        run.stop_processes(procs)


if __name__ == "__main__":
    main()
