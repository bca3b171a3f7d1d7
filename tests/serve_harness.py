"""serve_harness.py - start build/kipp-serve on a free loopback port for a test,
plus small HTTP helpers and a strict SSE parser, for the kipp-serve tests.

The server is started with --port 0 and prints the port it bound; only
127.0.0.1 is ever contacted. Every loop here is bounded by a deadline.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVE = Path(os.environ.get("KIPP_SERVE_BIN", REPO / "build" / "kipp-serve"))  # override: a sanitizer build


class Server:
    """A running kipp-serve; use as a context manager."""

    def __init__(self, model: Path, *args: str, backend: str = "cpu"):
        self.cmd = [str(SERVE), "--model", str(model), "--port", "0", "--backend", backend, "--threads", "2", *args]
        self.proc = None
        self.port = 0

    def __enter__(self) -> "Server":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # the "listening on" line, or EOF if it failed
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"kipp-serve did not start: {line!r} {self.proc.stderr.read()}")
        self.port = int(m.group(1))
        self.banner = line  # kept for tests of what it says (the KV pool's size and rule)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        err = self.stderr = self.proc.stderr.read()  # kept for tests of startup notes
        self.proc.stdout.close(), self.proc.stderr.close()
        # a sanitizer build (KIPP_SERVE_BIN) reports at exit: any report fails the test
        assert "Sanitizer" not in err and "runtime error" not in err, err[-4000:]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict | None = None, timeout: float = 120) -> tuple[int, bytes]:
        """One request on a fresh connection: (status, body bytes)."""
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path: str, body, **kw) -> tuple[int, dict | bytes]:
        st, data = self.request("POST", path, body, **kw)
        try:
            return st, json.loads(data)
        except ValueError:
            return st, data

    def metrics(self) -> str:
        return self.request("GET", "/metrics")[1].decode()

    def gauge(self, name: str) -> float:
        m = re.search(rf"^{name} (\S+)$", self.metrics(), re.M)
        return float(m.group(1)) if m else float("nan")

    def wait_idle(self, timeout: float = 20) -> bool:
        """True once no choice is active and no KV block is held."""
        end = time.time() + timeout
        while time.time() < end:
            if self.gauge("kipp_active_choices") == 0 and self.gauge("kipp_kv_blocks_in_use") == 0:
                return True
            time.sleep(0.05)
        return False


def open_stream(port: int, body: dict) -> socket.socket:
    """POST body to /v1/completions on a raw socket and return it unread: a
    client that holds a stream open (or hangs up) at the byte level."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def parse_sse(raw: bytes) -> list:
    """Strict SSE: only 'data: <json>' events separated by one blank line, ending
    with exactly one 'data: [DONE]'. Returns the decoded chunks (without DONE)."""
    text = raw.decode("utf-8")  # must be valid UTF-8 throughout
    assert text.endswith("data: [DONE]\n\n"), f"stream does not end with [DONE]: {text[-200:]!r}"
    events = text[:-len("\n\n")].split("\n\n")
    assert events[-1] == "data: [DONE]"
    chunks = []
    for ev in events[:-1]:
        assert ev.startswith("data: ") and "\n" not in ev, f"bad SSE event {ev[:200]!r}"
        assert ev != "data: [DONE]", "[DONE] before the end"
        chunks.append(json.loads(ev[len("data: "):]))
    return chunks


def check_stream(chunks: list, n: int, chat: bool, include_usage: bool) -> dict:
    """Shape rules of an OpenAI stream; returns {index: (text, reasoning, finish)}."""
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1, f"one id per response, got {ids}"
    want_obj = "chat.completion.chunk" if chat else "text_completion"
    out = {i: ["", "", None] for i in range(n)}
    usage_chunks = [c for c in chunks if "usage" in c]
    for c in chunks:
        assert c["object"] == want_obj
        if not c["choices"]:
            assert "usage" in c, "a chunk without choices must be the usage chunk"
            continue
        for ch in c["choices"]:
            i = ch["index"]
            assert 0 <= i < n
            assert out[i][2] is None, f"choice {i} has content after its finish chunk"
            if chat:
                out[i][0] += ch["delta"].get("content") or ""
                out[i][1] += ch["delta"].get("reasoning_content") or ""
            else:
                out[i][0] += ch["text"]
            if ch["finish_reason"] is not None:
                out[i][2] = ch["finish_reason"]
    assert all(v[2] in ("stop", "length", "tool_calls") for v in out.values()), f"a choice lacks its finish chunk: {out}"
    finishes = sum(1 for c in chunks for ch in c["choices"] if ch["finish_reason"] is not None)
    assert finishes == n, f"{finishes} finish chunks for {n} choices"
    if include_usage:
        assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0] and chunks[-1]["choices"] == []
        u = chunks[-1]["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert "timings" in chunks[-1]
    else:
        assert not usage_chunks, "usage chunk sent without stream_options.include_usage"
        assert "timings" in chunks[-1]
    return {i: tuple(v) for i, v in out.items()}


def concurrent_equals_alone(s: "Server", max_tokens: int) -> None:
    """Three seeded completions run one by one, then at once (so admission makes
    them wait their turn): every concurrent one is 200 with its isolated text, and
    the server ends idle."""
    bodies = [{"prompt": "word " * (3 * k + 1), "max_tokens": max_tokens, "temperature": 0.7, "seed": k} for k in range(3)]
    alone = [s.post("/v1/completions", b)[1]["choices"][0]["text"] for b in bodies]
    out = [None] * 3

    def go(k):
        out[k] = s.post("/v1/completions", bodies[k])

    ts = [threading.Thread(target=go, args=(k,)) for k in range(3)]
    [t.start() for t in ts]
    [t.join(timeout=120) for t in ts]
    assert [o[0] for o in out] == [200] * 3
    assert [o[1]["choices"][0]["text"] for o in out] == alone
    assert s.wait_idle()


# A required const whose shortest completion is longer than the cut tests' max_tokens: the grammar
# finishes a forced call within max_tokens only when max_tokens holds that completion
# (docs/STRUCTURED_OUTPUT.md), so with this field max_tokens can still cut a call after its head.
LONG_NOTE = ("for the next three days, in degrees Celsius, with the wind, the rain, the humidity, the pressure "
             "and the hours of sunshine of every one of them")


def with_long_note(params: dict) -> dict:
    """params (an object schema) with the required const field "note" = LONG_NOTE added last."""
    return {**params, "properties": {**params["properties"], "note": {"const": LONG_NOTE}},
            "required": params["required"] + ["note"]}
