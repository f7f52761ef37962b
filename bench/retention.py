#!/usr/bin/env python3
"""What request-log retention costs the requests served while it prunes a backlog.

    python3 bench/retention.py [--skip-build] [--rows N] [--seconds S] [--port-base P]

A SQLite request log is filled with `--rows` copies (default 500,000) of a real row, 40 days old,
then the same gateway binary serves `bench-fixed` at 32 clients for `--seconds` (default 20) in
three windows on that file: keeping every row (`REQUEST_LOG_RETENTION_DAYS=0`), keeping 30 days
(pruning the whole backlog meanwhile), and keeping every row again. Each window is a fresh gateway.
Prints each window's req/s and the gateway's CPU µs per request, the ratio of the pruning window
to the mean of the other two, the rows pruned a second while serving, how long the whole backlog
took, and whether the request log dropped a row (its queue full while pruning held the file).

Uses bench/run.py's mock, config and wrk driver.
"""
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402

DAY_MS = 86_400_000
ROWS = run.arg("--rows", 500_000)
SECONDS = run.arg("--seconds", 20)
PORT_BASE = run.arg("--port-base", 19301)


def config(work, metrics_port):
    return (f"server:\n  metrics_listen: 127.0.0.1:{metrics_port}\n"
            + run.gateway_config(work, "retention.db"))


def rows_total(metrics_port, outcome):
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    found = re.search(r'^switchyard_request_log_rows_total\{outcome="%s"\} (\S+)$' % outcome, text, re.M)
    return int(float(found.group(1))) if found else 0


def start(binary, work, port, metrics_port, keep_days):
    path = work / "retention.yaml"
    path.write_text(config(work, metrics_port))
    env = run.gateway_env(REQUEST_LOG_RETENTION_DAYS=str(keep_days))
    proc = subprocess.Popen([binary, "serve", "--config", str(path), "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, env=env)
    run.wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
    return proc


def fill(db, rows):
    """`rows` copies of the newest row, 40 days back, a millisecond apart."""
    con = sqlite3.connect(db)
    columns = [c[1] for c in con.execute("PRAGMA table_info(api_logs)") if c[1] != "id"]
    template = con.execute(f"SELECT {', '.join(columns)} FROM api_logs ORDER BY id DESC LIMIT 1").fetchone()
    at = columns.index("created_at_ms")
    start_ms = int(time.time() * 1000) - 40 * DAY_MS
    marks = ", ".join("?" for _ in columns)
    batch = []
    for i in range(rows):
        row = list(template)
        row[at] = start_ms + i
        batch.append(row)
        if len(batch) == 10_000:
            con.executemany(f"INSERT INTO api_logs ({', '.join(columns)}) VALUES ({marks})", batch)
            batch.clear()
    if batch:
        con.executemany(f"INSERT INTO api_logs ({', '.join(columns)}) VALUES ({marks})", batch)
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def count(db, where=""):
    con = sqlite3.connect(db)
    try:
        return con.execute(f"SELECT COUNT(*) FROM api_logs {where}").fetchone()[0]
    finally:
        con.close()


def window(binary, work, port, metrics_port, keep_days):
    """One fresh gateway keeping `keep_days` (0: every row), loaded for SECONDS: its wrk figures,
    CPU µs a request, the rows it pruned meanwhile and the request log's dropped rows; when it
    prunes, also how long the whole backlog took from its start (`backlog_s`)."""
    started = time.monotonic()
    proc = start(binary, work, port, metrics_port, keep_days)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        r = run.wrk_cpu(url, run.body("bench-fixed"), 32, work, proc.pid)
        r["pruned"] = rows_total(metrics_port, "pruned")
        r["dropped"] = rows_total(metrics_port, "dropped")
        if keep_days:
            old = f"WHERE created_at_ms < {int(time.time() * 1000) - 30 * DAY_MS}"
            deadline = time.monotonic() + 600
            while count(work / "retention.db", old) and time.monotonic() < deadline:
                time.sleep(0.5)
            r["backlog_s"] = time.monotonic() - started
            r["left"] = count(work / "retention.db", old)
        return r
    finally:
        run.stop_processes([proc])


def main():
    run.ensure_tools(redis=False)
    binary = run.build()
    run.PORTS.update(mock=PORT_BASE)
    run.DURATION = SECONDS
    work = Path(tempfile.mkdtemp(prefix="switchyard-retention-"))
    mock = run.start_mock(binary, run.gateway_env())
    try:
        run.wait_http(f"http://127.0.0.1:{PORT_BASE}/health")
        port, metrics_port = PORT_BASE + 1, PORT_BASE + 2
        # One real row to copy.
        proc = start(binary, work, port, metrics_port, 0)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=run.body("bench-fixed").encode(),
                                         headers={"content-type": "application/json"})
        urllib.request.urlopen(request, timeout=10).read()
        deadline = time.monotonic() + 10
        while count(work / "retention.db") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        run.stop_processes([proc])
        print(f"filling the request log with {ROWS:,} rows 40 days old ...", flush=True)
        fill(work / "retention.db", ROWS)
        print(f"file: {(work / 'retention.db').stat().st_size / 2**20:.0f} MiB", flush=True)

        results = {}
        for name, keep_days in (("keep_all", 0), ("pruning", 30), ("keep_all_after", 0)):
            r = results[name] = window(binary, work, port, metrics_port, keep_days)
            print(f"{name:15} {r['rps']:9.0f} req/s  cpu {r['cpu_us_per_request']:.1f} us/req  "
                  f"pruned {r['pruned']:,}  dropped {r['dropped']}"
                  + (f"  whole backlog in {r['backlog_s']:.1f} s ({r['left']:,} left)"
                     if "backlog_s" in r else ""), flush=True)
        base_rps = statistics.mean([results["keep_all"]["rps"], results["keep_all_after"]["rps"]])
        base_cpu = statistics.mean([results["keep_all"]["cpu_us_per_request"],
                                    results["keep_all_after"]["cpu_us_per_request"]])
        p = results["pruning"]
        print(f"\npruning against keeping: throughput {p['rps'] / base_rps:.2f}x, "
              f"CPU a request {p['cpu_us_per_request'] / base_cpu:.2f}x; "
              f"{p['pruned'] / SECONDS:,.0f} rows pruned a second under load; "
              f"rows the request log dropped while pruning: {p['dropped']}")
    finally:
        run.stop_processes([mock])


if __name__ == "__main__":
    main()
