#!/usr/bin/env python3
"""hub_download.py - fetch a registry entry's pinned Hugging Face revision, verified.

Seed 000, "Conversion boundary". Called by tools/download_model.sh.

Flow, against HF_ENDPOINT (default https://huggingface.co):
  GET {endpoint}/api/models/{repo}/revision/{rev}  -> siblings (the file list)
  GET {endpoint}/api/models/{repo}/tree/{rev}      -> size, git oid, lfs sha256 per file
  GET {endpoint}/{repo}/resolve/{rev}/{file}       -> bytes (Range: resumes FILE.part)

Every file is checked against, in order of trust: the sha256 recorded in
tools/checkpoints.py (from data/qwen3/qwen3-registry.md), else the LFS sha256 the
pinned tree reports, else the tree's git blob id (sha1 of "blob <size>\\0" +
bytes); sizes likewise. A file lands under its final name only after it
verified; a bad download is deleted; an interrupted one is kept as FILE.part and
resumed with an HTTP Range request (retried here, or on the next run).

Plain urllib instead of huggingface_hub: it gives explicit control of Range
resume, of where partial files live and of which checksum is trusted, and needs
no token or cache directory.

Test hook: KIPP_DOWNLOAD_TEST_REGISTRY=FILE names a JSON object
{id: {"revision": ..., "weight_shards": ..., "files": {name: {"sha256": ..., "size": ...}}}}
that replaces those download facts of the named entries (only these keys). The
downloader announces it on stderr. tests/test_download.py uses it to serve small
files under a real entry's repository and revision.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as reg  # noqa: E402
from safe_io import term_escape  # noqa: E402

DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20
REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json")
TEST_REGISTRY_ENV = "KIPP_DOWNLOAD_TEST_REGISTRY"


class DownloadError(Exception):
    """A refusal or failed download; the message names the file, expectation and finding."""


@dataclasses.dataclass
class Remote:
    """What the pinned tree says about one file."""
    path: str
    size: Optional[int]
    sha256: Optional[str]     # LFS files only
    git_oid: Optional[str]    # sha1 of the git blob (non-LFS files)


# ---------------------------------------------------------------- registry

def apply_test_registry(c: reg.Checkpoint) -> reg.Checkpoint:
    """Replace the entry's download facts from KIPP_DOWNLOAD_TEST_REGISTRY, if set (tests only)."""
    path = os.environ.get(TEST_REGISTRY_ENV)
    if not path:
        return c
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DownloadError(f"{TEST_REGISTRY_ENV}={path} is unreadable ({e}); expected a JSON object") from None
    patch = table.get(c.id)
    if patch is None:
        return c
    unknown = set(patch) - {"revision", "weight_shards", "files"}
    if unknown:
        raise DownloadError(f"{TEST_REGISTRY_ENV}: keys {sorted(unknown)} for {c.id} are not allowed "
                            "(expected revision, weight_shards, files)")
    print(f"download_model: {TEST_REGISTRY_ENV}={path} overrides download facts of {c.id}", file=sys.stderr)
    fields = dict(patch)
    if "revision" in fields and fields["revision"] is None:
        fields["revision_status"] = reg.UNPINNED
    if "files" in fields:
        fields["files"] = {k: reg.FileFact(v.get("sha256"), v.get("size")) for k, v in fields["files"].items()}
    return dataclasses.replace(c, **fields)


def check_downloadable(c: reg.Checkpoint) -> None:
    """Refuse synthetic entries and entries without a pinned 40-hex revision."""
    if c.synthetic:
        raise DownloadError(f"checkpoint {c.id} is synthetic (repository {c.repository}); it is not on the "
                            f"Hub. Generate it with: tools/make_checkpoint.py --checkpoint {c.id} --out DIR")
    if not c.is_pinned:
        raise DownloadError(f"checkpoint {c.id} has no pinned revision (found {c.revision!r}, status "
                            f"{c.revision_status}); expected a 40-hex commit in tools/checkpoints.py, "
                            "refusing to download an unpinned branch")


# ---------------------------------------------------------------- HTTP

def _get(url: str, headers: Optional[dict] = None, timeout: float = 60):
    """Open url; HTTP errors become DownloadError naming the URL and status."""
    req = urllib.request.Request(url, headers={"User-Agent": "kipp-download/1", **(headers or {})})
    token = os.environ.get("HF_TOKEN")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise DownloadError(f"GET {url} failed: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DownloadError(f"GET {url} failed: {e.reason}") from None


def _get_json(url: str):
    with _get(url) as r:
        try:
            return json.loads(r.read())
        except json.JSONDecodeError as e:
            raise DownloadError(f"GET {url} returned invalid JSON ({e})") from None


def list_remote(endpoint: str, c: reg.Checkpoint) -> dict[str, Remote]:
    """The pinned revision's files with their sizes and hashes (siblings + tree)."""
    repo = urllib.parse.quote(c.repository, safe="/")
    info = _get_json(f"{endpoint}/api/models/{repo}/revision/{c.revision}")
    if info.get("sha") not in (None, c.revision):
        raise DownloadError(f"the Hub resolved revision {c.revision} of {c.repository} to commit "
                            f"{info.get('sha')}; expected the pinned commit itself")
    names = [s["rfilename"] for s in info.get("siblings", []) if "rfilename" in s]
    url = f"{endpoint}/api/models/{repo}/tree/{c.revision}"
    tree: dict[str, dict] = {}
    while url:  # the tree API pages with a Link: <...>; rel="next" header
        with _get(url) as r:
            for item in json.loads(r.read()):
                tree[item.get("path", "")] = item
            m = re.search(r'<([^>]+)>;\s*rel="next"', r.headers.get("Link", "") or "")
        url = urllib.parse.urljoin(endpoint + "/", m.group(1)) if m else ""
    out = {}
    for n in names:
        t = tree.get(n, {})
        lfs = t.get("lfs") or {}
        out[n] = Remote(n, lfs.get("size", t.get("size")), lfs.get("sha256", lfs.get("oid")),
                        None if lfs else t.get("oid"))
    return out


def check_file_list(c: reg.Checkpoint, remote: dict[str, Remote]) -> None:
    """The revision must hold the files the converter needs, in the recorded sharding."""
    need = list(REQUIRED) + list(c.files)
    expected = c.weight_files()
    if expected is not None:
        need += expected
    elif "model.safetensors" not in remote and "model.safetensors.index.json" not in remote:
        need.append("model.safetensors")
    missing = [n for n in need if n not in remote]
    if missing:
        raise DownloadError(f"revision {c.revision} of {c.repository} does not list {', '.join(missing)} "
                            "(expected by the registry entry)")
    if expected is not None:
        have = sorted(n for n in remote if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors", n))
        if have != sorted(n for n in expected if n.endswith(".safetensors")):
            raise DownloadError(f"{c.repository}@{c.revision} has weight files {have}; expected "
                                f"{c.weight_shards} as recorded in tools/checkpoints.py")


# ---------------------------------------------------------------- one file

def _hashes(path: Path) -> tuple[str, str, int]:
    """(sha256, git blob sha1, size) of a file, read once."""
    size = path.stat().st_size
    h256, h1 = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h256.update(block)
            h1.update(block)
    return h256.hexdigest(), h1.hexdigest(), size


def verify(path: Path, name: str, rec: Optional[reg.FileFact], rem: Remote) -> Optional[str]:
    """None when the file passes every check we have, else why not (one sentence)."""
    sha, blob, size = _hashes(path)
    want_size = rec.size if rec and rec.size is not None else rem.size
    if want_size is not None and size != want_size:
        return f"{name} is {size} bytes; expected {want_size}"
    if rec and rec.sha256:
        return None if sha == rec.sha256 else \
            f"{name} has sha256 {sha}; expected {rec.sha256} (recorded in tools/checkpoints.py)"
    if rem.sha256:
        return None if sha == rem.sha256 else \
            f"{name} has sha256 {sha}; expected {rem.sha256} (LFS sha256 of the pinned revision)"
    if rem.git_oid:
        return None if blob == rem.git_oid else \
            f"{name} has git blob id {blob}; expected {rem.git_oid} (the pinned revision's tree)"
    return f"{name}: no checksum is recorded or reported for it; refusing an unverifiable file"


def _fetch_once(url: str, part: Path, total: Optional[int], bar) -> None:
    """Append the rest of the file to part (Range from its current size)."""
    have = part.stat().st_size if part.exists() else 0
    if total is not None and have >= total:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    with _get(url, headers) as r:
        if have and r.status != 206:  # server ignored the Range: start over
            part.unlink()
            have = 0
        with open(part, "ab") as f:
            while True:
                block = r.read(CHUNK)
                if not block:
                    break
                f.write(block)
                if bar is not None:
                    bar.update(len(block))
    if total is not None and part.stat().st_size < total:
        raise ConnectionError(f"connection closed after {part.stat().st_size} of {total} bytes")


def download_file(endpoint: str, c: reg.Checkpoint, rem: Remote, dest: Path, retries: int,
                  quiet: bool) -> str:
    """Download one file to dest/name via name.part; returns "ok", "cached" or raises."""
    final = dest / rem.path
    rec = c.files.get(rem.path)
    if final.exists() and verify(final, rem.path, rec, rem) is None:
        return "cached"
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(final.name + ".part")
    url = f"{endpoint}/{urllib.parse.quote(c.repository, safe='/')}/resolve/{c.revision}/" \
          f"{urllib.parse.quote(rem.path)}"
    bar = None
    if not quiet:
        from tqdm import tqdm
        bar = tqdm(total=rem.size, unit="B", unit_scale=True, desc=rem.path,
                   initial=part.stat().st_size if part.exists() else 0)
    try:
        for attempt in range(retries + 1):
            try:
                _fetch_once(url, part, rem.size, bar)
                break
            except (ConnectionError, http.client.HTTPException, TimeoutError, OSError) as e:
                if attempt == retries:
                    raise DownloadError(f"{rem.path}: download interrupted ({e}); "
                                        f"{part.stat().st_size if part.exists() else 0} bytes kept in "
                                        f"{part}, rerun to resume") from None
                time.sleep(min(2.0 ** attempt * 0.2, 5.0))
    finally:
        if bar is not None:
            bar.close()
    problem = verify(part, rem.path, rec, rem)
    if problem:
        part.unlink()
        raise DownloadError(problem + "; the download was deleted")
    os.replace(part, final)
    return "ok"


def download(c: reg.Checkpoint, dest: Path, endpoint: str, retries: int = 3, quiet: bool = True) -> list[str]:
    """Fetch and verify every file of the pinned revision into dest; returns their names."""
    check_downloadable(c)
    remote = list_remote(endpoint.rstrip("/"), c)
    check_file_list(c, remote)
    dest.mkdir(parents=True, exist_ok=True)
    for name in sorted(remote):
        status = download_file(endpoint.rstrip("/"), c, remote[name], dest, retries, quiet)
        if not quiet:
            print(f"download_model: {term_escape(name)}: {status}", file=sys.stderr)
    return sorted(remote)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Download a registry entry's pinned Hugging Face revision "
                                 "and verify every file.")
    ap.add_argument("--checkpoint", required=True, help="real registry id, e.g. qwen3-0.6b")
    ap.add_argument("--dest", type=Path, help="target directory (default: models/<id> in the current directory)")
    ap.add_argument("--retries", type=int, default=3, help="resume attempts per file (default 3)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    try:
        c = apply_test_registry(reg.by_id(args.checkpoint))
    except KeyError as e:
        print(f"download_model: {e.args[0]}", file=sys.stderr)
        return 1
    except DownloadError as e:
        print(f"download_model: {term_escape(str(e))}", file=sys.stderr)
        return 1
    dest = args.dest or Path("models") / c.id
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    try:
        files = download(c, dest, endpoint, max(0, args.retries), args.quiet)
    except (DownloadError, OSError) as e:
        print(f"download_model: {term_escape(str(e))}", file=sys.stderr)
        return 1
    print(f"download_model: {c.id} ({c.repository}@{c.revision}): {len(files)} files verified in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
