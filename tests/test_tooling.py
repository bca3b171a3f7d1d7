"""test_tooling.py - the registry's two copies agree, and synthetic checkpoints are exact.

Oracles: `build/kipp registry --json` (the C table), data/qwen3/qwen3-registry.md
and data/qwen3/qwen3-configs/ (the facts the registry was built from), hashlib on
the vendored tokenizer files, tests/checkpoints.sha256.json (the manifest), a
pure-Python splitmix64/BF16 rounding, the `safetensors` package as an
independent header reader, and a small numpy Qwen3 forward for the logit scale.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import checkpoints as reg
import make_checkpoint as mk

REPO = Path(__file__).resolve().parent.parent
C_FIELDS = ["id", "repository", "revision", "synthetic", "variant", "chat_template", "d_model", "n_layer",
            "n_q_head", "n_kv_head", "head_dim", "d_ff", "vocab_size", "context_length", "rope_theta",
            "tied_embeddings", "eos_token_id", "stop_token_ids", "kv_bytes_per_token", "revision_status",
            "yarn_factor", "yarn_original_context", "yarn_context"]


# ---------------------------------------------------------------- registry

@pytest.fixture(scope="module")
def c_registry() -> list[dict]:
    kipp = REPO / "build" / "kipp"
    assert kipp.is_file(), f"{kipp} is missing: run `make all` before the Python tests"
    out = subprocess.run([str(kipp), "registry", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_registry_matches_c_table_field_by_field(c_registry):
    assert [e["id"] for e in c_registry] == [c.id for c in reg.CHECKPOINTS]
    for ce, pe in zip(c_registry, reg.CHECKPOINTS):
        assert list(ce) == C_FIELDS, f"kipp registry --json keys changed for {ce['id']}"
        py = pe.registry_json()
        for f in C_FIELDS:
            assert ce[f] == py[f], f"{pe.id}.{f}: C has {ce[f]!r}, tools/checkpoints.py has {py[f]!r}"
            assert type(ce[f]) is type(py[f]), f"{pe.id}.{f}: JSON type differs"


def test_family_invariants_every_entry():
    for c in reg.CHECKPOINTS:
        assert (c.vocab_size, c.n_kv_head, c.head_dim) == (151936, 8, 128), c.id
        assert c.eos_token_id in c.stop_token_ids, c.id
        assert (c.variant in ("base", "embedding", "reranker")) == (c.chat_template == "none"), c.id
        assert c.eos_token_id == (151643 if c.chat_template == "none" else 151645), c.id
        assert c.stop_token_ids == ((151643,) if c.eos_token_id == 151643 else (151645, 151643)), c.id
        if c.synthetic:
            assert c.repository.startswith("synthetic/") and c.revision_status == reg.SYNTHETIC, c.id
            assert re.fullmatch(r"kipp-synth-v1-seed\d+", c.revision), c.id
        else:
            assert re.fullmatch(r"[0-9a-f]{40}", c.revision) and c.is_pinned, c.id
            assert c.revision_status == reg.PINNED_UNVERIFIED, c.id
    assert reg.RMS_EPS == 1e-6 and reg.VOCAB_SIZE == 151936 and reg.N_TOKENS == 151669
    assert len([c for c in reg.CHECKPOINTS if not c.synthetic]) == 19
    tiny = reg.by_id("synthetic-tiny")
    assert tiny.tied_embeddings and tiny.attn_width != tiny.d_model and tiny.n_layer >= 2
    assert not reg.by_id("synthetic-tiny-untied").tied_embeddings


def _registry_md_rows(data: Path) -> dict[str, list[str]]:
    rows = {}
    for line in (data / "qwen3-registry.md").read_text().splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith("qwen3-"):
            rows[cells[0]] = cells
    return rows


def test_real_entries_match_registry_md(qwen3_data):
    rows = _registry_md_rows(qwen3_data)
    real = [c for c in reg.CHECKPOINTS if not c.synthetic and c.task == "generate"]  # registry.md: generation only
    assert sorted(rows) == sorted(c.id for c in real)
    for c in real:
        _, repo, rev, d, ff, L, nq, ctx, theta, tied, eos, stops = rows[c.id]
        assert (repo, rev) == (c.repository, c.revision), c.id
        assert [int(x) for x in (d, ff, L, nq, ctx, eos)] == \
            [c.d_model, c.d_ff, c.n_layer, c.n_q_head, c.context_length, c.eos_token_id], c.id
        assert float(theta) == c.rope_theta and (tied == "yes") == c.tied_embeddings, c.id
        assert tuple(int(s) for s in stops.split(",")) == c.stop_token_ids, c.id


def test_real_entries_match_vendored_config_json(qwen3_data):
    files = sorted((qwen3_data / "qwen3-configs").glob("*.config.json"))
    assert len(files) == 10
    for f in files:
        c = next(x for x in reg.CHECKPOINTS if x.repository == "Qwen/" + f.name[:-len(".config.json")])
        cfg = json.loads(f.read_text())
        assert cfg["hidden_size"] == c.d_model and cfg["num_hidden_layers"] == c.n_layer, c.id
        assert cfg["num_attention_heads"] == c.n_q_head and cfg["intermediate_size"] == c.d_ff, c.id
        assert cfg["num_key_value_heads"] == 8 and cfg["head_dim"] == 128, c.id
        assert cfg["vocab_size"] == 151936 and cfg["rms_norm_eps"] == 1e-6, c.id
        assert cfg["max_position_embeddings"] == c.context_length, c.id
        assert cfg["rope_theta"] == c.rope_theta and cfg["tie_word_embeddings"] == c.tied_embeddings, c.id
        assert cfg["eos_token_id"] == c.eos_token_id and cfg["bos_token_id"] == 151643, c.id
        assert cfg["rope_scaling"] is None and cfg["use_sliding_window"] is False, c.id
        # make_checkpoint's config template reproduces the Hub file byte for byte.
        assert reg.hf_config_text(c) == f.read_text(), c.id
        data = f.read_bytes()
        assert c.files["config.json"] == reg.FileFact(hashlib.sha256(data).hexdigest(), len(data)), c.id


def test_recorded_tokenizer_hashes_match_vendored_files(qwen3_data):
    tok = (qwen3_data / "qwen3-tokenizer" / "tokenizer.json").read_bytes()
    assert hashlib.sha256(tok).hexdigest() == reg.TOKENIZER_JSON_SHA256 and len(tok) == reg.TOKENIZER_JSON_SIZE
    for kind, (name, sha, size) in reg.TOKENIZER_CONFIGS.items():
        data = (qwen3_data / "qwen3-tokenizer" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha, kind
        assert size is None or size == len(data), kind
    # Every real entry verifies its tokenizer_config.json against its own chat kind.
    for c in reg.CHECKPOINTS:
        if not c.synthetic and c.task == "generate":
            assert c.files["tokenizer_config.json"].sha256 == reg.TOKENIZER_CONFIGS[c.chat_template][1]
        elif not c.synthetic:  # retrieval checkpoints: no recorded file facts (their tokenizer differs)
            assert c.files == {} and c.weight_files() is None, c.id


# Qwen3-Embedding / Qwen3-Reranker size -> the Qwen3 checkpoint whose shape they share.
RETRIEVAL_SHAPE_OF = {"0.6b": "qwen3-0.6b", "4b": "qwen3-4b", "8b": "qwen3-8b"}


def test_retrieval_entries_share_the_qwen3_shapes():
    """Issue 56: six retrieval entries, shaped like Qwen3 of their size; tasks follow the variant."""
    got = {c.id: c for c in reg.CHECKPOINTS if c.variant in ("embedding", "reranker") and not c.synthetic}
    assert sorted(got) == sorted(f"qwen3-{k}-{s}" for k in ("embedding", "reranker") for s in RETRIEVAL_SHAPE_OF)
    for c in got.values():
        base = reg.by_id(RETRIEVAL_SHAPE_OF[c.id.rsplit("-", 1)[1]])
        assert (c.d_model, c.n_layer, c.n_q_head, c.d_ff) == (base.d_model, base.n_layer, base.n_q_head, base.d_ff)
        assert c.hub_tie == base.tied_embeddings and c.rope_theta == 1e6, c.id
        # An embedding file is always tied (token_embd only): the 8B's Hub file has no lm_head.
        assert c.tied_embeddings == (c.variant == "embedding" or base.tied_embeddings), c.id
        assert c.hub_prefix == ("" if c.variant == "embedding" else "model.")
        role, size = c.id.split("-")[1:]
        assert c.repository == f"Qwen/Qwen3-{role.capitalize()}-{size.upper()}", c.id
        assert c.hub_vocab_rows in (151665, 151669) and c.chat_template == "none", c.id
        assert c.task == ("embed" if c.variant == "embedding" else "rerank")
    assert reg.by_id("qwen3-embedding-0.6b").context_length == 32768
    assert reg.by_id("synthetic-tiny").task == "generate" and reg.by_id("synthetic-tiny-embedding").task == "embed"


def test_weight_file_facts():
    assert reg.by_id("qwen3-0.6b").weight_files() == ["model.safetensors"]
    assert reg.by_id("qwen3-0.6b").files["model.safetensors"].size == 1503300328
    assert reg.by_id("qwen3-32b").weight_files()[16] == "model-00017-of-00017.safetensors"
    assert reg.by_id("qwen3-1.7b-base").weight_files() is None  # not recorded: never guessed


@pytest.mark.parametrize("id_,params", [("synthetic-0.6b", 596049920), ("synthetic-1.7b", 1720574976),
                                        ("synthetic-4b", 4022468096), ("synthetic-8b", 8190735360)])
def test_real_shape_parameter_counts(id_, params):
    """Synthetic benchmark shapes match the real checkpoints' parameter counts (registry.md)."""
    specs = mk.tensor_specs(reg.by_id(id_))
    assert sum(s.numel for s in specs) == params
    shards = mk.plan_shards(specs, mk.DEFAULT_SHARD_BYTES)
    assert all(sum(s.nbytes for s in sh) <= mk.DEFAULT_SHARD_BYTES or len(sh) == 1 for sh in shards)
    assert [s for sh in shards for s in sh] == specs


# ---------------------------------------------------------------- generator

def _bf16_oracle(x: float) -> int:
    """Nearest BF16 to float32 x, ties to even, by exact rational arithmetic."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    lo = bits & 0xFFFF0000
    cand = [lo, lo + 0x10000]
    val = [Fraction(struct.unpack("<f", struct.pack("<I", c))[0]) for c in cand]
    d0, d1 = abs(Fraction(x) - val[0]), abs(Fraction(x) - val[1])
    pick = cand[0] if d0 < d1 or (d0 == d1 and (cand[0] >> 16) % 2 == 0) else cand[1]
    return pick >> 16


def test_bf16_rounding_matches_exact_oracle():
    xs = np.array([1.0, -2.5, 3.14159265, 1.00390625, 1.01171875, 1e-3, -7.8e-5, 0.1, 65504.0,
                   1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8], dtype=np.float32)
    rng_bits = mk.hash_block(7, 3, 0, 500) >> np.uint64(34)
    xs = np.concatenate([xs, (rng_bits.astype(np.float32) - 2 ** 29) * np.float32(2 ** -27)])
    got = mk.f32_to_bf16(xs)
    assert [int(g) for g in got] == [_bf16_oracle(float(x)) for x in xs]


def test_counter_hash_matches_scalar_splitmix64():
    seed, t = 5, 17
    got = mk.hash_block(seed, t, 1000, 64)
    base = mk.mix64_int(seed)
    for i, g in enumerate(got):
        z = (((t << 40) | (1000 + i)) * 0x9E3779B97F4A7C15 + base) & (2 ** 64 - 1)
        assert int(g) == mk.mix64_int(z)
    # Reference values of splitmix64's finaliser (Vigna's splitmix64.c, seed 0 sequence).
    assert mk.mix64_int(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    assert mk.mix64_int(2 * 0x9E3779B97F4A7C15 % 2 ** 64) == 0x6E789E6AA1B965F4


def test_generated_values_have_intended_distribution():
    c = reg.by_id("synthetic-tiny")
    specs = {s.name: s for s in mk.tensor_specs(c)}
    q = mk.generate(specs["model.layers.0.self_attn.q_proj.weight"], c.seed, 0, 1 << 16)
    qf = (q.astype(np.uint32) << 16).view(np.float32)
    assert abs(qf.mean()) < 0.002 and abs(qf.std() - 256 ** -0.5) < 0.002
    n = mk.generate(specs["model.norm.weight"], c.seed, 0, 256)
    nf = (n.astype(np.uint32) << 16).view(np.float32)
    assert nf.min() >= 0.8 - 1e-2 and nf.max() <= 1.2 + 1e-2 and abs(nf.mean() - 1.0) < 0.03
    # Chunked generation equals one-shot generation (streaming does not change the bytes).
    emb = specs["model.embed_tokens.weight"]
    whole = mk.generate(emb, c.seed, 0, 3000)
    assert np.array_equal(np.concatenate([mk.generate(emb, c.seed, 0, 1234),
                                          mk.generate(emb, c.seed, 1234, 1766)]), whole)


def test_manifest_hashes_of_tiny_checkpoints(synthetic_dir):
    man = json.loads((REPO / "tests" / "checkpoints.sha256.json").read_text())
    assert man["generator"] == reg.SYNTH_GENERATOR and man["shard_bytes"] == mk.DEFAULT_SHARD_BYTES
    assert sorted(man["checkpoints"]) == ["synthetic-tiny", "synthetic-tiny-untied"]
    for id_, entry in man["checkpoints"].items():
        d = synthetic_dir(id_)
        assert entry["revision"] == reg.by_id(id_).revision
        assert sorted(p.name for p in d.iterdir()) == sorted(entry["files"]), id_
        for name, want in entry["files"].items():
            data = (d / name).read_bytes()
            assert (hashlib.sha256(data).hexdigest(), len(data)) == (want["sha256"], want["size"]), \
                f"{id_}/{name} differs from tests/checkpoints.sha256.json"


def test_hf_layout_single_and_sharded(synthetic_dir, qwen3_data):
    from safetensors import safe_open

    for id_, shards in (("synthetic-tiny", 1), ("synthetic-tiny-untied", 3)):
        c, d = reg.by_id(id_), synthetic_dir(id_)
        cfg = json.loads((d / "config.json").read_text())
        template = json.loads((qwen3_data / "qwen3-configs" / "Qwen3-0.6B.config.json").read_text())
        assert sorted(cfg) == sorted(template) and cfg["architectures"] == ["Qwen3ForCausalLM"]
        gen = json.loads((d / "generation_config.json").read_text())
        assert gen["eos_token_id"] == (151643 if c.variant == "base" else [151645, 151643])
        tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
        assert tok_cfg["eos_token"] == ("<|endoftext|>" if c.variant == "base" else "<|im_end|>")
        expect = {s.name: s.shape for s in mk.tensor_specs(c)}
        assert ("lm_head.weight" in expect) == (not c.tied_embeddings)
        files = ["model.safetensors"] if shards == 1 else mk.shard_names(shards)
        seen, total = {}, 0
        for fn in files:
            with safe_open(str(d / fn), "np") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    assert sl.get_dtype() == "BF16"
                    seen[k] = (tuple(sl.get_shape()), fn)
                    total += 2 * int(np.prod(sl.get_shape()))
        assert {k: v[0] for k, v in seen.items()} == expect
        if shards > 1:
            idx = json.loads((d / "model.safetensors.index.json").read_text())
            assert idx["metadata"]["total_size"] == total
            assert idx["weight_map"] == {k: v[1] for k, v in seen.items()}


def _bf16_load(path: Path) -> dict[str, np.ndarray]:
    """Tiny safetensors reader (own code, float32 out) for the numpy forward below."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k != "__metadata__":
            b, e = v["data_offsets"]
            u = np.frombuffer(raw, dtype="<u2", count=(e - b) // 2, offset=8 + n + b)
            out[k] = (u.astype(np.uint32) << 16).view(np.float32).reshape(v["shape"])
    return out


def _qwen3_logits(w: dict[str, np.ndarray], c: reg.Checkpoint, ids: list[int]) -> np.ndarray:
    """Plain numpy Qwen3 forward (seed 000 layer order), FP32: [len(ids)][vocab] logits."""
    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
    T, hd = len(ids), 128
    pos = np.arange(T)[:, None]
    inv = 1e6 ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)

    def rope(x):  # [T][heads][128], rotate-half convention of transformers
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        cs, sn = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * cs - b * sn, b * cs + a * sn], -1)
    h = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c.n_layer):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(T, c.n_q_head, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(T, 8, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, 8, hd)
        q, k = rope(rms(q, w[p + "self_attn.q_norm.weight"])), rope(rms(k, w[p + "self_attn.k_norm.weight"]))
        g = c.n_q_head // 8
        att = np.empty((T, c.n_q_head, hd))
        for hq in range(c.n_q_head):
            s = q[:, hq] @ k[:, hq // g].T / np.sqrt(hd) + mask
            pr = np.exp(s - s.max(-1, keepdims=True))
            att[:, hq] = (pr / pr.sum(-1, keepdims=True)) @ v[:, hq // g]
        h = h + att.reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gt = x @ w[p + "mlp.gate_proj.weight"].T
        h = h + (gt / (1 + np.exp(-gt)) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if c.tied_embeddings else w["lm_head.weight"]
    return rms(h, w["model.norm.weight"]) @ head.T


def test_tiny_logits_spread_like_a_real_model(synthetic_dir):
    """Logit std of a few units and a clear top-1 margin, so argmax gates mean something."""
    c = reg.by_id("synthetic-tiny")
    w = _bf16_load(synthetic_dir(c.id) / "model.safetensors")
    ids = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 151644, 872]
    lg = _qwen3_logits(w, c, ids)[:, :reg.N_TOKENS]
    std = lg.std(1)
    top2 = np.sort(lg, 1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    assert np.all((std > 2) & (std < 6)), std
    assert np.median(margin) > 0.5, margin
    assert len(set(lg.argmax(1).tolist())) >= len(ids) // 2  # the argmax follows the input


# ---------------------------------------------------------------- make_checkpoint CLI

def test_make_checkpoint_refuses_real_and_unknown_ids(tmp_path):
    for id_, needle in (("qwen3-4b", "real checkpoint"), ("qwen9", "unknown checkpoint id 'qwen9'")):
        r = subprocess.run([sys.executable, str(REPO / "tools" / "make_checkpoint.py"), "--checkpoint", id_,
                            "--out", str(tmp_path / id_)], capture_output=True, text=True)
        assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / id_ / "config.json").exists()


def test_big_shape_first_shard_starts_streaming(tmp_path):
    """synthetic-8b is not generated in tests: only the first MiB of its first shard."""
    c = reg.by_id("synthetic-8b")
    written = mk.write_checkpoint(c, tmp_path, stop_after_bytes=1 << 20)
    nshards = len(mk.plan_shards(mk.tensor_specs(c), mk.DEFAULT_SHARD_BYTES))
    assert written == [f"model-00001-of-{nshards:05d}.safetensors.part"] and nshards > 100
    raw = (tmp_path / written[0]).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    assert hdr["model.embed_tokens.weight"] == {"dtype": "BF16", "shape": [151936, 4096],
                                                "data_offsets": [0, 151936 * 4096 * 2]}
    assert len(raw) == 8 + n + (1 << 20)
    first = mk.tensor_specs(c)[0]
    assert raw[8 + n:] == mk.generate(first, c.seed, 0, 1 << 19).astype("<u2").tobytes()


# ---------------------------------------------------------------- formats

def test_format_table_matches_c_table():
    """tools/quant_blocks.py FORMATS and QUANTIZABLE are kernels/formats.h's lists, row by row."""
    import quant_blocks as qb

    text = (REPO / "kernels" / "formats.h").read_text()
    body = re.search(r"#define KIPP_FMT_LIST\(X\)(.*?)\n\n", text, re.S).group(1)
    rows = re.findall(r'X\((\w+),\s*(\d+),\s*"(\w+)",\s*"(\w+)",\s*(\d+),\s*(\d+)\)', body)
    c_rows = [qb.Format(i, int(g), tn, sch, int(b), int(bb)) for i, g, tn, sch, b, bb in rows]
    assert c_rows and c_rows == list(qb.FORMATS)
    quant = re.search(r"#define KIPP_QUANTIZABLE_LIST\(X\)(.*)", text).group(1)
    assert tuple(re.findall(r"X\((\w+)\)", quant)) == qb.QUANTIZABLE


def test_converter_schemes_follow_the_format_table():
    import convert_to_gguf as cv
    import quant_blocks as qb

    assert list(cv.QUANT_SCHEMES) == [f.scheme for f in qb.FORMATS]
    for f in qb.FORMATS:
        assert cv.tensor_type("blk.0.attn_q.weight", f.scheme) == f.gguf_type
        assert cv.tensor_type("blk.0.attn_norm.weight", f.scheme) == qb.GGML_TYPE_BF16
        assert cv.tensor_bytes(f.gguf_type, (16, 64)) == 16 * 64 // f.block * f.block_bytes
