#!/usr/bin/env python3
"""Where one client's wait goes, read off the scheduler: the mock alone, nginx's hop and the
gateway's at one client (wrk -c1), each traced with `perf sched record` (every context switch and
wake-up on the machine) while it serves.

`perf trace` (bench/critical_path.py) splits a request at the proxy's system calls but makes each
call ~15-20 µs slower on this VM, more than the gap it measures. The scheduler's trace costs a
little per switch and nothing per call. Per request it gives, for each process on the path:

    run      CPU time on its threads, system calls included (`perf sched timehist`'s run time)
    slices   times one of its threads was switched in
    delay    median wake-up → running (the scheduler's delay: a wake-up's share of the latency)

and the client's p50. The added p50 of a proxy (its p50 minus the mock's alone) is its run time on
the path, its wake-ups' delays, and its threads' hops; this says how much of each. Each round also
reports the share of the machine's CPU time the hypervisor stole while it ran (/proc/stat): on a
shared VM a round with steal, or with the client's own run time far above its usual ~20 µs, was
slowed from outside.

    python3 bench/sched_split.py [--binary PATH] [--model fixed] [--seconds 5] [--rounds 3] [--port-base N]

Rounds alternate the three targets, so a drift of the machine falls on each alike; the report is the
medians over rounds. The binary defaults to the release build; the strategies and the mock come from
it, as in bench/run.py.
"""
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


# `perf sched timehist` line: time, [cpu], comm[tid/pid] or comm[pid], wait, sch delay, run (ms).
SLICE = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(.*?)\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def threads_of(pid):
    """Thread ids of `pid` now."""
    return {int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()}


def traced_round(url, payload, seconds, work, groups):
    """One wrk -c1 run under `perf sched record`; returns the client's p50 and requests, and per
    group of pids (name → pids) the run time, slices and wake-up delays of their threads."""
    data = work / "sched.data"
    lua = run.wrk_script(payload, work)
    record = subprocess.Popen(["perf", "sched", "record", "-o", str(data), "--", "sleep", str(seconds + 2)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)  # perf attaches
        ticks = run.cpu_ticks()
        load = subprocess.run(["wrk", "-t1", "-c1", f"-d{seconds}s", "--latency", "-s", str(lua), url],
                              capture_output=True, text=True, timeout=seconds + 60, check=True)
        stolen = run.stolen_share(ticks, run.cpu_ticks())
    finally:
        record.wait(seconds + 60)
    report = load.stdout
    p50 = run.to_ms(re.search(r"^\s+50%\s+(\S+)", report, re.M).group(1))
    requests = int(re.search(r"(\d+) requests in", report).group(1))
    out = subprocess.run(["perf", "sched", "timehist", "-i", str(data)], capture_output=True, text=True,
                         check=True).stdout
    tids = {name: set().union(*(threads_of(pid) for pid in pids)) for name, pids in groups.items()}
    per = defaultdict(lambda: {"run_ms": 0.0, "slices": 0, "delays": []})
    for line in out.splitlines():
        m = SLICE.match(line)
        if not m:
            continue
        _, _, comm, tid, pid, _, delay, run_ms = m.groups()
        tid = int(tid)
        if comm.startswith("wrk"):
            name = "client (wrk)"
        else:
            name = next((n for n, ts in tids.items() if tid in ts), None)
            if name is None:
                continue
        entry = per[name]
        entry["run_ms"] += float(run_ms)
        entry["slices"] += 1
        entry["delays"].append(float(delay))
    return p50, requests, stolen, {
        name: {"run_us": e["run_ms"] * 1000 / requests, "slices": e["slices"] / requests,
               "delay_us": statistics.median(e["delays"]) * 1000 if e["delays"] else 0.0}
        for name, e in per.items()}


def main():
    binary = run.arg("--binary", str(run.target_dir() / "release" / "switchyard"))
    model, seconds, rounds = run.arg("--model", "fixed"), run.arg("--seconds", 5), run.arg("--rounds", 3)
    port_base = run.arg("--port-base", 19971)
    run.ensure_tools(redis=False, perf=True)
    env = run.gateway_env()
    with run.mock_and_nginx(binary, env, port_base, "switchyard-sched-") as (work, mock, nginx_pids, procs):
        port = port_base + 2
        gw = run.start_gateway(binary, work, "gw", port, env)
        procs.append(gw)
        targets = [
            ("direct", f"http://127.0.0.1:{port_base}", "sim", {"mock": [mock.pid]}),
            ("nginx", f"http://127.0.0.1:{port_base + 1}", "sim", {"mock": [mock.pid], "proxy": nginx_pids}),
            ("switchyard", f"http://127.0.0.1:{port}", f"bench-{model}", {"mock": [mock.pid], "proxy": [gw.pid]}),
        ]
        runs = defaultdict(list)
        for r in range(rounds):
            for label, base, name, groups in targets:
                url = base + "/v1/chat/completions"
                run.wrk(url, run.body(name), 1, work)  # warm-up, and the upstream connection opened
                p50, requests, stolen, split = traced_round(url, run.body(name), seconds, work, groups)
                runs[label].append({"p50_us": p50 * 1000, "requests": requests, "stolen %": stolen * 100, **{
                    f"{who} {key}": value for who, figures in split.items() for key, value in figures.items()}})
                print(f"round {r + 1} {label}: p50 {p50 * 1000:.1f} µs, {requests} requests, "
                      f"{stolen * 100:.1f} % of the CPU stolen by the host, "
                      + ", ".join(f"{who}: run {f['run_us']:.1f} µs, {f['slices']:.2f} slices, "
                                  f"delay {f['delay_us']:.1f} µs" for who, f in sorted(split.items())), flush=True)
        keys = sorted({k for rows in runs.values() for row in rows for k in row})
        print(f"\none client, `{model}`, {rounds} rounds of {seconds} s, medians; per request:")
        print(f"{'':28}" + "".join(f"{label:>14}" for label in runs))
        for k in keys:
            cells = []
            for label in runs:
                values = [row[k] for row in runs[label] if k in row]
                cells.append(f"{statistics.median(values):14.2f}" if values else f"{'':>14}")
            print(f"{k:28}" + "".join(cells))


if __name__ == "__main__":
    main()
