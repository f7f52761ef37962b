#!/usr/bin/env python3
"""Two (or more) builds of the gateway side by side: each serves the suite's config on its own port
behind one mock, and rounds alternate over builds and models, so a machine whose speed drifts moves
every build alike. For a before/after of one change, e.g. a build of main and one of a branch:

    python3 bench/ab.py base=PATH new=PATH [nginx=nginx] [--models fixed,routewise] [--rounds N]
                        [--seconds S] [--clients C] [--port-base N] [--threads]

Prints req/s, wrk's p50 and the gateway's CPU µs per non-streaming request (from /proc/<pid>/stat) per round,
then the medians per build and model. `nginx=nginx` adds nginx (one worker, `proxy_pass` to the
same mock, as in bench/run.py) as one more "build" in the same rounds, the issue's yardstick;
`direct=direct` adds the mock itself (no hop), whose p50 the others' is read against at
`--clients 1` (issue #18's added p50).
`--threads` also splits each one's CPU by thread name into user and system time (from
/proc/<pid>/task/*/stat): the serving threads, the request log's SQLite thread, the main runtime. Strategies come from `$CARGO_TARGET_DIR/strategies` (else
`target/strategies`), as in bench/run.py, whose mock, config and wrk driver it reuses; the first
build also runs the mock. Extra environment for every gateway: `--gateway-env K=V,K=V`
(e.g. `SWITCHYARD_WORKER_THREADS=1`).
`--warm-up LABEL=SECONDS[,LABEL=SECONDS]` loads those builds first (non-streaming and streaming
requests to every model in `--models`, 32 clients, in turns of 10 s), so that one gateway can be
measured after serving a long run beside a fresh one: the same binary twice, one of them warmed up,
says what the state a gateway builds up (its request log, its heap) costs a request.
`--restart-warmed` then restarts the warmed gateways on the same files before the rounds: what
is left of the difference is the request log's, not the process's.
"""
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


def thread_cpu(pid):
    """CPU seconds (user, system) per thread name of process `pid`, summed over its threads."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended since the listing
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        user, system = run.stat_times(stat)
        user0, system0 = out.get(name, (0.0, 0.0))
        out[name] = (user0 + user, system0 + system)
    return out


def warm(gateway, models, seconds, work):
    """Turns of 10 s of non-streaming and streaming requests to each model, until `seconds` have
    gone; prints the requests each turn served."""
    port, pid = gateway
    saved, run.DURATION = run.DURATION, 10
    try:
        deadline, served = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            for model in models:
                for stream in (False, True):
                    out = run.wrk_cpu(f"http://127.0.0.1:{port}/v1/chat/completions",
                                      run.body(f"bench-{model}", stream), 32, work, pid)
                    served += out["requests"]
        print(f"warm-up: port {port} served {served} requests in {seconds:.0f} s", flush=True)
    finally:
        run.DURATION = saved


def main():
    # `label=path` arguments, except the value of `--gateway-env`.
    builds = [a.split("=", 1) for i, a in enumerate(sys.argv[1:], 1)
              if "=" in a and not a.startswith("-") and sys.argv[i - 1] not in ("--gateway-env", "--warm-up")]
    if not builds:
        sys.exit(__doc__)
    models = run.arg("--models", "fixed,routewise").split(",")
    rounds, clients = run.arg("--rounds", 4), run.arg("--clients", 32)
    run.DURATION = run.arg("--seconds", 5)
    gateway_env = dict(kv.split("=", 1) for kv in run.arg("--gateway-env", "").split(",") if kv)
    warm_up = {label: float(s) for label, s in
               (kv.split("=", 1) for kv in run.arg("--warm-up", "").split(",") if kv)}
    port_base = run.arg("--port-base", 19801)
    run.PORTS["mock"] = port_base
    run.ensure_tools(redis=False)
    env = run.gateway_env()
    work = Path(tempfile.mkdtemp(prefix="switchyard-ab-"))
    split = "--threads" in sys.argv
    procs, gateways, nginx_bin = [], {}, None
    try:
        procs.append(run.start_mock(next(b for _, b in builds if b not in ("nginx", "direct")), env))
        run.wait_http(f"http://127.0.0.1:{port_base}/health")
        for i, (label, binary) in enumerate(builds):
            port = port_base + 1 + i
            if binary == "direct":
                gateways[label] = (port_base, procs[0].pid)
                continue
            if binary == "nginx":
                nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
                run.PORTS["nginx"] = port
                gateways[label] = (port, run.start_nginx(work, nginx_bin)[0])
                continue
            gateway = run.start_gateway(binary, work, label, port, dict(env, **gateway_env))
            procs.append(gateway)
            gateways[label] = (port, gateway.pid)
        for label, seconds in warm_up.items():
            warm(gateways[label], models, seconds, work)
            if "--restart-warmed" in sys.argv:
                binary = dict(builds)[label]
                old = next(p for p in procs if p.pid == gateways[label][1])
                run.stop_processes([old])
                procs.remove(old)
                gateway = run.start_gateway(binary, work, label, gateways[label][0], dict(env, **gateway_env))
                procs.append(gateway)
                gateways[label] = (gateways[label][0], gateway.pid)
        results, threads = {}, {}
        for r in range(rounds):
            for label, (port, pid) in gateways.items():
                for model in models:
                    before = thread_cpu(pid) if split else {}
                    name = "sim" if port == port_base else f"bench-{model}"
                    out = run.wrk_cpu(f"http://127.0.0.1:{port}/v1/chat/completions",
                                      run.body(name), clients, work, pid)
                    cpu_us = out["cpu_us_per_request"]
                    results.setdefault((label, model), []).append((out["rps"], cpu_us, out["p50_ms"]))
                    print(f"round {r + 1} {label:12} {model:12} {out['rps']:9.0f} req/s  p50 {out['p50_ms']:.3f} ms  "
                          f"cpu {cpu_us:6.1f} us/req"
                          + (f"  ERRORS {out['errors']}" if out["errors"] else ""), flush=True)
                    if split:
                        per_request = 1e6 / max(out["requests"], 1)
                        for name, (user, system) in sorted(thread_cpu(pid).items()):
                            user0, system0 = before.get(name, (0.0, 0.0))
                            row = ((user - user0) * per_request, (system - system0) * per_request)
                            if row[0] + row[1] > 0:
                                threads.setdefault((label, model, name), []).append(row)
                                print(f"    {name:24} user {row[0]:6.1f}  system {row[1]:6.1f} us/req")
        print(f"\nmedians of {rounds} rounds, {run.DURATION} s each, {clients} clients, non-streaming:")
        for (label, model), rows in results.items():
            print(f"  {label:12} {model:12} {statistics.median(r[0] for r in rows):9.0f} req/s  "
                  f"p50 {statistics.median(r[2] for r in rows):.3f} ms  "
                  f"cpu {statistics.median(r[1] for r in rows):6.1f} us/req")
            for (t_label, t_model, name), t_rows in sorted(threads.items()):
                if (t_label, t_model) == (label, model):
                    # A thread busy in only some rounds counts 0 in the others.
                    padded = t_rows + [(0.0, 0.0)] * (rounds - len(t_rows))
                    print(f"    {name:24} user {statistics.median(r[0] for r in padded):6.1f}  "
                          f"system {statistics.median(r[1] for r in padded):6.1f} us/req")
    finally:
        if nginx_bin:
            run.stop_nginx(work, nginx_bin)
        run.stop_processes(procs)


if __name__ == "__main__":
    main()
