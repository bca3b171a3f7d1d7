"""conftest.py - shared pytest fixtures: repository paths and the tiny synthetic checkpoints.

`make test` runs `make models-test` first, which writes build/models/<id>/ and
build/models/<id>.gguf for synthetic-tiny and synthetic-tiny-untied; the fixtures
reuse those (KIPP_TEST_MODELS overrides the directory). When pytest runs on its
own and they are absent, the fixtures generate them once per session into a
temporary directory with tools/make_checkpoint.py and tools/convert_to_gguf.py.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = REPO_ROOT / "tools"
QWEN3_DATA = REPO_ROOT / "data" / "qwen3"
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def models_dir() -> Path:
    """Where `make models-test` put the tiny checkpoints."""
    d = Path(os.environ.get("KIPP_TEST_MODELS", REPO_ROOT / "build" / "models"))
    return d if d.is_absolute() else REPO_ROOT / d


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def qwen3_data() -> Path:
    """data/qwen3: the vendored registry facts, real configs, tokenizer and golden cases."""
    assert (QWEN3_DATA / "qwen3-tokenizer" / "tokenizer.json").is_file(), \
        f"{QWEN3_DATA} lacks qwen3-tokenizer/tokenizer.json (it is part of the repository)"
    return QWEN3_DATA


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Callable[[str], Path]:
    """id -> HF checkpoint directory of a synthetic entry (build/models/<id> or generated)."""
    import checkpoints as reg
    import make_checkpoint

    cache: dict[str, Path] = {}

    def get(id_: str) -> Path:
        if id_ not in cache:
            built = models_dir() / id_
            if (built / "config.json").is_file():
                cache[id_] = built
            else:
                out = tmp_path_factory.mktemp("models") / id_
                make_checkpoint.write_checkpoint(reg.by_id(id_), out)
                cache[id_] = out
        return cache[id_]

    return get


@pytest.fixture(scope="session")
def synthetic_gguf(tmp_path_factory, synthetic_dir) -> Callable[[str], Path]:
    """id -> converted GGUF of a synthetic entry (build/models/<id>.gguf or converted)."""
    import checkpoints as reg
    import convert_to_gguf

    cache: dict[str, Path] = {}

    def get(id_: str) -> Path:
        if id_ not in cache:
            built = models_dir() / f"{id_}.gguf"
            if built.is_file():
                cache[id_] = built
            else:
                out = tmp_path_factory.mktemp("gguf") / f"{id_}.gguf"
                convert_to_gguf.convert(reg.by_id(id_), synthetic_dir(id_), out)
                cache[id_] = out
        return cache[id_]

    return get
