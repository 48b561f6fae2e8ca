"""Reading the user's config files so that no input can crash, hang or exhaust the doctor: a
regular file only (a FIFO, a device or /dev/zero behind a symlink is refused), at most
MAX_CONFIG_BYTES, YAML through the safe loader with its nesting bounded before it is built, and
every value walked once, with a bound on how many values the walk may meet (PyYAML keeps an
alias as a shared reference; the blow-up of a billion-laughs bomb happens when something walks
it). What is expected where (a mapping, a whole number in range, "auto") is checked as it is
read, so the rules never meet a list where they ask `.get`. Every refusal is an InputError of one
line naming the file and the key path: `train.yaml: deepspeed.zero_optimization: expected a
mapping, got a list`.

What LLaMA-Factory's parser accepts, the reader accepts, and the rules judge: HfArgumentParser's
parse_dict hands the YAML's values to the dataclasses unconverted, so a quoted number ("4") and a
float where an int is annotated (`1e2` is 100.0 under OmegaConf) both pass get_train_args and fail
later; they reach config.llamafactory (MGD918), not an exit 2."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from dataclasses import dataclass

import yaml

from ..errors import InputError

MAX_CONFIG_BYTES = 16 << 20  # a real train YAML or DeepSpeed JSON is a few KB
MAX_DEPTH = 64  # DeepSpeed's deepest section is 3 levels; LLaMA-Factory's YAML is flat
MAX_VALUES = 100_000  # values met by the walk, aliases counted each time they are reached
MAX_INT = 1 << 63  # no option of these libraries takes a larger whole number
MAX_YAML_VALUES = 10_000  # OmegaConf's default bound on a YAML after alias expansion (llamafactory-cli reads with it)


class _OmegaConfLikeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The safe loader with the rules of OmegaConf's (omegaconf/_yaml.py get_yaml_loader), which
    llamafactory-cli reads its YAML with: `1e-4` is a float, a date stays a string, a key given
    twice is refused. No tag beyond YAML's own is constructed."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                            f"found duplicate key {key_node.value}", key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


_OmegaConfLikeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))
_OmegaConfLikeLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in _OmegaConfLikeLoader.yaml_implicit_resolvers.items()}
_LOADER = _OmegaConfLikeLoader


class SourceFloat(float):
    """A JSON number as written (`5e8` stays `5e8` when fix writes the file back)."""

    text: str

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.text = text
        return obj

    def __deepcopy__(self, memo):  # immutable, like float
        return self


# ---- the file itself --------------------------------------------------------------------------

def read_text(path: str, what: str) -> str:
    """The text of a regular file of at most MAX_CONFIG_BYTES, or one line saying why not."""
    st = _stat(path, what)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: not a regular file (a device, FIFO or socket), not a {what}")
    if st.st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{path}: {st.st_size / 1e6:.0f} MB is too large for a {what} (at most {MAX_CONFIG_BYTES >> 20} MB)")
    data = _read_capped(path)
    if b"\x00" in data[:4096]:
        raise InputError(f"{path}: looks like binary data, not a {what}")
    return data.decode("utf-8-sig", "replace")


def _stat(path: str, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file ({what})") from None
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ELOOP, EACCES; ValueError: a NUL in the path
        raise InputError(f"{_short(path)}: cannot open ({_why(exc)})") from None


def _read_capped(path: str) -> bytes:
    """Read at most MAX_CONFIG_BYTES + 1; O_NONBLOCK so that a FIFO swapped in after the stat
    cannot block the open, and the opened file is checked again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InputError(f"{_short(path)}: cannot read ({_why(exc)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: not a regular file (a device, FIFO or socket)")
        chunks, left = [], MAX_CONFIG_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise InputError(f"{_short(path)}: cannot read ({_why(exc)})") from None
    finally:
        os.close(fd)
    if left <= 0:
        raise InputError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MB: not a config file")
    return b"".join(chunks)


def _why(exc: Exception) -> str:
    if isinstance(exc, ValueError):
        return "the path contains a NUL byte"
    if getattr(exc, "errno", None) == errno.ENAMETOOLONG:
        return "file name too long"
    return getattr(exc, "strerror", None) or str(exc)


def _short(path: str, limit: int = 120) -> str:
    """A path as the error line shows it: a 5,000-character value taken for a path is cut."""
    text = repr(path) if "\x00" in path else path
    return text if len(text) <= limit else text[: limit - 1] + "…"


def why_not_file(path: str) -> str:
    """How a path named in a config is not a usable file, as the end of a sentence."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "was not found"
    except (OSError, ValueError) as exc:
        return f"cannot be opened ({_why(exc)})"
    return "is a directory" if stat.S_ISDIR(st.st_mode) else "is not a regular file"


def path_is_file(path: str) -> bool:
    """os.path.isfile for any string a config may hold (too long, a NUL byte: not a file)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# ---- parsing ----------------------------------------------------------------------------------

def parse_yaml(text: str, path: str):
    """yaml.safe_load (no arbitrary tags), with the nesting bounded by a first pass over the
    parser's events (flat, so a 100,000-deep document cannot reach Python's recursion limit)."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise InputError(f"{path}: line {line}: nested more than {MAX_DEPTH} levels deep")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise InputError(f"{path}: not valid YAML ({where}{getattr(exc, 'problem', None) or exc})") from None
    except (RecursionError, MemoryError):
        raise InputError(f"{path}: not valid YAML (too deeply nested or too large)") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor's own refusal (a bad !!timestamp)
        raise InputError(f"{path}: not valid YAML ({type(exc).__name__}: {exc})") from None


def parse_json(text: str, path: str):
    """json.loads keeping each number's spelling, refusing duplicate keys (DeepSpeed does)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_float=SourceFloat,
                          parse_constant=float)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise InputError(f"{path}: not valid JSON (nested more than {MAX_DEPTH} levels deep)") from None
    except ValueError as exc:  # a duplicate key; a whole number of more than 4300 digits
        raise InputError(f"{path}: {exc}") from None


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r} (DeepSpeed rejects it)")
        seen[k] = v
    return seen


# ---- the walk ---------------------------------------------------------------------------------

SCALARS = (str, int, float, bool, type(None))


def key_path(parts: tuple) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) and not isinstance(p, bool) else (f".{p}" if out else str(p))
    return out or "(top level)"


def check_tree(data, path: str, prefix: tuple = (), limit: int = MAX_VALUES) -> None:
    """Walk every value once, without recursion: keys are strings, numbers finite and in range,
    values plain (YAML's !!set, !!binary, dates are refused), nesting at most MAX_DEPTH, at most
    MAX_VALUES values with each alias counted wherever it is used."""
    stack = [(prefix, data)]
    seen = 1
    while stack:
        where, node = stack.pop()
        if len(where) - len(prefix) > MAX_DEPTH:
            raise InputError(f"{path}: {key_path(where[:len(prefix) + 3])}: nested more than {MAX_DEPTH} levels deep "
                             "(or a YAML alias that contains itself)")
        if isinstance(node, (dict, list)):
            seen += len(node)
            if seen > limit:
                raise InputError(f"{path}: {key_path(where)}: more than {limit:,} values once YAML aliases are "
                                 "expanded (an alias bomb?): not a run config")
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    raise InputError(f"{path}: {key_path(where)}: key {k!r} is not a string")
                stack.append((where + (k,), v))
        elif isinstance(node, list):
            stack.extend((where + (i,), v) for i, v in enumerate(node))
        else:
            _check_scalar(node, path, where)


def _check_scalar(value, path: str, where: tuple) -> None:
    if not isinstance(value, SCALARS):
        raise InputError(f"{path}: {key_path(where)}: {describe(value)} is not a plain value (use a string, "
                         "number, true/false, list or mapping)")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{path}: {key_path(where)}: {value!r} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
        raise InputError(f"{path}: {key_path(where)}: {value} is out of range")


def describe(value) -> str:
    """What a value is, in the words of the error line."""
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    for t, name in names.items():
        if type(value) is t or (t is float and isinstance(value, float)):
            return f"{name} ({_clip(value)})" if t in (str, int, float) else name
    return f"a {type(value).__name__}"


def _clip(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---- what is expected where -------------------------------------------------------------------

@dataclass(frozen=True)
class Expect:
    """What one key may hold: a kind ('mapping', 'int', 'number', 'string', 'path'), the range of a
    number, and whether "auto" is legal there (a DeepSpeed JSON through the HF Trainer)."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    auto: bool = False
    also_mapping: bool = False  # `deepspeed:` in a YAML: a path, or the DeepSpeed config inline
    quoted: bool = False  # a number in quotes passes (lf_rules reports it as LLaMA-Factory sees it)
    loose: bool = False  # "int" takes a float too (HfArgumentParser does not convert; lf_rules judges it)

    def problem(self, value) -> str | None:
        if value is None or (self.auto and value == "auto"):
            return None
        if isinstance(value, str) and self.kind in ("int", "number") and is_number_text(value):
            return None if self.quoted else (f"expected {self._wanted()}, got a string ({_clip(value)}): write it "
                                             "without quotes")
        if self.also_mapping and isinstance(value, dict):
            return None
        if self.kind == "path" and isinstance(value, str) and (len(value) > 4096 or "\x00" in value):
            return "a path with a NUL byte" if "\x00" in value else f"a path of {len(value):,} characters is too long"
        ok = {"mapping": isinstance(value, dict), "string": isinstance(value, str),
              "path": isinstance(value, str),
              "int": isinstance(value, (int, float) if self.loose else int) and not isinstance(value, bool),
              "number": isinstance(value, (int, float)) and not isinstance(value, bool)}[self.kind]
        if not ok:
            return f"expected {self._wanted()}, got {describe(value)}"
        low = self.lo is not None and value < self.lo
        high = self.hi is not None and value > self.hi
        if self.kind in ("int", "number") and (low or high):
            return f"{value:g} is out of range (expected {self._wanted()})"
        return None

    def _wanted(self) -> str:
        words = {"mapping": "a mapping", "string": "a string", "path": "a file path (a string)",
                 "int": "a whole number", "number": "a number"}[self.kind]
        if self.kind in ("int", "number") and (self.lo is not None or self.hi is not None):
            words += f" from {self.lo:g}" if self.hi is None else f" from {self.lo:g} to {self.hi:g}"
        if self.also_mapping:
            words += " or a mapping"
        return words + (' or "auto"' if self.auto else "")


_COUNT = dict(lo=1, hi=1 << 31)
_NUMERIC = re.compile(r"\s*[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)\s*$")


def is_number_text(value: str) -> bool:
    """A string that reads as a number (what a user meant as one when quoting it)."""
    return bool(_NUMERIC.match(value))


def as_number(value) -> int | float | None:
    """A value the rules may do arithmetic with: a number, or a quoted number read as one (the
    estimate follows what the user meant; config.llamafactory reports the quotes); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and is_number_text(value):
        text = value.strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            number = float(text)
            return number if math.isfinite(number) else None
    return None


_LF = dict(quoted=True, loose=True)  # as get_train_args takes it: a quoted number, a float for an int
# the LLaMA-Factory keys the run rules read, with the annotations of TrainingArguments (transformers 5)
# and LLaMA-Factory's argument classes (tests/test_runconfig_readers.py reads them from the classes)
YAML_EXPECT = {
    "model_name_or_path": Expect("path"), "deepspeed": Expect("path", also_mapping=True),
    "stage": Expect("string"), "finetuning_type": Expect("string"), "quantization_method": Expect("string"),
    "flash_attn": Expect("string"), "template": Expect("string"),
    "per_device_train_batch_size": Expect("int", **_COUNT, **_LF),
    "gradient_accumulation_steps": Expect("int", **_COUNT, **_LF),
    "cutoff_len": Expect("int", **_COUNT, **_LF), "lora_rank": Expect("int", **_COUNT, **_LF),
    "quantization_bit": Expect("int", lo=1, hi=64, **_LF), "ddp_timeout": Expect("int", lo=0, hi=10 ** 12, **_LF),
    "max_grad_norm": Expect("number", lo=0, hi=1e12, **_LF), "max_steps": Expect("int", lo=-1, hi=1 << 62, **_LF),
    "num_train_epochs": Expect("number", lo=0, hi=1e12, **_LF), "warmup_steps": Expect("number", lo=0, hi=1 << 62, **_LF),
}
DS_EXPECT = {  # the DeepSpeed keys the rules read, as DeepSpeed's config model types them
    "train_batch_size": Expect("number", auto=True, **_COUNT),
    "train_micro_batch_size_per_gpu": Expect("number", auto=True, **_COUNT),
    "gradient_accumulation_steps": Expect("number", auto=True, **_COUNT),
    "gradient_clipping": Expect("number", auto=True, lo=0, hi=1e12),
    "fp16": Expect("mapping"), "bf16": Expect("mapping"), "optimizer": Expect("mapping"),
    "scheduler": Expect("mapping"), "optimizer.params": Expect("mapping"), "scheduler.params": Expect("mapping"),
    "optimizer.type": Expect("string"), "scheduler.type": Expect("string"),
    "zero_optimization": Expect("mapping"),
    "zero_optimization.offload_optimizer": Expect("mapping"), "zero_optimization.offload_param": Expect("mapping"),
    "zero_optimization.offload_optimizer.device": Expect("string"),
    "zero_optimization.offload_param.device": Expect("string"),
    "zero_optimization.offload_optimizer.nvme_path": Expect("string"),
    "zero_optimization.offload_param.nvme_path": Expect("string"),
}


def check_expected(data: dict, expect: dict[str, Expect], path: str, prefix: str = "") -> None:
    """Each dotted key of `expect` that is present holds what is expected there; a parent that is
    not a mapping is its own key's problem (checked first: the keys are in parent order)."""
    for dotted in sorted(expect, key=lambda k: k.count(".")):
        node, found = data, True
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                found = False
                break
            node = node[part]
        if found and (why := expect[dotted].problem(node)):
            raise InputError(f"{path}: {prefix}{dotted}: {why}")
