"""test_convert.py - tools/convert_to_gguf.py against docs/FORMAT.md.

Oracles: the `gguf` PyPI package (gguf.GGUFReader) reads our files; tensor bytes
are compared with the safetensors bytes located by a header parse written here;
metadata with tools/checkpoints.py and data/qwen3/qwen3-tokenizer/tokenizer.json.
Refusals run the converter CLI on minimally altered copies of synthetic-tiny and
check the exit status, the message (field, expected, found) and that no output
file is left behind.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf
import pytest

import checkpoints as reg
import convert_to_gguf as cv


REPO = Path(__file__).resolve().parent.parent
CONVERT = REPO / "tools" / "convert_to_gguf.py"

FORMAT_KEYS = [
    "general.architecture", "general.alignment", "general.name", "kipp.format_version", "kipp.checkpoint.id",
    "kipp.source.repository", "kipp.source.revision", "kipp.quant.scheme", "kipp.variant",
    "kipp.chat_template", "kipp.d_model", "kipp.n_layer", "kipp.n_q_head", "kipp.n_kv_head", "kipp.head_dim",
    "kipp.d_ff", "kipp.vocab_size", "kipp.context_length", "kipp.rope_theta", "kipp.rms_norm_eps",
    "kipp.tied_embeddings", "kipp.bos_token_id", "kipp.eos_token_id", "kipp.stop_token_ids",
    "kipp.tokenizer.tokens", "kipp.tokenizer.merges", "kipp.tokenizer.added_ids",
    "kipp.tokenizer.added_special", "kipp.tokenizer.pre_regex", "kipp.tokenizer.normalizer"]
LAYER = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
         "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
HF_OF = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def st_tensors(d: Path) -> dict[str, tuple[list[int], str, bytes]]:
    """name -> (shape, dtype, raw bytes) of every tensor in a checkpoint dir (own parser)."""
    idx = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() \
        else ["model.safetensors"]
    out = {}
    for fn in files:
        raw = (d / fn).read_bytes()
        n = int.from_bytes(raw[:8], "little")
        for k, v in json.loads(raw[8:8 + n]).items():
            if k != "__metadata__":
                b, e = v["data_offsets"]
                out[k] = (v["shape"], v["dtype"], raw[8 + n + b:8 + n + e])
    return out


def expected_names(c: reg.Checkpoint) -> list[tuple[str, str]]:
    """(GGUF name, HF name) in FORMAT.md order, written out independently of the converter."""
    names = [("token_embd.weight", "model.embed_tokens.weight")]
    for i in range(c.n_layer):
        names += [(f"blk.{i}.{t}.weight", f"model.layers.{i}.{HF_OF[t]}.weight") for t in LAYER]
    names.append(("output_norm.weight", "model.norm.weight"))
    if not c.tied_embeddings:
        names.append(("output.weight", "lm_head.weight"))
    return names


def field_value(r, key):
    return r.fields[key].contents()


@pytest.fixture(scope="module")
def reader(synthetic_gguf):
    """id -> gguf.GGUFReader of the converted file (opened once: the reader is slow on 300k strings)."""
    cache: dict = {}

    def get(id_: str):
        if id_ not in cache:
            cache[id_] = gguf.GGUFReader(str(synthetic_gguf(id_)))
        return cache[id_]
    return get


@pytest.mark.parametrize("id_", ["synthetic-tiny", "synthetic-tiny-untied"])
def test_round_trip_with_gguf_reader(id_, synthetic_dir, synthetic_gguf, reader):
    c = reg.by_id(id_)
    path = synthetic_gguf(id_)
    r = reader(id_)
    src = st_tensors(synthetic_dir(id_))
    names = expected_names(c)
    assert [t.name for t in r.tensors] == [g for g, _ in names]
    assert r.data_offset % 64 == 0
    for t, (_, hf) in zip(r.tensors, names):
        shape, dtype, raw = src[hf]
        assert dtype == "BF16" and t.tensor_type == gguf.GGMLQuantizationType.BF16
        assert list(t.shape) == list(reversed(shape))  # GGUF: fastest-varying dimension first
        assert t.data_offset % 64 == 0
        assert np.asarray(t.data).tobytes() == raw, f"{t.name} bytes differ from {hf}"
    last = r.tensors[-1]
    assert os.path.getsize(path) - (last.data_offset + last.n_bytes) < 64


@pytest.mark.parametrize("id_", ["synthetic-tiny", "synthetic-tiny-untied"])
def test_metadata_per_format(id_, reader, qwen3_data):
    c = reg.by_id(id_)
    r = reader(id_)
    assert list(r.fields)[3:] == FORMAT_KEYS  # the reader adds GGUF.version/tensor_count/kv_count
    want = {"general.architecture": "qwen3", "general.alignment": 64, "general.name": c.id,
            "kipp.format_version": 1, "kipp.checkpoint.id": c.id, "kipp.source.repository": c.repository,
            "kipp.source.revision": c.revision, "kipp.quant.scheme": "bf16", "kipp.variant": c.variant,
            "kipp.chat_template": c.chat_template, "kipp.d_model": c.d_model, "kipp.n_layer": c.n_layer,
            "kipp.n_q_head": c.n_q_head, "kipp.n_kv_head": 8, "kipp.head_dim": 128, "kipp.d_ff": c.d_ff,
            "kipp.vocab_size": 151936, "kipp.context_length": c.context_length,
            "kipp.tied_embeddings": c.tied_embeddings, "kipp.bos_token_id": 151643,
            "kipp.eos_token_id": c.eos_token_id, "kipp.stop_token_ids": list(c.stop_token_ids),
            "kipp.tokenizer.normalizer": "NFC"}
    for k, v in want.items():
        assert field_value(r, k) == v, k
    types = gguf.GGUFValueType
    assert r.fields["general.alignment"].types == [types.UINT32]
    assert r.fields["kipp.rope_theta"].types == [types.FLOAT32]
    assert field_value(r, "kipp.rope_theta") == pytest.approx(c.rope_theta, rel=1e-7)
    assert field_value(r, "kipp.rms_norm_eps") == pytest.approx(1e-6, rel=1e-6)
    assert r.fields["kipp.tied_embeddings"].types == [types.BOOL]
    tok = json.loads((qwen3_data / "qwen3-tokenizer" / "tokenizer.json").read_text())
    tokens = field_value(r, "kipp.tokenizer.tokens")
    assert len(tokens) == 151669
    for text, tid in list(tok["model"]["vocab"].items())[::997]:
        assert tokens[tid] == text
    assert tokens[151643] == "<|endoftext|>" and tokens[151667] == "<think>"
    merges = field_value(r, "kipp.tokenizer.merges")
    assert len(merges) == len(tok["model"]["merges"]) and merges[0] == "Ġ Ġ"
    assert merges[-1] == " ".join(tok["model"]["merges"][-1])
    assert field_value(r, "kipp.tokenizer.added_ids") == list(range(151643, 151669))
    special = field_value(r, "kipp.tokenizer.added_special")
    assert special[151644 - 151643] is True and special[151667 - 151643] is False
    assert field_value(r, "kipp.tokenizer.pre_regex") == tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]


# ---------------------------------------------------------------- refusals

def tiny_copy(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint dir whose big files are symlinks (cheap to alter one file)."""
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).symlink_to(p)
    return dst


def replace_file(path: Path, data: bytes | str) -> None:
    path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def rewrite_safetensors(path: Path, edit, extra: bytes = b"") -> None:
    """Rewrite a (possibly symlinked) safetensors file with an edited header (+ appended data)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    hdr = edit(json.loads(raw[8:8 + n]), len(raw) - 8 - n)
    text = json.dumps(hdr).encode()
    text += b" " * (-len(text) % 8)
    replace_file(path, len(text).to_bytes(8, "little") + text + raw[8 + n:] + extra)


def drop_tensor(path: Path, name: str) -> None:
    """Remove one tensor and its bytes, shifting the later offsets so the data stays tiled."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    b, e = hdr.pop(name)["data_offsets"]
    for k, v in hdr.items():
        if k != "__metadata__" and v["data_offsets"][0] >= e:
            v["data_offsets"] = [o - (e - b) for o in v["data_offsets"]]
    text = json.dumps(hdr).encode()
    text += b" " * (-len(text) % 8)
    replace_file(path, len(text).to_bytes(8, "little") + text + raw[8 + n:8 + n + b] + raw[8 + n + e:])


def run_convert(indir: Path, out: Path, *extra: str, id_: str = "synthetic-tiny") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CONVERT), "--checkpoint", id_, "--input", str(indir),
                           "--out", str(out), "--quiet", *extra], capture_output=True, text=True)


def assert_refused(r: subprocess.CompletedProcess, out: Path, *needles: str) -> None:
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in r.stderr, f"{n!r} not in: {r.stderr}"
    assert not out.exists() and not out.with_name(out.name + ".part").exists()


@pytest.mark.parametrize("field,value,found", [
    ("hidden_size", 512, "512"), ("num_hidden_layers", 3, "3"), ("num_attention_heads", 8, "8"),
    ("num_key_value_heads", 4, "4"), ("head_dim", 64, "64"), ("intermediate_size", 1024, "1024"),
    ("vocab_size", 151669, "151669"), ("max_position_embeddings", 40960, "40960"),
    ("rope_theta", 10000.0, "10000.0"), ("rms_norm_eps", 1e-5, "1e-05"),
    ("tie_word_embeddings", False, "false"), ("eos_token_id", 151643, "151643"),
    ("bos_token_id", 1, "1"), ("architectures", ["Qwen2ForCausalLM"], '["Qwen2ForCausalLM"]'),
    ("torch_dtype", "float16", '"float16"'), ("attention_bias", True, "true"),
    ("use_sliding_window", True, "true"),
])  # rope_scaling is read, not compared (docs/FORMAT.md "RoPE scaling"): tests/test_yarn_cli.py
def test_config_mismatch_refused(field, value, found, synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")
    cfg = json.loads((d / "config.json").read_text())
    expected = json.dumps(cfg[field])
    cfg[field] = value
    replace_file(d / "config.json", json.dumps(cfg))
    out = tmp_path / "x.gguf"
    r = run_convert(d, out)
    assert_refused(r, out, f"{field}: expected", found)
    if field not in ("use_sliding_window", "torch_dtype"):
        assert f"{field}: expected {expected}, found {found}" in r.stderr


def test_config_missing_field_refused(synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["intermediate_size"]
    replace_file(d / "config.json", json.dumps(cfg))
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(d, out), out, "intermediate_size: expected 512, found missing")


def test_wrong_checkpoint_id_for_input_refused(synthetic_dir, tmp_path):
    out = tmp_path / "x.gguf"
    r = run_convert(synthetic_dir("synthetic-tiny"), out, id_="synthetic-tiny-untied")
    assert_refused(r, out, "hidden_size: expected 384, found 256", "tie_word_embeddings: expected false")


def test_unknown_tensor_refused(synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")

    def add_bias(h, n):
        h["model.layers.0.self_attn.q_proj.bias"] = {"dtype": "BF16", "shape": [2048], "data_offsets": [n, n + 4096]}
        return h
    rewrite_safetensors(d / "model.safetensors", add_bias, bytes(4096))
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(d, out), out, "unknown tensor(s) model.layers.0.self_attn.q_proj.bias")


def test_missing_tensor_refused(synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")

    drop_tensor(d / "model.safetensors", "model.layers.1.mlp.up_proj.weight")
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(d, out), out, "missing tensor(s) model.layers.1.mlp.up_proj.weight")


def test_wrong_dtype_and_shape_refused(synthetic_dir, tmp_path):
    for i, (key, val, needle) in enumerate([
            ("dtype", "F16", "model.norm.weight has dtype F16; expected BF16"),
            ("shape", [128, 2], "model.norm.weight has shape [128, 2]; expected [256]")]):
        d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / f"in{i}")

        def edit(h, n):
            h["model.norm.weight"][key] = val
            return h
        rewrite_safetensors(d / "model.safetensors", edit)
        out = tmp_path / f"x{i}.gguf"
        assert_refused(run_convert(d, out), out, needle)


def test_tied_lm_head_copy_accepted_and_dropped(synthetic_dir, synthetic_gguf, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")

    emb = st_tensors(synthetic_dir("synthetic-tiny"))["model.embed_tokens.weight"][2]

    def add_copy(h, n):  # the real 0.6B ships a duplicate lm_head: same bytes as the embedding
        h["lm_head.weight"] = dict(h["model.embed_tokens.weight"], data_offsets=[n, n + len(emb)])
        return h
    rewrite_safetensors(d / "model.safetensors", add_copy, emb)
    out = tmp_path / "x.gguf"
    r = run_convert(d, out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == synthetic_gguf("synthetic-tiny").read_bytes()


def test_tied_lm_head_mismatch_refused(synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")
    src = st_tensors(synthetic_dir("synthetic-tiny"))["model.embed_tokens.weight"][2]
    head = bytearray(src)
    head[12345] ^= 0x01

    def add_head(h, n):
        h["lm_head.weight"] = {"dtype": "BF16", "shape": [151936, 256], "data_offsets": [n, n + len(head)]}
        return h
    rewrite_safetensors(d / "model.safetensors", add_head, bytes(head))
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(d, out), out, "lm_head.weight differs from model.embed_tokens.weight",
                   "byte-identical")


def test_sharded_index_inconsistency_refused(synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny-untied"), tmp_path / "in")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors"
    replace_file(d / "model.safetensors.index.json", json.dumps(idx))
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(d, out, id_="synthetic-tiny-untied"), out,
                   "model.norm.weight is in model-00002-of-00003.safetensors")


def test_unknown_quant_scheme_refused(synthetic_dir, tmp_path):
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(synthetic_dir("synthetic-tiny"), out, "--quant", "fp8"), out,
                   "--quant is 'fp8'; expected one of bf16, q8_0, affine4_gs32")


@pytest.mark.parametrize("scheme,gtype", [("q8_0", 8), ("affine4_gs32", 3)])
def test_quantized_conversion_read_by_gguf(scheme, gtype, synthetic_dir, tmp_path):
    """Seed 000 "Weight quantization": only the seven projections are quantized, with
    their GGML type; the gguf package's own dequantizer reproduces the weights within
    the block error; the sidecar's NMSE matches an independent recomputation."""
    src = synthetic_dir("synthetic-tiny")
    out = tmp_path / f"tiny-{scheme}.gguf"
    r = run_convert(src, out, "--quant", scheme)
    assert r.returncode == 0, r.stderr
    rd = gguf.GGUFReader(out)
    assert field_value(rd, "kipp.quant.scheme") == scheme
    st = st_tensors(src)
    hf_of = dict(expected_names(reg.by_id("synthetic-tiny")))
    side = json.loads((tmp_path / f"tiny-{scheme}.gguf.quant.json").read_text())
    n_quant = 0
    for t in rd.tensors:
        quantized = cv.is_quantizable(t.name)
        assert int(t.tensor_type) == (gtype if quantized else 30), t.name
        if not quantized:
            continue
        n_quant += 1
        shape, _, raw = st[hf_of[t.name]]
        w = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        err = float(np.sum((w.astype(np.float64) - deq) ** 2) / np.sum(w.astype(np.float64) ** 2))
        assert err == pytest.approx(side["tensors"][t.name]["nmse"], rel=1e-6)
        assert err < (1e-4 if scheme == "q8_0" else 1e-2), (t.name, err)
    assert n_quant == 7 * reg.by_id("synthetic-tiny").n_layer == side["quantized_tensors"]


@pytest.mark.parametrize("ckpt,scheme,head,gtype", [("synthetic-tiny", "q8_0", "q8_0", 8),
                                                    ("synthetic-tiny", "affine4_gs32", "affine4_gs32", 3),
                                                    ("synthetic-tiny-untied", "bf16", "q8_0", 8)])
def test_quant_head_conversion(ckpt, scheme, head, gtype, synthetic_dir, tmp_path):
    """--quant-head: kipp.quant.head follows kipp.quant.scheme; output.weight
    (for a tied checkpoint: a separate copy of the embedding, after output_norm) has
    the head's GGML type and dequantizes (gguf package) to the source head within
    the block error; token_embd stays BF16 and byte-identical; the sidecar has the
    head's NMSE. Every other tensor is as without the option."""
    src = synthetic_dir(ckpt)
    out = tmp_path / "h.gguf"
    r = run_convert(src, out, "--quant", scheme, "--quant-head", head, id_=ckpt)
    assert r.returncode == 0, r.stderr
    rd = gguf.GGUFReader(out)
    keys = [f.name for f in rd.fields.values() if not f.name.startswith("GGUF.")]
    assert keys[keys.index("kipp.quant.scheme") + 1] == "kipp.quant.head"
    assert field_value(rd, "kipp.quant.head") == head
    c = reg.by_id(ckpt)
    names = [t.name for t in rd.tensors]
    assert names[-2:] == ["output_norm.weight", "output.weight"]
    assert len(names) == 3 + 11 * c.n_layer
    st = st_tensors(src)
    by = {t.name: t for t in rd.tensors}
    hf = "model.embed_tokens.weight" if c.tied_embeddings else "lm_head.weight"
    shape, _, raw = st[hf]
    assert int(by["output.weight"].tensor_type) == gtype
    assert int(by["token_embd.weight"].tensor_type) == 30
    assert bytes(by["token_embd.weight"].data.tobytes()) == st["model.embed_tokens.weight"][2]
    w = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    deq = gguf.quants.dequantize(by["output.weight"].data, by["output.weight"].tensor_type).reshape(shape)
    err = float(np.sum((w.astype(np.float64) - deq) ** 2) / np.sum(w.astype(np.float64) ** 2))
    side = json.loads((tmp_path / "h.gguf.quant.json").read_text())
    assert side["head"] == head and err == pytest.approx(side["head_nmse"], rel=1e-6)
    assert err < (1e-4 if head == "q8_0" else 1e-2)
    proj = 8 if scheme == "q8_0" else 3 if scheme == "affine4_gs32" else 30
    for t in rd.tensors:
        if t.name != "output.weight":
            assert int(t.tensor_type) == (proj if cv.is_quantizable(t.name) else 30), t.name


def test_quant_head_refused(synthetic_dir, tmp_path):
    out = tmp_path / "x.gguf"
    for bad in ("bf16", "q4_0"):
        assert_refused(run_convert(synthetic_dir("synthetic-tiny"), out, "--quant-head", bad), out,
                       f"--quant-head is '{bad}'; expected one of q8_0, affine4_gs32")


def test_unknown_checkpoint_and_missing_input(tmp_path):
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(tmp_path, out, id_="qwen3-99b"), out, "unknown checkpoint id 'qwen3-99b'")
    assert_refused(run_convert(tmp_path / "nope", out), out, "does not exist")


# ---------------------------------------------------------------- safetensors header strictness
# Each malformed file is checked against the safetensors library itself (the oracle:
# it must refuse the file too) and against the converter's own parser.

ST_GOOD = {"a": ("F32", [2, 3], 0, 24), "b": ("I32", [4], 24, 40), "c": ("F32", [2], 40, 48)}


def st_header(entries: dict) -> bytes:
    return json.dumps({k: {"dtype": d, "shape": s, "data_offsets": [b, e]}
                       for k, (d, s, b, e) in entries.items()}).encode()


def st_file(path: Path, text: bytes, data: bytes, hlen: int | None = None) -> Path:
    """A safetensors file with header text `text`, its length field `hlen` (default: true length)."""
    path.write_bytes((len(text) if hlen is None else hlen).to_bytes(8, "little") + text + data)
    return path


def st_data() -> bytes:
    return bytes(range(48))


def _edit(**changes):
    return st_header({**ST_GOOD, **changes})


ST_BAD = {  # case -> (header text, data, length field or None, needle in our message)
    "begin_shifted": (_edit(a=("F32", [2, 3], 2, 26), b=("I32", [4], 26, 42), c=("F32", [2], 42, 50)),
                      st_data() + b"\0\0", None, "leaves a gap of 2 bytes"),
    "gap_between": (_edit(c=("F32", [2], 41, 49)), st_data() + b"\0", None, "tensor c data_offsets [41, 49] leaves a gap"),
    "overlap": (_edit(b=("I32", [4], 20, 36), c=("F32", [2], 36, 44)), st_data()[:44], None, "overlaps"),
    "alias": (_edit(c=("F32", [2], 0, 8)), st_data()[:40], None, "overlaps"),
    "duplicate_name": (st_header(ST_GOOD)[:-1] + b', "a": {"dtype": "F32", "shape": [2], "data_offsets": [48, 56]}}',
                       st_data() + bytes(8), None, "'a' appears twice"),
    "trailing_data": (st_header(ST_GOOD), st_data() + b"\0", None, "data section after the"),
    "data_short": (st_header(ST_GOOD), st_data()[:47], None, "tensors cover 48 bytes but the data section"),
    "hlen_minus_1": (st_header(ST_GOOD) + b" ", st_data(), len(st_header(ST_GOOD)), "data section"),
    "hlen_plus_1": (st_header(ST_GOOD), st_data(), len(st_header(ST_GOOD)) + 1, "not valid JSON"),
    "hlen_past_file": (st_header(ST_GOOD), st_data(), 10 ** 6, "header length 1000000 does not fit"),
    "hlen_over_limit": (st_header(ST_GOOD), st_data(), 100_000_001, "header length 100000001"),
    "nul_padding": (st_header(ST_GOOD) + b"\0\0", st_data(), None, "padded only with whitespace"),
    "junk_padding": (st_header(ST_GOOD) + b" x", st_data(), None, "not valid JSON"),
    "not_utf8": (st_header(ST_GOOD).replace(b'"a"', b'"a\xff"'), st_data(), None, "not valid UTF-8"),
    "not_object": (b"[1, 2]", b"", None, "header is a list"),
    "nan_offset": (st_header(ST_GOOD).replace(b"[40, 48]", b"[40, NaN]"), st_data(), None, "NaN"),
    "float_offset": (st_header(ST_GOOD).replace(b"[40, 48]", b"[40, 48.0]"), st_data(), None,
                     "data_offsets [40, 48.0]; expected [begin, end] non-negative integers"),
    "three_offsets": (st_header(ST_GOOD).replace(b"[40, 48]", b"[40, 48, 56]"), st_data(), None,
                      "data_offsets [40, 48, 56]"),
    "negative_dim": (st_header(ST_GOOD).replace(b"[2, 3]", b"[-2, -3]"), st_data(), None, "shape [-2, -3]"),
    "string_dim": (st_header(ST_GOOD).replace(b"[2, 3]", b'["2", 3]'), st_data(), None, "shape ['2', 3]"),
    "size_vs_shape": (_edit(a=("F32", [2, 2], 0, 24)), st_data(), None, "span 24 bytes; expected 16 for F32 [2, 2]"),
    "unknown_dtype": (_edit(a=("Q4", [2, 3], 0, 24)), st_data(), None, "unknown dtype 'Q4'"),
    "missing_field": (st_header(ST_GOOD).replace(b'"shape": [4], ', b""), st_data(), None,
                      "tensor b has a malformed header entry"),
    "metadata_not_strings": (b'{"__metadata__": {"k": 1}, ' + st_header(ST_GOOD)[1:], st_data(), None,
                             "__metadata__ is {'k': 1}"),
}


@pytest.mark.parametrize("case", sorted(ST_BAD))
def test_malformed_safetensors_refused_like_the_library(case, tmp_path):
    from safetensors import SafetensorError, safe_open
    text, data, hlen, needle = ST_BAD[case]
    path = st_file(tmp_path / "m.safetensors", text, data, hlen)
    with pytest.raises(SafetensorError):  # the oracle refuses it too
        with safe_open(str(path), framework="numpy") as f:
            [f.get_tensor(k) for k in f.keys()]
    with pytest.raises(cv.ConvertError) as e:
        cv.read_safetensors_header(path)
    assert needle in str(e.value) and "m.safetensors" in str(e.value)


def test_wellformed_safetensors_located_like_the_library(tmp_path):
    """Positive control: offsets listed out of order and whitespace around the JSON are valid."""
    from safetensors import safe_open
    entries = dict(reversed(list(ST_GOOD.items())))
    text = b" \n" + st_header(entries) + b"\t \r\n"
    path = st_file(tmp_path / "g.safetensors", text, st_data())
    got = cv.read_safetensors_header(path)
    raw = path.read_bytes()
    with safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(got)
        for k, t in got.items():
            assert raw[t.begin:t.begin + t.nbytes] == f.get_tensor(k).tobytes()
            assert (t.dtype, list(t.shape)) == ST_GOOD[k][:2]
    assert cv.read_safetensors_header(st_file(tmp_path / "e.safetensors", b"{}", b"")) == {}


def _embedding_shifted(raw: bytes) -> bytes:
    """The tester's repro: embedding data_offsets [0, E] -> [2, E + 2], padded to the same length."""
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    e = hdr["model.embed_tokens.weight"]["data_offsets"][1]
    old = f'"data_offsets":[0,{e}]'.encode()
    text = raw[8:8 + n].replace(b" ", b"")
    assert old in text, "make_checkpoint's header layout changed; update this repro"
    text = text.replace(old, f'"data_offsets":[2,{e + 2}]'.encode())
    return n.to_bytes(8, "little") + text.ljust(n) + raw[8 + n:]


def _hlen_minus_one(raw: bytes) -> bytes:
    n = int.from_bytes(raw[:8], "little")
    assert raw[8 + n - 1:8 + n] == b" ", "the header must end in padding for this repro"
    return (n - 1).to_bytes(8, "little") + raw[8:]


@pytest.mark.parametrize("corrupt,needle", [
    (_embedding_shifted, "model.embed_tokens.weight data_offsets [2, "),
    (_hlen_minus_one, "but the data section after the"),
])
def test_corrupt_synthetic_tiny_refused(corrupt, needle, synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")
    replace_file(d / "model.safetensors", corrupt((d / "model.safetensors").read_bytes()))
    out = tmp_path / "x.gguf"
    assert_refused(run_convert(d, out), out, "model.safetensors: ", needle)


def test_output_path_checked_before_converting(synthetic_dir, tmp_path):
    d = tiny_copy(synthetic_dir("synthetic-tiny"), tmp_path / "in")
    replace_file(d / "config.json", "not json")  # conversion would fail here; the --out check comes first
    missing = tmp_path / "no" / "such" / "w.gguf"
    assert_refused(run_convert(d, missing), missing, f"--out {missing}: directory {missing.parent} does not exist")
    assert not (tmp_path / "no").exists()  # no silent mkdir -p
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    r = run_convert(d, outdir)
    assert r.returncode == 1 and f"--out {outdir} is a directory" in r.stderr, r.stderr
    assert "Errno" not in r.stderr and list(outdir.iterdir()) == []
    os.mkfifo(tmp_path / "fifo")
    r = run_convert(d, tmp_path / "fifo")
    assert r.returncode == 1 and "is not a regular file" in r.stderr, r.stderr


# ---------------------------------------------------------------- tokenizer merge

@pytest.fixture(scope="module")
def tokenizer_files(qwen3_data):
    t = qwen3_data / "qwen3-tokenizer"
    return (json.loads((t / "tokenizer.json").read_text()), json.loads((t / "tokenizer_config.json").read_text()))


def test_added_tokens_decoder_merged_over_tokenizer_json(tokenizer_files):
    tok, cfg = copy.deepcopy(tokenizer_files[0]), tokenizer_files[1]
    # An older tokenizer.json without the think/tool tokens, and a wrong special flag:
    tok["added_tokens"] = [a for a in tok["added_tokens"] if a["id"] < 151665]
    next(a for a in tok["added_tokens"] if a["id"] == 151657)["special"] = True  # <tool_call>
    td = cv.build_tokenizer(tok, cfg)
    assert len(td.tokens) == 151669
    assert td.tokens[151667] == "<think>" and td.tokens[151668] == "</think>"
    flags = dict(zip(td.added_ids, td.added_special))
    assert flags[151667] is cfg["added_tokens_decoder"]["151667"]["special"] is False
    assert flags[151657] is False and flags[151645] is True  # config wins over tokenizer.json
    with pytest.raises(cv.ConvertError, match="added tokens have ids"):
        cv.build_tokenizer(tok, {})  # without the config the think tokens are missing


def test_tokenizer_merges_as_strings_or_pairs_and_missing_ids(tokenizer_files):
    tok, cfg = tokenizer_files
    as_pairs = cv.build_tokenizer(tok, cfg)
    tok2 = dict(tok, model=dict(tok["model"], merges=[" ".join(m) for m in tok["model"]["merges"]]))
    assert cv.build_tokenizer(tok2, cfg).merges == as_pairs.merges
    vocab = dict(tok["model"]["vocab"])
    gone = next(k for k, v in vocab.items() if v == 4242)
    del vocab[gone]
    tok3 = dict(tok, model=dict(tok["model"], vocab=vocab))
    with pytest.raises(cv.ConvertError, match="token id 4242 has no entry"):
        cv.build_tokenizer(tok3, cfg)
    tok4 = dict(tok, model=dict(tok["model"], merges=["a b c"]))
    with pytest.raises(cv.ConvertError, match="merge 0 is 'a b c'"):
        cv.build_tokenizer(tok4, cfg)


# ---- retrieval checkpoints in their Hub layouts (issue 56; docs/FORMAT.md "Retrieval checkpoints") ----

def _retrieval_variant(id_: str, **changes) -> reg.Checkpoint:
    """A tiny retrieval twin with other Hub facts (not a registry entry: convert() takes the object)."""
    import dataclasses
    return dataclasses.replace(reg.by_id(id_), **changes)


def _make(c: reg.Checkpoint, d: Path) -> Path:
    import make_checkpoint
    make_checkpoint.write_checkpoint(c, d)
    return d


def _assert_padded(r: gguf.GGUFReader, gname: str, raw: bytes, hub_rows: int, d: int) -> None:
    """The GGUF tensor is the Hub tensor's rows, then zero rows up to 151936."""
    t = next(t for t in r.tensors if t.name == gname)
    assert list(t.shape) == [d, 151936] and t.tensor_type == gguf.GGMLQuantizationType.BF16
    data = np.asarray(t.data).tobytes()
    assert data[:len(raw)] == raw and len(raw) == 2 * hub_rows * d
    assert data[len(raw):] == bytes(2 * (151936 - hub_rows) * d), f"{gname}: padding rows are not zero"


@pytest.mark.parametrize("id_,prefix,files", [
    ("synthetic-tiny-embedding", "", {"modules.json", "1_Pooling", "config_sentence_transformers.json"}),
    ("synthetic-tiny-reranker", "model.", set())])
def test_retrieval_twin_hub_layout(id_, prefix, files, synthetic_dir, synthetic_gguf, reader):
    """Embedding twin: a Qwen3Model file (no "model." prefix, no lm_head) with the sentence-transformers
    files; reranker twin: a Qwen3ForCausalLM file. Both hold 151669 rows, padded with zero rows."""
    c, d = reg.by_id(id_), synthetic_dir(id_)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["vocab_size"] == 151669 and cfg["tie_word_embeddings"] is True
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    src = st_tensors(d)
    assert "lm_head.weight" not in src
    assert sorted(n for n in src if "layers" not in n) == [prefix + "embed_tokens.weight", prefix + "norm.weight"]
    assert all(n.startswith(prefix + "layers.") for n in src if "layers" in n)
    assert files <= {p.name for p in d.iterdir()}
    if files:
        pool = json.loads((d / "1_Pooling" / "config.json").read_text())
        assert pool["pooling_mode_lasttoken"] is True and pool["word_embedding_dimension"] == c.d_model
        assert not any(v for k, v in pool.items() if k.startswith("pooling_mode_") and k != "pooling_mode_lasttoken")
        prompts = json.loads((d / "config_sentence_transformers.json").read_text())["prompts"]
        assert prompts["query"].endswith("\nQuery:") and prompts["document"] == ""
    shape, _, raw = src[prefix + "embed_tokens.weight"]
    assert shape == [151669, c.d_model]
    r = reader(id_)
    _assert_padded(r, "token_embd.weight", raw, 151669, c.d_model)
    assert [t.name for t in r.tensors] == [g for g, _ in expected_names(c)]
    for t, (g, hf) in zip(r.tensors[1:], expected_names(c)[1:]):
        assert np.asarray(t.data).tobytes() == src[hf.replace("model.", prefix, 1)][2], g
    assert field_value(r, "kipp.variant") == c.variant and field_value(r, "kipp.vocab_size") == 151936


def test_untied_embedding_without_lm_head_is_written_tied(tmp_path):
    """Qwen3-Embedding-8B's shape of Hub file on the tiny shape: tie_word_embeddings false, 151665 rows,
    no lm_head. The Kipp file is tied (token_embd only, no output.weight), as registry entry
    qwen3-embedding-8b says (tied_embeddings true, hub_tied false)."""
    real = reg.by_id("qwen3-embedding-8b")
    assert (real.tied_embeddings, real.hub_tie, real.hub_rows, real.hub_lm_head) == (True, False, 151665, False)
    c = _retrieval_variant("synthetic-tiny-embedding", hub_tied=False, hub_vocab_rows=151665)
    d = _make(c, tmp_path / "in")
    cfg = json.loads((d / "config.json").read_text())
    assert (cfg["tie_word_embeddings"], cfg["vocab_size"]) == (False, 151665)
    src = st_tensors(d)
    assert "lm_head.weight" not in src and src["embed_tokens.weight"][0] == [151665, 256]
    out = tmp_path / "e8.gguf"
    assert cv.convert(c, d, out) == 1 + 11 * c.n_layer + 1
    r = gguf.GGUFReader(str(out))
    assert field_value(r, "kipp.tied_embeddings") is True
    assert "output.weight" not in [t.name for t in r.tensors]
    _assert_padded(r, "token_embd.weight", src["embed_tokens.weight"][2], 151665, 256)
    # The same directory under an entry that expects the tied Hub config is refused by field.
    with pytest.raises(cv.ConvertError, match=r"tie_word_embeddings: expected true, found false"):
        cv.convert(reg.by_id("synthetic-tiny-embedding"), d, tmp_path / "x.gguf")


def test_untied_reranker_lm_head_padded(tmp_path):
    """Qwen3-Reranker-8B's layout on the tiny shape: an untied Qwen3ForCausalLM with lm_head [151669, d];
    output.weight is padded with zero rows (logits 0 there; a reranker reads only yes/no)."""
    c = _retrieval_variant("synthetic-tiny-reranker", tied_embeddings=False)
    d = _make(c, tmp_path / "in")
    src = st_tensors(d)
    assert src["lm_head.weight"][0] == [151669, 256] and "model.embed_tokens.weight" in src
    out = tmp_path / "r8.gguf"
    cv.convert(c, d, out)
    r = gguf.GGUFReader(str(out))
    _assert_padded(r, "output.weight", src["lm_head.weight"][2], 151669, 256)
    _assert_padded(r, "token_embd.weight", src["model.embed_tokens.weight"][2], 151669, 256)
    yes_no = [9693, 2152]  # "yes", "no": ids of the vendored tokenizer, below 151669
    tok = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
    assert [tok["yes"], tok["no"]] == yes_no


def test_retrieval_layout_refusals(synthetic_dir, tmp_path):
    emb, rr = synthetic_dir("synthetic-tiny-embedding"), synthetic_dir("synthetic-tiny-reranker")
    out = tmp_path / "x.gguf"
    # An embedding directory under a reranker entry: its sentence-transformers files say what it is...
    assert_refused(run_convert(emb, out, id_="synthetic-tiny-reranker"), out,
                   "sentence-transformers modules.json", "synthetic-tiny-reranker is a reranker checkpoint")
    # ... and without them, the unprefixed names do.
    d = tmp_path / "emb"
    d.mkdir()
    for p in emb.iterdir():
        if p.name not in ("modules.json", "1_Pooling", "config_sentence_transformers.json"):
            (d / p.name).symlink_to(p)
    assert_refused(run_convert(d, out, id_="synthetic-tiny-reranker"), out,
                   "lack the 'model.' prefix", "a Qwen3ForCausalLM file")
    # A Qwen3ForCausalLM directory under an embedding entry.
    assert_refused(run_convert(rr, out, id_="synthetic-tiny-embedding"), out,
                   "carry the 'model.' prefix", "Qwen3Model")
    # Mean pooling is not what Kipp computes.
    d2 = tiny_copy(emb, tmp_path / "mean")
    (d2 / "1_Pooling").unlink()
    (d2 / "1_Pooling").mkdir()
    pool = json.loads((emb / "1_Pooling" / "config.json").read_text())
    pool["pooling_mode_mean_tokens"] = True
    (d2 / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    assert_refused(run_convert(d2, out, id_="synthetic-tiny-embedding"), out,
                   "pooling_mode_mean_tokens", "expected only pooling_mode_lasttoken")
    # An embedding file has no head to quantize.
    assert_refused(run_convert(emb, out, "--quant-head", "q8_0", id_="synthetic-tiny-embedding"), out,
                   "embedding model", "omit --quant-head")
    # A generation checkpoint's full-vocabulary config is not a retrieval twin's.
    assert_refused(run_convert(synthetic_dir("synthetic-tiny"), out, id_="synthetic-tiny-embedding"), out,
                   "vocab_size: expected 151669, found 151936")


def test_untied_embedding_with_lm_head_refused(tmp_path):
    c = _retrieval_variant("synthetic-tiny-embedding", hub_tied=False, hub_vocab_rows=151665)
    d = _make(c, tmp_path / "in")
    emb = st_tensors(d)["embed_tokens.weight"][2]

    def add_head(h, n):
        h["lm_head.weight"] = {"dtype": "BF16", "shape": [151665, 256], "data_offsets": [n, n + len(emb)]}
        return h
    rewrite_safetensors(d / "model.safetensors", add_head, emb)
    with pytest.raises(cv.ConvertError, match="has no head"):
        cv.convert(c, d, tmp_path / "x.gguf")
