#!/usr/bin/env python3
"""gen_tokenizer_cases.py - golden tokenizer cases from Hugging Face `tokenizers`.

Writes tests/tokenizer_cases/cases.jsonl, one JSON object per line:

  {"tag": str, "special": bool,               # KIPP_TOK_SPECIAL on/off
   "text": str            | "bytes_b64": str, # input (bytes_b64 for invalid UTF-8)
   "gen": {...},                              # or: a seeded long line (see below)
   "ids": [int, ...]      | "n_ids", "ids_fnv64", "head_ids"   (long lines)
   "nfc": str}                                # NFC(input), the decode oracle

The oracle is the `tokenizers` library on data/qwen3/qwen3-tokenizer/tokenizer.json
with tokenizer_config.json's added_tokens_decoder merged over it (what
transformers does when it loads the checkpoint). Two reference tokenizers:

  special=True   the full tokenizer: all 26 added tokens matched in the raw text
                 (transformers with split_special_tokens=False, the Qwen default).
  special=False  the same tokenizer.json with "added_tokens" emptied: added-token
                 text is split by the pre-tokenizer and BPE like any other text.

Invalid UTF-8 (bytes_b64 cases) is given to the reference as
bytes.decode("utf-8", "replace"), the documented Kipp behaviour
(docs/TOKENIZER.md).

Long lines (>= 100 KB) are not committed: a "gen" object holds a seed, a target
byte count and a list of fragments; tests rebuild the text with the LCG below
(mirrored in tests/test_tokenizer.c) and compare the id count, an FNV-1a-64 hash
of the ids (each as 4 little-endian bytes) and the first ids.

Usage: .venv/bin/python tools/gen_tokenizer_cases.py [--data data/qwen3] [--out tests/tokenizer_cases]
Needs: pip install tokenizers (transformers optional: used as a cross-check).
"""
import argparse
import base64
import json
import os
import random
import sys
import unicodedata

from tokenizers import Tokenizer

ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
         "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
         "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
         "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
         "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
         "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
         "<think>", "</think>"]


def load_reference(data):
    """(full, plain) reference tokenizers, added_tokens_decoder merged in."""
    tdir = os.path.join(data, "qwen3-tokenizer")
    tj = json.load(open(os.path.join(tdir, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(tdir, "tokenizer_config.json"), encoding="utf-8"))
    by_id = {a["id"]: a for a in tj["added_tokens"]}
    for sid, a in cfg.get("added_tokens_decoder", {}).items():
        ent = dict(by_id.get(int(sid), {}))
        ent.update(a)
        ent["id"] = int(sid)
        by_id[int(sid)] = ent
    tj["added_tokens"] = [by_id[k] for k in sorted(by_id)]
    assert [a["content"] for a in tj["added_tokens"]] == ADDED, "unexpected added tokens"
    full = Tokenizer.from_str(json.dumps(tj))
    tj["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(tj))
    return full, plain


# ---- the deterministic long-line generator (mirrored in tests/test_tokenizer.c) ----
M64 = (1 << 64) - 1


def gen_text(seed, nbytes, frags):
    """Append fragments picked by a 64-bit LCG until the UTF-8 size >= nbytes."""
    x = seed & M64
    parts, size = [], 0
    fb = [f.encode("utf-8") for f in frags]
    while size < nbytes:
        x = (x * 6364136223846793005 + 1442695040888963407) & M64
        b = fb[(x >> 33) % len(fb)]
        parts.append(b)
        size += len(b)
    return b"".join(parts).decode("utf-8")


def fnv64(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for k in range(4):
            h ^= (i >> (8 * k)) & 0xFF
            h = (h * 0x100000001b3) & M64
    return "%016x" % h


# ---- case material ----
SCRIPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Größenwahn über Äpfel, Öl und Übermut; ß ẞ",
    "Ελληνικά: Καλημέρα κόσμε, ΑΒΓΔ αβγδ ς",
    "Русский текст: Съешь же ещё этих мягких французских булок.",
    "Українська: Ґанок, їжак, є. Беларуская: ў",
    "Հայերեն՝ Բարև աշխարհ", "ქართული ენა — გამარჯობა",
    "עברית: שלום עולם", "العربية: مرحبا بالعالم ١٢٣٤٥", "فارسی: سلام دنیا ۱۲۳",
    "हिन्दी: नमस्ते दुनिया, क्षत्रिय", "বাংলা: ওহে বিশ্ব", "தமிழ்: வணக்கம் உலகம்",
    "తెలుగు భాష", "ಕನ್ನಡ", "മലയാളം", "ગુજરાતી", "ਪੰਜਾਬੀ", "සිංහල",
    "ไทย: สวัสดีชาวโลก", "ລາວ", "ខ្មែរ: សួស្តីពិភពលោក", "မြန်မာ", "ᏣᎳᎩ Cherokee",
    "中文：你好，世界！这是一个测试。", "繁體中文：臺灣與香港", "日本語：こんにちは世界、カタカナ、ｶﾀｶﾅ",
    "한국어: 안녕하세요 세계", "Tiếng Việt: Cửa Việt, người", "Türkçe: İstanbul ıi",
    "Ænglisc þorn ð", "Polski: zażółć gęślą jaźń", "Čeština: příliš žluťoučký kůň",
    "Ge'ez: ሰላም ዓለም", "ᠮᠣᠩᠭᠣᠯ", "བོད་ཡིག", "ꦗꦮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝒜", "∀x∈ℝ: x²≥0, ∑ᵢ aᵢ ≈ π",
    "┌─┬─┐│ │└─┘ ░▒▓█", "Ⅻ ⅻ ½ ¾ ⅓ ① ⑳ ²³", "𓀀𓁐 hieroglyphs", "ancient 𐌰𐌱𐌲 gothic",
]
EMOJI = [
    "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "🇯🇵🇺🇸🇩🇪", "🇫🇷 flag", "👍🏻👍🏿", "1️⃣#️⃣*️⃣",
    "❤️ vs ❤", "🦙.cpp", "😶‍🌫️", "🧑‍🤝‍🧑", "🫠🫡🪿", "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland", "a😀b", "😀😀😀",
]
NFC_CASES = [
    "e\u0301", "cafe\u0301", "A\u030a", "\u212b", "\u2126", "o\u0308\u0304",
    "a\u0328\u0301", "a\u0301\u0328", "\u1100\u1161\u11a8", "\u1100\u1161", "\u0344",
    "\u0958", "\u2adc", "s\u0323\u0307", "\u1e9b\u0323", "q\u0307\u0323", "\u00c5\u0301",
    "n\u0303o", "Ä vs A\u0308", "\u0041\u030a\u0301\u0327", "\uFB01 ligature kept",
    "\u3099\u304b", "\u304b\u3099", "\u0915\u093c", "\U0001d15e", "\u0f73",
]
WS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n ",
      "\u00a0", "\u3000", "\u2003", "\u2028", "\u2029", "\u0085", "\u180e", "\u200b",
      "\ufeff", "\x0b", "\x0c", " \t \n", "\n \n", "    \n    "]
CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'Ve",
                "'m", "'M", "'ll", "'LL", "'Ll", "'lL", "'d", "'D", "’s", "''s", "'st",
                "' s", "'", "''", "'sS"]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; ++i) a[i] += b[i] * 0.5f;",
    '{"key": [1, 2.5e-3, true, null], "nested": {"a": "b"}}',
    "<div class=\"x\"><a href='#'>link</a></div>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "$ ls -la /usr/bin | grep -E '^-rwx' > out.txt 2>&1",
    "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@\\w+\\.com$",
    "fn main() { let v: Vec<u8> = vec![0; 16]; println!(\"{:?}\", v); }",
    "    if x:\n        pass\n\n\n    else:\n\t\tpass",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=6;c>>=7;d&&=e||f",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
]
URLS = ["https://example.com/path?q=1&r=two#frag", "http://192.168.0.1:8080/",
        "ftp://files.example.org/pub/file-1.2.3.tar.gz", "mailto:someone@example.com",
        "user.name+tag@sub.domain.co.uk", "/usr/local/lib/libkipp.so.1",
        "C:\\Users\\Name\\Documents\\file.txt", "https://huggingface.co/Qwen/Qwen3-0.6B"]
NUMS = ["0", "7", "42", "1234567890", "3.14159", "-273.15", "1e-10", "1,000,000",
        "٠١٢٣٤٥٦٧٨٩", "０１２３", "123abc456", "v1.2.3", "2024-01-01T12:00:00Z", "0x1F",
        "9" * 40, "12 34  56   78"]
NEAR = ["<|im_start", "<|im_start|", "im_start|>", "<|IM_START|>", "< |im_start|>",
        "<|im_start |>", "<think >", "<<think>>", "<|endoftext|>>", "<</think>", "<think",
        "think>", "</think", "<tool_call", "<|im_end||>", "<|im_end|><", "<||>", "<|>",
        "<|endoftext", "<|fim_prefix", "<tool_response", "</ tool_response>"]


def base_texts():
    t = [("empty", "")]
    t += [("script", s) for s in SCRIPTS]
    t += [("emoji", s) for s in EMOJI]
    t += [("nfc", s) for s in NFC_CASES]
    t += [("nfc", "x " + s + " y") for s in NFC_CASES]
    t += [("ws", w) for w in WS]
    t += [("ws", "a" + w + "b") for w in WS]
    t += [("ws", "word" + w) for w in WS]
    t += [("ws", w + "word") for w in WS]
    t += [("ws", "x" + w + "\n" + w + "y") for w in WS]
    t += [("contraction", "it" + c + " here") for c in CONTRACTIONS]
    t += [("contraction", "IT" + c.upper() + " HERE") for c in CONTRACTIONS]
    t += [("contraction", c) for c in CONTRACTIONS]
    t += [("contraction", "x " + c + "x") for c in CONTRACTIONS]
    t += [("code", c) for c in CODE]
    t += [("url", u) for u in URLS]
    t += [("url", "see " + u + ", ok") for u in URLS]
    t += [("digits", n) for n in NUMS]
    t += [("digits", "abc" + n + "def") for n in NUMS]
    t += [("near_miss", n) for n in NEAR]
    t += [("near_miss", "pre" + n + "post") for n in NEAR]
    t += [("nul", "a\x00b"), ("nul", "\x00"), ("nul", "\x00\x00 \x00x"), ("nul", "<think>\x00</think>")]
    t += [("control", "".join(chr(c) for c in range(1, 32))), ("control", "\x7f\x80\x9f")]
    return t


def special_texts():
    t = [("special", a) for a in ADDED]
    t += [("special", "x" + a + "y") for a in ADDED]
    t += [("special", " " + a + " ") for a in ADDED]
    t += [("special", "\n" + a + "\n") for a in ADDED]
    t += [("special", "".join(ADDED))]
    t += [("special", "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello.<|im_end|>")]
    t += [("special", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>")]
    t += [("special", "<<|im_start|>>"), ("special", "<|im_start|><|im_start|>"),
          ("special", "<think></think>"), ("special", "e\u0301<think>e\u0301")]
    return t


def random_texts(rng, n):
    """Random mixes of the material above and of single code points."""
    pool = SCRIPTS + EMOJI + NFC_CASES + WS + CONTRACTIONS + CODE + URLS + NUMS + NEAR + ADDED
    cps = list(range(0x20, 0x7f)) + [0xe9, 0x301, 0x308, 0x3b1, 0x436, 0x4e2d, 0x6587, 0xac00,
                                      0x1100, 0x1161, 0x3042, 0x1f600, 0x200d, 0xfe0f, 0x1f1ef,
                                      0x0a, 0x0d, 0x09, 0x3000, 0xa0, 0x85, 0x2028, 0x5d0, 0x627,
                                      0x660, 0xff10, 0x1d400, 0xe000, 0x10ffff, 0xfffd, 0x0]
    out = []
    for i in range(n):
        k = rng.randint(1, 8)
        parts = []
        for _ in range(k):
            if rng.random() < 0.6:
                s = rng.choice(pool)
                if len(s) > 12 and rng.random() < 0.5:
                    a = rng.randrange(len(s))
                    s = s[a:a + rng.randint(1, 12)]
                parts.append(s)
            else:
                parts.append("".join(chr(rng.choice(cps)) for _ in range(rng.randint(1, 6))))
        out.append(("random", "".join(parts)))
    return out


INVALID = [
    b"\x80", b"abc\x80def", b"\xbf\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf",
    b"\xf0\x80\x80\xaf", b"\xc3", b"abc\xc3", b"\xe2\x82", b"x\xe2\x82y", b"\xf0\x9f\x98",
    b"\xf0\x9f\x98 ok", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\x80\xed\xb0\x80",
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe\xff",
    b"\xff", b"caf\xe9", b"\xe9t\xe9", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1",
    b"\xe2\x82\x28", b"\xf0\x28\x8c\xbc", b"\xf0\x90\x28\xbc", b"\xf0\x28\x8c\x28",
    b"<think>\xff</think>", b"\xef\xbb\xbfBOM", b"\xed\x9f\xbf", b"\xee\x80\x80",
    b"hello \xf0\x9f\x98\x80\xf0\x9f world", b"\x00\xff\x00", b"\xc2\x85", b"\xe0\xa0\x80",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(here, "..", "data", "qwen3"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "tokenizer_cases"))
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    full, plain = load_reference(args.data)
    rng = random.Random(args.seed)
    cases = []

    def add(tag, text, special, raw=None):
        ref = full if special else plain
        c = {"tag": tag, "special": special}
        if raw is not None:
            c["bytes_b64"] = base64.b64encode(raw).decode()
        else:
            c["text"] = text
        c["ids"] = ref.encode(text, add_special_tokens=False).ids
        c["nfc"] = unicodedata.normalize("NFC", text)
        cases.append(c)

    for tag, s in base_texts() + random_texts(rng, 560):
        add(tag, s, True)
    for tag, s in special_texts() + random_texts(rng, 60):
        add(tag, s, True)
        add(tag, s, False)
    for tag, s in base_texts()[::7]:
        add(tag, s, False)
    for raw in INVALID:
        add("invalid_utf8", raw.decode("utf-8", "replace"), True, raw)
        add("invalid_utf8", raw.decode("utf-8", "replace"), False, raw)

    long_frags = [
        (["Hello world. ", "The cat sat on the mat.\n", "数字 12345 ", "naïve café ", "\t", "   "]),
        (["a", "b", "c", "ab", "abc", "xyz"]),  # one pre-token of 100+ KB: heap BPE
        ([" ", "  ", "\n", "\t", "\r\n"]),       # whitespace run: regex backtracking
        (["😀", "👨‍👩‍👧", "🇯🇵", "中文", "日本", "ß", "e\u0301"]),
        (["!", "?", "...", "---", "==>", "{}", "[]"]),
        (["<|im_start|>", "<think>", "text ", "<|im_end|>", "<|im_sta", "\n"]),
    ]
    for i, frags in enumerate(long_frags):
        for special in (True, False) if i == 5 else (True,):
            seed, nbytes = 1000 + i, 100_000 + 20_000 * i
            text = gen_text(seed, nbytes, frags)
            ids = (full if special else plain).encode(text, add_special_tokens=False).ids
            cases.append({"tag": "long_line", "special": special,
                          "gen": {"seed": seed, "bytes": nbytes, "frags": frags},
                          "n_ids": len(ids), "ids_fnv64": fnv64(ids), "head_ids": ids[:64],
                          "nfc_len": len(unicodedata.normalize("NFC", text).encode())})

    try:  # cross-check the reference against transformers when it is installed
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(os.path.join(args.data, "qwen3-tokenizer"))
        bad = [c["tag"] for c in cases if c["special"] and "text" in c
               and at.encode(c["text"], add_special_tokens=False) != c["ids"]]
        print(f"transformers cross-check: {len(bad)} disagreements", file=sys.stderr)
        if bad:
            sys.exit("tokenizers and transformers disagree; not writing cases")
    except ImportError:
        print("transformers not installed: cross-check skipped", file=sys.stderr)

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
