"""Tests of the benchmark tooling (issue 5, item 5): tools/report.py reads only
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
    (tmp_path / "broken.json").write_text("{not json")
    out = tmp_path / "report.png"
    p = subprocess.run([sys.executable, str(ROOT / "tools/report.py"), "--results", str(tmp_path), "--out", str(out)],
                       capture_output=True, text=True, check=True)
    assert "2 result files, 1 model series, 1 roofline points" in p.stdout
    assert "skipping other.json: schema is not kipp.bench.v1" in p.stderr
    assert "skipping broken.json" in p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_models_rejects_unknown_model() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "tools/bench_models.py"), "--model", "qwen3-0.6b"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "unknown synthetic benchmark shape 'qwen3-0.6b'" in p.stderr
