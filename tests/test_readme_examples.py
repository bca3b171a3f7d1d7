"""test_readme_examples.py - the README's `build/kipp ...` examples run as written.

Every command line in a ```sh block of README.md that starts with `build/kipp ` and
uses build/models/synthetic-tiny.gguf (the model `make models-test` writes) is run
from a scratch directory, with the repository's build/ paths made absolute: it must
exit 0. Where a tokenize or detokenize example's comment shows its output, stdout
must equal it. `kipp chat` gets "/exit" on stdin; `render` gets a one-message request.json.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODEL = "build/models/synthetic-tiny.gguf"


def readme_examples() -> list[tuple[str, list[str], str]]:
    """(line, argv, comment) for each example; continuation lines joined."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.startswith("build/kipp ") and MODEL in line:
                m = re.search(r"\s#\s*(.*)$", line)
                out.append((line, shlex.split(line, comments=True), m.group(1).strip() if m else ""))
    return out


EXAMPLES = readme_examples()


def test_readme_has_examples():
    cmds = {argv[1] for _, argv, _ in EXAMPLES}
    assert {"generate", "chat", "logits", "tokenize", "detokenize", "render", "inspect"} <= cmds, cmds


@pytest.mark.parametrize("line,argv,comment", EXAMPLES, ids=[f"{i}-{a[1]}" for i, (_, a, _) in enumerate(EXAMPLES)])
def test_readme_example_runs(line, argv, comment, tmp_path):
    model = REPO / MODEL
    if not model.is_file():
        pytest.fail(f"{model} is missing: run `make models-test` first")
    argv = [str(REPO / a) if a.startswith("build/") else a for a in argv]
    (tmp_path / "request.json").write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    stdin = "/exit\n" if argv[1] == "chat" else ""
    r = subprocess.run(argv, cwd=tmp_path, input=stdin.encode(), capture_output=True, timeout=300)
    assert r.returncode == 0, f"{line}\nexit {r.returncode}\n{r.stderr.decode(errors='replace')}"
    if argv[1] in ("tokenize", "detokenize") and comment:
        shown = comment.split(";")[0].strip()
        assert r.stdout.decode().strip() == shown, (line, r.stdout)
