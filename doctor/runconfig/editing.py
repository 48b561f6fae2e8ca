"""Writing a repaired config back as a careful editor does: the real file behind a symlink (the
link stays), a backup that is complete or absent, an exclusive temporary file in the same folder
(never a path an attacker planted), the file's permissions kept, one atomic rename. The new text
changes only what the repair changed: the JSON keeps its indent and each number's spelling
(`5e8`), the YAML is edited line by line (its comments stay). Diffs are correct for files
without a final newline."""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import stat
import tempfile

import yaml

from ..errors import InputError
from .reading import MAX_CONFIG_BYTES, SourceFloat, parse_yaml

_MISSING = object()


# ---- the new text -----------------------------------------------------------------------------

def json_text(data: dict, like: str = "") -> str:
    """`data` as JSON in the layout of `like` (the original text): its indent, numbers as written."""
    nonce = secrets.token_hex(8)
    literals: list[str] = []

    def mark(node):
        if isinstance(node, dict):
            return {k: mark(v) for k, v in node.items()}
        if isinstance(node, list):
            return [mark(v) for v in node]
        if isinstance(node, SourceFloat):
            literals.append(node.text)
            return f"\x00{nonce}:{len(literals) - 1}\x00"
        return node

    text = json.dumps(mark(data), indent=_indent_of(like), ensure_ascii=False)
    token = re.compile(r'"\\u0000' + nonce + r':(\d+)\\u0000"')
    return token.sub(lambda m: literals[int(m.group(1))], text) + "\n"


def _indent_of(text: str) -> int | str:
    lines = text.splitlines()
    for first, second in zip(lines, lines[1:]):
        if first.rstrip().endswith(("{", "[")) and second[:1] in (" ", "\t"):
            lead = second[: len(second) - len(second.lstrip())]
            return "\t" if lead.startswith("\t") else len(lead)
    return 2


def yaml_text(text: str, before: dict, after: dict, path: str) -> str:
    """The YAML text with the top-level keys that differ between `before` and `after` edited in
    place (a `key: value` line, its comment kept) or appended; anything else is refused, and the
    result must read back as `after`."""
    lines = text.splitlines(True)
    for key in [k for k in {**before, **after} if before.get(k, _MISSING) != after.get(k, _MISSING)]:
        value = after.get(key, _MISSING)
        if value is _MISSING or isinstance(value, (dict, list)):
            raise InputError(f"{path}: {key}: this repair cannot be written line by line; edit it by hand")
        lines = _set_line(lines, key, _scalar(value), path)
    new = "".join(lines)
    if parse_yaml(new, path) != after:
        raise InputError(f"{path}: the YAML does not read back as repaired (flow style or anchors?); edit it by hand")
    return new


def _set_line(lines: list[str], key: str, value: str, path: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(key)}[ \t]*:(?P<value>[ \t]*[^#\n]*?)(?P<comment>[ \t]+#[^\n]*)?(?P<end>\r?\n?)$")
    hits = [i for i, line in enumerate(lines) if pattern.match(line)]
    if len(hits) > 1:
        raise InputError(f"{path}: {key} is written {len(hits)} times; edit it by hand")
    if not hits:
        if lines and not lines[-1].endswith("\n"):
            lines = [*lines[:-1], lines[-1] + "\n"]
        return [*lines, f"{key}: {value}\n"]
    m = pattern.match(lines[hits[0]])
    if not m.group("value").strip():
        raise InputError(f"{path}: {key} holds a block; edit it by hand")
    line = f"{key}: {value}{m.group('comment') or ''}{m.group('end')}"
    return [*lines[: hits[0]], line, *lines[hits[0] + 1:]]


def _scalar(value) -> str:
    if isinstance(value, (bool, int, float)) or value is None:
        return json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()


def unified_diff(before: str, after: str, fromfile: str, tofile: str) -> str:
    """difflib's unified diff, with the `\\ No newline at end of file` line that patch expects."""
    out = []
    for line in difflib.unified_diff(before.splitlines(True), after.splitlines(True), fromfile, tofile):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


# ---- the write --------------------------------------------------------------------------------

def write_carefully(path: str, expected: str, text: str) -> str:
    """Replace the file behind `path` (through symlinks) with `text`; `expected` is its text as
    read, which it must still have. Returns the backup's path (the original, byte for byte)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: not a regular file; nothing written")
    backup = real + ".bak"
    if os.path.islink(backup):
        raise InputError(f"{backup} is a symbolic link: no backup is written through it; remove it first")
    if os.path.lexists(backup):
        raise InputError(f"{backup} already exists; move it away first (it may be an earlier original)")
    original = _read_original(real, expected, path)
    _create_exclusive(backup, original, st)
    try:
        _replace_atomically(real, text.encode("utf-8"), st)
    except BaseException:
        _unlink(backup)  # the original is untouched: no backup either, so the next --write can run
        raise
    return backup


def _read_original(real: str, expected: str, path: str) -> bytes:
    with open(real, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if data.decode("utf-8-sig", "replace") != expected:
        raise InputError(f"{path}: changed while mgft-doctor was reading it; nothing written (run fix again)")
    return data


def _create_exclusive(path: str, data: bytes, st: os.stat_result) -> None:
    """A new file (O_EXCL: never an existing one, never through a link) holding all of data, or
    no file at all: a full disk leaves nothing behind that blocks the next --write."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, stat.S_IMODE(st.st_mode))
    except OSError as exc:
        raise InputError(f"{path}: cannot create the backup ({exc.strerror}); nothing written") from None
    try:
        _fill(fd, data, st)
    except OSError as exc:
        os.close(fd)
        _unlink(path)
        raise InputError(f"{path}: cannot write the backup ({exc.strerror}); nothing written") from None
    os.close(fd)


def _replace_atomically(real: str, data: bytes, st: os.stat_result) -> None:
    folder, name = os.path.split(real)
    try:  # mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW under a random name in the same folder
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".mgft-doctor.tmp", dir=folder or ".")
    except OSError as exc:
        raise InputError(f"{real}: cannot create a temporary file next to it ({exc.strerror}); nothing written") from None
    try:
        _fill(fd, data, st)
        os.close(fd)
        fd = -1
        os.replace(tmp, real)
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        _unlink(tmp)
        raise InputError(f"{real}: cannot write ({exc.strerror}); nothing changed") from None
    _sync_folder(folder or ".")


def _fill(fd: int, data: bytes, st: os.stat_result) -> None:
    """All of data into fd, then the original's mode (and owner, where allowed), flushed to disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    try:
        os.fchown(fd, st.st_uid, st.st_gid)
    except OSError:
        pass  # not root: the file is ours anyway
    os.fsync(fd)


def _sync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
