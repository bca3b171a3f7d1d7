"""test_yarn_cli.py - YaRN RoPE scaling through the converter and the front ends (docs/FORMAT.md "RoPE scaling").

Oracles: the GGUF keys as the `gguf` PyPI reader sees them (values from the config written here);
bitwise equality of `kipp logits` between a file with the scaling and the same weights with
--rope-scaling (tests/test_yarn.c gates the numbers against the numpy transcription of transformers);
the exit status and message of every refusal.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT, models_dir

sys.path.insert(0, str(REPO_ROOT / "tools"))
KIPP = REPO_ROOT / "build" / "kipp"
PY = sys.executable
KEYS = ("qwen3.rope.scaling.type", "qwen3.rope.scaling.factor", "qwen3.rope.scaling.original_context_length",
        "qwen3.rope.scaling.yarn_beta_fast", "qwen3.rope.scaling.yarn_beta_slow")


def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)


def model(stem: str) -> Path:
    p = models_dir() / f"{stem}.gguf"
    assert p.is_file(), f"{p} is missing: run `make models-test`"
    return p


def rope_keys(path: Path) -> dict:
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    return {k: r.fields[k].contents() for k in KEYS if k in r.fields}


@pytest.fixture()
def tiny_dir(tmp_path: Path) -> Path:
    """synthetic-tiny's checkpoint directory, config.json writable, weights linked."""
    src = models_dir() / "synthetic-tiny"
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in src.iterdir():
        if f.name == "config.json":
            shutil.copy(f, d / f.name)
        else:
            (d / f.name).symlink_to(f.resolve())
    return d


def convert(indir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run(PY, REPO_ROOT / "tools" / "convert_to_gguf.py", "--checkpoint", "synthetic-tiny", "--input", indir,
               "--out", out, "--quiet", *extra)


def test_config_rope_scaling_becomes_keys(tiny_dir, tmp_path):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "t.gguf"
    r = convert(tiny_dir, out)
    assert r.returncode == 0, r.stderr
    assert rope_keys(out) == {KEYS[0]: "yarn", KEYS[1]: 4.0, KEYS[2]: 64, KEYS[3]: 32.0, KEYS[4]: 1.0}
    # The same file as --rope-scaling yarn:4:64 writes (Makefile's synthetic-tiny-yarn), byte for byte.
    assert out.read_bytes() == model("synthetic-tiny-yarn").read_bytes()
    # --rope-scaling none overrides the config: the plain file, byte for byte.
    r = convert(tiny_dir, out, "--rope-scaling", "none")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == model("synthetic-tiny").read_bytes()


@pytest.mark.parametrize("rs, why", [
    ({"rope_type": "linear", "factor": 4.0}, 'rope_type "linear", expected "yarn"'),
    ({"type": "yarn", "factor": 0.5}, "factor 0.5, expected above 1"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": 0.7}, "mscale set"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": False}, "truncate false set"),
    ({"rope_type": "yarn", "factor": 4.0, "color": 1}, "unknown keys color"),
])
def test_config_rope_scaling_refused(tiny_dir, tmp_path, rs, why):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg["rope_scaling"] = rs
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    r = convert(tiny_dir, tmp_path / "t.gguf")
    assert r.returncode == 1 and why in r.stderr, r.stderr
    assert not (tmp_path / "t.gguf").exists()


def test_converter_bad_flag(tiny_dir, tmp_path):
    r = convert(tiny_dir, tmp_path / "t.gguf", "--rope-scaling", "yarn:4:x")
    assert r.returncode == 1 and "'yarn:4:x'" in r.stderr and "expected" in r.stderr, r.stderr


def logits(stem: str, out: Path, *extra: str) -> np.ndarray:
    r = run(KIPP, "logits", "--model", model(stem), "--backend", "ref", "--threads", "1",
            "--prompt", "The quick brown fox jumps over the lazy dog. " * 8, "--out", out, *extra)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4")


def test_override_equals_file(tmp_path):
    scaled = logits("synthetic-tiny-yarn", tmp_path / "a.f32")
    assert np.array_equal(logits("synthetic-tiny", tmp_path / "b.f32", "--rope-scaling", "yarn:4:64"), scaled)
    plain = logits("synthetic-tiny", tmp_path / "c.f32")
    assert np.array_equal(logits("synthetic-tiny-yarn", tmp_path / "d.f32", "--rope-scaling", "none"), plain)
    assert not np.array_equal(scaled, plain)


def test_inspect_shows_scaling():
    r = run(KIPP, "inspect", model("synthetic-tiny-yarn"))
    assert r.returncode == 0, r.stderr
    assert "context         256 tokens" in r.stdout
    assert "rope scaling    yarn: factor 4 over 64 original tokens (beta_fast 32, beta_slow 1)" in r.stdout


@pytest.mark.parametrize("value", ["yarn", "yarn:1", "yarn:abc", "yarn:4:0", "linear:2", "yarn:65"])
def test_bad_values_named(value):
    for argv in ([KIPP, "generate", "--model", model("synthetic-tiny"), "--prompt", "hi"],
                 [REPO_ROOT / "build" / "kipp-serve", "--model", model("synthetic-tiny")],
                 [REPO_ROOT / "build" / "kipp-bench", "--model", model("synthetic-tiny")]):
        r = run(*argv, "--rope-scaling", value)
        assert r.returncode in (1, 2) and f"'{value}'" in r.stderr and "expected" in r.stderr, (argv[0], r.stderr)


def test_ctx_over_the_limit_named():
    r = run(KIPP, "generate", "--model", model("synthetic-tiny-yarn"), "--prompt", "hi", "--ctx", "257")
    assert r.returncode == 2 and "above 256 tokens, the YaRN limit 64 x 4" in r.stderr, r.stderr
    r = run(KIPP, "generate", "--model", model("synthetic-tiny"), "--prompt", "hi", "--ctx", "5000")
    assert r.returncode == 2 and "above 4096 tokens" in r.stderr and "--rope-scaling" in r.stderr, r.stderr
    r = run(KIPP, "generate", "--model", model("synthetic-tiny"), "--prompt", "hi", "--ctx", "5000",
            "--rope-scaling", "yarn:2", "--max-tokens", "1", "--backend", "ref", "--threads", "1")
    assert r.returncode == 0, r.stderr
    r = run(REPO_ROOT / "build" / "kipp-serve", "--model", model("synthetic-tiny-yarn"), "--ctx", "1000")
    assert r.returncode == 2 and "--ctx 1000 is above 256 tokens, the YaRN limit 64 x 4" in r.stderr, r.stderr
    r = run(KIPP, "generate", "--model", model("synthetic-tiny"), "--prompt", "hi", "--rope-scaling", "yarn:64:32768")
    assert r.returncode != 0 and "2097152" in r.stderr and "1048576" in r.stderr, r.stderr


def _patched(tmp_path: Path, edit) -> Path:
    """synthetic-tiny-yarn.gguf with edit(header bytearray, reader) applied to its metadata, as a new file."""
    from gguf import GGUFReader
    src = model("synthetic-tiny-yarn")
    r = GGUFReader(str(src))
    raw = bytearray(src.read_bytes())
    out = tmp_path / "p.gguf"
    out.write_bytes(edit(raw, r))
    return out


def _drop_key(raw: bytearray, r, key: str) -> bytes:
    """The file without one metadata entry: kv_count - 1, directory re-padded to 64 (data unchanged)."""
    f = r.fields[key]
    off, n = f.offset, sum(p.nbytes for p in f.parts)
    last = r.tensors[-1].field
    dir_end = last.offset + sum(p.nbytes for p in last.parts)
    kv_count = int.from_bytes(raw[16:24], "little") - 1
    head = raw[:16] + kv_count.to_bytes(8, "little") + raw[24:off] + raw[off + n:dir_end]
    head += bytes(-len(head) % 64)
    return bytes(head) + bytes(raw[r.data_offset:])


@pytest.mark.parametrize("case, want", [
    ("drop", "4 of the 5 qwen3.rope.scaling.* keys are present"),
    ("type", "qwen3.rope.scaling.type is 'yarm', expected 'yarn'"),
    ("gguf_type", "metadata key 'qwen3.rope.scaling.factor' has GGUF type u32 (4), expected f32 (6)"),
    ("factor", "YaRN factor 0.5, expected above 1"),
])
def test_loader_refuses_bad_keys(tmp_path, case, want):
    import struct

    def edit(raw: bytearray, r) -> bytes:
        if case == "drop":
            return _drop_key(raw, r, "qwen3.rope.scaling.yarn_beta_slow")
        f = r.fields["qwen3.rope.scaling.type" if case == "type" else "qwen3.rope.scaling.factor"]
        type_at = f.offset + 8 + len(f.name.encode())
        if case == "type":
            raw[type_at + 4 + 8 + 3] = ord("m")  # u32 type, u64 length, "yarn" -> "yarm"
        elif case == "gguf_type":
            raw[type_at:type_at + 4] = struct.pack("<I", 4)
        else:
            raw[type_at + 4:type_at + 8] = struct.pack("<f", 0.5)
        return bytes(raw)

    r = run(KIPP, "inspect", _patched(tmp_path, edit))
    assert r.returncode != 0 and want in r.stderr, r.stderr
