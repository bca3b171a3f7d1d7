"""test_layers.py - the include rules of docs/ARCHITECTURE.md "Who may call whom", by grep.

base < kernels < backends < engine < server: a layer includes its own files
and the layers below it, never one above. Concretely, for every quoted
`#include "dir/..."` (include paths are relative to the repository root):

- base/ includes only base/ (the floor: libc and system headers besides);
- kernels/ includes only kernels/ and base/, except the kernel check drivers
  (kernels/<backend>/check/kcheck*, which time kernels too), which may also
  include the bench harness (bench/bench_harness.h);
- backends/<name>/ includes only backends/<name>/, kernels/, base/ and
  engine/backend.h (the boundary it implements), so in particular never
  engine/kipp.h or engine/internal.h;
- engine/ includes nothing of server/, cli/, bench/ or tests/.

The checker runs on the real tree, and on a synthetic tree with one
violation of each kind, so that it is shown to be able to fail.
"""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def allowed(path: str, inc: str) -> bool:
    """Whether the file at repo-relative path may include inc (repo-relative)."""
    top = path.split("/", 1)[0]
    if top == "base":
        return inc.startswith("base/")
    if top == "kernels":
        driver = "/check/kcheck" in path and inc == "bench/bench_harness.h"
        return driver or inc.startswith(("kernels/", "base/"))
    if top == "backends":
        own = "/".join(path.split("/")[:2]) + "/"
        return inc.startswith((own, "kernels/", "base/")) or inc == "engine/backend.h"
    if top == "engine":
        return not inc.startswith(("server/", "cli/", "bench/", "tests/"))
    return True


def violations(root: Path) -> list[str]:
    """'file: #include "x"' for every include in root that breaks a layer rule."""
    out = []
    for top in ("base", "kernels", "backends", "engine"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in SOURCES or not f.is_file():
                continue
            rel = f.relative_to(root).as_posix()
            for inc in INCLUDE.findall(f.read_text(errors="replace")):
                if not allowed(rel, inc):
                    out.append(f'{rel}: #include "{inc}"')
    return out


def test_tree_keeps_the_layers():
    bad = violations(REPO)
    assert not bad, "includes that reach upward (docs/ARCHITECTURE.md \"Who may call whom\"):\n" + "\n".join(bad)


def test_the_floor_exists():
    # The rules above are vacuous for a missing layer: base/ holds the pieces issue 50 moved there.
    for name in ("errors.h", "errbuf.h", "threadpool.h", "safe_io.h", "hugepage.h", "cpuinfo.h", "park.h"):
        assert (REPO / "base" / name).is_file(), f"base/{name} is missing"


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_checker_catches_each_kind(tmp_path):
    clean = {
        "base/a.c": '#include <stdio.h>\n#include "base/a.h"\n',
        "kernels/cpu/k.c": '#include "kernels/common.h"\n#include "base/cpuinfo.h"\n',
        "backends/cpu/b.c": '#include "backends/cpu/b.h"\n#include "engine/backend.h"\n#include "base/errbuf.h"\n'
                            '#include "kernels/cpu/kernels.h"\n',
        "engine/e.c": '#include "engine/internal.h"\n#include "backends/cpu/kv_store.h"\n',
        "kernels/cpu/check/kcheck.c": '#include "bench/bench_harness.h"\n#include "kernels/cpu/check/kcase.h"\n',
    }
    bad = {
        "base/up.c": '#include "kernels/common.h"\n',
        "base/up2.h": '  #  include "engine/kipp.h"\n',
        "kernels/cpu/up.c": '#include "engine/kipp.h"\n',
        "kernels/cpu/bench_up.c": '#include "bench/bench_harness.h"\n',
        "kernels/cuda/up.cu": '#include "engine/internal.h"\n',
        "backends/cpu/up.c": '#include "engine/kipp.h"\n',
        "backends/cuda/up.c": '#include "engine/internal.h"\n',
        "backends/cuda/side.c": '#include "backends/cpu/kv_store.h"\n',
        "engine/up.c": '#include "server/serve.h"\n',
    }
    for rel, text in clean.items():
        write(tmp_path, rel, text)
    assert violations(tmp_path) == []
    for rel, text in bad.items():
        write(tmp_path, rel, text)
    found = {v.split(":", 1)[0] for v in violations(tmp_path)}
    assert found == set(bad), f"missed {set(bad) - found}, flagged {found - set(bad)}"
