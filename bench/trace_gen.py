#!/usr/bin/env python3
"""Synthetic request traces in the Mooncake JSONL format.

One JSON object per line, sorted by time:
  {"timestamp": ms, "input_length": tokens, "output_length": tokens,
   "hash_ids": [ids of the prompt's 512-token blocks]}
Two prompts share their first k blocks exactly when their first k hash_ids
are equal (an id names a block together with everything before it, as in
the published Mooncake traces), so a trace describes prefix reuse without
any text. bench/trace_replay.py turns the ids back into prompts.

Workloads (--kind):
  system-prompts  a few long system prompts, picked by Zipf popularity,
                  each followed by a question of its own
  multi-turn      conversations whose every turn resends the history
                  (previous prompts and answers) plus a new message
  agent-loops     agents sharing a long tool-description prompt per agent
                  type, each looping: call, read the tool output, call again
  mix             the three together (the benchmark's default)
  short-long      mostly short chat prompts (under one 512-token block) and
                  some long ones over a few shared documents: the workload
                  where sending short prompts in one hop (conditional
                  disaggregation, bench/conditional_pd.sh) should pay
  hot-prefix      4 long shared prefixes (4-12k tokens, Zipf popularity:
                  the hottest takes ~60% of the requests), each request one
                  prefix + a question of its own (64-512 tokens), arriving
                  in bursts: 1-2 s at 4x the mean rate, then 4-8 s at a
                  quarter of it (the mean stays --rate). The workload where
                  several gateway replicas pile onto the engine caching the
                  hot prefix at the same moment

Usage: trace_gen.py --kind mix --duration-s 60 --rate 8 --seed 1 > trace.jsonl
"""
import argparse
import json
import random
import sys

BLOCK = 512  # tokens per hash block, as in the Mooncake traces


class Ids:
    """Hands out block ids; a shared prefix reuses its ids."""

    def __init__(self):
        self.next = 1

    def fresh(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def blocks_for(tokens):
    return (tokens + BLOCK - 1) // BLOCK


def extend(ids, prefix_ids, prefix_tokens, new_tokens):
    """The ids of a prompt made of a prefix (prefix_tokens long, ids
    prefix_ids) followed by new_tokens of new text: the prefix's full
    blocks are kept, its partial last block (if any) is changed by the new
    text, so it and everything after get fresh ids."""
    full = prefix_tokens // BLOCK
    total = prefix_tokens + new_tokens
    return prefix_ids[:full] + ids.fresh(blocks_for(total) - full)


def zipf_pick(rng, n, s=1.1):
    weights = [1.0 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def poisson_times(rng, rate_per_s, duration_s):
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return
        yield t


def system_prompts(rng, ids, rate, duration_s):
    """Sessions of one request each: a popular system prompt + a question."""
    prompts = []
    for _ in range(8):
        tokens = rng.randint(2048, 6144)
        prompts.append((ids.fresh(blocks_for(tokens)), tokens))
    for t in poisson_times(rng, rate, duration_s):
        p_ids, p_tokens = prompts[zipf_pick(rng, len(prompts))]
        question = rng.randint(64, 1024)
        yield t, p_tokens + question, rng.randint(32, 256), extend(ids, p_ids, p_tokens, question)


def conversation(rng, ids, start, head_ids, head_tokens, turns, gap_s, message, answer):
    """One session: each turn sends the history so far plus a new message."""
    hist_ids, hist_tokens = head_ids, head_tokens
    t = start
    for _ in range(turns):
        new = rng.randint(*message)
        req_ids = extend(ids, hist_ids, hist_tokens, new)
        out = rng.randint(*answer)
        yield t, hist_tokens + new, out, req_ids
        # The answer joins the history; the next prompt repeats all of it.
        hist_ids = extend(ids, req_ids, hist_tokens + new, out)
        hist_tokens += new + out
        t += rng.uniform(*gap_s)


def multi_turn(rng, ids, rate, duration_s):
    """Conversations (short system prompt of their own), 2-8 turns."""
    for start in poisson_times(rng, rate / 4.0, duration_s):
        head = rng.randint(256, 1024)
        yield from conversation(rng, ids, start, ids.fresh(blocks_for(head)), head,
                                rng.randint(2, 8), (2.0, 8.0), (64, 768), (32, 384))


def agent_loops(rng, ids, rate, duration_s):
    """Agents of 3 types (a long shared tool prompt each), 4-12 quick steps."""
    types = []
    for _ in range(3):
        tokens = rng.randint(4096, 8192)
        types.append((ids.fresh(blocks_for(tokens)), tokens))
    for start in poisson_times(rng, rate / 8.0, duration_s):
        # Every agent prompt starts with its type's tool prompt (shared), then
        # the task (its own); each step adds the tool output it read.
        t_ids, t_tokens = types[zipf_pick(rng, len(types))]
        task = rng.randint(128, 512)
        head_ids = extend(ids, t_ids, t_tokens, task)
        yield from conversation(rng, ids, start, head_ids, t_tokens + task,
                                rng.randint(4, 12), (0.3, 1.5), (128, 1024), (16, 128))


def short_long(rng, ids, rate, duration_s, short_share=0.75):
    """One request per session: 3 in 4 a short chat message after a short
    system prompt (128-480 tokens in all), the rest a question (64-512
    tokens) about one of 4 long documents (3-6k tokens, Zipf popularity)."""
    docs = []
    for _ in range(4):
        tokens = rng.randint(3072, 6144)
        docs.append((ids.fresh(blocks_for(tokens)), tokens))
    for t in poisson_times(rng, rate, duration_s):
        if rng.random() < short_share:
            tokens = rng.randint(128, 480)
            yield t, tokens, rng.randint(16, 128), ids.fresh(blocks_for(tokens))
        else:
            d_ids, d_tokens = docs[zipf_pick(rng, len(docs))]
            question = rng.randint(64, 512)
            yield t, d_tokens + question, rng.randint(16, 128), extend(ids, d_ids, d_tokens,
                                                                        question)


def on_off_times(rng, rate_per_s, duration_s, burst_s=(1.0, 2.0), gap_s=(4.0, 8.0),
                 burst_factor=4.0, gap_factor=0.25):
    """Bursty arrivals: Poisson at burst_factor x rate during bursts of
    burst_s seconds, at gap_factor x rate during the gaps of gap_s seconds
    between them. With the defaults the mean rate is rate_per_s (a burst
    of 1.5 s on average carries 4 x 1.5 = 6 s of requests, a gap of 6 s
    1.5 s: 7.5 s of requests in 7.5 s). The trace starts part-way into a
    gap, so the first burst does not come at time 0."""
    t = 0.0
    burst = False
    seg = rng.uniform(0.0, rng.uniform(*gap_s))
    while t < duration_s:
        end = min(duration_s, t + seg)
        lam = rate_per_s * (burst_factor if burst else gap_factor)
        # Poisson arrivals restarted at each segment (memoryless).
        u = t + rng.expovariate(lam)
        while u < end:
            yield u
            u += rng.expovariate(lam)
        t = end
        burst = not burst
        seg = rng.uniform(*(burst_s if burst else gap_s))


def hot_prefix(rng, ids, rate, duration_s):
    """One request per session: one of 16 long prefixes (4-12k tokens, Zipf
    popularity with s = 1.2: the hottest takes ~30% of the requests, the
    four hottest ~60%) + a question of its own (64-512 tokens), bursty
    arrivals (on_off_times). Sixteen prefixes of ~8k tokens are ~128k
    tokens: with engines of 64k tokens of KV each (bench/README.md), no
    engine holds them all, so where a prefix goes decides its hits, and in
    a burst the hot prefix's home queues more than recomputing it costs."""
    prefixes = []
    for _ in range(16):
        tokens = rng.randint(4096, 12288)
        prefixes.append((ids.fresh(blocks_for(tokens)), tokens))
    for t in on_off_times(rng, rate, duration_s):
        p_ids, p_tokens = prefixes[zipf_pick(rng, len(prefixes), s=1.2)]
        question = rng.randint(64, 512)
        yield t, p_tokens + question, rng.randint(16, 128), extend(ids, p_ids, p_tokens, question)


KINDS = {
    "system-prompts": [(system_prompts, 1.0)],
    "multi-turn": [(multi_turn, 1.0)],
    "agent-loops": [(agent_loops, 1.0)],
    "mix": [(system_prompts, 0.3), (multi_turn, 0.35), (agent_loops, 0.35)],
    "short-long": [(short_long, 1.0)],
    "hot-prefix": [(hot_prefix, 1.0)],
}


def generate(kind, rate, duration_s, seed):
    """The trace's records, sorted by timestamp; `rate` is the mean requests/s
    (sessions of several turns start less often, so the total matches)."""
    rng = random.Random(seed)
    ids = Ids()
    streams = [gen(rng, ids, rate * share, duration_s) for gen, share in KINDS[kind]]
    records = []
    for stream in streams:
        for t, input_len, output_len, hash_ids in stream:
            if t < duration_s:
                assert len(hash_ids) == blocks_for(input_len)
                records.append({"timestamp": int(t * 1000), "input_length": input_len,
                                "output_length": output_len, "hash_ids": hash_ids})
    records.sort(key=lambda r: r["timestamp"])
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=sorted(KINDS), default="mix")
    ap.add_argument("--rate", type=float, default=8.0, help="mean requests per second")
    ap.add_argument("--duration-s", type=float, default=60.0, help="trace length, seconds")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.rate <= 0 or a.duration_s <= 0:
        ap.error("--rate and --duration-s must be positive")
    for r in generate(a.kind, a.rate, a.duration_s, a.seed):
        sys.stdout.write(json.dumps(r, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
