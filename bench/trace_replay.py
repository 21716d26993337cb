#!/usr/bin/env python3
"""Replays a Mooncake-format trace through one or more gateways.

Each record becomes a streaming /v1/completions request sent at
timestamp / --speed, the requests alternating between the --url gateways as
a load balancer's round-robin would. The prompt is built from the record's
hash_ids: block id h is 512 tokens of text that depends only on h (2048
bytes: pdgate-sim counts 4 bytes per token), the last block cut to
input_length. Equal leading ids are thus equal leading bytes, which the
gateway's prefix index and the engines' prefix caches see as the same
prefix; different ids differ in every engine block.

Prints one JSON object: requests, failures (non-200, error event, no
[DONE], timeout, connection error), TTFT p50/p90/p99 (ms, successful
requests; from sending the request to the first token event), and the
largest delay of a send behind its schedule (the client keeping up).

Usage: trace_replay.py --trace T.jsonl --url http://127.0.0.1:8000 [--url ...]
                       [--speed 1] [--limit N] [--max-tokens 16]
"""
import argparse
import asyncio
import json
import math
import sys
import time

TRACE_BLOCK = 512
BYTES_PER_TOKEN = 4


def block_text(hash_id):
    """512 tokens of text standing for block `hash_id`: its id in every
    16 bytes, so two blocks differ in every engine block (16 tokens)."""
    return ("b%014d " % hash_id) * (TRACE_BLOCK * BYTES_PER_TOKEN // 16)


def prompt_for(record):
    n = record["input_length"] * BYTES_PER_TOKEN
    text = "".join(block_text(h) for h in record["hash_ids"])
    if len(text) < n:  # a trace whose ids cover less than input_length
        text += "x" * (n - len(text))
    return text[:n]


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def split_url(url):
    if not url.startswith("http://"):
        raise ValueError("--url must be http://HOST:PORT")
    hostport = url[len("http://"):].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


async def one_request(host, port, body):
    """Sends one streaming request; returns (ok, ttft_seconds or None, why)."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = ("POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                "Content-Type: application/json\r\nContent-Length: %d\r\n"
                "Connection: close\r\n\r\n" % (host, port, len(body)))
        writer.write(head.encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 else 0
        # With Connection: close the body (chunked or not) ends at EOF; the
        # chunk-size lines between events do not matter for what is looked at.
        raw = b""
        ttft = None
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            raw += chunk
            if ttft is None and b"data: {" in raw:
                ttft = time.monotonic() - t0
        if status != 200:
            return False, None, "status %d" % status
        if b'"error"' in raw:
            return False, None, "error event"
        if b"[DONE]" not in raw or ttft is None:
            return False, None, "stream cut"
        return True, ttft, ""
    finally:
        writer.close()


async def replay(records, urls, speed, max_tokens, model, timeout_s):
    targets = [split_url(u) for u in urls]
    start = time.monotonic() + 0.2
    ttfts = []
    failures = {}
    lag = [0.0]

    async def run(i, record):
        when = start + record["timestamp"] / 1000.0 / speed
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        body = json.dumps({"model": model, "prompt": prompt_for(record),
                           "max_tokens": max(1, min(record["output_length"], max_tokens)),
                           "stream": True}).encode()
        lag[0] = max(lag[0], time.monotonic() - when)
        host, port = targets[i % len(targets)]
        try:
            ok, ttft, why = await asyncio.wait_for(one_request(host, port, body), timeout_s)
        except asyncio.TimeoutError:
            ok, ttft, why = False, None, "timeout"
        except OSError as e:
            ok, ttft, why = False, None, "connection: %s" % e.__class__.__name__
        if ok:
            ttfts.append(ttft * 1000.0)
        else:
            failures[why] = failures.get(why, 0) + 1

    t_begin = time.monotonic()
    await asyncio.gather(*(run(i, r) for i, r in enumerate(records)))
    elapsed = time.monotonic() - t_begin
    ttfts.sort()
    return {
        "requests": len(records),
        "failures": sum(failures.values()),
        "failure_kinds": failures,
        "ttft_ms": {p: (round(percentile(ttfts, q), 1) if ttfts else None)
                    for p, q in (("p50", 50), ("p90", 90), ("p99", 99))},
        "elapsed_s": round(elapsed, 1),
        "max_send_lag_ms": round(lag[0] * 1000.0, 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--url", action="append", required=True, help="a gateway; repeat for replicas")
    ap.add_argument("--speed", type=float, default=1.0, help="replay this many times faster")
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--max-tokens", type=int, default=16,
                    help="cap on each request's output_length (decode time is not measured)")
    ap.add_argument("--model", default="sim-model")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    a = ap.parse_args()
    if a.speed <= 0:
        ap.error("--speed must be positive")
    records = []
    with open(a.trace) as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
                if a.limit and len(records) >= a.limit:
                    break
    if records:
        t0 = records[0]["timestamp"]
        for r in records:
            r["timestamp"] -= t0
    out = asyncio.run(replay(records, a.url, a.speed, a.max_tokens, a.model, a.timeout_s))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
