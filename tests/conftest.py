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


# ---- kipp-serve on the tiny model (the test_serve_*.py modules and others) ----

@pytest.fixture(scope="session")
def model(synthetic_gguf) -> Path:
    """The synthetic-tiny GGUF: the model the kipp-serve tests serve."""
    return synthetic_gguf("synthetic-tiny")


@pytest.fixture(scope="module")
def srv(request, model):
    """kipp-serve on synthetic-tiny for one test module: --ctx the module's
    N_CTX (1024 when it has none), then its SERVE_ARGS (a tuple of flags)."""
    from serve_harness import Server
    args = ("--ctx", str(getattr(request.module, "N_CTX", 1024)), *getattr(request.module, "SERVE_ARGS", ()))
    with Server(model, *args) as s:
        yield s


@pytest.fixture(scope="module")
def oai(srv):
    """The official openai client on srv's /v1 (no retries: a failure shows at once)."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(oai):
    """The module's SDK client: the openai one (test_serve_anthropic overrides it with anthropic's)."""
    return oai


@pytest.fixture(scope="session")
def hf():
    """The Qwen3 tokenizer as HF tokenizers loads it (data/qwen3)."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(QWEN3_DATA / "qwen3-tokenizer" / "tokenizer.json"))


@pytest.fixture(scope="session")
def tid(model) -> Callable[[str], int]:
    """text -> its one token id in the tiny model's vocabulary (kipp tokenize --special)."""
    import json
    import subprocess

    def get(text: str) -> int:
        r = subprocess.run([str(REPO_ROOT / "build" / "kipp"), "tokenize", "--model", str(model), "--special", "--text", text],
                           capture_output=True, text=True, timeout=60)
        ids = json.loads(r.stdout)
        assert len(ids) == 1, (text, ids)
        return ids[0]
    return get


@pytest.fixture(scope="session")
def compact(hf) -> dict:
    """logit_bias -100 on 300 whitespace-only tokens (the API's most entries), so
    the random model spends few tokens on the whitespace JSON allows."""
    ws = sorted(i for i in hf.get_vocab().values() if i < 151643 and not hf.decode([i]).strip(" \t\r\n")
                and hf.decode([i]))
    return {str(i): -100 for i in ws[:300]}


@pytest.fixture(scope="session")
def hf_render() -> Callable:
    """(messages, tools, add_generation_prompt, thinking) -> the prompt text
    Qwen3's chat template renders, by jinja2 as transformers does
    (tools/gen_chat_cases.py): the independent oracle of Kipp's renderer."""
    pytest.importorskip("jinja2")
    import json
    from gen_chat_cases import make_renderer
    template = json.load(open(QWEN3_DATA / "qwen3-tokenizer" / "tokenizer_config.json"))["chat_template"]
    render = make_renderer(str(QWEN3_DATA))
    return lambda msgs, tools, agp, thinking: render(template, msgs, tools, agp, thinking)
