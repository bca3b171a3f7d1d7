"""test_plan.py - `kipp plan` and `--ctx 0`.

Oracles, none of them the planner's code:
  - the machine: /proc/cpuinfo (core ids per package), os.cpu_count, /proc/meminfo;
  - the model's needs: its Hugging Face config.json (shapes -> KV bytes per
    token, bytes and FLOPs per token in each format from the block sizes of
    tools/quant_blocks.py's FORMATS);
  - Kipp's shares: the median of the newest results/*-cpu-*.json of this CPU
    id and level by docs/PLANNING.md's rule, found and read here with Python's json;
  - the arithmetic: the predictions recomputed from the plan's own measured
    inputs with the formulas docs/PLANNING.md states.
The measured figures themselves (bandwidth, peak, disk) vary with the load of
this shared machine: only their presence and sign are checked here; their
accuracy is the benchmark's business (make bench).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, models_dir

KIPP = REPO_ROOT / "build" / "kipp"
SERVE = REPO_ROOT / "build" / "kipp-serve"
TG_CONTEXT, PP = 80.5, 512.0


def tiny() -> Path:
    return models_dir() / "synthetic-tiny.gguf"


def plan(*extra: str, env=None) -> dict:
    r = subprocess.run([str(KIPP), "plan", "--model", str(tiny()), "--json", *extra], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def cpu_levels() -> list[str]:
    flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    levels = ["ref"]
    if {"avx2", "fma", "f16c"} <= flags:
        levels.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            levels.append("avx512")
            if "avx512_bf16" in flags:
                levels.append("avx512_bf16")
    return levels


def physical_cores() -> int:
    cores, phys = set(), None
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("physical id"):
            phys = line.split(":")[1].strip()
        elif line.startswith("core id"):
            cores.add((phys, line.split(":")[1].strip()))
    return len(cores) or os.cpu_count()


def meminfo(key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M).group(1)) * 1024


def block_facts():
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    import quant_blocks
    return {f.scheme: (f.block, f.block_bytes) for f in quant_blocks.FORMATS}


def needs(cfg: dict, block: int, block_bytes: int) -> tuple[float, float, float]:
    """(weight bytes, decode bytes per token at the tg128 context, prefill FLOPs per token at pp512)."""
    D, L, F, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or D // cfg["num_attention_heads"]
    A, KV = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    params = L * ((A + 2 * KV) * D + D * A + 3 * F * D)
    layers = params * block_bytes / block + 2 * L * (2 * D + 2 * hd)
    head = 2.0 * V * D
    embd = 0 if cfg.get("tie_word_embeddings") else 2.0 * V * D
    kv = L * 2 * KV * 2
    decode = layers + head + 4.0 * D + TG_CONTEXT * kv
    prefill = 2 * params + L * 4 * A * (PP + 1) / 2 + 2 * head / 2 / PP
    return layers + head + embd, decode, prefill


@pytest.fixture(scope="module")
def cfg():
    return json.loads((models_dir() / "synthetic-tiny" / "config.json").read_text())


@pytest.fixture(scope="module")
def p():
    return plan()


def test_machine_matches_the_system(p):
    m = p["machine"]
    assert m["logical_cpus"] == os.cpu_count()
    assert m["physical_cores"] == physical_cores()
    assert m["ram_total_bytes"] <= meminfo("MemTotal")
    assert 0 < m["ram_available_bytes"] <= m["ram_total_bytes"]
    assert abs(m["ram_available_bytes"] - meminfo("MemAvailable")) < 0.25 * meminfo("MemTotal")
    assert m["isa"] == cpu_levels()[-1]
    assert m["ram_read_gbps"] > 0 and m["peak_gflops"] > 0
    assert m["disk_read_gbps"] > 0 and 0 < m["disk_sample_bytes"] <= min(tiny().stat().st_size + 4096, 256 << 20)


def test_kv_context_and_residency(p, cfg):
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * hd * 2  # K and V, BF16
    assert p["kv_bytes_per_token"] == kv
    assert p["context_length"] == cfg["max_position_embeddings"]
    avail = p["machine"]["ram_available_bytes"]
    weights = tiny().stat().st_size
    assert p["streamed"] is False and p["layers_resident"] == cfg["num_hidden_layers"] and p["layers_streamed"] == 0
    assert weights <= 0.75 * avail
    # usable = available - the resident weights (the file's tensor bytes: a little less than the file)
    assert avail - weights <= p["usable_ram_bytes"] <= avail
    want = min(p["context_length"], p["usable_ram_bytes"] // 4 // kv) // 32 * 32
    assert p["ctx"] == want


SCHEMES = ("q8_0", "affine4_gs32")


def row_format(r: dict) -> str:
    """A row's format; kipp-bench wrote "bf16" for every file before it read the file's scheme, and such a row's
    model name (<id>-<scheme>[-head_<head>]) still says it."""
    fmt, model = r.get("format"), r.get("model", "").split("-head_")[0]
    if fmt == "bf16":
        fmt = next((q for q in SCHEMES if model.endswith("-" + q)), fmt)
    return fmt


def newest_shares(cpu_id: str, isa: str, fmt: str, cores: int, stem: str):
    """(decode, prefill, batch8 share) by docs/PLANNING.md's rule: the tg128/pp512/batch8 rows of this CPU id,
    level and format (tg128: its share of the read bandwidth; pp512 and batch8: plan.limit_share); only the
    planned model's rows (model == stem) when it has any; of those only runs that started quiet (others used
    under 25% of the CPUs in the second before; runs without that figure: a load average below half the cores,
    or none recorded) when there are any; the median of the newest three."""
    rows = {"tg128": [], "pp512": [], "batch8": []}
    for f in (REPO_ROOT / "results").glob("*-cpu-*.json"):
        d = json.loads(f.read_text())
        if d.get("schema") != "kipp.bench.v1" or d.get("cpu", {}).get("cpu_id") != cpu_id:
            continue
        if d.get("config", {}).get("isa") != isa:
            continue
        for r in d["results"]:
            if row_format(r) != fmt or r.get("name") not in rows:
                continue
            if r["name"] == "tg128":
                s = r.get("roofline_share") if r.get("roofline_ref", "").startswith("read_gbps") else None
            else:
                s = (r.get("plan") or {}).get("limit_share")
            if not s or s <= 0:
                continue
            busy, load = d["config"].get("cpu_busy_others_at_start"), d["config"].get("load_avg_1min_at_start")
            quiet = busy < 0.25 if busy is not None and busy >= 0 else load is None or load < 0.5 * cores
            rows[r["name"]].append((d["date"], s, quiet, r["model"] == stem))
    out = []
    for name in ("tg128", "pp512", "batch8"):
        rs = rows[name]
        if any(x[3] for x in rs):
            rs = [x for x in rs if x[3]]
        if any(x[2] for x in rs):
            rs = [x for x in rs if x[2]]
        newest = sorted(rs, key=lambda x: x[0], reverse=True)[:3]
        out.append(statistics.median(x[1] for x in newest) if newest else None)
    return tuple(out)


def arith(m: dict, fmt: str, quant_head: bool = False) -> dict:
    """The instruction each part runs (docs/PLANNING.md): bf16 projections on the BF16 dot where the plan's
    bf16_act says so (mixed: all but Q|K|V; bf16: all), q8_0/affine4 on the int8 dot where the machine has one,
    attention on the BF16 dot in the mixed and bf16 modes; a bf16 file's head on the BF16 dot in those modes, a
    quantized head on the int8 dot where the machine has one, a bf16 head beside quantized layers on FP32."""
    dot = m["bf16_dot_gflops"] > 0 and m["bf16_act"] != "f32"
    vnni = m["int8_dot_gops"] > 0
    if fmt == "bf16":
        qkv, rest = ("bf16" if dot and m["bf16_act"] == "bf16" else "fp32"), ("bf16" if dot else "fp32")
    else:
        qkv = rest = "int8" if vnni else "fp32"
    return {"qkv": qkv, "rest": rest, "attn": "bf16" if dot else "fp32",
            "head": "int8" if quant_head and vnni else "bf16" if fmt == "bf16" and not quant_head and dot else "fp32"}


def parts_seconds(cfg: dict, m: dict, a: dict, rows: float, ctx: float, head_rows: float) -> float:
    """Seconds of a step's FLOPs with each part at its instruction's peak."""
    D, L, F, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or D // cfg["num_attention_heads"]
    A, KV = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    peak = {"fp32": m["peak_gflops"], "bf16": m["bf16_dot_gflops"], "int8": m["int8_dot_gops"]}
    flops = {"qkv": rows * 2 * L * (A + 2 * KV) * D, "rest": rows * 2 * L * (D * A + 3 * F * D),
             "attn": rows * L * 4 * A * ctx, "head": head_rows * 2 * V * D}
    return sum(f / (peak[a[k]] * 1e9) for k, f in flops.items())


def test_predictions_follow_the_stated_arithmetic(p, cfg):
    m, facts = p["machine"], block_facts()
    assert [f["format"] for f in p["formats"]] == list(facts)
    for f in p["formats"]:
        weights, decode_b, prefill_f = needs(cfg, *facts[f["format"]])
        assert f["weight_bytes"] == pytest.approx(weights, rel=1e-9)
        assert f["decode_bytes_per_token"] == pytest.approx(decode_b, rel=1e-9)
        assert f["prefill_flops_per_token"] == pytest.approx(prefill_f, rel=1e-9)
        stem = "synthetic-tiny" + ("" if f["format"] == "bf16" else "-" + f["format"])
        d_share, p_share, b_share = newest_shares(m["cpu_id"], m["isa"], f["format"], m["physical_cores"], stem)
        assert f["decode_share"] == pytest.approx(d_share if d_share else 0.80, rel=1e-6), f
        assert f["prefill_share"] == pytest.approx(p_share if p_share else 0.60, rel=1e-6), f
        assert f["batch8"]["share"] == pytest.approx(b_share if b_share else 0.60, rel=1e-6), f
        assert (f["decode_share_source"] == "assumed") == (d_share is None)
        assert (f["prefill_share_source"] == "assumed") == (p_share is None)
        assert f["decode_tok_s"] == pytest.approx(m["ram_read_gbps"] * 1e9 * f["decode_share"] / decode_b, rel=1e-6)
        limit = 1 / parts_seconds(cfg, m, arith(m, f["format"]), 1, (PP + 1) / 2, 1 / PP)
        assert f["prefill_limit_tok_s"] == pytest.approx(limit, rel=1e-6)
        assert f["prefill_tok_s"] == pytest.approx(limit * f["prefill_share"], rel=1e-6)
        assert f"{f['decode_tok_s']:.1f} tok/s" in f["rationale"] and f"{f['prefill_tok_s']:.1f} tok/s" in f["rationale"]


def fake_profile(tmp_path: Path, **peaks) -> Path:
    """A kipp.profile.v1 file with round figures (an old profile's shape when a peak is None or left out)."""
    doc = {"schema": "kipp.profile.v1", "isa": {"kernel_isa": peaks.pop("isa", "avx512_bf16")},
           "cpu": {"cpu_id": "test-cpu"}, "bandwidth": {"read_gbps_all": 10.0, "read_gbps_1t": 6.0},
           "peaks": {"fp32_fma_gflops_all": 100.0} | {k: v for k, v in peaks.items()}}
    f = tmp_path / "profile.json"
    f.write_text(json.dumps(doc))
    return f


def test_a_fake_profile_gives_the_hand_figures(tmp_path):
    """--profile: the peaks and bandwidth of the file, not probes (the JSON's 9 digits bound the match); synthetic-tiny's pp512 and batch8 limits at
    10 GB/s, FP32 100, BF16 dot 200, int8 dot 400 (GFLOP/s), worked out by hand in tests/test_plan_arith.c."""
    prof = fake_profile(tmp_path, bf16_dot_gflops_all=200.0, int8_dot_gops_all=400.0)
    env = {k: v for k, v in os.environ.items() if k != "KIPP_BF16_ACT"}
    q = plan("--profile", str(prof), "--results", str(tmp_path), env=env)
    m = q["machine"]
    assert (m["ram_read_gbps"], m["peak_gflops"], m["bf16_dot_gflops"], m["int8_dot_gops"]) == (10, 100, 200, 400)
    assert m["cpu_id"] == "test-cpu" and m["isa"] == "avx512_bf16" and m["bf16_act"] == "mixed"
    assert m["peaks_from"] == str(prof)
    bf16, q8, a4 = q["formats"]
    assert bf16["prefill_limit_tok_s"] == pytest.approx(1 / 82.06528e-6, rel=1e-8)  # the head on the BF16 dot
    assert q8["prefill_limit_tok_s"] == pytest.approx(1 / 42.19264e-6, rel=1e-8)
    assert a4["prefill_limit_tok_s"] == pytest.approx(1 / 42.19264e-6, rel=1e-8)
    assert bf16["prefill_tok_s"] == pytest.approx(0.60 / 82.06528e-6, rel=1e-8)
    # batch8, bf16: 87796736 bytes at 10 GB/s (8.78 ms) outlast 8 rows of 451.91168 us
    assert bf16["batch8"]["limit_tok_s"] == pytest.approx(8 / 8.7796736e-3, rel=1e-8)
    assert bf16["batch8"]["tok_s"] == pytest.approx(0.60 * 8 / 8.7796736e-3, rel=1e-8)
    assert bf16["serve"]["max_batch"] == 32  # test_plan_arith.c works the pick by hand
    # no dot at all: every part on FP32 FMA
    prof = fake_profile(tmp_path, isa="avx2", bf16_dot_gflops_all=None)
    q = plan("--profile", str(prof), "--results", str(tmp_path), env=env)
    assert q["machine"]["bf16_act"] == "f32" and q["machine"]["int8_dot_gops"] == 0
    for f in q["formats"]:
        assert f["prefill_limit_tok_s"] == pytest.approx(100e9 / f["prefill_flops_per_token"], rel=1e-8)
        assert f["arith"] == "q|k|v fp32, o/gate|up/down fp32, attention fp32, head fp32"


# KV bytes per value by cache type: BF16, and llama.cpp's q8_0 block (32 int8 values and an FP16 scale).
KV_VALUE_BYTES = {"bf16": 2.0, "q8_0": 34 / 32}


def test_kv_fit_of_the_4b_2507_shape(tmp_path):
    """--shape qwen3-4b-instruct-2507 (262,144 native positions, no file): per weight format and KV type the
    longest context whose KV fits all the available RAM beside that format's weights, in whole 32-token blocks,
    at most the model's context; recomputed from the registry's config (tools/checkpoints.py hf_config) and the
    plan's own available-RAM figure. The issue's figures: 262,144 tokens of BF16 KV are 36 GiB, of q8_0 ~19 GiB."""
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    import checkpoints
    cfg = checkpoints.hf_config(checkpoints.by_id("qwen3-4b-instruct-2507"))
    prof = fake_profile(tmp_path, bf16_dot_gflops_all=200.0, int8_dot_gops_all=400.0)
    r = subprocess.run([str(KIPP), "plan", "--shape", "qwen3-4b-instruct-2507", "--json", "--profile", str(prof),
                        "--results", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    q = json.loads(r.stdout)
    assert q["model"] == "qwen3-4b-instruct-2507" and q["context_length"] == cfg["max_position_embeddings"] == 262144
    hd = cfg["head_dim"]
    values = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * hd  # K and V per token, all layers
    assert values * 2 * 262144 == 36 << 30 and 19 << 30 < values * 34 / 32 * 262144 < 20 << 30
    avail, facts = q["machine"]["ram_available_bytes"], block_facts()
    assert [f["format"] for f in q["formats"]] == list(facts)
    for f in q["formats"]:
        weights = needs(cfg, *facts[f["format"]])[0]
        assert f["weight_bytes"] == pytest.approx(weights, rel=1e-8)  # the JSON keeps 9 digits
        fits = {}
        for x, kv in zip(f["kv_fit"], KV_VALUE_BYTES):
            per_tok = values * KV_VALUE_BYTES[kv]
            free = max(0, avail - int(weights))
            ram = int(free // per_tok) // 32 * 32
            assert x["kv_type"] == kv and x["kv_bytes_per_token"] == per_tok and x["free_bytes"] == free, x
            assert x["ram_ctx"] == ram and x["max_ctx"] == min(ram, 262144 // 32 * 32), (f["format"], x)
            fits[kv] = x["ram_ctx"]
        if fits["bf16"] > 1000:  # the q8_0 KV context is about twice the BF16 one: 64/34 of it, to a block
            assert abs(fits["q8_0"] / fits["bf16"] - 64 / 34) < 64 / fits["bf16"], fits
    text = subprocess.run([str(KIPP), "plan", "--shape", "qwen3-4b-instruct-2507", "--profile", str(prof),
                           "--results", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    lines = re.findall(r"^  longest context beside these weights \(all [\d.]+ GB left for KV, no scratch counted\): "
                       r"bf16 KV \d+ tokens \(144\.0 KiB per token.*; q8_0 KV \d+ tokens \(76\.5 KiB per token",
                       text.stdout, re.M)
    assert len(lines) == len(q["formats"]), text.stdout  # one per format (the RAM figure moves between runs)
    for args, why in ((["--shape", "qwen3-nope"], "--shape 'qwen3-nope' is not a registry id"),
                      (["--shape", "qwen3-4b", "--model", str(tiny())], "give one of them"),
                      (["--shape", "qwen3-4b", "--rope-scaling", "yarn:4"], "--rope-scaling applies to a --model"),
                      (["--shape"], "--shape needs a value: a registry id")):
        bad = subprocess.run([str(KIPP), "plan", *args], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and why in bad.stderr, (args, bad.stderr)


def test_every_committed_profile_loads(tmp_path):
    """Profiles of every age (before the int8 peak was measured, with null BF16 peaks, without cpu.cpu_id) load:
    the plan takes their figures, 0 for what they lack."""
    profs = sorted((REPO_ROOT / "profiles").glob("*.json"))
    assert profs
    for prof in profs:
        d = json.loads(prof.read_text())
        q = plan("--profile", str(prof), "--results", str(tmp_path))
        m, pk, bw = q["machine"], d["peaks"], d["bandwidth"]
        assert m["peak_gflops"] == pytest.approx(pk["fp32_fma_gflops_all"])
        assert m["bf16_dot_gflops"] == pytest.approx(pk.get("bf16_dot_gflops_all") or 0)
        assert m["int8_dot_gops"] == pytest.approx(pk.get("int8_dot_gops_all") or 0)
        assert m["ram_read_gbps"] == pytest.approx(max(bw["read_gbps_all"], bw["read_gbps_1t"]))
        assert m["isa"] == d["isa"]["kernel_isa"]
        assert all(f["prefill_tok_s"] > 0 and f["batch8"]["tok_s"] > 0 for f in q["formats"]), prof.name


def test_a_bad_profile_is_named(tmp_path):
    for text, why in (("{", "line 1"), ('{"schema": "kipp.bench.v1"}', 'expected "kipp.profile.v1"'),
                      ('{"schema": "kipp.profile.v1", "bandwidth": {}}', "lacks bandwidth.read_gbps_all")):
        f = tmp_path / "bad.json"
        f.write_text(text)
        r = subprocess.run([str(KIPP), "plan", "--model", str(tiny()), "--profile", str(f)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1 and str(f) in r.stderr and why in r.stderr, r.stderr
    r = subprocess.run([str(KIPP), "plan", "--model", str(tiny()), "--profile"], capture_output=True, text=True)
    assert r.returncode == 2 and "--profile needs a value" in r.stderr, r.stderr


def test_make_bench_writes_the_prediction_beside_each_row(tmp_path):
    """tools/bench_models.py attach_prediction: tg128, pp512 and batch8 rows of the file get the plan's
    prediction, both ratios, the target and, for pp512 and batch8, the share of the plan's limit."""
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    import bench_models
    rows = [{"name": n, "model": "synthetic-0.6b-q8_0", "format": "q8_0", "median": v}
            for n, v in (("tg128", 40.0), ("pp512", 500.0), ("batch8", 200.0), ("tg4k", 30.0))]
    rows.append({"name": "pp512", "model": "synthetic-0.6b", "format": "bf16", "median": 300.0})
    res = tmp_path / "20260101-vm-test-cpu-cpu-abc.json"
    res.write_text(json.dumps({"schema": "kipp.bench.v1", "results": rows}))
    fmt = {"format": "q8_0", "decode_tok_s": 50.0, "decode_share": 0.8, "decode_share_source": "assumed",
           "prefill_tok_s": 400.0, "prefill_limit_tok_s": 1000.0, "prefill_share": 0.4,
           "prefill_share_source": "x", "batch8": {"tok_s": 250.0, "limit_tok_s": 400.0, "share": 0.625,
                                                   "share_source": "y"}}
    machine = {"ram_read_gbps": 30.0, "peak_gflops": 500.0, "bf16_dot_gflops": 1000.0, "int8_dot_gops": 2000.0,
               "disk_read_gbps": 1.0, "bf16_act": "mixed"}
    bench_models.attach_prediction(tmp_path, tmp_path / "synthetic-0.6b-q8_0.gguf", "q8_0",
                                   {"formats": [fmt], "machine": machine})
    out = {(r["name"], r["format"]): r for r in json.loads(res.read_text())["results"]}
    tg, pp, b8 = out["tg128", "q8_0"], out["pp512", "q8_0"], out["batch8", "q8_0"]
    assert (tg["predicted_tok_s"], tg["pred_over_measured"], tg["measured_over_predicted"]) == (50.0, 1.25, 0.8)
    assert tg["pred_target"] == 0.15 and tg["pred_target_met"] is False and "limit_share" not in tg["plan"]
    assert (pp["predicted_tok_s"], pp["measured_over_predicted"], pp["pred_target_met"]) == (400.0, 1.25, True)
    assert pp["plan"]["limit_share"] == 0.5 and pp["plan"]["int8_dot_gops"] == 2000.0
    assert (b8["predicted_tok_s"], b8["pred_target"], b8["plan"]["limit_share"]) == (250.0, 0.20, 0.5)
    assert b8["pred_target_met"] is False  # 250 / 200 = 1.25
    assert "predicted_tok_s" not in out["tg4k", "q8_0"] and "predicted_tok_s" not in out["pp512", "bf16"]


@pytest.mark.parametrize("level", cpu_levels())
def test_every_cpu_level_plans(level):
    """KIPP_ISA forces the level the backend would use; the plan follows it (ref: no vector probes, so no
    bandwidth or peak to predict from, and the predictions say 0 rather than guess)."""
    q = plan(env=dict(os.environ, KIPP_ISA=level))
    assert q["machine"]["isa"] == level
    if level == "ref":
        assert q["machine"]["ram_read_gbps"] == 0 and all(f["decode_tok_s"] == 0 for f in q["formats"])
    else:
        assert q["machine"]["ram_read_gbps"] > 0 and all(f["decode_tok_s"] > 0 for f in q["formats"])


def test_text_output_and_errors():
    r = subprocess.run([str(KIPP), "plan", "--model", str(tiny())], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for fmt in block_facts():
        assert re.search(rf"^{fmt}\s+decode\s+[\d.]+ tok/s\s+prefill\s+[\d.]+ tok/s", r.stdout, re.M), r.stdout
    assert "bf16" in r.stdout.split("<- this file")[0].splitlines()[-1]
    bad = subprocess.run([str(KIPP), "plan"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--model" in bad.stderr
    bad = subprocess.run([str(KIPP), "plan", "--model", str(tiny()), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'--bogus'" in bad.stderr
    bad = subprocess.run([str(KIPP), "plan", "--model", "/nonexistent.gguf"], capture_output=True, text=True)
    assert bad.returncode == 1 and "/nonexistent.gguf" in bad.stderr
    bad = subprocess.run([str(KIPP), "plan", "--model"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--model needs a value: a .gguf path" in bad.stderr, bad.stderr
    for where, why in (("/nonexistent-results-dir", "No such file or directory"), (str(tiny()), "not a directory")):
        bad = subprocess.run([str(KIPP), "plan", "--model", str(tiny()), "--results", where], capture_output=True,
                             text=True)
        assert bad.returncode == 1 and f"--results '{where}': {why}" in bad.stderr, bad.stderr


def test_a_bad_model_file_is_named(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOTGGUF!" * 8)
    bad = subprocess.run([str(KIPP), "plan", "--model", str(junk)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and f"'{junk}': bad magic" in bad.stderr, bad.stderr
    bad = subprocess.run([str(SERVE), "--model", str(junk), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and f"'{junk}': bad magic" in bad.stderr, bad.stderr


def test_ctx_0_uses_the_plan_in_generate_chat_and_serve(p):
    g = subprocess.run([str(KIPP), "generate", "--model", str(tiny()), "--prompt", "hi", "--max-tokens", "2",
                        "--ctx", "0"], capture_output=True, text=True, timeout=120)
    assert g.returncode == 0, g.stderr
    assert f"the plan picks a {p['ctx']}-token context" in g.stderr
    c = subprocess.run([str(KIPP), "chat", "--model", str(tiny()), "--max-tokens", "2", "--ctx", "0"],
                       input="hi\n", capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    assert f"{p['ctx']}-token context" in c.stderr
    s = subprocess.Popen([str(SERVE), "--model", str(tiny()), "--ctx", "0", "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = s.stdout.readline()
        assert f"n_ctx {p['ctx']}" in line, line
    finally:
        s.terminate()
        err = s.communicate(timeout=60)[1]
    assert "plan (--ctx 0)" in err and "decode" in err and "<- this file" in err
