#!/usr/bin/env python3
"""The client-visible stall when a stream is resumed on another decode.

Starts a prefill pdgate-sim, a decode sim that dies after --die-after events
of every stream, a healthy decode sim, and a pdgate in front of them
(round-robin: half the streams start on the dying decode and are resumed
on the other). Sends streamed chat requests, some at a time, each with its
own X-Request-Id, and measures on the client:

  stall   for a resumed stream, the longest gap between two events (the
          break, the continuation's prefill and decode's first token)
  ttft    for a stream that was not resumed, request sent to first token:
          what a fresh request costs, the engines' own time to first token
          plus the gateway's

Writes one JSON row per request to bench/results/migration-stall.jsonl (or
--out) and prints the percentiles of both and their ratio.

Usage: bench/migration_stall.py [--build build] [--requests 200]
       [--concurrency 8] [--tokens 40] [--die-after 10] [--prompt-words 200]
       [--out FILE]
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time

from mooncake_legs import start  # starts a process, reads its port


def stream(port, body, rid):
    """Event arrival times (seconds since the request was sent) and the text."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body,
              {"Content-Type": "application/json", "X-Request-Id": rid})
    r = c.getresponse()
    times, text, ok = [], "", False
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            ok = True
            continue
        event = json.loads(data)
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                times.append(time.perf_counter() - t0)
                text += piece
    c.close()
    return times, text, ok


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--die-after", type=int, default=10)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--itl-ms", type=float, default=10)
    ap.add_argument("--out", default="bench/results/migration-stall.jsonl")
    a = ap.parse_args()

    sim = os.path.join(a.build, "pdgate-sim")
    gw = os.path.join(a.build, "pdgate")
    logs = tempfile.mkdtemp(prefix="migration-stall-")
    common = ["--host", "127.0.0.1", "--port", "0", "--itl-ms", str(a.itl_ms),
              "--max-num-seqs", "256", "--prefill-base-ms", "5", "--log-level", "warn"]
    procs = []
    try:
        p, pport = start([sim, "--role", "prefill", "--prefill-lanes", "0", *common],
                         open(os.path.join(logs, "prefill.log"), "w"))
        procs.append(p)
        d1, dying = start([sim, "--role", "decode", "--die-after-chunks", str(a.die_after), *common],
                          open(os.path.join(logs, "dying.log"), "w"))
        procs.append(d1)
        d2, healthy = start([sim, "--role", "decode", *common],
                            open(os.path.join(logs, "healthy.log"), "w"))
        procs.append(d2)
        g, port = start([gw, "--host", "127.0.0.1", "--port", "0", "--prefill", f"127.0.0.1:{pport}",
                         "--decode", f"127.0.0.1:{dying}", f"127.0.0.1:{healthy}",
                         "--retry-budget", "1", "--eject-after", "1000", "--log-level", "warn"],
                        open(os.path.join(logs, "pdgate.log"), "w"))
        procs.append(g)

        prompt = " ".join(f"word{i}" for i in range(a.prompt_words))
        rows, lock = [], threading.Lock()
        todo = iter(range(a.requests))

        def worker():
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                rid = f"bench-{i}"
                body = json.dumps({"model": "sim-model", "stream": True, "max_tokens": a.tokens,
                                   "messages": [{"role": "user", "content": f"{i} {prompt}"}]})
                times, text, ok = stream(port, body, rid)
                gaps = [b - t for t, b in zip(times, times[1:])]
                with lock:
                    rows.append({"rid": rid, "ok": ok, "tokens": len(times),
                                 "ttft_s": times[0] if times else None,
                                 "max_gap_s": max(gaps) if gaps else None})

        threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        # Which streams started on the dying decode: its request log.
        c = http.client.HTTPConnection("127.0.0.1", dying, timeout=10)
        c.request("GET", "/sim/requests")
        broke = {r.get("request_id") for r in json.loads(c.getresponse().read())}
        for r in rows:
            r["resumed"] = r["rid"] in broke
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        bad = [r for r in rows if not r["ok"] or r["tokens"] != a.tokens]
        stalls = [r["max_gap_s"] * 1000 for r in rows if r["resumed"] and r["max_gap_s"]]
        ttfts = [r["ttft_s"] * 1000 for r in rows if not r["resumed"] and r["ttft_s"]]
        gaps = [r["max_gap_s"] * 1000 for r in rows if not r["resumed"] and r["max_gap_s"]]
        print(f"{len(rows)} streams, {len(stalls)} resumed, {len(bad)} incomplete")
        print("| measure | n | p50 | p90 | p99 | mean |")
        print("|---|---|---|---|---|---|")
        for name, v in (("stall at a migration (resumed streams' longest gap)", stalls),
                        ("time to first token (streams not resumed)", ttfts),
                        ("longest gap of streams not resumed", gaps)):
            if v:
                print(f"| {name} | {len(v)} | {pct(v, 50):.1f} ms | {pct(v, 90):.1f} ms | "
                      f"{pct(v, 99):.1f} ms | {statistics.mean(v):.1f} ms |")
        if stalls and ttfts:
            print(f"| **stall / TTFT** | | **{pct(stalls, 50) / pct(ttfts, 50):.2f}** | "
                  f"**{pct(stalls, 90) / pct(ttfts, 90):.2f}** | "
                  f"**{pct(stalls, 99) / pct(ttfts, 99):.2f}** | "
                  f"**{statistics.mean(stalls) / statistics.mean(ttfts):.2f}** |")
        return 1 if bad else 0
    finally:
        for p in procs:
            p.kill()


if __name__ == "__main__":
    sys.exit(main())
