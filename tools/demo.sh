#!/usr/bin/env bash
# demo.sh - the body of `make demo`: on a fresh clone, after
# tools/install_deps.sh and `make all` (the Makefile runs both first), write a
# synthetic Qwen3 checkpoint in the Hugging Face layout, convert it to Kipp's
# GGUF, inspect it, and generate text from a real prompt.
#
# The default checkpoint is synthetic-tiny (2 layers, ~90 MB, seconds end to
# end). KIPP_DEMO_CHECKPOINT=synthetic-0.6b runs the real 0.6B shape instead
# (28 layers, 1.2 GB of BF16 written twice: minutes and ~2.5 GB of disk).
# KIPP_DEMO_BACKEND=ref|cpu picks the backend (default cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

CKPT=${KIPP_DEMO_CHECKPOINT:-synthetic-tiny}
BACKEND=${KIPP_DEMO_BACKEND:-cpu}
PY=${PYTHON:-.venv/bin/python}   # the project venv (tools/install_deps.sh)
OUT=build/models   # where `make models-test` writes too, and where the README's examples point
QUIET=$([ -t 1 ] || echo --quiet)   # progress bars on a terminal only
PROMPT="Write one sentence about the history of Cologne Cathedral."
KIPP=${KIPP_BIN:-build/kipp}

[ -x "$KIPP" ] || { echo "demo: $KIPP is missing; run 'make all' first" >&2; exit 1; }
mkdir -p "$OUT"

cat <<EOF
==============================================================================
 Kipp demo: checkpoint '$CKPT', backend '$BACKEND'

 The weights are SYNTHETIC: deterministic pseudo-random numbers written by
 tools/make_checkpoint.py in the exact Qwen3 layout. The whole pipeline is
 real (HF layout -> GGUF -> strict loader -> tokenizer -> forward -> sampler
 -> streaming detokenizer), but the generated text is meaningless by
 construction. Use a real checkpoint (commands at the end) for real text.
==============================================================================
EOF

step() { printf '\n---- %s\n' "$*"; }

step "1/4 synthetic checkpoint (Hugging Face layout): $OUT/$CKPT"
"$PY" tools/make_checkpoint.py --checkpoint "$CKPT" --out "$OUT/$CKPT" $QUIET
ls -l "$OUT/$CKPT"

step "2/4 convert to Kipp GGUF: $OUT/$CKPT.gguf"
"$PY" tools/convert_to_gguf.py --checkpoint "$CKPT" --input "$OUT/$CKPT" --out "$OUT/$CKPT.gguf" $QUIET
(cd "$OUT" && sha256sum "$CKPT.gguf" > "$CKPT.gguf.sha256")   # the stamp `make models-test` checks
ls -l "$OUT/$CKPT.gguf"

step "3/4 kipp inspect $OUT/$CKPT.gguf"
"$KIPP" inspect "$OUT/$CKPT.gguf"

step "4/4 kipp generate --chat (sampled, seed 7, 32 tokens): \"$PROMPT\""
"$KIPP" generate --model "$OUT/$CKPT.gguf" --backend "$BACKEND" --chat --no-think --seed 7 \
    --temperature 0.7 --top-p 0.9 --top-k 40 --repeat-penalty 1.3 \
    --prompt "$PROMPT" --max-tokens 32

cat <<'EOF'

==============================================================================
 With network access, the same three steps on a real checkpoint:

   tools/download_model.sh --checkpoint qwen3-0.6b --dest models/qwen3-0.6b
   .venv/bin/python tools/convert_to_gguf.py --checkpoint qwen3-0.6b \
       --input models/qwen3-0.6b --out models/qwen3-0.6b.gguf
   build/kipp generate --model models/qwen3-0.6b.gguf --chat \
       --prompt "Why is the sky blue?" --temperature 0.6 --top-p 0.95 --top-k 20

 (`build/kipp chat --model models/qwen3-0.6b.gguf` for a multi-turn chat.)
==============================================================================
EOF
