#!/usr/bin/env python3
"""Paired ratios of bench/routing.sh's rows: how N replicas routing apart
compare with the same N replicas taking every request through one.

On a shared 2-core machine a row's absolute latencies drift from run to
run by more than the effects measured (a hot-prefix p50 of 32-49 ms for the
same build and flags), while an alternating row and the through-one row
run right after it saw about the same machine. So each repeat of the
matrix (routing.sh --repeat) gives one ratio per (replicas, policy):
alternating / through-one for the hit rate and TTFT p50 and p99, and the
summary is the median over repeats with each repeat's value beside it.
Also per repeat: round-robin's alternating p50 / the policy's (how much
faster than round-robin the policy is through N replicas).

Usage: routing_ratios.py ROWS.jsonl [--bounds 0.95,1.15,1.15]
Prints a markdown table; exits 0 whatever the ratios (it reports).
"""
import argparse
import json
import statistics
import sys


def paired(rows):
    """{(replicas, policy): [(repeat, alternating_row, through_one_row)]} for
    every replica count above one whose repeat has both rows."""
    by = {}
    for r in rows:
        if r["replicas"] < 2:
            continue
        key = (r["replicas"], r["policy"], r.get("repeat", 1))
        by.setdefault(key, {})[r.get("traffic", "alternating")] = r
    out = {}
    for (n, policy, rep), rs in sorted(by.items(), key=lambda kv: kv[0]):
        if "alternating" in rs and "through-one" in rs:
            out.setdefault((n, policy), []).append((rep, rs["alternating"], rs["through-one"]))
    return out


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def ratios(rows):
    """Per (replicas, policy): {"hit": [...], "p50": [...], "p99": [...],
    "rr_p50": [...]} with one value per repeat (None where a figure is
    missing), in repeat order."""
    rr = {}
    for r in rows:
        if r["policy"] == "round_robin" and r.get("traffic", "alternating") == "alternating":
            rr[(r["replicas"], r.get("repeat", 1))] = r["ttft_ms"]["p50"]
    out = {}
    for (n, policy), pairs in paired(rows).items():
        d = {"hit": [], "p50": [], "p99": [], "rr_p50": [], "repeats": []}
        for rep, alt, one in pairs:
            d["repeats"].append(rep)
            d["hit"].append(ratio(alt["hit_rate"], one["hit_rate"]))
            d["p50"].append(ratio(alt["ttft_ms"]["p50"], one["ttft_ms"]["p50"]))
            d["p99"].append(ratio(alt["ttft_ms"]["p99"], one["ttft_ms"]["p99"]))
            d["rr_p50"].append(ratio(rr.get((n, rep)), alt["ttft_ms"]["p50"]))
        out[(n, policy)] = d
    return out


def median(values):
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def within(values, lo=None, hi=None):
    """How many of the values meet the bound (lo: at least, hi: at most)."""
    n = 0
    for v in values:
        if v is None:
            continue
        if (lo is None or v >= lo) and (hi is None or v <= hi):
            n += 1
    return n


def table(rows, bounds=(0.95, 1.15, 1.15)):
    fmt = lambda v: "-" if v is None else "%.2fx" % v
    lines = [
        "| replicas | prefill policy | repeats | hit rate alt / one | TTFT p50 alt / one "
        "| TTFT p99 alt / one | round-robin p50 / policy's (alt) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (n, policy), d in ratios(rows).items():
        k = len(d["repeats"])
        if policy == "round_robin":
            d = dict(d, rr_p50=[None] * k)

        def cell(name, lo=None, hi=None):
            values = d[name]
            each = ", ".join(fmt(v) for v in values)
            if k == 1:
                return fmt(values[0])
            bound = "" if lo is None and hi is None else "; %d of %d within" % (within(values, lo, hi), k)
            return "**%s** (%s%s)" % (fmt(median(values)), each, bound)

        lines.append("| %d | %s | %d | %s | %s | %s | %s |" % (
            n, policy, k, cell("hit", lo=bounds[0]), cell("p50", hi=bounds[1]),
            cell("p99", hi=bounds[2]), cell("rr_p50")))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows")
    ap.add_argument("--bounds", default="0.95,1.15,1.15",
                    help="hit rate at least, p50 and p99 at most (alternating / through one)")
    a = ap.parse_args()
    bounds = tuple(float(x) for x in a.bounds.split(","))
    if len(bounds) != 3:
        sys.exit("routing_ratios.py: --bounds takes three numbers")
    with open(a.rows) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    if not paired(rows):
        return
    print("Alternating / through one, each repeat paired (median in bold; "
          "bounds: hit >= %.2fx, p50 <= %.2fx, p99 <= %.2fx):" % bounds)
    print()
    print(table(rows, bounds))


if __name__ == "__main__":
    main()
