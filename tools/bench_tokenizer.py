#!/usr/bin/env python3
"""bench_tokenizer.py - native tokenizer vs Hugging Face `tokenizers`, one thread.

1. Writes a deterministic mixed corpus (>= 10 MiB: English-like prose, code,
   CJK, Cyrillic/Greek/Arabic/Devanagari, numbers, URLs, emoji, whitespace
   runs and a few special-token strings) to build/bench/tokenizer_corpus.txt.
   The words are drawn from the Qwen vocabulary itself, so no word list is needed.
2. Runs build/bin/bench_tokenizer on it (kipp_tokenize, one call per rep).
3. Runs HF tokenizers on the same text in this process with
   RAYON_NUM_THREADS=1 (single thread), same warm-up and reps.
4. Checks the two id sequences are identical and writes
   results/<YYYYMMDD>-<host>-<cpu id>-tokenizer-<gitsha>.json (schema kipp.bench.v1).
   Extra kipp-only rows time the worst single-line shapes at 10 MB.

Usage: .venv/bin/python tools/bench_tokenizer.py [--reps 5] [--warmup 1] [--mib 10] [--no-longlines]
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"          # before tokenizers is imported
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import array  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_models  # noqa: E402  (profile_rel)
import machine  # noqa: E402  (cpu_facts, host_tag)


def byte_decoder():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def vocab_pools(tok):
    """Words by script from the vocabulary (lower id = more frequent)."""
    dec = byte_decoder()
    pools = {"en": [], "cjk": [], "cyr": [], "grk": [], "ara": [], "dev": []}
    for piece, i in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        if i >= 151643:
            continue
        try:
            s = bytes(dec[c] for c in piece).decode("utf-8")
        except (UnicodeDecodeError, KeyError):
            continue
        w = s.strip()
        if not w or not w.isalpha():
            continue
        cp = ord(w[0])
        key = ("en" if w.isascii() and len(w) > 1 else "cjk" if 0x4E00 <= cp <= 0x9FFF
               else "cyr" if 0x400 <= cp <= 0x4FF else "grk" if 0x370 <= cp <= 0x3FF
               else "ara" if 0x600 <= cp <= 0x6FF else "dev" if 0x900 <= cp <= 0x97F else None)
        if key:
            pools[key].append(w)
    return pools


CODE = ["def {a}({b}, {c}=None):\n    if {b} is None:\n        return {c}\n    return [{b} * i for i in range({n})]\n\n",
        "static int {a}(const char *{b}, size_t {c}) {{\n\tfor (size_t i = 0; i < {c}; i++)\n\t\tif ({b}[i] == '\\n') return (int)i;\n\treturn -{n};\n}}\n\n",
        "const {a} = async ({b}) => {{ const r = await fetch(`/api/{c}?id=${{{b}}}`); return r.json(); }};\n",
        "{{\"{a}\": {n}, \"{b}\": [\"{c}\", null, true, 3.{n}e-2]}}\n",
        "SELECT {a}, COUNT(*) FROM {b} WHERE {c} > {n} GROUP BY {a};\n"]
EXTRA = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🚀✨", "→", "©", "€{n}", "https://example.com/{a}/{b}?q={n}",
         "{a}@{b}.org", "{n}.{n}.{n}", "  ", "\t", "\r\n", "\n\n", "<|im_start|>", "<think>", "'s", "'LL"]


def make_corpus(path, target, seed=20240601):
    tok = Tokenizer.from_file(os.path.join(ROOT, "data", "qwen3", "qwen3-tokenizer", "tokenizer.json"))
    pools = vocab_pools(tok)
    rng = random.Random(seed)

    def pick(pool):
        return pool[int(len(pool) * rng.random() ** 3)]

    def sentence(pool, sep=" ", n=None):
        ws = [pick(pool) for _ in range(n or rng.randint(4, 18))]
        return sep.join(ws)

    parts, size = [], 0
    while size < target:
        r = rng.random()
        ident = {"a": pick(pools["en"]).lower(), "b": pick(pools["en"]).lower(), "c": pick(pools["en"]).lower(),
                 "n": rng.randint(0, 99999)}
        if r < 0.55:
            s = sentence(pools["en"]).capitalize() + rng.choice([".", "!", "?", ",", ";"]) + rng.choice([" ", " ", "\n"])
        elif r < 0.68:
            s = rng.choice(CODE).format(**ident)
        elif r < 0.78:
            s = sentence(pools["cjk"], sep="", n=rng.randint(5, 30)) + rng.choice(["。", "，", "！", "\n"])
        elif r < 0.90:
            s = sentence(pools[rng.choice(["cyr", "grk", "ara", "dev"])]) + rng.choice([". ", "\n"])
        else:
            s = rng.choice(EXTRA).format(**ident) + " " + str(rng.randint(0, 10 ** rng.randint(1, 9)))
        parts.append(s)
        size += len(s.encode())
    text = "".join(parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return text


def run_kipp(args, model, extra):
    cmd = [os.path.join(ROOT, "build", "bin", "bench_tokenizer"), "--model", model,
           "--reps", str(args.reps), "--warmup", str(args.warmup)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def row(name, r):
    return {"name": name, "unit": "MB/s", "median": round(r["mb_s_median"], 3), "min": round(r["mb_s_min"], 3),
            "max": round(r["mb_s_max"], 3), "reps": r["reps"], "tokens_per_s": round(r["tokens_per_s"], 1),
            "bytes": r["bytes"], "tokens": r["tokens"]}


def run_hf(text, reps, warmup):
    tok = Tokenizer.from_file(os.path.join(ROOT, "data", "qwen3", "qwen3-tokenizer", "tokenizer.json"))
    t, ids = [], None
    for r in range(-warmup, reps):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        if r >= 0:
            t.append(time.perf_counter() - t0)
    n = len(text.encode())
    med = statistics.median(t)
    return ids, {"mb_s_median": n / med / 1e6, "mb_s_min": n / max(t) / 1e6, "mb_s_max": n / min(t) / 1e6,
                 "reps": reps, "tokens_per_s": len(ids) / med, "bytes": n, "tokens": len(ids)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--mib", type=float, default=10.0)
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "synthetic-tiny.gguf"))
    ap.add_argument("--no-longlines", action="store_true")
    args = ap.parse_args()
    corpus = os.path.join(ROOT, "build", "bench", "tokenizer_corpus.txt")
    text = make_corpus(corpus, int(args.mib * (1 << 20)))
    ids_path = corpus + ".kipp_ids"
    k = run_kipp(args, args.model, ["--corpus", corpus, "--special", "--ids-out", ids_path])
    print(f"kipp: {k['mb_s_median']:.2f} MB/s, {k['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    hf_ids, h = run_hf(text, args.reps, args.warmup)
    print(f"hf tokenizers (1 thread): {h['mb_s_median']:.2f} MB/s, {h['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    kipp_ids = array.array("I")
    with open(ids_path, "rb") as f:
        kipp_ids.frombytes(f.read())
    match = list(kipp_ids) == hf_ids
    results = [row("kipp_encode", k), row("hf_tokenizers_encode", h)]
    if not args.no_longlines:
        for name, rep in [("kipp_encode_10mb_one_word", "abcdefghij"), ("kipp_encode_10mb_whitespace", " \t "),
                          ("kipp_encode_10mb_words_line", "hello world ")]:
            r = run_kipp(args, args.model, ["--repeat", rep, "--bytes", str(10 << 20)])
            results.append(row(name, r))
    host = socket.gethostname()
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip() or "unknown"
    now = datetime.datetime.now(datetime.timezone.utc)
    out = {"schema": "kipp.bench.v1", "kind": "tokenizer", "git_sha": sha,
           "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "host": host, "cpu": machine.cpu_facts(),
           "profile": bench_models.profile_rel(),
           "config": {"corpus": os.path.relpath(corpus, ROOT), "corpus_bytes": len(text.encode()),
                      "corpus_seed": 20240601, "reps": args.reps, "warmup": args.warmup, "threads": 1,
                      "special": True, "ids_identical": match,
                      "speedup_vs_hf": round(k["mb_s_median"] / h["mb_s_median"], 3)},
           "results": results}
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    path = os.path.join(ROOT, "results", f"{now:%Y%m%d}-{machine.host_tag()}-tokenizer-{sha}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"ids identical: {match}; wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
