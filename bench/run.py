#!/usr/bin/env python3
"""Overhead benchmark: Switchyard against calling the upstream directly and against nginx as a
plain reverse proxy (proxy_pass with upstream keepalive), with the same load generator (wrk).

Run: `python3 bench/run.py` (installs wrk and nginx from Debian packages when missing, builds the
release binary and the strategies). `--quick` runs 3 s per point instead of 10 s.
Writes bench/results/latest.json and latest.md and prints the table.

Everything runs on loopback on this machine; the load generator, the proxies and the mock upstream
share its cores, so absolute figures are pessimistic — compare the ratios measured in one run.
"""

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICK = "--quick" in sys.argv
DURATION = 3 if QUICK else 10
CONCURRENCY = [1, 32, 256]
PORTS = {"mock": 19101, "nginx": 19102, "switchyard": 19103}
BODY = json.dumps(
    {"model": "MODEL", "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
)


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def ensure_tools():
    missing = [t for t in ("wrk", "nginx") if shutil.which(t) is None and not Path("/usr/sbin/" + t).exists()]
    if missing:
        sh("apt-get", "update", "-qq")
        sh("apt-get", "install", "-y", "-qq", *missing)


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def build():
    sh("cargo", "xtask", "build-strategies", cwd=ROOT)
    sh("cargo", "build", "--release", "-p", "switchyard", cwd=ROOT)
    return target_dir() / "release" / "switchyard"


def wait_http(url, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def to_ms(value):
    m = re.match(r"([\d.]+)(us|ms|s)", value)
    number, unit = float(m.group(1)), m.group(2)
    return number / 1000 if unit == "us" else number * 1000 if unit == "s" else number


def wrk(url, model, concurrency, script_dir):
    lua = script_dir / f"{model}.lua"
    lua.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(BODY.replace('MODEL', model))}\n"
    )
    threads = min(2, concurrency)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{DURATION}s", "--latency", "-s", str(lua), url],
        check=True, capture_output=True, text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p = {k: to_ms(v) for k, v in re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    return {"rps": rps, "requests": requests, "p50_ms": p["50"], "p99_ms": p["99"],
            "errors": int(errors.group(1)) if errors else 0}


def main():
    ensure_tools()
    binary = build()
    env = dict(os.environ, RUST_LOG="warn", ROUTING_AFFINITY_ENABLED="0", SWITCHYARD_DEFAULT_AUTH="disabled",
               SWITCHYARD_BUILTIN_STRATEGIES=str(target_dir() / "strategies"))
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    procs = []
    try:
        mock = subprocess.Popen([binary, "mock-upstream", "--port", str(PORTS["mock"]), "--completion-tokens", "16"],
                                stdout=subprocess.DEVNULL, env=env)
        procs.append(mock)
        upstream = f"http://127.0.0.1:{PORTS['mock']}"
        wait_http(upstream + "/health")

        nginx_conf = work / "nginx.conf"
        nginx_conf.write_text(f"""
worker_processes 1;
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
""")
        nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
        sh(nginx_bin, "-c", str(nginx_conf), "-p", str(work))
        time.sleep(0.5)
        nginx_pid = int((work / "nginx.pid").read_text())
        nginx_workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(nginx_pid)], capture_output=True, text=True).stdout.split()]

        models = "".join(
            f"  - id: bench-{name}\n    router: {name}\n    route:\n      - kind: openai_compat\n"
            f"        base_url: {upstream}/v1\n        provider_model_id: sim\n"
            + ("        pricing: { prompt: 0.1, completion: 0.4 }\n" if name == "routewise" else "")
            for name in ("fixed", "round_robin", "routewise")
        )
        # 20 more models per strategy for the idle-memory figure.
        for i in range(20):
            for name in ("fixed", "round_robin", "routewise"):
                models += (f"  - id: idle-{name}-{i}\n    router: {name}\n    route:\n      - kind: openai_compat\n"
                           f"        base_url: {upstream}/v1\n")
        config = work / "bench.yaml"
        config.write_text(f"database:\n  url: sqlite://{work}/bench.db\nmodels:\n{models}")
        gw = subprocess.Popen([binary, "serve", "--config", str(config), "--listen", f"127.0.0.1:{PORTS['switchyard']}"],
                              stdout=subprocess.DEVNULL, env=env)
        procs.append(gw)
        wait_http(f"http://127.0.0.1:{PORTS['switchyard']}/health")
        time.sleep(1)
        rss_idle = rss_mib(gw.pid)

        targets = [
            ("direct", f"{upstream}/v1/chat/completions", "sim", []),
            ("nginx", f"http://127.0.0.1:{PORTS['nginx']}/v1/chat/completions", "sim", nginx_workers),
            ("switchyard fixed", f"http://127.0.0.1:{PORTS['switchyard']}/v1/chat/completions", "bench-fixed", [gw.pid]),
            ("switchyard round_robin", f"http://127.0.0.1:{PORTS['switchyard']}/v1/chat/completions", "bench-round_robin", [gw.pid]),
            ("switchyard routewise", f"http://127.0.0.1:{PORTS['switchyard']}/v1/chat/completions", "bench-routewise", [gw.pid]),
        ]
        results = []
        for name, url, model, pids in targets:
            for c in CONCURRENCY:
                before = sum(cpu_seconds(p) for p in pids)
                r = wrk(url, model, c, work)
                after = sum(cpu_seconds(p) for p in pids)
                r.update(target=name, concurrency=c,
                         cpu_us_per_request=(after - before) * 1e6 / max(r["requests"], 1) if pids else None)
                results.append(r)
                print(f"{name:24} c={c:<4} {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms"
                      + (f"  cpu {r['cpu_us_per_request']:.1f} us/req" if pids else ""), flush=True)
        rss_after = rss_mib(gw.pid)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        if (work / "nginx.pid").exists():
            subprocess.run([shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(work / "nginx.conf"), "-p", str(work), "-s", "stop"])

    direct = {r["concurrency"]: r for r in results if r["target"] == "direct"}
    nginx = {r["concurrency"]: r for r in results if r["target"] == "nginx"}
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.node()} ({os.cpu_count()} cores), "
        f"{DURATION} s per point, wrk, mock upstream answering 16 tokens without delay; RUST_LOG=warn.",
        "",
        "| target | clients | req/s | vs direct | vs nginx | p50 ms | added p50 ms | p99 ms | CPU µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = r["concurrency"]
        cpu = f"{r['cpu_us_per_request']:.1f}" if r["cpu_us_per_request"] is not None else "–"
        lines.append(
            f"| {r['target']} | {c} | {r['rps']:.0f} | {r['rps'] / direct[c]['rps']:.2f}× | "
            f"{r['rps'] / nginx[c]['rps']:.2f}× | {r['p50_ms']:.3f} | {r['p50_ms'] - direct[c]['p50_ms']:+.3f} | "
            f"{r['p99_ms']:.3f} | {cpu} |"
        )
    lines += ["", f"Switchyard RSS: {rss_idle:.1f} MiB idle with 63 models (21 per strategy) loaded; "
              f"{rss_after:.1f} MiB after the run."]
    table = "\n".join(lines)
    print("\n" + table)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"results": results, "rss_idle_mib": rss_idle,
                                                 "rss_after_mib": rss_after, "duration_s": DURATION}, indent=2))
    (out / "latest.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
