"""test_bench_embed.py - tools/bench_embed.py's pure parts (no servers): the inputs it
sends (B token arrays of exactly --tokens ids, <|endoftext|> last, reproducible by
seed), requests per batch size, argument refusals, and the result document's shape
as tools/report.py's checker reads it."""
from __future__ import annotations

import pytest

import bench_embed as be
import report


def test_inputs_are_exact_and_seeded():
    a = be.inputs(16, 128, seed=5)
    assert len(a) == 16 and all(len(x) == 128 and x[-1] == be.EOT for x in a)
    assert all(0 <= t < be.EOT for x in a for t in x[:-1])
    assert a == be.inputs(16, 128, seed=5) and a != be.inputs(16, 128, seed=6)


def test_reps_per_batch_size():
    assert [be.reps_of(b, 1) for b in (1, 2, 16, 64)] == [16, 8, 1, 1]
    assert be.reps_of(64, 3) == 3 and be.reps_of(1, 2) == 32


@pytest.mark.parametrize("argv,needle", [(["--batches", "x"], "comma list"), (["--batches", "0"], "1..2048"),
                                         (["--tokens", "1"], "2..4096"), (["--rounds", "0"], "at least 1")])
def test_bad_arguments(argv, needle, capsys):
    with pytest.raises(SystemExit):
        be.parse_args(argv)
    assert needle in capsys.readouterr().err


def test_result_document_passes_the_report_checker():
    cell = {"name": "embed_b16_t128", "model": "synthetic-0.6b-embedding", "batch": 16, "tokens": 128,
            "unit": "embeddings/s", "kipp": be.summary([1.0, 2.0, 3.0]), "llama_server": be.summary([1.0]), "ratio": 2.0}
    doc = {"schema": report.SCHEMA, "kind": "embed", "git_sha": "x", "date": "2026-12-07T19:00:00Z", "results": [cell]}
    assert report.doc_problem(doc) is None
    assert cell["kipp"]["median"] == 2.0
