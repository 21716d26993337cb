#!/usr/bin/python3
"""A KV-event publisher speaking vLLM's wire format, written with Debian's
python3-zmq and python3-msgpack only (no project code), so pdgate's
ingestion is checked against an independent encoder.

It binds a ZMQ PUB socket and a ROUTER replay socket on 127.0.0.1, and an
HTTP control port a test drives:
  GET  /endpoints  -> {"pub": "tcp://...", "replay": "tcp://..."}
  POST /publish    {"events": [...], "layout": "array"|"map",
                    "hashes": "int"|"bytes", "drop": bool}
                   -> {"seq": N}; with "drop" the batch is kept for replay
                   but not published (a gap).
                   {"raw": "hex"} publishes those bytes as the payload.
  POST /replay     {"enabled": bool}: whether the replay socket answers.
  POST /restart    sequence numbers start again at 0 and the replay buffer
                   empties, as when the engine restarts.
  POST /hostile    {"interval_ms": N}: from now on a batch every N ms, each
                   numbered one less than the one before (as a hostile or
                   broken engine might), and the replay socket never answers.
Events are JSON objects as vLLM's would be in map form: {"type":
"BlockStored", "block_hashes": [int], "parent_block_hash": int|null,
"token_ids": [int], "block_size": int}, {"type": "BlockRemoved",
"block_hashes": [int]}, {"type": "AllBlocksCleared"}. With "hashes":
"bytes" each int hash is sent as 32 big-endian bytes, as newer vLLMs send
their hashes. The first line on stdout is "listening on http://H:P".
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import msgpack
import zmq

ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")

lock = threading.Lock()
pub_lock = threading.Lock()  # a ZMQ socket is used by one thread at a time
buffer = []  # (seq, payload), as vLLM's replay buffer keeps them
state = {"seq": 0, "replay": True}


def convert_hash(h, hashes):
    if h is None or hashes == "int":
        return h
    return int(h).to_bytes(32, "big", signed=True)


def encode(batch, layout, hashes):
    events = []
    for e in batch["events"]:
        kind = e["type"]
        bh = [convert_hash(h, hashes) for h in e.get("block_hashes", [])]
        if layout == "array":
            if kind == "BlockStored":
                events.append([kind, bh, convert_hash(e.get("parent_block_hash"), hashes),
                               e["token_ids"], e["block_size"], None, "GPU", None])
            elif kind == "BlockRemoved":
                events.append([kind, bh, "GPU"])
            else:
                events.append([kind])
        else:
            m = {"type": kind}
            if kind == "BlockStored":
                m.update(block_hashes=bh,
                         parent_block_hash=convert_hash(e.get("parent_block_hash"), hashes),
                         token_ids=e["token_ids"], block_size=e["block_size"], lora_id=None,
                         medium="GPU")
            elif kind == "BlockRemoved":
                m.update(block_hashes=bh, medium="GPU")
            events.append(m)
    ts = time.time()
    if layout == "array":
        return msgpack.packb([ts, events, 0], use_bin_type=True)
    return msgpack.packb({"ts": ts, "events": events, "data_parallel_rank": 0},
                         use_bin_type=True)


def publish_backwards(interval):
    seq = 1 << 40
    payload = encode({"events": []}, "array", "int")
    while True:
        with pub_lock:
            pub.send_multipart([b"kv@test", seq.to_bytes(8, "big"), payload])
        seq -= 1
        time.sleep(interval)


def serve_replay():
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while True:
        if not poller.poll(100):
            continue
        frames = router.recv_multipart()
        ident, start = frames[0], int.from_bytes(frames[-1], "big")
        with lock:
            if not state["replay"]:
                continue
            todo = [(s, p) for s, p in buffer if s >= start]
        for s, p in todo:
            router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
        router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply({"pub": f"tcp://127.0.0.1:{pub_port}",
                    "replay": f"tcp://127.0.0.1:{replay_port}"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/restart":
            with lock:
                state["seq"] = 0
                buffer.clear()
            self.reply({"seq": 0})
            return
        if self.path == "/hostile":
            with lock:
                state["replay"] = False
            threading.Thread(target=publish_backwards, args=(req["interval_ms"] / 1000.0,),
                             daemon=True).start()
            self.reply({"hostile": True})
            return
        if self.path == "/replay":
            with lock:
                state["replay"] = bool(req["enabled"])
            self.reply({"replay": state["replay"]})
            return
        if "raw" in req:
            payload = bytes.fromhex(req["raw"])
        else:
            payload = encode(req, req.get("layout", "array"), req.get("hashes", "int"))
        with lock:
            seq = state["seq"]
            state["seq"] += 1
            buffer.append((seq, payload))
        if not req.get("drop", False):
            with pub_lock:
                pub.send_multipart([b"kv@test", seq.to_bytes(8, "big"), payload])
        self.reply({"seq": seq})


server = HTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=serve_replay, daemon=True).start()
print(f"kv event publisher listening on http://127.0.0.1:{server.server_port}", flush=True)
server.serve_forever()
