#!/usr/bin/env python3
"""Instructions the gateway spends per request, by kind of request and strategy (callgrind).

Run: `python3 bench/callgrind.py [--skip-build] [--binary PATH] [--mock-binary PATH] [--requests N]
[--repeat N] [--port-base N] [--keep-dumps DIR]` (needs
valgrind; installs it from Debian packages when missing). It starts `switchyard mock-upstream`
natively and the release gateway under `valgrind --tool=callgrind --instr-atstart=no`, warms each
phase up with instrumentation off, then counts a fixed number of sequential requests per phase with
`callgrind_control -i on/off` (a window closes a flush interval after its last request, so it holds
its own request-log rows, and what that idle wait costs alone is taken off), `--repeat` times
(default 3), dumping each window separately. Counts
are the gateway's user-space instructions only; they do not depend on the machine's load, so two
binaries compare exactly. `SWITCHYARD_METRICS=off` in the environment counts without metrics.
`--fleet` makes the gateway a one-replica fleet on the machine's Redis (its rate-limit counters
live there). `--traces` turns traces on: the gateway exports OTLP to a sink this script serves on loopback
(it answers every POST with 200 and keeps nothing), so a run with and one without it give what
traces cost per request, exporting included.

Periodic work is kept out of the windows where it can be: strategy ticks are off, and each window
starts after the request log has written the rows of what came before (it flushes every 250 ms).
What stays in is the writing of the window's own rows, a per-request cost; SQLite's WAL checkpoint
(every 1000 pages) lands in one window or another, which is why each phase is counted several
times: the median is reported with the spread.

Phases: non-streaming requests with `fixed`, `round_robin`, `routewise`, and with `fixed` for a
40-turn (~32 KiB) conversation; OpenAI streams (20
events) with `fixed`; Anthropic client to OpenAI upstream streams with `fixed`; Anthropic client
to Anthropic upstream streams. `--phases stream,Anthropic` keeps the phases whose names contain
one of the words (`--phases "stream, fixed|Anthropic"`, split on `|`, keeps the three streams only). Prints a table of
instructions per request (also split into the request path and the request log's SQLite thread, each
the median of its own windows) and the top functions by self cost of each phase (from `callgrind_annotate`),
and writes bench/results/callgrind.json. The gateway runs with `SWITCHYARD_WASM_PROFILER=perfmap`, so
a strategy's compiled code shows in those tables as `wasm <function>` instead of `???:0x…` (a
binary without the knob ignores it; `--keep-dumps` keeps the map beside the dumps as `perf.map`).
"""

import bisect
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (shares build, config and request bodies with the suite)

ROOT = bench.ROOT


def long_conversation():
    """A chat body of 40 alternating turns of ~800 bytes each (~32 KiB), for `fixed`."""
    turn = "The quick brown fox jumps over the lazy dog, again and again. " * 13
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {turn}"} for i in range(40)]
    return json.dumps({"model": "bench-fixed", "messages": messages})


def arg(name, default):
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


# `--port-base N`: the mock on N, the gateway on N + 2 (another benchmark may hold the defaults).
PORT_MOCK = int(arg("--port-base", "19201"))
PORT_GW = PORT_MOCK + 2


REQUESTS = int(arg("--requests", "1000"))
REPEAT = int(arg("--repeat", "3"))
WARMUP = 200
# Longer than the request log's flush interval (250 ms), also under valgrind's slowdown.
SETTLE_S = 2.0


def post(conn, path, payload, headers):
    conn.request("POST", path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data[:200]!r}")


def drive(n, path, payload, headers):
    conn = http.client.HTTPConnection("127.0.0.1", PORT_GW, timeout=60)
    for _ in range(n):
        post(conn, path, payload, headers)
    conn.close()


def callgrind_control(*args):
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def total_of(path):
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


# The request log's SQLite connection thread (sqlx runs each connection on a thread of its own): its
# work depends on the batch sizes, B-tree page splits and WAL checkpoints that fall in a window
# (12,000 to 45,000 instructions per request between windows of one binary), so it is reported
# apart from the request path, and each is the median of its own windows.
DB_THREAD = re.compile(r"sqlx-sqlite-[\d.]+/src/connection/worker\.rs:std::sys::backtrace::__rust_begin_short_backtrace")


def database_thread_of(path):
    """Instructions of `path`'s window on the request log's SQLite thread (inclusive of its root)."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", path],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if DB_THREAD.search(line):
            return int(line.split()[0].replace(",", ""))
    return 0


def median(values):
    return sorted(values)[len(values) // 2]


def count_window(gw, work, label, during):
    """Counts `during()` and the flush interval after it (instrumentation on from before it to
    SETTLE_S after it) as one dump labelled `label`; returns the dump's path."""
    callgrind_control("--zero", str(gw.pid))
    callgrind_control("-i", "on", str(gw.pid))
    during()
    time.sleep(SETTLE_S)
    callgrind_control("-i", "off", str(gw.pid))
    callgrind_control("-d", label, str(gw.pid))
    time.sleep(1)
    return str(sorted(work.glob(f"cg.out.{gw.pid}.*"), key=os.path.getmtime)[-1])


def perf_map(pid):
    """`(start, end, name)` of the strategy code wasmtime compiled in process `pid`, sorted: the
    gateway runs with `SWITCHYARD_WASM_PROFILER=perfmap`, which writes them to /tmp/perf-<pid>.map
    (valgrind keeps the pid). Callgrind knows JIT code only by address (`???:0x…`)."""
    entries = []
    path = Path(f"/tmp/perf-{pid}.map")
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3:
                start, size = int(parts[0], 16), int(parts[1], 16)
                entries.append((start, start + size, parts[2]))
    return sorted(entries)


JIT_ADDRESS = re.compile(r"\?\?\?:0x([0-9a-f]+) \[\?\?\?\]")


def named(function, entries):
    """`function` with a JIT address replaced by the strategy function that holds it."""
    m = JIT_ADDRESS.fullmatch(function)
    if not m or not entries:
        return function
    address = int(m.group(1), 16)
    i = bisect.bisect_right(entries, (address, float("inf"), "")) - 1
    if i >= 0 and entries[i][0] <= address < entries[i][1]:
        return f"wasm {entries[i][2]}"
    return function


def top_functions(path, n=25, entries=()):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=99", "--auto=no", path],
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*([\d.]+)%\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            rows.append((int(m.group(1).replace(",", "")), named(m.group(3).strip(), entries)))
    return rows[:n]


def start_otlp_sink():
    """An OTLP/HTTP endpoint that accepts every export and keeps nothing; returns its port."""
    import http.server
    import threading

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def main():
    if shutil.which("valgrind") is None:
        bench.sh("apt-get", "install", "-y", "-qq", "valgrind")
    binary = Path(arg("--binary", "")) if "--binary" in sys.argv else bench.build()
    work = Path(tempfile.mkdtemp(prefix="switchyard-callgrind-"))
    env = bench.gateway_env(SWITCHYARD_WASM_PROFILER="perfmap")
    traces = "--traces" in sys.argv
    # `--keep-dumps DIR`: copy each phase's median window there, for `callgrind_annotate --inclusive=yes`
    # or a caller tree (the work directory is removed at the end).
    keep_dumps = Path(arg("--keep-dumps", "")) if "--keep-dumps" in sys.argv else None
    if traces:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{start_otlp_sink()}"
        # Export once a second, so each counted window holds its share of exports.
        env["OTEL_BSP_SCHEDULE_DELAY"] = "1000"
    bench.PORTS["mock"] = PORT_MOCK
    bench.PORTS["slow_mock"] = PORT_MOCK
    # Only the measured models: each wasm instance reserves 4 GiB of address space, and valgrind's
    # is much smaller than the kernel's.
    bench.IDLE_MODELS_PER_STRATEGY = 1
    # No strategy ticks: periodic wasm calls would land in the counted windows by chance.
    # `--fleet`: the gateway is a one-replica fleet, so the rate-limited phase checks its limits in
    # Redis (the gateway's instructions only: Redis's own are not counted).
    fleet = "--fleet" in sys.argv
    (work / "gw.yaml").write_text(bench.gateway_config(work, fleet=fleet) + "strategies:\n  tick_interval_ms: 0\n")
    procs = []
    try:
        # `--mock-binary PATH`: the mock from another build, so that two gateways whose own mock
        # writes different bytes (key order, say) are counted against the same upstream.
        mock = Path(arg("--mock-binary", str(binary)))
        procs.append(subprocess.Popen([mock, "mock-upstream", "--port", str(PORT_MOCK), "--completion-tokens",
                                       str(bench.COMPLETION_TOKENS)], stdout=subprocess.DEVNULL, env=env))
        bench.wait_http(f"http://127.0.0.1:{PORT_MOCK}/health")
        gw = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                               f"--callgrind-out-file={work}/cg.out.%p", binary, "serve", "--config",
                               str(work / "gw.yaml"), "--listen", f"127.0.0.1:{PORT_GW}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        procs.append(gw)
        # Under valgrind, start-up (compiling and instantiating the strategies) takes minutes.
        bench.wait_http(f"http://127.0.0.1:{PORT_GW}/health", timeout=1200)
        json_headers = {"content-type": "application/json"}
        anthropic_headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        phases = [
            ("non-streaming, fixed", "/v1/chat/completions", bench.body("bench-fixed"), json_headers),
            ("non-streaming, round_robin", "/v1/chat/completions", bench.body("bench-round_robin"), json_headers),
            ("non-streaming, routewise", "/v1/chat/completions", bench.body("bench-routewise"), json_headers),
            # A conversation of 40 turns (~32 KiB): what grows with the body (its reading, copies).
            ("non-streaming, fixed, 32 KiB conversation", "/v1/chat/completions", long_conversation(),
             json_headers),
            # `fixed` through a route whose rate-limit plugin never refuses: the check's cost.
            ("non-streaming, fixed, rate-limited", "/limited/v1/chat/completions", bench.body("bench-fixed"),
             json_headers),
            ("stream, fixed", "/v1/chat/completions", bench.body("bench-fixed", stream=True), json_headers),
            ("Anthropic client → OpenAI stream, fixed", "/v1/messages",
             bench.body("bench-fixed", stream=True, dialect="anthropic"), anthropic_headers),
            ("Anthropic stream, fixed", "/v1/messages",
             bench.body("bench-anthropic", stream=True, dialect="anthropic"), anthropic_headers),
        ]
        # `--phases a,b`: only the phases whose names contain one of these words; `a|b` when a word
        # holds a comma (`--phases "stream, fixed|Anthropic"`: the streams, not `non-streaming, fixed`).
        spec = arg("--phases", "")
        wanted = [w.strip() for w in spec.split("|" if "|" in spec else ",") if w.strip()]
        if wanted:
            phases = [p for p in phases if any(w in p[0] for w in wanted)]
        # What a window's closing wait costs with no requests (timers, the log writer waking up):
        # the median of three idle windows, taken off every window's total.
        drive(WARMUP, *phases[0][1:])
        idle_windows = []
        for w in range(3):
            time.sleep(SETTLE_S)
            idle_windows.append(total_of(count_window(gw, work, f"idle-{w}", lambda: None)))
        idle = median(idle_windows)
        print(f"an idle {SETTLE_S} s wait: {idle:,} instructions (median of {idle_windows}), taken off each "
              "window", flush=True)
        results = []
        for i, (name, path, payload, headers) in enumerate(phases):
            drive(WARMUP, path, payload, headers)
            windows = []
            for w in range(REPEAT):
                # The rows of the requests before this window are written outside it, and this
                # window's own rows inside it: the window ends a flush interval after its last
                # request (how many rows spilled past its end varied, and with it the count).
                # What the idle wait costs by itself is measured once and taken off.
                time.sleep(SETTLE_S)
                dump = count_window(gw, work, f"phase{i}-{w}",
                                    lambda: drive(REQUESTS, path, payload, headers))
                windows.append((total_of(dump) - idle, database_thread_of(dump), dump))
            windows.sort()
            total, _, dump = windows[len(windows) // 2]
            request_path = [(t - db) // REQUESTS for t, db, _ in windows]
            database = [db // REQUESTS for _, db, _ in windows]
            if keep_dumps:
                keep_dumps.mkdir(parents=True, exist_ok=True)
                shutil.copy(dump, keep_dumps / f"phase{i}.{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}.out")
                if Path(f"/tmp/perf-{gw.pid}.map").exists():
                    shutil.copy(f"/tmp/perf-{gw.pid}.map", keep_dumps / "perf.map")
            per_window = [t // REQUESTS for t, _, _ in windows]
            results.append({"phase": name, "instructions_per_request": total // REQUESTS,
                            "windows": per_window,
                            "request_path_per_request": median(request_path),
                            "request_path_windows": request_path,
                            "database_thread_per_request": median(database),
                            "database_thread_windows": database,
                            "top": [(c // REQUESTS, f) for c, f in top_functions(dump, entries=perf_map(gw.pid))]})
            print(f"{name}: {total // REQUESTS:,} instructions per request (median of {per_window}); "
                  f"request path {median(request_path):,} (of {request_path}), request log's SQLite thread "
                  f"{median(database):,} (of {database})", flush=True)
        out = ROOT / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "callgrind.json").write_text(json.dumps({"requests_per_phase": REQUESTS, "repeat": REPEAT,
                                                        "idle_wait_instructions": idle,
                                                        "metrics": os.environ.get("SWITCHYARD_METRICS", "on"),
                                                        "traces": "on" if traces else "off",
                                                        "fleet": fleet,
                                                        "phases": results}, indent=2))
        print()
        for r in results:
            print(f"## {r['phase']}: {r['instructions_per_request']:,} per request (windows {r['windows']}; "
                  f"request path {r['request_path_per_request']:,}, SQLite thread {r['database_thread_per_request']:,})")
            for cost, fn in r["top"]:
                print(f"{cost:>9,}  {fn[:150]}")
            print()
    finally:
        bench.stop_processes(list(reversed(procs)), timeout=30)
        for gw_proc in procs[1:]:
            Path(f"/tmp/perf-{gw_proc.pid}.map").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
