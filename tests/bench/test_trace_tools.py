"""The routing benchmark's trace tools (bench/trace_*.py): traces are well
formed, prompts rebuilt from hash ids share bytes exactly as the ids say,
the ceilings count as pdgate-sim does, and, end to end, one engine with
room for everything reaches exactly the infinite-cache ceiling."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import routing_ratios  # noqa: E402
import trace_ceilings  # noqa: E402
import trace_gen  # noqa: E402
import trace_replay  # noqa: E402


def rec(ts, n, ids, out=4):
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


class TraceGen(unittest.TestCase):
    # Every kind yields records sorted by time, one hash id per started 512-token block.
    def test_records_well_formed(self):
        for kind in trace_gen.KINDS:
            rs = trace_gen.generate(kind, 4.0, 20.0, 3)
            self.assertGreater(len(rs), 20, kind)
            self.assertEqual([r["timestamp"] for r in rs], sorted(r["timestamp"] for r in rs))
            for r in rs:
                self.assertEqual(len(r["hash_ids"]), (r["input_length"] + 511) // 512, kind)
                self.assertGreater(r["output_length"], 0)

    # The same seed gives the same trace; another seed another one.
    def test_deterministic(self):
        self.assertEqual(trace_gen.generate("mix", 4.0, 10.0, 7), trace_gen.generate("mix", 4.0, 10.0, 7))
        self.assertNotEqual(trace_gen.generate("mix", 4.0, 10.0, 7), trace_gen.generate("mix", 4.0, 10.0, 8))

    # A conversation's next turn keeps the previous prompt's full blocks and replaces its
    # partial last block (new text was appended to it).
    def test_extend_keeps_full_blocks(self):
        ids = trace_gen.Ids()
        first = ids.fresh(3)  # 1100 tokens: blocks 1, 2 full, 3 partial
        nxt = trace_gen.extend(ids, first, 1100, 500)  # 1600 tokens: 4 blocks
        self.assertEqual(nxt[:2], first[:2])
        self.assertNotIn(first[2], nxt)
        self.assertEqual(len(nxt), 4)

    # Each kind reuses prefixes: its infinite-cache ceiling is well above zero.
    def test_kinds_reuse_prefixes(self):
        for kind in trace_gen.KINDS:
            inf, _ = trace_ceilings.ceilings(trace_gen.generate(kind, 4.0, 30.0, 1), 10 ** 9)
            self.assertGreater(inf, 0.3, kind)


def max_window(times_s, width_s=1.0):
    """The most records in any window of width_s seconds (sorted times)."""
    best, j = 0, 0
    for i, t in enumerate(times_s):
        while t - times_s[j] >= width_s:
            j += 1
        best = max(best, i - j + 1)
    return best


def dispersion(times_s, duration_s):
    """Variance over mean of the counts in 1-s bins: ~1 for Poisson arrivals."""
    counts = [0] * int(duration_s)
    for t in times_s:
        counts[min(int(t), len(counts) - 1)] += 1
    mean = sum(counts) / len(counts)
    return sum((c - mean) ** 2 for c in counts) / len(counts) / mean


class HotPrefix(unittest.TestCase):
    # Every request is one of at most 16 long prefixes (>= 4k tokens: 8 full blocks) and a
    # question of its own (64-512 tokens, so at most 2 blocks of its own); one prefix is hot,
    # and together they are more than one 64k-token engine cache holds.
    def test_few_long_shared_prefixes(self):
        rs = trace_gen.generate("hot-prefix", 8.0, 60.0, 1)
        groups = {}
        for r in rs:
            groups.setdefault(r["hash_ids"][0], []).append(r)
        self.assertLessEqual(len(groups), 16)
        self.assertGreaterEqual(len(groups), 10)
        for first, g in groups.items():
            common = g[0]["hash_ids"]
            for r in g[1:]:
                k = 0
                while k < min(len(common), len(r["hash_ids"])) and common[k] == r["hash_ids"][k]:
                    k += 1
                common = common[:k]
            self.assertGreaterEqual(len(common), 4096 // 512, first)
            for r in g:
                own = r["input_length"] - len(common) * 512
                self.assertGreaterEqual(own, 64, r)
                self.assertLessEqual(own, 512 + 511, r)
                self.assertLessEqual(len(r["hash_ids"]) - len(common), 2, r)
        sizes = sorted((len(g) for g in groups.values()), reverse=True)
        self.assertGreater(sizes[0], 0.2 * len(rs), sizes)
        self.assertGreater(sizes[0], 1.5 * sizes[1], sizes)
        self.assertGreater(sum(sizes[:4]), 0.5 * len(rs), sizes)
        prefix_tokens = sum(min(r["input_length"] for r in g) for g in groups.values())
        self.assertGreater(prefix_tokens, 65536, prefix_tokens)
        inf, _ = trace_ceilings.ceilings(rs, 10 ** 9)
        self.assertGreater(inf, 0.8)

    # Arrivals come in bursts: the busiest 1-s window holds several times the mean rate and
    # the 1-s counts are far more spread than Poisson's (system-prompts: dispersion ~1),
    # while the mean rate stays --rate.
    def test_bursty_with_the_mean_rate(self):
        for seed in (1, 2, 3):
            rs = trace_gen.generate("hot-prefix", 8.0, 60.0, seed)
            ts = [r["timestamp"] / 1000.0 for r in rs]
            self.assertGreater(len(rs) / 60.0, 8.0 * 0.8, seed)
            self.assertLess(len(rs) / 60.0, 8.0 * 1.25, seed)
            self.assertGreaterEqual(max_window(ts), 3 * 8, seed)
            self.assertGreater(dispersion(ts, 60.0), 5.0, seed)
        long = trace_gen.generate("hot-prefix", 8.0, 600.0, 4)
        self.assertAlmostEqual(len(long) / 600.0, 8.0, delta=0.8)
        poisson = [r["timestamp"] / 1000.0 for r in trace_gen.generate("system-prompts", 8.0, 60.0, 1)]
        self.assertLess(dispersion(poisson, 60.0), 2.0)
        self.assertLess(max_window(poisson), 3 * 8)

    # The same seed gives the same trace (prefixes and arrival times); another seed another one.
    def test_deterministic(self):
        a = trace_gen.generate("hot-prefix", 8.0, 30.0, 7)
        self.assertEqual(a, trace_gen.generate("hot-prefix", 8.0, 30.0, 7))
        b = trace_gen.generate("hot-prefix", 8.0, 30.0, 8)
        self.assertNotEqual([r["timestamp"] for r in a], [r["timestamp"] for r in b])


class Prompts(unittest.TestCase):
    # A prompt is 4 bytes per token; equal leading ids give equal leading bytes, and two
    # different ids differ in every 64-byte (16-token) engine block.
    def test_ids_map_to_bytes(self):
        a = trace_replay.prompt_for(rec(0, 1200, [5, 6, 7]))
        b = trace_replay.prompt_for(rec(0, 1100, [5, 6, 9]))
        self.assertEqual(len(a), 4800)
        self.assertEqual(len(b), 4400)
        self.assertEqual(a[:4096], b[:4096])
        for off in range(4096, 4400, 64):
            self.assertNotEqual(a[off:off + 64], b[off:off + 64], off)

    # Nearest-rank percentiles.
    def test_percentile(self):
        v = list(range(1, 101))
        self.assertEqual(trace_replay.percentile(v, 50), 50)
        self.assertEqual(trace_replay.percentile(v, 99), 99)
        self.assertEqual(trace_replay.percentile([7], 90), 7)
        self.assertIsNone(trace_replay.percentile([], 50))


class Ceilings(unittest.TestCase):
    # A prompt extending an earlier one hits the earlier one's blocks in an infinite cache.
    def test_infinite(self):
        inf, _ = trace_ceilings.ceilings([rec(0, 1024, [1, 2]), rec(1, 1536, [1, 2, 3])], 10 ** 9)
        self.assertAlmostEqual(inf, 1024 / 2560)

    # An LRU of 512 tokens keeps only the first prompt's head block (a chain's tail is
    # evicted first), so the second prompt hits 512 tokens.
    def test_lru_keeps_head(self):
        _, lru = trace_ceilings.ceilings([rec(0, 1024, [1, 2]), rec(1, 1536, [1, 2, 3])], 512)
        self.assertAlmostEqual(lru, 512 / 2560)

    # The last prompt token is always computed: a repeated prompt hits all but its last
    # 16-token block when its length is a multiple of 16.
    def test_last_token_computed(self):
        inf, _ = trace_ceilings.ceilings([rec(0, 512, [4]), rec(1, 512, [4])], 10 ** 9)
        self.assertAlmostEqual(inf, 496 / 1024)

    # An id reused after a different prefix is not a match (ids are chained).
    def test_only_real_prefixes(self):
        inf, _ = trace_ceilings.ceilings([rec(0, 1024, [1, 2]), rec(1, 1024, [3, 2])], 10 ** 9)
        self.assertEqual(inf, 0)


def row(n, traffic, policy, rep, hit, p50, p99):
    return {"replicas": n, "traffic": traffic, "policy": policy, "repeat": rep, "hit_rate": hit,
            "ttft_ms": {"p50": p50, "p90": None, "p99": p99}}


class RoutingRatios(unittest.TestCase):
    # Each repeat's alternating row is divided by the same repeat's through-one row, never by
    # another repeat's; one-replica rows and a repeat missing its pair are left out.
    def test_pairs_within_a_repeat(self):
        rows = [row(1, "alternating", "pa", 1, 0.9, 10, 100),
                row(4, "alternating", "round_robin", 1, 0.6, 200, 900),
                row(4, "alternating", "pa", 1, 0.8, 30, 300),
                row(4, "through-one", "pa", 1, 0.8, 20, 200),
                row(4, "alternating", "round_robin", 2, 0.6, 120, 900),
                row(4, "alternating", "pa", 2, 0.9, 40, 400),
                row(4, "through-one", "pa", 2, 1.0, 40, 500),
                row(4, "alternating", "pa", 3, 0.9, 40, 400)]
        r = routing_ratios.ratios(rows)
        self.assertEqual(list(r), [(4, "pa")])
        d = r[(4, "pa")]
        self.assertEqual(d["repeats"], [1, 2])
        self.assertEqual(d["hit"], [1.0, 0.9])
        self.assertEqual(d["p50"], [1.5, 1.0])
        self.assertEqual(d["p99"], [1.5, 0.8])
        self.assertEqual(d["rr_p50"], [200 / 30, 3.0])
        self.assertEqual(routing_ratios.median(d["p50"]), 1.25)
        self.assertEqual(routing_ratios.within(d["p99"], hi=1.15), 1)
        self.assertEqual(routing_ratios.within(d["hit"], lo=0.95), 1)

    # The table shows the median in bold with each repeat's ratio and how many met the bound;
    # a missing figure is a dash, not an error.
    def test_table(self):
        rows = [row(4, "alternating", "pa", 1, 0.8, 30, None),
                row(4, "through-one", "pa", 1, 0.8, 20, 200),
                row(4, "alternating", "pa", 2, 0.8, 20, 220),
                row(4, "through-one", "pa", 2, 0.8, 20, 200)]
        t = routing_ratios.table(rows)
        self.assertIn("| 4 | pa | 2 | **1.00x** (1.00x, 1.00x; 2 of 2 within) | "
                      "**1.25x** (1.50x, 1.00x; 1 of 2 within) | "
                      "**1.10x** (-, 1.10x; 1 of 2 within) | **-** (-, -) |", t)


@unittest.skipUnless(os.environ.get("PDGATE_BUILD_DIR"), "needs PDGATE_BUILD_DIR (built pdgate, pdgate-sim)")
class RoutingScript(unittest.TestCase):
    # bench/routing.sh over one engine with room for the whole trace, requests spaced so each
    # prompt is cached before the next: the engine's measured hit rate is the trace's
    # infinite-cache ceiling, no request fails, and the table is printed.
    def test_one_engine_reaches_the_ceiling(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.jsonl")
            rs = trace_gen.generate("mix", 4.0, 30.0, 5)[:40]
            with open(trace, "w") as f:
                for i, r in enumerate(rs):
                    r["timestamp"] = i * 150
                    f.write(json.dumps(r) + "\n")
            out = os.path.join(d, "out")
            p = subprocess.run(
                ["bash", os.path.join(ROOT, "bench", "routing.sh"), "--trace", trace, "--replicas", "1",
                 "--policies", "round_robin", "--engines", "1", "--kv-tokens", str(1 << 22),
                 "--prefill-us-per-token", "1", "--itl-ms", "1", "--max-tokens", "2",
                 "--build", os.environ["PDGATE_BUILD_DIR"], "--out", out],
                capture_output=True, text=True, timeout=240)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("| 1 | alternating | round_robin |", p.stdout)
            row = json.loads(open(os.path.join(out, "rows.jsonl")).readline())
            self.assertEqual(row["failures"], 0, row)
            self.assertEqual(row["requests"], 40)
            inf, _ = trace_ceilings.ceilings(rs, 1 << 22)
            self.assertGreater(inf, 0.3)
            self.assertAlmostEqual(row["hit_rate"], inf, places=3)

    # Two replicas give an alternating and a through-one row from one run (per repeat), each with the
    # gateways' metrics asked for: alternating splits the requests between the replicas,
    # through-one sends them all to the first; a metric no gateway has is null, not an error.
    def test_traffic_rows_and_gateway_metrics(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.jsonl")
            rs = trace_gen.generate("hot-prefix", 8.0, 30.0, 5)[:20]
            with open(trace, "w") as f:
                for i, r in enumerate(rs):
                    r["timestamp"] = i * 50
                    f.write(json.dumps(r) + "\n")
            out = os.path.join(d, "out")
            p = subprocess.run(
                ["bash", os.path.join(ROOT, "bench", "routing.sh"), "--trace", trace, "--replicas", "2",
                 "--policies", "prefix_affinity", "--engines", "1", "--kv-tokens", str(1 << 20),
                 "--prefill-us-per-token", "1", "--itl-ms", "1", "--max-tokens", "2",
                 "--collect-gateway-metrics", "pdgate_requests_total,pdgate_no_such_metric",
                 "--collect-gateway-metrics", 'pdgate_requests_total{status="200"}',
                 "--collect-gateway-metrics", 'pdgate_requests_total{status="503"}',
                 "--repeat", "2",
                 "--build", os.environ["PDGATE_BUILD_DIR"], "--out", out],
                capture_output=True, text=True, timeout=240)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("| 2 | alternating | prefix_affinity |", p.stdout)
            self.assertIn("| 2 | through-one | prefix_affinity |", p.stdout)
            with open(os.path.join(out, "rows.jsonl")) as f:
                rows = [json.loads(l) for l in f if l.strip()]
            # --repeat 2: the matrix twice, each row tagged, and the paired ratios after the table.
            self.assertEqual([(r["traffic"], r["repeat"]) for r in rows],
                             [("alternating", 1), ("through-one", 1), ("alternating", 2),
                              ("through-one", 2)])
            self.assertIn("| 2 | prefix_affinity | 2 | **", p.stdout)
            for r in rows:
                self.assertEqual(r["failures"], 0, r)
                self.assertEqual(r["requests"], 20)
                self.assertEqual(r["gateway_metrics"]["pdgate_no_such_metric"], [None, None])
            self.assertEqual(rows[0]["gateway_metrics"]["pdgate_requests_total"], [10, 10])
            first, idle = rows[1]["gateway_metrics"]["pdgate_requests_total"]
            self.assertEqual(first, 20)
            self.assertIn(idle, (None, 0))
            # A label selector sums only the label sets holding it: every request was a 200.
            self.assertEqual(rows[0]["gateway_metrics"]['pdgate_requests_total{status="200"}'], [10, 10])
            self.assertEqual(rows[0]["gateway_metrics"]['pdgate_requests_total{status="503"}'],
                             [None, None])
            # The one prefill engine served every request, and its counters are the row's.
            for r in rows:
                (engine,) = r["prefill_engines"]
                self.assertEqual(engine["requests"], 20, r)
                self.assertEqual(engine["hits"], r["hits"])
                self.assertEqual(engine["queries"], r["queries"])


if __name__ == "__main__":
    unittest.main()
