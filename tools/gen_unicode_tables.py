#!/usr/bin/env python3
"""Generate engine/tokenizer_unicode.h: the character classes of the Qwen2
pre-tokenizer pattern (\\p{L}, \\p{N}, \\s) as Hugging Face tokenizers'
Oniguruma sees them, from the Unicode Character Database.

Source: the `unicodedata2` package at exactly UNICODE_VERSION (it ships that
UCD's UnicodeData.txt compiled in). Classes:
  L = General_Category Lu|Ll|Lt|Lm|Lo
  N = General_Category Nd|Nl|No
  S = White_Space, which since Unicode 6.3 is exactly Zs|Zl|Zp plus
      U+0009..U+000D and U+0085 (PropList.txt); U+180E is not in it.
  P = everything else, unassigned code points included.
A second bit per code point, NFC-safe, lets encode skip the NFC pass over a
segment: it is set when the code point is a starter (Canonical_Combining_Class
0), is its own NFC, and is not the second element of any primary composition
(Hangul V and T jamo included), i.e. NFC_Quick_Check = Yes and ccc = 0. A text
made only of such code points is already NFC. Unicode's stability policy makes
the 16.0 set a subset of the safe set of every later version, and of
utf8proc's (Unicode 15.0) for the code points it knows; with --verify-utf8proc
the generator checks that utf8proc leaves each safe code point alone and gives
it class 0.

Usage:
  pip install --target /tmp/ud2 unicodedata2==16.0.0
  .venv/bin/python tools/gen_unicode_tables.py --ucd /tmp/ud2 \\
      --tokenizer data/qwen3/qwen3-tokenizer/tokenizer.json [--verify-utf8proc] [--verify-hf]

A third bit marks the code points where HF's NFC differs from utf8proc's
(hf_nfc_boundaries below); it is found by probing HF, as no UCD of the old
version HF's normaliser uses is at hand.

--verify-hf probes HF's pre-tokenizer on every code point (U+0000..U+10FFFF,
surrogates excluded) and fails unless its classes equal the table's. The
probes are: "中X" is one pre-token iff X is L; "!X" iff L or P; " X" iff L, P
or S. Code points that NFC changes never reach the pre-tokenizer and are
skipped.
"""
import argparse, os, sys

UNICODE_VERSION = "16.0.0"
CLASS = {"P": 0, "L": 1, "N": 2, "S": 3}
WS_CC = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85}


def classify(ud, cp):
    g = ud.category(chr(cp))
    if g[0] == "L":
        return "L"
    if g[0] == "N":
        return "N"
    if g in ("Zs", "Zl", "Zp") or cp in WS_CC:
        return "S"
    return "P"


def nfc_safe_set(ud):
    """Code points with ccc 0, NFC(cp) == cp, and not a composition's second element."""
    second = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V, T
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        d = ud.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        if len(parts) == 2 and ud.normalize("NFC", chr(parts[0]) + chr(parts[1])) == chr(cp):
            second.add(parts[1])
    safe = set()
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        if ud.combining(c) == 0 and ud.normalize("NFC", c) == c and cp not in second:
            safe.add(cp)
    return safe


def verify_utf8proc(safe):
    import ctypes
    lib = ctypes.CDLL("libutf8proc.so")
    lib.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16 * 2)  # category, combining_class
    lib.utf8proc_NFC.restype = ctypes.c_void_p
    lib.utf8proc_NFC.argtypes = [ctypes.c_char_p]
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    bad = 0
    for cp in sorted(safe):
        if cp == 0:
            continue
        b = chr(cp).encode()
        p = lib.utf8proc_NFC(b)
        same = ctypes.string_at(p) == b
        libc.free(p)
        if not same or lib.utf8proc_get_property(cp).contents[1] != 0:
            if bad < 20:
                print(f"U+{cp:04X}: utf8proc changes it or gives it a nonzero combining class", file=sys.stderr)
            bad += 1
    return bad


def utf8proc_nfc():
    import ctypes
    lib = ctypes.CDLL("libutf8proc.so")
    lib.utf8proc_NFC.restype = ctypes.c_void_p
    lib.utf8proc_NFC.argtypes = [ctypes.c_char_p]
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]

    def nfc(s):
        if not s:
            return s
        p = lib.utf8proc_NFC(s.encode())
        r = ctypes.string_at(p).decode()
        libc.free(p)
        return r
    return nfc


def composition_firsts(ud):
    """second element -> first elements of the primary compositions it ends."""
    firsts = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        d = ud.decomposition(chr(cp))
        if d and not d.startswith("<"):
            p = [int(x, 16) for x in d.split()]
            if len(p) == 2 and ud.normalize("NFC", chr(p[0]) + chr(p[1])) == chr(cp):
                firsts.setdefault(p[1], []).append(p[0])
    return firsts


def nfc_probes(x, firsts):
    """Texts that show how a normaliser treats code point x: reordering against
    marks of class 1, 10, 230 and 240, blocking a composition, composing."""
    c = chr(x)
    ps = ["q\u0301" + c, "q" + c + "\u0334", "a" + c + "\u0301", "a\u0301" + c, c + "\u0301", "a" + c,
          "q\u0334" + c + "\u0301", "\u05b0" + c, c + "\u05b0", "a" + c + "\u0345", "a\u0345" + c]
    for f in firsts.get(x, [])[:1]:
        ps += [chr(f) + c, chr(f) + "\u0334" + c]
    return ps


def model_nfc(s, safe, bound, nfc):
    """Kipp's NFC (engine/tokenizer_encode.c, nfc_segment) in Python."""
    out, done, last_safe, i, n = [], 0, 0, 0, len(s)
    while i < n:
        cp = ord(s[i])
        if cp in safe:
            last_safe = i
            i += 1
            continue
        if cp in bound:
            out += [s[done:i], s[i]]
            i += 1
            done = last_safe = i
            continue
        start, q = max(last_safe, done), i + 1
        while q < n and ord(s[q]) not in safe and ord(s[q]) not in bound:
            q += 1
        out += [s[done:start], nfc(s[start:q])]
        done = last_safe = i = q
    out.append(s[done:])
    return "".join(out)


def hf_nfc_boundaries(path, ud, safe):
    """Code points that HF's NFC (the unicode-normalization-alignments crate,
    whose tables predate Unicode 10.0) treats as plain starters while utf8proc
    does not: marks given a combining class in Unicode 10.0..15.0, and U+11930,
    whose composition with U+11935 (13.0) HF lacks. Found by probing HF on every
    code point that is not NFC-safe, then checked: utf8proc split at these
    code points must equal HF on every probe and on 100,000 random texts."""
    import random
    from tokenizers import Tokenizer
    nz = Tokenizer.from_file(path).normalizer
    nfc = utf8proc_nfc()
    firsts = composition_firsts(ud)
    unsafe = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and cp not in safe]
    bound = {x for x in unsafe if any(nz.normalize_str(p) != nfc(p) for p in nfc_probes(x, firsts))}
    bad = [(x, p) for x in unsafe for p in nfc_probes(x, firsts) if nz.normalize_str(p) != model_nfc(p, safe, bound, nfc)]
    rng = random.Random(13)
    pool = unsafe + [ord(c) for c in "aeqAE1 \n中かウ"] * 50
    for _ in range(100000):
        t = "".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 8)))
        if nz.normalize_str(t) != model_nfc(t, safe, bound, nfc):
            bad.append((None, t))
    for x, p in bad[:20]:
        print(f"NFC differs from HF on {p.encode('unicode_escape')}", file=sys.stderr)
    return bound, len(bad)


def verify_hf(path, cls):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(path)
    pt, nz = t.pre_tokenizer, t.normalizer
    bad = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        x = chr(cp)
        if nz.normalize_str(x) != x:
            continue
        if x in "\r\n":  # "!\n" and " \n" are single matches of [\r\n]* and \s*[\r\n]+
            h = "S"
        elif len(pt.pre_tokenize_str("中" + x)) == 1:
            h = "L"
        elif len(pt.pre_tokenize_str("!" + x)) == 1:
            h = "P"
        elif len(pt.pre_tokenize_str(" " + x)) == 1:
            h = "S"
        else:
            h = "N"
        if h != cls[cp]:
            bad.append((cp, h, cls[cp]))
    for cp, h, k in bad[:20]:
        print(f"U+{cp:04X}: HF sees {h}, the table says {k}", file=sys.stderr)
    return len(bad)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ucd", help="directory holding unicodedata2 (pip --target)")
    ap.add_argument("--out", default="engine/tokenizer_unicode.h")
    ap.add_argument("--tokenizer", metavar="TOKENIZER_JSON", required=True,
                    help="HF tokenizer.json: its normaliser is probed for the NFC boundary bit")
    ap.add_argument("--verify-hf", action="store_true", help="check the classes against HF on every code point")
    ap.add_argument("--verify-utf8proc", action="store_true", help="check the NFC-safe set against libutf8proc")
    a = ap.parse_args()
    if a.ucd:
        sys.path.insert(0, a.ucd)
    import unicodedata2 as ud
    if ud.unidata_version != UNICODE_VERSION:
        sys.exit(f"unicodedata2 has Unicode {ud.unidata_version}; expected {UNICODE_VERSION} "
                 f"(pip install unicodedata2=={UNICODE_VERSION})")
    cls = ["P"] * 0x110000
    for cp in range(0x110000):
        if not 0xD800 <= cp < 0xE000:
            cls[cp] = classify(ud, cp)
    safe = nfc_safe_set(ud)
    if a.verify_utf8proc:
        n = verify_utf8proc(safe)
        if n:
            sys.exit(f"{n} NFC-safe code points are not safe for utf8proc; the table was not written")
        print(f"verified against utf8proc: {len(safe)} NFC-safe code points", file=sys.stderr)
    bound, n = hf_nfc_boundaries(a.tokenizer, ud, safe)
    if n:
        sys.exit(f"{n} NFC probes differ from HF; the table was not written")
    print(f"HF NFC boundaries: {len(bound)} code points; NFC probes and random texts agree with HF", file=sys.stderr)
    if a.verify_hf:
        n = verify_hf(a.tokenizer, cls)
        if n:
            sys.exit(f"{n} code points differ from HF; the table was not written")
        print("verified against HF tokenizers: 0 code points differ", file=sys.stderr)
    # Two-stage table: stage 1 maps cp >> 8 to a unique 256-entry block of
    # 4-bit entries (class in bits 0-1, NFC-safe in bit 2, HF NFC boundary in
    # bit 3) packed 2 to a byte
    # (128 bytes a block).
    blocks, index, stage1 = [], {}, []
    for hi in range(0x1100):
        b = bytearray(128)
        for lo in range(256):
            cp = hi << 8 | lo
            v = CLASS[cls[cp]] | (4 if cp in safe else 0) | (8 if cp in bound else 0)
            b[lo >> 1] |= v << ((lo & 1) * 4)
        b = bytes(b)
        if b not in index:
            index[b] = len(blocks)
            blocks.append(b)
        stage1.append(index[b])
    assert len(blocks) < 65536
    counts = {k: cls.count(k) for k in "LNS"}
    o = []
    o.append("/* Generated by tools/gen_unicode_tables.py from the Unicode Character Database\n"
             f" * {UNICODE_VERSION} (unicodedata2=={UNICODE_VERSION}). Do not edit; regenerate.\n"
             " *\n"
             " * Classes of the Qwen2 pre-tokenizer pattern as HF tokenizers (Oniguruma) sees\n"
             " * them: 1 = \\p{L}, 2 = \\p{N}, 3 = \\s (White_Space), 0 = anything else.\n"
             " * NFC-safe (NFC_Quick_Check Yes and ccc 0): a text of only these is NFC.\n"
             " * HF NFC boundary: HF's normaliser treats it as a plain starter, utf8proc not.\n"
             f" * {counts['L']} L, {counts['N']} N, {counts['S']} S, {len(safe)} NFC-safe, {len(bound)} HF NFC boundary\n"
             " * code points;\n"
             f" * {len(blocks)} unique blocks.\n"
             " */\n#ifndef KIPP_TOKENIZER_UNICODE_H\n#define KIPP_TOKENIZER_UNICODE_H\n\n#include <stdint.h>\n\n"
             f'#define KIPP_UNICODE_VERSION "{UNICODE_VERSION}"\n'
             "#define KIPP_UC_OTHER 0u\n#define KIPP_UC_L 1u\n#define KIPP_UC_N 2u\n#define KIPP_UC_S 3u\n"
             "#define KIPP_UC_NFC_SAFE 4u\n#define KIPP_UC_HF_NFC_BOUNDARY 8u\n\n")
    o.append(f"static const uint16_t kipp_uc_stage1[{len(stage1)}] = {{\n")
    for i in range(0, len(stage1), 16):
        o.append("    " + ", ".join(str(v) for v in stage1[i:i + 16]) + ",\n")
    o.append("};\n\n")
    o.append(f"static const uint8_t kipp_uc_blocks[{len(blocks)}][128] = {{\n")
    for b in blocks:
        o.append("    {" + ",".join(f"0x{v:02x}" for v in b) + "},\n")
    o.append("};\n\n")
    o.append("/** Table entry of code point cp (< 0x110000): class in bits 0-1, KIPP_UC_NFC_SAFE,\n"
             " *  KIPP_UC_HF_NFC_BOUNDARY. */\n"
             "static inline unsigned kipp_uc_entry(uint32_t cp)\n{\n"
             "    return (kipp_uc_blocks[kipp_uc_stage1[cp >> 8]][(cp & 255) >> 1] >> ((cp & 1) * 4)) & 15u;\n"
             "}\n\n"
             "/** Class of code point cp (< 0x110000): KIPP_UC_*. */\n"
             "static inline unsigned kipp_uc_class(uint32_t cp) { return kipp_uc_entry(cp) & 3u; }\n\n#endif\n")
    with open(a.out, "w") as f:
        f.write("".join(o))
    print(f"wrote {a.out}: Unicode {UNICODE_VERSION}, {len(blocks)} blocks", file=sys.stderr)


if __name__ == "__main__":
    main()
