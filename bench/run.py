#!/usr/bin/env python3
"""Overhead benchmark: Switchyard against calling the mock upstream directly and against nginx as a
plain reverse proxy (proxy_pass with upstream keepalive), with the same load generator (wrk).

Run: `python3 bench/run.py` (installs wrk and nginx from Debian packages when missing, builds the
release binary and the strategies). `--pgo` measures the profile-guided build the container image
ships instead (`cargo xtask build-pgo`, `<target>/pgo/switchyard`). `--quick` runs 3 s per point instead of 10 s and leaves the
README alone; `--skip-build` uses the binary already built (from `$CARGO_TARGET_DIR`, else `target/`).

Peer gateways get rows in the same tables, behind the same mock, with the same requests and load
(each checked with one request first; its CPU is summed over every process of its session):
  * the Portkey gateway (npm `@portkey-ai/gateway`, pinned), installed under
    `<target>/bench-peers/portkey` when missing and run with Node; `--skip-peers` leaves peers out;
  * the LiteLLM proxy (PyPI `litellm[proxy]`, pinned) only with `--litellm`, as its install takes
    minutes: a venv in `~/.cache/switchyard/bench-peers/litellm-venv`, outside the clone;
  * `--peers-only` measures only direct, nginx and the peers (no gateway started; with
    `--skip-build` no cargo either), for a quick look at the peer rows; it writes
    bench/results/peers-latest.json and .md and leaves latest.* alone. E.g.
    `CARGO_TARGET_DIR=… python3 bench/run.py --skip-build --peers-only --quick [--litellm]`.
`--port-base N` moves every port the suite listens on by the same offset (from 19101).

It measures, in one run:
  * non-streaming and streaming requests at 1, 32 and 256 clients: direct, nginx, and the gateway
    with `fixed`, `round_robin` and `routewise` (req/s, p50/p99, CPU per request of the proxy);
  * streams with translation (Anthropic Messages client, OpenAI Chat upstream) beside the same
    load without it, for the CPU per relayed stream;
  * time to first byte of a stream (sequential requests), gateway and nginx against direct;
  * memory: the gateway's RSS idle with 20 models per strategy on a first start (an empty
    compiled-code cache, so every strategy is compiled), after the load, and while holding
    10,000 idle streams from a mock that trickles its tokens;
  * the gateway's CPU seconds over 30 s while 10,000 idle keep-alive client connections are open,
    beside the same window without them (`--idle-connections [BINARY]` measures only this).
Writes bench/results/latest.json and latest.md, prints the tables and, on a full run, replaces the
table between the `bench:start` / `bench:end` markers in README.md.

`python3 bench/run.py --memory [--binary PATH]` measures instead the memory one large request
costs (issue #15 item 6): for each pair of client and upstream dialect and three body shapes near
the 32 MiB body limit, the gateway's peak RSS growth while it serves 1, then 8 concurrent copies
(a fresh gateway per figure; peak from /proc/PID/status VmHWM after resetting it through
/proc/PID/clear_refs). Writes bench/results/memory-latest.json and prints the table. `--binary`
measures another build (e.g. main's, for a before/after); otherwise the release build is used.

Everything runs on loopback on this machine; the load generator, the proxies and the mock upstream
share its cores, so absolute figures are pessimistic — compare the ratios measured in one run.
"""

import asyncio
import contextlib
import http.client
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICK = "--quick" in sys.argv
SKIP_BUILD = "--skip-build" in sys.argv
# The gateway as the container image builds it: profile-guided (`cargo xtask build-pgo`).
PGO = "--pgo" in sys.argv
DURATION = 3 if QUICK else 10
CONCURRENCY = [1, 32, 256]
TTFB_REQUESTS = 200 if QUICK else 1000
IDLE_STREAMS = 10_000
COMPLETION_TOKENS = 16
PORTS = {"mock": 19101, "nginx": 19102, "switchyard": 19103, "slow_mock": 19104, "switchyard_one_thread": 19105,
         "switchyard_idle": 19106, "switchyard_fleet": 19107, "switchyard_shared": 19108, "portkey": 19109,
         "litellm": 19110, "switchyard_pair_default": 19111, "switchyard_pair_one_thread": 19112}
# `--port-base N` moves every port by the same offset (another benchmark may hold the defaults).
if "--port-base" in sys.argv:
    _offset = int(sys.argv[sys.argv.index("--port-base") + 1]) - PORTS["mock"]
    PORTS = {name: port + _offset for name, port in PORTS.items()}
SKIP_PEERS = "--skip-peers" in sys.argv
PEERS_ONLY = "--peers-only" in sys.argv
LITELLM = "--litellm" in sys.argv
PORTKEY_VERSION = "1.15.2"
# Portkey's release of that version (its lock file, its Node 20 image) serves with these; npm would
# resolve the package's open ranges to newer ones, and with @hono/node-server >= 1.14 every stream
# answers 500 (Portkey appends headers to the upstream's immutable ones, which those versions keep).
PORTKEY_OVERRIDES = {"hono": "4.9.7", "@hono/node-server": "1.13.5", "@hono/node-ws": "1.2.0"}
# The newest whose `proxy` extra resolves on the registry this project reaches: later ones pin
# litellm-enterprise and litellm-proxy-extras releases (and a litellm-proxy package) that are not there.
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = Path.home() / ".cache" / "switchyard" / "bench-peers" / "litellm-venv"
# A peer that takes longer than this to answer its first health check has failed to start.
PEER_START_S = 180
# wrk leaves answers slower than its timeout (2 s by default) out of its latency figures and counts
# them as errors; a peer at 256 clients answers in seconds, and its p50 would read 0.
WRK_TIMEOUT_S = 30
# The fleet gateway's Redis (its rate-limit counters live there): the machine's, started when silent.
REDIS_URL = "redis://127.0.0.1:6379"
# The CPU cost of idle client connections (issue #15): keep-alive connections after one request.
IDLE_CONNECTIONS = 10_000
IDLE_WINDOW_S = 10 if QUICK else 30
# The gateway runs on its default configuration (issue #18: what users run), one serving thread per
# core but one on per-core runtimes; nginx runs one worker process. A second gateway with one thread
# (`SWITCHYARD_WORKER_THREADS=1`, nginx's share of the machine) and a third on the shared
# work-stealing runtime are measured beside it, non-streaming.
ONE_THREAD = "1"
PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]
STRATEGIES = ("fixed", "round_robin", "routewise")
IDLE_MODELS_PER_STRATEGY = 20

# The targets of issue #18, checked against this run (all with `fixed`, on the default configuration),
# as multiples of nginx's hop measured in the same run: the machine's speed cancels out.
TARGETS = {
    "cpu_vs_nginx": 2.0,
    "rps_vs_nginx_c32": 0.5,
    "stream_cpu_vs_nginx": 2.5,
    "translated_stream_cpu_vs_nginx": 4.0,
    "added_p50_ms_c1": 0.05,
    # The default must not cost more per request than one thread does.
    "default_vs_one_thread_cpu": 1.0,
    "routewise_vs_fixed": 0.8,
    "rss_idle_mib": 60.0,
    "rss_idle_streams_mib": 1024.0,
}


def body(model, stream=False, dialect="openai"):
    if dialect == "anthropic":
        b = {"model": model, "max_tokens": 256, "messages": PROMPT}
    else:
        b = {"model": model, "messages": PROMPT}
    if stream:
        b["stream"] = True
        if dialect == "openai":
            # The gateway asks Chat upstreams for usage; ask for it directly too, so every target
            # relays the same events.
            b["stream_options"] = {"include_usage": True}
    return json.dumps(b)


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def ensure_tools(redis=True, perf=False):
    wanted = {"wrk": "wrk", "nginx": "nginx"}
    if perf:
        wanted["perf"] = "linux-perf"
    if not SKIP_PEERS:
        wanted.update(node="nodejs", npm="npm")
    missing = [pkg for tool, pkg in wanted.items()
               if shutil.which(tool) is None and not Path("/usr/sbin/" + tool).exists()]
    if missing:
        sh("apt-get", "update", "-qq")
        sh("apt-get", "install", "-y", "-qq", *missing)
    if not redis:
        return
    ping = ["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"]
    if subprocess.run(ping, capture_output=True).returncode != 0:
        sh("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379", "--save", "")
        time.sleep(0.5)


def raise_fd_limit():
    """`ulimit -n` for this process and its children: 10,000 streams are 10,000 client sockets
    here, and as many client plus upstream sockets in the gateway."""
    want = 4 * IDLE_STREAMS + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for limit in ((max(want, hard), max(want, hard)), (hard, hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def arg(name, default):
    """The command-line value after `name`, as `default`'s type; `default` when not given."""
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


@contextlib.contextmanager
def mock_and_nginx(binary, env, port_base, prefix):
    """The mock on `port_base` and nginx proxying to it on `port_base + 1`, in a fresh work folder:
    yields `(work, mock, nginx_pids, procs)`. Processes appended to `procs` (gateways) are stopped
    with the mock and nginx on the way out."""
    PORTS.update(mock=port_base, nginx=port_base + 1)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    procs = []
    try:
        mock = start_mock(binary, env)
        procs.append(mock)
        wait_http(f"http://127.0.0.1:{port_base}/health")
        yield work, mock, start_nginx(work, nginx_bin), procs
    finally:
        stop_nginx(work, nginx_bin)
        stop_processes(procs)


def gateway_env(**extra):
    """The environment the benchmarks run the gateway and its mock in: warnings only, session
    affinity and authentication off, the built strategies; `extra` on top."""
    return dict(os.environ, RUST_LOG="warn", ROUTING_AFFINITY_ENABLED="0", SWITCHYARD_DEFAULT_AUTH="disabled",
                SWITCHYARD_BUILTIN_STRATEGIES=str(target_dir() / "strategies"), **extra)


def build():
    if PGO:
        if not SKIP_BUILD:
            sh("cargo", "xtask", "build-pgo", cwd=ROOT)
        return target_dir() / "pgo" / "switchyard"
    if not SKIP_BUILD:
        sh("cargo", "xtask", "build-strategies", cwd=ROOT)
        sh("cargo", "build", "--release", "-p", "switchyard", cwd=ROOT)
    return target_dir() / "release" / "switchyard"


def wait_http(url, timeout=30, proc=None, pause_s=0.1, attempt_s=1):
    """Waits for `url` to answer; with `proc`, gives up as soon as that process exits."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=attempt_s)
            return
        except Exception:
            time.sleep(pause_s)
    raise RuntimeError(f"{url} did not come up within {timeout} s")


def stat_times(stat):
    """User and system CPU seconds from the text of a `/proc/<pid>/stat` or
    `/proc/<pid>/task/<tid>/stat` file."""
    fields = stat.rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def cpu_seconds(pid):
    return sum(stat_times(Path(f"/proc/{pid}/stat").read_text()))


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def to_ms(value):
    m = re.match(r"([\d.]+)(us|ms|s)", value)
    number, unit = float(m.group(1)), m.group(2)
    return number / 1000 if unit == "us" else number * 1000 if unit == "s" else number


def machine():
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{platform.node()} ({os.cpu_count()} cores, {cpu}, Linux {platform.release()})"


def wrk_script(payload, script_dir, headers=None):
    """The wrk script that POSTs `payload` as JSON (with `headers`), written in `script_dir`."""
    lua = script_dir / "wrk.lua"
    # JSON string literals are valid Lua string literals for the ASCII text used here.
    extra = "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in (headers or {}).items())
    lua.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"{extra}wrk.body = {json.dumps(payload)}\n"
    )
    return lua


def wrk(url, payload, concurrency, script_dir, headers=None):
    """`headers` are sent with every request besides the content type (a peer's routing headers)."""
    lua = wrk_script(payload, script_dir, headers)
    threads = min(2, concurrency)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{DURATION}s", f"--timeout={WRK_TIMEOUT_S}s", "--latency",
         "-s", str(lua), url],
        check=True, capture_output=True, text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    p = {k: to_ms(v) for k, v in re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    return {"rps": rps, "requests": requests, "p50_ms": p["50"], "p99_ms": p["99"],
            "errors": (int(errors.group(1)) if errors else 0)
            + (sum(int(g) for g in socket_errors.groups()) if socket_errors else 0)}


def wrk_cpu(url, payload, concurrency, script_dir, pid):
    """`wrk` as above, plus the CPU the process `pid` spent per request over the run (from
    /proc/<pid>/stat) as `cpu_us_per_request`."""
    before = cpu_seconds(pid)
    r = wrk(url, payload, concurrency, script_dir)
    r["cpu_us_per_request"] = (cpu_seconds(pid) - before) * 1e6 / max(r["requests"], 1)
    return r


def stop_processes(procs, timeout=10):
    """SIGTERM to every process, then waits for each; kills what has not exited by `timeout`."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()


def count_events(url, payload, headers=None):
    """SSE `data:` events in one answer, to say what a 'stream' is in the tables."""
    return len(sse_data(url, payload, headers))


def sse_data(url, payload, headers=None):
    """The `data:` payloads of one streamed answer, in order."""
    req = urllib.request.Request(url, data=payload.encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        return [line[5:].strip() for line in r.read().decode().splitlines() if line.startswith("data:")]


def ttfb(host, port, path, payload, n):
    """Sequential streaming requests on one keep-alive connection: time from sending the request
    to the first byte of the body (the first SSE event), in ms."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    samples = []
    headers = {"Content-Type": "application/json"}
    for i in range(n + 20):
        t0 = time.perf_counter()
        conn.request("POST", path, body=payload, headers=headers)
        resp = conn.getresponse()
        first = resp.read1(65536)
        t1 = time.perf_counter()
        resp.read()
        if resp.status != 200 or not first:
            raise RuntimeError(f"TTFB request to :{port}{path} answered {resp.status}")
        if i >= 20:  # warm-up
            samples.append((t1 - t0) * 1000)
    conn.close()
    samples.sort()
    return {"p50_ms": samples[len(samples) // 2], "p99_ms": samples[int(len(samples) * 0.99)],
            "requests": n}


async def hold_streams(port, path, payload, n, gateway_pid, settle_s):
    """Opens `n` streams that stay idle after their first event; returns the gateway's RSS while
    all are open. Connections are opened 256 at a time to stay inside the listen backlog."""
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n{payload}").encode()
    writers = []
    opened = 0
    failures = []
    gate = asyncio.Semaphore(256)

    async def one():
        nonlocal opened
        async with gate:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                await writer.drain()
                seen = b""
                while b"data:" not in seen:
                    chunk = await asyncio.wait_for(reader.read(4096), 30)
                    if not chunk:
                        raise RuntimeError("closed before the first event")
                    seen += chunk
                writers.append(writer)
                opened += 1
            except Exception as e:  # noqa: BLE001 - reported as a count
                failures.append(repr(e))

    started = time.time()
    await asyncio.gather(*(one() for _ in range(n)))
    open_s = time.time() - started
    await asyncio.sleep(settle_s)
    rss = rss_mib(gateway_pid)
    for w in writers:
        w.close()
    return {"streams": opened, "failed": len(failures), "first_failure": failures[0] if failures else None,
            "open_s": open_s, "rss_mib": rss}


async def hold_idle_connections(port, n, window_s, gateway_pid):
    """Opens `n` keep-alive connections, each after one `GET /health`, leaves them idle and returns
    the gateway's CPU seconds over `window_s` while they stay open, with how many stayed open."""
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    writers = []
    failures = []
    gate = asyncio.Semaphore(256)

    async def one():
        async with gate:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
                await asyncio.wait_for(reader.readexactly(length), 30)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
                writers.append((reader, writer))
            except Exception as e:  # noqa: BLE001 - reported as a count
                failures.append(repr(e))

    await asyncio.gather(*(one() for _ in range(n)))
    await asyncio.sleep(1)
    before = cpu_seconds(gateway_pid)
    await asyncio.sleep(window_s)
    cpu = cpu_seconds(gateway_pid) - before
    still_open = sum(1 for r, _ in writers if not r.at_eof())
    for _, w in writers:
        w.close()
    return {"connections": len(writers), "failed": len(failures),
            "first_failure": failures[0] if failures else None, "still_open": still_open, "cpu_s": cpu}


def idle_connection_cost(binary, env, work, n=IDLE_CONNECTIONS, window_s=IDLE_WINDOW_S):
    """The gateway's CPU seconds over `window_s` with no client, then while `n` idle keep-alive
    connections are open. The gateway gets a header timeout longer than the window (where its
    config knows the key) so the connections stay open for the whole measurement."""
    port = PORTS["switchyard_idle"]
    config = work / "idle.yaml"
    base = f"database:\n  url: sqlite://{work}/idle.db\n"
    limits = ("server:\n  header_read_timeout_seconds: 600\n"
              f"  max_connections: {n + 1000}\n")
    config.write_text(base + limits)
    if subprocess.run([binary, "check", "--config", str(config)], capture_output=True, env=env).returncode != 0:
        limits = ""  # a binary without these keys (before issue #15): nothing times out
        config.write_text(base)
    gw = subprocess.Popen([binary, "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        time.sleep(1)
        before = cpu_seconds(gw.pid)
        time.sleep(window_s)
        none = cpu_seconds(gw.pid) - before
        held = asyncio.run(hold_idle_connections(port, n, window_s, gw.pid))
        rss = rss_mib(gw.pid)
    finally:
        gw.send_signal(signal.SIGTERM)
        try:
            gw.wait(40)
        except subprocess.TimeoutExpired:
            gw.kill()
    result = {"binary": str(binary), "window_s": window_s, "cpu_s_no_connections": none,
              "cpu_s_idle_connections": held["cpu_s"], "rss_mib": rss, "limits_configured": bool(limits), **held}
    print(f"idle connections: {held['connections']} open ({held['failed']} failed, {held['still_open']} still open "
          f"at the end): gateway CPU {held['cpu_s']:.3f} s over {window_s} s (without connections "
          f"{none:.3f} s); RSS {rss:.1f} MiB", flush=True)
    return result


def nginx_config(work):
    return f"""
worker_processes 1;
worker_rlimit_nofile 65536;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  upstream mock {{ server 127.0.0.1:{PORTS['mock']}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{PORTS['nginx']};
    location / {{
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""



def start_nginx(work, nginx_bin):
    """Starts nginx from a config in `work`; returns its worker pids (the ones that proxy)."""
    (work / "nginx.conf").write_text(nginx_config(work))
    sh(nginx_bin, "-c", str(work / "nginx.conf"), "-p", str(work))
    time.sleep(0.5)
    master = int((work / "nginx.pid").read_text())
    return [int(p) for p in subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()]


def stop_nginx(work, nginx_bin):
    if (work / "nginx.pid").exists():
        subprocess.run([nginx_bin, "-c", str(work / "nginx.conf"), "-p", str(work), "-s", "stop"], timeout=30)


def start_group(cmd, log, env, groups, cwd=None):
    """Starts a peer in a session of its own: a Node or Python server may fork workers, and the
    session lets them be counted (CPU) and stopped together with it. The process joins `groups` at
    once, so the caller's `finally` stops it whatever fails after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    groups.append(proc)
    return proc


def session_pids(sid):
    """Every live process of session `sid` (a peer and all it forked)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[3]) == sid:
            pids.append(int(stat.parent.name))
    return pids


def stop_group(proc, timeout=15):
    """SIGTERM to the peer's whole process group, then SIGKILL to whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    # Workers can outlive their parent's exit; the group id stays theirs.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout)


def log_tail(log, lines=40):
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def wait_peer(name, proc, url, log, timeout=PEER_START_S):
    """`wait_http` for a peer: stops as soon as it exits, and shows its log on failure."""
    try:
        wait_http(url, timeout, proc=proc, pause_s=0.5, attempt_s=2)
    except RuntimeError as e:
        raise RuntimeError(f"{name}: {e}\n--- {log} (tail) ---\n{log_tail(log)}") from None


def check_peer_answers(peer):
    """One request before the load: a peer that answers errors would otherwise show only as an
    error count after minutes of load. Fails with the peer's log tail."""
    url = peer["base"] + "/v1/chat/completions"
    req = urllib.request.Request(url, data=body(peer["model"]).encode(),
                                 headers={"Content-Type": "application/json", **peer["headers"]})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, answer = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, answer = e.code, e.read()
    except OSError as e:
        status, answer = None, repr(e).encode()
    try:
        choices = json.loads(answer).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if status != 200 or not choices:
        raise RuntimeError(f"{peer['name']} answered {status}: {answer[:500]!r}\n"
                           f"--- {peer['log']} (tail) ---\n{log_tail(peer['log'])}")


def check_peer_streams(peer, events_direct):
    """Whether a streamed answer comes through whole (every event of the mock's, then [DONE]);
    only then does the peer get streaming rows. Returns a note when it does not."""
    try:
        data = sse_data(peer["base"] + "/v1/chat/completions", body(peer["model"], True), peer["headers"])
    except Exception as e:  # noqa: BLE001 - reported in the table's intro
        return f"its streaming failed ({e})"
    if not data or data[-1] != "[DONE]":
        return f"its stream did not end with [DONE] ({len(data)} events)"
    if len(data) != events_direct:
        return f"its stream had {len(data)} events where the mock sends {events_direct}"
    return None


def install_portkey():
    """Installs the pinned Portkey gateway under the target dir (never committed) when it is
    missing or pinned differently there; returns its Node server script."""
    prefix = target_dir() / "bench-peers" / "portkey"
    manifest = json.dumps({"private": True, "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
                           "overrides": PORTKEY_OVERRIDES}, indent=2) + "\n"
    server = prefix / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    package = prefix / "package.json"
    if not server.exists() or not package.exists() or package.read_text() != manifest:
        prefix.mkdir(parents=True, exist_ok=True)
        package.write_text(manifest)
        print(f"installing @portkey-ai/gateway@{PORTKEY_VERSION} in {prefix}", flush=True)
        sh("npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", timeout=900)
    installed = json.loads((server.parent.parent / "package.json").read_text())["version"]
    if installed != PORTKEY_VERSION:
        raise RuntimeError(f"{prefix} holds @portkey-ai/gateway {installed}, not {PORTKEY_VERSION}")
    return server


def start_portkey(work, groups):
    server = install_portkey()
    port = PORTS["portkey"]
    log = work / "portkey.log"
    # `--headless` leaves out the web console and its log stream. The CLI has no host flag: it
    # listens on every interface; the load goes to loopback.
    proc = start_group(["node", server, f"--port={port}", "--headless"], log, dict(os.environ), groups)
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout.strip().lstrip("v")
    peer = {"name": f"portkey gateway {PORTKEY_VERSION} (node {node})", "proc": proc, "log": log,
            "base": f"http://127.0.0.1:{port}", "model": "sim",
            # The OpenAI provider with its base URL replaced by the mock's; the key is never checked.
            "headers": {"x-portkey-provider": "openai",
                        "x-portkey-custom-host": f"http://127.0.0.1:{PORTS['mock']}/v1",
                        "Authorization": "Bearer sk-bench"},
            "how": f"Portkey gateway {PORTKEY_VERSION} (npm `@portkey-ai/gateway`; hono and @hono/node-server at "
                   f"the versions of its release's lock file, as newer ones break its streams) as one Node {node} "
                   "process (`--headless`), sent to the mock by the headers `x-portkey-provider: openai` and "
                   "`x-portkey-custom-host`; it holds the first chunk of every stream for 25 ms (a timer in its "
                   "stream reader), which bounds its one-client stream rate"}
    wait_peer(peer["name"], proc, peer["base"] + "/", log)
    return peer


def installed_litellm(python):
    if not python.exists():
        return None
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                           capture_output=True, text=True, timeout=60)
    return probe.stdout.strip() if probe.returncode == 0 else None


def install_litellm():
    """The pinned LiteLLM proxy in a venv under ~/.cache (its install takes minutes and hundreds of
    MiB, so it outlives a clone); returns its `litellm` command."""
    python = LITELLM_VENV / "bin" / "python"
    if installed_litellm(python) != LITELLM_VERSION:
        print(f"installing litellm[proxy]=={LITELLM_VERSION} in {LITELLM_VENV}", flush=True)
        if not python.exists():
            sh(sys.executable, "-m", "venv", str(LITELLM_VENV), timeout=300)
        sh(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           f"litellm[proxy]=={LITELLM_VERSION}", timeout=1800)
    return LITELLM_VENV / "bin" / "litellm"


def litellm_config(master_key):
    # One model on the mock through LiteLLM's OpenAI provider (the mock never checks the key).
    # The proxy refuses to start without a strong master key, so each run makes one and the load
    # sends it: the check is part of what LiteLLM costs as deployed.
    return f"""model_list:
  - model_name: sim
    litellm_params:
      model: openai/sim
      api_base: http://127.0.0.1:{PORTS['mock']}/v1
      api_key: sk-bench
general_settings:
  master_key: {master_key}
"""


def litellm_env():
    # No database and no cache: LiteLLM would pick either up from these and log spend per request.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "REDIS_HOST")}
    env.update(
        # The price list bundled with the package, not a download at import, which retries with
        # back-off where only the package registries are reachable.
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_TELEMETRY_DISABLED="True",
        # Also uvicorn's level: no access-log line per request (nginx and the gateway write none).
        LITELLM_LOG="ERROR",
    )
    return env


def start_litellm(work, groups):
    litellm = install_litellm()
    port = PORTS["litellm"]
    config = work / "litellm.yaml"
    master_key = "sk-" + secrets.token_hex(32)
    config.write_text(litellm_config(master_key))
    log = work / "litellm.log"
    proc = start_group([litellm, "--config", config, "--host", "127.0.0.1", "--port", str(port),
                        "--num_workers", "1"], log, litellm_env(), groups, cwd=work)
    python = subprocess.run([LITELLM_VENV / "bin" / "python", "--version"], capture_output=True, text=True,
                            timeout=60).stdout.split()[-1]
    peer = {"name": f"litellm {LITELLM_VERSION} (python {python})", "proc": proc, "log": log,
            "base": f"http://127.0.0.1:{port}", "model": "sim", "headers": {"Authorization": f"Bearer {master_key}"},
            "how": f"LiteLLM proxy {LITELLM_VERSION} (PyPI `litellm[proxy]`, Python {python}) started as "
                   "`litellm --config … --num_workers 1` with one model `openai/sim` on the mock, a master key "
                   "(it refuses to start without one) and no database"}
    wait_peer(peer["name"], proc, peer["base"] + "/health/liveliness", log)
    return peer


def start_peers(work, events_direct, groups):
    """Starts and checks the peers this run measures; their processes go into `groups`."""
    if SKIP_PEERS:
        return []
    peers = []
    for start in [start_portkey] + ([start_litellm] if LITELLM else []):
        peer = start(work, groups)
        check_peer_answers(peer)
        peer["stream_note"] = check_peer_streams(peer, events_direct)
        # Read once the peer serves: its workers are forked by then.
        peer["pids"] = session_pids(peer["proc"].pid)
        peers.append(peer)
        print(f"peer   {peer['name']}: pids {peer['pids']}" +
              (f"; no stream rows: {peer['stream_note']}" if peer["stream_note"] else ""), flush=True)
    return peers


def peer_runs(peers):
    """(mode, name, base, model, pids, headers) for each peer, streaming only where it streams."""
    runs = [("json", p["name"], p["base"], p["model"], p["pids"], p["headers"]) for p in peers]
    return runs, [("stream", *r[1:]) for r, p in zip(runs, peers) if not p["stream_note"]]


def peers_summary(peers):
    return [{"name": p["name"], "how": p["how"], "pids": len(p["pids"]), "stream_note": p["stream_note"]}
            for p in peers]


def gateway_config(work, db="bench.db", fleet=False):
    upstream = f"http://127.0.0.1:{PORTS['mock']}/v1"
    models = ""
    for name in STRATEGIES:
        models += (f"  - id: bench-{name}\n    router: {name}\n    route:\n      - kind: openai_compat\n"
                   f"        base_url: {upstream}\n        provider_model_id: sim\n"
                   + ("        pricing: { prompt: 0.1, completion: 0.4 }\n" if name == "routewise" else ""))
    # An Anthropic upstream, for Anthropic clients without translation (bench/callgrind.py).
    models += (f"  - id: bench-anthropic\n    router: fixed\n    route:\n      - kind: anthropic\n"
               f"        base_url: http://127.0.0.1:{PORTS['mock']}\n        provider_model_id: sim\n")
    # The idle streams come from a second mock that trickles its tokens.
    models += (f"  - id: bench-slow\n    router: fixed\n    route:\n      - kind: openai_compat\n"
               f"        base_url: http://127.0.0.1:{PORTS['slow_mock']}/v1\n        provider_model_id: sim\n")
    # More models per strategy, for the idle-memory figure.
    for i in range(IDLE_MODELS_PER_STRATEGY - 1):
        for name in STRATEGIES:
            models += (f"  - id: idle-{name}-{i}\n    router: {name}\n    route:\n      - kind: openai_compat\n"
                       f"        base_url: {upstream}\n")
    # `/` is open as without routes; `/limited` adds a rate-limit plugin whose limits never trigger
    # (one caller here, far below 10^9 a minute), so its row is the cost of the check alone.
    never = 1_000_000_000
    routes = ("routes:\n  - name: open\n    path_prefix: /\n    disable_auth: true\n"
              "  - name: limited\n    path_prefix: /limited\n    disable_auth: true\n"
              "    plugins:\n      rate-limit:\n        limits:\n          - scope: consumer\n"
              f"            requests_per_minute: {never}\n            tokens_per_minute: {never}\n"
              f"            concurrent_requests: {never}\n")
    # The fleet gateway keeps the same limits in Redis (one limit for every replica).
    fleet_section = (f"fleet:\n  redis_url: {REDIS_URL}\n  key_prefix: bench-{os.getpid()}\n"
                     "  deadline_ms: 50\n") if fleet else ""
    return f"database:\n  url: sqlite://{work}/{db}\n{fleet_section}{routes}models:\n{models}"


def start_gateway(binary, work, name, port, env):
    """A gateway on the suite's config with a SQLite file of its own (`work/<name>.db`), returned
    once it answers its health check on `port` (the caller stops it)."""
    config = work / f"{name}.yaml"
    config.write_text(gateway_config(work, f"{name}.db"))
    proc = subprocess.Popen([binary, "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, env=env)
    wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
    return proc


def start_mock(binary, env):
    return subprocess.Popen([binary, "mock-upstream", "--port", str(PORTS["mock"]),
                             "--completion-tokens", str(COMPLETION_TOKENS)], stdout=subprocess.DEVNULL, env=env)


def base_targets(mock_url, nginx_workers):
    """(name, base URL, model, pids) of the references every other row is compared with."""
    return [("direct", mock_url, "sim", []),
            ("nginx", f"http://127.0.0.1:{PORTS['nginx']}", "sim", nginx_workers)]


def measure(work, mode, name, base, model, pids, headers):
    """One target at each client count: wrk's figures and the CPU its processes spent per request."""
    dialect = "anthropic" if "anthropic" in name else "openai"
    path = "/v1/messages" if dialect == "anthropic" else "/v1/chat/completions"
    rows = []
    for c in CONCURRENCY:
        r = measure_point(work, base + path, body(model, mode == "stream", dialect), c, pids, headers)
        r.update(mode=mode, target=name, concurrency=c, dialect=dialect)
        rows.append(r)
        print(f"{mode:6} {name:34} c={c:<4} {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.3f} ms  "
              f"p99 {r['p99_ms']:.3f} ms"
              + (f"  cpu {r['cpu_us_per_request']:.1f} us/req" if r["cpu_us_per_request"] is not None else "")
              + (f"  ERRORS {r['errors']}" if r["errors"] else "")
              + ("" if r["requests"] else "  NO ANSWER COMPLETED"), flush=True)
    return rows


def cpu_ticks():
    """The machine's CPU ticks so far, all and stolen by the hypervisor (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7]


def stolen_share(before, after):
    """The share of the machine's CPU time the hypervisor stole between two `cpu_ticks()`."""
    return (after[1] - before[1]) / max(after[0] - before[0], 1)


def measure_point(work, url, payload, c, pids, headers=None):
    """wrk's figures for one point, the CPU `pids` spent per request over it, once they settled,
    and the share of the machine's CPU the hypervisor stole meanwhile (`stolen`): on a shared VM a
    point with steal was slowed from outside."""
    before = sum(cpu_seconds(p) for p in pids)
    ticks = cpu_ticks()
    r = wrk(url, payload, c, work, headers)
    r["stolen"] = stolen_share(ticks, cpu_ticks())
    after = sum(cpu_seconds(p) for p in pids)
    # A peer slower than the window (LiteLLM streams at 256 clients) may finish no answer in it;
    # a CPU figure per request is then undefined, not the whole window's CPU.
    r["cpu_us_per_request"] = (after - before) * 1e6 / r["requests"] if pids and r["requests"] else None
    settle(pids)
    return r


def settle(pids, idle_share=0.05, window_s=0.2, timeout_s=30):
    """Waits until `pids` use less than `idle_share` of a core: a proxy slower than the load
    (a peer at 256 clients) is still working through queued requests when wrk stops, and would
    take the cores from the next point's measurement."""
    deadline = time.time() + timeout_s
    while pids and time.time() < deadline:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(window_s)
        if sum(cpu_seconds(p) for p in pids) - before < idle_share * window_s:
            return
    if pids:
        print(f"       still busy {timeout_s} s after the load stopped; measuring on", flush=True)


def stop_all(procs, groups, work, nginx_bin):
    # The peers first: requests still queued in them would otherwise meet a stopped mock.
    for g in groups:
        stop_group(g)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    stop_nginx(work, nginx_bin)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def main():
    ensure_tools()
    fd_limit = raise_fd_limit()
    idle_streams = min(IDLE_STREAMS, (fd_limit - 512) // 2)
    binary = build()
    env = gateway_env()
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    procs = []
    groups = []  # the peers, each stopped as a process group
    results = []
    extra = {}
    try:
        procs.append(start_mock(binary, env))
        # Idle streams: the first token at once, then one every 100 s. The first token, not the
        # role-only first event: the gateway commits a stream to its client at the first token
        # (before it, a failure can still fall back), so without it no client saw a byte and every
        # held stream timed out.
        slow = subprocess.Popen([binary, "mock-upstream", "--port", str(PORTS["slow_mock"]),
                                 "--completion-tokens", str(COMPLETION_TOKENS), "--tokens-per-s", "0.01",
                                 "--first-token-at-once"],
                                stdout=subprocess.DEVNULL, env=env)
        procs.append(slow)
        mock_url = f"http://127.0.0.1:{PORTS['mock']}"
        wait_http(mock_url + "/health")
        wait_http(f"http://127.0.0.1:{PORTS['slow_mock']}/health")

        nginx_workers = start_nginx(work, nginx_bin)

        (work / "bench.yaml").write_text(gateway_config(work))
        # A first start: an empty compiled-code cache of its own, so it compiles every strategy as a
        # container's first start does, and its idle RSS below is that start's, whatever ran before.
        gw = subprocess.Popen([binary, "serve", "--config", str(work / "bench.yaml"),
                               "--listen", f"127.0.0.1:{PORTS['switchyard']}"], stdout=subprocess.DEVNULL,
                              env=dict(env, SWITCHYARD_CACHE_DIR=str(work / "first-start-cache")))
        procs.append(gw)
        # Its own database: two processes writing request logs to one SQLite file would contend
        # for its write lock.
        (work / "bench-one-thread.yaml").write_text(gateway_config(work, "bench-one-thread.db"))
        gw_one_thread = subprocess.Popen([binary, "serve", "--config", str(work / "bench-one-thread.yaml"),
                                          "--listen", f"127.0.0.1:{PORTS['switchyard_one_thread']}"],
                                         stdout=subprocess.DEVNULL, env=dict(env, SWITCHYARD_WORKER_THREADS=ONE_THREAD))
        procs.append(gw_one_thread)
        wait_http(f"http://127.0.0.1:{PORTS['switchyard_one_thread']}/health")
        # The default thread count on the shared work-stealing runtime, beside the default per-core ones.
        (work / "bench-shared.yaml").write_text(gateway_config(work, "bench-shared.db"))
        gw_shared = subprocess.Popen([binary, "serve", "--config", str(work / "bench-shared.yaml"),
                                      "--listen", f"127.0.0.1:{PORTS['switchyard_shared']}", "--runtime", "shared"],
                                     stdout=subprocess.DEVNULL, env=env)
        procs.append(gw_shared)
        wait_http(f"http://127.0.0.1:{PORTS['switchyard_shared']}/health")
        # A one-replica fleet: the same limits, decided in Redis (a Lua script per request).
        (work / "bench-fleet.yaml").write_text(gateway_config(work, "bench-fleet.db", fleet=True))
        gw_fleet = subprocess.Popen([binary, "serve", "--config", str(work / "bench-fleet.yaml"),
                                     "--listen", f"127.0.0.1:{PORTS['switchyard_fleet']}"],
                                    stdout=subprocess.DEVNULL, env=env)
        procs.append(gw_fleet)
        wait_http(f"http://127.0.0.1:{PORTS['switchyard_fleet']}/health")
        gw_url = f"http://127.0.0.1:{PORTS['switchyard']}"
        wait_http(gw_url + "/health")
        time.sleep(1)
        rss_idle = rss_mib(gw.pid)
        models_loaded = len(STRATEGIES) * IDLE_MODELS_PER_STRATEGY + 2  # + bench-slow, bench-anthropic

        chat, messages = "/v1/chat/completions", "/v1/messages"
        events = {
            "openai": count_events(mock_url + chat, body("sim", True)),
            "anthropic": count_events(mock_url + messages, body("sim", True, "anthropic")),
        }
        peers = start_peers(work, events["openai"], groups)
        extra["peers"] = peers_summary(peers)
        peer_json, peer_stream = peer_runs(peers)
        targets = base_targets(mock_url, nginx_workers) + [
            (f"switchyard {s}", gw_url, f"bench-{s}", [gw.pid]) for s in STRATEGIES] + [
            # The same as `switchyard fixed` through a route with a rate-limit plugin that never refuses.
            ("switchyard fixed, rate-limited", gw_url + "/limited", "bench-fixed", [gw.pid]),
            # The same limits in Redis; the gateway's CPU only (Redis's own is not counted).
            ("switchyard fixed, rate-limited in Redis", f"http://127.0.0.1:{PORTS['switchyard_fleet']}/limited",
             "bench-fixed", [gw_fleet.pid])]
        runs = [("json", *t, None) for t in targets] + [
            ("json", "switchyard fixed, one thread", f"http://127.0.0.1:{PORTS['switchyard_one_thread']}",
             "bench-fixed", [gw_one_thread.pid], None),
            ("json", "switchyard fixed, shared runtime", f"http://127.0.0.1:{PORTS['switchyard_shared']}",
             "bench-fixed", [gw_shared.pid], None),
        ] + peer_json + [("stream", *t, None) for t in targets] + peer_stream
        # Translation: an Anthropic Messages client; the mock answers it directly in that protocol,
        # the gateway's bench-fixed route speaks OpenAI Chat to the same mock.
        runs += [(mode, name, base, model, pids, None) for mode in ("json", "stream")
                 for name, base, model, pids in (
                     ("direct anthropic", mock_url, "sim", []),
                     ("switchyard fixed anthropic→openai", gw_url, "bench-fixed", [gw.pid]))]
        for run in runs:
            results += measure(work, *run)
        # The peers' rows are done: their timers and background tasks leave the cores to what follows.
        while groups:
            stop_group(groups.pop())
        extra["routewise_pairs"] = paired_routewise(gw_url + chat, gw.pid, work)
        nginx_url = f"http://127.0.0.1:{PORTS['nginx']}"
        # The default-against-one-thread target compares two configurations, so both sides start
        # here, fresh, and serve only the target rounds: the default gateway above has served every
        # table (millions of requests), and a gateway that has measured 2-5 % dearer a request
        # than a fresh one of the same build (`bench/ab.py --warm-up`), which is not what the
        # configuration costs. The CPU-against-nginx targets keep the long-served gateway.
        pair_default = start_gateway(binary, work, "pair-default", PORTS["switchyard_pair_default"], env)
        procs.append(pair_default)
        pair_one = start_gateway(binary, work, "pair-one-thread", PORTS["switchyard_pair_one_thread"],
                                 dict(env, SWITCHYARD_WORKER_THREADS=ONE_THREAD))
        procs.append(pair_one)
        pair_default_url = f"http://127.0.0.1:{PORTS['switchyard_pair_default']}"
        one_url = f"http://127.0.0.1:{PORTS['switchyard_pair_one_thread']}"
        extra["target_rounds"] = target_rounds(work, [
            ("nginx", "json", 32, nginx_url + chat, "sim", "openai", nginx_workers),
            ("fixed", "json", 32, gw_url + chat, "bench-fixed", "openai", [gw.pid]),
            ("fixed, fresh", "json", 32, pair_default_url + chat, "bench-fixed", "openai", [pair_default.pid]),
            ("fixed, fresh, one thread", "json", 32, one_url + chat, "bench-fixed", "openai", [pair_one.pid]),
            ("nginx stream", "stream", 32, nginx_url + chat, "sim", "openai", nginx_workers),
            ("fixed stream", "stream", 32, gw_url + chat, "bench-fixed", "openai", [gw.pid]),
            ("fixed stream anthropic→openai", "stream", 32, gw_url + messages, "bench-fixed", "anthropic",
             [gw.pid]),
            ("direct", "json", 1, mock_url + chat, "sim", "openai", []),
            ("fixed", "json", 1, gw_url + chat, "bench-fixed", "openai", [gw.pid]),
        ])
        rss_after = rss_mib(gw.pid)

        ttfb_results = {}
        for name, port, model in (("direct", PORTS["mock"], "sim"), ("nginx", PORTS["nginx"], "sim"),
                                  ("switchyard fixed", PORTS["switchyard"], "bench-fixed")):
            ttfb_results[name] = ttfb("127.0.0.1", port, chat, body(model, True), TTFB_REQUESTS)
            print(f"ttfb   {name:34} p50 {ttfb_results[name]['p50_ms']:.3f} ms  "
                  f"p99 {ttfb_results[name]['p99_ms']:.3f} ms", flush=True)

        rss_before_streams = rss_mib(gw.pid)
        held = asyncio.run(hold_streams(PORTS["switchyard"], chat, body("bench-slow", True), idle_streams,
                                        gw.pid, settle_s=2))
        time.sleep(2)
        rss_after_streams = rss_mib(gw.pid)
        print(f"idle   {held['streams']} streams held (failed {held['failed']}) in {held['open_s']:.1f} s: "
              f"RSS {held['rss_mib']:.1f} MiB; {rss_after_streams:.1f} MiB after closing", flush=True)
        # Where the fd limit cannot be raised (no CAP_SYS_RESOURCE), fewer streams are held; the
        # figure for 10,000 is then scaled from the measured growth per stream.
        per_stream_mib = (held["rss_mib"] - rss_before_streams) / max(held["streams"], 1)
        held["rss_before_mib"] = rss_before_streams
        held["rss_per_stream_kib"] = per_stream_mib * 1024
        # Scaling from a handful of streams is noise (one run held none and reported a negative
        # figure): below a tenth of the goal there is no figure, and the target is not met.
        scalable = held["streams"] >= IDLE_STREAMS // 10
        held["rss_10k_mib"] = (held["rss_mib"] if held["streams"] >= IDLE_STREAMS
                               else rss_before_streams + per_stream_mib * IDLE_STREAMS if scalable else None)
        if not scalable:
            held["rss_per_stream_kib"] = None
        extra["idle_connections"] = idle_connection_cost(binary, env, work, min(IDLE_CONNECTIONS, fd_limit - 1024))
        extra = {**extra, "rss_idle_mib": rss_idle, "rss_after_load_mib": rss_after, "models_loaded": models_loaded,
                 "ttfb": ttfb_results, "idle_streams": held, "rss_after_idle_streams_mib": rss_after_streams,
                 "events_per_stream": events, "fd_limit": fd_limit}
    finally:
        stop_all(procs, groups, work, nginx_bin)

    extra["build"] = "pgo" if PGO else "release"
    report = render(results, extra)
    print("\n" + report)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H%M%S")
    data = json.dumps({"measured": stamp, "machine": machine(), "duration_s": DURATION, "quick": QUICK,
                       "results": results, **extra, "targets": check_targets(results, extra)}, indent=2)
    for name in ("latest", stamp):
        (out / f"{name}.json").write_text(data)
        (out / f"{name}.md").write_text(report + "\n")
    if not QUICK:
        update_readme(report)


def paired_routewise(url, pid, script_dir, rounds=3):
    """`routewise` against `fixed` at 32 clients, alternating, so both see the same machine: on a
    shared VM one 10 s point apart can differ by a third either way. The ratio of the medians."""
    runs = {"fixed": [], "routewise": []}
    for n in range(rounds):
        # Every other pair runs `routewise` first, so that neither side is always the one that
        # follows the other (a point measured right after another can read dearer or cheaper).
        for name in ("fixed", "routewise") if n % 2 == 0 else ("routewise", "fixed"):
            r = wrk_cpu(url, body(f"bench-{name}"), 32, script_dir, pid)
            runs[name].append(r)
            print(f"pair   switchyard {name:23} c=32   {r['rps']:9.0f} req/s  "
                  f"cpu {r['cpu_us_per_request']:.1f} us/req", flush=True)

    def median(name, key):
        return statistics.median(r[key] for r in runs[name])

    return {"rounds": rounds, "runs": runs,
            "rps_ratio": median("routewise", "rps") / median("fixed", "rps"),
            "cpu_ratio": median("routewise", "cpu_us_per_request") / median("fixed", "cpu_us_per_request")}


TARGET_ROUNDS, TARGET_ROUND_S = 4, 5


def target_rounds(work, points, rounds=TARGET_ROUNDS, seconds=None):
    """The points the targets compare (`(name, mode, clients, url, model, dialect, pids)`), again,
    in alternating rounds, so that each ratio's two sides see the same machine: on a shared VM one
    10 s point of the tables above can land in a slow minute its reference missed (one run measured
    the same build at 50.1 and 38.4 µs a request minutes apart). Medians per point."""
    global DURATION
    # A `--quick` run's points are shorter still.
    seconds = seconds or min(TARGET_ROUND_S, DURATION)
    saved, DURATION = DURATION, seconds
    runs = {}
    try:
        for n in range(rounds):
            # Every other round runs its points in reverse, so that each point follows and precedes
            # its reference equally often (round twenty-six's run measured the one-thread gateway,
            # always right after the default one, cheaper in all three rounds).
            for name, mode, c, url, model, dialect, pids in (points if n % 2 == 0 else points[::-1]):
                r = measure_point(work, url, body(model, mode == "stream", dialect), c, pids)
                runs.setdefault(f"{mode} {name} c={c}", []).append(r)
                print(f"round  {mode:6} {name:29} c={c:<4} {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.3f} ms"
                      + (f"  cpu {r['cpu_us_per_request']:.1f} us/req" if r["cpu_us_per_request"] else "")
                      + f"  stolen {r['stolen'] * 100:.1f} %", flush=True)
    finally:
        DURATION = saved

    def median(rows, key):
        values = [r[key] for r in rows if r[key] is not None]
        return statistics.median(values) if values else None

    stolen = [r["stolen"] for rows in runs.values() for r in rows]
    return {"rounds": rounds, "seconds": seconds, "runs": runs,
            "medians": {point: {key: median(rows, key) for key in ("rps", "p50_ms", "cpu_us_per_request")}
                        for point, rows in runs.items()},
            # How much of the rounds' machine the hypervisor took: the report says when it took any.
            "stolen": {"rounds_over_2pct": sum(x > 0.02 for x in stolen), "of": len(stolen),
                       "max": max(stolen, default=0.0)}}


def pick(results, mode, target, c):
    return next((r for r in results if r["mode"] == mode and r["target"] == target and r["concurrency"] == c), None)


def check_targets(results, extra):
    fixed = "switchyard fixed"
    c1, c32 = pick(results, "json", fixed, 1), pick(results, "json", fixed, 32)
    s32 = pick(results, "stream", fixed, 32)
    t32 = pick(results, "stream", fixed + " anthropic→openai", 32)
    nginx32, nginx_s32 = pick(results, "json", "nginx", 32), pick(results, "stream", "nginx", 32)
    one32 = pick(results, "json", fixed + ", one thread", 32)
    measured = {
        "cpu_vs_nginx": c32["cpu_us_per_request"] / nginx32["cpu_us_per_request"],
        "rps_vs_nginx_c32": c32["rps"] / nginx32["rps"],
        "stream_cpu_vs_nginx": s32["cpu_us_per_request"] / nginx_s32["cpu_us_per_request"],
        # nginx relays the same stream without translating it: the translated row's multiple.
        "translated_stream_cpu_vs_nginx": t32["cpu_us_per_request"] / nginx_s32["cpu_us_per_request"],
        "added_p50_ms_c1": c1["p50_ms"] - pick(results, "json", "direct", 1)["p50_ms"],
        "default_vs_one_thread_cpu": c32["cpu_us_per_request"] / one32["cpu_us_per_request"] if one32 else 0.0,
        "routewise_vs_fixed": (extra["routewise_pairs"]["rps_ratio"] if "routewise_pairs" in extra
                               else pick(results, "json", "switchyard routewise", 32)["rps"] / c32["rps"]),
        "rss_idle_mib": extra["rss_idle_mib"],
        "rss_idle_streams_mib": extra["idle_streams"]["rss_10k_mib"],
    }
    if "target_rounds" in extra:
        # The alternating rounds' medians, where the run has them (see `target_rounds`).
        m = extra["target_rounds"]["medians"]
        cpu = lambda point: m[point]["cpu_us_per_request"]  # noqa: E731
        measured.update({
            "cpu_vs_nginx": cpu("json fixed c=32") / cpu("json nginx c=32"),
            "rps_vs_nginx_c32": m["json fixed c=32"]["rps"] / m["json nginx c=32"]["rps"],
            "stream_cpu_vs_nginx": cpu("stream fixed stream c=32") / cpu("stream nginx stream c=32"),
            "translated_stream_cpu_vs_nginx": (cpu("stream fixed stream anthropic→openai c=32")
                                               / cpu("stream nginx stream c=32")),
            "added_p50_ms_c1": m["json fixed c=1"]["p50_ms"] - m["json direct c=1"]["p50_ms"],
            "default_vs_one_thread_cpu": cpu("json fixed, fresh c=32") / cpu("json fixed, fresh, one thread c=32"),
        })
    higher_is_better = {"rps_vs_nginx_c32", "routewise_vs_fixed"}
    return {k: {"measured": v, "target": TARGETS[k],
                "met": v is not None and (v >= TARGETS[k] if k in higher_is_better else v <= TARGETS[k])}
            for k, v in measured.items()}


def peers_sentence(peers):
    """Names the peer gateways of a run and how they were run, for the report's intro."""
    if not peers:
        return ""
    described = "; ".join(p["how"] + (f" (no streaming rows: {p['stream_note']})" if p.get("stream_note") else "")
                          for p in peers)
    return (f" Peer gateways behind the same mock, with the same requests and load: {described}. "
            "A peer's CPU is summed over all the processes of its session.")


def render_tables(results):
    """The non-streaming and streaming tables, one row per target and client count."""
    lines = []
    for mode, title, unit in (("json", "Non-streaming", "req"), ("stream", "Streaming", "stream")):
        direct = {r["concurrency"]: r for r in results if r["mode"] == mode and r["target"] == "direct"}
        nginx = {r["concurrency"]: r for r in results if r["mode"] == mode and r["target"] == "nginx"}
        lines += ["", f"**{title}** (req/s counts whole answers; vs direct/nginx are throughput ratios)", "",
                  f"| target | clients | req/s | vs direct | vs nginx | p50 ms | added p50 ms | p99 ms | "
                  f"added p99 ms | CPU µs/{unit} |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            if r["mode"] != mode:
                continue
            c = r["concurrency"]
            # Anthropic-client rows compare with the mock answering Anthropic directly.
            base = (pick(results, mode, "direct anthropic", c) if r["dialect"] == "anthropic"
                    and pick(results, mode, "direct anthropic", c) else direct[c])
            cpu = f"{r['cpu_us_per_request']:.1f}" if r["cpu_us_per_request"] is not None else "–"
            lines.append(
                f"| {r['target']} | {c} | {r['rps']:.0f} | {r['rps'] / base['rps']:.2f}× | "
                f"{r['rps'] / nginx[c]['rps']:.2f}× | {r['p50_ms']:.3f} | {r['p50_ms'] - base['p50_ms']:+.3f} | "
                f"{r['p99_ms']:.3f} | {r['p99_ms'] - base['p99_ms']:+.3f} | {cpu} |"
                + (f" ({r['errors']} errors)" if r["errors"] else "")
                + ("" if r["requests"] else " (no answer completed within the window)")
            )
    return lines


def render(results, extra, measured=None, machine_name=None):
    lines = [
        f"Measured {measured or time.strftime('%Y-%m-%d')} on {machine_name or machine()}; {DURATION} s per point, wrk, mock upstream "
        f"answering {COMPLETION_TOKENS} tokens without delay ({extra['events_per_stream']['openai']} SSE events "
        f"per OpenAI stream, {extra['events_per_stream']['anthropic']} per Anthropic one); RUST_LOG=warn; "
        "the load generator, proxies and mock share the cores. nginx runs one worker process and the "
        "gateway its default configuration (per-core runtimes on all of the machine's cores but one, at least one), "
        + ("built as the container image builds it (profile-guided, `cargo xtask build-pgo`), "
           if extra.get("build") == "pgo" else "built with `cargo build --release`, ")
        + "except the rows "
        "marked \"one thread\" (`SWITCHYARD_WORKER_THREADS=1`) and \"shared runtime\" (`--runtime shared`)."
        + peers_sentence(extra.get("peers")),
    ]
    lines += render_tables(results)
    t = extra["ttfb"]
    lines += ["", f"**Time to first byte of a stream** ({t['direct']['requests']} sequential requests on one "
              "connection)", "", "| target | p50 ms | added p50 ms | p99 ms | added p99 ms |", "|---|---:|---:|---:|---:|"]
    for name, r in t.items():
        lines.append(f"| {name} | {r['p50_ms']:.3f} | {r['p50_ms'] - t['direct']['p50_ms']:+.3f} | "
                     f"{r['p99_ms']:.3f} | {r['p99_ms'] - t['direct']['p99_ms']:+.3f} |")
    held = extra["idle_streams"]
    lines += ["", f"**Memory**: RSS {extra['rss_idle_mib']:.1f} MiB idle with {extra['models_loaded']} models "
              f"({IDLE_MODELS_PER_STRATEGY} per strategy) loaded on a first start (every strategy compiled, "
              f"the compiled-code cache empty); {extra['rss_after_load_mib']:.1f} MiB after the "
              f"load above; {held['rss_mib']:.1f} MiB holding {held['streams']} idle streams"
              + (f" ({held['failed']} failed to open)" if held["failed"] else "")
              + (f" ({held['rss_per_stream_kib']:.1f} KiB per stream, client and upstream connection included"
                 + (f"; {held['rss_10k_mib']:.1f} MiB scaled to {IDLE_STREAMS} — the fd limit here is "
                    f"{extra['fd_limit']} and cannot be raised" if held["streams"] < IDLE_STREAMS else "")
                 + ")" if held["rss_per_stream_kib"] is not None
                 else f" (too few to scale to {IDLE_STREAMS}; first failure: {held['first_failure']})")
              + f"; {extra['rss_after_idle_streams_mib']:.1f} MiB after they closed."]
    idle = extra.get("idle_connections")
    if idle:
        lines += ["", f"**Idle client connections**: gateway CPU {idle['cpu_s_idle_connections']:.3f} s over "
                  f"{idle['window_s']} s holding {idle['connections']} idle keep-alive connections "
                  f"({idle['cpu_s_no_connections']:.3f} s without any); RSS {idle['rss_mib']:.1f} MiB."]
    targets = check_targets(results, extra)
    names = {
        "cpu_vs_nginx": ("CPU per non-streaming request, 32 clients, × nginx's", "≤ {t:.1f}×", "{v:.2f}×"),
        "rps_vs_nginx_c32": ("throughput vs nginx, 32 clients", "≥ {t}×", "{v:.2f}×"),
        "stream_cpu_vs_nginx": ("CPU per relayed stream, same protocol, × nginx's", "≤ {t:.1f}×", "{v:.2f}×"),
        "translated_stream_cpu_vs_nginx": ("CPU per relayed stream, translated, × nginx's (same stream)",
                                           "≤ {t:.1f}×", "{v:.2f}×"),
        "added_p50_ms_c1": ("added p50, 1 client", "≤ {t} ms", "{v:+.3f} ms"),
        "default_vs_one_thread_cpu": ("CPU per request, default vs one thread, 32 clients (two gateways "
                                      "started fresh for the target rounds)", "≤ {t:.1f}×", "{v:.2f}×"),
        "routewise_vs_fixed": ("routewise vs fixed throughput, 32 clients (median of 3 alternating pairs)",
                               "≥ {t}×", "{v:.2f}×"),
        "rss_idle_mib": ("RSS idle, first start (strategies compiled)", "< {t:.0f} MiB", "{v:.1f} MiB"),
        "rss_idle_streams_mib": ("RSS with 10,000 idle streams", "< {t:.0f} MiB", "{v:.1f} MiB"),
    }
    rounds = extra.get("target_rounds")
    how = (f"; the first six from the medians of {rounds['rounds']} alternating rounds of {rounds['seconds']} s "
           "at their points, run after the tables above" if rounds else "")
    lines += ["", f"**Targets** (issue #18, `fixed`, default configuration{how})", "",
              "| target | goal | measured | met |", "|---|---|---:|---|"]
    cores = os.cpu_count() or 1
    # The default is one serving thread per core but one (`host/src/main.rs`), at least one: on
    # two cores or fewer it is the one-thread configuration, and their ratio can only be noise.
    same_configuration = cores <= 2
    for k, (label, goal, fmt) in names.items():
        r = targets[k]
        shown = "not measured" if r["measured"] is None else fmt.format(v=r["measured"])
        met = "yes" if r["met"] else "no"
        if k == "default_vs_one_thread_cpu" and same_configuration:
            met = "same configuration here (A/A)"
        lines.append(f"| {label} | {goal.format(t=r['target'])} | {shown} | {met} |")
    if same_configuration:
        lines += ["", f"On this {cores}-core machine the default configuration serves on one thread, as the "
                      "one-thread row does: the two are the same configuration, and the ratio between them "
                      "is the spread of rounds measured minutes apart."]
    stolen = (rounds or {}).get("stolen")
    if stolen and stolen["rounds_over_2pct"]:
        lines += ["", f"{stolen['rounds_over_2pct']} of the {stolen['of']} target rounds ran with more than 2 % of "
                      f"the machine's CPU stolen by the hypervisor (at most {stolen['max'] * 100:.1f} %): those "
                      "rounds were slowed from outside."]
    return "\n".join(lines)


def update_readme(report):
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    if start not in text or end not in text:
        print("README.md has no bench markers; not updated")
        return
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{report}\n{end}{tail}")
    print("README.md updated")


def rerender():
    """Renders bench/results/latest.json again (after a change to the tables or targets) and, for
    a full run, puts it in the README, without measuring anything."""
    out = ROOT / "bench" / "results"
    data = json.loads((out / "latest.json").read_text())
    extra = {k: v for k, v in data.items()
             if k not in ("measured", "machine", "duration_s", "quick", "results", "targets")}
    global DURATION
    DURATION = data["duration_s"]
    report = render(data["results"], extra, measured=data["measured"][:10], machine_name=data["machine"])
    data["targets"] = check_targets(data["results"], extra)
    (out / "latest.json").write_text(json.dumps(data, indent=2))
    (out / "latest.md").write_text(report + "\n")
    print(report)
    if not data["quick"]:
        update_readme(report)


def idle_only():
    """`--idle-connections [BINARY]`: only the idle-connection measurement, for one binary (the
    release build by default), e.g. to compare a branch with main's build."""
    fd_limit = raise_fd_limit()
    args = sys.argv[sys.argv.index("--idle-connections") + 1:]
    binary = Path(args[0]) if args and not args[0].startswith("--") else build()
    env = dict(os.environ, RUST_LOG="warn", SWITCHYARD_DEFAULT_AUTH="disabled",
               SWITCHYARD_BUILTIN_STRATEGIES=str(target_dir() / "strategies"))
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-idle-"))
    result = idle_connection_cost(binary, env, work, min(IDLE_CONNECTIONS, fd_limit - 1024))
    print(json.dumps(result, indent=2))


def peers_only():
    """`--peers-only`: direct, nginx and the peers, without the gateway, so the peer rows can be
    checked in a minute or two. Leaves latest.json (the full run's) alone."""
    global SKIP_PEERS
    SKIP_PEERS = False
    ensure_tools(redis=False)
    raise_fd_limit()
    binary = build()
    env = dict(os.environ, RUST_LOG="warn")
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-peers-"))
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    procs, groups, results = [], [], []
    try:
        procs.append(start_mock(binary, env))
        mock_url = f"http://127.0.0.1:{PORTS['mock']}"
        wait_http(mock_url + "/health")
        nginx_workers = start_nginx(work, nginx_bin)
        events = count_events(mock_url + "/v1/chat/completions", body("sim", True))
        peers = start_peers(work, events, groups)
        peer_json, peer_stream = peer_runs(peers)
        targets = base_targets(mock_url, nginx_workers)
        runs = ([("json", *t, None) for t in targets] + peer_json
                + [("stream", *t, None) for t in targets] + peer_stream)
        for run in runs:
            results += measure(work, *run)
    finally:
        stop_all(procs, groups, work, nginx_bin)
    report = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; {DURATION} s per point, wrk, mock upstream "
        f"answering {COMPLETION_TOKENS} tokens without delay ({events} SSE events per stream); nginx runs one "
        "worker process." + peers_sentence(peers_summary(peers))] + render_tables(results))
    print("\n" + report)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers-latest.json").write_text(json.dumps(
        {"measured": time.strftime("%Y-%m-%dT%H%M%S"), "machine": machine(), "duration_s": DURATION,
         "quick": QUICK, "peers": peers_summary(peers), "results": results}, indent=2))
    (out / "peers-latest.md").write_text(report + "\n")


MEMORY_PORTS = {"mock": 19111, "gateway": 19112}
MEMORY_CLIENTS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
MEMORY_UPSTREAMS = {"chat": "openai_compat", "anthropic": "anthropic", "responses": "openai_responses"}


def memory_body(client, model, shape):
    """A request body of about 25 MiB in the client's dialect. Shapes: `tiny` is issue #15's 900k
    one-word messages (over the default message limit, so now refused); `many` is 100,000 messages
    of ~250 characters (at the limit); `few` is 10 messages of 2.5 MiB."""
    count, size = {"tiny": (900_000, 1), "many": (100_000, 250), "few": (10, 2_500_000)}[shape]
    text = "x" * size
    roles = ("user", "assistant")
    if client == "responses":
        items = [{"role": roles[i % 2], "content": text} for i in range(count)]
        return {"model": model, "input": items, "max_output_tokens": 16}
    messages = [{"role": roles[i % 2], "content": text} for i in range(count)]
    if client == "messages":
        return {"model": model, "max_tokens": 16, "messages": messages}
    return {"model": model, "messages": messages, "max_tokens": 16}


def vm_kib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def post_many(port, path, payload, n):
    """Sends `n` copies of `payload` at once; returns their statuses."""
    def one():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", path, payload, {"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: one(), range(n)))


def large_body_memory():
    def arg(name, default):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default
    binary = Path(arg("--binary", "")) if "--binary" in sys.argv else build()
    # The mock parses every body too; `--mock-binary` keeps it the same across a before/after pair.
    mock_binary = Path(arg("--mock-binary", str(binary)))
    concurrency = [int(c) for c in arg("--concurrency", "1,8").split(",")]
    env = gateway_env()
    work = Path(tempfile.mkdtemp(prefix="switchyard-memory-"))
    upstream = f"127.0.0.1:{MEMORY_PORTS['mock']}"
    models = "".join(
        f"  - id: mem-{name}\n    route:\n      - kind: {kind}\n"
        f"        base_url: http://{upstream}{'' if kind == 'anthropic' else '/v1'}\n        provider_model_id: sim\n"
        for name, kind in MEMORY_UPSTREAMS.items())
    (work / "memory.yaml").write_text(f"database:\n  url: sqlite://{work}/memory.db\nmodels:\n{models}")
    mock = subprocess.Popen([mock_binary, "mock-upstream", "--port", str(MEMORY_PORTS["mock"]),
                             "--completion-tokens", "4"], stdout=subprocess.DEVNULL, env=env)
    results = []
    try:
        wait_http(f"http://{upstream}/health")
        for shape in arg("--shapes", "tiny,many,few").split(","):
            for client, path in MEMORY_CLIENTS.items():
                for up in MEMORY_UPSTREAMS:
                    if f"{client}>{up}" not in arg("--pairs", f"{client}>{up}").split(","):
                        continue
                    payload = json.dumps(memory_body(client, f"mem-{up}", shape), separators=(",", ":")).encode()
                    row = {"shape": shape, "client": client, "upstream": up, "body_mib": len(payload) / 2**20}
                    for n in concurrency:
                        gw = subprocess.Popen([binary, "serve", "--config", str(work / "memory.yaml"), "--listen",
                                               f"127.0.0.1:{MEMORY_PORTS['gateway']}"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                        try:
                            wait_http(f"http://127.0.0.1:{MEMORY_PORTS['gateway']}/health")
                            time.sleep(0.5)
                            # Resets VmHWM to the current RSS, so the peak below is this request's.
                            Path(f"/proc/{gw.pid}/clear_refs").write_text("5")
                            base = vm_kib(gw.pid, "VmRSS")
                            statuses = post_many(MEMORY_PORTS["gateway"], path, payload, n)
                            peak = vm_kib(gw.pid, "VmHWM")
                        finally:
                            gw.send_signal(signal.SIGTERM)
                            gw.wait(30)
                        growth = (peak - base) / 1024
                        row[f"peak_growth_mib_{n}"] = growth
                        row[f"ratio_{n}"] = growth / (row["body_mib"] * n)
                        row[f"status_{n}"] = sorted(set(statuses))
                    results.append(row)
                    print(f"{shape:5} {client:9} -> {up:9} body {row['body_mib']:5.1f} MiB" + "".join(
                        f"  x{n}: +{row[f'peak_growth_mib_{n}']:7.1f} MiB ({row[f'ratio_{n}']:4.1f}x the bodies) "
                        f"{row[f'status_{n}']}" for n in concurrency), flush=True)
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait(10)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    label = sys.argv[sys.argv.index("--label") + 1] if "--label" in sys.argv else "latest"
    (out / f"memory-{label}.json").write_text(json.dumps(
        {"measured": time.strftime("%Y-%m-%dT%H%M%S"), "machine": machine(), "binary": str(binary),
         "results": results}, indent=2))


if __name__ == "__main__":
    if "--memory" in sys.argv:
        large_body_memory()
    elif "--rerender" in sys.argv:
        rerender()
    elif "--idle-connections" in sys.argv:
        idle_only()
    elif PEERS_ONLY:
        peers_only()
    else:
        main()
