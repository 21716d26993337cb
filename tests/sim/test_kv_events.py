"""pdgate-sim's KV cache events, checked independently of pdgate's own code:
a subscriber written with Debian's python3-zmq and python3-msgpack decodes
what the sim publishes, as it would decode vLLM's ZmqEventPublisher: three
frames [topic, seq (8 bytes big-endian), msgpack(KVEventBatch)], batches
[ts, events, data_parallel_rank] (or maps, --kv-events-format map), events
tagged BlockStored / BlockRemoved / AllBlocksCleared, and a ROUTER socket
that replays from a sequence number.

Run with /usr/bin/python3 (Debian's modules); PDGATE_BUILD_DIR names the
build whose pdgate-sim is tested."""
import json
import os
import struct
import subprocess
import time
import unittest
import urllib.error
import urllib.request

import msgpack
import zmq

BUILD = os.environ.get("PDGATE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
SIM = os.path.join(BUILD, "pdgate-sim")
# Every wait is bounded; generous, because the suite also runs under ASan.
WAIT_S = 20.0
BLOCK = 4  # tokens per block in these tests: 16 bytes of prefix text
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def token_ids(text: bytes):
    """The sim's rule, written again here: token i is the little-endian
    uint32 of bytes [4i, 4i+4), the last one zero-padded."""
    padded = text + b"\0" * (-len(text) % 4)
    return [v for (v,) in struct.iter_unpack("<I", padded)]


def text_of(prompt: str) -> bytes:
    return prompt.encode()


def blocks(*letters):
    """A prompt of whole blocks, one letter repeated per block."""
    return "".join(c * (4 * BLOCK) for c in letters)


class Sim:
    """A pdgate-sim with KV events on ephemeral ports, and a subscriber."""

    def __init__(self, role="both", extra=(), replay=False, topic="kv-test", config=None,
                 sub=None, fmt="array"):
        """`sub`: a SUB socket that already bound the endpoint (the sim
        connects to it); by default the test's SUB connects to the sim.
        `fmt`: --kv-events-format; most tests read older vLLMs' positional
        events, test_current_vllm_layout current vLLM's."""
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": "tcp://127.0.0.1:*", "topic": topic}
        if replay:
            cfg["replay_endpoint"] = "tcp://127.0.0.1:*"
        if config:
            cfg.update(config)
        self.topic = topic.encode()
        self.proc = subprocess.Popen(
            [SIM, "--role", role, "--block-size", str(BLOCK), "--prefill-base-ms", "0",
             "--prefill-us-per-token", "0", "--itl-ms", "0", "--kv-events-config", json.dumps(cfg),
             "--kv-events-format", fmt, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.endpoint = self.replay_endpoint = None
        self.port = None
        deadline = time.monotonic() + WAIT_S
        # stdout carries one line; the event sockets are in /sim/stats (and
        # on stderr).
        while self.port is None and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if "listening on http://" in line:
                self.port = int(line.strip().rsplit(":", 1)[1])
            else:
                self.close()
                raise RuntimeError("pdgate-sim wrote more than its listening line: " + line)
        if self.port is None:
            self.close()
            raise RuntimeError("pdgate-sim did not start")
        ev = self.stats().get("kv_events") or {}
        self.endpoint = ev.get("endpoint")
        self.replay_endpoint = ev.get("replay_endpoint") or None
        if self.endpoint is None:
            self.close()
            raise RuntimeError("pdgate-sim has no kv events socket")
        self.ctx = zmq.Context()
        if sub is None:
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.connect(self.endpoint)
        self.sub = sub
        self.baseline = self.sync()

    def sync(self):
        """A SUB socket misses what is published before its subscription
        reaches the publisher: reset the cache until an AllBlocksCleared
        arrives, and return its seq (every later event follows it)."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            self.post("/reset_prefix_cache", {})
            if self.sub.poll(200):
                seq = None
                while self.sub.poll(100):  # drain earlier resets too
                    _, seq_b, _ = self.sub.recv_multipart()
                    seq = int.from_bytes(seq_b, "big")
                return seq
        raise RuntimeError("no event reached the subscriber")

    def post(self, path, body, raw=None, headers=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def complete(self, prompt, **extra):
        status, body = self.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, **extra})
        assert status == 200, body
        return json.loads(body)

    def recv(self):
        """The next message: (topic, seq, decoded batch, raw payload)."""
        if not self.sub.poll(int(WAIT_S * 1000)):
            raise AssertionError("no KV event within %.0f s" % WAIT_S)
        frames = self.sub.recv_multipart()
        assert len(frames) == 3, frames
        topic, seq, payload = frames
        assert len(seq) == 8
        return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload), payload

    def no_more(self, ms=300):
        return not self.sub.poll(ms)

    def stats(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/sim/stats", timeout=WAIT_S) as r:
            return json.loads(r.read())

    def close(self):
        if getattr(self, "ctx", None) is not None:
            self.ctx.destroy(linger=0)
            self.ctx = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def events_of(batch):
    """Events of a decoded batch as (type, fields) in vLLM's positional order,
    whatever the layout."""
    if isinstance(batch, dict):
        out = []
        for e in batch["events"]:
            t = e["type"]
            if t == "BlockStored":
                out.append((t, [e["block_hashes"], e["parent_block_hash"], e["token_ids"],
                                e["block_size"], e["lora_id"], e["medium"], e["lora_name"]]))
            elif t == "BlockRemoved":
                out.append((t, [e["block_hashes"], e["medium"]]))
            else:
                out.append((t, []))
        return out
    return [(e[0], list(e[1:])) for e in batch[1]]


class KvEventsTest(unittest.TestCase):
    def start(self, **kw):
        sim = Sim(**kw)
        self.addCleanup(sim.close)
        return sim

    def assert_batch_shape(self, batch):
        self.assertIsInstance(batch, list)
        self.assertEqual(len(batch), 3)
        self.assertIsInstance(batch[0], float)
        self.assertLess(abs(batch[0] - time.time()), 60)
        self.assertEqual(batch[2], 0)

    # A prefill stores its full blocks in one chained BlockStored (parent nil, the blocks'
    # token ids, block_size in tokens); a later prompt sharing two blocks stores only its new
    # block, parented on the shared one; sequence numbers follow each other.
    def test_prefill_stores_chained_blocks(self):
        sim = self.start(role="prefill")
        a = blocks("a", "b", "c") + "tail"
        sim.complete(a, kv_transfer_params={"do_remote_decode": True})
        topic, seq1, batch, _ = sim.recv()
        self.assertEqual(topic, b"kv-test")
        self.assertEqual(seq1, sim.baseline + 1)
        self.assert_batch_shape(batch)
        self.assertEqual(len(batch[1]), 1)
        ev = batch[1][0]
        self.assertEqual(len(ev), 8)
        name, hashes, parent, toks, bs, lora_id, medium, lora_name = ev
        self.assertEqual(name, "BlockStored")
        self.assertEqual(len(hashes), 3)
        self.assertTrue(all(isinstance(h, int) for h in hashes))
        self.assertEqual(len(set(hashes)), 3)
        self.assertIsNone(parent)
        self.assertEqual(toks, token_ids(text_of(blocks("a", "b", "c"))))
        self.assertEqual(bs, BLOCK)
        self.assertIsNone(lora_id)
        self.assertEqual(medium, "GPU")
        self.assertIsNone(lora_name)

        sim.complete(blocks("a", "b", "x", "y"))
        _, seq2, batch2, _ = sim.recv()
        self.assertEqual(seq2, seq1 + 1)
        [ev2] = batch2[1]
        self.assertEqual(ev2[0], "BlockStored")
        self.assertEqual(len(ev2[1]), 2)
        self.assertEqual(ev2[2], hashes[1])
        self.assertEqual(ev2[3], token_ids(text_of(blocks("x", "y"))))
        # A prompt fully cached already stores nothing.
        sim.complete(blocks("a", "b"))
        self.assertTrue(sim.no_more())

    # Evicting to make room sends BlockRemoved (before the BlockStored of the same batch),
    # and a subscriber replaying every event holds exactly as many blocks as the sim.
    def test_eviction_sends_block_removed(self):
        sim = self.start(extra=["--kv-blocks", "4"])
        held = set()
        sent = [blocks("a", "b", "c"), blocks("p", "q", "r"), blocks("a", "b", "z")]
        removed_any = False
        for prompt in sent:
            sim.complete(prompt)
            _, _, batch, _ = sim.recv()
            kinds = [e[0] for e in batch[1]]
            self.assertEqual(kinds[-1], "BlockStored")
            for name, fields in events_of(batch):
                if name == "BlockStored":
                    self.assertFalse(held & set(fields[0]), "stored twice")
                    held |= set(fields[0])
                elif name == "BlockRemoved":
                    removed_any = True
                    self.assertEqual(kinds.index("BlockRemoved"), 0)
                    self.assertTrue(set(fields[0]) <= held, "removed an unknown block")
                    self.assertEqual(fields[1], "GPU")
                    held -= set(fields[0])
        self.assertTrue(removed_any)
        self.assertEqual(len(held), sim.stats()["prefix_cache_blocks"])
        self.assertEqual(len(held), 4)

    # POST /reset_prefix_cache sends AllBlocksCleared; the same prompt is then stored again
    # from its first block.
    def test_reset_sends_all_blocks_cleared(self):
        sim = self.start()
        sim.complete(blocks("a", "b"))
        _, _, first, _ = sim.recv()
        status, _ = sim.post("/reset_prefix_cache", {})
        self.assertEqual(status, 200)
        _, _, cleared, _ = sim.recv()
        self.assertEqual(cleared[1], [["AllBlocksCleared"]])
        sim.complete(blocks("a", "b"))
        _, _, again, _ = sim.recv()
        self.assertEqual(again[1], first[1])

    # --kv-events-hash bytes: hashes and parents are 32-byte values, chained as with ints.
    def test_byte_hashes(self):
        sim = self.start(extra=["--kv-events-hash", "bytes"])
        sim.complete(blocks("a", "b"))
        _, _, b1, _ = sim.recv()
        hashes = b1[1][0][1]
        self.assertEqual([type(h) for h in hashes], [bytes, bytes])
        self.assertTrue(all(len(h) == 32 for h in hashes))
        sim.complete(blocks("a", "b", "c"))
        _, _, b2, _ = sim.recv()
        self.assertEqual(b2[1][0][2], hashes[1])
        self.assertEqual(len(b2[1][0][1][0]), 32)

    # The default layout is current vLLM's: a positional batch of events as maps, each
    # carrying its KV-cache group and kind (--kv-cache-groups: one event per group), the
    # adapter that computed it (--lora-modules: lora_name, lora_id and extra_keys naming it),
    # and kv_cache_spec_sliding_window for sliding-window groups only. An adapter's blocks
    # hash apart from the base model's for the same prompt.
    def test_current_vllm_layout(self):
        sim = self.start(fmt="vllm", extra=["--kv-cache-groups", "full_attention,sliding_window",
                                            "--lora-modules", "ad1=/adapters/ad1"])
        sim.complete(blocks("a", "b"), model="ad1")
        _, _, batch, _ = sim.recv()
        self.assert_batch_shape(batch)
        full, window = batch[1]
        for ev, idx, kind in ((full, 0, "full_attention"), (window, 1, "sliding_window")):
            self.assertEqual(ev["type"], "BlockStored")
            self.assertEqual(ev["group_idx"], idx)
            self.assertEqual(ev["kv_cache_spec_kind"], kind)
            self.assertEqual(ev["lora_name"], "ad1")
            self.assertEqual(ev["lora_id"], 1)
            self.assertEqual(ev["medium"], "GPU")
            self.assertEqual(ev["extra_keys"], [["ad1"], ["ad1"]])
            self.assertEqual(ev["token_ids"], token_ids(text_of(blocks("a", "b"))))
        self.assertEqual(full["block_hashes"], window["block_hashes"])
        self.assertNotIn("kv_cache_spec_sliding_window", full)
        self.assertEqual(window["kv_cache_spec_sliding_window"], 4 * BLOCK)
        sim.complete(blocks("a", "b"))
        _, _, base, _ = sim.recv()
        ev = base[1][0]
        self.assertIsNone(ev["lora_name"])
        self.assertIsNone(ev["lora_id"])
        self.assertEqual(ev["extra_keys"], [None, None])
        self.assertFalse(set(ev["block_hashes"]) & set(full["block_hashes"]))
        status, _ = sim.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "model": "ad2"})
        self.assertEqual(status, 404)

    # --kv-events-format map: the batch and its events are maps keyed by field name, with
    # the same content as the positional layout.
    def test_map_layout(self):
        sim = self.start(extra=["--kv-events-format", "map"])
        sim.complete(blocks("a", "b", "c"))
        _, _, batch, _ = sim.recv()
        self.assertEqual(set(batch), {"ts", "events", "data_parallel_rank"})
        self.assertIsInstance(batch["ts"], float)
        [ev] = batch["events"]
        self.assertEqual(ev["type"], "BlockStored")
        self.assertEqual(len(ev["block_hashes"]), 3)
        self.assertIsNone(ev["parent_block_hash"])
        self.assertEqual(ev["token_ids"], token_ids(text_of(blocks("a", "b", "c"))))
        self.assertEqual(ev["block_size"], BLOCK)
        sim.post("/reset_prefix_cache", {})
        _, _, cleared, _ = sim.recv()
        self.assertEqual(cleared["events"], [{"type": "AllBlocksCleared"}])

    # The replay socket resends every buffered batch from the requested seq, byte for byte,
    # then the end marker (seq -1, empty payload); a DEALER client receives them all.
    def test_replay_from_a_sequence_number(self):
        sim = self.start(replay=True)
        self.assertIsNotNone(sim.replay_endpoint)
        live = []
        for c in "abc":
            sim.complete(blocks(c, c))
            _, seq, _, payload = sim.recv()
            live.append((seq, payload))
        dealer = sim.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(sim.replay_endpoint)
        start = live[1][0]
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            self.assertTrue(dealer.poll(int(WAIT_S * 1000)), "replay did not end")
            empty, seq, payload = dealer.recv_multipart()
            self.assertEqual(empty, b"")
            if seq == END_SEQ:
                self.assertEqual(payload, b"")
                break
            got.append((int.from_bytes(seq, "big"), payload))
        self.assertEqual(got, live[1:])
        self.assertEqual(sim.stats()["kv_events"]["replays"], 1)

        # vLLM's example client uses REQ: it receives the first reply only.
        req = sim.ctx.socket(zmq.REQ)
        self.addCleanup(req.close, 0)
        req.connect(sim.replay_endpoint)
        req.send(start.to_bytes(8, "big"))
        self.assertTrue(req.poll(int(WAIT_S * 1000)))
        seq, payload = req.recv_multipart()
        self.assertEqual((int.from_bytes(seq, "big"), payload), live[1])

    # The replay buffer keeps the last buffer_steps batches: a replay from an older seq
    # starts at the oldest kept one, so the consumer sees what it cannot recover.
    def test_replay_buffer_is_bounded(self):
        sim = self.start(replay=True, config={"buffer_steps": 2})
        seqs = []
        for c in "abcd":
            sim.complete(blocks(c))
            seqs.append(sim.recv()[1])
        dealer = sim.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(sim.replay_endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        got = []
        while True:
            self.assertTrue(dealer.poll(int(WAIT_S * 1000)), "replay did not end")
            _, seq, _ = dealer.recv_multipart()
            if seq == END_SEQ:
                break
            got.append(int.from_bytes(seq, "big"))
        self.assertEqual(got, seqs[-2:])

    # A decode that pulled a prefill's KV stores the same blocks (same hashes, same token ids)
    # as the prefill did, and a decode serving a request in one hop stores what it prefilled.
    def test_decode_stores_pulled_and_one_hop_blocks(self):
        prefill = self.start(role="prefill")
        decode = self.start(role="decode")
        prompt = blocks("a", "b", "c") + "xy"
        answer = prefill.complete(prompt, kv_transfer_params={"do_remote_decode": True})
        _, _, pb, _ = prefill.recv()
        kv = answer["kv_transfer_params"]
        self.assertTrue(kv["remote_block_ids"])
        decode.complete(prompt, kv_transfer_params=kv)
        _, _, db, _ = decode.recv()
        self.assertEqual(db[1], pb[1])
        decode.complete(blocks("o", "n", "e"))
        _, _, one_hop, _ = decode.recv()
        self.assertEqual(one_hop[1][0][3], token_ids(text_of(blocks("o", "n", "e"))))

    # POST /tokenize gives the ids the events carry, for prompts and chat messages, and
    # answers vLLM's JSON errors for bad requests.
    # --data-parallel-size 2: each engine core publishes on its own socket with its rank in
    # every batch and its own engine id; a request pinned to rank 1 by X-data-parallel-rank
    # stores its blocks on rank 1 only; a rank the server does not have is a 400.
    def test_data_parallel_ranks_publish_apart(self):
        sim = self.start(role="prefill", extra=("--data-parallel-size", "2"))
        ranks = sim.stats()["data_parallel_ranks"]
        self.assertEqual([r["rank"] for r in ranks], [0, 1])
        self.assertTrue(ranks[0]["engine_id"].endswith("_dp0"), ranks)
        self.assertEqual(ranks[1]["engine_id"], ranks[0]["engine_id"][:-1] + "1")
        self.assertEqual(ranks[0]["kv_events"]["endpoint"], sim.endpoint)
        self.assertNotEqual(ranks[1]["kv_events"]["endpoint"], sim.endpoint)
        sub1 = sim.ctx.socket(zmq.SUB)
        self.addCleanup(sub1.close, 0)
        sub1.setsockopt(zmq.SUBSCRIBE, sim.topic)
        sub1.connect(ranks[1]["kv_events"]["endpoint"])
        deadline = time.monotonic() + WAIT_S
        synced = False
        while not synced and time.monotonic() < deadline:
            sim.post("/reset_prefix_cache", {})
            synced = sub1.poll(200)
        self.assertTrue(synced, "rank 1 published nothing")
        while sub1.poll(100):
            sub1.recv_multipart()
        while sim.sub.poll(100):
            sim.sub.recv_multipart()

        status, body = sim.post("/v1/completions", {"prompt": blocks("r", "s") + "x",
                                                    "max_tokens": 1},
                                headers={"X-data-parallel-rank": "1"})
        self.assertEqual(status, 200, body)
        self.assertTrue(sub1.poll(int(WAIT_S * 1000)), "no event from rank 1")
        _, _, payload = sub1.recv_multipart()
        batch = msgpack.unpackb(payload)
        self.assertEqual(batch[2], 1)
        self.assertEqual([t for t, _ in events_of(batch)], ["BlockStored"])
        self.assertTrue(sim.no_more(), "rank 0 published a block it does not hold")
        self.assertEqual([r["prefix_cache_blocks"] for r in sim.stats()["data_parallel_ranks"]],
                         [0, 2])

        status, body = sim.post("/v1/completions", {"prompt": "x", "max_tokens": 1},
                                headers={"X-data-parallel-rank": "2"})
        self.assertEqual(status, 400)
        self.assertIn("out of range [0, 2)", json.loads(body)["error"]["message"])

    def test_tokenize(self):
        sim = self.start()
        prompt = blocks("a", "b") + "tail!"
        status, body = sim.post("/tokenize", {"model": "sim-model", "prompt": prompt})
        self.assertEqual(status, 200)
        out = json.loads(body)
        self.assertEqual(out["tokens"], token_ids(text_of(prompt)))
        self.assertEqual(out["count"], len(out["tokens"]))
        self.assertEqual(out["max_model_len"], 32768)
        sim.complete(prompt)
        _, _, batch, _ = sim.recv()
        self.assertEqual(batch[1][0][3], out["tokens"][:2 * BLOCK])

        status, body = sim.post("/tokenize", {"messages": [{"role": "user", "content": "héllo"}]})
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["tokens"], token_ids("userhéllo".encode()))

        for raw, code in ((b"{", 400), (b"[]", 400), (b'{"model": "sim-model"}', 400),
                          (b'{"prompt": 5}', 400), (b'{"model": "other", "prompt": "x"}', 404)):
            status, body = sim.post("/tokenize", None, raw=raw)
            self.assertEqual(status, code, raw)
            self.assertEqual(json.loads(body)["error"]["code"], code, raw)

    # An endpoint without a wildcard is connected, as vLLM does: the sim's PUB socket reaches
    # a subscriber that bound the address, and its events arrive there.
    def test_concrete_endpoint_connects_to_a_binding_subscriber(self):
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.bind("tcp://127.0.0.1:*")
        endpoint = sub.getsockopt(zmq.LAST_ENDPOINT).decode()
        sim = self.start(config={"endpoint": endpoint}, sub=sub)
        self.assertEqual(sim.endpoint, endpoint)
        sim.complete(blocks("a"))
        _, _, batch, _ = sim.recv()
        self.assertEqual(batch[1][0][0], "BlockStored")

    # A malformed --kv-events-config stops the sim at startup with a message naming it.
    def test_bad_config_is_refused(self):
        p = subprocess.run([SIM, "--role", "both", "--kv-events-config", '{"endpont": "tcp://*:1"}'],
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--kv-events-config", p.stderr)
        self.assertIn("endpont", p.stderr)
        p = subprocess.run([SIM, "--role", "both", "--kv-events-config",
                            # TEST-NET-1: no local interface has it, so the bind fails.
                            '{"enable_kv_cache_events": true, "endpoint": "tcp://192.0.2.1:*"}'],
                           capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual(p.returncode, 2)
        self.assertIn("cannot open the KV event socket tcp://192.0.2.1:*", p.stderr)


if __name__ == "__main__":
    unittest.main()
