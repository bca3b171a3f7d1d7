"""safe_io.py - output files and name lists for the Python tools.

The Python side of base/safe_io.h: no tool writes over one of its own inputs
(compared by (st_dev, st_ino), so another spelling, a hard link or a symlink of
the input is caught), and every output is written to a temporary file in the
destination's directory and renamed into place, so an interrupted run leaves no
half-written file there. List-valued options match exact names and name the
known ones when they reject one.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional, Sequence


class SameFileError(ValueError):
    """An output path that names one of the command's inputs."""


def _identity(p: os.PathLike | str) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def refuse_same_file(out: os.PathLike | str, inputs: Iterable[os.PathLike | str], what: str = "--out") -> None:
    """Raise SameFileError when out exists and is the same file as any of inputs."""
    o = _identity(out)
    if o is None:
        return
    for i in inputs:
        if _identity(i) == o:
            raise SameFileError(f"{what} {out} is the same file as the input {i}; expected a different output "
                                "path (refusing to overwrite an input)")


@contextlib.contextmanager
def atomic_output(out: os.PathLike | str, inputs: Iterable[os.PathLike | str] = (),
                  what: str = "--out") -> Iterator[BinaryIO]:
    """Open a temporary file next to out for binary writing; on normal exit it is
    flushed, fsynced and renamed onto out, on an exception (or KeyboardInterrupt)
    it is deleted and out is left as it was. Refuses out == an input first."""
    out = Path(out)
    refuse_same_file(out, inputs, what)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes(out: os.PathLike | str, data: bytes, inputs: Iterable[os.PathLike | str] = ()) -> None:
    """Write data to out through atomic_output."""
    with atomic_output(out, inputs) as f:
        f.write(data)


def write_text(out: os.PathLike | str, text: str, inputs: Iterable[os.PathLike | str] = ()) -> None:
    """Write UTF-8 text to out through atomic_output."""
    write_bytes(out, text.encode("utf-8"), inputs)


def copy_file(src: os.PathLike | str, dst: os.PathLike | str) -> None:
    """Copy src to dst through atomic_output (refused when they are the same file)."""
    with atomic_output(dst, [src], what="destination") as f, open(src, "rb") as s:
        while True:
            block = s.read(1 << 20)
            if not block:
                break
            f.write(block)


def parse_names(text: str, known: Sequence[str], flag: str, what: str = "name") -> list[str]:
    """Split a comma-separated option value into names, each exactly one of known;
    raise ValueError naming the unknown one (as `what`) and the known ones."""
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if n not in known:
            raise ValueError(f"{flag} '{text}': unknown {what} '{n}'; expected a comma-separated list of "
                             + ", ".join(known))
    return names


def term_escape(text: str) -> str:
    """text with control characters (C0, DEL, C1) and lone surrogates from undecodable
    bytes written as \\xNN / \\uNNNN (and \\n \\r \\t as such), so file-derived text
    printed in a message cannot drive the terminal (base/safe_io.h does the same)."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif o < 0x20 or o == 0x7F or 0x80 <= o <= 0x9F:
            out.append(f"\\x{o:02x}")
        elif 0xD800 <= o <= 0xDFFF:  # surrogateescape'd byte of invalid UTF-8
            out.append(f"\\x{o - 0xDC00:02x}" if o >= 0xDC80 else f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)
