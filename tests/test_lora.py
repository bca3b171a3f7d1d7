"""test_lora.py - LoRA adapters merged at load, end to end.

A synthetic PEFT adapter (tools/make_lora.py) goes the path a trained one
takes: tools/convert_lora_to_gguf.py, then `kipp logits --lora`. Gates:
  - BF16: the merged model's logits against the numpy oracle (tools/np_forward.py,
    no Kipp code) run on the file's weights plus scale*alpha/r * B.A computed here
    in float64: NMSE <= 5e-5 (ref backend: FP32 matvec; only BF16 rounding of the
    merged weights and of the KV cache remains);
  - scale 0 reproduces the file bitwise (same logits bytes) for bf16, q8_0 and
    affine4_gs32, and PATH:SCALE scales the delta (scale 2 differs from scale 1);
  - the adapter file's layout is llama.cpp's (names, GGUF dims, keys);
  - every refusal (bad shape, missing half, unknown tensor, wrong architecture,
    wrong checkpoint, rank 0, not an adapter, a bad --lora argument, converter
    input errors) exits non-zero with a message naming the tensor or key and
    what was expected.
The unbiasedness of the quantized merge is tests/test_lora.c.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT, models_dir

import convert_lora_to_gguf as conv
import make_lora
import np_forward
import checkpoints as reg

KIPP = REPO_ROOT / "build" / "kipp"
PROMPT = "The quick brown fox jumps over the lazy dog"
RANK, ALPHA, STD = 8, 16.0, 0.05
NMSE_BOUND = 5e-5  # BF16 merge against the oracle: the CPU contract's bound


def gguf(name: str) -> Path:
    p = models_dir() / name
    assert p.is_file(), f"{p} is missing: run `make models-test`"
    return p


def kipp(*args: str) -> subprocess.CompletedProcess:
    assert KIPP.is_file(), f"{KIPP} is missing: run `make all`"
    return subprocess.run([str(KIPP), *args], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)


def logits(tmp: Path, model: Path, *extra: str, backend: str = "ref") -> bytes:
    out = tmp / f"logits-{abs(hash((str(model), extra, backend)))}.f32"
    threads = ["--threads", "1"] if backend == "ref" else []
    r = kipp("logits", "--model", str(model), "--prompt", PROMPT, "--out", str(out), "--backend", backend,
             *threads, *extra)
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> tuple[Path, Path]:
    """(PEFT directory, converted GGUF) of the seeded synthetic adapter for synthetic-tiny."""
    d = tmp_path_factory.mktemp("lora")
    assert make_lora.main(["--checkpoint", "synthetic-tiny", "--out", str(d / "peft"), "--rank", str(RANK),
                           "--alpha", str(ALPHA), "--seed", "7", "--std", str(STD)]) == 0
    assert conv.main(["--checkpoint", "synthetic-tiny", "--input", str(d / "peft"), "--out", str(d / "a.gguf")]) == 0
    return d / "peft", d / "a.gguf"


def peft_deltas(peft: Path, scale: float) -> dict[str, np.ndarray]:
    """GGUF base name -> scale*alpha/r * B @ A in float64, from the PEFT files (not the GGUF)."""
    cfg = json.loads((peft / "adapter_config.json").read_text())
    t = conv.read_safetensors(peft / "adapter_model.safetensors")
    out = {}
    for name, a in t.items():
        m = conv.PEFT_RE.match(name)
        if not m or m.group(4) != "A":
            continue
        b = t[name.replace("lora_A", "lora_B")]
        base = f"blk.{m.group(1)}.{make_lora.MODULES[m.group(3)][1]}.weight"
        out[base] = scale * cfg["lora_alpha"] / cfg["r"] * (b.astype(np.float64) @ a.astype(np.float64))
    return out


def nmse(a: np.ndarray, ref: np.ndarray) -> float:
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    return float(np.sum((a - ref) ** 2) / np.sum(ref ** 2))


def test_layout_is_llama_cpp(adapter):
    from gguf import GGUFReader
    r = GGUFReader(str(adapter[1]))
    assert r.fields["general.type"].contents() == "adapter"
    assert r.fields["adapter.type"].contents() == "lora"
    assert r.fields["general.architecture"].contents() == "qwen3"
    assert float(r.fields["adapter.lora.alpha"].contents()) == ALPHA
    c = reg.by_id("synthetic-tiny")
    names = {t.name: [int(x) for x in t.shape] for t in r.tensors}  # GGUF dims, fastest first
    assert len(names) == 2 * 7 * c.n_layer
    assert names["blk.0.attn_q.weight.lora_a"] == [c.d_model, RANK]
    assert names["blk.0.attn_q.weight.lora_b"] == [RANK, c.attn_width]
    assert names["blk.1.ffn_down.weight.lora_a"] == [c.d_ff, RANK]
    assert names["blk.1.ffn_down.weight.lora_b"] == [RANK, c.d_model]


@pytest.fixture(scope="module")
def oracle(adapter) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(prompt ids, oracle logits of the file, oracle logits with the adapter at scale 1)."""
    model = gguf("synthetic-tiny.gguf")
    ids = json.loads(kipp("tokenize", "--model", str(model), "--text", PROMPT).stdout)
    meta, w = np_forward.load_weights(model)
    base = np_forward.forward(meta, w, ids, [len(ids) - 1])[0]
    for name, d in peft_deltas(adapter[0], 1.0).items():
        w[name] = (w[name].astype(np.float64) + d).astype(np.float32)
    return ids, base, np_forward.forward(meta, w, ids, [len(ids) - 1])[0]


@pytest.mark.parametrize("loras", [["{a}"], ["{a}:0.5", "{a}:0.5"]], ids=["one", "two-halves"])
def test_bf16_merge_matches_numpy_oracle(adapter, oracle, tmp_path, loras):
    """One adapter, and two half-scale copies (their deltas add up before the one merge)."""
    _, base_ref, ref = oracle
    args = [x for l in loras for x in ("--lora", l.format(a=adapter[1]))]
    got = np.frombuffer(logits(tmp_path, gguf("synthetic-tiny.gguf"), *args), dtype=np.float32)
    e, moved = nmse(got, ref), nmse(base_ref, ref)
    print(f"bf16 merge {loras}: logits NMSE vs oracle {e:.3g} (bound {NMSE_BOUND}); "
          f"the adapter moves the logits by {moved:.3g}")
    assert moved > 100 * NMSE_BOUND, f"the adapter barely changes the logits ({moved:.3g}): the gate would prove nothing"
    assert e <= NMSE_BOUND, f"BF16 merge logits NMSE {e:.3g} > {NMSE_BOUND}"
    assert int(np.argmax(got)) == int(np.argmax(ref))


@pytest.mark.parametrize("name", ["synthetic-tiny.gguf", "synthetic-tiny-q8_0.gguf",
                                  "synthetic-tiny-affine4_gs32.gguf"])
def test_scale_zero_is_bitwise_the_file(adapter, tmp_path, name):
    model = gguf(name)
    base = logits(tmp_path, model, backend="cpu")
    assert logits(tmp_path, model, "--lora", f"{adapter[1]}:0", backend="cpu") == base
    one = logits(tmp_path, model, "--lora", str(adapter[1]), backend="cpu")
    two = logits(tmp_path, model, "--lora", f"{adapter[1]}:2", backend="cpu")
    assert one != base and two != one


# ------------------------------------------------------------------ refusals

def write_adapter(path: Path, tensors: dict[str, np.ndarray], arch: str = "qwen3", kind: str = "adapter",
                  ckpt: str | None = "synthetic-tiny", alpha: float = 16.0) -> Path:
    """A hand-made adapter GGUF (numpy shapes: row-major, i.e. GGUF dims reversed)."""
    import gguf as g
    w = g.GGUFWriter(str(path), arch)
    w.add_string("general.type", kind)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    if ckpt:
        w.add_string("kipp.checkpoint.id", ckpt)
    for n, a in tensors.items():
        w.add_tensor(n, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def q_pair(r: int = 4, n_in: int = 256, n_out: int = 2048) -> dict[str, np.ndarray]:
    return {"blk.0.attn_q.weight.lora_a": np.ones((r, n_in)), "blk.0.attn_q.weight.lora_b": np.ones((n_out, r))}


def refusal(tmp_path: Path, path: Path) -> str:
    r = kipp("logits", "--model", str(gguf("synthetic-tiny.gguf")), "--prompt", "hi", "--out",
             str(tmp_path / "x.f32"), "--lora", str(path))
    assert r.returncode == 1, f"expected a refusal, got exit {r.returncode}: {r.stderr}"
    assert not (tmp_path / "x.f32").exists()
    return r.stderr


def test_good_hand_made_adapter_loads(tmp_path):
    p = write_adapter(tmp_path / "ok.gguf", q_pair())
    logits(tmp_path, gguf("synthetic-tiny.gguf"), "--lora", f"{p}:0.001")


@pytest.mark.parametrize("case,tensors,kw,expect", [
    ("bad shape a", {"blk.0.attn_q.weight.lora_a": np.ones((4, 255)), "blk.0.attn_q.weight.lora_b": np.ones((2048, 4))},
     {}, ["blk.0.attn_q.weight.lora_a", "expected [256, 4]"]),
    ("bad shape b", {"blk.0.attn_q.weight.lora_a": np.ones((4, 256)), "blk.0.attn_q.weight.lora_b": np.ones((1024, 4))},
     {}, ["blk.0.attn_q.weight.lora_b", "expected [4, 2048]"]),
    ("rank mismatch", {"blk.0.attn_q.weight.lora_a": np.ones((3, 256)), "blk.0.attn_q.weight.lora_b": np.ones((2048, 4))},
     {}, ["blk.0.attn_q.weight.lora_a", "expected [256, 4]"]),
    ("missing half", {"blk.0.attn_q.weight.lora_a": np.ones((4, 256))}, {},
     ["blk.0.attn_q.weight.lora_b", "no other half"]),
    ("unknown tensor", {**q_pair(), "blk.0.attn_x.weight.lora_a": np.ones((4, 256))}, {},
     ["blk.0.attn_x.weight.lora_a", "no tensor 'blk.0.attn_x.weight'"]),
    ("not lora", {**q_pair(), "blk.0.attn_q.weight": np.ones((4, 256))}, {},
     ["unknown tensor 'blk.0.attn_q.weight'", ".lora_a"]),
    ("1-D target", {"blk.0.attn_norm.weight.lora_a": np.ones((4, 256)),
                    "blk.0.attn_norm.weight.lora_b": np.ones((256, 4))}, {}, ["attn_norm", "2-D"]),
    ("tied head", {"output.weight.lora_a": np.ones((4, 256)), "output.weight.lora_b": np.ones((151936, 4))}, {},
     ["output.weight.lora_a", "no tensor 'output.weight'"]),
    ("wrong arch", q_pair(), {"arch": "llama"}, ["general.architecture", "'llama'", "expected 'qwen3'"]),
    ("wrong checkpoint", q_pair(), {"ckpt": "synthetic-tiny-untied"},
     ["kipp.checkpoint.id", "synthetic-tiny-untied", "expected 'synthetic-tiny'"]),
    ("not an adapter", q_pair(), {"kind": "model"}, ["general.type", "expected 'adapter'"]),
    ("rank 0", {"blk.0.attn_q.weight.lora_a": np.ones((0, 256)), "blk.0.attn_q.weight.lora_b": np.ones((2048, 0))},
     {}, ["blk.0.attn_q.weight.lora_a", "is 0"]),
    ("nan", {"blk.0.attn_q.weight.lora_a": np.full((4, 256), np.nan), "blk.0.attn_q.weight.lora_b": np.ones((2048, 4))},
     {}, ["blk.0.attn_q.weight.lora_a", "finite"]),
])
def test_refusals_name_tensor_and_expectation(tmp_path, case, tensors, kw, expect):
    err = refusal(tmp_path, write_adapter(tmp_path / "bad.gguf", tensors, **kw))
    for s in expect:
        assert s in err, f"{case}: '{s}' not in: {err}"


def test_lora_argument_errors(tmp_path):
    base = ["logits", "--model", str(gguf("synthetic-tiny.gguf")), "--prompt", "hi", "--out", str(tmp_path / "x")]
    for arg, expect in ((":1", "empty path"), ("a.gguf:", "empty scale"), ("a.gguf:inf", "not finite")):
        r = kipp(*base, "--lora", arg)
        assert r.returncode == 2 and expect in r.stderr, (arg, r.stderr)
    r = kipp(*base, "--lora", str(tmp_path / "absent.gguf"))
    assert r.returncode == 1 and "absent.gguf" in r.stderr


def test_converter_refusals(tmp_path, adapter):
    cfg = json.loads((adapter[0] / "adapter_config.json").read_text())
    for key, val, expect in (("use_dora", True, "use_dora"), ("r", 0, "r is 0"),
                             ("rank_pattern", {"q_proj": 4}, "rank_pattern"), ("peft_type", "IA3", "peft_type")):
        with pytest.raises(conv.ConvertError, match=expect):
            conv.check_config({**cfg, key: val})
    t = conv.read_safetensors(adapter[0] / "adapter_model.safetensors")
    bad = dict(t)
    bad["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] = np.ones((RANK, 255), np.float32)
    with pytest.raises(conv.ConvertError, match=r"q_proj.lora_A.weight' has shape \[8, 255\], expected \[8, 256\]"):
        conv.plan(reg.by_id("synthetic-tiny"), bad, RANK)
    bad = dict(t)
    del bad["base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"]
    with pytest.raises(conv.ConvertError, match="blk.1.ffn_up.weight' has lora_A but no lora_B"):
        conv.plan(reg.by_id("synthetic-tiny"), bad, RANK)
    with pytest.raises(conv.ConvertError, match="layer 2"):
        conv.plan(reg.by_id("synthetic-tiny"),
                  {"base_model.model.model.layers.2.mlp.up_proj.lora_A.weight": np.ones((RANK, 256), np.float32)}, RANK)


# ------------------------------------------------------------ other front ends

def test_serve_and_generate_share_the_merge(adapter):
    """kipp-serve --lora and kipp generate --lora give the same greedy text; scale 0 serves the file's text."""
    from serve_harness import Server
    model = gguf("synthetic-tiny.gguf")
    body = {"model": "synthetic-tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}

    def served(*args: str) -> str:
        with Server(model, *args) as s:
            st, r = s.post("/v1/completions", body)
            assert st == 200, r
            return r["choices"][0]["text"]

    base, zero, merged = served(), served("--lora", f"{adapter[1]}:0"), served("--lora", str(adapter[1]))
    assert zero == base and merged != base
    g = kipp("generate", "--model", str(model), "--prompt", PROMPT, "--max-tokens", "12", "--threads", "2",
             "--lora", str(adapter[1]))
    assert g.returncode == 0, g.stderr
    assert g.stdout.rstrip("\n") == merged


def test_bench_and_serve_refuse_a_bad_adapter(tmp_path):
    bad = write_adapter(tmp_path / "bad.gguf", q_pair(), arch="llama")
    from serve_harness import SERVE
    r = subprocess.run([str(SERVE), "--model", str(gguf("synthetic-tiny.gguf")), "--port", "0", "--lora", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "general.architecture" in r.stderr, r.stderr
    r = subprocess.run([str(REPO_ROOT / "build" / "kipp-bench"), "--model", str(gguf("synthetic-tiny.gguf")),
                        "--bench", "tg128", "--reps", "1", "--warmup", "0", "--out", str(tmp_path),
                        "--lora", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "general.architecture" in r.stderr, r.stderr


def test_tied_embedding_adapter_changes_the_lookup_only(tmp_path):
    """An embed_tokens adapter on the tied synthetic-tiny: the oracle adds the delta to the
    input lookup and keeps the file's matrix as the head (llama.cpp and PEFT semantics)."""
    peft, out = tmp_path / "peft", tmp_path / "e.gguf"
    assert make_lora.main(["--checkpoint", "synthetic-tiny", "--out", str(peft), "--rank", "4", "--seed", "3",
                           "--targets", "q", "--embed", "--std", "0.1"]) == 0
    assert conv.main(["--checkpoint", "synthetic-tiny", "--input", str(peft), "--out", str(out)]) == 0
    model = gguf("synthetic-tiny.gguf")
    ids = json.loads(kipp("tokenize", "--model", str(model), "--text", PROMPT).stdout)
    meta, w = np_forward.load_weights(model)
    t = conv.read_safetensors(peft / "adapter_model.safetensors")
    a = t["base_model.model.model.embed_tokens.lora_embedding_A"].astype(np.float64)  # [r][vocab]
    b = t["base_model.model.model.embed_tokens.lora_embedding_B"].astype(np.float64)  # [d][r]
    head = w["token_embd.weight"].copy()
    w["token_embd.weight"] = (w["token_embd.weight"] + 16.0 / 4 * (b @ a).T).astype(np.float32)
    for name, d in peft_deltas(peft, 1.0).items():
        w[name] = (w[name].astype(np.float64) + d).astype(np.float32)
    meta["kipp.tied_embeddings"], w["output.weight"] = False, head  # the head stays the file's
    ref = np_forward.forward(meta, w, ids, [len(ids) - 1])[0]
    w["output.weight"] = w["token_embd.weight"]  # what a merge that also changed the head would give
    wrong = np_forward.forward(meta, w, ids, [len(ids) - 1])[0]
    got = np.frombuffer(logits(tmp_path, model, "--lora", str(out)), dtype=np.float32)
    e, e_wrong = nmse(got, ref), nmse(got, wrong)
    print(f"tied embedding adapter: NMSE vs lookup-only oracle {e:.3g}, vs head-changed oracle {e_wrong:.3g}")
    assert e <= NMSE_BOUND and e_wrong > 100 * NMSE_BOUND


def test_corrupted_adapters_are_refused_not_crashed(tmp_path):
    """Seeded byte corruptions of a valid adapter (header, directory, data): every run ends in
    a merge or a refusal with a message, never a signal."""
    good = write_adapter(tmp_path / "good.gguf", q_pair(r=2))
    raw = bytearray(good.read_bytes())
    rng = np.random.Generator(np.random.PCG64(38))
    data_start = len(raw) - 4 * 2 * (256 + 2048)
    refused = 0
    for i in range(40):
        b = bytearray(raw)
        hi = data_start if i % 4 else len(raw)  # mostly the header and directory, where the parsing is
        for pos in rng.integers(0, hi, size=int(rng.integers(1, 4))):
            b[pos] = int(rng.integers(0, 256))
        p = tmp_path / f"c{i}.gguf"
        p.write_bytes(bytes(b))
        r = kipp("logits", "--model", str(gguf("synthetic-tiny.gguf")), "--prompt", "hi", "--out",
                 str(tmp_path / "x.f32"), "--backend", "ref", "--threads", "1", "--lora", f"{p}:0.01")
        assert r.returncode in (0, 1), f"corruption {i}: exit {r.returncode}\n{r.stderr}"
        if r.returncode:
            refused += 1
            assert "LoRA adapter" in r.stderr and str(p) in r.stderr, r.stderr
    assert refused > 0
