#!/usr/bin/env python3
"""Golden ids for the exhaustive Unicode tokenizer test (tests/test_tokenizer_unicode.c).

Every code point X of planes 0-3 and 14 (surrogates excluded; unassigned ones
included, a superset of the assigned ones) is encoded by HF tokenizers in each
context of CONTEXTS, with add_special_tokens=False. The ids are hashed per block
of 256 code points, so the committed file is small and the C test needs no
Python:

  hash = FNV-1a 64 over, for each X of the block in order and each context in
         order: the id count, then each id, all as uint32 little-endian.

Output: one line per block, "<cp >> 8 in hex> <hash in hex>", after '#' header
lines. Usage:

  .venv/bin/python tools/gen_tokenizer_unicode.py --ucd /tmp/ud2 \\
      [--tokenizer data/qwen3/qwen3-tokenizer/tokenizer.json] \\
      [--out tests/tokenizer_cases/unicode_blocks.txt]

With --ucd (a unicodedata2==16.0.0 directory, as for gen_unicode_tables.py)
it also writes tests/tokenizer_cases/unicode_nfc.txt: for every code point X
that is not NFC-safe, the hash of HF's ids over the NFC probes of X
(gen_unicode_tables.nfc_probes: reordering against marks of class 1, 10, 230,
240, composing with its composition first F), as "X F hash" (F 0 for none);
then 500 random texts over those code points as "T cp,cp,... hash".

Keep CONTEXTS and the probes in step with the C test.
"""
import argparse, os, struct

# X is replaced by the code point. Before 's, before +W, after a space,
# before a digit, and both of the last two at once.
CONTEXTS = ["X's", "X+W", " X", "X1", " X1"]
PLANES = [0, 1, 2, 3, 14]
FNV_OFF, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv(h, data):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=os.path.join(here, "..", "data", "qwen3", "qwen3-tokenizer", "tokenizer.json"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "tokenizer_cases", "unicode_blocks.txt"))
    ap.add_argument("--ucd", help="unicodedata2==16.0.0 directory: also write the NFC golden data")
    ap.add_argument("--nfc-out", default=os.path.join(here, "..", "tests", "tokenizer_cases", "unicode_nfc.txt"))
    a = ap.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "2")
    import tokenizers
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    lines = ["# Exhaustive Unicode golden data: tools/gen_tokenizer_unicode.py",
             f"# tokenizers {tokenizers.__version__}; contexts {' | '.join(repr(c) for c in CONTEXTS)}",
             "# planes " + ",".join(str(p) for p in PLANES) + "; surrogates excluded; FNV-1a 64 per 256 code points",
             "# block hash"]
    for plane in PLANES:
        for blk in range(plane << 8, (plane + 1) << 8):
            if 0xD8 <= blk <= 0xDF:
                continue
            texts = [c.replace("X", chr(cp)) for cp in range(blk << 8, (blk + 1) << 8) for c in CONTEXTS]
            h = FNV_OFF
            for e in tok.encode_batch(texts, add_special_tokens=False):
                h = fnv(h, struct.pack(f"<{len(e.ids) + 1}I", len(e.ids), *e.ids))
            lines.append(f"{blk:x} {h:016x}")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(lines) - 4} blocks")
    if a.ucd:
        write_nfc(tok, a.ucd, a.nfc_out)


def ids_hash(tok, texts):
    h = FNV_OFF
    for e in tok.encode_batch(texts, add_special_tokens=False):
        h = fnv(h, struct.pack(f"<{len(e.ids) + 1}I", len(e.ids), *e.ids))
    return h


def write_nfc(tok, ucd, out):
    import random, sys
    sys.path.insert(0, ucd)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import unicodedata2 as ud
    import gen_unicode_tables as g
    assert ud.unidata_version == g.UNICODE_VERSION
    safe = g.nfc_safe_set(ud)
    firsts = g.composition_firsts(ud)
    unsafe = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and cp not in safe]
    lines = ["# NFC golden data: tools/gen_tokenizer_unicode.py --ucd (unicodedata2 " + ud.unidata_version + ")",
             "# X F hash: HF ids over gen_unicode_tables.nfc_probes(X); T cps hash: one random text"]
    for x in unsafe:
        f = firsts.get(x, [0])[0]
        lines.append(f"{x:x} {f:x} {ids_hash(tok, g.nfc_probes(x, firsts)):016x}")
    rng = random.Random(1313)
    pool = unsafe + [ord(c) for c in "aeqAE1 \n中かウ"] * 50
    for _ in range(500):
        t = [rng.choice(pool) for _ in range(rng.randint(1, 8))]
        if 0 in t:
            continue
        lines.append("T " + ",".join(f"{c:x}" for c in t) + f" {ids_hash(tok, [''.join(map(chr, t))]):016x}")
    with open(out, "w") as fo:
        fo.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(unsafe)} code points, random texts")


if __name__ == "__main__":
    main()
