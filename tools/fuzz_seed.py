#!/usr/bin/env python3
"""fuzz_seed.py - write a small seed corpus for tests/fuzz_gguf.c.

    .venv/bin/python tools/fuzz_seed.py --out DIR FILES.gguf...

For each converted Kipp GGUF (bf16 and quantized schemes) it writes:
  * <name>-prefix.gguf: the first 64 KiB of the file, i.e. the real header and
    the start of the tokenizer arrays (libFuzzer runs with -max_len=65536);
  * <name>-small.gguf: the same file re-serialised with the tokenizer arrays cut
    to a few entries and the data cut off - small enough for fast mutation,
    still carrying every Kipp key and tensor name;
  * for a quantized file (Q8_0 = 8 or Q4_1 = 3 projections), <name>-qnorm.gguf:
    the small seed with the first norm given the quantized type too (the
    loader's scheme/type refusal path);
and, independently of the inputs, a few hand-made minimal GGUFs (empty file
with no keys, every scalar type, arrays, one tensor with data, default and
explicit alignment). Seeds are deterministic; the corpus directory is shared
with libFuzzer, which adds its own findings next to them.

The GGUF reader here is a small independent implementation of the container
(header, typed key/values, tensor directory) used only to cut seeds.
"""
import argparse
import os
import struct
import sys

MAGIC = b"GGUF"
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
          10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
BF16, F32 = 30, 0
Q4_1, Q8_0 = 3, 8


class Reader:
    """Sequential little-endian reader over bytes."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.buf[self.pos:self.pos + n]
        if len(s) != n:
            raise ValueError("truncated string")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            return (etype, [self.value(etype) for _ in range(n)])
        return self.take(SCALAR[vtype])


def read_gguf(buf):
    """Parse header, metadata and directory -> (kvs, tensors, dir_end).

    kvs: list of (key bytes, type, value); tensors: list of
    (name bytes, dims tuple (GGUF order), type, offset); dir_end: byte after the directory.
    """
    r = Reader(buf)
    if buf[:4] != MAGIC:
        raise ValueError("not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        raise ValueError(f"GGUF version {version}, expected 3")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("<I")
        kvs.append((key, vtype, r.value(vtype)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        dims = tuple(r.take("<Q") for _ in range(nd))
        ttype, off = r.take("<I"), r.take("<Q")
        tensors.append((name, dims, ttype, off))
    return kvs, tensors, r.pos


def enc_value(vtype, v):
    if vtype == STRING:
        return struct.pack("<Q", len(v)) + v
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(enc_value(etype, x) for x in items)
    return struct.pack(SCALAR[vtype], v)


def write_gguf(kvs, tensors, data=b"", alignment=32):
    """Serialise a GGUF v3 image: header, kvs, directory, padding to alignment, data."""
    out = [MAGIC, struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    for key, vtype, v in kvs:
        out += [struct.pack("<Q", len(key)) + key, struct.pack("<I", vtype), enc_value(vtype, v)]
    for name, dims, ttype, off in tensors:
        out.append(struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)))
        out.append(b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, off))
    img = b"".join(out)
    img += b"\0" * ((-len(img)) % alignment)
    return img + data


def shrink_arrays(kvs, keep=8):
    """Cut every array to `keep` elements (the tokenizer arrays are ~4 MB)."""
    res = []
    for key, vtype, v in kvs:
        if vtype == ARRAY and len(v[1]) > keep:
            v = (v[0], v[1][:keep])
        res.append((key, vtype, v))
    return res


def seeds_from_file(path):
    """Two seeds per converted file: its first 64 KiB, and a shrunk re-serialisation."""
    with open(path, "rb") as f:
        head = f.read(64 << 20)
    kvs, tensors, _ = read_gguf(head)
    base = os.path.splitext(os.path.basename(path))[0]
    yield f"{base}-prefix.gguf", head[:65536]
    small = write_gguf(shrink_arrays(kvs), tensors, alignment=64)
    yield f"{base}-small.gguf", small + bytes(256)
    qtypes = {t[2] for t in tensors} & {Q4_1, Q8_0}
    if qtypes:
        qt = min(qtypes)
        norm = next(i for i, t in enumerate(tensors) if t[0].endswith(b"norm.weight"))
        bad = list(tensors)
        bad[norm] = (bad[norm][0], bad[norm][1], qt, bad[norm][3])
        yield f"{base}-qnorm.gguf", write_gguf(shrink_arrays(kvs), bad, alignment=64) + bytes(256)


def handmade_seeds():
    """Minimal GGUFs that reach every value type and the tensor placement logic."""
    yield "empty.gguf", write_gguf([], [])
    scalars = [(f"t{t}".encode(), t, v) for t, v in
               [(0, 1), (1, -1), (2, 2), (3, -2), (4, 4), (5, -4), (6, 1.5), (7, 1),
                (10, 8), (11, -8), (12, 2.5)]]
    yield "scalars.gguf", write_gguf(scalars + [(b"s", STRING, b"hello")], [])
    arrays = [(b"a.u32", ARRAY, (4, [1, 2, 3])), (b"a.str", ARRAY, (STRING, [b"x", b"yz", b""])),
              (b"a.bool", ARRAY, (7, [0, 1])), (b"a.f64", ARRAY, (12, [0.5])),
              (b"a.empty", ARRAY, (4, []))]
    yield "arrays.gguf", write_gguf(arrays, [])
    t = [(b"w", (4, 2), F32, 0), (b"v", (8,), BF16, 64)]
    kv64 = [(b"general.alignment", 4, 64)]
    yield "tensors64.gguf", write_gguf(kv64, t, bytes(80), alignment=64)
    yield "tensors32.gguf", write_gguf([], [(b"w", (4, 2), F32, 0)], bytes(32))
    yield "q8.gguf", write_gguf([], [(b"q", (32, 2), Q8_0, 0)], bytes(68))
    yield "q4_1.gguf", write_gguf([], [(b"q", (32, 2), Q4_1, 0)], bytes(40))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="corpus directory (created)")
    ap.add_argument("files", nargs="*", help="converted Kipp GGUF files")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    n = 0
    for path in args.files:
        try:
            for name, img in seeds_from_file(path):
                with open(os.path.join(args.out, name), "wb") as f:
                    f.write(img)
                n += 1
        except (OSError, ValueError, struct.error) as e:
            print(f"fuzz_seed: {path}: {e}", file=sys.stderr)
            return 1
    for name, img in handmade_seeds():
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(img)
        n += 1
    print(f"fuzz_seed: wrote {n} seeds to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
