#!/usr/bin/env python3
"""Where one client's wait goes: the gateway's and nginx's hop at one client (wrk -c1), split at
their system calls, traced with `perf trace` (timestamps of each call on the proxy's threads).

The added latency at one client (issue #18: ≤ 0.05 ms) is the hop's whole cost: the proxy's work
before it writes the request upstream, its work between the upstream's answer and the answer it
writes back, and the wake-ups in between. Per request, medians:

    before upstream   the request's read returned → the upstream write entered
    after upstream    the upstream answer's read returned → the client's answer entered its write
    after answer      the client's answer written → the thread waits again (work off the path)
    calls             system calls the proxy made for the request

    python3 bench/critical_path.py [--binary PATH] [--model fixed] [--seconds 5] [--port-base N]

`perf trace` makes each system call slower by its own cost (a few µs), the same for both
proxies; the gaps between calls are user-space work plus that. The binary defaults to the
release build; the strategies and the mock come from it, as in bench/run.py.
"""
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


# `perf trace` line: "   12.345 ( 0.004 ms): name/tid syscall(fd: 7, ...) = 120"
# (A process of one thread is traced without "name/tid".)
LINE = re.compile(r"^\s*([\d.]+) \(\s*([\d.]+) ms\): (?:(.+?)/(\d+) )?(\w+)\((.*)\)\s+= (-?\d+|0x[0-9a-f]+)?")
READS = {"read", "recvfrom", "readv", "recvmsg"}
WRITES = {"write", "sendto", "writev", "sendmsg"}


def socket_fds(pid, local_port=None, remote_port=None):
    """The fds of `pid`'s TCP sockets with that local or remote port (from `ss -tnp`)."""
    out = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=True).stdout
    fds = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        local, remote = fields[3], fields[4]
        for m in re.finditer(rf"pid={pid},fd=(\d+)", line):
            if (local_port and local.endswith(f":{local_port}")) or (remote_port and remote.endswith(f":{remote_port}")):
                fds.add(int(m.group(1)))
    return fds


def traced(pid, url, payload, seconds, work, listen, upstream_port):
    """`perf trace` of `pid` (all threads) while one client sends requests: wrk's figures, the
    parsed calls, and the fds of the client's and the upstream's connections (read mid-run)."""
    out = work / f"trace-{pid}.txt"
    lua = run.wrk_script(payload, work)
    perf = subprocess.Popen(["perf", "trace", "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)  # perf attaches
        load = subprocess.Popen(["wrk", "-t1", "-c1", f"-d{seconds}s", "--latency", "-s", str(lua), url],
                                stdout=subprocess.PIPE, text=True)
        time.sleep(min(1.0, seconds / 2))
        client = socket_fds(pid, local_port=listen)
        upstream = socket_fds(pid, remote_port=upstream_port)
        report = load.communicate(timeout=seconds + 60)[0]
    finally:
        perf.send_signal(2)
        perf.wait(60)
    p50 = run.to_ms(re.search(r"^\s+50%\s+(\S+)", report, re.M).group(1))
    calls = []
    for line in out.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        start_ms, dur_ms, _, tid, name, args, ret = m.groups()
        fd = re.match(r"fd: (\d+)", args)
        value = int(ret, 0) if ret else 0
        calls.append({"start": float(start_ms) * 1000, "end": (float(start_ms) + float(dur_ms)) * 1000,
                      "tid": int(tid or 0), "name": name, "fd": int(fd.group(1)) if fd else None, "ret": value})
    return p50, calls, client, upstream


def segments(calls, client_fds, upstream_fds):
    """Per request (µs): before upstream, after upstream, after answer, calls, on the thread that
    read the request."""
    rows = []
    current = None
    for c in calls:
        if current and c["tid"] != current["tid"]:
            continue
        if c["name"] in READS and c["fd"] in client_fds and c["ret"] > 0:
            if current and "answered" in current:
                rows.append(current)
            current = {"tid": c["tid"], "read": c["end"], "calls": 1}
            continue
        if not current:
            continue
        current["calls"] += 1
        if c["name"] in WRITES and c["fd"] in upstream_fds and "sent" not in current:
            current["sent"] = c["start"]
        elif c["name"] in READS and c["fd"] in upstream_fds and c["ret"] > 0 and "sent" in current:
            current.setdefault("upstream_read", c["end"])
        elif c["name"] in WRITES and c["fd"] in client_fds and "upstream_read" in current:
            current.setdefault("answered", c["start"])
            current.setdefault("written", c["end"])
        elif c["name"].startswith("epoll") and "written" in current and "parked" not in current:
            current["parked"] = c["start"]
    done = [r for r in rows if {"sent", "upstream_read", "answered", "parked"} <= r.keys()]
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return {
        "requests": len(done),
        "before_upstream_us": med([r["sent"] - r["read"] for r in done]),
        "upstream_us": med([r["upstream_read"] - r["sent"] for r in done]),
        "after_upstream_us": med([r["answered"] - r["upstream_read"] for r in done]),
        "after_answer_us": med([r["parked"] - r["written"] for r in done]),
        "calls": med([r["calls"] for r in done]),
    }


def main():
    binary = run.arg("--binary", str(run.target_dir() / "release" / "switchyard"))
    model, seconds = run.arg("--model", "fixed"), run.arg("--seconds", 5)
    port_base = run.arg("--port-base", 19951)
    run.ensure_tools(redis=False, perf=True)
    env = run.gateway_env()
    with run.mock_and_nginx(binary, env, port_base, "switchyard-critical-") as (work, _, nginx_pids, procs):
        port = port_base + 2
        gw = run.start_gateway(binary, work, "gw", port, env)
        procs.append(gw)
        targets = [("nginx", port_base + 1, nginx_pids[0], "sim"), ("switchyard", port, gw.pid, f"bench-{model}")]
        results = {}
        for label, listen, pid, name in targets:
            url = f"http://127.0.0.1:{listen}/v1/chat/completions"
            run.wrk(url, run.body(name), 1, work)  # warm-up, and the upstream connection opened
            p50, calls, client, upstream = traced(pid, url, run.body(name), seconds, work, listen, port_base)
            results[label] = dict(segments(calls, client, upstream), p50_ms=p50)
            print(f"{label}: {results[label]}", flush=True)
        print(f"\none client, {seconds} s, `{model}`, µs per request (medians; perf trace on):")
        keys = ["before_upstream_us", "upstream_us", "after_upstream_us", "after_answer_us", "calls", "p50_ms"]
        print(f"{'':22}" + "".join(f"{label:>12}" for label in results))
        for k in keys:
            print(f"{k:22}" + "".join(f"{results[label][k]:12.3f}" for label in results))

if __name__ == "__main__":
    main()
