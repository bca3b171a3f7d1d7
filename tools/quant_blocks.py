"""quant_blocks.py - the 32-weight block encoders and decoders of the quantized schemes.

Seed 000 "Weight quantization"; docs/FORMAT.md "Quantized schemes". numpy only.
Both formats are GGML's, so the files open in every GGUF reader:

  q8_0          GGML Q8_0 (type 8), 34 bytes per block: fp16 d, then 32 int8 q.
                w = d * q. d = amax / 127 rounded to fp16; q = round(w / d)
                against that rounded d, clamped to [-127, 127] (0 when d is 0).
  affine4_gs32  GGML Q4_1 (type 3), 20 bytes per block: fp16 d, fp16 m, then 16
                bytes of nibbles: byte j holds q[j] (low nibble) and q[j+16]
                (high nibble). w = d * q + m. m = min rounded to fp16,
                d = (max - m) / 15 rounded to fp16, q = round((w - m) / d)
                clamped to [0, 15] (0 when d is 0).

round() is half away from zero on the float32 quotient, which is C's roundf
on the same float32 division: kernels/cpu/ref_q8_0.c and ref_affine4.c
(k_fmt_info.from_f32) produce the same bytes, and kcheck compares them.
"""
from __future__ import annotations

import numpy as np

from typing import NamedTuple


class Format(NamedTuple):
    """One row of kernels/formats.h KIPP_FMT_LIST (tests/test_tooling.py compares them)."""
    id: str           # BF16, Q8_0, Q4_1
    gguf_type: int    # GGML tensor type id
    type_name: str    # GGML's name of the type
    scheme: str       # kipp.quant.scheme (and --quant) that stores the projections in it
    block: int        # weights per block along a row
    block_bytes: int  # file bytes per block


# The format table, mirrored from kernels/formats.h: every other table here and
# in convert_to_gguf.py is derived from it.
FORMATS = (
    Format("BF16", 30, "BF16", "bf16", 1, 2),
    Format("Q8_0", 8, "Q8_0", "q8_0", 32, 34),
    Format("Q4_1", 3, "Q4_1", "affine4_gs32", 32, 20),
)
# The layer tensors a scheme may quantize (kernels/formats.h KIPP_QUANTIZABLE_LIST);
# norms and the embedding always stay BF16, the output head too unless converted
# with --quant-head (docs/FORMAT.md "Quantized head").
QUANTIZABLE = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

_BY_ID = {f.id: f for f in FORMATS}
GGML_TYPE_BF16 = _BY_ID["BF16"].gguf_type
GGML_TYPE_Q4_1 = _BY_ID["Q4_1"].gguf_type
GGML_TYPE_Q8_0 = _BY_ID["Q8_0"].gguf_type
TYPE_NAMES = {f.gguf_type: f.type_name for f in FORMATS}
BLOCK = 32  # the quantized formats' block (FORMATS rows with block > 1)
BLOCK_BYTES = {f.gguf_type: f.block_bytes for f in FORMATS if f.block > 1}
assert all(f.block in (1, BLOCK) for f in FORMATS)


def row_bytes(gtype: int, cols: int) -> int:
    """Bytes of one row of cols weights (cols % 32 == 0)."""
    if cols % BLOCK:
        raise ValueError(f"row length {cols} is not a multiple of the {BLOCK}-weight block")
    return cols // BLOCK * BLOCK_BYTES[gtype]


def _round_away(x: np.ndarray) -> np.ndarray:
    """Half away from zero of a float32 array (C roundf), exact via float64."""
    x64 = x.astype(np.float64)
    return np.sign(x64) * np.floor(np.abs(x64) + 0.5)


def _fp16(x: np.ndarray) -> np.ndarray:
    """Round to fp16 (RNE) and back to float32; refuse overflow."""
    h = x.astype(np.float16)
    if not np.all(np.isfinite(h)):
        raise ValueError("a block scale overflows fp16 (|scale| > 65504): weights too large to quantize")
    return h


def _blocks(w: np.ndarray) -> np.ndarray:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"shape {list(w.shape)}: expected [rows][cols] with cols % {BLOCK} == 0")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights hold NaN or Inf; expected finite values")
    return w.reshape(w.shape[0], -1, BLOCK)


def encode_q8_0(w: np.ndarray) -> bytes:
    """[rows][cols] float32 -> GGML Q8_0 bytes, row-major blocks."""
    b = _blocks(w)
    amax = np.max(np.abs(b), axis=2, keepdims=True)
    d16 = _fp16(amax / np.float32(127.0))
    d = d16.astype(np.float32)
    safe = np.where(d == 0, np.float32(1.0), d)
    q = np.clip(_round_away(b / safe), -127, 127)
    q = np.where(d == 0, 0, q).astype(np.int8)
    out = np.empty(b.shape[:2] + (34,), dtype=np.uint8)
    out[..., 0:2] = d16.view(np.uint8).reshape(b.shape[:2] + (2,))
    out[..., 2:] = q.view(np.uint8)
    return out.tobytes()


def decode_q8_0(data: bytes, rows: int, cols: int) -> np.ndarray:
    """GGML Q8_0 bytes -> [rows][cols] float32, w = d * q."""
    a = np.frombuffer(data, dtype=np.uint8).reshape(rows, cols // BLOCK, 34)
    d = a[..., 0:2].copy().view(np.float16).astype(np.float32)
    q = a[..., 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(rows, cols)


def encode_affine4(w: np.ndarray) -> bytes:
    """[rows][cols] float32 -> GGML Q4_1 bytes, row-major blocks."""
    b = _blocks(w)
    lo = np.min(b, axis=2, keepdims=True)
    hi = np.max(b, axis=2, keepdims=True)
    m16 = _fp16(lo)
    m = m16.astype(np.float32)
    d16 = _fp16((hi - m) / np.float32(15.0))
    d = d16.astype(np.float32)
    safe = np.where(d == 0, np.float32(1.0), d)
    q = np.clip(_round_away((b - m) / safe), 0, 15)
    q = np.where(d == 0, 0, q).astype(np.uint8)
    out = np.empty(b.shape[:2] + (20,), dtype=np.uint8)
    out[..., 0:2] = d16.view(np.uint8).reshape(b.shape[:2] + (2,))
    out[..., 2:4] = m16.view(np.uint8).reshape(b.shape[:2] + (2,))
    out[..., 4:] = q[..., :16] | (q[..., 16:] << 4)
    return out.tobytes()


def decode_affine4(data: bytes, rows: int, cols: int) -> np.ndarray:
    """GGML Q4_1 bytes -> [rows][cols] float32, w = d * q + m."""
    a = np.frombuffer(data, dtype=np.uint8).reshape(rows, cols // BLOCK, 20)
    d = a[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = a[..., 2:4].copy().view(np.float16).astype(np.float32)
    nib = a[..., 4:]
    q = np.concatenate([nib & 15, nib >> 4], axis=2).astype(np.float32)
    return (d * q + m).reshape(rows, cols)


ENCODERS = {GGML_TYPE_Q8_0: encode_q8_0, GGML_TYPE_Q4_1: encode_affine4}
DECODERS = {GGML_TYPE_Q8_0: decode_q8_0, GGML_TYPE_Q4_1: decode_affine4}


def quantize(gtype: int, w: np.ndarray) -> tuple[bytes, float]:
    """Encode w [rows][cols] float32; returns (bytes, NMSE of the decoded weights vs w)."""
    data = ENCODERS[gtype](w)
    deq = DECODERS[gtype](data, w.shape[0], w.shape[1])
    w64 = w.astype(np.float64)
    den = float(np.sum(w64 * w64))
    nmse = float(np.sum((w64 - deq) ** 2) / den) if den > 0 else 0.0
    return data, nmse
