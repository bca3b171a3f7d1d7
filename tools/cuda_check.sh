#!/usr/bin/env bash
# cuda_check.sh - the device check of the CUDA backend: one
# script, under 8 minutes on one H200, for the `run` device tool.
#
# Two steps, because the device machine has no network and may lack the C
# libraries the binaries link (hwloc, jansson, pcre2, utf8proc, xxhash, papi):
#
#   1. here (any machine with nvcc):   tools/cuda_check.sh --pack
#      runs `make cuda`, then copies the stripped build/cuda binaries and the
#      shared libraries they need (beyond glibc and libstdc++) into .cuda-carry/
#      (git-ignored; one xz bundle, about 5 MiB), with the commit and a hash of
#      the sources they were built from.
#   2. on the device, through the run tool:
#      run(command="tools/cuda_check.sh", carry=[".cuda-carry"], kind="nvidia-h200", timeout_s=540)
#      Without .cuda-carry it builds there with `make cuda` (needs those libraries).
#
# On the device it:
#   - makes the synthetic checkpoints with the repo's numpy tools (python3 there
#     has numpy): tiny (bf16, untied, q8_0, affine4_gs32), synthetic-0.6b in the
#     three formats, synthetic-1.7b in bf16; in the background, in parallel;
#   - runs every kernel check (build/cuda/kcheck_cuda) meanwhile;
#   - the model gates (kipp-cuda-gate): argmax equal to the ref backend and
#     full-logit NMSE <= 1e-4 for every prefill row and every decode position,
#     isolated, batched (one kipp_eval_batch, decode graphs), pooled and with
#     the KV arena grown under a live session; tiny
#     models (plus a prefill longer than one backend round) and the 0.6B shape
#     in bf16, q8_0 and affine4_gs32;
#   - kipp-serve --backend cuda on the tiny model: two greedy /v1/completions;
#   - kipp-bench --backend cuda: pp512, tg128, tg4k, batch8 on synthetic-0.6b
#     and synthetic-1.7b (bf16), with the share of the HBM roofline added;
#   - writes under $OUT (or ./cuda-check-out): check.log, summary.txt,
#     gates.json, the benchmark results under kipp-bench's own file name
#     (<date>-<host>-<cpu>-cuda-<sha>.json: kipp.bench.v1 plus device, hbm_peak_gbps
#     and per-row hbm_share; ready for results/), logs.tar.gz (every log),
#     build.log when it built there.
# Expected time on an H200: 4-6 minutes (the scalar ref oracle on the 0.6B
# shape and making the 1.7B checkpoint are the long parts); BUDGET (470 s)
# bounds it. Exit status: 0 only when the build, every kernel check, every gate
# and the kipp-serve check pass, and every benchmark ran
# (the speed targets are reported, not gated).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRY=.cuda-carry
PY=${PYTHON:-python3}
# What the binaries are built from (the device copy of the tree may have no .git).
src_hash() {
    find backends kernels engine cli bench server \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print0 |
        LC_ALL=C sort -z | xargs -0 cat | sha256sum | cut -c1-16
}

if [ "${1:-}" = "--pack" ]; then
    set -e
    command -v nvcc >/dev/null || { echo "cuda_check --pack: nvcc not found: nothing to build"; exit 1; }
    nice make -j"${JOBS:-2}" cuda
    rm -rf "$CARRY"; mkdir -p "$CARRY"
    stage=$(mktemp -d); mkdir -p "$stage/bin" "$stage/lib"
    for b in kipp kipp-bench kipp-serve kipp-cuda-gate kcheck_cuda; do
        [ -x build/cuda/$b ] || { echo "cuda_check --pack: build/cuda/$b missing after make cuda"; exit 1; }
        strip --strip-debug -o "$stage/bin/$b" build/cuda/$b
    done
    # Every shared library outside glibc and the C++ runtime, which the device image has.
    for b in "$stage"/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/lib/"; done
    # Compressed: the working tree and the carry travel within 64 MiB together.
    tar -C "$stage" -cJf "$CARRY/bundle.tar.xz" bin lib
    rm -rf "$stage"
    git rev-parse --short=12 HEAD > "$CARRY/BUILD_SHA"
    git diff --quiet HEAD -- || echo dirty >> "$CARRY/BUILD_SHA"
    src_hash > "$CARRY/SRC_HASH"
    du -sh "$CARRY"
    echo "cuda_check --pack: now run tools/cuda_check.sh on the device with carry=[\"$CARRY\"]"
    exit 0
fi

# The run tool brings back at most 8 files from $OUT: the work goes to $W and
# $OUT gets check.log (written as it runs), summary.txt, gates.json, the
# benchmark results (kipp-bench's file name) and logs.tar.gz (every log) at the end.
FINAL=${OUT:-$ROOT/cuda-check-out}
W=/tmp/cuda-check-work
rm -rf "$W"; mkdir -p "$FINAL" "$W"
OUT=$W
LOG=$FINAL/check.log
: > "$LOG"
T0=$(date +%s)
FAILS=()
# The whole check stays inside BUDGET seconds (the run tool's limit is 600 s a
# call): each benchmark gets what is left, and is skipped under a minute.
BUDGET=${CUDA_CHECK_BUDGET:-470}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
fail() { FAILS+=("$1"); say "FAIL: $1"; }

say "cuda_check on $(hostname) at $(git rev-parse --short=12 HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)

# ---- binaries: carried (--pack) or built here ----
if [ -f "$CARRY/bundle.tar.xz" ]; then
    rm -rf /tmp/kipp-carry; mkdir -p /tmp/kipp-carry
    tar -C /tmp/kipp-carry -xJf "$CARRY/bundle.tar.xz" 2>/dev/null ||  # no xz there: Python's lzma
        "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$CARRY/bundle.tar.xz" /tmp/kipp-carry || fail "unpacking $CARRY/bundle.tar.xz"
    BIN=/tmp/kipp-carry/bin
    export LD_LIBRARY_PATH=/tmp/kipp-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "binaries: carried from --pack at $(tr '\n' ' ' < "$CARRY/BUILD_SHA")"
    if [ "$(cat "$CARRY/SRC_HASH" 2>/dev/null)" != "$(src_hash)" ]; then
        fail "the carried binaries were built from other sources than this tree: run tools/cuda_check.sh --pack again"
    fi
    if ldd "$BIN"/* | grep -q 'not found'; then ldd "$BIN"/* | grep 'not found' | tee -a "$LOG"; fail "carried binaries miss shared libraries"; fi
else
    say "binaries: make cuda here"
    if make -j16 cuda > "$FINAL/build.log" 2>&1; then BIN=$ROOT/build/cuda; else
        tail -n 30 "$FINAL/build.log"; fail "make cuda (build.log)"; BIN=$ROOT/build/cuda; fi
fi
for b in kipp kipp-bench kipp-cuda-gate kcheck_cuda; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
if [ ${#FAILS[@]} -gt 0 ]; then say "cannot go on without binaries"; printf '%s\n' "${FAILS[@]}" > "$FINAL/summary.txt"; exit 1; fi

# ---- checkpoints, in the background (numpy only; nothing is downloaded) ----
M=/tmp/kipp-models
mkdir -p "$M"
mk() { # mk ID [QUANT...]: HF checkpoint, bf16 GGUF, then the quantized GGUFs
    local id=$1; shift
    [ -f "$M/$id.gguf" ] || { "$PY" tools/make_checkpoint.py --checkpoint "$id" --out "$M/$id" --quiet &&
        "$PY" tools/convert_to_gguf.py --checkpoint "$id" --input "$M/$id" --out "$M/$id.gguf" --quiet; } || return 1
    for q in "$@"; do
        [ -f "$M/$id-$q.gguf" ] || "$PY" tools/convert_to_gguf.py --checkpoint "$id" --input "$M/$id" \
            --out "$M/$id-$q.gguf" --quant "$q" --quiet || return 1
    done
    echo "$id ready"
}
( mk synthetic-tiny q8_0 affine4_gs32 && mk synthetic-tiny-untied ) > "$OUT/models-tiny.log" 2>&1 &
P_TINY=$!
# CUDA_CHECK_TINY_ONLY=1: a dry run of the script's flow (no 0.6B/1.7B checkpoints).
if [ -z "${CUDA_CHECK_TINY_ONLY:-}" ]; then
    ( mk synthetic-0.6b q8_0 affine4_gs32 ) > "$OUT/models-0.6b.log" 2>&1 &
    P_06=$!
    ( mk synthetic-1.7b ) > "$OUT/models-1.7b.log" 2>&1 &
    P_17=$!
else
    (exit 1) & P_06=$!
    (exit 1) & P_17=$!
fi

# ---- kernel checks (GPU) while the checkpoints are made ----
say "kernel checks: kcheck_cuda"
if timeout 180 "$BIN/kcheck_cuda" > "$OUT/kcheck.log" 2>&1; then say "kcheck_cuda: pass ($(grep -E '^RESULT' "$OUT/kcheck.log" | tail -n1))"
else tail -n 30 "$OUT/kcheck.log"; fail "kcheck_cuda (kcheck.log)"; fi

# ---- model gates ----
# gate FILE... : one kipp-cuda-gate process per model, in parallel (the ref
# oracle is one CPU thread each), $GATE_FLAGS for all; logs and JSON per model.
gate() {
    local pids=() f i=0
    for f in "$@"; do
        timeout 300 "$BIN/kipp-cuda-gate" --nmse 1e-4 $GATE_FLAGS --model "$M/$f.gguf" \
            --json "$OUT/gate-$f.json" > "$OUT/gate-$f.log" 2>&1 &
        pids+=($!)
    done
    for f in "$@"; do
        if wait "${pids[$i]}"; then say "gates $f: pass"; else fail "gates $f (gate-$f.log in logs.tar.gz)"; fi
        grep -Ev '^    row' "$OUT/gate-$f.log" | head -n 20 | tee -a "$LOG"
        i=$((i + 1))
    done
}

if wait $P_TINY; then
    say "gates: tiny models (bf16, q8_0, affine4_gs32, untied), with a prefill longer than one round"
    GATE_FLAGS="--prompt 40 --decode 8 --batch 4 --long 700" \
        gate synthetic-tiny synthetic-tiny-q8_0 synthetic-tiny-affine4_gs32 synthetic-tiny-untied
else tail -n 20 "$OUT/models-tiny.log"; fail "making the tiny checkpoints (models-tiny.log)"; fi

if wait $P_06; then
    say "gates: synthetic-0.6b in bf16, q8_0, affine4_gs32"
    GATE_FLAGS="--prompt 8 --decode 3 --batch 2" gate synthetic-0.6b synthetic-0.6b-q8_0 synthetic-0.6b-affine4_gs32
else tail -n 20 "$OUT/models-0.6b.log"; fail "making synthetic-0.6b (models-0.6b.log)"; fi

# ---- kipp-serve --backend cuda: two greedy requests on the tiny model, pooled KV ----
if [ -f "$M/synthetic-tiny.gguf" ] && [ -x "$BIN/kipp-serve" ]; then
    say "kipp-serve --backend cuda: /v1/completions on synthetic-tiny"
    "$BIN/kipp-serve" --model "$M/synthetic-tiny.gguf" --backend cuda --port 18431 --kv-pool-mib 256 \
        > "$OUT/serve.log" 2>&1 &
    SP=$!
    if SERVE_PID=$SP timeout 90 "$PY" - > "$OUT/serve-client.log" 2>&1 <<'PYEOF'; then say "kipp-serve: pass"; else fail "kipp-serve --backend cuda (serve.log, serve-client.log)"; fi
import json, os, time, urllib.request
base = "http://127.0.0.1:18431"
def alive():
    try:
        return open(f"/proc/{os.environ['SERVE_PID']}/stat").read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
for _ in range(120):
    if not alive():
        raise SystemExit("kipp-serve exited (serve.log)")
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(0.5)
else:
    raise SystemExit("kipp-serve did not become healthy")
texts = []
for prompt in ("Hello there", "Hello there"):
    req = urllib.request.Request(base + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": prompt, "max_tokens": 12, "temperature": 0}).encode())
    r = json.load(urllib.request.urlopen(req, timeout=60))
    texts.append(r["choices"][0]["text"])
    print(json.dumps(r)[:400])
assert texts[0] == texts[1], texts  # greedy, the same prompt: the same text
PYEOF
    kill "$SP" 2>/dev/null; wait "$SP" 2>/dev/null
    tail -n 5 "$OUT/serve-client.log" | tee -a "$LOG"
fi

# ---- benchmarks: nothing else on the GPU now ----
BENCH_MODELS=()
[ -f "$M/synthetic-0.6b.gguf" ] && BENCH_MODELS+=("$M/synthetic-0.6b.gguf")
if wait $P_17; then BENCH_MODELS+=("$M/synthetic-1.7b.gguf"); else fail "making synthetic-1.7b (models-1.7b.log)"; fi
if [ ${#BENCH_MODELS[@]} -gt 0 ]; then
    rm -rf /tmp/kipp-bench-out
    for f in "${BENCH_MODELS[@]}"; do  # one model per run: a timeout keeps the rows before it
        t=$(left)
        if [ "$t" -lt 60 ]; then fail "kipp-bench $(basename "$f"): skipped, ${t} s of the budget left"; continue; fi
        say "kipp-bench --backend cuda $(basename "$f"): pp512, tg128, tg4k, batch8 (at most ${t} s)"
        if timeout "$t" "$BIN/kipp-bench" --backend cuda --model "$f" --bench pp512,tg128,tg4k,batch8 \
            --reps 3 --warmup 1 --out /tmp/kipp-bench-out >> "$OUT/bench.log" 2>&1; then say "kipp-bench $(basename "$f"): done"
        else tail -n 30 "$OUT/bench.log"; fail "kipp-bench $(basename "$f") (bench.log)"; fi
    done
    raw=$(ls /tmp/kipp-bench-out/*.json 2>/dev/null | head -n1)
    if [ -n "$raw" ]; then
        # The HBM roofline: nominal peak of the card (H200 4.8 TB/s, H100 SXM 3.35 TB/s).
        # Written under kipp-bench's own name (<date>-<host>-<cpu>-cuda-<sha>.json), ready for results/.
        BENCH_JSON=$(basename "$raw")
        GPU="$GPU" "$PY" - "$raw" "$OUT/$BENCH_JSON" <<'PYEOF' | tee -a "$LOG"
import json, os, sys
doc = json.load(open(sys.argv[1]))
gpu = os.environ.get("GPU", "")
peak = 4800.0 if "H200" in gpu else 3350.0 if "H100" in gpu else None
doc["device"] = gpu
doc["hbm_peak_gbps"] = peak
doc["hbm_peak_source"] = "nominal datasheet figure of the card"
print(f"{'bench':8} {'model':16} {'tok/s':>10} {'ms/tok':>8} {'GB/s':>8} {'HBM share':>9}")
for r in doc.get("results", []):
    gbps = r.get("gbps_effective")
    share = gbps / peak if (gbps and peak and r.get("bound") == "memory") else None
    r["hbm_peak_gbps"] = peak
    r["hbm_share"] = share
    s = f"{100 * share:8.1f}%" if share is not None else "   (compute)"
    print(f"{r.get('name', '?'):8} {r.get('model', '?'):16} {r.get('median', 0):10.1f} {r.get('ms_per_token', 0):8.3f} "
          f"{gbps or 0:8.1f} {s}")
    if r.get("name") == "tg128" and "1.7b" in r.get("model", "") and share is not None:
        print(f"  1.7B decode at {100 * share:.1f}% of HBM (target: >= 80%): {'met' if share >= 0.8 else 'not met'}")
json.dump(doc, open(sys.argv[2], "w"), indent=1)
PYEOF
    fi
fi

# ---- summary and what comes back ----
"$PY" - "$OUT" "$FINAL/gates.json" <<'PYEOF'
import glob, json, os, sys
gates = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "gate-*.json"))):
    try:
        gates[os.path.basename(f)[5:-5]] = json.load(open(f))
    except (OSError, ValueError) as e:
        gates[os.path.basename(f)[5:-5]] = {"error": str(e)}
json.dump({"schema": "kipp.cuda_gates.v1", "gates": gates}, open(sys.argv[2], "w"), indent=1)
PYEOF
[ -n "${BENCH_JSON:-}" ] && [ -f "$OUT/$BENCH_JSON" ] && cp "$OUT/$BENCH_JSON" "$FINAL/"
{
    echo "cuda_check: $GPU, $(( $(date +%s) - T0 )) s"
    for f in "$OUT"/gate-*.log; do [ -f "$f" ] && grep -E '^(  [a-z]+ +[0-9]+ rows|GATE|  open)' "$f" | sed "s|^|$(basename "$f" .log): |"; done
    if [ ${#FAILS[@]} -eq 0 ]; then echo "ALL PASS"; else echo "FAILED: ${#FAILS[@]}"; printf '  %s\n' "${FAILS[@]}"; fi
} > "$FINAL/summary.txt"
tar -czf "$FINAL/logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls) 2>/dev/null
cat "$FINAL/summary.txt"
[ ${#FAILS[@]} -eq 0 ]
