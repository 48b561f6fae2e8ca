"""Open a log however it arrives (path, stdin, gzip/bz2/xz, UTF-8/UTF-16/legacy bytes) and
hand it on as line-aligned UTF-8 byte blocks, so memory stays flat however large the log is."""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import os
import stat
import sys
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from ..errors import InputError

BLOCK_SIZE = 4 << 20  # bytes read at a time; a block always ends at a line boundary
SNIFF_SIZE = 64 << 10

_COMPRESSED = (
    (b"\x1f\x8b", gzip.open, "gzip"),
    (b"BZh", bz2.open, "bzip2"),
    (b"\xfd7zXZ\x00", lzma.open, "xz"),
)


@dataclass
class LogSource:
    """One opened log: its display name and a binary stream of its (decompressed) bytes."""

    name: str
    stream: BinaryIO
    encoding: str  # 'utf-8' (also for ASCII and unknown 8-bit encodings) or 'utf-16-le'/'utf-16-be'

    def close(self) -> None:
        if self.stream is not sys.stdin.buffer:
            self.stream.close()


def open_log(path: str) -> LogSource:
    """Open PATH ('-' for stdin) for reading, or raise InputError with one clear line."""
    if path == "-":
        raw: BinaryIO = sys.stdin.buffer
        name = "<stdin>"
        raw = io.BufferedReader(raw) if not hasattr(raw, "peek") else raw
    else:
        name = path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise InputError(f"{path}: no such file")
        except PermissionError:
            raise InputError(f"{path}: permission denied")
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})")
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: is a directory, not a log file")
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed by LogSource.close
        except PermissionError:
            raise InputError(f"{path}: permission denied")
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})")
    head = raw.peek(8)[:8]
    for magic, opener, label in _COMPRESSED:
        if head.startswith(magic):
            raw = opener(raw if path == "-" else path, "rb")
            name = f"{name} ({label})"
            try:
                head = raw.peek(8)[:8]
            except (OSError, EOFError, lzma.LZMAError) as exc:
                raise InputError(f"{path}: damaged {label} data ({exc})")
            break
    try:
        sample = raw.peek(SNIFF_SIZE)[:SNIFF_SIZE]
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise InputError(f"{path}: cannot read ({exc})")
    encoding = _sniff_encoding(sample)
    if encoding is None:
        raise InputError(f"{path}: looks like binary data, not a text log")
    return LogSource(name=name, stream=raw, encoding=encoding)


def _sniff_encoding(sample: bytes) -> str | None:
    """'utf-8' for anything byte-oriented, 'utf-16-*' by BOM or NUL layout, None for binary."""
    if sample.startswith(codecs.BOM_UTF16_LE):
        return "utf-16-le"
    if sample.startswith(codecs.BOM_UTF16_BE):
        return "utf-16-be"
    if not sample:
        return "utf-8"
    even_nul = sample[0::2].count(0)
    odd_nul = sample[1::2].count(0)
    half = max(1, len(sample) // 2)
    if odd_nul > 0.4 * half and even_nul < 0.05 * half:
        return "utf-16-le"
    if even_nul > 0.4 * half and odd_nul < 0.05 * half:
        return "utf-16-be"
    nul = sample.count(0)
    controls = sum(sample.count(c) for c in (1, 2, 3, 4, 5, 6, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31))
    if nul > len(sample) * 0.001 or nul + controls > len(sample) * 0.05:
        return None
    return "utf-8"


def _hard_cut(data: bytes) -> int:
    """Where to end a block inside a line longer than a block: before its last '[' (a rank
    prefix then starts the next block, and the line's prefixes still read as prefixes) or after
    its last space, whichever is later, if that is in the block's second half; else at the end."""
    half = len(data) // 2
    cut = max(data.rfind(b"[", half) - 1, data.rfind(b" ", half))
    return cut if cut >= half else len(data) - 1


def iter_blocks(source: LogSource, block_size: int = BLOCK_SIZE) -> Iterator[bytes]:
    """Yield UTF-8 byte blocks that end at a line boundary ('\\n', else '\\r', else a hard cut)."""
    decoder = None
    if source.encoding.startswith("utf-16"):
        decoder = codecs.getincrementaldecoder(source.encoding)(errors="replace")
    carry = b""
    while True:
        try:
            chunk = source.stream.read(block_size)
        except (OSError, EOFError, lzma.LZMAError) as exc:
            raise InputError(f"{source.name}: read failed part-way ({exc})")
        if decoder is not None:
            text = decoder.decode(chunk, final=not chunk)
            chunk = text.lstrip("\ufeff").encode("utf-8", "replace") if text else b""
        if not chunk:
            if carry:
                yield carry
            return
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            cut = data.rfind(b"\r")
        if cut < 0:
            if len(data) < block_size:
                carry = data
                continue
            cut = _hard_cut(data)  # one endless line: a cut keeps memory bounded
        carry = data[cut + 1 :]
        yield data[: cut + 1]
