#!/usr/bin/env python3
"""convert_to_gguf.py - BF16 safetensors checkpoint -> one Kipp GGUF file (docs/FORMAT.md).

Seed 000, "Conversion boundary" and "Strict GGUF subset".
    convert_to_gguf.py --checkpoint ID --input DIR --out FILE [--quant bf16|q8_0|affine4_gs32]
                       [--quant-head q8_0|affine4_gs32] [--quiet]

1. config.json is validated against the registry entry (tools/checkpoints.py);
   every mismatch is refused naming the field, the expected and the found value.
2. Safetensors (single file or sharded with model.safetensors.index.json) are
   read from their headers; every tensor must be one the entry expects, BF16,
   with its exact shape. A tied checkpoint's lm_head.weight is accepted only if
   byte-identical to the embedding, and then dropped. Retrieval entries are read in
   their Hub layouts (docs/FORMAT.md "Retrieval checkpoints"): Qwen3-Embedding names
   without "model." and no lm_head, 151669 (or 151665) rows padded with zero rows to
   151936; an embedding file is always written tied (token_embd only).
3. The tokenizer is rebuilt from tokenizer.json with tokenizer_config.json's
   added_tokens_decoder merged over its added tokens, as upstream does.
4. The GGUF v3 file (64-byte alignment) is written by the small writer below
   (not gguf.GGUFWriter, so the `gguf` package stays an independent reader in
   the tests). With --quant bf16 tensor bytes are copied verbatim: no float
   conversion. With --quant q8_0 / affine4_gs32 the seven per-layer projections
   (attn_q/k/v/output, ffn_gate/up/down) are quantized in 32-weight blocks
   (seed 000 "Weight quantization"; tools/quant_blocks.py holds the block
   encoders, the same arithmetic as the kernels' from_f32), every other tensor
   stays BF16, and FILE.quant.json records each quantized tensor's NMSE.
   --quant-head (opt-in; docs/FORMAT.md "Quantized head") also
   quantizes the output head, output.weight, into that format and writes
   kipp.quant.head; a tied checkpoint then gets its own output.weight (the
   embedding's weights, quantized) while token_embd stays BF16 for the lookup.
   The file
   is written as FILE.part and renamed, so a failure never leaves a bad FILE.
   FILE's directory must already exist and FILE must not be a directory or
   other non-regular file; this is checked before any conversion work.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as reg  # noqa: E402
import st_config  # noqa: E402
import yarn_config as yc  # noqa: E402
from safe_io import SameFileError, atomic_output, refuse_same_file, term_escape  # noqa: E402

ALIGNMENT = 64               # docs/FORMAT.md: one cache line, one zmm load
FORMAT_VERSION = 1           # kipp.format_version
GGUF_VERSION = 3
COPY_CHUNK = 16 << 20        # bytes per read while copying tensor data
MAX_HEADER = 100_000_000     # a larger safetensors JSON header is refused (the library's limit)

# GGUF metadata value types.
T_U32, T_F32, T_BOOL, T_STRING, T_ARRAY = 4, 6, 7, 8, 9

import quant_blocks as qb  # noqa: E402

GGML_TYPE_BF16 = qb.GGML_TYPE_BF16
# Scheme -> GGML tensor type of the quantized projections (None: nothing
# quantized), from the format table (quant_blocks.FORMATS, kernels/formats.h).
QUANT_SCHEMES = {f.scheme: (None if f.gguf_type == GGML_TYPE_BF16 else f.gguf_type) for f in qb.FORMATS}
# The seven per-layer projections a scheme may quantize (seed 000).
QUANTIZABLE = qb.QUANTIZABLE
# --quant-head formats: every quantized scheme of the table.
HEAD_SCHEMES = {s: t for s, t in QUANT_SCHEMES.items() if t is not None}


class ConvertError(Exception):
    """A refusal: the message names the bad value and what was expected."""


# ---------------------------------------------------------------- safetensors input

@dataclass(frozen=True)
class SourceTensor:
    """One tensor in a safetensors file: where its bytes lie (absolute file offsets)."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    begin: int          # absolute byte offset in path
    nbytes: int
    pad_bytes: int = 0  # zero bytes written after the source's: the rows that pad a Hub file's
                        # vocabulary to Kipp's 151936 (shape is then the padded shape)


# Bits per element of every dtype the safetensors library (0.8) knows; others are refused as it does.
ST_DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


def _is_count(x: object) -> bool:
    """A JSON unsigned integer (not a bool, not a float such as 4.0), as serde's usize."""
    return type(x) is int and x >= 0


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """json object_pairs_hook: a repeated tensor name would silently shadow the first entry."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ConvertError(f"key {k!r} appears twice in one JSON object (expected unique names)")
        out[k] = v
    return out


def _reject_constant(name: str) -> None:
    raise ConvertError(f"{name} is not a JSON value (expected strict JSON)")


def _parse_header_json(path: Path, text: bytes) -> dict:
    """Strict UTF-8 JSON object, as serde_json reads it: whitespace is the only padding allowed
    around it, no NaN/Infinity, no duplicate keys, no lone surrogates."""
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicate_keys,
                            parse_constant=_reject_constant)
        json.dumps(header, ensure_ascii=False).encode("utf-8")  # lone surrogate escapes (\ud800) fail here
    except UnicodeError as e:
        raise ConvertError(f"{path.name}: header is not valid UTF-8 JSON ({e})") from None
    except json.JSONDecodeError as e:
        raise ConvertError(f"{path.name}: header is not valid JSON ({e}); expected a JSON object "
                           "padded only with whitespace") from None
    except ConvertError as e:
        raise ConvertError(f"{path.name}: header {e}") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path.name}: header is a {type(header).__name__}, expected a JSON object")
    meta = header.get("__metadata__", {})
    if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise ConvertError(f"{path.name}: __metadata__ is {meta!r}; expected an object of strings")
    return header


def _header_entry(path: Path, name: str, info: object) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one tensor entry, each field type-checked."""
    try:
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ConvertError(f"{path.name}: tensor {name} has a malformed header entry {info!r} "
                           "(expected dtype, shape and data_offsets)") from None
    if dtype not in ST_DTYPE_BITS:
        raise ConvertError(f"{path.name}: tensor {name} has unknown dtype {dtype!r} (expected one of "
                           f"{', '.join(ST_DTYPE_BITS)})")
    if not (isinstance(shape, list) and all(_is_count(s) for s in shape)):
        raise ConvertError(f"{path.name}: tensor {name} has shape {shape!r}; expected a list of "
                           "non-negative integers")
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_count(o) for o in offs)):
        raise ConvertError(f"{path.name}: tensor {name} has data_offsets {offs!r}; expected "
                           "[begin, end] non-negative integers")
    bits = _numel(tuple(shape)) * ST_DTYPE_BITS[dtype]
    if bits % 8 or offs[1] - offs[0] != bits // 8:
        raise ConvertError(f"{path.name}: tensor {name} data_offsets {offs} span {offs[1] - offs[0]} bytes; "
                           f"expected {bits / 8:g} for {dtype} {shape}")
    return dtype, tuple(shape), offs[0], offs[1]


def read_safetensors_header(path: Path) -> dict[str, SourceTensor]:
    """Parse one safetensors header (u64 LE length + JSON) as strictly as the safetensors
    library does: sorted by offset, the tensors must tile the data section exactly, from
    byte 0 to its last byte, with no gap, overlap or alias; anything else means the
    offsets (or the header length) are wrong and the bytes would be read shifted."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConvertError(f"{path.name}: file is {size} bytes, too short for a safetensors header")
        hlen = int.from_bytes(raw, "little")
        if hlen > MAX_HEADER or 8 + hlen > size:
            raise ConvertError(f"{path.name}: header length {hlen} does not fit the file of {size} "
                               f"bytes (expected at most {min(MAX_HEADER, size - 8)}; a safetensors file?)")
        header = _parse_header_json(path, f.read(hlen))
    data_start, data_len = 8 + hlen, size - 8 - hlen
    entries = sorted(((_header_entry(path, name, info), name) for name, info in header.items()
                      if name != "__metadata__"), key=lambda x: (x[0][2], x[0][3]))
    out: dict[str, SourceTensor] = {}
    covered = 0  # bytes of the data section tiled so far, in offset order
    for (dtype, shape, b, e), name in entries:
        if b != covered:
            what = "overlaps the previous tensor" if b < covered else f"leaves a gap of {b - covered} bytes"
            raise ConvertError(f"{path.name}: tensor {name} data_offsets [{b}, {e}] {what} (expected it "
                               f"to begin at byte {covered}: tensors must tile the data section)")
        covered = e
        out[name] = SourceTensor(name, dtype, shape, path, data_start + b, e - b)
    if covered != data_len:
        raise ConvertError(f"{path.name}: tensors cover {covered} bytes but the data section after the "
                           f"{hlen}-byte header is {data_len} bytes (expected exactly covered; header "
                           "length or data_offsets are wrong)")
    return out


def read_source_tensors(indir: Path) -> dict[str, SourceTensor]:
    """All tensors of a checkpoint directory, single-file or sharded (index.json wins)."""
    index = indir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConvertError(f"{index.name}: expected a JSON object with a weight_map ({e})") from None
        tensors: dict[str, SourceTensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (indir / shard).is_file():
                raise ConvertError(f"{index.name} names shard {shard}, which is not in {indir}")
            for name, t in read_safetensors_header(indir / shard).items():
                if name in tensors:
                    raise ConvertError(f"tensor {name} appears in both {tensors[name].path.name} "
                                       f"and {shard} (expected exactly one copy)")
                if weight_map.get(name) != shard:
                    raise ConvertError(f"tensor {name} is in {shard} but {index.name} maps it to "
                                       f"{weight_map.get(name)!r}")
                tensors[name] = t
        for name, shard in weight_map.items():
            if name not in tensors:
                raise ConvertError(f"{index.name} maps {name} to {shard}, but that shard has no such tensor")
        return tensors
    single = indir / "model.safetensors"
    if not single.is_file():
        raise ConvertError(f"{indir} has neither model.safetensors nor model.safetensors.index.json "
                           "(expected a Hugging Face checkpoint directory)")
    return read_safetensors_header(single)


# ---------------------------------------------------------------- validation

def _load_json(path: Path) -> dict:
    """Read a JSON object, refusing a missing or malformed file by name."""
    if not path.is_file():
        raise ConvertError(f"{path} is missing (expected it in the checkpoint directory)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path.name} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ConvertError(f"{path.name} holds a {type(obj).__name__}, expected a JSON object")
    return obj


_MISSING = object()


def _json_equal(got: object, want: object) -> bool:
    """Equality as JSON values: 1000000 == 1e6, but true != 1 and "8" != 8."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and float(got) == float(want)
    return got == want


def config_mismatches(cfg: dict, c: reg.Checkpoint) -> list[str]:
    """Every config.json field that differs from the registry entry, as readable lines."""
    expect: list[tuple[str, object]] = [
        ("model_type", "qwen3"),
        ("hidden_size", c.d_model), ("num_hidden_layers", c.n_layer),
        ("num_attention_heads", c.n_q_head), ("num_key_value_heads", c.n_kv_head),
        ("head_dim", c.head_dim), ("intermediate_size", c.d_ff), ("vocab_size", c.hub_rows),
        ("max_position_embeddings", c.context_length), ("rope_theta", c.rope_theta),
        ("rms_norm_eps", reg.RMS_EPS), ("tie_word_embeddings", c.hub_tie),
        ("eos_token_id", c.eos_token_id), ("bos_token_id", reg.BOS_ID),
        ("hidden_act", "silu"), ("attention_bias", False),
    ]
    bad: list[str] = []
    archs = [[reg.ARCHITECTURE]] + ([["Qwen3Model"]] if c.variant == "embedding" else [])
    if cfg.get("architectures", _MISSING) not in archs:
        got = cfg.get("architectures", _MISSING)
        bad.append(f"architectures: expected {' or '.join(json.dumps(a) for a in archs)}, found "
                   f"{'missing' if got is _MISSING else json.dumps(got)}")
    for key, want in expect:
        got = cfg.get(key, _MISSING)
        if not _json_equal(got, want):
            found = "missing" if got is _MISSING else json.dumps(got)
            shown = int(want) if isinstance(want, float) and want.is_integer() else want  # 1000000, as JSON has it
            bad.append(f"{key}: expected {json.dumps(shown)}, found {found}")
    # transformers >= 4.56 writes "dtype" instead of "torch_dtype".
    dtype = cfg.get("torch_dtype", cfg.get("dtype", _MISSING))
    if dtype != "bfloat16":
        bad.append(f"torch_dtype: expected \"bfloat16\", found "
                   f"{'missing' if dtype is _MISSING else json.dumps(dtype)}")
    if cfg.get("use_sliding_window", False) is not False:
        bad.append(f"use_sliding_window: expected false (no sliding window), found "
                   f"{json.dumps(cfg['use_sliding_window'])}")
    return bad


def check_sentence_transformers(indir: Path, c: reg.Checkpoint) -> None:
    """tools/st_config.py's check of the sentence-transformers files, as a refusal."""
    try:
        st_config.check(indir, c)
    except ValueError as e:
        raise ConvertError(str(e)) from None


def yarn_metadata(y: Optional[yc.Yarn]) -> list[bytes]:
    """The five qwen3.rope.scaling.* keys (llama.cpp's names), or none."""
    if y is None:
        return []
    return [_kv("qwen3.rope.scaling.type", T_STRING, "yarn"),
            _kv("qwen3.rope.scaling.factor", T_F32, y.factor),
            _kv("qwen3.rope.scaling.original_context_length", T_U32, y.original_context),
            _kv("qwen3.rope.scaling.yarn_beta_fast", T_F32, y.beta_fast),
            _kv("qwen3.rope.scaling.yarn_beta_slow", T_F32, y.beta_slow)]


def gguf_tensor_plan(c: reg.Checkpoint, head_quant: bool = False) -> list[tuple[str, str, tuple[int, ...]]]:
    """(GGUF name, HF name, row-major shape) in the exact order of docs/FORMAT.md.
    head_quant: a quantized head (--quant-head) is always its own output.weight, read
    for a tied checkpoint from the embedding (which stays BF16 for the lookup)."""
    d, a, kv, ff, hd = c.d_model, c.attn_width, c.n_kv_head * c.head_dim, c.d_ff, c.head_dim
    m = c.hub_prefix  # "" for a Qwen3-Embedding file (Qwen3Model), "model." otherwise
    plan = [("token_embd.weight", m + "embed_tokens.weight", (c.vocab_size, d))]
    for i in range(c.n_layer):
        p, b = f"{m}layers.{i}.", f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", p + "input_layernorm.weight", (d,)),
            (b + "attn_q.weight", p + "self_attn.q_proj.weight", (a, d)),
            (b + "attn_k.weight", p + "self_attn.k_proj.weight", (kv, d)),
            (b + "attn_v.weight", p + "self_attn.v_proj.weight", (kv, d)),
            (b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", (hd,)),
            (b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", (hd,)),
            (b + "attn_output.weight", p + "self_attn.o_proj.weight", (d, a)),
            (b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (d,)),
            (b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (ff, d)),
            (b + "ffn_up.weight", p + "mlp.up_proj.weight", (ff, d)),
            (b + "ffn_down.weight", p + "mlp.down_proj.weight", (d, ff)),
        ]
    plan.append(("output_norm.weight", m + "norm.weight", (d,)))
    if not c.tied_embeddings:
        plan.append(("output.weight", "lm_head.weight", (c.vocab_size, d)))
    elif head_quant:
        plan.append(("output.weight", m + "embed_tokens.weight", (c.vocab_size, d)))
    return plan


def _layout_hint(src: dict[str, SourceTensor], c: reg.Checkpoint) -> str:
    """Why the names may not match: the other Hub layout's prefix (empty when not that)."""
    if c.hub_prefix == "" and any(n.startswith("model.") for n in src):
        return (f" (the names carry the 'model.' prefix of a Qwen3ForCausalLM file, but {c.id} is a "
                "Qwen3-Embedding checkpoint: its Hub file is a Qwen3Model, names without the prefix)")
    if c.hub_prefix and "embed_tokens.weight" in src:
        return (f" (the names lack the 'model.' prefix, as in a Qwen3-Embedding file, but {c.id} is a "
                f"{c.variant} checkpoint: a Qwen3ForCausalLM file)")
    return ""


def _padded(t: SourceTensor, c: reg.Checkpoint, shape: tuple[int, ...]) -> SourceTensor:
    """An embedding or lm_head of the Hub file's hub_rows rows, padded with zero rows to shape."""
    if len(shape) != 2 or shape[0] != c.vocab_size or t.shape != (c.hub_rows, shape[1]) or t.shape == shape:
        return t
    return dataclasses.replace(t, shape=shape, pad_bytes=2 * (shape[0] - c.hub_rows) * shape[1])


def _same_bytes(a: SourceTensor, b: SourceTensor) -> Optional[int]:
    """None when both tensors hold identical bytes, else the first differing chunk offset."""
    if a.nbytes != b.nbytes:
        return 0
    with open(a.path, "rb") as fa, open(b.path, "rb") as fb:
        fa.seek(a.begin)
        fb.seek(b.begin)
        for off in range(0, a.nbytes, COPY_CHUNK):
            n = min(COPY_CHUNK, a.nbytes - off)
            if fa.read(n) != fb.read(n):
                return off
    return None


def select_tensors(src: dict[str, SourceTensor], c: reg.Checkpoint,
                   head_quant: bool = False) -> list[tuple[str, SourceTensor]]:
    """Match the source tensors to the plan: refuse unknown, missing, non-BF16 or misshapen ones."""
    plan = gguf_tensor_plan(c, head_quant)
    wanted = {hf for _, hf, _ in plan}
    extra = set(src) - wanted
    if c.variant == "embedding" and not c.hub_tie and "lm_head.weight" in src:
        raise ConvertError(f"lm_head.weight found, but {c.id} is an untied Qwen3-Embedding file, which has no "
                           "head (expected none: an embedding model never runs it)")
    if c.tied_embeddings and "lm_head.weight" in extra:
        emb = src.get(c.hub_prefix + "embed_tokens.weight")
        head = src["lm_head.weight"]
        if emb is not None:
            if head.dtype != emb.dtype or head.shape != emb.shape:
                raise ConvertError(f"lm_head.weight is {head.dtype} {list(head.shape)} but the checkpoint "
                                   f"is tied: expected a byte-identical copy of model.embed_tokens.weight "
                                   f"({emb.dtype} {list(emb.shape)})")
            diff = _same_bytes(head, emb)
            if diff is not None:
                raise ConvertError(f"lm_head.weight differs from {emb.name} (first differing "
                                   f"chunk at byte {diff}) but checkpoint {c.id} is tied: expected a "
                                   "byte-identical copy")
        extra.discard("lm_head.weight")  # verified duplicate of the embedding: dropped
    if extra:
        shown = sorted(extra)
        raise ConvertError(f"unknown tensor(s) {', '.join(shown[:8])}{' ...' if len(shown) > 8 else ''}: "
                           f"checkpoint {c.id} expects only the Qwen3 tensors of docs/FORMAT.md"
                           f"{_layout_hint(src, c)}")
    missing = [hf for hf in sorted(wanted) if hf not in src]
    if missing:
        raise ConvertError(f"missing tensor(s) {', '.join(missing)} (required by checkpoint {c.id})")
    out = []
    for gname, hf, shape in plan:
        t = _padded(src[hf], c, shape)
        if t.dtype != "BF16":
            raise ConvertError(f"tensor {hf} has dtype {t.dtype}; expected BF16")
        if t.shape != shape:
            want = list(shape) if c.hub_rows == c.vocab_size or len(shape) != 2 else [c.hub_rows, shape[1]]
            raise ConvertError(f"tensor {hf} has shape {list(t.shape)}; expected {want} for {c.id}")
        if t.nbytes + t.pad_bytes != 2 * _numel(shape):
            raise ConvertError(f"tensor {hf} spans {t.nbytes} bytes; expected {2 * _numel(shape) - t.pad_bytes} "
                               f"for BF16 {list(src[hf].shape)}")
        out.append((gname, t))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------- tokenizer

@dataclass
class TokenizerData:
    """What the GGUF carries of the tokenizer (docs/FORMAT.md, kipp.tokenizer.*)."""
    tokens: list[str]          # [151669], index = id
    merges: list[str]          # rank order, "left right"
    added_ids: list[int]       # ascending
    added_special: list[bool]  # parallel to added_ids
    pre_regex: str


def _split_regex(pre: object) -> str:
    """The pattern of the (single) Split pre-tokenizer, possibly inside a Sequence."""
    if not isinstance(pre, dict):
        raise ConvertError(f"tokenizer.json pre_tokenizer is {pre!r}; expected a Split pre-tokenizer")
    items = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    found = [p.get("pattern", {}).get("Regex") for p in items if isinstance(p, dict) and p.get("type") == "Split"]
    if len(found) != 1 or not isinstance(found[0], str):
        raise ConvertError(f"tokenizer.json: expected exactly one Split pre-tokenizer with a Regex pattern, "
                           f"found {len(found)}")
    return found[0]


def build_tokenizer(tok: dict, tok_cfg: dict) -> TokenizerData:
    """Vocab + added tokens (tokenizer_config.json's added_tokens_decoder merged over
    tokenizer.json's added_tokens, content and special flag), merges and regex."""
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"tokenizer.json model type is {model.get('type')!r}; expected 'BPE'")
    norm = tok.get("normalizer") or {}
    if norm.get("type") != "NFC":
        raise ConvertError(f"tokenizer.json normalizer is {norm.get('type')!r}; expected 'NFC'")
    tokens: list[Optional[str]] = [None] * reg.N_TOKENS
    for text, tid in model.get("vocab", {}).items():
        if not (isinstance(tid, int) and 0 <= tid < reg.FIRST_ADDED_ID):
            raise ConvertError(f"tokenizer.json vocab entry {text!r} has id {tid!r}; expected "
                               f"0..{reg.FIRST_ADDED_ID - 1}")
        if tokens[tid] is not None:
            raise ConvertError(f"tokenizer.json vocab assigns id {tid} to both {tokens[tid]!r} and {text!r}")
        tokens[tid] = text
    added: dict[int, tuple[str, bool]] = {}
    try:
        for a in tok.get("added_tokens", []):
            added[int(a["id"])] = (str(a["content"]), bool(a.get("special", False)))
        for key, a in (tok_cfg.get("added_tokens_decoder") or {}).items():  # config wins, as upstream
            added[int(key)] = (str(a["content"]), bool(a.get("special", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise ConvertError(f"malformed added token entry ({e!r}); expected id/content/special fields") from None
    want = set(range(reg.FIRST_ADDED_ID, reg.N_TOKENS))
    if set(added) != want:
        odd = sorted(set(added) ^ want)
        raise ConvertError(f"added tokens have ids {odd[:8]} out of place; expected exactly "
                           f"{reg.FIRST_ADDED_ID}..{reg.N_TOKENS - 1}")
    for tid, (content, _) in added.items():
        tokens[tid] = content
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise ConvertError(f"token id {missing[0]} has no entry ({len(missing)} ids missing); expected "
                           f"every id in 0..{reg.N_TOKENS - 1}")
    merges = []
    for rank, m in enumerate(model.get("merges", [])):
        pair = m.split(" ") if isinstance(m, str) else list(m)
        if len(pair) != 2 or not pair[0] or not pair[1]:
            raise ConvertError(f"tokenizer.json merge {rank} is {m!r}; expected a pair 'left right'")
        merges.append(f"{pair[0]} {pair[1]}")
    ids = sorted(added)
    return TokenizerData([t for t in tokens if t is not None], merges, ids,
                         [added[i][1] for i in ids], _split_regex(tok.get("pre_tokenizer")))


# ---------------------------------------------------------------- GGUF writer

def _gstr(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value: object) -> bytes:
    """One metadata entry: key string, u32 type, value."""
    out = [_gstr(key), struct.pack("<I", vtype)]
    if vtype == T_STRING:
        out.append(_gstr(value))  # type: ignore[arg-type]
    elif vtype == T_U32:
        out.append(struct.pack("<I", value))
    elif vtype == T_F32:
        out.append(struct.pack("<f", value))
    elif vtype == T_BOOL:
        out.append(struct.pack("<B", 1 if value else 0))
    else:
        raise ValueError(f"unsupported scalar type {vtype}")
    return b"".join(out)


def _kv_array(key: str, etype: int, values: list) -> bytes:
    """One array entry: key, ARRAY, element type, u64 count, elements."""
    head = _gstr(key) + struct.pack("<IIQ", T_ARRAY, etype, len(values))
    if etype == T_STRING:
        return head + b"".join(_gstr(v) for v in values)
    if etype == T_U32:
        return head + struct.pack(f"<{len(values)}I", *values)
    if etype == T_BOOL:
        return head + bytes(1 if v else 0 for v in values)
    raise ValueError(f"unsupported array type {etype}")


def gguf_metadata(c: reg.Checkpoint, quant: str, tk: TokenizerData, head: Optional[str] = None,
                  yarn: Optional[yc.Yarn] = None) -> list[bytes]:
    """All metadata entries, in the order of docs/FORMAT.md's table; kipp.quant.head
    follows kipp.quant.scheme only when the head is quantized (a BF16-head file is
    byte-identical to one written before the option existed); the RoPE scaling keys
    come last, only with YaRN (likewise)."""
    return [
        _kv("general.architecture", T_STRING, "qwen3"),
        _kv("general.alignment", T_U32, ALIGNMENT),
        _kv("general.name", T_STRING, c.id),
        _kv("kipp.format_version", T_U32, FORMAT_VERSION),
        _kv("kipp.checkpoint.id", T_STRING, c.id),
        _kv("kipp.source.repository", T_STRING, c.repository),
        _kv("kipp.source.revision", T_STRING, c.revision),
        _kv("kipp.quant.scheme", T_STRING, quant),
        *([_kv("kipp.quant.head", T_STRING, head)] if head else []),
        _kv("kipp.variant", T_STRING, c.variant),
        _kv("kipp.chat_template", T_STRING, c.chat_template),
        _kv("kipp.d_model", T_U32, c.d_model),
        _kv("kipp.n_layer", T_U32, c.n_layer),
        _kv("kipp.n_q_head", T_U32, c.n_q_head),
        _kv("kipp.n_kv_head", T_U32, c.n_kv_head),
        _kv("kipp.head_dim", T_U32, c.head_dim),
        _kv("kipp.d_ff", T_U32, c.d_ff),
        _kv("kipp.vocab_size", T_U32, c.vocab_size),
        _kv("kipp.context_length", T_U32, c.context_length),
        _kv("kipp.rope_theta", T_F32, c.rope_theta),
        _kv("kipp.rms_norm_eps", T_F32, reg.RMS_EPS),
        _kv("kipp.tied_embeddings", T_BOOL, c.tied_embeddings),
        _kv("kipp.bos_token_id", T_U32, reg.BOS_ID),
        _kv("kipp.eos_token_id", T_U32, c.eos_token_id),
        _kv_array("kipp.stop_token_ids", T_U32, list(c.stop_token_ids)),
        _kv_array("kipp.tokenizer.tokens", T_STRING, tk.tokens),
        _kv_array("kipp.tokenizer.merges", T_STRING, tk.merges),
        _kv_array("kipp.tokenizer.added_ids", T_U32, tk.added_ids),
        _kv_array("kipp.tokenizer.added_special", T_BOOL, tk.added_special),
        _kv("kipp.tokenizer.pre_regex", T_STRING, tk.pre_regex),
        _kv("kipp.tokenizer.normalizer", T_STRING, "NFC"),
        *yarn_metadata(yarn),
    ]


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def is_quantizable(gguf_name: str) -> bool:
    """True for blk.<i>.<projection>.weight, the tensors a quant scheme may quantize."""
    parts = gguf_name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in QUANTIZABLE


def tensor_type(gguf_name: str, quant: str, head: Optional[str] = None) -> int:
    """GGML type of one tensor under a scheme (and a --quant-head format)."""
    if gguf_name == "output.weight" and head:
        return QUANT_SCHEMES[head]
    qt = QUANT_SCHEMES[quant]
    return qt if qt is not None and is_quantizable(gguf_name) else GGML_TYPE_BF16


def tensor_bytes(gtype: int, shape: tuple[int, ...]) -> int:
    """Bytes of a row-major tensor of this GGML type in the file."""
    if gtype == GGML_TYPE_BF16:
        return 2 * _numel(shape)
    return qb.row_bytes(gtype, shape[-1]) * (_numel(shape) // shape[-1])


def _read_bf16(t: SourceTensor):
    """The tensor's BF16 bytes widened exactly to float32 [rows][cols]."""
    import numpy as np
    with open(t.path, "rb") as src:
        src.seek(t.begin)
        raw = src.read(t.nbytes)
    if len(raw) != t.nbytes:
        raise ConvertError(f"{t.path.name} ended inside tensor {t.name}")
    raw += b"\0" * t.pad_bytes  # the zero rows that pad a Hub vocabulary (BF16 +0.0)
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(t.shape)


def write_gguf(f: BinaryIO, meta: list[bytes], tensors: list[tuple[str, SourceTensor]], bar,
               quant: str = "bf16", report: Optional[dict] = None, head: Optional[str] = None) -> None:
    """Header, metadata, tensor directory, aligned data (docs/FORMAT.md, "Container").
    Quantized tensors are encoded per tensor; report[name] gets their NMSE."""
    f.write(b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta)))
    for m in meta:
        f.write(m)
    offset = 0
    for name, t in tensors:
        gtype = tensor_type(name, quant, head)
        nbytes = tensor_bytes(gtype, t.shape)
        dims = tuple(reversed(t.shape))  # GGUF lists the fastest-varying dimension first
        f.write(_gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gtype, offset))
        offset += nbytes + _pad(nbytes)
    f.write(b"\0" * _pad(f.tell()))
    for name, t in tensors:
        gtype = tensor_type(name, quant, head)
        if gtype != GGML_TYPE_BF16:
            w = _read_bf16(t)
            try:
                data, nmse = qb.quantize(gtype, w)
            except ValueError as e:
                raise ConvertError(f"tensor {name}: {e}") from None
            if report is not None:
                report[name] = {"type": qb.TYPE_NAMES[gtype], "shape": list(t.shape), "nmse": nmse,
                                "bytes": len(data)}
            f.write(data)
            if bar is not None:
                bar.update(t.nbytes)
            f.write(b"\0" * _pad(len(data)))
            continue
        with open(t.path, "rb") as src:
            src.seek(t.begin)
            left = t.nbytes
            while left:
                chunk = src.read(min(COPY_CHUNK, left))
                if not chunk:
                    raise ConvertError(f"{t.path.name} ended inside tensor {t.name}")
                f.write(chunk)
                left -= len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
        f.write(b"\0" * t.pad_bytes)  # the zero rows that pad a Hub vocabulary
        f.write(b"\0" * _pad(t.nbytes + t.pad_bytes))


def check_output_path(out: Path) -> None:
    """Refuse an output path that cannot take the file before any work is done: its
    directory must already exist (no silent mkdir -p) and be writable, and the path
    itself must be absent or a regular file (it is replaced atomically)."""
    parent = out.parent
    if not parent.is_dir():
        raise ConvertError(f"--out {out}: directory {parent} does not exist (expected an existing "
                           "directory; create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConvertError(f"--out {out}: directory {parent} is not writable")
    if out.exists() and not out.is_file():
        kind = "a directory" if out.is_dir() else "not a regular file"
        raise ConvertError(f"--out {out} is {kind} (expected a .gguf file path to create or replace)")


def convert(c: reg.Checkpoint, indir: Path, out: Path, quant: str = "bf16", quiet: bool = True,
            head: Optional[str] = None, rope_scaling: Optional[str] = None) -> int:
    """Validate and convert; returns the number of tensors written. Raises ConvertError.
    head: --quant-head, the output head's format (None: BF16, the seed's default).
    rope_scaling: --rope-scaling (None: config.json's rope_scaling, usually null)."""
    if quant not in QUANT_SCHEMES:
        raise ConvertError(f"--quant is '{quant}'; expected one of {', '.join(QUANT_SCHEMES)}")
    if head is not None and HEAD_SCHEMES.get(head) is None:
        raise ConvertError(f"--quant-head is '{head}'; expected one of {', '.join(HEAD_SCHEMES)} "
                           "(omit it to keep the BF16 head)")
    if head is not None and c.variant == "embedding":
        raise ConvertError(f"--quant-head {head}: {c.id} is an embedding model, whose file has no head to "
                           "quantize (the head is never run); omit --quant-head")
    if not indir.is_dir():
        raise ConvertError(f"input directory {indir} does not exist")
    check_output_path(out)
    try:
        refuse_same_file(out, input_files(indir))  # before any work; atomic_output checks again
    except SameFileError as e:
        raise ConvertError(str(e)) from None
    cfg = _load_json(indir / "config.json")
    bad = config_mismatches(cfg, c)
    if bad:
        raise ConvertError(f"config.json does not match registry entry {c.id}:\n  " + "\n  ".join(bad))
    check_sentence_transformers(indir, c)
    try:
        yarn = yc.parse_rope_scaling(rope_scaling, c) if rope_scaling is not None else yc.yarn_from_config(cfg)
    except yc.YarnError as e:
        raise ConvertError(str(e)) from None
    tensors = select_tensors(read_source_tensors(indir), c, head is not None)
    tok_cfg = _load_json(indir / "tokenizer_config.json")
    tk = build_tokenizer(_load_json(indir / "tokenizer.json"), tok_cfg)
    eos = tok_cfg.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos != tk.tokens[c.eos_token_id]:
        raise ConvertError(f"tokenizer_config.json eos_token is {eos!r}; expected "
                           f"{tk.tokens[c.eos_token_id]!r} (id {c.eos_token_id}) for {c.id}")
    meta = gguf_metadata(c, quant, tk, head, yarn)
    bar = None
    if not quiet:
        from tqdm import tqdm
        bar = tqdm(total=sum(t.nbytes for _, t in tensors), unit="B", unit_scale=True,
                   desc=f"{out.name} ({quant}{', head ' + head if head else ''})")
    report: dict = {}
    try:
        with atomic_output(out, input_files(indir)) as f:
            write_gguf(f, meta, tensors, bar, quant, report, head)
        if QUANT_SCHEMES[quant] is not None or head:
            write_sidecar(out, c, quant, report, head)
    finally:
        if bar is not None:
            bar.close()
    return len(tensors)


def input_files(indir: Path) -> list[Path]:
    """Every file the conversion reads: the checkpoint directory's regular files."""
    return [p for p in indir.iterdir() if p.is_file()] if indir.is_dir() else []


def write_sidecar(out: Path, c: reg.Checkpoint, quant: str, report: dict, head: Optional[str] = None) -> None:
    """FILE.quant.json: scheme, GGML type and per-tensor quantization NMSE
    (sum (w - deq(q(w)))^2 / sum w^2 over the BF16 source weights); with
    --quant-head also the head's format and NMSE (output.weight's entry)."""
    vals = [r["nmse"] for n, r in report.items() if n != "output.weight"]  # the projections
    qt = QUANT_SCHEMES[quant]
    doc = {"schema": "kipp-quant-v1", "checkpoint": c.id, "scheme": quant,
           "gguf": out.name, "ggml_type": qb.TYPE_NAMES[qt if qt is not None else GGML_TYPE_BF16],
           "head": head or "bf16",
           "head_nmse": report["output.weight"]["nmse"] if head else 0.0,
           "quantized_tensors": len(report),
           "nmse_max": max(vals) if vals else 0.0,
           "nmse_mean": sum(vals) / len(vals) if vals else 0.0,
           "tensors": report}
    side = out.with_name(out.name + ".quant.json")
    side.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Convert a BF16 safetensors Qwen3 checkpoint into a Kipp "
                                 "GGUF file (docs/FORMAT.md).")
    ap.add_argument("--checkpoint", required=True, help="registry id, e.g. qwen3-0.6b or synthetic-tiny")
    ap.add_argument("--input", required=True, type=Path, help="Hugging Face checkpoint directory")
    ap.add_argument("--out", required=True, type=Path,
                    help="output .gguf file (its directory must exist; an existing file is replaced)")
    ap.add_argument("--quant", default="bf16",
                    help=f"weight scheme: {', '.join(QUANT_SCHEMES)} (default bf16; the seven projections)")
    ap.add_argument("--quant-head", default=None, metavar="FORMAT",
                    help=f"also quantize the output head: {', '.join(HEAD_SCHEMES)} (opt-in; default: the "
                    "head stays BF16. Tied checkpoints keep token_embd BF16 and gain a quantized output.weight; "
                    "docs/FORMAT.md \"Quantized head\")")
    ap.add_argument("--rope-scaling", default=None, metavar="SPEC",
                    help="RoPE scaling to write: none, yarn:F or yarn:F:ORIG (factor F over ORIG original "
                    "context tokens; ORIG defaults to the model card's, else max_position_embeddings). Default: "
                    "config.json's rope_scaling (docs/FORMAT.md \"RoPE scaling\")")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        c = reg.by_id(args.checkpoint)
    except KeyError as e:
        print(f"convert_to_gguf: {e.args[0]}", file=sys.stderr)
        return 1
    try:
        n = convert(c, args.input, args.out, args.quant, args.quiet, args.quant_head, args.rope_scaling)
    except (ConvertError, SameFileError, OSError) as e:
        print(f"convert_to_gguf: {term_escape(str(e))}", file=sys.stderr)
        return 1
    if not args.quiet:
        head = f", head {args.quant_head}" if args.quant_head else ""
        print(f"convert_to_gguf: wrote {args.out} ({n} tensors, {c.id}, {args.quant}{head})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
