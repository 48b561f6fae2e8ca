"""Reading the stacks a rank dumped: faulthandler's text ("Thread 0x... (most recent call
first):" then 'File "f", line N in func') and py-spy's ("Thread N (idle): "MainThread"" then
"func (file:line)"). Frames are kept innermost first; the frame that tells where a rank is
skips the stdlib's waiting machinery (threading, selectors, queue, ...)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[([^\]]*)\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')
_PS_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \((\w+)\)(?:: "(.*)")?')
_PS_FRAME = re.compile(r"^\s+(.+?) \((.+?):(\d+)\)\s*$")

# where a waiting thread sits without telling anything about the program
_PLUMBING = re.compile(
    r"(^|/)(threading|selectors|socket|queue|subprocess|ssl|contextlib|functools|runpy|weakref|"
    r"signal|socketserver|codecs|tempfile|shutil)\.py$|(^|/)(multiprocessing|concurrent|asyncio|importlib|"
    r"logging|json|http|email|urllib|encodings)/|^<frozen |^<string>$")
_LIBRARY = re.compile(r"/(site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages|dist-packages)|^<frozen ")
# torch's own wrappers around a collective: the caller of these is the interesting frame
_WRAPPERS = re.compile(r"torch/distributed/c10d_logger\.py$|torch/utils/_contextlib\.py$|"
                       r"torch/nn/modules/module\.py$|deepspeed/comm/comm\.py$|deepspeed/utils/nvtx\.py$")
COLLECTIVES = frozenset("""all_reduce all_gather all_gather_into_tensor _all_gather_base all_gather_object
all_gather_coalesced reduce_scatter reduce_scatter_tensor _reduce_scatter_base all_to_all all_to_all_single
broadcast broadcast_object_list barrier monitored_barrier reduce gather gather_object scatter
scatter_object_list send recv isend irecv batch_isend_irecv wait""".split())
_COLLECTIVE_FILES = re.compile(r"torch/distributed/distributed_c10d\.py$|deepspeed/comm/torch\.py$")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        parts = self.file.replace("\\", "/").split("/")
        for marker in ("site-packages", "dist-packages"):
            if marker in parts:
                parts = parts[parts.index(marker) + 1:]
                break
        else:
            parts = parts[-2:] if len(parts) > 2 else parts
        return f"{self.func} ({'/'.join(parts)}:{self.line})"

    @property
    def is_plumbing(self) -> bool:
        return bool(_PLUMBING.search(self.file))

    @property
    def is_users(self) -> bool:
        if not os.path.isabs(self.file) and "/" in self.file.replace("\\", "/"):
            return False  # py-spy's short form of a site-packages file: "datasets/arrow_dataset.py"
        return not _LIBRARY.search(self.file) and not _STDLIB.search(self.file) and not self.is_plumbing


@dataclass
class Thread:
    ident: str
    name: str = ""
    frames: list[Frame] = field(default_factory=list)  # innermost first


def parse_faulthandler(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            threads.append(Thread(m.group(2), m.group(3) or ""))
            continue
        m = _FH_FRAME.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m.group(1), int(m.group(2)), m.group(3)))
    return threads


def parse_py_spy(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _PS_THREAD.match(line)
        if m:
            threads.append(Thread(m.group(1), m.group(3) or ""))
            continue
        m = _PS_FRAME.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m.group(2), int(m.group(3)), m.group(1)))
    return threads


def main_thread(threads: list[Thread]) -> Thread | None:
    """The program's own thread: py-spy names it; in faulthandler's dump it is the one whose
    outermost frame is a module's top level (others start in threading's _bootstrap)."""
    for t in threads:
        if t.name == "MainThread":
            return t
    tops = [t for t in threads if t.frames and t.frames[-1].func == "<module>"]
    if tops:
        return tops[-1]
    with_frames = [t for t in threads if t.frames]
    return with_frames[-1] if with_frames else None


def collective_frame(frames: list[Frame]) -> tuple[Frame, Frame | None] | None:
    """(the collective call, the frame that called it) when the thread waits in one."""
    for i, f in enumerate(frames):
        if f.func in COLLECTIVES and _COLLECTIVE_FILES.search(f.file.replace("\\", "/")):
            caller = next((g for g in frames[i + 1:] if not _WRAPPERS.search(g.file.replace("\\", "/"))
                           and not _COLLECTIVE_FILES.search(g.file.replace("\\", "/"))), None)
            return f, caller
    return None


def top_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of user or library code (the stdlib's waiting machinery skipped)."""
    return next((f for f in frames if not f.is_plumbing), frames[0] if frames else None)


def users_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the user's own code (outside site-packages and the stdlib)."""
    return next((f for f in frames if f.is_users), None)


def mentions(frames: list[Frame], pattern: re.Pattern) -> Frame | None:
    """The innermost frame whose function or file matches pattern."""
    return next((f for f in frames if pattern.search(f"{f.file} {f.func}")), None)
