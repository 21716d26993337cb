#!/usr/bin/env python3
"""Turns bench/compare.sh's raw.jsonl into results.md and gnuplot scripts.

Every ratio is computed within one round (the targets of a round ran
back to back, so they saw the same machine load) and the table shows the
median over rounds with the range: absolute numbers on a shared 2-core
machine drift, paired ratios much less.
"""
import json
import statistics
import sys
from pathlib import Path

raw, out = Path(sys.argv[1]), Path(sys.argv[2])
load_before, load_after, rounds, secs, streams = sys.argv[3:8]
# Results written before the static rows had rounds of their own (or given
# no such arguments) ran them in the main rounds.
own_static_rounds = len(sys.argv) >= 10
static_rounds, static_secs = sys.argv[8:10] if own_static_rounds else (rounds, secs)
TARGETS = ["direct", "directpd", "nginx", "onehop", "pd"]
NAMES = {"direct": "direct", "directpd": "direct P/D", "nginx": "nginx", "onehop": "pdgate one-hop",
         "pd": "pdgate P/D"}
# The floor a row is measured against: a single request to a --role both
# engine ("direct") for one-hop proxies, the client doing the P/D handshake
# itself with the prefill and decode engines ("direct P/D") for pdgate P/D.
FLOORS = {"direct": "direct (one engine)", "directpd": "direct P/D (client → prefill → decode)",
          None: "—"}

runs = {}  # (workload, target) -> {round: result}
holds = {}
syscalls = {}  # (workload, target) -> system calls per request
for line in raw.read_text().splitlines():
    r = json.loads(line)
    if r["workload"] == "hold":
        holds[r["target"]] = r
        continue
    if r["workload"].startswith("syscalls_"):
        syscalls[(r["workload"][len("syscalls_"):], r["target"])] = r["calls"] / max(r["requests"], 1)
        continue
    res = r["result"]
    if res.get("all"):
        res["cpu_us"] = r.get("cpu_ns", 0) / 1000 / res["all"]
    runs.setdefault((r["workload"], r["target"]), {})[r["round"]] = res

all_rounds = sorted({k for v in runs.values() for k in v})


def val(workload, target, key, rnd):
    r = runs.get((workload, target), {}).get(rnd)
    if not r or r.get("ok", 0) == 0:
        return None
    return r.get(key)


def per_round(fn):
    xs = []
    for rnd in all_rounds:
        try:
            x = fn(rnd)
        except (TypeError, ZeroDivisionError):
            x = None
        if x is not None:
            xs.append(x)
    return xs


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rng(xs, fmt):
    if not xs:
        return "n/a"
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def absolute(workload, target, key):
    return med(per_round(lambda r: val(workload, target, key, r)))


rows = []


def target(name, xs, fmt, goal, ok, floor=None):
    met = "n/a" if not xs else ("—" if goal == "—" else "**met**" if ok(med(xs)) else "**missed**")
    rows.append(f"| {name} | {FLOORS[floor]} | {rng(xs, fmt)} | {goal} | {met} |")


# 1. One-hop throughput against nginx.
target("one-hop throughput ÷ nginx throughput (c=32)",
       per_round(lambda r: val("throughput", "onehop", "rps", r) / val("throughput", "nginx", "rps", r)),
       "{:.2f}×", "≥ 0.8×", lambda m: m >= 0.8)


target("nginx CPU per request ÷ one-hop CPU per request (c=32): throughput per core",
       per_round(lambda r: val("throughput", "nginx", "cpu_us", r) / val("throughput", "onehop", "cpu_us", r)),
       "{:.2f}×", "≥ 0.8×", lambda m: m >= 0.8)


# 2. P/D added p50 latency against nginx's one-hop added latency. Each
# proxy is measured against its own floor: nginx against one request to a
# combined engine, pdgate P/D against the client doing the handshake with
# the same prefill and decode engines itself.
def added(workload, t, key, r, floor="direct"):
    return val(workload, t, key, r) - val(workload, floor, key, r)


# A per-round ratio is meaningless when nginx's added latency is at or
# below zero (it is a few µs on loopback, inside the engine's own jitter):
# the verdict compares the medians instead, P/D ≤ 2 × max(nginx, 0).
pd_added = per_round(lambda r: added("latency", "pd", "e2e_p50", r, "directpd"))
nginx_added = per_round(lambda r: added("latency", "nginx", "e2e_p50", r))
if pd_added and nginx_added:
    pd_m, ng_m = med(pd_added), med(nginx_added)
    shown = (f"{pd_m / ng_m:.2f}×" if ng_m > 0 else
             f"n/a: nginx's added latency {ng_m:+.3f} ms is ≤ 0 (noise), P/D's {pd_m:+.3f} ms")
    verdict = "**met**" if pd_m <= 2 * max(ng_m, 0.0) else "**missed**"
    rows.append(f"| P/D added p50 latency ÷ nginx added p50 latency (c=1), ratio of medians "
                f"| {FLOORS['directpd']} | {shown} | ≤ 2× | {verdict} |")
target("P/D added p50 latency (ms, c=1)",
       per_round(lambda r: added("latency", "pd", "e2e_p50", r, "directpd")), "{:+.3f}", "—",
       lambda m: True, "directpd")
target("nginx added p50 latency (ms, c=1), for scale",
       per_round(lambda r: added("latency", "nginx", "e2e_p50", r)), "{:+.3f}", "—",
       lambda m: True, "direct")
# 3. Streaming TTFT p99 and inter-token gaps.
target("one-hop TTFT p99 − floor TTFT p99 (ms)",
       per_round(lambda r: added("stream", "onehop", "ttft_p99", r)), "{:+.3f}", "≤ 1 ms",
       lambda m: m <= 1, "direct")
target("P/D TTFT p99 − floor TTFT p99 (ms)",
       per_round(lambda r: added("stream", "pd", "ttft_p99", r, "directpd")), "{:+.3f}", "≤ 1 ms",
       lambda m: m <= 1, "directpd")
target("P/D TTFT p99 − one-engine TTFT p99 (ms): the old floor, engines' P/D work included",
       per_round(lambda r: added("stream", "pd", "ttft_p99", r)), "{:+.3f}", "—", lambda m: True,
       "direct")
for t, floor in (("onehop", "direct"), ("pd", "directpd")):
    target(f"{NAMES[t]} ITL p50 − floor ITL p50 (ms)",
           per_round(lambda r, t=t, floor=floor: added("stream", t, "itl_p50", r, floor)), "{:+.3f}",
           "≈ 0 (±0.5 ms)", lambda m: abs(m) <= 0.5, floor)
    target(f"{NAMES[t]} ITL p99 − floor ITL p99 (ms)",
           per_round(lambda r, t=t, floor=floor: added("stream", t, "itl_p99", r, floor)), "{:+.3f}",
           "≈ 0 (±1 ms)", lambda m: abs(m) <= 1, floor)


# 4. 1 MiB prompt against 1 KiB: what the proxy adds on top of its floor
# (for P/D the floor includes both engines' passes and the KV pull).
def big_prompt_cost(t, r, floor="direct"):
    gw = val("prompt_1m", t, "e2e_p50", r) - val("prompt_1k", t, "e2e_p50", r)
    eng = val("prompt_1m", floor, "e2e_p50", r) - val("prompt_1k", floor, "e2e_p50", r)
    return gw - eng


target("one-hop: extra p50 latency of 1 MiB over 1 KiB, minus the floor's (ms)",
       per_round(lambda r: big_prompt_cost("onehop", r)), "{:+.3f}", "≤ 2 ms", lambda m: m <= 2,
       "direct")
target("P/D: extra p50 latency of 1 MiB over 1 KiB, minus the floor's (ms)",
       per_round(lambda r: big_prompt_cost("pd", r, "directpd")), "{:+.3f}", "≤ 2 ms",
       lambda m: m <= 2, "directpd")
target("nginx: extra p50 latency of 1 MiB over 1 KiB, minus the floor's, for scale (ms)",
       per_round(lambda r: big_prompt_cost("nginx", r)), "{:+.3f}", "—", lambda m: True, "direct")
target("one-hop: gateway CPU per 1 MiB request − per 1 KiB request (ms)",
       per_round(lambda r: (val("prompt_1m", "onehop", "cpu_us", r) - val("prompt_1k", "onehop", "cpu_us", r)) / 1000),
       "{:+.3f}", "≤ 2 ms", lambda m: m <= 2)
target("P/D: gateway CPU per 1 MiB request − per 1 KiB request (ms)",
       per_round(lambda r: (val("prompt_1m", "pd", "cpu_us", r) - val("prompt_1k", "pd", "cpu_us", r)) / 1000),
       "{:+.3f}", "≤ 2 ms", lambda m: m <= 2)
target("nginx: gateway CPU per 1 MiB request − per 1 KiB request, for scale (ms)",
       per_round(lambda r: (val("prompt_1m", "nginx", "cpu_us", r) - val("prompt_1k", "nginx", "cpu_us", r)) / 1000),
       "{:+.3f}", "—", lambda m: True)
# 5. Idle streams.


def early_rss(h):
    """The RSS read 1 s after the last stream opened, as a note (runs from
    before it was read say nothing)."""
    if "rss_early_kib" not in h:
        return ""
    return f"; {h['rss_early_kib'] / 1024:.1f} MiB 1 s after the last opened"


h = holds.get("pdgate")
if h:
    held = max(h["streams"], 1)
    per = (h["rss_during_kib"] - h["rss_before_kib"]) / held
    # Where the open-file limit kept the run below the goal's stream
    # count, the idle RSS plus the measured per-stream cost is projected.
    at_goal = (h["rss_before_kib"] + per * int(streams)) / 1024
    met = "**met**" if at_goal <= 100 else "**missed**"
    proj = "" if h["streams"] >= int(streams) else f"; projected to {streams}: {at_goal:.1f} MiB"
    rows.append(f"| pdgate RSS with {h['streams']} idle streams held, 4 s after the last opened | — | "
                f"{h['rss_during_kib'] / 1024:.1f} MiB ({per:.2f} KiB/stream over "
                f"{h['rss_before_kib'] / 1024:.1f} MiB idle{proj}{early_rss(h)}) | ≤ 100 MiB at {streams} | {met} |")
h = holds.get("nginx")
if h:
    per = (h["rss_during_kib"] - h["rss_before_kib"]) / max(h["streams"], 1)
    rows.append(f"| nginx worker RSS, {h['streams']} idle streams, for scale | — | "
                f"{h['rss_during_kib'] / 1024:.1f} MiB ({per:.2f} KiB/stream{early_rss(h)}) | — | — |")

# 6. Against engines that cost nothing (static answers): the proxy's own
# CPU per request, and its system calls.
static_rows = []


def static_target(name, xs, fmt, goal, ok):
    met = "n/a" if not xs else ("—" if goal == "—" else "**met**" if ok(med(xs)) else "**missed**")
    static_rows.append(f"| {name} | {rng(xs, fmt)} | {goal} | {met} |")


for w, desc in (("static_stream", "streaming 4-event answer"), ("static_whole", "whole answer")):
    static_target(f"nginx CPU/request ÷ pdgate one-hop CPU/request, {desc} (c=32)",
                  per_round(lambda r, w=w: val(w, "nginx", "cpu_us", r) / val(w, "onehop", "cpu_us", r)),
                  "{:.2f}×", "≥ 0.8×", lambda m: m >= 0.8)
for w, desc in (("static_stream", "streaming"), ("static_whole", "whole")):
    static_target(f"pdgate P/D CPU/request ÷ one-hop CPU/request, {desc} (c=32)",
                  per_round(lambda r, w=w: val(w, "pd", "cpu_us", r) / val(w, "onehop", "cpu_us", r)),
                  "{:.2f}×", "≤ 2×", lambda m: m <= 2)
for w, desc in (("static_stream", "streaming"), ("static_whole", "whole")):
    for t in ("nginx", "onehop", "pd"):
        static_target(f"{NAMES[t]} CPU µs/request, {desc}",
                      per_round(lambda r, w=w, t=t: val(w, t, "cpu_us", r)), "{:.1f}", "—",
                      lambda m: True)
for w in ("stream", "whole"):
    cells = [f"{syscalls[(w, t)]:.2f}" if (w, t) in syscalls else "n/a" for t in ("nginx", "onehop", "pd")]
    static_rows.append(f"| system calls per request, {w} (nginx / one-hop / P/D) | {' / '.join(cells)} | — | — |")

lines = [
    "# pdgate against the floor and nginx",
    "",
    f"Generated by `bench/compare.sh`: {rounds} interleaved rounds of {secs} s runs; "
    f"load average before {load_before}, after {load_after} (2 cores, shared).",
    "Each ratio or difference is computed within a round; shown: median (min–max over rounds).",
    "The floor column says what a row is measured against: **direct (one engine)** is one request",
    "to a `--role both` engine (the floor of nginx and pdgate one-hop); **direct P/D** is the",
    "client itself POSTing to the prefill engine (max_tokens 1, kv_transfer_params",
    "do_remote_decode) and then to the decode engine with the returned params (the floor of",
    "pdgate P/D: both engines' passes and the decode's KV pull are in it).",
    "",
    "| target | floor | measured | goal | |",
    "| --- | --- | --- | --- | --- |",
    *rows,
    "",
    "## Against engines that cost nothing",
    "",
    "A second nginx answers every request with a fixed body at once (a 4-event chat stream, a",
    "whole chat answer, a prefill answer with kv_transfer_params), so the proxies' own work is",
    "what is measured: CPU time of the proxy process (all threads) per request, and system",
    "calls per request counted by `strace -c` over 4,000 requests.",
    (f"These rows have rounds of their own: {static_rounds} rounds of {static_secs} s runs, each"
     if own_static_rounds else f"These rows ran in the {rounds} rounds above ({secs} s runs), each"),
    "target once per round in a rotated order; a ratio pairs the runs of one round, and the",
    "table shows the median over rounds (min–max), so a burst of load from elsewhere on the",
    "machine moves the range more than the median.",
    "",
    "| target | measured | goal | |",
    "| --- | --- | --- | --- |",
    *static_rows,
    "",
    "## Absolute numbers (median over rounds)",
    "",
    "| workload | metric | " + " | ".join(NAMES[t] for t in TARGETS) + " |",
    "| --- | --- | " + " | ".join("---" for _ in TARGETS) + " |",
]
metrics = [
    ("throughput", "rps", "req/s, c=32, 16 tokens"),
    ("throughput", "e2e_p50", "e2e p50 ms, c=32"),
    ("latency", "e2e_p50", "e2e p50 ms, c=1"),
    ("latency", "e2e_p99", "e2e p99 ms, c=1"),
    ("stream", "ttft_p50", "TTFT p50 ms, c=8, 5 ms/token"),
    ("stream", "ttft_p99", "TTFT p99 ms"),
    ("stream", "itl_p50", "ITL p50 ms"),
    ("stream", "itl_p99", "ITL p99 ms"),
    ("prompt_1k", "e2e_p50", "1 KiB prompt e2e p50 ms"),
    ("prompt_1m", "e2e_p50", "1 MiB prompt e2e p50 ms"),
    ("throughput", "cpu_us", "CPU µs/request, c=32 (direct, direct P/D: the engines')"),
    ("latency", "cpu_us", "CPU µs/request, c=1"),
    ("stream", "cpu_us", "CPU µs/request, streaming 32 tokens"),
    ("prompt_1k", "cpu_us", "CPU µs/request, 1 KiB prompt"),
    ("prompt_1m", "cpu_us", "CPU µs/request, 1 MiB prompt"),
]
for w, k, desc in metrics:
    cells = [f"{absolute(w, t, k):.3f}" if k != "rps" else f"{absolute(w, t, k):.0f}" for t in TARGETS]
    lines.append(f"| {w} | {desc} | " + " | ".join(cells) + " |")
errs = sum(r.get("errors", 0) for v in runs.values() for r in v.values())
lines += ["", f"Failed requests over all runs: {errs}.", ""]
(out / "results.md").write_text("\n".join(lines))


# gnuplot: one clustered bar chart per question.
def chart(name, title, ylabel, series):
    dat = out / f"{name}.dat"
    with dat.open("w") as f:
        f.write("# target " + " ".join(s[0].replace(" ", "_") for s in series) + "\n")
        for t in TARGETS:
            f.write(f"\"{NAMES[t]}\" " + " ".join(f"{absolute(s[1], t, s[2]):.4f}" for s in series) + "\n")
    cols = f"'{dat}' using 2:xtic(1) title '{series[0][0]}'" + "".join(
        f", '' using {i + 2} title '{s[0]}'" for i, s in enumerate(series) if i > 0)
    (out / f"{name}.gp").write_text(
        f"set terminal pngcairo size 800,450 noenhanced\nset output '{out / (name + '.png')}'\n"
        f"set title '{title}'\nset ylabel '{ylabel}'\nset style data histograms\n"
        "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
        "set key top left\nset grid ytics\nset yrange [0:*]\n"
        f"plot {cols}\n")


chart("throughput", "Throughput, 32 concurrent non-streaming requests", "requests/s",
      [("req/s", "throughput", "rps")])
chart("latency", "End-to-end latency, one request at a time", "ms",
      [("p50", "latency", "e2e_p50"), ("p99", "latency", "e2e_p99")])
chart("streaming", "Streaming (5 ms/token): TTFT and inter-token gaps", "ms",
      [("TTFT p50", "stream", "ttft_p50"), ("TTFT p99", "stream", "ttft_p99"),
       ("ITL p50", "stream", "itl_p50"), ("ITL p99", "stream", "itl_p99")])
chart("prompt_size", "Prompt size: 1 KiB against 1 MiB (e2e p50)", "ms",
      [("1 KiB", "prompt_1k", "e2e_p50"), ("1 MiB", "prompt_1m", "e2e_p50")])
