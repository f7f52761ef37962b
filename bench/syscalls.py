#!/usr/bin/env python3
"""System calls and context switches per request: the gateway (default threads and one thread)
beside nginx, under the same load from wrk, counted by the kernel's tracepoints (`perf stat -e
'syscalls:sys_enter_*'` attached to each process for the run). Callgrind sees only user space;
about half of a request's CPU is the kernel's, and this is where it goes.

    python3 bench/syscalls.py [--binary PATH] [--model fixed] [--clients 32] [--seconds 5]
                              [--stream] [--port-base N]

Prints, per request, each system call at least one in fifty requests make, and the totals
(`raw_syscalls:sys_enter`, `context-switches`). The binary defaults to the release build; the
strategies and the mock come from it, as in bench/run.py.
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


EVENTS = "raw_syscalls:sys_enter,context-switches,syscalls:sys_enter_*"


def counted(pids, url, payload, clients, work):
    """wrk against `url` while `perf stat` counts the events of `pids`; (requests, {event: n})."""
    out = work / "perf.csv"
    perf = subprocess.Popen(["perf", "stat", "-x", ";", "-o", str(out), "-e", EVENTS,
                             "-p", ",".join(map(str, pids))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = run.wrk(url, payload, clients, work)
    finally:
        perf.send_signal(2)  # SIGINT: perf writes its counts and exits
        perf.wait(30)
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split(";")
        if len(fields) > 2 and fields[0].strip().isdigit():
            counts[fields[2].replace("syscalls:sys_enter_", "")] = int(fields[0])
    return result["requests"], counts


def main():
    binary = run.arg("--binary", str(run.target_dir() / "release" / "switchyard"))
    model, clients = run.arg("--model", "fixed"), run.arg("--clients", 32)
    stream = "--stream" in sys.argv
    run.DURATION = run.arg("--seconds", 5)
    port_base = run.arg("--port-base", 19901)
    run.ensure_tools(redis=False, perf=True)
    env = run.gateway_env()
    with run.mock_and_nginx(binary, env, port_base, "switchyard-syscalls-") as (work, _, nginx_pids, procs):
        targets = [("nginx", f"http://127.0.0.1:{port_base + 1}", nginx_pids, "sim")]
        for i, (label, extra_env) in enumerate([("default", {}), ("one thread", {"SWITCHYARD_WORKER_THREADS": "1"})]):
            port = port_base + 2 + i
            gw = run.start_gateway(binary, work, f"gw{i}", port, dict(env, **extra_env))
            procs.append(gw)
            targets.append((label, f"http://127.0.0.1:{port}", [gw.pid], f"bench-{model}"))
        per_request = {}
        for label, base, pids, name in targets:
            # A warm-up run first: pools, caches and the request log's statements settle.
            run.wrk(base + "/v1/chat/completions", run.body(name, stream), clients, work)
            requests, counts = counted(pids, base + "/v1/chat/completions", run.body(name, stream), clients, work)
            per_request[label] = {k: v / max(requests, 1) for k, v in counts.items()}
            print(f"{label}: {requests} requests", flush=True)
        labels = [t[0] for t in targets]
        rows = sorted({k for c in per_request.values() for k, v in c.items() if v >= 0.02},
                      key=lambda k: -max(per_request[label].get(k, 0) for label in labels))
        print(f"\nper {'streamed ' if stream else ''}request, {clients} clients, {run.DURATION} s, `{model}`:")
        print(f"{'':24}" + "".join(f"{label:>12}" for label in labels))
        for k in rows:
            print(f"{k:24}" + "".join(f"{per_request[label].get(k, 0):12.2f}" for label in labels))


if __name__ == "__main__":
    main()
