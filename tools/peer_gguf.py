#!/usr/bin/env python3
"""peer_gguf.py - the same weights for llama.cpp: rewrite a Kipp GGUF as a
llama.cpp-layout GGUF with the `gguf` package, so both engines are measured
on the same weights.

llama.cpp does not load Kipp's artifact directly: Kipp keeps its hyper-
parameters and tokenizer under `kipp.*` keys (docs/FORMAT.md), while
llama.cpp's qwen3 loader wants `qwen3.*` hyperparameters and
`tokenizer.ggml.*` (checked: llama-bench refuses a Kipp file with "key not
found in model: qwen3.context_length"). Tensor names are already llama.cpp's,
so this copies every matrix's bytes unchanged (BF16, or a quantized type when
the file has one), widens the BF16 norm vectors to F32 exactly (llama.cpp's CPU
backend has no f32 x bf16 elementwise multiply), and writes the keys llama.cpp
reads. Reading the Kipp GGUF
rather than the safetensors guarantees the two engines run bit-identical
weights.

    peer_gguf.py --in models/synthetic-0.6b.gguf --out build/peers/synthetic-0.6b.gguf

--rerank writes what llama.cpp's convert_hf_to_gguf.py writes for a
Qwen3-Reranker (issue 56): pooling type rank, classifier labels yes/no, a
"rerank" chat template with the model card's prompt (default instruction), and
cls.output.weight = the output head's "yes" and "no" rows (F32, exact), whose
softmax llama.cpp's rank pooling takes as the score: P(yes), as Kipp's.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - install_deps.sh installs it
    sys.exit("peer_gguf: the gguf package is missing; run tools/install_deps.sh")


def field(r: gguf.GGUFReader, key: str):
    """Scalar or array value of a metadata key; SystemExit naming the key when absent."""
    f = r.get_field(key)
    if f is None:
        raise SystemExit(f"peer_gguf: {key} is missing; expected a Kipp GGUF (docs/FORMAT.md)")
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def token_types(n: int, added: list[int], special: list[bool]) -> list[int]:
    """llama.cpp token types: NORMAL, CONTROL for special added tokens, USER_DEFINED for the rest."""
    types = [gguf.TokenType.NORMAL] * n
    for i, s in zip(added, special):
        types[i] = gguf.TokenType.CONTROL if s else gguf.TokenType.USER_DEFINED
    return types


RERANK_TEMPLATE = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                   "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
                   "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
                   "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def add_rerank(w: gguf.GGUFWriter, r: gguf.GGUFReader, tokens: list[str]) -> None:
    """The reranker's pooling, labels, template and cls.output ("yes" and "no" rows of the head)."""
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])
    names = {t.name: t for t in r.tensors}
    head = names.get("output.weight") or names["token_embd.weight"]
    if head.tensor_type != gguf.GGMLQuantizationType.BF16:
        raise SystemExit("peer_gguf: --rerank needs a BF16 output head")
    rows = np.asarray(head.data).view(np.uint16).reshape(int(head.shape[1]), -1)
    pick = rows[[tokens.index("yes"), tokens.index("no")]].astype(np.uint32) << 16
    w.add_tensor("cls.output.weight", pick.view(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)


def write_peer(src: Path, dst: Path, rerank: bool = False) -> None:
    """Write dst (via a temporary file renamed into place) from the Kipp GGUF src."""
    r = gguf.GGUFReader(str(src))
    if field(r, "general.architecture") != "qwen3":
        raise SystemExit(f"peer_gguf: {src} is not a qwen3 artifact")
    vocab = int(field(r, "kipp.vocab_size"))
    tokens = field(r, "kipp.tokenizer.tokens")
    tmp = dst.with_name(dst.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen3")
    w.add_name(field(r, "general.name"))
    w.add_block_count(int(field(r, "kipp.n_layer")))
    w.add_context_length(int(field(r, "kipp.context_length")))
    w.add_embedding_length(int(field(r, "kipp.d_model")))
    w.add_feed_forward_length(int(field(r, "kipp.d_ff")))
    w.add_head_count(int(field(r, "kipp.n_q_head")))
    w.add_head_count_kv(int(field(r, "kipp.n_kv_head")))
    w.add_key_length(int(field(r, "kipp.head_dim")))
    w.add_value_length(int(field(r, "kipp.head_dim")))
    w.add_rope_freq_base(float(field(r, "kipp.rope_theta")))
    if "qwen3.rope.scaling.type" in r.fields:  # docs/FORMAT.md "RoPE scaling": already llama.cpp's names
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(field(r, "qwen3.rope.scaling.factor")))
        w.add_rope_scaling_orig_ctx_len(int(field(r, "qwen3.rope.scaling.original_context_length")))
        w.add_rope_scaling_yarn_beta_fast(float(field(r, "qwen3.rope.scaling.yarn_beta_fast")))
        w.add_rope_scaling_yarn_beta_slow(float(field(r, "qwen3.rope.scaling.yarn_beta_slow")))
    w.add_layer_norm_rms_eps(float(field(r, "kipp.rms_norm_eps")))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    # the logits rows beyond the tokenizer (151669..151935) are padding, as in the HF vocab
    pad = [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    w.add_token_list(tokens + pad)
    types = token_types(len(tokens), field(r, "kipp.tokenizer.added_ids"), field(r, "kipp.tokenizer.added_special"))
    w.add_token_types(types + [gguf.TokenType.UNUSED] * len(pad))
    w.add_token_merges(field(r, "kipp.tokenizer.merges"))
    w.add_bos_token_id(int(field(r, "kipp.bos_token_id")))
    w.add_eos_token_id(int(field(r, "kipp.eos_token_id")))
    w.add_pad_token_id(int(field(r, "kipp.bos_token_id")))
    w.add_add_bos_token(False)
    if rerank:
        add_rerank(w, r, tokens)
    for t in r.tensors:
        data = np.asarray(t.data)  # raw bytes, [rows][row bytes] uint8
        if len(t.shape) == 1 and t.tensor_type == gguf.GGMLQuantizationType.BF16:
            # norms: llama.cpp's CPU backend multiplies f32 activations only by
            # f32 vectors (binary_op refuses a bf16 src1); BF16 -> F32 is exact
            f32 = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            w.add_tensor(t.name, f32, raw_dtype=gguf.GGMLQuantizationType.F32)
            continue
        # with uint8 data the writer reads raw_shape as a byte shape and derives the element shape
        w.add_tensor(t.name, data, raw_shape=list(data.shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=sys.stdout.isatty())
    w.close()
    os.replace(tmp, dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="src", required=True, type=Path, help="Kipp GGUF (tools/convert_to_gguf.py)")
    ap.add_argument("--out", required=True, type=Path, help="llama.cpp-layout GGUF to write")
    ap.add_argument("--rerank", action="store_true", help="a Qwen3-Reranker for llama-server --reranking")
    a = ap.parse_args(argv)
    if not a.src.is_file():
        ap.error(f"--in {a.src} is not a readable file")
    if a.out.exists() and os.path.samefile(a.src, a.out):
        ap.error(f"--out {a.out} is the input file; refusing to overwrite it")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_peer(a.src, a.out, a.rerank)
    print(f"peer_gguf: wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
