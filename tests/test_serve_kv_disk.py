"""test_serve_kv_disk.py - kipp-serve's KV disk tier (issue 54: --kv-cache-dir,
--kv-cache-disk-mib): published blocks are written through to verified files,
read back when RAM lacks them, found again by a restarted server; corrupt,
truncated, foreign-model and foreign-KV-type files are refused and counted;
a server killed with -9 mid-write never leaves a block that changes an
output; an unsafe directory is refused at startup.

The oracle for every output is the same greedy request on a server without
the pool (--kv-pool-mib 0), which never reads or writes KV files. Block files
are parsed here from the documented layout (engine/kv_disk_file.c), not
through the engine.
"""
from __future__ import annotations

import os
import random
import re
import socket
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from serve_harness import SERVE, Server, open_stream

xxhash = pytest.importorskip("xxhash")
zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

BLOCK = 32
ROOT_HASH = 0x4B495050
HEAD = 128
# A small RAM pool (16 blocks of the tiny model's 256 KiB) with --ctx 256, so
# prompts evict each other's blocks and later ones must come back from disk.
SMALL = ("--ctx", "256", "--kv-pool-mib", "4")


def _prompt(seed: int, n: int, shared: list[int] | None = None) -> list[int]:
    """n token ids: `shared` first, then ids from a small LCG (ordinary vocabulary)."""
    out = list(shared or [])
    x = seed * 7919 + 13
    while len(out) < n:
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(1000 + x % 50000)
    return out


SHARED = _prompt(99, 96)
PROMPTS = [_prompt(k, 150, SHARED) for k in range(4)]  # 3 shared blocks, then 1 of their own


def _chain(ids: list[int]) -> list[int]:
    """Chain hashes of the full blocks of ids (kipp_kv_event's rule)."""
    out, h = [], ROOT_HASH
    for b in range(len(ids) // BLOCK):
        h = xxhash.xxh3_64_intdigest(struct.pack(f"<{BLOCK}I", *ids[b * BLOCK:(b + 1) * BLOCK]), seed=h)
        out.append(h)
    return out


def _text(s: Server, ids: list[int], max_tokens: int = 6) -> tuple[str, dict]:
    st, body = s.post("/v1/completions", {"prompt": ids, "max_tokens": max_tokens, "temperature": 0})
    assert st == 200, body
    return body["choices"][0]["text"], body["usage"]


GAUGES = {"bytes", "capacity_bytes", "files", "queued"}


def _m(s: Server, name: str) -> float:
    return s.gauge(f"kipp_kv_disk_{name}" if name in GAUGES else f"kipp_kv_disk_{name}_total")


def _wait_written(s: Server, timeout: float = 20) -> None:
    end = time.time() + timeout
    while time.time() < end and _m(s, "queued") > 0:
        time.sleep(0.05)
    time.sleep(0.1)  # the last write's rename and index update follow its dequeue
    assert _m(s, "queued") == 0


@pytest.fixture(scope="module")
def oracle(synthetic_gguf) -> dict[int, str]:
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "256", "--kv-pool-mib", "0") as plain:
        return {k: _text(plain, p)[0] for k, p in enumerate(PROMPTS)}


def _tier(model: Path, d: Path, *extra: str) -> Server:
    return Server(model, *SMALL, "--kv-cache-dir", str(d), "--kv-cache-disk-mib", "64", *extra)


def test_tier_outputs_equal_alone_batched_and_after_restart(synthetic_gguf, oracle, tmp_path):
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    with _tier(model, d) as s:
        assert f"disk tier {d}, 64 MiB" in s.banner
        for k, p in enumerate(PROMPTS):
            assert _text(s, p)[0] == oracle[k], f"prompt {k} alone"
        out = {}
        ts = [threading.Thread(target=lambda k=k: out.__setitem__(k, _text(s, PROMPTS[k])[0])) for k in range(4)]
        [t.start() for t in ts]
        [t.join(timeout=120) for t in ts]
        assert out == oracle, "batched"
        _wait_written(s)
        written = _m(s, "writes")
        assert written == 3 + 4, "the shared prefix's 3 blocks once, then each prompt's own block"
        assert _m(s, "files") == written and _m(s, "rejects") == 0
    files = sorted(d.glob("*.kvb"))
    assert {f.stem for f in files} == {f"{h:016x}" for p in PROMPTS for h in _chain(p[:-1])}
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files) and d.stat().st_mode & 0o777 == 0o700
    with _tier(model, d) as s:  # a restarted server: every block of prompt 0 comes back from disk
        text, usage = _text(s, PROMPTS[0])
        assert text == oracle[0]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 128
        assert _m(s, "hits") == 4 and _m(s, "reads") == 4 and _m(s, "rejects") == 0
        assert _m(s, "writes") == 0, "blocks read from disk are not written again"
        out = {}
        ts = [threading.Thread(target=lambda k=k: out.__setitem__(k, _text(s, PROMPTS[k])[0])) for k in range(4)]
        [t.start() for t in ts]
        [t.join(timeout=120) for t in ts]
        assert out == oracle, "batched after a restart"


def test_small_pool_evicts_then_reads_back(synthetic_gguf, oracle, tmp_path):
    """Prompts that do not fit the RAM pool together evict each other; the
    evicted blocks come back from disk, and outputs stay bitwise equal, also
    for batched choices that are preempted and resumed."""
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    others = [_prompt(50 + k, 200) for k in range(3)]  # 6 blocks each: the 16-block pool cannot keep them all
    with _tier(model, d) as s:
        for k in range(4):
            assert _text(s, PROMPTS[k])[0] == oracle[k]
        _wait_written(s)
        for p in others:
            _text(s, p, 40)
        _wait_written(s)
        hits = _m(s, "hits")
        for k in range(4):
            assert _text(s, PROMPTS[k])[0] == oracle[k]
        assert s.gauge("kipp_kv_pool_evictions_total") > 0
        assert _m(s, "hits") > hits, "evicted blocks were read back from disk"
        # all four at once with long replies (8 blocks each) outgrow the 16 blocks: choices are preempted,
        # their blocks published (and written), and resumed through the prefix match, RAM or disk
        body = lambda k: {"prompt": PROMPTS[k], "max_tokens": 100, "temperature": 0}
        alone = [s.post("/v1/completions", body(k))[1]["choices"][0]["text"] for k in range(4)]
        out = {}
        ts = [threading.Thread(target=lambda k=k: out.__setitem__(k, s.post("/v1/completions", body(k))[1])) for k in range(4)]
        [t.start() for t in ts]
        [t.join(timeout=120) for t in ts]
        assert [out[k]["choices"][0]["text"] for k in range(4)] == alone
        assert s.gauge("kipp_preemptions_total") > 0, "the premise: some choice was preempted"


def _set_u32(raw: bytearray, off: int, v: int) -> None:
    raw[off:off + 4] = struct.pack("<I", v)


def _reseal(raw: bytearray) -> None:
    """Recompute the header checksum (bytes 0..119 and the ids), as a writer with other settings would."""
    n_ids = struct.unpack_from("<I", raw, 64)[0]
    h = xxhash.xxh3_64_intdigest(bytes(raw[:120]) + bytes(raw[HEAD:HEAD + 4 * n_ids]))
    raw[120:128] = struct.pack("<Q", h)


def test_bad_files_are_rejected_counted_and_requests_succeed(synthetic_gguf, oracle, tmp_path):
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    distinct = [_prompt(200 + k, 70) for k in range(4)]  # no shared prefix: 2 blocks of their own each
    with _tier(model, d) as s:
        want = [_text(s, p)[0] for p in distinct]
        _wait_written(s)
    firsts = [d / f"{_chain(p)[0]:016x}.kvb" for p in distinct]
    raws = [bytearray(f.read_bytes()) for f in firsts]
    raws[0][-1000] ^= 0x40                      # a flipped payload bit
    raws[1] = raws[1][:len(raws[1]) // 2]       # truncated
    raws[2][16] ^= 1                            # another model's identity, a valid header otherwise
    _reseal(raws[2])
    _set_u32(raws[3], 12, 2)                    # another KV type (not bf16), a valid header otherwise
    _reseal(raws[3])
    for f, raw in zip(firsts, raws):
        f.write_bytes(bytes(raw))
    with _tier(model, d) as s:
        for p, w in zip(distinct, want):
            text, usage = _text(s, p)
            assert text == w
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0, "nothing adopted past a refused first block"
        assert _m(s, "rejects") == 4 and _m(s, "hits") == 0
        _wait_written(s)
        assert _m(s, "writes") == 4, "each refused block was computed again and written over its file"
    log = s.stderr
    reasons = re.findall(r"skipping [0-9a-f]{16}\.kvb: (.*)", log)
    assert len(reasons) == 4, log
    assert any("checksum" in r for r in reasons) and any("truncated" in r for r in reasons)
    assert any("another model" in r for r in reasons) and any("KV type 2" in r for r in reasons)
    with _tier(model, d) as s:  # the rewritten files are good again
        for p, w in zip(distinct, want):
            assert _text(s, p)[0] == w
        assert _m(s, "rejects") == 0 and _m(s, "hits") == 4 * 2


def test_kill9_mid_write_never_yields_a_wrong_block(synthetic_gguf, oracle, tmp_path, monkeypatch):
    """Kill the server with SIGKILL while its I/O thread is inside writes
    (slowed by a test hook between header and payload), many times; every
    restart finds only whole, verified files, and outputs stay equal to a
    cold run."""
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    rng = random.Random(54)
    monkeypatch.setenv("KIPP_TEST_KV_DISK_SLOW_MS", "40")
    for it in range(8):
        s = _tier(model, d).__enter__()
        try:
            k = it % 4
            assert _text(s, PROMPTS[k])[0] == oracle[k]
            assert _m(s, "rejects") == 0
            _text(s, _prompt(300 + it, 250), 2)  # 7 more blocks to write: ~300 ms of slowed writes, past the longest sleep
            time.sleep(rng.uniform(0, 0.15))
        finally:
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait()
            s.proc.stdout.close(), s.proc.stderr.close()
    monkeypatch.delenv("KIPP_TEST_KV_DISK_SLOW_MS")
    with _tier(model, d) as s:
        for k in range(4):
            assert _text(s, PROMPTS[k])[0] == oracle[k]
        assert _m(s, "rejects") == 0, "a killed writer never leaves a torn file under a block's name"
        assert _m(s, "hits") > 0
        assert _m(s, "tmp_removed") > 0, "some kill landed mid-write (a temporary file was left)"
    assert not list(d.glob("*.tmp"))


def _start_fails(model: Path, d: Path) -> str:
    p = subprocess.run([str(SERVE), "--model", str(model), "--port", "0", "--threads", "1", *SMALL, "--kv-cache-dir", str(d)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_unsafe_directory_is_refused(synthetic_gguf, tmp_path):
    model = synthetic_gguf("synthetic-tiny")
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    err = _start_fails(model, d)
    assert f"--kv-cache-dir '{d}' has mode 777, writable by others" in err, err
    d.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(d)
    assert "a symlink is refused" in _start_fails(model, link)
    f = tmp_path / "plain"
    f.write_text("x")
    assert f"--kv-cache-dir '{f}' exists and is not a directory (a regular file)" in _start_fails(model, f)
    err = _start_fails(model, Path("/proc"))
    assert "cannot create its lock file /proc/lock" in err and "another kipp process" not in err, err
    assert "needs a value" in subprocess.run([str(SERVE), "--model", str(model), "--kv-cache-dir"], capture_output=True,
                                             text=True).stderr
    p = subprocess.run([str(SERVE), "--model", str(model), "--kv-cache-disk-mib", "8"], capture_output=True, text=True)
    assert p.returncode == 2 and "add --kv-cache-dir DIR" in p.stderr
    p = subprocess.run([str(SERVE), "--model", str(model), "--kv-pool-mib", "0", "--kv-cache-dir", str(d)],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--kv-pool-mib 0 turns the pool off" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_foreign_owned_directory_is_refused(synthetic_gguf, tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    err = _start_fails(synthetic_gguf("synthetic-tiny"), d)
    assert "is owned by uid 65534, expected this process's uid 0" in err, err


def test_kv_events_report_disk_medium(synthetic_gguf, tmp_path):
    """A block written to disk is announced as BlockStored with medium DISK,
    after its CPU BlockStored; its chain hash is the oracle's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with _tier(synthetic_gguf("synthetic-tiny"), tmp_path / "kv", "--kv-events", f"tcp://*:{port}") as s:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        try:
            time.sleep(0.5)
            sub.poll(50)
            _text(s, PROMPTS[0])
            _wait_written(s)
            seen = {"CPU": [], "DISK": []}
            while sub.poll(500):
                _, _, payload = sub.recv_multipart()
                for ev in msgpack.unpackb(payload, raw=False)[1]:
                    if ev[0] == "BlockStored":
                        seen[ev[6]] += ev[1]
        finally:
            sub.close(linger=0)
            ctx.term()
    want = _chain(PROMPTS[0][:-1])
    assert seen["CPU"] == want and seen["DISK"] == want, seen
    # a restarted server announces the blocks it found on disk (DISK, parents first) before any request;
    # they went out before anyone subscribed, so a router gets them through the replay socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        rport = probe.getsockname()[1]
    with _tier(synthetic_gguf("synthetic-tiny"), tmp_path / "kv", "--kv-events", f"tcp://*:{port}",
               "--kv-events-replay", f"tcp://*:{rport}") as s:
        ctx = zmq.Context()
        replay = ctx.socket(zmq.DEALER)
        try:
            replay.connect(f"tcp://127.0.0.1:{rport}")
            replay.send_multipart([b"", (0).to_bytes(8, "big")])
            stored = []
            while True:
                assert replay.poll(10000), "no replay answer"
                _, seq, payload = replay.recv_multipart()
                if seq == (-1).to_bytes(8, "big", signed=True):
                    break
                stored += [(ev[1], ev[2], ev[3], ev[6]) for ev in msgpack.unpackb(payload, raw=False)[1]
                           if ev[0] == "BlockStored"]
        finally:
            replay.close(linger=0)
            ctx.term()
    # the publisher merges a chain's consecutive blocks into one event (hashes and ids concatenated)
    assert [h for x in stored for h in x[0]] == want, stored
    assert stored[0][1] is None and all(x[3] == "DISK" for x in stored)
    assert [t for x in stored for t in x[2]] == PROMPTS[0][:BLOCK * len(want)]


def test_lru_keeps_the_directory_within_budget(synthetic_gguf, tmp_path):
    """A 1 MiB budget holds 3 of the tiny model's ~256 KiB block files: the least recently used go first."""
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    with Server(model, *SMALL, "--kv-cache-dir", str(d), "--kv-cache-disk-mib", "1") as s:
        for k in range(3):
            _text(s, _prompt(400 + k, 70))
            _wait_written(s)
        assert _m(s, "bytes") <= 1 << 20 and _m(s, "files") == 3
        assert _m(s, "evictions") == 3
        total = sum(f.stat().st_size for f in d.glob("*.kvb"))
        assert total == _m(s, "bytes")
        last = _chain(_prompt(402, 70))
        assert {f.stem for f in d.glob("*.kvb")} >= {f"{h:016x}" for h in last}, "the newest blocks stay"
    kept = {f.stem for f in d.glob("*.kvb")}
    for f in d.glob("*.kvb"):  # a chain loses its tail first: no file is kept behind a removed parent
        has_parent, parent = struct.unpack_from("<I", f.read_bytes(), 44)[0], struct.unpack_from("<Q", f.read_bytes(), 56)[0]
        assert not has_parent or f"{parent:016x}" in kept, f"{f.name} kept without its parent {parent:016x}"



def _stream_times(sock, times: list) -> None:
    """Read a (chunked) SSE stream to its end, appending the arrival time of each token chunk."""
    buf, seen = b"", 0
    sock.settimeout(60)
    while b"data: [DONE]" not in buf:
        data = sock.recv(65536)
        if not data:
            return
        buf += data
        n = buf.count(b"data: {")
        times.extend([time.monotonic()] * (n - seen))
        seen = n


LONG = ("--ctx", "2048", "--kv-pool-mib", "16")


def test_disk_reads_do_not_stall_running_streams(synthetic_gguf, tmp_path, monkeypatch):
    """A request whose 6 prompt blocks are on disk waits while the I/O thread
    reads them (slowed to 300 ms a block by a test hook): a stream already
    running keeps getting tokens meanwhile, and the request's output equals a
    poolless server's. Reading inside the admission (the scheduler thread)
    would give that stream no token for 1.8 s."""
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    disk_prompt, other = _prompt(700, 200), _prompt(701, 40)
    with Server(model, "--ctx", "2048", "--kv-pool-mib", "0") as plain:
        want = _text(plain, disk_prompt)[0]
    with _tier(model, d) as s:
        _text(s, disk_prompt)
        _wait_written(s)
    monkeypatch.setenv("KIPP_TEST_KV_DISK_SLOW_READ_MS", "300")
    with Server(model, *LONG, "--kv-cache-dir", str(d), "--kv-cache-disk-mib", "64") as s:
        times: list[float] = []
        sock = open_stream(s.port, {"prompt": other, "max_tokens": 1900, "temperature": 0, "stream": True,
                                    "min_tokens": 1900})
        reader = threading.Thread(target=_stream_times, args=(sock, times))
        reader.start()
        end = time.time() + 60
        while len(times) < 5 and time.time() < end:
            time.sleep(0.01)
        assert len(times) >= 5, "the running stream started"
        t0 = time.monotonic()
        text, usage = _text(s, disk_prompt)
        t1 = time.monotonic()
        during = [t for t in times if t0 + 0.3 < t < t1 - 0.3]
        running = reader.is_alive()
        sock.shutdown(socket.SHUT_RDWR)  # the client hangs up; the reader sees the end
        reader.join(timeout=30)
        sock.close()
        assert text == want
        assert usage["prompt_tokens_details"]["cached_tokens"] == 192, "6 blocks came from disk"
        assert _m(s, "hits") == 6 and _m(s, "reads") == 6 and _m(s, "rejects") == 0
        assert t1 - t0 >= 1.8, "the premise: the slowed reads took their time"
        assert running, "the premise: the stream was still running when the read was over"
        assert len(during) >= 5, f"the running stream got {len(during)} tokens in {t1 - t0:.1f} s of disk reads"


def test_client_gone_while_its_blocks_load(synthetic_gguf, tmp_path, monkeypatch):
    """A client that hangs up while its prompt's blocks are being read: the
    read is cancelled, every block it held goes back to the pool, and the
    same prompt later gets the poolless server's output."""
    model, d = synthetic_gguf("synthetic-tiny"), tmp_path / "kv"
    disk_prompt = _prompt(702, 200)
    with Server(model, "--ctx", "256", "--kv-pool-mib", "0") as plain:
        want = _text(plain, disk_prompt)[0]
    with _tier(model, d) as s:
        _text(s, disk_prompt)
        _wait_written(s)
    monkeypatch.setenv("KIPP_TEST_KV_DISK_SLOW_READ_MS", "300")
    with _tier(model, d) as s:
        sock = open_stream(s.port, {"prompt": disk_prompt, "max_tokens": 4, "temperature": 0, "stream": True})
        time.sleep(0.5)  # two or three of its six blocks read
        sock.close()
        end = time.time() + 20
        while time.time() < end and s.gauge("kipp_queue_depth") + s.gauge("kipp_active_choices") > 0:
            time.sleep(0.05)
        assert _m(s, "hits") < 6, "the read was cut short"
        m = s.metrics()
        assert re.search(r'^kipp_kv_pool_blocks\{state="private"\} 0$', m, re.M), m
        assert re.search(r'^kipp_kv_pool_blocks\{state="referenced"\} 0$', m, re.M), m
        assert _text(s, disk_prompt)[0] == want


def test_kipp_chat_adopts_its_predecessors_blocks(synthetic_gguf, tmp_path):
    """`kipp chat --kv-cache-dir`: a second process adopts the first one's
    system prompt from disk (fewer prompt tokens evaluated) and replies as
    --no-cache-reuse does."""
    kipp = SERVE.parent / "kipp"
    base = [str(kipp), "chat", "--model", str(synthetic_gguf("synthetic-tiny")), "--threads", "1", "--max-tokens", "8",
            "--system", "You are a helpful assistant. " * 20]
    line = "hello there, tell me a story\n"
    runs = [subprocess.run(base + ["--kv-cache-dir", str(tmp_path / "kv")], input=line, capture_output=True, text=True,
                           timeout=120) for _ in range(2)]
    oracle = subprocess.run(base + ["--no-cache-reuse"], input=line, capture_output=True, text=True, timeout=120)
    assert all(r.returncode == 0 for r in runs + [oracle]), [r.stderr for r in runs + [oracle]]
    assert runs[0].stdout == runs[1].stdout == oracle.stdout
    evaluated = [int(re.search(r"prompt (\d+) tokens", r.stderr).group(1)) for r in runs]
    assert evaluated[1] == evaluated[0] - 128, evaluated  # 4 blocks of the system prompt came from disk
