#!/usr/bin/env python3
"""st_config.py - the sentence-transformers files of a Qwen3-Embedding checkpoint (issue 56).

Qwen3-Embedding's Hub repository carries, beside the transformers files, the
sentence-transformers module chain (modules.json: Transformer -> Pooling -> Normalize),
the pooling config (1_Pooling/config.json: pooling_mode_lasttoken) and the stored prompts
(config_sentence_transformers.json). tools/convert_to_gguf.py checks them with check()
(Kipp reproduces last-token pooling and L2 normalization only); tools/make_checkpoint.py
writes them for the embedding twins with files().
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as reg  # noqa: E402

# The query prompt of Qwen3-Embedding's config_sentence_transformers.json (its model card's
# get_detailed_instruct with the default task; no space after "Query:").
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


def files(c: reg.Checkpoint) -> dict[str, str]:
    """The side files of an embedding entry (relative name -> text); empty for other variants.
    Content follows third-party copies of the Hub files (docs/FORMAT.md "Retrieval checkpoints")."""
    if c.variant != "embedding":
        return {}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    pooling = {"word_embedding_dimension": c.d_model, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": True, "include_prompt": True}
    st = {"prompts": {"query": QUERY_PROMPT, "document": ""}, "default_prompt_name": None,
          "similarity_fn_name": "cosine"}
    return {"modules.json": json.dumps(modules, indent=2) + "\n",
            "1_Pooling/config.json": json.dumps(pooling, indent=4) + "\n",
            "config_sentence_transformers.json": json.dumps(st, indent=2) + "\n"}


def _load_json(path: Path) -> dict:
    """A JSON object, refusing a missing or malformed file by name."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise ValueError(f"{path} is missing (modules.json names it)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path.name} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path.name} holds a {type(obj).__name__}, expected a JSON object")
    return obj


# Pooling modes of a sentence-transformers 1_Pooling/config.json; Kipp pools the last token only.
ST_POOLING_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                    "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                    "pooling_mode_lasttoken")


def check(indir: Path, c: reg.Checkpoint) -> None:
    """Refuse a sentence-transformers module chain Kipp would not reproduce. Qwen3-Embedding's
    repository has modules.json (Transformer -> Pooling -> Normalize) with last-token pooling
    in 1_Pooling/config.json; Kipp pools the last token and L2-normalizes. Absent files are
    accepted (the downloader fetches only what the conversion needs); a modules.json beside a
    generation or reranker entry means the directory is an embedding model, and is refused."""
    mod_path = indir / "modules.json"
    if not mod_path.is_file():
        return
    if c.variant != "embedding":
        raise ValueError(f"{indir} has a sentence-transformers modules.json (an embedding model), but "
                         f"{c.id} is a {c.variant} checkpoint; expected an embedding entry such as "
                         "qwen3-embedding-0.6b")
    try:
        modules = json.loads(mod_path.read_text(encoding="utf-8"))
        types = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pool_dir = next(m["path"] for m in modules if m["type"].endswith(".Pooling"))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, StopIteration) as e:
        raise ValueError(f"modules.json is not a sentence-transformers module list with a Pooling "
                         f"module ({e!r})") from None
    if types != ["Transformer", "Pooling", "Normalize"]:
        raise ValueError(f"modules.json chains {' -> '.join(types)}; expected Transformer -> Pooling -> "
                         "Normalize (Kipp pools the last token and L2-normalizes, nothing else)")
    pool = _load_json(indir / pool_dir / "config.json")
    on = [k for k in ST_POOLING_MODES if pool.get(k) is True]
    if on != ["pooling_mode_lasttoken"]:
        raise ValueError(f"{pool_dir}/config.json enables {on or 'no pooling mode'}; expected only "
                         "pooling_mode_lasttoken (Kipp pools the last token)")
    if pool.get("word_embedding_dimension", c.d_model) != c.d_model:
        raise ValueError(f"{pool_dir}/config.json word_embedding_dimension is "
                         f"{pool['word_embedding_dimension']}; expected {c.d_model} for {c.id}")
