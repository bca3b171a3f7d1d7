"""test_serve_kv_events.py - `kipp-serve --kv-events`: the KV
pool's block events in vLLM's KV-events format, as a router's subscriber sees
them (ZeroMQ SUB, msgpack).

The oracles are independent of the server's code:
  - the prompts are token ids the test chose, so a stored block's token ids
    must be exactly the prompt's 32-id slices;
  - a block's hash must be XXH3-64 of its ids (uint32 little-endian) seeded
    with its parent's hash (python-xxhash, its own copy of the algorithm);
  - an index built only from the events (what llm-d's indexer keeps) must
    predict each request's usage.prompt_tokens_details.cached_tokens, and
    its size and removals must agree with the pool's /metrics;
  - the frames and payload follow vLLM's ZmqEventPublisher and the
    msgspec array_like structs of vllm/distributed/kv_events.py.
"""
from __future__ import annotations

import re
import socket
import subprocess
import time

import msgpack
import msgspec
import xxhash
import zmq

from serve_harness import SERVE, Server

FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"),
          "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}  # vLLM's field order
ROOT_HASH = 0x4B495050  # chain seed of a prompt's first block (engine/kv_pool.h)
BLOCK = 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chain(ids: list[int]) -> list[int]:
    """The chain hashes of the full blocks of ids (the independent oracle)."""
    out, h = [], ROOT_HASH
    for b in range(len(ids) // BLOCK):
        blk = ids[b * BLOCK:(b + 1) * BLOCK]
        h = xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in blk), seed=h)
        out.append(h)
    return out


class Subscriber:
    """A SUB socket that decodes every message into (seq, batch) and keeps an
    index {hash: (parent, token ids)} as a prefix-aware router would."""

    def __init__(self, endpoint: str, bind: bool):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        (self.sock.bind if bind else self.sock.connect)(endpoint)
        self.seqs: list[int] = []
        self.events: list[list] = []
        self.index: dict[int, tuple[int | None, list[int]]] = {}
        self.payloads: list[bytes] = []
        self.removed = 0
        self.cleared = 0

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()

    def settle(self, seconds: float = 1.0) -> None:
        """Let a new connection come up. The SUB socket must be called into to
        send its subscription to a peer that just connected; until the
        publisher has it, the publisher drops what it sends."""
        end = time.time() + seconds
        while time.time() < end:
            assert not self.sock.poll(50), "no event is published before the first request"

    def pump(self, quiet: float = 0.3, limit: float = 10.0) -> None:
        """Receive until no message has come for `quiet` seconds."""
        end = time.time() + limit
        while time.time() < end and self.sock.poll(int(quiet * 1000)):
            frames = self.sock.recv_multipart()
            assert len(frames) == 3, f"expected topic, seq, payload frames, got {len(frames)}"
            topic, seq, payload = frames
            assert topic == b"" and len(seq) == 8
            self.seqs.append(int.from_bytes(seq, "big"))
            self.payloads.append(payload)
            self._apply(msgpack.unpackb(payload, raw=False))

    def _apply(self, batch) -> None:
        # KVEventBatch, array_like: [ts, events, data_parallel_rank]
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 60 and rank == 0
        assert events, "a batch is sent only when there are events"
        for ev in events:
            if isinstance(ev, dict):  # --kv-events-format map: the same fields by name
                order = FIELDS.get(ev.get("type"))
                assert order is not None and set(ev) == {"type", *order}, ev
                ev = [ev["type"], *(ev[k] for k in order)]
            self.events.append(ev)
            tag = ev[0]
            if tag == "BlockStored":
                # [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]
                assert len(ev) == 8, ev
                hashes, parent, ids, size, lora_id, medium, lora_name = ev[1:]
                assert size == BLOCK and lora_id is None and lora_name is None and medium == "CPU"
                assert len(ids) == size * len(hashes) and hashes
                assert parent is None or parent in self.index, "a stored block's parent must be indexed"
                for k, h in enumerate(hashes):
                    blk = ids[k * size:(k + 1) * size]
                    want = xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in blk),
                                                    seed=ROOT_HASH if parent is None else parent)
                    assert h == want, f"block hash {h:#x} is not the chain hash {want:#x} of its ids"
                    assert h not in self.index, "a block is stored twice without a removal"
                    self.index[h] = (parent, blk)
                    parent = h
            elif tag == "BlockRemoved":
                assert len(ev) == 3 and ev[2] == "CPU", ev
                for h in ev[1]:
                    assert h in self.index, "removed a block that was never stored"
                    assert all(p != h for p, _ in self.index.values()), \
                        "a block was removed while a stored child names it as parent"
                    del self.index[h]
                    self.removed += 1
            elif tag == "AllBlocksCleared":
                assert len(ev) == 1
                self.index.clear()
                self.cleared += 1
            else:
                raise AssertionError(f"unknown event {ev!r}")

    def predicted_cached(self, ids: list[int]) -> int:
        """Cached tokens a request for ids gets, from the index alone: the longest
        indexed chain of its full blocks, leaving its last token to evaluate."""
        n = 0
        for h in _chain(ids[:len(ids) - 1]):
            if h not in self.index:
                break
            n += 1
        return n * BLOCK


def _prompt(seed: int, n: int, shared: list[int] | None = None) -> list[int]:
    """n token ids: `shared` first, then ids from a small LCG (ordinary vocabulary)."""
    out = list(shared or [])
    x = seed * 7919 + 13
    while len(out) < n:
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(1000 + x % 50000)
    return out


def _published(s: Server) -> float:
    m = re.search(r'^kipp_kv_pool_blocks\{state="published"\} (\S+)$', s.metrics(), re.M)
    assert m, "the pooled server exports kipp_kv_pool_blocks"
    return float(m.group(1))


def _complete(s: Server, ids: list[int], max_tokens: int = 4) -> dict:
    st, body = s.post("/v1/completions", {"prompt": ids, "max_tokens": max_tokens, "temperature": 0})
    assert st == 200, body
    return body


def test_kv_events_bad_endpoint_is_refused(synthetic_gguf):
    model = str(synthetic_gguf("synthetic-tiny"))
    for ep, why in (("http://127.0.0.1:5557", "does not start with tcp://"), ("tcp://*:0", "1..65535"),
                    ("tcp://*:port", "1..65535"), ("tcp://localhost", "no HOST:PORT")):
        r = subprocess.run([str(SERVE), "--model", model, "--kv-events", ep], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and f"--kv-events '{ep}' is invalid" in r.stderr and why in r.stderr, r.stderr
    r = subprocess.run([str(SERVE), "--model", model, "--kv-events", "tcp://*:5557", "--kv-events-format", "json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--kv-events-format 'json' is invalid, expected array or map" in r.stderr, r.stderr
    r = subprocess.run([str(SERVE), "--model", model, "--kv-events", "tcp://*:5557", "--kv-pool-mib", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--kv-pool-mib 0" in r.stderr, r.stderr


def test_kv_events_endpoint_in_use_is_named(synthetic_gguf):
    port = _free_port()
    with socket.socket() as held:
        held.bind(("0.0.0.0", port))
        held.listen()
        r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf("synthetic-tiny")), "--port", "0",
                            "--kv-events", f"tcp://*:{port}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"--kv-events 'tcp://*:{port}': cannot bind the ZeroMQ PUB socket" in r.stderr, r.stderr


def test_kv_events_stored_match_prompts_and_predict_reuse(synthetic_gguf):
    """Bind mode (tcp://*:PORT, the subscriber connects): stored events carry the
    prompts' blocks, chain through their parents, and predict cached_tokens."""
    port = _free_port()
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-pool-mib", "16",
                "--kv-events", f"tcp://*:{port}") as s:
        sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=False)
        try:
            sub.settle()
            a = _prompt(1, 100)                 # 3 full blocks (99 tokens evaluated + 4 generated < 128)
            b = _prompt(2, 110, shared=a[:70])  # shares a's first 2 blocks
            ra = _complete(s, a)
            sub.pump()
            assert sub.seqs and sub.seqs[0] == 0, f"the first batch must be seq 0, got {sub.seqs[:3]}"
            assert ra["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            ha = _chain(a)
            assert set(ha) <= set(sub.index), "every full block of a's prompt is stored"
            for k, h in enumerate(ha):
                parent, ids = sub.index[h]
                assert ids == a[k * BLOCK:(k + 1) * BLOCK]
                assert parent == (ha[k - 1] if k else None)
            assert sub.predicted_cached(b) == 64
            rb = _complete(s, b)
            assert rb["usage"]["prompt_tokens_details"]["cached_tokens"] == 64
            sub.pump()
            hb = _chain(b)
            assert hb[:2] == ha[:2] and set(hb) <= set(sub.index)
            stored_b = [ev for ev in sub.events if ev[0] == "BlockStored" and ev[1][0] == hb[2]]
            assert len(stored_b) == 1 and stored_b[0][2] == hb[1], "b's own blocks hang off the shared prefix"
            # the same prompt again: the index predicts the whole prefix, and nothing new is stored
            n_events = len(sub.events)
            assert _complete(s, a)["usage"]["prompt_tokens_details"]["cached_tokens"] == sub.predicted_cached(a) == 96
            sub.pump()
            assert len(sub.events) == n_events
            assert sub.seqs == list(range(len(sub.seqs))), f"sequence numbers have a gap: {sub.seqs}"
            assert s.wait_idle()
            published = _published(s)
            assert len(sub.index) == published, (len(sub.index), published)
        finally:
            sub.close()


# KVEventBatch as vLLM declares it with msgspec (vllm/distributed/kv_events.py):
# array_like structs, events tagged by class name. The "v0" types are the first
# release's shape (no medium, no data_parallel_rank), the "v1" types the later one.
class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _StoredV0(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _RemovedV0(_Event, tag="BlockRemoved"):
    block_hashes: list[int]


class _StoredV1(_StoredV0, tag="BlockStored"):
    medium: str | None


class _RemovedV1(_RemovedV0, tag="BlockRemoved"):
    medium: str | None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


# The later shape, which vllm-router's kv_aware index decodes: the same batch,
# the events as maps tagged by "type" (--kv-events-format map).
class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _StoredMap(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    group_idx: int | None = None


class _RemovedMap(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class _ClearedMap(_MapEvent, tag="AllBlocksCleared"):
    pass


class _BatchMap(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_StoredMap | _RemovedMap | _ClearedMap]
    data_parallel_rank: int | None = None


class _BatchV0(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_StoredV0 | _RemovedV0 | _Cleared]


class _BatchV1(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_StoredV1 | _RemovedV1 | _Cleared]
    data_parallel_rank: int | None = None


def _run_small_pool(synthetic_gguf, *extra: str) -> Subscriber:
    """Five 3-block prompts into a 12-block pool (stores, then evictions), then
    exit (all cleared); the subscriber with everything it received."""
    port = _free_port()
    sub = None
    try:
        with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "256", "--kv-pool-mib", "3",
                    "--kv-events", f"tcp://*:{port}", *extra) as s:
            sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=False)
            sub.settle()
            for k in range(5):  # 3 blocks each into a 12-block pool: stores, then evictions
                _complete(s, _prompt(20 + k, 100))
                sub.pump()
        sub.pump(quiet=1.5)
    finally:
        if sub:
            sub.close()
    return sub


def test_kv_events_decode_with_vllms_msgspec_types(synthetic_gguf):
    """Every payload decodes with the msgspec types vLLM's own subscriber uses,
    in both array shapes vLLM has shipped, to the same events msgpack saw."""
    sub = _run_small_pool(synthetic_gguf)
    kinds = {ev[0] for ev in sub.events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}, kinds
    tags = {_StoredV0: "BlockStored", _StoredV1: "BlockStored", _RemovedV0: "BlockRemoved", _RemovedV1: "BlockRemoved",
            _Cleared: "AllBlocksCleared"}
    for medium, typ in ((True, _BatchV1), (False, _BatchV0)):
        n = 0
        for raw in sub.payloads:
            batch = msgspec.msgpack.decode(raw, type=typ)
            assert not medium or batch.data_parallel_rank == 0
            for ev in batch.events:
                assert tags[type(ev)] == sub.events[n][0]
                if tags[type(ev)] == "BlockStored":
                    assert ev.block_hashes == sub.events[n][1] and ev.token_ids == sub.events[n][3] and ev.block_size == 32
                    assert not medium or ev.medium == "CPU"
                n += 1
        assert n == len(sub.events)


def test_kv_events_removed_on_eviction_and_cleared_at_exit(synthetic_gguf):
    """Connect mode (the subscriber binds, as llm-d's indexer does): a small pool
    evicts, every removal is a stored leaf, the index tracks the pool's published
    count and eviction counter, and the replica's exit clears everything."""
    port = _free_port()
    sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=True)
    try:
        with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "256", "--kv-pool-mib", "3",
                    "--kv-events", f"tcp://127.0.0.1:{port}") as s:
            sub.settle()
            prompts = [_prompt(10 + k, 100) for k in range(6)]  # 3 blocks each into a 12-block pool
            for p in prompts:
                assert _complete(s, p)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
                sub.pump()
                assert len(sub.index) <= 12
            assert s.wait_idle()
            sub.pump()
            evictions = s.gauge("kipp_kv_pool_evictions_total")
            assert evictions > 0 and sub.removed == evictions, (sub.removed, evictions)
            assert len(sub.index) == _published(s)
            # the earliest prompt was evicted (least recently used): the index says how much is left
            want = sub.predicted_cached(prompts[0])
            got = _complete(s, prompts[0])["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert got == want, (got, want)
            sub.pump()
        sub.pump(quiet=1.5)
        assert sub.cleared == 1 and sub.events[-1] == ["AllBlocksCleared"] and not sub.index
        assert sub.seqs == list(range(len(sub.seqs))), f"sequence numbers have a gap: {sub.seqs}"
    finally:
        sub.close()


def test_kv_events_map_format_decodes_as_tagged_maps(synthetic_gguf):
    """--kv-events-format map: the same events, each a map tagged by "type", in
    the same array batch (what vllm-router's kv_aware index decodes)."""
    arr = _run_small_pool(synthetic_gguf)
    sub = _run_small_pool(synthetic_gguf, "--kv-events-format", "map")
    got = []
    for raw in sub.payloads:
        batch = msgspec.msgpack.decode(raw, type=_BatchMap)
        assert batch.data_parallel_rank == 0
        plain = msgpack.unpackb(raw)
        assert isinstance(plain, list) and all(isinstance(e, dict) and e["type"] for e in plain[1])
        got += [(type(e).__name__, getattr(e, "block_hashes", None), getattr(e, "token_ids", None)) for e in batch.events]
    names = {"_StoredMap": "BlockStored", "_RemovedMap": "BlockRemoved", "_ClearedMap": "AllBlocksCleared"}
    want = [(e[0], e[1] if len(e) > 1 else None, e[3] if e[0] == "BlockStored" else None) for e in arr.events]
    assert [(names[n], h, t) for n, h, t in got] == want, "the same prompts give the same events in either format"


def test_kv_events_replay_resends_missed_batches(synthetic_gguf):
    """--kv-events-replay: a subscriber that missed batches asks for them from a
    start seq (vLLM's replay protocol) and gets exactly the bytes published,
    then the end marker (seq -1)."""
    port, rport = _free_port(), _free_port()
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "256", "--kv-pool-mib", "3",
                "--kv-events", f"tcp://*:{port}", "--kv-events-replay", f"tcp://*:{rport}") as s:
        sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=False)
        ctx = zmq.Context()
        replay = ctx.socket(zmq.DEALER)
        try:
            sub.settle()
            for k in range(5):
                _complete(s, _prompt(30 + k, 100))
                sub.pump()
            assert len(sub.payloads) >= 5 and sub.seqs == list(range(len(sub.seqs)))
            replay.connect(f"tcp://127.0.0.1:{rport}")
            for start in (0, 3, len(sub.seqs)):
                replay.send_multipart([b"", start.to_bytes(8, "big")])
                got = []
                while True:
                    assert replay.poll(10000), "no replay answer"
                    empty, seq, payload = replay.recv_multipart()
                    assert empty == b""
                    if seq == (-1).to_bytes(8, "big", signed=True):
                        assert payload == b""
                        break
                    got.append((int.from_bytes(seq, "big"), payload))
                assert got == list(zip(sub.seqs, sub.payloads))[start:], f"replay from {start}"
        finally:
            replay.close(linger=0)
            ctx.term()
            sub.close()
    r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf("synthetic-tiny")), "--kv-events-replay", "tcp://*:5558"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--kv-events-replay needs --kv-events" in r.stderr, r.stderr
    r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf("synthetic-tiny")), "--kv-events", "tcp://*:5557",
                        "--kv-events-replay", "udp://x:1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--kv-events-replay 'udp://x:1' is invalid" in r.stderr, r.stderr
