#!/usr/bin/env python3
"""What the gateway keeps resident when it is idle: after startup, and after a burst of load.

Run: `python3 bench/idle_rss.py --binary A [--binary B ...] [--rounds N] [--port-base N] [--cold]` (release
builds; the strategies from `$CARGO_TARGET_DIR/strategies`, else `target/strategies`). For each
round and each binary, alternating so that drift on a shared machine falls on both: the suite's
configuration (`bench/run.py`, 20 models per strategy) behind a fresh mock; the RSS 1 s after the
gateway answers, with what it is made of (from /proc/PID/smaps: the allocator's heap, the binary's
code, the strategies' memory images and compiled code, the rest); then 5 s of 32 clients
(`wrk`) of non-streaming requests and 5 s of streams, each followed by its RSS at once and after 3
quiet seconds. Prints the median of the rounds per binary. `--cold` starts each gateway on an
empty compiled-code cache of its own, as a container's first start is: it compiles every strategy
instead of loading it. RSS is a count of pages, not a time:
the machine's load does not change it, only what the process did.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (shares config, mock, bodies and port offsets with the suite)


# Seconds of each load before its RSS is read.
LOAD_S = 5


def args(name):
    return [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == name and i + 1 < len(sys.argv)]


def smaps_parts(pid, binary):
    """RSS in MiB by what the mapping holds."""
    parts = {"heap": 0, "code": 0, "images": 0, "jit": 0, "other": 0}
    part = "other"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):
            perms, name = fields[1], (fields[5] if len(fields) > 5 else "")
            if name == "" and perms == "rw-p":
                part = "heap"  # mimalloc's arenas, thread stacks, wasm linear memory outside the image
            elif name == "" and "x" in perms:
                part = "jit"
            elif name.startswith("/memfd:wasm-memory-image"):
                part = "images"
            elif Path(name).name == Path(binary).name:
                part = "code"
            else:
                part = "other"
        elif fields[0] == "Rss:":
            parts[part] += int(fields[1]) / 1024
    return parts


def measure(binary, strategies, cold):
    env = dict(os.environ, RUST_LOG="warn", ROUTING_AFFINITY_ENABLED="0", SWITCHYARD_DEFAULT_AUTH="disabled",
               SWITCHYARD_BUILTIN_STRATEGIES=str(strategies))
    work = Path(tempfile.mkdtemp(prefix="switchyard-idle-rss-"))
    if cold:
        env["SWITCHYARD_CACHE_DIR"] = str(work / "cache")
    (work / "bench.yaml").write_text(bench.gateway_config(work))
    port = bench.PORTS["switchyard"]
    url = f"http://127.0.0.1:{port}"
    mock = bench.start_mock(binary, env)
    gw = subprocess.Popen([binary, "serve", "--config", str(work / "bench.yaml"), "--listen", f"127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, env=env)
    try:
        bench.wait_http(f"http://127.0.0.1:{bench.PORTS['mock']}/health")
        bench.wait_http(url + "/health", proc=gw)
        time.sleep(1)
        row = {"idle": bench.rss_mib(gw.pid), **smaps_parts(gw.pid, binary)}
        for stream in (False, True):
            kind = "streams" if stream else "requests"
            bench.wrk(url + "/v1/chat/completions", bench.body("bench-fixed", stream), 32, work)
            row[f"after {kind}"] = bench.rss_mib(gw.pid)
            time.sleep(3)
            row[f"3 s after {kind}"] = bench.rss_mib(gw.pid)
        return row
    finally:
        for p in (gw, mock):
            p.terminate()
            p.wait(10)


def main():
    binaries = args("--binary")
    if not binaries:
        sys.exit("usage: idle_rss.py --binary PATH [--binary PATH ...] [--rounds N] [--port-base N] [--cold]")
    rounds = int((args("--rounds") or ["3"])[0])
    bench.DURATION = LOAD_S  # the suite's wrk run, shorter: the load only has to be served
    strategies = bench.target_dir() / "strategies"
    bench.ensure_tools(redis=False)
    rows = {b: [] for b in binaries}
    for r in range(rounds):
        for b in binaries:
            rows[b].append(measure(b, strategies, "--cold" in sys.argv))
            print(f"round {r + 1} {b}: " + ", ".join(f"{k} {v:.1f}" for k, v in rows[b][-1].items()), flush=True)
    keys = list(rows[binaries[0]][0])
    print("\nMiB, median of", rounds, "rounds\n")
    print("| binary | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for b in binaries:
        print(f"| {b} | " + " | ".join(f"{statistics.median(row[k] for row in rows[b]):.1f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
