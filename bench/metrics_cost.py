#!/usr/bin/env python3
"""What metrics cost on the hot path: CPU per request of the gateway with metrics recorded and
scraped every second, against the same binary with metrics off (`SWITCHYARD_METRICS=off`).

Run: `python3 bench/metrics_cost.py` (uses bench/run.py's helpers: installs wrk when missing and
builds the release binary; `--skip-build` uses the one already built, `--binary PATH` another one,
`--quick` runs 3 s rounds, `--rounds N` sets the rounds per side (default 7), `--scrape-every S`
the scrape interval in seconds (default 1; Prometheus' default is 15)).
Both gateways run the same binary with one thread each on the same mock upstream; in each round
both are measured back to back, the order flipping every round (off-on, on-off, …) so drift on a
shared machine and whatever the first of a pair pays hit both alike. Compared: the median of the
rounds per side (their ratio is the result) and each round's own on/off ratio, whose spread says
how much of a difference is noise. CPU is the gateway process's user + system time over the round
(all its threads, from /proc/PID/stat) divided by the requests wrk completed. Writes
bench/results/metrics_cost.json and prints the table.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (bench/run.py: build, wrk, cpu_seconds, wait_http, body)

def option(flag, default, kind):
    return kind(sys.argv[sys.argv.index(flag) + 1]) if flag in sys.argv else default


ROUNDS = option("--rounds", 3 if run.QUICK else 7, int)
PORTS = {"mock": 19201, "off": 19202, "on": 19203, "on_metrics": 19204}
CONCURRENCY = 32
# Prometheus' default scrape interval is 15 s; once a second is the pessimistic case.
SCRAPE_EVERY_S = option("--scrape-every", 1.0, float)
# Issue #17: metrics may cost at most 5 % of a request's CPU.
TARGET_RATIO = 1.05


def config(work, name, metrics_listen=None):
    server = f"server:\n  metrics_listen: 127.0.0.1:{metrics_listen}\n" if metrics_listen else ""
    return (f"database:\n  url: sqlite://{work}/{name}.db\n{server}models:\n  - id: bench-fixed\n"
            f"    router: fixed\n    route:\n      - kind: openai_compat\n"
            f"        base_url: http://127.0.0.1:{PORTS['mock']}/v1\n        provider_model_id: sim\n")


def scraper(url, stop, counts):
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                counts["bytes"] = len(r.read())
                counts["scrapes"] += 1
        except Exception:
            counts["errors"] += 1
        stop.wait(SCRAPE_EVERY_S)


def measure(url, pid, mode, script_dir):
    payload = run.body("bench-fixed", stream=(mode == "stream"))
    before = run.cpu_seconds(pid)
    result = run.wrk(url + "/v1/chat/completions", payload, CONCURRENCY, script_dir)
    cpu = run.cpu_seconds(pid) - before
    assert result["errors"] == 0, result
    return cpu / result["requests"] * 1e6, result["rps"]


def main():
    run.ensure_tools()
    if "--binary" in sys.argv:
        binary = Path(sys.argv[sys.argv.index("--binary") + 1])
    else:
        binary = run.build()
    work = Path(tempfile.mkdtemp(prefix="switchyard-metrics-cost-"))
    env = dict(run.os.environ, RUST_LOG="warn", ROUTING_AFFINITY_ENABLED="0",
               SWITCHYARD_DEFAULT_AUTH="disabled", SWITCHYARD_WORKER_THREADS="1",
               SWITCHYARD_BUILTIN_STRATEGIES=str(run.target_dir() / "strategies"))
    procs = []
    stop = threading.Event()
    counts = {"scrapes": 0, "errors": 0, "bytes": 0}
    try:
        procs.append(subprocess.Popen([binary, "mock-upstream", "--port", str(PORTS["mock"]),
                                       "--completion-tokens", str(run.COMPLETION_TOKENS)],
                                      stdout=subprocess.DEVNULL, env=env))
        run.wait_http(f"http://127.0.0.1:{PORTS['mock']}/health")
        gateways = {}
        for name, metrics_env, metrics_port in (("off", "off", None), ("on", "on", PORTS["on_metrics"])):
            (work / f"{name}.yaml").write_text(config(work, name, metrics_port))
            p = subprocess.Popen([binary, "serve", "--config", str(work / f"{name}.yaml"),
                                  "--listen", f"127.0.0.1:{PORTS[name]}"], stdout=subprocess.DEVNULL,
                                 env=dict(env, SWITCHYARD_METRICS=metrics_env))
            procs.append(p)
            url = f"http://127.0.0.1:{PORTS[name]}"
            run.wait_http(url + "/health")
            gateways[name] = (url, p.pid)
        metrics_url = f"http://127.0.0.1:{PORTS['on_metrics']}/metrics"
        run.wait_http(metrics_url)
        threading.Thread(target=scraper, args=(metrics_url, stop, counts), daemon=True).start()
        results = {}
        for mode in ("json", "stream"):
            samples = {"off": [], "on": []}
            rps = {"off": [], "on": []}
            # Warm both (connection pools, allocator) before measuring.
            for name in ("off", "on"):
                measure(*gateways[name], mode, work)
            for i in range(ROUNDS):
                for name in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    us, r = measure(*gateways[name], mode, work)
                    samples[name].append(us)
                    rps[name].append(r)
            off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
            paired = [b / a for a, b in zip(samples["off"], samples["on"])]
            results[mode] = {
                "cpu_us_per_request_metrics_off": round(off, 1),
                "cpu_us_per_request_metrics_on_scraped": round(on, 1),
                "ratio": round(on / off, 3),
                "round_ratios_median": round(statistics.median(paired), 3),
                "round_ratios_min": round(min(paired), 3),
                "round_ratios_max": round(max(paired), 3),
                "rps_off": round(statistics.median(rps["off"])),
                "rps_on": round(statistics.median(rps["on"])),
                "rounds_off": [round(x, 1) for x in samples["off"]],
                "rounds_on": [round(x, 1) for x in samples["on"]],
            }
        results["scrapes"] = dict(counts)
        results["target_ratio"] = TARGET_RATIO
        results["command"] = " ".join(["python3", "bench/metrics_cost.py", *sys.argv[1:]])
        results["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        results["setup"] = (f"one gateway thread each, wrk c={CONCURRENCY}, {run.DURATION} s rounds x {ROUNDS}, "
                            f"order flipped each round, scraped every {SCRAPE_EVERY_S:g} s; {run.machine()}")
    finally:
        stop.set()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    out = run.ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics_cost.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"| mode | CPU µs/request, metrics off | metrics on, scraped every {SCRAPE_EVERY_S:g} s | ratio "
          f"| per-round ratios (median, min–max) |")
    print("|---|---:|---:|---:|---|")
    for mode in ("json", "stream"):
        r = results[mode]
        print(f"| {mode} | {r['cpu_us_per_request_metrics_off']} | {r['cpu_us_per_request_metrics_on_scraped']} "
              f"| {r['ratio']} | {r['round_ratios_median']} ({r['round_ratios_min']}–{r['round_ratios_max']}) |")
    print(f"scrapes: {counts}; {results['setup']}")
    verdict = {m: results[m]["ratio"] <= TARGET_RATIO for m in ("json", "stream")}
    print(f"target ratio ≤ {TARGET_RATIO}: " + ", ".join(f"{m} {'met' if ok else 'MISSED'}" for m, ok in verdict.items()))


if __name__ == "__main__":
    main()
