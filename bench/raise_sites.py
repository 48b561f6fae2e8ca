#!/usr/bin/env python3
"""The libraries' own error sites, and which catalog entry recognises each of them.

usage: python bench/raise_sites.py [--json] [--group NAME] [--unmatched]
                                   [--python EXE | --site-packages DIR]

Reads the installed stack (the examined Python's site-packages; by default this interpreter's)
with `ast` and collects the messages it fails with:

- `raise X("...")` (f-strings, `+`, `%` and `.format()` reduced to a template whose
  interpolations are wildcards; a message held in a local variable is followed to its
  assignment in the same function),
- `assert cond, "..."`,
- `logger.error(...)`, `logger.critical(...)`, `logger.exception(...)` (error level; LLaMA-Factory's
  `error_rank0` too).

Each site becomes a minimal realistic log, printed the way the library prints it: a rank's
traceback with the site's own frame and torchrun's ChildFailedError summary for code that runs
in the ranks; the launcher's own traceback for torchrun/deepspeed launcher code; pydantic's
ValidationError for DeepSpeed config validators; the library's logging format for logger calls
(followed by the launcher's exit line). The log goes through the real matcher
(`mgft_doctor.explain.explain_text`); the site is *matched* when the first diagnosis is a
catalog code.

Sites that are not user-facing failures are excluded by the explicit rules in EXCLUSION_RULES
(each reason is counted and printed; nothing is dropped silently):

- reraise:            `raise`, `raise err` of a caught exception: the message is someone else's.
- abstract:           NotImplementedError as the whole body of a method (an abstract base).
- control-flow:       StopIteration, KeyboardInterrupt, SystemExit, GeneratorExit: not failures.
- no-static-message:  no literal text at all (a bare assert, `raise X(msg)` with msg built
                      elsewhere): nothing a catalog signature could name.
- internal-invariant: the message itself says it cannot happen or is a bug of the library
                      ("unreachable", "should never happen", "internal error", "please report"),
                      or the site is in KNOWN_INTERNAL (reviewed one by one, each with its reason).
- private-type-check: TypeError from a private helper (`_name`) about the type of an argument.
- test-helper:        code that only the libraries' own tests call (e.g. llamafactory/train/test_utils.py).
- other-accelerator:  op builders and checks for accelerators other than NVIDIA GPUs and the CPU
                      (Ascend NPU, Gaudi HPU, Intel XPU, MLU, MUSA, MPS, ...): this project's users never run them.
- registry-definition: a register_* function refusing a name registered twice (templates, plugins,
                      rendezvous handlers): only an edit of the library's own source triggers it.

A site is *matched* only when the first diagnosis rests on the site's own message line (its
evidence includes it); a first diagnosis from elsewhere (e.g. the generic "rank exited with an error
code" entry reading the launcher's exit line) is shown in parentheses and does not count.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# --------------------------------------------------------------------------------------------
# Groups: which files, and (for the shared files of transformers/accelerate) which sites.


@dataclass
class Spec:
    """Files of one group: a glob relative to site-packages, optionally only some sites in them."""

    pattern: str
    only_deepspeed: bool = False  # keep only sites whose message, function or guard mentions DeepSpeed
    classes: tuple[str, ...] = ()  # keep only sites inside these classes
    launcher_side: bool = False  # the code runs in the launcher process (torchrun, deepspeed), not in a rank


@dataclass
class Group:
    name: str
    specs: list[Spec]


GROUPS: dict[str, Group] = {
    g.name: g
    for g in [
        Group("llamafactory", [
            Spec("llamafactory/hparams/**/*.py"),
            Spec("llamafactory/data/**/*.py"),
            Spec("llamafactory/model/**/*.py"),
            Spec("llamafactory/train/**/*.py"),
            Spec("llamafactory/extras/misc.py"),
        ]),
        Group("hf-deepspeed", [
            Spec("transformers/integrations/deepspeed.py"),
            Spec("transformers/trainer.py", only_deepspeed=True),
            Spec("transformers/training_args.py", only_deepspeed=True),
            Spec("accelerate/utils/dataclasses.py", classes=("DeepSpeedPlugin",)),
            Spec("accelerate/utils/deepspeed.py"),
            Spec("accelerate/accelerator.py", only_deepspeed=True),
        ]),
        Group("deepspeed", [
            Spec("deepspeed/runtime/config.py"),
            Spec("deepspeed/runtime/zero/**/*.py"),
            Spec("deepspeed/runtime/engine.py"),
            Spec("deepspeed/launcher/**/*.py", launcher_side=True),
            Spec("deepspeed/ops/op_builder/**/*.py"),
            Spec("op_builder/**/*.py"),  # where a source install puts it
            Spec("deepspeed/runtime/fp16/**/*.py"),
            Spec("deepspeed/runtime/bf16_optimizer.py"),
            # checkpoint loading: the checkpoint engines, the universal-checkpoint and ZeRO
            # checkpoint readers, and zero_to_fp32; not the offline converter ds_to_universal.py
            # nor the AutoEP/affine expert-placement metadata (expert parallelism)
            Spec("deepspeed/runtime/checkpoint_engine/**/*.py"),
            Spec("deepspeed/checkpoint/universal_checkpoint.py"),
            Spec("deepspeed/checkpoint/zero_checkpoint.py"),
            Spec("deepspeed/checkpoint/deepspeed_checkpoint.py"),
            Spec("deepspeed/checkpoint/reshape_utils.py"),
            Spec("deepspeed/checkpoint/utils.py"),
            Spec("deepspeed/utils/zero_to_fp32.py"),
        ]),
        Group("torch-distributed", [
            Spec("torch/distributed/elastic/**/*.py", launcher_side=True),
            Spec("torch/distributed/distributed_c10d.py"),
            Spec("torch/distributed/rendezvous.py"),
            Spec("torch/distributed/run.py", launcher_side=True),
            Spec("torch/distributed/launcher/**/*.py", launcher_side=True),
            Spec("torch/distributed/constants.py"),
        ]),
    ]
}

# DeepSpeed words: not "non-zero" or "zero_grad", which are no ZeRO
_DS_WORDS = re.compile(r"deepspeed|zero[-_ ]?(?:stage|[0-3]\b)|zero_(?:optimization|init|stage)|\bds_|_ds\b|hf_ds|(?-i:\bZeRO\b)", re.I)

# --------------------------------------------------------------------------------------------
# Exclusions: explicit and counted.

CONTROL_FLOW = {"StopIteration", "StopAsyncIteration", "KeyboardInterrupt", "SystemExit", "GeneratorExit",
                # torch's etcd rendezvous raises these to retry its own loop; they never leave it
                "EtcdRendezvousRetryableFailure", "EtcdRendezvousRetryImmediately"}
INTERNAL_WORDS = re.compile(
    r"unreachable|should(?: never| not|n't) (?:happen|be reached|get here|be triggered)|this should never|internal error|"
    r"^Logic error:|"
    r"this is a bug|please (?:report|file) (?:a|an|this) (?:bug|issue)|not be reachable|invariant",
    re.I)
TYPE_WORDS = re.compile(r"\btype\b|must be (?:a|an)\b|expected (?:a|an)\b|isinstance|instance of", re.I)
# accelerators other than NVIDIA GPUs and the CPU: Ascend NPU, Gaudi HPU, Intel XPU, Cambricon MLU,
# Moore Threads MUSA, Apple MPS, ... (their op builders, and the checks that only run on them)
OTHER_ACCELERATOR_DIRS = re.compile(r"op_builder/(?:npu|hpu|xpu|mlu|sdaa|supa|klxpu|mps|musa)/")
OTHER_ACCELERATOR_WORDS = re.compile(r"\b(?:NPU|HPU|XPU|Xpu|MLU|MUSA|SDAA|SUPA|KLXPU|MPS|CANN_HOME|Ascend|Gaudi)\b")
# Reviewed one by one: checks whose condition the code right above them already guarantees, so only a
# bug of the library itself can fire them. (path part, message regex, why)
KNOWN_INTERNAL: list[tuple[str, str, str]] = [
    ("llamafactory/data/loader.py", r"^Sample num mismatched\.$",
     "the indexes were just built to hold exactly num_samples entries"),
    ("deepspeed/runtime/zero/", r"^This can happen either zero or only once as this must be the first tensor",
     "partition bookkeeping of the flattening loop right above it"),
    ("deepspeed/runtime/zero/stage_1_and_2.py", r"^param in ipg bucket does not match extra-large param",
     "follows the 'more than 1 param in ipg bucket' invariant"),
    ("deepspeed/runtime/zero/stage3.py", r"^Unexpected that largest partition is empty",
     "computed from the non-empty partitions just built"),
    ("deepspeed/runtime/zero/stage3.py", r"^params and buffers_to_allgather must have the same (?:length|numel)",
     "both lists are built together by the caller"),
    ("deepspeed/runtime/zero/stage3.py", r"^fp32 parameters of sub_group .* is None",
     "set up for every sub-group when the optimizer is created"),
    ("deepspeed/runtime/zero/stage3.py", r"^ Number of elements do not match",
     "copies between a partition and its own flat buffer"),
    ("deepspeed/runtime/zero/stage3.py", r"^ZeRO Stage 3 parameter bucket mixes partition process groups",
     "buckets are built per process group"),
    ("deepspeed/runtime/zero/partitioned_param_profiler.py", r"^unknown event",
     "event names are the profiler's own constants"),
    ("deepspeed/runtime/engine.py", r"^Unknown pass",
     "compile pass names are DeepSpeed's own constants"),
    # torch.distributed: asserts in process-group construction on values torch computed itself
    ("torch/distributed/distributed_c10d.py", r"^(?:Default process group creation returned a nonmember|"
     r"Default process group store is not initialized|Group rank must be specified for group members|"
     r"Unknown (?:c10d )?backend type|group_(?:name|desc) must not be None|Expected split_from to be ProcessGroupNCCL|"
     r"group name should be set to|Mismatched bound device between new pg and the default pg|"
     r"Local process group store is not initialized|Current rank was not assigned to a subgroup|"
     r"rankset doesn't include the current node|Rank .* was not included in process group|"
     r"Mismatch in return ranks for object sizes and objects)",
     "computed by torch's own group bookkeeping a few lines above"),
    ("torch/distributed/elastic/", r"^(?:Unknown worker:|The (?:process context|subprocess handlers) already "
     r"initialized|.*local rank mapping mismatch|Tracing requires rank information|Unexpected state of "
     r"EtcdRendezvousHandler|The timer has already started|\[.*\] worker pids do not match process_context pids|"
     r"\[.*\] Worker group in .* state$)",
     "the agent's own state machine; user input cannot reach it"),
]
TEST_HELPERS = (
    "llamafactory/train/test_utils.py",
    "deepspeed/runtime/zero/test.py",
    # ContiguousMemoryAllocator is constructed only by runtime/zero/test.py in this DeepSpeed
    "deepspeed/runtime/zero/contiguous_memory_allocator.py",
    # starts a throw-away etcd server for torch's own rendezvous tests
    "torch/distributed/elastic/rendezvous/etcd_server.py",
)

EXCLUSION_RULES = {
    "reraise": "re-raises a caught exception: the message is another site's",
    "abstract": "NotImplementedError as the whole body of a method (abstract base)",
    "control-flow": "StopIteration/KeyboardInterrupt/SystemExit/GeneratorExit: not a failure",
    "no-static-message": "no literal text in the message (bare assert, message built elsewhere)",
    "internal-invariant": "the message says it cannot happen or is a library bug",
    "private-type-check": "TypeError about an argument's type in a private helper",
    "test-helper": "only the library's own tests call it",
    "other-accelerator": "runs only on an accelerator other than NVIDIA GPUs or the CPU (NPU, HPU, XPU, MLU, MPS, ...)",
    "registry-definition": "a library registering its own templates/plugins/handlers twice: only an edit of its source triggers it",
}

# --------------------------------------------------------------------------------------------
# Message templates.

WILD = "\0"  # marks a wildcard in a template's literal form


@dataclass
class Part:
    text: str  # literal text, or the source of the interpolated expression
    wild: bool = False
    spec: str = ""  # format spec of the interpolation (":.2f", "%d"), for filling


def _lit(s: str) -> list[Part]:
    return [Part(s)] if s else []


def _wild(hint: str, spec: str = "") -> list[Part]:
    return [Part(hint, True, spec)]


_PERCENT = re.compile(r"%(?:\((\w+)\))?[-#0 +]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]")
_BRACE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


class Templater:
    """Turns a message expression into parts, following local names to their assignments."""

    def __init__(self, func: ast.AST | None, module: ast.Module, constant=None, cls_name: str | None = None,
                 bindings: dict[str, list[Part]] | None = None):
        self.func = func
        self.module = module
        self.cls_name = cls_name
        self.bindings = bindings or {}  # parameters of an exception factory, bound to the caller's parts
        self.constant = constant  # name -> value of an imported string constant, or None

    def parts(self, node: ast.AST | None, before_line: int, depth: int = 0) -> list[Part]:
        if node is None or depth > 6:
            return _wild("?")
        if isinstance(node, ast.Constant):
            return _lit(node.value) if isinstance(node.value, str) else _wild(repr(node.value))
        if isinstance(node, ast.JoinedStr):
            out: list[Part] = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    out += _lit(str(v.value))
                elif isinstance(v, ast.FormattedValue):
                    spec = ast.unparse(v.format_spec) if v.format_spec is not None else ""
                    if self.cls_name and ast.unparse(v.value) in ("type(self).__name__", "self.__class__.__name__"):
                        out += _lit(self.cls_name)  # what Python prints inside this class's methods
                        continue
                    if isinstance(v.value, ast.Name) and not spec and v.conversion == -1:
                        got = self._name(v.value.id, before_line, depth + 1)
                        if got and not (len(got) == 1 and got[0].wild and got[0].text == v.value.id):
                            out += got  # a string constant or a local built from one: as Python prints it
                            continue
                    out += _wild(ast.unparse(v.value), "!r" if v.conversion == ord("r") and not spec else spec)
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.parts(node.left, before_line, depth + 1) + self.parts(node.right, before_line, depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            left = self.parts(node.left, before_line, depth + 1)
            if len(left) == 1 and not left[0].wild:
                args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
                return self._percent(left[0].text, [ast.unparse(a) for a in args])
            return left
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr == "format":
                base = self.parts(node.func.value, before_line, depth + 1)
                if len(base) == 1 and not base[0].wild:
                    def arg(a):  # a string constant's text (as format prints it), else the expression
                        got = self.parts(a, before_line, depth + 1) if isinstance(a, (ast.Name, ast.Constant)) else []
                        return Part("".join(p.text for p in got)) if got and all(not p.wild for p in got) \
                            else Part(ast.unparse(a), True)
                    pos = [arg(a) for a in node.args]
                    kw = {k.arg: arg(k.value) for k in node.keywords if k.arg}
                    return self._braces(base[0].text, pos, kw)
                return base
            if attr in ("strip", "lstrip", "rstrip", "dedent") or (
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "textwrap"):
                inner = node.func.value if attr != "dedent" else (node.args[0] if node.args else None)
                got = self.parts(inner, before_line, depth + 1)
                if attr == "dedent":
                    got = [Part(_dedent(p.text), p.wild, p.spec) if not p.wild else p for p in got]
                return got
            if attr == "join" and isinstance(node.func.value, ast.Constant):
                return _wild(ast.unparse(node))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.path.join", "join", "posixpath.join") and node.args:
            out = []
            for i, a in enumerate(node.args):
                out += ([Part("/")] if i else []) + self.parts(a, before_line, depth + 1)
            return out
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
            return self.parts(node.args[0], before_line, depth + 1)
        if isinstance(node, ast.IfExp):
            return self.parts(node.body, before_line, depth + 1)
        if isinstance(node, ast.Name):
            if node.id in self.bindings:
                return list(self.bindings[node.id])
            return self._name(node.id, before_line, depth)
        return _wild(ast.unparse(node))

    def _name(self, name: str, before_line: int, depth: int) -> list[Part]:
        """The value of a local string variable at the site, else of a module-level or imported
        string constant (IMAGE_PLACEHOLDER = os.getenv("IMAGE_PLACEHOLDER", "<image>"))."""
        if self.func is not None:
            assigned: list[tuple[int, str, ast.AST]] = []
            for n in ast.walk(self.func):
                if getattr(n, "lineno", before_line) >= before_line:
                    continue
                if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                    assigned.append((n.lineno, "=", n.value))
                elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name and n.value:
                    assigned.append((n.lineno, "=", n.value))
                elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id == name \
                        and isinstance(n.op, ast.Add):
                    assigned.append((n.lineno, "+=", n.value))
            assigned.sort(key=lambda t: t[0])
            start = max((i for i, (_, op, _) in enumerate(assigned) if op == "="), default=None)
            if start is not None:
                out: list[Part] = []
                for _, _, value in assigned[start:]:
                    out += self.parts(value, before_line, depth + 1)
                return out
        value = _constant_in(self.module, name)
        if value is None and self.constant is not None:
            value = self.constant(name)
        return _lit(value) if value is not None else _wild(name)

    @staticmethod
    def _percent(fmt: str, args: list[str]) -> list[Part]:
        out: list[Part] = []
        pos = 0
        i = 0
        for m in _PERCENT.finditer(fmt):
            out += _lit(fmt[pos:m.start()])
            if m.group(0) == "%%":
                out += _lit("%")
            else:
                hint = m.group(1) or (args[i] if i < len(args) else "?")
                i += 0 if m.group(1) else 1
                out += _wild(hint, m.group(0)[-1])
            pos = m.end()
        out += _lit(fmt[pos:])
        return out

    @staticmethod
    def _braces(fmt: str, pos_args: list[Part], kw: dict[str, Part]) -> list[Part]:
        out: list[Part] = []
        last = 0
        auto = 0
        for m in _BRACE.finditer(fmt):
            out += _lit(fmt[last:m.start()])
            tok = m.group(0)
            if tok in ("{{", "}}"):
                out += _lit(tok[0])
            else:
                field_name, _, spec = (m.group(1) or "").partition(":")
                field_name = field_name.split("!")[0]
                if field_name == "":
                    arg = pos_args[auto] if auto < len(pos_args) else Part("?", True)
                    auto += 1
                elif field_name.isdigit():
                    k = int(field_name)
                    arg = pos_args[k] if k < len(pos_args) else Part("?", True)
                else:
                    arg = kw.get(field_name.split(".")[0].split("[")[0], Part(field_name, True))
                out += [arg] if not arg.wild else _wild(arg.text, spec)
            last = m.end()
        out += _lit(fmt[last:])
        return out


def _constant_value(node: ast.AST | None) -> str | None:
    """A string constant, or the default of os.getenv / os.environ.get."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.getenv", "os.environ.get") \
            and len(node.args) > 1:
        return _constant_value(node.args[1])
    return None


def _constant_in(module: ast.Module, name: str) -> str | None:
    """The value of a top-level string constant of a module (its last assignment: DeepSpeed's
    constants.py documents a name in a string assigned to it first)."""
    value = None
    for n in module.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            value = _constant_value(n.value)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name:
            value = _constant_value(n.value)
    return value


def _dedent(s: str) -> str:
    import textwrap
    return textwrap.dedent(s)


def _merge(parts: list[Part]) -> list[Part]:
    out: list[Part] = []
    for p in parts:
        if out and not p.wild and not out[-1].wild:
            out[-1] = Part(out[-1].text + p.text)
        else:
            out.append(p)
    return out


def template_regex(parts: list[Part]) -> str:
    """The template as a regex: literal text escaped, each interpolation a lazy wildcard."""
    return "".join(".+?" if p.wild else re.escape(p.text) for p in parts)


def template_text(parts: list[Part]) -> str:
    return "".join("{…}" if p.wild else p.text for p in parts)


# Plausible values for interpolations, chosen from the expression's own words: first from its
# last name (`finetuning_args.freeze_trainable_layers` -> "freeze_trainable_layers"), then from the
# whole expression.
_FILL_RULES: list[tuple[re.Pattern[str], str]] = [(re.compile(p, re.I), v) for p, v in [
    (r"version", "0.14.0"),
    (r"stage", "3"),
    (r"dtype", "torch.float16"),
    (r"device\.type", "cpu"),
    (r"device_name|device_type", "cuda"),
    (r"device$|^device", "cuda:0"),
    (r"backend", "nccl"),
    (r"port", "29500"),
    (r"addr|host|endpoint", "10.0.0.1"),
    (r"url|init_method", "tcp://10.0.0.1:29500"),
    (r"timeout|seconds|elapsed|^time$|_time$", "1800"),
    (r"returncode|exitcode|exit_code|^code$", "1"),
    (r"^cmd$|^command$", "['/opt/venv/bin/python', '-u', 'train.py', '--local_rank=0']"),
    (r"template", "qwen"),
    (r"unknown_args|remaining|unused", "['--lora_rnak', '8']"),
    (r"_dir$|_path$", "/data/ckpt"),
    (r"dataset|data_name", "alpaca_en_demo"),
    (r"finetuning_type|ft_type", "lora"),
    (r"model_type|arch", "llama"),
    (r"optimizer|optim", "adamw_torch"),
    (r"scheduler", "cosine"),
    (r"name_or_path|model_name", "Qwen/Qwen2.5-7B-Instruct"),
    (r"path|dir|file|folder|checkpoint|ckpt", "/data/ckpt/checkpoint-100"),
    (r"shape", "torch.Size([4096, 4096])"),
    (r"ds_summary", "{'id': 1, 'status': 'INFLIGHT', 'numel': 4096, 'ds_numel': 4096, 'persist': False}"),
    (r"pid$|_id$|^id$|offset|nodes|rank|world|size|num|count|steps|len$|^len|numel|gas|micro|batch|idx|index|^i$|^n$|bytes|bucket|layers|devices|workers|total|degree|sz$", "8"),
    (r"dict|config|kwargs|^args$", "{'train_batch_size': 'auto'}"),
    (r"^exc|^err|^e$", "RuntimeError('boom')"),
    (r"key|name|param|field|arg|attr|option|mode|method|role|kind|module", "lora_target"),
]]


def fill_value(part: Part) -> str:
    if part.spec == "!r":
        value = fill_value(Part(part.text, True))
        return value if value[:1] in "'\"[({<" or value.isdigit() else repr(value)
    spec = part.spec
    if spec and spec[-1:] in "dioxX":
        return "8"
    if spec and spec[-1:] in "eEfFgG%":
        return "0.5"
    text = part.text
    if re.match(r"(?:len|sum|int|max|min)\(", text) or re.search(r"\.(?:numel|size|dim)\(", text):
        return "8"
    if re.match(r"type\(", text) or text.endswith(("__class__", "__name__", "__qualname__")):
        return "<class 'str'>"
    if ".join(" in text:
        return "json,jsonl"
    names = re.findall(r"[A-Za-z_]\w*", text)
    for key in ([names[-1]] if names else []) + [text]:
        for pattern, value in _FILL_RULES:
            if pattern.search(key):
                return value
    return "value"


_MUST_BE_POSITIVE = re.compile(r"^\W{0,3}(?:has to be|must be|should be) (?:greater than (?:0|zero)|> ?0|positive)")


def fill(parts: list[Part]) -> str:
    """The message with plausible values; a value the message says must be positive is the 0 that
    made it fail."""
    out = []
    for i, p in enumerate(parts):
        if not p.wild:
            out.append(p.text)
            continue
        nxt = parts[i + 1].text if i + 1 < len(parts) and not parts[i + 1].wild else ""
        out.append("0" if _MUST_BE_POSITIVE.search(nxt) else fill_value(p))
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Sites.


@dataclass
class Site:
    group: str
    file: str  # relative to site-packages
    line: int
    function: str  # Class.method, or <module>
    kind: str  # raise, assert, log
    exc_type: str  # exception type as Python prints it; for logs the level
    template: str  # readable template, {…} for interpolations
    regex: str  # the template as a regex
    message: str  # the message with plausible values filled in
    source: str  # the first source line of the site
    excluded: str | None = None
    code: str | None = None  # catalog code of the first diagnosis, when it rests on the site's own message
    first_diagnosis: str | None = None  # the first diagnosis whatever it rests on
    diagnoses: list[str] = field(default_factory=list)
    evidence: str = ""  # the evidence line the first diagnosis points at
    launcher_side: bool = False
    validator: str | None = None  # pydantic model/field when raised inside a validator
    log: str = ""  # the log that was explained

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


_LOGGER_NAMES = re.compile(r"(?:^|\.)(?:_?logger|log|_log|LOG|logging|LOGGER|self\.logger)$")
_LOG_METHODS = {"error": "ERROR", "critical": "CRITICAL", "exception": "ERROR", "error_rank0": "ERROR",
                "fatal": "CRITICAL"}


def _import_table(module: ast.Module, modname: str) -> dict[str, str]:
    """Name -> defining module as far as the file's imports tell; `from m import *` modules are
    listed under the key "*" (separated by spaces)."""
    table: dict[str, str] = {}
    stars: list[str] = []
    for n in ast.walk(module):
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = modname.split(".")
                base = ".".join(parts[:len(parts) - n.level] + ([n.module] if n.module else []))
            for a in n.names:
                if a.name == "*":
                    stars.append(base)
                else:
                    table[a.asname or a.name] = base
    for n in module.body:
        if isinstance(n, ast.ClassDef):
            table[n.name] = modname
    if stars:
        table["*"] = " ".join(stars)
    return table


def _exc_type(node: ast.AST, imports: dict[str, str]) -> str:
    """The exception's name as Python prints it: builtins bare, others module-qualified."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        name = target.id
        if name in ("EnvironmentError", "IOError"):
            return "OSError"  # aliases: Python prints OSError
        if name in vars(builtins):
            return name
        mod = imports.get(name)
        return f"{mod}.{name}" if mod else name
    if isinstance(target, ast.Attribute):
        text = ast.unparse(target)
        head = text.split(".")[0]
        if head in imports:
            return f"{imports[head]}.{text}" if not imports[head].endswith(head) else text
        return text
    return ast.unparse(target)


def _message_arg(call: ast.Call) -> ast.AST | None:
    if call.args:
        return call.args[0]
    for k in call.keywords:
        if k.arg in ("msg", "message", "reason", "error_msg", "err_msg", "errmsg"):
            return k.value
    return None


_ABSTRACT_WORDS = re.compile(r"implement|subclass|abstract|override|must be defined|derived class", re.I)


def _is_abstract(func: ast.AST | None, node: ast.AST, literal: str) -> bool:
    """NotImplementedError as the whole body of a method, with no message or one that asks for an override."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and body[0] is node and (not literal.strip() or bool(_ABSTRACT_WORDS.search(literal)))


def _validator(func: ast.AST | None, cls: ast.ClassDef | None) -> str | None:
    """'Model' or 'Model.field' when func is a pydantic validator (its errors reach the user as
    a ValidationError)."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or cls is None:
        return None
    for d in func.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = ast.unparse(target).split(".")[-1]
        if name in ("field_validator", "validator"):
            fields = [a.value for a in getattr(d, "args", []) if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            return f"{cls.name}.{fields[0]}" if fields else cls.name
        if name in ("model_validator", "root_validator"):
            return cls.name
    return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, group: str, rel: str, spec: Spec, module: ast.Module, lines: list[str]):
        self.group, self.rel, self.spec, self.module, self.lines = group, rel, spec, module, lines
        modname = rel[:-3].replace("/", ".")
        if modname.endswith(".__init__"):
            modname = modname[: -len(".__init__")]
        self.imports = _import_table(module, modname)
        self.root: Path | None = None
        self.stack: list[ast.AST] = []  # enclosing classes and functions
        self.guards: list[str] = []  # tests of enclosing if statements
        self.handlers: list[set[str]] = []  # names bound by enclosing except clauses
        self.sites: list[Site] = []

    # scopes
    def visit_ClassDef(self, node):
        self.stack.append(node)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node):
        self.stack.append(node)
        saved, self.guards = self.guards, []
        self.generic_visit(node)
        self.guards = saved
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):
        # only a guard that holds on the path to the site counts as "mentioning DeepSpeed":
        # `if ds_enabled: raise` yes; the else branch of `if ds_enabled`, or `if not ds_enabled`, no
        self.visit(node.test)
        test = ast.unparse(node.test)
        positive = not (isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not))
        self.guards.append(test if positive else "")
        for s in node.body:
            self.visit(s)
        self.guards.pop()
        self.guards.append("")
        for s in node.orelse:
            self.visit(s)
        self.guards.pop()

    def visit_ExceptHandler(self, node):
        self.handlers.append({node.name} if node.name else set())
        self.generic_visit(node)
        self.handlers.pop()

    def constant(self, name: str) -> str | None:
        """An imported module's string constant (read from its source under root)."""
        if self.root is None:
            return None
        mod = self.imports.get(name)
        if mod:
            return _module_constant(self.root, mod, name)
        for star in self.imports.get("*", "").split():
            value = _module_constant(self.root, star, name)
            if value is not None:
                return value
        return None

    def templater(self) -> "Templater":
        cls = self._cls()
        return Templater(self._func(), self.module, self.constant, cls.name if cls is not None else None)

    # helpers
    def _func(self):
        return next((n for n in reversed(self.stack) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)

    def _cls(self):
        return next((n for n in reversed(self.stack) if isinstance(n, ast.ClassDef)), None)

    def _qualname(self) -> str:
        names = [n.name for n in self.stack]
        return ".".join(names) if names else "<module>"

    def _add(self, node, kind, exc_type, parts: list[Part] | None, excluded: str | None = None):
        parts = _merge(parts or [])
        qual = self._qualname()
        if self.spec.classes and not any(isinstance(n, ast.ClassDef) and n.name in self.spec.classes for n in self.stack):
            return
        if self.spec.only_deepspeed:
            context = " ".join([template_text(parts), qual, *self.guards])
            if not _DS_WORDS.search(context):
                return
        literal = "".join(p.text for p in parts if not p.wild)
        func = self._func()
        if excluded is None:
            if any(self.rel.endswith(t) for t in TEST_HELPERS):
                excluded = "test-helper"
            elif OTHER_ACCELERATOR_DIRS.search(self.rel) or OTHER_ACCELERATOR_WORDS.search(literal):
                excluded = "other-accelerator"
            elif func is not None and re.match(r"_?register", func.name) and re.search(r"already", literal, re.I):
                excluded = "registry-definition"
            elif exc_type.split(".")[-1] in CONTROL_FLOW:
                excluded = "control-flow"
            elif exc_type == "NotImplementedError" and _is_abstract(self._func(), node, literal):
                excluded = "abstract"
            elif len(re.sub(r"[\W_]+", "", literal)) < 3:
                excluded = "no-static-message"
            elif INTERNAL_WORDS.search(literal) or any(
                    f in self.rel and re.search(r, literal) for f, r, _ in KNOWN_INTERNAL):
                excluded = "internal-invariant"
            elif exc_type == "TypeError" and self._func() is not None and self._func().name.startswith("_") \
                    and not self._func().name.startswith("__") and TYPE_WORDS.search(literal):
                excluded = "private-type-check"
        src = self.lines[node.lineno - 1].strip() if node.lineno - 1 < len(self.lines) else ""
        self.sites.append(Site(
            group=self.group, file=self.rel, line=node.lineno, function=qual, kind=kind, exc_type=exc_type,
            template=template_text(parts), regex=template_regex(parts), message=fill(parts), source=src,
            excluded=excluded, launcher_side=self.spec.launcher_side,
            validator=_validator(self._func(), self._cls()) if kind != "log" else None,
        ))

    def _version_check(self, node, requirement: str, fname: str) -> None:
        """A dependency check: the ImportError transformers' require_version raises through it."""
        mandatory = any(k.arg == "mandatory" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
        hint = None
        if fname == "require_version":
            h = node.args[1] if len(node.args) > 1 else None
            hint = "".join(p.text for p in self.templater().parts(h, node.lineno)) if h is not None else ""
        exc, msg = version_check_message(requirement, mandatory or fname == "require_version", hint)
        self._add(node, "version-check", exc, [Part(msg)])

    # sites
    def visit_Raise(self, node):
        self.generic_visit(node)
        exc = node.exc
        if exc is None:
            return self._add(node, "raise", "<re-raise>", [], "reraise")
        caught = set().union(*self.handlers) if self.handlers else set()
        if isinstance(exc, ast.Name) and (exc.id in caught or exc.id[:1].islower()):
            return self._add(node, "raise", "<re-raise>", [], "reraise")
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Attribute) and exc.func.attr == "with_traceback":
            return self._add(node, "raise", "<re-raise>", [], "reraise")
        made = self._factory(exc, node.lineno) if isinstance(exc, ast.Call) else None
        if made is not None:
            return self._add(node, "raise", *made)
        exc_type = _exc_type(exc, self.imports)
        if isinstance(exc, ast.Call):
            arg = _message_arg(exc)
            parts = self.templater().parts(arg, node.lineno) if arg is not None else []
        else:
            parts = []
        self._add(node, "raise", exc_type, parts)

    def _function_named(self, name: str) -> ast.FunctionDef | None:
        """A def of this name in an enclosing function or at module level."""
        for scope in [*(n for n in reversed(self.stack) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                      self.module]:
            for n in scope.body:
                if isinstance(n, ast.FunctionDef) and n.name == name:
                    return n
        return None

    def _factory(self, call: ast.Call, line: int, templ: "Templater | None" = None, depth: int = 0):
        """`raise _error("path missing")` where _error is a helper that returns an exception:
        the (type, parts) the helper builds, its parameters bound to the caller's arguments."""
        if depth > 3 or not isinstance(call.func, ast.Name) or call.func.id in vars(builtins):
            return None
        fdef = self._function_named(call.func.id)
        if fdef is None:
            return None
        body = [b for b in fdef.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
            return None
        templ = templ or self.templater()
        params = [a.arg for a in fdef.args.args]
        bindings = {p: templ.parts(a, line) for p, a in zip(params, call.args)}
        inner = Templater(fdef, self.module, self.constant, templ.cls_name, bindings)
        ret = body[0].value
        deeper = self._factory(ret, line, inner, depth + 1)
        if deeper is not None:
            return deeper
        arg = _message_arg(ret)
        return _exc_type(ret, self.imports), (inner.parts(arg, line) if arg is not None else [])

    def visit_Assert(self, node):
        self.generic_visit(node)
        parts = self.templater().parts(node.msg, node.lineno) if node.msg is not None else []
        self._add(node, "assert", "AssertionError", parts)

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if fname in ("check_version", "require_version") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            return self._version_check(node, node.args[0].value, fname)
        if not (isinstance(f, ast.Attribute) and f.attr in _LOG_METHODS):
            return
        owner = ast.unparse(f.value)
        if not _LOGGER_NAMES.search(owner):
            return
        arg = node.args[0] if node.args else None
        templ = self.templater()
        parts = templ.parts(arg, node.lineno) if arg is not None else []
        if len(parts) == 1 and not parts[0].wild and len(node.args) > 1 and "%" in parts[0].text:
            parts = templ._percent(parts[0].text, [ast.unparse(a) for a in node.args[1:]])
        self._add(node, "log", _LOG_METHODS[f.attr], parts)


def _violating_version(spec: str) -> str:
    """A version outside the requirement's range (what a user with the wrong install has)."""
    from packaging.version import Version
    bounds = re.findall(r"(<=|<|>=|>|==|~=)\s*([\d.]+)", spec)
    for op, v in bounds:
        if op in ("<=", "<"):
            parts = Version(v).release + (0,)
            return f"{parts[0]}.{parts[1] + 1}.0" if op == "<=" or len(parts) > 1 else f"{parts[0] + 1}.0.0"
    for op, v in bounds:
        if op in (">=", ">", "==", "~="):
            parts = Version(v).release + (0, 0)
            return f"{parts[0]}.{max(parts[1] - 1, 0)}.0" if parts[1] else f"{max(parts[0] - 1, 0)}.9.0"
    return "0.0.1"


def version_check_message(requirement: str, mandatory: bool, hint: str | None = None) -> tuple[str, str]:
    """(exception type, message) that transformers' require_version raises through LLaMA-Factory's
    check_version: a version outside the range when the requirement has one, else a missing package."""
    m = re.match(r"^([\w.\-\[\]]+)\s*(.*)$", requirement.strip())
    pkg, spec = (m.group(1), m.group(2)) if m else (requirement, "")
    pip = f"pip install {requirement}" + (" --no-build-isolation" if "gptmodel" in requirement or "autoawq" in requirement else "")
    if hint is None:
        hint = f"To fix: run `{pip}`." if mandatory else \
            f"To fix: run `{pip}` or set `DISABLE_VERSION_CHECK=1` to skip this check."
    if spec:
        return "ImportError", (f"{requirement} is required for a normal functioning of this module, but found "
                               f"{pkg}=={_violating_version(spec)}.\n{hint}")
    return ("importlib.metadata.PackageNotFoundError",
            f"The '{requirement}' distribution was not found and is required by this application. \n{hint}")


_MODULES: dict[tuple[str, str], ast.Module | None] = {}


def _module_constant(root: Path, modname: str, name: str) -> str | None:
    key = (str(root), modname)
    if key not in _MODULES:
        base = root / modname.replace(".", "/")
        tree = None
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                try:
                    tree = ast.parse(path.read_text(encoding="utf-8"))
                except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                    tree = None
                break
        _MODULES[key] = tree
    tree = _MODULES[key]
    return _constant_in(tree, name) if tree is not None else None


def site_packages(python: str | None = None) -> Path:
    if python is None:
        import sysconfig
        return Path(sysconfig.get_paths()["purelib"])
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60, check=True)
    return Path(out.stdout.strip())


def _files(root: Path, spec: Spec) -> list[Path]:
    if "**" in spec.pattern:
        base, _, rest = spec.pattern.partition("/**/")
        d = root / base
        return sorted(p for p in d.rglob(rest) if "__pycache__" not in p.parts) if d.is_dir() else []
    p = root / spec.pattern
    return [p] if p.is_file() else []


def collect(root: Path, group: Group) -> list[Site]:
    """Every error site of one group under root (site-packages or any directory of packages)."""
    sites: list[Site] = []
    seen: set[str] = set()
    for spec in group.specs:
        for path in _files(root, spec):
            rel = path.relative_to(root).as_posix()
            if rel in seen:
                continue
            seen.add(rel)
            try:
                text = path.read_text(encoding="utf-8")
                module = ast.parse(text, filename=str(path))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            v = _Visitor(group.name, rel, spec, module, text.splitlines())
            v.root = root
            v.visit(module)
            sites.extend(v.sites)
    return sites


# --------------------------------------------------------------------------------------------
# The log a site prints, and the matcher's verdict on it.

SITE_ROOT = "/opt/conda/lib/python3.11/site-packages"
_LAUNCH_EXIT = ("E0101 10:00:09.000000 4000 torch/distributed/elastic/multiprocessing/api.py:869] "
                "failed (exitcode: 1) local_rank: 0 (pid: 4021) of binary: /opt/conda/bin/python3.11")
# By default a rank's log ends with torchrun's line for the failed rank (an excerpt as users paste
# it); with --full-summary torchrun's own traceback and ChildFailedError summary follow, as in a
# whole log. The matcher prefilters every new line against every pattern, so the summary's ~20
# salient lines make each site 3x slower; the verdicts are compared in tests/test_raise_sites.py.
_TORCHRUN_TRACEBACK = """Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 143, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 277, in launch_agent
    raise ChildFailedError("""
_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/conda/lib/python3.11/site-packages/llamafactory/launcher.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-01-01_10:00:09
  host      : gpu-node-1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4021)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""
FULL_SUMMARY = False


def _printed_exception(site: Site) -> list[str]:
    """The exception line(s) as Python's traceback printer writes them."""
    msg = site.message
    exc = site.exc_type
    if site.validator:
        model, _, fieldname = site.validator.partition(".")
        label = "Assertion failed" if site.kind == "assert" or exc == "AssertionError" else "Value error"
        head = [f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}"]
        if fieldname:
            head.append(fieldname)
        first, *rest = msg.split("\n")
        head.append(f"  {label}, {first}" + ("" if rest else " [type=value_error, input_value={}, input_type=dict]"))
        head += [f"  {r}" for r in rest]
        return head
    if exc.split(".")[-1] == "KeyError":
        msg = repr(msg)
    first, *rest = msg.split("\n")
    return [f"{exc}: {first}" if first else exc, *rest]


def _log_line(site: Site) -> str:
    rel = site.file
    base = os.path.basename(rel)
    func = site.function.split(".")[-1]
    if rel.startswith("llamafactory/"):
        name = rel[:-3].replace("/", ".")
        return f"[{site.exc_type}|2025-01-01 10:00:05] {name}:{site.line} >> {site.message}"
    if rel.startswith(("transformers/", "accelerate/")):
        return f"[{site.exc_type}|{base}:{site.line}] 2025-01-01 10:00:05,000 >> {site.message}"
    if rel.startswith(("deepspeed/", "op_builder/")):
        return f"[2025-01-01 10:00:05,000] [{site.exc_type}] [{base}:{site.line}:{func}] {site.message}"
    return f"E0101 10:00:05.000000 4000 {rel}:{site.line}] {site.message}"


def build_log(site: Site) -> str:
    """A minimal realistic log of the run that hit this site."""
    if site.kind == "log":
        first, *rest = site.message.split("\n")
        lines = [_log_line(Site(**{**asdict(site), "message": first})), *rest]
        if not site.launcher_side:
            lines += [_LAUNCH_EXIT]
        return "\n".join(lines) + "\n"
    frame = [
        f'  File "{SITE_ROOT}/{site.file}", line {site.line}, in {site.function.split(".")[-1]}',
        f"    {site.source}",
    ]
    exc_lines = _printed_exception(site)
    if site.launcher_side:
        entry = ('  File "/opt/conda/bin/torchrun", line 8, in <module>' if site.file.startswith("torch/")
                 else '  File "/opt/conda/bin/deepspeed", line 6, in <module>')
        body = ["Traceback (most recent call last):", entry, "    sys.exit(main())", *frame, *exc_lines]
        return "\n".join(body) + "\n"
    entry = [f'  File "{SITE_ROOT}/llamafactory/launcher.py", line 23, in <module>', "    launch()"]
    body = ["Traceback (most recent call last):", *entry, *frame, *exc_lines]
    tail = [_LAUNCH_EXIT, *([_TORCHRUN_TRACEBACK, _SUMMARY] if FULL_SUMMARY else [])]
    return "\n".join(f"[rank0]: {ln}" for ln in body) + "\n" + "\n".join(tail) + "\n"


def own_lines(site: Site) -> list[str]:
    """The lines of the log that carry the site's own message (as explain reports evidence)."""
    if site.kind == "log":
        first, *rest = site.message.split("\n")
        return [_log_line(Site(**{**asdict(site), "message": first})).strip(), *(r.strip() for r in rest)]
    return [ln.strip() for ln in _printed_exception(site)]


def _verdict(site: Site) -> tuple[list[str], str | None, str]:
    """(diagnosis codes, code when it rests on the site's own line, evidence) for one site."""
    from mgft_doctor.explain import explain_text

    report = explain_text(build_log(site))
    codes = [d.code for d in report.diagnoses]
    if not report.diagnoses:
        return codes, None, ""
    evidence = [ln.text.strip() for ln in report.diagnoses[0].evidence]
    own = {ln for ln in own_lines(site) if ln}
    hit = next((e for e in evidence if e in own), None)
    return codes, (codes[0] if hit is not None else None), (hit or (evidence[0] if evidence else ""))[:300]


def _verdicts(sites: list[Site]) -> list[tuple[list[str], str | None, str]]:
    return [_verdict(s) for s in sites]


def match_sites(sites: list[Site], jobs: int = 1) -> None:
    """Explain each site's log with the real matcher. A site is matched when the first diagnosis
    is a catalog code whose evidence includes the site's own message line; a first diagnosis
    that rests only on other lines (the exit code of a generic 'rank exited' entry, a context
    line) is recorded in first_diagnosis but does not count. jobs > 1 explains in forked workers."""
    if jobs > 1 and len(sites) > 50 and "fork" in __import__("multiprocessing").get_all_start_methods():
        import multiprocessing

        from mgft_doctor.explain import explain_text  # noqa: F401  (loaded once, shared by the forks)

        chunks = [sites[i::jobs] for i in range(jobs)]
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_verdicts, chunks)
        verdicts: dict[int, tuple] = {}
        for i, chunk_result in enumerate(results):
            for j, v in enumerate(chunk_result):
                verdicts[i + j * jobs] = v
        ordered = [verdicts[k] for k in range(len(sites))]
    else:
        ordered = _verdicts(sites)
    for site, (codes, code, evidence) in zip(sites, ordered):
        site.log = build_log(site)
        site.diagnoses = codes
        site.first_diagnosis = codes[0] if codes else None
        site.code = code
        site.evidence = evidence


def summarise(sites: list[Site]) -> dict[str, dict[str, int]]:
    """Per group: total sites, matched (of those not excluded), excluded, and the exclusions by reason."""
    out: dict[str, dict] = {}
    for s in sites:
        g = out.setdefault(s.group, {"total": 0, "matched": 0, "excluded": 0, "excluded_by": {}})
        g["total"] += 1
        if s.excluded:
            g["excluded"] += 1
            g["excluded_by"][s.excluded] = g["excluded_by"].get(s.excluded, 0) + 1
        elif s.code:
            g["matched"] += 1
    return out


def coverage(summary: dict) -> float:
    considered = summary["total"] - summary["excluded"]
    return summary["matched"] / considered if considered else 1.0


def run(root: Path, groups: list[Group], jobs: int = 1) -> list[Site]:
    """Collect the groups' sites under root and explain the ones not excluded."""
    sites: list[Site] = []
    for g in groups:
        sites += collect(root, g)
    match_sites([s for s in sites if not s.excluded], jobs)
    return sites


# --------------------------------------------------------------------------------------------
# CLI.


def _print_human(sites: list[Site], summary: dict, unmatched_only: bool, root: Path, elapsed: float) -> None:
    for name, g in summary.items():
        mine = [s for s in sites if s.group == name and not s.excluded and (not unmatched_only or not s.code)]
        print(f"\n== {name}: {g['matched']}/{g['total'] - g['excluded']} matched "
              f"({coverage(g):.0%}), {g['excluded']} excluded of {g['total']}")
        if mine:
            w = max(len(s.where) for s in mine)
            for s in mine:
                exc = s.exc_type.split(".")[-1]
                code = s.code or (f"({s.first_diagnosis})" if s.first_diagnosis else "-")
                print(f"  {s.where:<{w}}  {code:<8} {s.function[:40]:<40} {exc[:24]:<24} {s.template[:110]!r}")
    print("\nsummary")
    for name, g in summary.items():
        by = ", ".join(f"{k} {v}" for k, v in sorted(g["excluded_by"].items()))
        print(f"  {name:<18} total {g['total']:>4}  excluded {g['excluded']:>4}  matched {g['matched']:>4}/"
              f"{g['total'] - g['excluded']:<4} {coverage(g):6.1%}   excluded: {by or 'none'}")
    print(f"  scanned {root} in {elapsed:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the groups' figures and every site as JSON")
    ap.add_argument("--group", action="append", choices=sorted(GROUPS), help="only this group (repeatable)")
    ap.add_argument("--unmatched", action="store_true", help="list only the sites no catalog entry matches")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--python", help="the examined interpreter (default: this one)")
    where.add_argument("--site-packages", help="a site-packages directory to read directly")
    ap.add_argument("--full-summary", action="store_true",
                    help="put torchrun's own traceback above its ChildFailedError summary in every rank log (slower)")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="worker processes for the matching (default: min(4, CPUs))")
    ap.add_argument("--show-excluded", action="store_true", help="list the excluded sites too (human output)")
    args = ap.parse_args(argv)
    global FULL_SUMMARY
    FULL_SUMMARY = args.full_summary
    t0 = time.perf_counter()
    root = Path(args.site_packages) if args.site_packages else site_packages(args.python)
    groups = [GROUPS[g] for g in (args.group or GROUPS)]
    sites = run(root, groups, max(1, args.jobs))
    summary = summarise(sites)
    elapsed = time.perf_counter() - t0
    if args.json:
        shown = [s for s in sites if not args.unmatched or (not s.excluded and not s.code)]
        rows = []
        for s in shown:
            d = asdict(s)
            d.pop("log")
            d.pop("launcher_side")
            d["where"] = s.where
            rows.append(d)
        print(json.dumps({"site_packages": str(root),
                          "groups": {k: {"total": v["total"], "matched": v["matched"], "excluded": v["excluded"],
                                         "excluded_by": v["excluded_by"]} for k, v in summary.items()},
                          "exclusion_rules": EXCLUSION_RULES, "sites": rows}, indent=1))
    else:
        _print_human(sites, summary, args.unmatched, root, elapsed)
        if args.show_excluded:
            print("\nexcluded sites")
            for s in sites:
                if s.excluded:
                    print(f"  {s.where}  {s.excluded:<20} {s.exc_type.split('.')[-1]:<22} {s.template[:100]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
