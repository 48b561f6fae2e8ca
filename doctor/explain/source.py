"""Open a log however it arrives (path, stdin, a FIFO, gzip/bz2/xz, UTF-8/UTF-16/UTF-32/legacy
bytes) and hand it on as line-aligned UTF-8 byte blocks, so memory stays flat however large the
log is.

Every way in ends in a log or in one InputError line (exit 2): a damaged compressed stream is
named as such, a device or socket is refused, a FIFO that no writer opens is given up after
FIFO_WAIT_S, and an encoding is read only when it can be told for sure (a BOM, the NUL layout of
UTF-16/UTF-32, valid UTF-8, or mostly ASCII text); anything else is refused, not misread."""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import os
import select
import stat
import sys
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from ..errors import InputError

BLOCK_SIZE = 4 << 20  # bytes read at a time; a block always ends at a line boundary
SNIFF_SIZE = 64 << 10
FIFO_WAIT_S = 10.0  # how long a FIFO may stay without a writer before explain gives up
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)  # what a damaged stream raises

_COMPRESSED = (
    (b"\x1f\x8b", gzip.open, "gzip"),
    (b"BZh", bz2.open, "bzip2"),
    (b"\xfd7zXZ\x00", lzma.open, "xz"),
)
_BOMS = (  # longest first: the UTF-32-LE BOM starts with the UTF-16-LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CONTROLS = bytes([*range(1, 7), *range(14, 27), *range(28, 32)])
_TEXT_BYTES = bytes([9, 10, 13, *range(32, 127)])
MIN_ASCII_SHARE = 0.5  # of a sample that is not UTF-8: below this it is no ASCII-compatible log


@dataclass
class LogSource:
    """One opened log: its display name and a binary stream of its (decompressed) bytes."""

    name: str
    stream: BinaryIO
    encoding: str  # 'utf-8' (also for ASCII and ASCII-compatible legacy bytes), 'utf-16-*' or 'utf-32-*'
    compression: str = ""  # 'gzip', 'bzip2', 'xz' or '' (names the format when its stream is damaged)
    raw: BinaryIO | None = None  # the file under a decompressor, closed with it

    def close(self) -> None:
        stdin = getattr(sys.stdin, "buffer", None)
        for stream in (self.stream, self.raw):
            if stream is not None and stream is not stdin:
                stream.close()


def open_log(path: str) -> LogSource:
    """Open PATH ('-' for stdin) for reading, or raise InputError with one clear line."""
    if path == "-":
        raw, name = _open_stdin(), "<stdin>"
    else:
        raw, name = _open_path(path), path
    source = LogSource(name=name, stream=raw, encoding="utf-8")
    try:
        head = raw.peek(8)[:8]
        for magic, opener, fmt in _COMPRESSED:
            if head.startswith(magic):
                source.stream, source.raw, source.compression = opener(raw), raw, fmt
                source.name = f"{name} ({fmt})"
                break
        sample = source.stream.peek(SNIFF_SIZE)[:SNIFF_SIZE]
    except READ_ERRORS as exc:
        source.close()
        raise InputError(_read_failure(path, source.compression, exc))
    encoding = sniff_encoding(sample)
    if isinstance(encoding, _Refusal):
        source.close()
        raise InputError(f"{path}: {encoding.reason}")
    source.encoding = encoding
    return source


def _read_failure(name: str, compression: str, exc: BaseException) -> str:
    detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if compression:
        return f"{name}: damaged {compression} stream ({detail})"
    return f"{name}: cannot read ({detail})"


def _open_stdin() -> BinaryIO:
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:
        raise InputError("-: stdin is closed; give a log file or pipe one in")
    return raw if hasattr(raw, "peek") else io.BufferedReader(raw)


def _open_path(path: str) -> BinaryIO:
    """A regular file or a FIFO, opened; devices and sockets refused with the reason."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file")
    except PermissionError:
        raise InputError(f"{path}: permission denied")
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})")
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a directory, not a log file")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise InputError(f"{path}: is a device, not a log file")
    if stat.S_ISSOCK(mode):
        raise InputError(f"{path}: is a socket, not a log file; pipe it in with '-' instead")
    if stat.S_ISFIFO(mode):
        return _open_fifo(path)
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is not a regular file")
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by LogSource.close
    except PermissionError:
        raise InputError(f"{path}: permission denied")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})")


def _open_fifo(path: str) -> BinaryIO:
    """A FIFO (or a shell's <(...)) opened without blocking, then waited on for at most
    FIFO_WAIT_S until a writer sends something or closes it; read normally from then on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})")
    try:
        ready, _, _ = select.select([fd], [], [], FIFO_WAIT_S)
    except (OSError, ValueError) as exc:
        os.close(fd)
        raise InputError(f"{path}: cannot read ({exc})")
    if not ready:
        os.close(fd)
        raise InputError(f"{path}: a FIFO that no program writes to (nothing came in {FIFO_WAIT_S:g} s)")
    os.set_blocking(fd, True)
    return open(fd, "rb")  # noqa: SIM115 - closed by LogSource.close


@dataclass
class _Refusal:
    reason: str


def sniff_encoding(sample: bytes) -> str | _Refusal:
    """The encoding of a log from its first bytes, or why it is refused: a BOM; the NUL layout
    of UTF-32 or UTF-16; then UTF-8, or ASCII-compatible bytes read as UTF-8 (their ASCII, where
    the errors are, exact). Binary data and text in no encoding that can be told are refused."""
    for bom, name in _BOMS:
        if sample.startswith(bom):
            return name
    if not sample:
        return "utf-8"
    nul = sample.count(0)
    if nul:
        wide = _wide_layout(sample)
        if wide:
            return wide
        if nul > len(sample) * 0.001:
            return _Refusal("looks like binary data, not a text log")
    if sum(sample.count(c) for c in _CONTROLS) > len(sample) * 0.05:
        return _Refusal("looks like binary data, not a text log")
    if _valid_utf8(sample):
        return "utf-8"
    if len(sample.translate(None, _TEXT_BYTES)) > len(sample) * (1 - MIN_ASCII_SHARE):
        return _Refusal("is neither UTF-8, UTF-16 nor UTF-32, and too little of it is ASCII to read it "
                        "safely; convert it first (iconv -f ENCODING -t UTF-8)")
    return "utf-8"


def _wide_layout(sample: bytes) -> str | None:
    """'utf-32-*' or 'utf-16-*' when the NULs sit where ASCII text in that encoding puts them."""
    n = len(sample) - len(sample) % 4
    if n >= 8:
        lanes = [sample[i:n:4].count(0) / (n // 4) for i in range(4)]
        if lanes[1] > 0.9 and lanes[2] > 0.9 and lanes[3] > 0.9 and lanes[0] < 0.5:
            return "utf-32-le"
        if lanes[0] > 0.9 and lanes[1] > 0.9 and lanes[2] > 0.9 and lanes[3] < 0.5:
            return "utf-32-be"
    half = max(1, len(sample) // 2)
    even_nul, odd_nul = sample[0::2].count(0), sample[1::2].count(0)
    if odd_nul > 0.4 * half and even_nul < 0.05 * half:
        return "utf-16-le"
    if even_nul > 0.4 * half and odd_nul < 0.05 * half:
        return "utf-16-be"
    return None


def _valid_utf8(sample: bytes) -> bool:
    """Valid UTF-8, allowing a character cut off at the end of the sample."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _hard_cut(data: bytes) -> int:
    """Where to end a block inside a line longer than a block: before its last '[' (a rank
    prefix then starts the next block, and the line's prefixes still read as prefixes) or after
    its last space, whichever is later, if that is in the block's second half; else at the end."""
    half = len(data) // 2
    cut = max(data.rfind(b"[", half) - 1, data.rfind(b" ", half))
    return cut if cut >= half else len(data) - 1


def _read(source: LogSource, size: int) -> bytes:
    try:
        return source.stream.read(size)
    except READ_ERRORS as exc:
        if source.compression:
            name = source.name.removesuffix(f" ({source.compression})")
            raise InputError(_read_failure(name, source.compression, exc))
        raise InputError(f"{source.name}: read failed part-way ({getattr(exc, 'strerror', None) or exc})")


def iter_blocks(source: LogSource, block_size: int = BLOCK_SIZE) -> Iterator[bytes]:
    """Yield UTF-8 byte blocks that end at a line boundary ('\\n', else '\\r', else a cut)."""
    decoder = None
    if source.encoding != "utf-8":
        decoder = codecs.getincrementaldecoder(source.encoding)(errors="replace")
    carry = b""
    first = True
    while True:
        chunk = _read(source, block_size)
        if decoder is not None:
            text = decoder.decode(chunk, final=not chunk)
            chunk = text.encode("utf-8", "replace") if text else b""
        if first and chunk:
            first = False
            if chunk.startswith(codecs.BOM_UTF8):
                chunk = chunk[len(codecs.BOM_UTF8):]  # a BOM is no part of the first line
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
