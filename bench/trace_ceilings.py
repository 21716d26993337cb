#!/usr/bin/env python3
"""Prefix-cache hit-rate ceilings of a Mooncake-format trace.

The hit rate (cached prompt tokens / prompt tokens) that routing could at
best reach on a trace, counted the way pdgate-sim counts its own
(docs/sim.md): a prompt is cut into blocks of --engine-block tokens, a
block hits when it and every block before it are cached, and the last
prompt token is always computed.

  infinite  one cache that never evicts: every repeated prefix hits
  lru       one LRU cache as large as all engines together (--capacity-tokens);
            routing that spreads requests over K engines of capacity C/K
            cannot beat one cache of capacity C

Usage: trace_ceilings.py TRACE.jsonl --capacity-tokens N [--engine-block 16]
"""
import argparse
import collections
import json
import sys

TRACE_BLOCK = 512  # tokens per hash id


def read_trace(path, limit=0):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            out.append(r)
            if limit and len(out) >= limit:
                break
    return out


def engine_blocks(record, engine_block):
    """Keys of the prompt's full engine blocks, in order. A key stands for
    the block and everything before it (the trace ids are chained, and the
    chain is rebuilt here so a trace that reuses an id elsewhere still
    matches only real prefixes)."""
    n = record["input_length"]
    keys = []
    chain = ()
    per = TRACE_BLOCK // engine_block
    for pos, hid in enumerate(record["hash_ids"]):
        chain = hash((chain, hid))
        full = min(per, (n - pos * TRACE_BLOCK) // engine_block)
        for k in range(full):
            keys.append((chain, k))
    return keys


def cached_tokens(matched, engine_block, input_length):
    return min(matched, (input_length - 1) // engine_block) * engine_block


def ceilings(records, capacity_tokens, engine_block=16):
    """(infinite-cache hit rate, LRU hit rate) over the records."""
    capacity = max(capacity_tokens // engine_block, 1)
    seen = set()
    lru = collections.OrderedDict()  # last = most recently used
    queries = hits_inf = hits_lru = 0
    for r in records:
        keys = engine_blocks(r, engine_block)
        n = r["input_length"]
        queries += n
        m = 0
        while m < len(keys) and keys[m] in seen:
            m += 1
        hits_inf += cached_tokens(m, engine_block, n)
        seen.update(keys)
        m = 0
        while m < len(keys) and keys[m] in lru:
            m += 1
        hits_lru += cached_tokens(m, engine_block, n)
        # Touched tail first, as the sim does, so a chain's head is evicted last.
        for k in reversed(keys):
            lru[k] = True
            lru.move_to_end(k)
        while len(lru) > capacity:
            lru.popitem(last=False)
    if queries == 0:
        return 0.0, 0.0
    return hits_inf / queries, hits_lru / queries


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--capacity-tokens", type=int, required=True,
                    help="KV capacity of all engines together, tokens")
    ap.add_argument("--engine-block", type=int, default=16, help="engine KV block, tokens")
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    a = ap.parse_args()
    if a.engine_block <= 0 or TRACE_BLOCK % a.engine_block:
        ap.error("--engine-block must divide 512")
    inf, lru = ceilings(read_trace(a.trace, a.limit), a.capacity_tokens, a.engine_block)
    json.dump({"infinite": round(inf, 4), "lru": round(lru, 4)}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
