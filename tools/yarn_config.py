#!/usr/bin/env python3
"""yarn_config.py - YaRN RoPE scaling as the converter reads and writes it (docs/FORMAT.md "RoPE scaling").

config.json's rope_scaling is read the way Hugging Face transformers' _compute_yarn_parameters
(src/transformers/modeling_rope_utils.py) reads it: factor; original_max_position_embeddings, else
max_position_embeddings; beta_fast or 32; beta_slow or 1; truncate True. The formula itself lives in
the oracle (tools/np_forward.py) and the engine (kernels/cpu/ref.c k_rope_table_yarn).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import checkpoints as reg


class YarnError(ValueError):
    """A rope_scaling or --rope-scaling value Kipp does not run, with the reason."""


@dataclass(frozen=True)
class Yarn:
    """YaRN RoPE scaling as the file stores it (docs/FORMAT.md "RoPE scaling"): factor,
    original_max_position_embeddings (tokens) and the two correction betas."""
    factor: float
    original_context: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


YARN_MAX_FACTOR = 64.0         # engine/kipp.h KIPP_ROPE_MAX_FACTOR
YARN_MAX_CONTEXT = 1 << 20     # engine/kipp.h KIPP_ROPE_MAX_CONTEXT
# rope_scaling keys transformers' _compute_yarn_parameters reads that change the result away from
# its defaults; Kipp computes only the defaults (attention factor 0.1 ln(factor) + 1, truncated ramp).
_YARN_UNSUPPORTED = ("attention_factor", "mscale", "mscale_all_dim")


def _check_yarn(y: Yarn, where: str) -> Yarn:
    if not (1.0 < y.factor <= YARN_MAX_FACTOR):
        raise YarnError(f"{where}: factor {y.factor}, expected above 1 and at most {YARN_MAX_FACTOR:g}")
    if y.original_context < 32:
        raise YarnError(f"{where}: original_max_position_embeddings {y.original_context}, expected >= 32")
    if int(y.original_context * y.factor) > YARN_MAX_CONTEXT:
        raise YarnError(f"{where}: {y.original_context} x {y.factor:g} = {int(y.original_context * y.factor)} "
                           f"tokens, above Kipp's limit of {YARN_MAX_CONTEXT}")
    if not (y.beta_fast > y.beta_slow > 0):
        raise YarnError(f"{where}: beta_fast {y.beta_fast} and beta_slow {y.beta_slow}, expected "
                           "beta_fast > beta_slow > 0")
    return y


def yarn_from_config(cfg: dict) -> Optional[Yarn]:
    """config.json's rope_scaling as transformers reads it for YaRN (None when null/absent):
    rope_type (or the older "type") "yarn", factor, and the optional original_max_position_embeddings
    (default: max_position_embeddings), beta_fast (32), beta_slow (1), truncate (True). Keys that move
    the result off transformers' defaults (attention_factor, mscale, mscale_all_dim, truncate false)
    and unknown keys are refused rather than ignored."""
    rs = cfg.get("rope_scaling")
    if rs is None:
        return None
    where = f"config.json rope_scaling {json.dumps(rs)}"
    if not isinstance(rs, dict):
        raise YarnError(f"{where}: expected an object or null")
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "yarn":
        raise YarnError(f"{where}: rope_type {json.dumps(kind)}, expected \"yarn\" (the only scaling Kipp runs)")
    known = {"rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "truncate", *_YARN_UNSUPPORTED}
    extra = sorted(set(rs) - known)
    if extra:
        raise YarnError(f"{where}: unknown keys {', '.join(extra)}")
    odd = [k for k in _YARN_UNSUPPORTED if rs.get(k) is not None]
    if odd or rs.get("truncate", True) is not True:
        raise YarnError(f"{where}: {', '.join(odd) or 'truncate false'} set; Kipp runs transformers' defaults "
                           "only (attention factor 0.1 ln(factor) + 1, truncated correction range)")
    num = lambda k, d: rs.get(k) or d  # transformers: rope_scaling.get("beta_fast") or 32
    if not _is_number(rs.get("factor")):
        raise YarnError(f"{where}: factor {json.dumps(rs.get('factor'))}, expected a number")
    orig = rs.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
    if not (isinstance(orig, int) and not isinstance(orig, bool) and orig > 0):
        raise YarnError(f"{where}: original_max_position_embeddings {json.dumps(orig)}, expected a count")
    return _check_yarn(Yarn(float(rs["factor"]), int(orig), float(num("beta_fast", 32.0)),
                            float(num("beta_slow", 1.0))), where)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_rope_scaling(arg: str, c: reg.Checkpoint) -> Optional[Yarn]:
    """--rope-scaling none | yarn:F | yarn:F:ORIG (ORIG default: the registry card's original context,
    else max_position_embeddings), as kipp --rope-scaling takes it. None for "none"."""
    form = "expected none, yarn:F or yarn:F:ORIG (e.g. yarn:4)"
    if arg == "none":
        return None
    parts = arg.split(":")
    if parts[0] != "yarn" or len(parts) not in (2, 3):
        raise YarnError(f"--rope-scaling '{arg}': {form}")
    try:
        factor = float(parts[1])
    except ValueError:
        raise YarnError(f"--rope-scaling '{arg}': factor '{parts[1]}' is not a number; {form}") from None
    if len(parts) == 3 and not parts[2].isdigit():
        raise YarnError(f"--rope-scaling '{arg}': original context '{parts[2]}' is not a count of tokens; {form}")
    orig = int(parts[2]) if len(parts) == 3 else (c.yarn_original_context or c.context_length)
    return _check_yarn(Yarn(factor, orig), f"--rope-scaling '{arg}'")
