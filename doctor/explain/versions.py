"""Versions of the training stack: those a log reveals (env dumps, pip output, site-packages
paths, DeepSpeed's banner) and those installed here, read from package metadata without
importing the packages (importing torch or deepspeed takes seconds and may itself fail)."""

from __future__ import annotations

import re
from importlib import metadata

from .lines import InertLines, LineMemo, LogLine


# the distributions whose installed versions matter to a diagnosis (package metadata names)
INSTALLED = ("llamafactory", "transformers", "accelerate", "deepspeed", "peft", "trl", "datasets",
             "torch", "tokenizers", "bitsandbytes", "flash-attn", "vllm", "torchvision")
WATCHED = ("llamafactory", "transformers", "accelerate", "deepspeed", "peft", "trl", "datasets",
           "torch", "tokenizers", "bitsandbytes", "flash-attn", "vllm", "nccl", "python", "cuda")
_ALIASES = {
    "pytorch": "torch", "torch": "torch", "llamafactory": "llamafactory", "llama-factory": "llamafactory",
    "llama_factory": "llamafactory", "llmtuner": "llamafactory", "transformers": "transformers",
    "accelerate": "accelerate", "deepspeed": "deepspeed", "peft": "peft", "trl": "trl",
    "datasets": "datasets", "tokenizers": "tokenizers", "bitsandbytes": "bitsandbytes",
    "flash-attn": "flash-attn", "flash_attn": "flash-attn", "vllm": "vllm", "nccl": "nccl",
    "python": "python", "cuda": "cuda",
}
_V = r"(\d+\.\d+(?:\.\d+)?(?:\.?(?:post|dev|rc|a|b)\d+)?)"
_NAME = r"(pytorch|torch|llama[-_]?factory|llmtuner|transformers|accelerate|deepspeed|peft|trl|datasets|tokenizers|bitsandbytes|flash[-_]attn|vllm|python)"
_PATTERNS = (
    # llamafactory-cli env / transformers env / accelerate env: '- `transformers` version: 4.46.1'
    re.compile(rf"^\s*[-*]?\s*`?{_NAME}`?\s+version:?\s*{_V}", re.I),
    # pip freeze / requirements / pip install: 'deepspeed==0.16.0', 'Successfully installed deepspeed-0.16.0'
    re.compile(rf"\b{_NAME}\s*==\s*{_V}", re.I),
    re.compile(rf"(?:Successfully installed|Requirement already satisfied:).*?\b{_NAME}-{_V}", re.I),
    # site-packages/deepspeed-0.16.0-py3.10.egg or .dist-info
    re.compile(rf"site-packages/{_NAME}-{_V}", re.I),
    # DeepSpeed's banner and ds_report
    re.compile(r"(DeepSpeed) info: version=" + _V, re.I),
    re.compile(rf"^\s*{_NAME}\s+(?:info|version)\s*\.{{3,}}\s*\[?{_V}", re.I),
    re.compile(r"^(NCCL) version " + _V),
    re.compile(r"(python)(\d\.\d+)/(?:site|dist)-packages"),
)
_CUDA_LINE = re.compile(r"\b(CUDA) (?:Version|version):?\s*" + _V)
_PIP_SHOW = re.compile(r"pip3? show ([\w.-]+)")
_PIP_SHOW_VERSION = re.compile(r"^Version:\s*" + _V)


def _mute(text: str) -> bool:
    """True when text holds none of the words that every pattern below needs: it names no version."""
    return ("ersion" not in text and "==" not in text and "-packages/" not in text and "nstalled" not in text
            and "pip" not in text and "....." not in text)


def version_blind(text: str) -> bool:
    """True when what feed() makes of text is the same for every text of its shape (digits
    aside) whatever came before it: the patterns tell digits only from other characters, and
    `pip3 show` and the `Version:` line under it (read while a `pip show` is pending) are not in it."""
    return "pip" not in text and "Version:" not in text


class LogVersions:
    """Collects package versions mentioned in a log; the last mention wins."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}
        self._pip_show: str | None = None
        self._known = LineMemo()  # line -> the versions it names: read once however often it repeats
        self._made: list[tuple[str, str]] = []  # (key, version) recorded by the current line
        self._silent: set[str] = set()  # texts _mute() is true of (bounded as LineMemo)
        self._applied: str | None = None  # the text whose versions `found` took last, nothing recorded since
        self._barren: set[str] = set()  # texts read with no `pip show` pending that named no version (bounded)

    def feed_block(self, lines: list[LogLine]) -> None:
        """feed() the text of each line in turn; a text that names no version whatever comes
        before it (no word a version is written with) is passed over after its first time."""
        silent, barren = self._silent, self._barren
        for line in lines:
            text = line.text
            if (text in barren or text == self._applied) and self._pip_show is None:
                continue  # names no version, or names what it named when it was read last
            if text in silent:
                continue
            if _mute(text):
                if len(text) <= InertLines.MAX_CHARS:
                    if len(silent) >= InertLines.MAX_ENTRIES:
                        silent.clear()
                    silent.add(text)
                continue
            self.feed(text)

    def feed(self, text: str) -> None:
        if _mute(text):
            return
        remember = self._pip_show is None
        if remember:
            known = self._known.get(text)
            if known is not None:
                self.found.update(known)
                self._applied = text
                return
        self._applied = None
        self._made = []
        m = _PIP_SHOW.search(text)
        if m:
            self._pip_show = m.group(1)
            return
        if self._pip_show:
            m = _PIP_SHOW_VERSION.match(text.strip())
            if m:
                self._record(self._pip_show, m.group(1))
                self._pip_show = None
                return
        m = _CUDA_LINE.search(text)
        if m:
            self._record("cuda", m.group(2))
        for pattern in _PATTERNS:
            for m in pattern.finditer(text):
                self._record(m.group(1), m.group(2))
        if remember:
            self._known.put(text, tuple(self._made))
            self._applied = text  # what it names was recorded last: the same line again changes nothing
            if not self._made and len(text) <= InertLines.MAX_CHARS:
                if len(self._barren) >= InertLines.MAX_ENTRIES:
                    self._barren.clear()
                self._barren.add(text)

    def _record(self, name: str, version: str) -> None:
        key = _ALIASES.get(name.lower().replace(" ", ""))
        if key:
            self.found[key] = version
            self._made.append((key, version))


def installed_versions() -> dict[str, str]:
    out = {}
    for dist in INSTALLED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out
