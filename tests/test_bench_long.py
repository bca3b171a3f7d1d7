"""test_bench_long.py - the long-context peer cells of `make bench-peers` (tools/bench_peers.py
--long, issue 53 item 3) without running llama.cpp: the cells' contexts and llama-bench
arguments, the options' errors, the KV type passed to kipp-bench only when it is not bf16,
the step limit and attention's share against hand-computed values, kipp-bench's pplong and
tglong bookkeeping on synthetic-tiny at a short context, and the table tools/report.py draws."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_peers  # noqa: E402

PROFILE = {"bandwidth": {"read_gbps_1t": 30.0, "read_gbps_all": 40.0},
           "isa": {"avx512_bf16": True, "avx512_vnni": True},
           "peaks": {"fp32_fma_gflops_all": 200.0, "bf16_dot_gflops_all": 400.0, "int8_dot_gops_all": 800.0}}


def test_long_cells_contexts_and_peer_arguments() -> None:
    """16,384 on every model and 32,768 on the 0.6B only, unless --long-ctx names the contexts;
    llama-bench runs the prefill from an empty cache and 32 decode steps after an untimed fill
    of N (-d), both with flash attention, the KV type on K and V, no warm-up pass."""
    a = bench_peers.parse_args(["--long-only"])
    assert a.long and a.long_only and a.kv_types == ["bf16"] and a.long_rounds == 1
    assert bench_peers.long_plan(a, "synthetic-0.6b") == [16384, 32768]
    assert bench_peers.long_plan(a, "synthetic-1.7b") == [16384]
    a = bench_peers.parse_args(["--long", "--long-ctx", "2048", "--kv-types", "bf16,q8_0", "--long-rounds", "2"])
    assert a.long and not a.long_only and a.kv_types == ["bf16", "q8_0"] and a.long_rounds == 2
    assert bench_peers.long_plan(a, "synthetic-1.7b") == [2048]
    assert bench_peers.long_names(16384) == ("pp16384", "tg16k") and bench_peers.long_names(2000) == ("pp2000", "tg@2000")
    args = bench_peers.long_peer_args(16384, "q8_0", 2)
    common = ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--no-warmup", "-t", "2", "-r", "1"]
    assert args == {"pp16384": ["-p", "16384", "-n", "0", *common],
                    "tg16k": ["-p", "0", "-n", "32", "-d", "16384", *common]}
    assert not bench_peers.parse_args([]).long


@pytest.mark.parametrize("argv, why", [
    (["--long", "--kv-types", "q4_0"], "--kv-types 'q4_0': expected a comma list of distinct bf16, q8_0"),
    (["--long", "--kv-types", "bf16,bf16"], "distinct"),
    (["--long", "--long-ctx", "16k"], "--long-ctx '16k': expected a comma list of integers"),
    (["--long", "--long-ctx", "32"], "expected distinct contexts of 64 to"),
    (["--long", "--long-rounds", "0"], "--long-rounds 0 must be >= 1"),
    (["--long", "--formats", "q8_0"], "--formats must include bf16"),
])
def test_long_options_refuse_bad_values(argv, why, capsys) -> None:
    with pytest.raises(SystemExit):
        bench_peers.parse_args(argv)
    assert why in capsys.readouterr().err


def fake_kipp_bench(rows_kv: str | None):
    """A stand-in for bench_peers.run that records the kipp-bench command and writes the two long
    rows into its --out directory, with kv_type rows_kv (None: no kv_type key, as kipp-bench wrote
    before it had one)."""
    seen = []

    def run(cmd, **kw):
        seen.append(cmd)
        n = int(cmd[cmd.index("--long-ctx") + 1])
        rows = [{"name": b, "median": 1.0, **({"kv_type": rows_kv} if rows_kv else {})} for b in bench_peers.long_names(n)]
        out = Path(cmd[cmd.index("--out") + 1])
        (out / "r.json").write_text(json.dumps({"results": rows}))
        return subprocess.CompletedProcess(cmd, 0)
    return run, seen


def test_kipp_gets_the_kv_type_only_when_it_is_not_bf16(monkeypatch) -> None:
    """kipp-bench on main has no --kv-type: a bf16 run must not pass it; a q8_0 run passes it and
    refuses rows that do not say they ran q8_0 (their byte counts would be BF16's)."""
    run, seen = fake_kipp_bench(None)
    monkeypatch.setattr(bench_peers, "run", run)
    rows = bench_peers.kipp_long_round(Path("m.gguf"), 2048, "bf16", 2)
    assert set(rows) == {"pp2048", "tg2k"} and "--kv-type" not in seen[-1]
    assert seen[-1][seen[-1].index("--bench") + 1] == "pplong,tglong"
    with pytest.raises(SystemExit, match="pp2048 row has kv_type 'bf16', expected 'q8_0'"):
        bench_peers.kipp_long_round(Path("m.gguf"), 2048, "q8_0", 2)
    assert seen[-1][seen[-1].index("--kv-type") + 1] == "q8_0"
    run, seen = fake_kipp_bench("q8_0")
    monkeypatch.setattr(bench_peers, "run", run)
    assert set(bench_peers.kipp_long_round(Path("m.gguf"), 2048, "q8_0", 2)) == {"pp2048", "tg2k"}


def long_row(name: str, **kw) -> dict:
    row = {"name": name, "median": 20.0, "roofline_ref": "read_gbps_adjacent", "roofline": 30.0,
           "tokens_per_step": 1.0, "bytes_per_step": 1.2e9, "kv_bytes_per_step": 0.3e9, "flops_per_step_layers": 1e9,
           "flops_per_step_head": 0.3e9, "flops_per_step_attention": 0.2e9}
    return {**row, **kw}


def test_long_limit_and_attention_share_by_hand() -> None:
    """Decode: 1.2e9 B at the 30 GB/s probed beside the row = 0.04 s (compute 1.5 GFLOP / 400 =
    3.75 ms), so 25 tok/s; Kipp's 20 is 80%, llama.cpp's 10 is 40%; attention's share is the KV's
    0.3e9 of the 1.2e9 bytes: 25%. Prefill of 1,000 tokens, no probe: read 1.2e9 / 40 GB/s = 0.03 s,
    compute (800 + 0.3) GFLOP / 400 + 400 GFLOP (attention, BF16 dot) / 400 = 3.00075 s, so 333.25
    tok/s bound by compute; attention's 1 s of it is 33.3%."""
    rows = [long_row("tg16k", median=m) for m in (19.0, 20.0, 21.0)]
    got = bench_peers.long_limit(rows, [10.0, 9.0, 11.0], PROFILE)["step_limit"]
    assert got["limit_tok_s"] == pytest.approx(25.0, rel=1e-12) and got["bound"] == "read"
    assert got["share"] == pytest.approx(0.8, rel=1e-12) and got["peer_share"] == pytest.approx(0.4, rel=1e-12)
    assert got["attention_share"] == pytest.approx(0.25, rel=1e-12) and "no per-op profile" in got["attention_share_source"]
    pp = long_row("pp16384", median=200.0, roofline_ref="bf16_gflops_all", roofline=400.0, tokens_per_step=1000.0,
                  flops_per_step_layers=800e9, flops_per_step_attention=400e9)
    got = bench_peers.long_limit([pp], [100.0], PROFILE)["step_limit"]
    assert got["bound"] == "compute" and got["limit_tok_s"] == pytest.approx(1000 / 3.00075, rel=1e-12)
    assert got["attention_share"] == pytest.approx(1 / 3.00075, rel=1e-12)
    assert got["rounds"][0]["read_gbps_source"] == "profile read_gbps_all"
    assert bench_peers.long_limit([pp], [100.0], None) == {
        "step_limit": None, "step_limit_why": "no machine profile of this CPU under profiles/ (make profile)"}


def test_kv_type_is_part_of_a_cell() -> None:
    """A bf16-KV and a q8_0-KV cell of one bench are two cells (merge_into keeps both)."""
    c = {"model": "synthetic-0.6b", "name": "tg16k", "format": "bf16"}
    assert bench_peers.cell_key({**c, "kv_type": "q8_0"}) != bench_peers.cell_key(c)
    assert bench_peers.cell_key({**c, "kv_type": "bf16"}) == bench_peers.cell_key(c)


def test_kipp_bench_long_rows_bookkeeping(tmp_path: Path) -> None:
    """pplong and tglong on synthetic-tiny at --long-ctx 256 (2 layers, 16 query heads of 128,
    8192 BF16 KV bytes per position; 16,384 attention FLOPs per attended position): the prefill
    is one step of 256 tokens at a mean context of 128.5, writing 256 positions of KV; a decode
    step attends 256 + 33/2 = 272.5 positions and reads their KV. Off the 1,024 grid the decode
    row is tg@256. Bookkeeping only: no rate is judged."""
    from conftest import models_dir
    r = subprocess.run([str(ROOT / "build/kipp-bench"), "--model", str(models_dir() / "synthetic-tiny.gguf"), "--bench",
                        "pplong,tglong", "--long-ctx", "256", "--reps", "1", "--warmup", "0", "--out", str(tmp_path),
                        "--profiles", str(tmp_path / "none")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (f,) = tmp_path.glob("*.json")
    rows = {x["name"]: x for x in json.loads(f.read_text())["results"]}
    assert set(rows) == {"pp256", "tg@256"}
    pp, tg = rows["pp256"], rows["tg@256"]
    for row, tokens, ctx, kv_pos in ((pp, 256, 128.5, 256), (tg, 1, 272.5, 272.5)):
        assert row["long_context"] == 256 and row["kv_type"] == "bf16" and row["tokens_per_step"] == tokens, row
        assert row["flops_per_step_layers"] == pytest.approx(tokens * 7864320, rel=1e-5), row
        assert row["flops_per_step_head"] == pytest.approx(77791232, rel=1e-5), row
        assert row["flops_per_step_attention"] == pytest.approx(tokens * ctx * 16384, rel=1e-5), row
        assert row["kv_bytes_per_step"] == pytest.approx(kv_pos * 8192, rel=1e-5), row
        assert row["bytes_per_step"] == pytest.approx(row["weight_bytes_per_step"] + tokens * 1024 + kv_pos * 8192,
                                                      rel=1e-5), row
    assert pp["bound"] == "compute" and tg["bound"] == "memory" and tg["context_mean"] == 272.5
    # the KV both sessions hold: the main one's 4,096 positions (the model's context) and the long one's 256 + 64
    assert pp["kv_cache_bytes"] == pytest.approx(8192 * (4096 + 320), rel=1e-5), pp["kv_cache_bytes"]  # 6 digits
    # a context past the model's is refused before anything runs, naming both
    bad = subprocess.run([str(ROOT / "build/kipp-bench"), "--model", str(models_dir() / "synthetic-tiny.gguf"),
                          "--bench", "tglong", "--long-ctx", "4096", "--out", str(tmp_path / "x"), "--profiles",
                          str(tmp_path / "none")], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "--long-ctx 4096 needs a context of 4128 positions" in bad.stderr, bad.stderr
    assert "context length of 4096" in bad.stderr


def long_doc(date: str, sha: str, kipp: float, peer: float) -> dict:
    cell = {"name": "tg16k", "model": "synthetic-0.6b", "format": "bf16", "kv_type": "q8_0", "unit": "tok/s",
            "kipp": {"median": kipp}, "llama_cpp": {"median": peer}, "ratio": kipp / peer, "long_context": 16384,
            "peer_tool": "llama-bench",
            "step_limit": {"limit_tok_s": 40.0, "bound": "read", "share": kipp / 40, "peer_share": peer / 40,
                           "attention_share": 0.5234}}
    return {"schema": "kipp.bench.v1", "kind": "peers", "git_sha": sha, "date": date,
            "cpu": {"model": "AMD EPYC", "cpu_id": "amd-f26m2", "flags": ["avx2", "avx512f", "avx512_bf16"]},
            "config": {"threads": 2, "rounds": 1, "long_rounds": 1, "load_avg_1min_at_start": 0.1,
                       "load_avg_1min_at_end": 0.2},
            "results": [cell]}


def test_report_draws_the_long_table(tmp_path: Path) -> None:
    """The long cells get their own table (both figures, ratio, limit, both shares and attention's);
    they stay out of the main table."""
    res = tmp_path / "res"
    res.mkdir()
    (res / "a-peers.json").write_text(json.dumps(long_doc("2026-12-01T00:00:00Z", "aaaaaaa", 20.0, 10.0)))
    (res / "b-peers.json").write_text(json.dumps(long_doc("2026-12-02T00:00:00Z", "bbbbbbb", 30.0, 12.0)))
    md = tmp_path / "R.md"
    md.write_text("x\n<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(res), "--out",
                        str(tmp_path / "r.png"), "--table", str(md)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in md.read_text().splitlines() if "| tg16k |" in ln]
    assert len(lines) == 1 and lines[0].startswith(
        "| synthetic-0.6b | q8_0 | tg16k | AMD EPYC amd-f26m2 (avx512_bf16) | 30.00 | 12.00 | **2.50x** | 40.00 (read) | "
        "75.0% | 30.0% | 52.3% | 1 rounds, load 0.1/0.2 | `b-peers.json` |"), lines


TINY = ROOT / "build" / "models" / "synthetic-tiny.gguf"


@pytest.mark.parametrize("argv,needle", [
    (["build/kipp-bench", "--model", str(TINY), "--kv-type", "q4_0"],
     "--kv-type 'q4_0' is not a KV cache type; expected bf16 or q8_0"),
    (["build/kipp-serve", "--model", str(TINY), "--kv-type", "q4_0"],
     "--kv-type 'q4_0' is not a KV cache type; expected bf16 or q8_0"),
    (["build/kipp-bench", "--model", str(TINY), "--long-ctx", "10"], "--long-ctx '10' is not an integer in 64..1048576"),
    (["build/kipp-bench", "--model", str(TINY), "--bench", "pplong", "--long-ctx", "100000", "--out", "{tmp}"],
     "--long-ctx 100000 needs a context of 100032 positions (32 decode steps after it); synthetic-tiny has a "
     "context length of 4096"),
])
def test_bad_kv_type_and_long_ctx_are_named(tmp_path: Path, argv: list[str], needle: str) -> None:
    """kipp-bench and kipp-serve refuse a KV type they do not have and a --long-ctx out of range or beyond the
    model's context, naming the value and the limit, before any benchmark or server starts."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and needle in r.stderr, (r.returncode, r.stderr)
    assert not list(tmp_path.glob("*.json"))  # nothing written for a refused run
