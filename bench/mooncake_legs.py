#!/usr/bin/env python3
"""Mooncake's parallel legs against sequential ones: time to first token.

Starts, for each mode, a prefill and a decode pdgate-sim and a pdgate, and
sends the same streamed chat requests through it, some at a time:

  parallel    --kv-connector mooncake (both legs at once under a
              gateway-minted transfer_id; the sims speak the current
              MooncakeConnector form)
  sequential  --kv-connector mooncake --mooncake-legs sequential (decode
              after prefill answered, NIXL's pull form, as older engines)

The modes alternate in rounds so that both see the same machine load.
Writes one JSON row per request to bench/results/mooncake-legs.jsonl (or
--out) and prints each mode's TTFT percentiles and their ratio.

Usage: bench/mooncake_legs.py [--build build] [--requests 200] [--rounds 4]
       [--concurrency 4] [--prompt-words 1500] [--out FILE]
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def start(argv, log):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = p.stdout.readline()
        m = re.search(r"listening on http://[^:]+:(\d+)", line or "")
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            break
    p.kill()
    raise SystemExit(f"{argv[0]} did not start; see {log.name}")


def ttft(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    while True:
        line = r.readline()
        if not line:
            break
        if first is None and line.startswith(b"data: ") and b'"content"' in line:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    c.close()
    return r.status, first, total


def run_mode(mode, args, tmp, rows, round_no):
    build = args.build
    sim = os.path.join(build, "pdgate-sim")
    common = ["--host", "127.0.0.1", "--port", "0", "--prefill-base-ms", "5",
              "--itl-ms", "10", "--max-num-seqs", "64", "--prefill-lanes", "4"]
    connector = "mooncake" if mode == "parallel" else "nixl"
    logs = [open(os.path.join(tmp, f"{mode}-{n}.log"), "w") for n in ("p", "d", "g")]
    procs = []
    try:
        p, pport = start([sim, "--role", "prefill", "--kv-connector", connector] + common, logs[0])
        procs.append(p)
        d, dport = start([sim, "--role", "decode", "--kv-connector", connector] + common, logs[1])
        procs.append(d)
        gw_args = [os.path.join(build, "pdgate"), "--host", "127.0.0.1", "--port", "0",
                   "--workers", "2", "--kv-connector", "mooncake",
                   "--mooncake-bootstrap-port", "0", "--prefill", f"127.0.0.1:{pport}",
                   "--decode", f"127.0.0.1:{dport}"]
        if mode == "sequential":
            gw_args += ["--mooncake-legs", "sequential"]
        g, gport = start(gw_args, logs[2])
        procs.append(g)
        lock = threading.Lock()
        next_i = [0]

        def worker():
            while True:
                with lock:
                    i = next_i[0]
                    next_i[0] += 1
                if i >= args.requests:
                    return
                # A distinct prompt each time: no prefix-cache hit anywhere.
                words = " ".join(f"w{round_no}x{i}x{k}" for k in range(args.prompt_words))
                body = json.dumps({"model": "sim-model", "stream": True, "max_tokens": 4,
                                   "messages": [{"role": "user", "content": words}]})
                status, first, total = ttft(gport, body)
                with lock:
                    rows.append({"mode": mode, "round": round_no, "i": i, "status": status,
                                 "ttft_s": first, "total_s": total})

        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        for f in logs:
            f.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-words", type=int, default=1500)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "mooncake-legs.jsonl"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in (("parallel", "sequential") if r % 2 == 0 else ("sequential", "parallel")):
                run_mode(mode, args, tmp, rows, r)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    summary = {}
    for mode in ("parallel", "sequential"):
        ok = [r["ttft_s"] for r in rows if r["mode"] == mode and r["status"] == 200
              and r["ttft_s"] is not None]
        bad = sum(1 for r in rows if r["mode"] == mode and r["status"] != 200)
        summary[mode] = {"n": len(ok), "errors": bad, "p50": statistics.median(ok),
                         "p90": pct(ok, 0.9), "p99": pct(ok, 0.99), "mean": statistics.mean(ok)}
        s = summary[mode]
        print(f"{mode:10s} n={s['n']} errors={s['errors']} TTFT p50={s['p50']*1000:.1f} ms "
              f"p90={s['p90']*1000:.1f} ms p99={s['p99']*1000:.1f} ms mean={s['mean']*1000:.1f} ms")
    for q in ("p50", "p90", "p99", "mean"):
        print(f"parallel/sequential {q}: {summary['parallel'][q] / summary['sequential'][q]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
