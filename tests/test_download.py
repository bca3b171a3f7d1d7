"""test_download.py - tools/download_model.sh against a local fake Hub (tests/fake_hub.py).

The fake Hub serves a small checkpoint as the pinned revision of the real entry
qwen3-0.6b (Qwen/Qwen3-0.6B @ c1899de...). config.json, tokenizer.json and
tokenizer_config.json are the vendored Hub files (data/qwen3), so the sha256 recorded in
tools/checkpoints.py is what verifies them; generation_config.json and README.md
are checked through their git blob id, model.safetensors (3 MiB here) through
the LFS sha256 of the tree. The only registry fact replaced (through
KIPP_DOWNLOAD_TEST_REGISTRY) is the recorded size of model.safetensors, 1.5 GB
on the Hub.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import checkpoints as reg
from fake_hub import FakeHub

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "download_model.sh"
ENTRY = reg.by_id("qwen3-0.6b")
MODEL_BYTES = 3 << 20


@pytest.fixture
def hub_dir(tmp_path, qwen3_data) -> Path:
    d = tmp_path / "hub"
    d.mkdir()
    shutil.copyfile(qwen3_data / "qwen3-configs" / "Qwen3-0.6B.config.json", d / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(qwen3_data / "qwen3-tokenizer" / name, d / name)
    (d / "generation_config.json").write_text(json.dumps(reg.hf_generation_config(ENTRY), indent=2) + "\n")
    (d / "README.md").write_text("# fake Qwen3-0.6B for tests\n")
    header = b'{"__metadata__":{"format":"pt"}}'
    i = np.arange(MODEL_BYTES - 8 - len(header), dtype=np.uint64)
    body = ((i * np.uint64(7919) + (i >> np.uint64(9))) & np.uint64(0xFF)).astype(np.uint8).tobytes()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + body)
    return d


@pytest.fixture
def test_registry(tmp_path) -> Path:
    files = {k: {"sha256": v.sha256, "size": v.size} for k, v in ENTRY.files.items()}
    files["model.safetensors"] = {"sha256": None, "size": MODEL_BYTES}
    p = tmp_path / "registry-override.json"
    p.write_text(json.dumps({ENTRY.id: {"files": files}}))
    return p


def run(hub: FakeHub, dest: Path, override: Path | None, *args: str,
        checkpoint: str = ENTRY.id) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_ENDPOINT=hub.url)
    env.pop("KIPP_DOWNLOAD_TEST_REGISTRY", None)
    if override is not None:
        env["KIPP_DOWNLOAD_TEST_REGISTRY"] = str(override)
    return subprocess.run([str(SCRIPT), "--checkpoint", checkpoint, "--dest", str(dest), "--quiet", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.glob("*.part")) if dest.exists() else []


def test_success_files_match(hub_dir, test_registry, tmp_path):
    dest = tmp_path / "dl"
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        r = run(hub, dest, test_registry)
        assert r.returncode == 0, r.stderr
        assert "KIPP_DOWNLOAD_TEST_REGISTRY" in r.stderr and "6 files verified" in r.stdout
        assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in hub_dir.iterdir())
        for p in hub_dir.iterdir():
            assert (dest / p.name).read_bytes() == p.read_bytes(), p.name
        n = len(hub.requests)
        again = run(hub, dest, test_registry)  # everything verifies in place: nothing is fetched
        assert again.returncode == 0 and len(hub.requests) == n


@pytest.mark.parametrize("name,why", [
    ("tokenizer_config.json", "expected d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101 "
                              "(recorded in tools/checkpoints.py)"),
    ("model.safetensors", "(LFS sha256 of the pinned revision)"),
    ("generation_config.json", "(the pinned revision's tree)"),
])
def test_bad_checksum_refused_and_deleted(name, why, hub_dir, test_registry, tmp_path):
    dest = tmp_path / "dl"
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        hub.corrupt.add(name)
        r = run(hub, dest, test_registry)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"download_model: {name} has " in r.stderr and why in r.stderr and "deleted" in r.stderr
    assert not (dest / name).exists() and leftovers(dest) == []


def test_missing_file_refused(hub_dir, test_registry, tmp_path):
    dest = tmp_path / "dl"
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        hub.missing.add("tokenizer.json")
        r = run(hub, dest, test_registry)
    assert r.returncode == 1 and "resolve/" + ENTRY.revision + "/tokenizer.json failed: HTTP 404" in r.stderr
    assert not (dest / "tokenizer.json").exists() and leftovers(dest) == []


def test_required_file_absent_from_revision_refused(hub_dir, test_registry, tmp_path):
    (hub_dir / "tokenizer.json").unlink()
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        r = run(hub, tmp_path / "dl", test_registry)
        assert hub.requests == []
    assert r.returncode == 1 and f"revision {ENTRY.revision} of Qwen/Qwen3-0.6B does not list tokenizer.json" \
        in r.stderr


def test_interrupted_download_resumes_with_range(hub_dir, test_registry, tmp_path):
    dest = tmp_path / "dl"
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        hub.drop_after["model.safetensors"] = 1 << 20
        r = run(hub, dest, test_registry)
        assert r.returncode == 0, r.stderr
        assert [x for x in hub.requests if x[0] == "model.safetensors"] == \
            [("model.safetensors", None), ("model.safetensors", f"bytes={1 << 20}-")]
    assert (dest / "model.safetensors").read_bytes() == (hub_dir / "model.safetensors").read_bytes()
    assert leftovers(dest) == []


def test_interrupted_download_fails_cleanly_then_resumes_next_run(hub_dir, test_registry, tmp_path):
    dest = tmp_path / "dl"
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        hub.drop_after["model.safetensors"] = 1 << 20
        hub.drop_times["model.safetensors"] = 99
        r = run(hub, dest, test_registry, "--retries", "1")
        assert r.returncode == 1 and "model.safetensors: download interrupted" in r.stderr
        assert "rerun to resume" in r.stderr
        assert not (dest / "model.safetensors").exists()
        assert (dest / "model.safetensors.part").stat().st_size == 2 << 20  # two cut attempts, appended
        hub.drop_times["model.safetensors"] = 0
        r = run(hub, dest, test_registry)
        assert r.returncode == 0, r.stderr
        assert ("model.safetensors", f"bytes={2 << 20}-") in hub.requests
    assert (dest / "model.safetensors").read_bytes() == (hub_dir / "model.safetensors").read_bytes()
    assert leftovers(dest) == []


def test_synthetic_and_unpinned_entries_refused(hub_dir, tmp_path):
    unpinned = tmp_path / "unpinned.json"
    unpinned.write_text(json.dumps({ENTRY.id: {"revision": None}}))
    with FakeHub(hub_dir, ENTRY.repository, ENTRY.revision) as hub:
        r1 = run(hub, tmp_path / "a", None, checkpoint="synthetic-tiny")
        r2 = run(hub, tmp_path / "b", unpinned)
        assert hub.requests == []
    assert r1.returncode == 1 and "synthetic-tiny is synthetic" in r1.stderr and "make_checkpoint" in r1.stderr
    assert r2.returncode == 1 and "qwen3-0.6b has no pinned revision (found None" in r2.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_unknown_revision_on_hub_refused(hub_dir, test_registry, tmp_path):
    with FakeHub(hub_dir, ENTRY.repository, "0" * 40) as hub:
        r = run(hub, tmp_path / "dl", test_registry)
    assert r.returncode == 1 and f"/api/models/Qwen/Qwen3-0.6B/revision/{ENTRY.revision} failed: HTTP 404" \
        in r.stderr
