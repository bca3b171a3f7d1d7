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


def newest_shares(cpu_id: str, isa: str, fmt: str, cores: int):
    """(decode share, prefill share vs the FP32 peak) by docs/PLANNING.md's rule: the tg128/pp512 rows of this CPU id,
    level and format; only the planned model's rows when it has any; of those only runs that started quiet
    (others used under 25% of the CPUs in the second before; runs without that figure: a load average below
    half the cores, or none recorded) when there are any; the median of the newest three."""
    rows = {"tg128": [], "pp512": []}
    for f in (REPO_ROOT / "results").glob("*-cpu-*.json"):
        d = json.loads(f.read_text())
        if d.get("schema") != "kipp.bench.v1" or d.get("cpu", {}).get("cpu_id") != cpu_id:
            continue
        if d.get("config", {}).get("isa") != isa:
            continue
        for r in d["results"]:
            if r.get("format") != fmt or r.get("name") not in rows:
                continue
            ref = r.get("roofline_ref", "")
            if r["name"] == "tg128":
                s = r.get("roofline_share") if ref.startswith("read_gbps") else None
            else:
                s = r.get("roofline_share") if ref == "fp32_gflops_all" else r.get("fp32_peak_share") \
                    if ref == "bf16_gflops_all" else None
            if not s or s <= 0:
                continue
            busy, load = d["config"].get("cpu_busy_others_at_start"), d["config"].get("load_avg_1min_at_start")
            quiet = busy < 0.25 if busy is not None and busy >= 0 else load is None or load < 0.5 * cores
            rows[r["name"]].append((d["date"], s, quiet, r["model"] == "synthetic-tiny"))
    out = []
    for name in ("tg128", "pp512"):
        rs = rows[name]
        if any(x[3] for x in rs):
            rs = [x for x in rs if x[3]]
        if any(x[2] for x in rs):
            rs = [x for x in rs if x[2]]
        newest = sorted(rs, key=lambda x: x[0], reverse=True)[:3]
        out.append(statistics.median(x[1] for x in newest) if newest else None)
    return tuple(out)


def test_predictions_follow_the_stated_arithmetic(p, cfg):
    m, facts = p["machine"], block_facts()
    assert [f["format"] for f in p["formats"]] == list(facts)
    for f in p["formats"]:
        weights, decode_b, prefill_f = needs(cfg, *facts[f["format"]])
        assert f["weight_bytes"] == pytest.approx(weights, rel=1e-9)
        assert f["decode_bytes_per_token"] == pytest.approx(decode_b, rel=1e-9)
        assert f["prefill_flops_per_token"] == pytest.approx(prefill_f, rel=1e-9)
        d_share, p_share = newest_shares(m["cpu_id"], m["isa"], f["format"], m["physical_cores"])
        assert f["decode_share"] == pytest.approx(d_share if d_share else 0.80, rel=1e-6), f
        assert f["prefill_share"] == pytest.approx(p_share if p_share else 0.50, rel=1e-6), f
        assert (f["decode_share_source"] == "assumed") == (d_share is None)
        assert (f["prefill_share_source"] == "assumed") == (p_share is None)
        assert f["decode_tok_s"] == pytest.approx(m["ram_read_gbps"] * 1e9 * f["decode_share"] / decode_b, rel=1e-6)
        assert f["prefill_tok_s"] == pytest.approx(m["peak_gflops"] * 1e9 * f["prefill_share"] / prefill_f, rel=1e-6)
        assert f"{f['decode_tok_s']:.1f} tok/s" in f["rationale"] and f"{f['prefill_tok_s']:.1f} tok/s" in f["rationale"]


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
