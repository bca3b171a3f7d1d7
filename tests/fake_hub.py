"""fake_hub.py - a local stand-in for the Hugging Face Hub, for tests/test_download.py.

Serves the files of one directory as revision `revision` of repository `repo`
on 127.0.0.1 (random port, one background thread), in the Hub's URL layout:
  GET /api/models/{repo}/revision/{rev}  -> {"id", "sha", "siblings": [{"rfilename"}]}
  GET /api/models/{repo}/tree/{rev}      -> [{"type", "path", "size", "oid", "lfs"?}]
  GET /{repo}/resolve/{rev}/{file}       -> the bytes; honours "Range: bytes=N-" with 206
Files ending in .safetensors or over 10 MB are reported as LFS files (lfs.oid =
sha256, as the Hub does); others carry their git blob id in `oid`.

Knobs (set before or between requests):
  corrupt      names served with one byte flipped (the tree still reports the true hash)
  missing      names listed in siblings/tree but answered with 404
  drop_after   name -> n: send the headers for the whole file, n bytes, then cut the connection
  drop_times   name -> how many requests get cut (default 1)
Observations: `requests` lists (path, Range header or None) for every resolve request.
"""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import unquote

LFS_THRESHOLD = 10 << 20


class FakeHub:
    """One repository at one revision, served from `root` (use as a context manager)."""

    def __init__(self, root: Path, repo: str, revision: str) -> None:
        self.root, self.repo, self.revision = Path(root), repo, revision
        self.corrupt: set[str] = set()
        self.missing: set[str] = set()
        self.drop_after: dict[str, int] = {}
        self.drop_times: dict[str, int] = {}
        self.requests: list[tuple[str, Optional[str]]] = []
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """The endpoint to put in HF_ENDPOINT."""
        assert self._server is not None, "FakeHub is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def files(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_file())

    def tree(self) -> list[dict]:
        """Tree API entries with sizes and hashes of the true file contents."""
        out = []
        for name in self.files():
            data = (self.root / name).read_bytes()
            item = {"type": "file", "path": name, "size": len(data),
                    "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
            if name.endswith(".safetensors") or len(data) > LFS_THRESHOLD:
                item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            out.append(item)
        return out

    def __enter__(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                hub._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------ request handling

    def _send(self, h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = "application/json",
              extra: Optional[dict] = None) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = unquote(h.path.split("?", 1)[0])
        api = f"/api/models/{self.repo}/"
        if path == api + f"revision/{self.revision}":
            body = {"id": self.repo, "sha": self.revision,
                    "siblings": [{"rfilename": n} for n in self.files()]}
            return self._send(h, 200, json.dumps(body).encode())
        if path == api + f"tree/{self.revision}":
            return self._send(h, 200, json.dumps(self.tree()).encode())
        prefix = f"/{self.repo}/resolve/{self.revision}/"
        if path.startswith(prefix):
            return self._serve_file(h, path[len(prefix):])
        self._send(h, 404, b'{"error":"Entry not found"}')

    def _serve_file(self, h: BaseHTTPRequestHandler, name: str) -> None:
        rng = h.headers.get("Range")
        self.requests.append((name, rng))
        if name in self.missing or name not in self.files():
            return self._send(h, 404, b'{"error":"Entry not found"}')
        data = bytearray((self.root / name).read_bytes())
        if name in self.corrupt:
            data[len(data) // 2] ^= 0xFF
        start = 0
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
        body = bytes(data[start:])
        code = 206 if start else 200
        extra = {"Accept-Ranges": "bytes"}
        if start:
            extra["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        cut = self.drop_after.get(name)
        if cut is not None and self.drop_times.get(name, 1) > 0:
            self.drop_times[name] = self.drop_times.get(name, 1) - 1
            h.send_response(code)
            h.send_header("Content-Length", str(len(body)))
            for k, v in extra.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True  # the client sees a short body: IncompleteRead
            return
        self._send(h, code, body, "application/octet-stream", extra)
