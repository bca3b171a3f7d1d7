"""test_vendored_data.py - data/qwen3 is complete, documented and unchanged.

The repository carries the Qwen3 files its tools and tests read (data/qwen3/README.md).
Oracles: the sha256/size records of tools/checkpoints.py (written from the Hub pins,
independently of these copies), the tokenizer NOTICE's own table, data/qwen3/README.md's
file list, and `git ls-files` for the repository's own text.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

import checkpoints as reg

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "qwen3"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_every_vendored_file_is_listed_in_the_readme():
    readme = (DATA / "README.md").read_text()
    files = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*") if p.is_file())
    for f in files:
        if f == "README.md":
            continue
        name = f.split("/")[-1]
        listed = f"`{f}`" in readme or (f.startswith("qwen3-configs/") and "`qwen3-configs/Qwen3-*.config.json`" in readme) \
            or (f.startswith("tokenizer-cases/") and f"`{name}`" in readme)
        assert listed, f"data/qwen3/{f} is not described in data/qwen3/README.md"
    assert len([f for f in files if f.startswith("qwen3-configs/")]) == len(reg.CONFIG_JSON_FACTS) == 10


def test_tokenizer_files_match_the_recorded_hashes():
    tok = DATA / "qwen3-tokenizer" / "tokenizer.json"
    assert (_sha(tok), tok.stat().st_size) == (reg.TOKENIZER_JSON_SHA256, reg.TOKENIZER_JSON_SIZE)
    for kind, (name, sha, size) in reg.TOKENIZER_CONFIGS.items():
        p = DATA / "qwen3-tokenizer" / name
        assert _sha(p) == sha, f"data/qwen3/qwen3-tokenizer/{name} ({kind}) differs from the Hub file"
        assert size is None or p.stat().st_size == size, name


def test_config_files_match_the_recorded_hashes():
    for id_, (sha, size) in reg.CONFIG_JSON_FACTS.items():
        c = reg.by_id(id_)
        p = DATA / "qwen3-configs" / (c.repository.split("/")[1] + ".config.json")
        assert (_sha(p), p.stat().st_size) == (sha, size), f"{p} differs from the Hub config.json of {id_}"


def test_notice_table_agrees_with_checkpoints_py():
    rows = {}
    for line in (DATA / "qwen3-tokenizer" / "NOTICE").read_text().splitlines():
        m = re.match(r"\| (tokenizer[\w.\-]*\.json) \|.*\| ([0-9a-f]{64}) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    want = {"tokenizer.json": reg.TOKENIZER_JSON_SHA256}
    want.update({name: sha for name, sha, _ in reg.TOKENIZER_CONFIGS.values()})
    assert rows == want


def test_tokenizer_cases_are_present():
    inp = (DATA / "tokenizer-cases" / "qwen2.inp").read_text(encoding="utf-8")
    out = (DATA / "tokenizer-cases" / "qwen2.out").read_text(encoding="utf-8")
    assert inp.count("__ggml_vocab_test__") == 46 and len(out.splitlines()) == 46


def test_no_file_reaches_outside_the_repository():
    """A clone has no ../shared beside it: nothing tracked may point there."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "-C", str(REPO), "grep", "-nE", r"\.\./shared|/work/shared|KIPP_SHARED", "--",
                        ".", ":!tests/test_vendored_data.py"], capture_output=True, text=True)
    assert r.returncode == 1, f"files that name the old shared folder:\n{r.stdout}"


def test_spec_citations_resolve():
    """Comments cite the spec as `seed 000 "Section"` / `seed 002 "Section"` and the
    house rules as docs/ARCHITECTURE.md: each cited phrase must stand in the
    vendored document (docs/spec/README.md), so a clone can follow every citation."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    spec = {"000": (REPO / "docs/spec/000-contract.txt").read_text(encoding="utf-8"),
            "002": (REPO / "docs/spec/002-fish.txt").read_text(encoding="utf-8")}
    assert (REPO / "docs/ARCHITECTURE.md").is_file()
    r = subprocess.run(["git", "-C", str(REPO), "grep", "-ohE", r'seed 00[0-9],? "[^"]+"', "--", ".",
                        ":!docs/spec", ":!tests/test_vendored_data.py"], capture_output=True, text=True)
    cites = set(re.findall(r'seed (00[0-9]),? "([^"]+)"', r.stdout))
    assert len(cites) >= 10, f"expected the code's spec citations, found {sorted(cites)}"
    missing = sorted(f'seed {n} "{s}"' for n, s in cites if n not in spec or s not in spec[n])
    assert not missing, f"citations with no such phrase in docs/spec: {missing}"
