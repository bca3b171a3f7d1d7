"""test_readme_examples.py - the README's and docs' `build/kipp ...` examples run as written.

Every command line in a ```sh block of README.md or docs/*.md that starts with
`build/kipp ` and uses build/models/synthetic-tiny.gguf (the model `make models-test`
writes) is run from a scratch directory, with the repository's build/ paths made
absolute: it must exit 0. Where a tokenize or detokenize example's comment shows its
output, stdout must equal it. `kipp chat` gets "/exit" on stdin; `render` gets a
one-message request.json. Printed commands run the Python tools with the project's
venv (`.venv/bin/python tools/x.py`): the system python3 lacks numpy, so a bare
`python3 tools/x.py` in a doc, a banner or a usage line would print a traceback.
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


DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def readme_examples() -> list[tuple[str, list[str], str]]:
    """(line, argv, comment) for each example of README.md and docs/*.md; continuation lines joined."""
    out = []
    blocks = [b for doc in DOCS for b in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S)]
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.startswith("build/kipp ") and MODEL in line:
                m = re.search(r"\s#\s*(.*)$", line)
                out.append((line, shlex.split(line, comments=True), m.group(1).strip() if m else ""))
    return out


EXAMPLES = readme_examples()


def test_readme_has_examples():
    cmds = {argv[1] for _, argv, _ in EXAMPLES}
    assert {"generate", "chat", "logits", "tokenize", "detokenize", "render", "inspect", "plan"} <= cmds, cmds
    docs = {p.name for p in DOCS}
    assert {"README.md", "CLI.md", "LORA.md", "PLANNING.md"} <= docs, docs  # where the moved examples live
    lora = [line for line, argv, _ in EXAMPLES if "--lora" in argv]
    assert len(lora) >= 2, lora  # docs/LORA.md's generate and logits examples are found and run


# Files whose text is printed (banners, --help from docstrings, make output) or copied from
# (README, docs): none may run a tools/ script with a bare python3/python or through its
# `#!/usr/bin/env python3` line, both of which reach the system Python.
PRINTED = DOCS + [REPO / "Makefile", REPO / "bench" / "README.md", REPO / "kernels" / "README.md"] + \
    sorted((REPO / "tools").glob("*.py")) + sorted((REPO / "tools").glob("*.sh")) + \
    sorted(p for d in ("cli", "server", "bench") for p in (REPO / d).glob("*.c"))
BARE = re.compile(r"(?<![\w/.$({-])python3? +tools/[\w.-]+\.py|Usage: +tools/[\w.-]+\.py")


def test_printed_commands_run_tools_with_the_venv():
    bad = [f"{p.relative_to(REPO)}:{p.read_text()[:m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
           for p in PRINTED for m in BARE.finditer(p.read_text())]
    bad += [f"{doc.relative_to(REPO)}: {line}" for doc in DOCS for b in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S)
            for line in b.splitlines() if re.match(r"tools/[\w.-]+\.py\b", line)]
    assert not bad, "use .venv/bin/python tools/...: " + "; ".join(bad)
    banner = (REPO / "tools" / "demo.sh").read_text().split("With network access", 1)[1]
    assert ".venv/bin/python tools/convert_to_gguf.py" in banner, banner


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
