"""What explain can still say when no catalog entry knows the error: the frame that raised it
(the user's code or a library's, file:line and function), the YAML key the message names, and
next steps that fit the kind of error (a data error gets no NCCL advice)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .argnames import yaml_key
from .failures import FailureEvent, logged_message, logged_origin
from .lines import LogLine

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# Frames that only pass a call on (decorators, module __call__, launch wrappers): never "the
# frame that raised it".
WRAPPER_FRAMES = re.compile(
    r"<frozen runpy>|/runpy\.py$|/functools\.py$|/contextlib\.py$|"
    r"torch/distributed/elastic/multiprocessing/errors/__init__\.py$|torch/distributed/c10d_logger\.py$|"
    r"torch/nn/modules/module\.py$|torch/utils/_contextlib\.py$|torch/_dynamo/eval_frame\.py$|torch/_compile\.py$|"
    r"deepspeed/utils/nvtx\.py$|accelerate/utils/operations\.py$|accelerate/hooks\.py$|"
    r"transformers/utils/generic\.py$|transformers/modeling_layers\.py$"
)
LIBRARY_PATH = re.compile(
    r"site-packages/|dist-packages/|/lib/python3\.\d+/|^<frozen |/bin/(?:torchrun|deepspeed|accelerate|llamafactory-cli|lmf)$|"
    r"/(?:llamafactory|transformers|deepspeed|torch|accelerate|peft|trl|datasets|tokenizers|bitsandbytes)/"
)
_PACKAGE = re.compile(r"(?:site-packages|dist-packages)/([A-Za-z_][\w]*)|/(llamafactory|transformers|deepspeed|torch|accelerate|peft|trl|datasets)/")
_LLAMAFACTORY = re.compile(r"/llamafactory/|/llmtuner/|llamafactory-cli")
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'|cannot import name '(\w+)' from '([\w.]+)'|module '([\w.]+)' has no attribute")


@dataclass
class Frame:
    file: str
    line: int
    function: str
    library: bool
    text: LogLine | None = None
    logged_by: str | None = None  # the package whose logger printed the error (no traceback: its location field)

    @property
    def package(self) -> str | None:
        if self.logged_by:
            return self.logged_by
        m = _PACKAGE.search(self.file)
        return (m.group(1) or m.group(2)) if m else None

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function, "library": self.library}

    def where(self) -> str:
        return f"{self.file}:{self.line}" + (f" in {self.function}" if self.function else "")


@dataclass
class Advice:
    frame: Frame | None
    caller: Frame | None  # the user's own last frame, when a library raised
    yaml_key: str | None
    kind: str
    next_steps: list[str]


def parse_frame(line: LogLine) -> Frame | None:
    m = _FRAME.search(line.text)
    if m is None:
        return None
    path = m.group("file")
    return Frame(path, int(m.group("line")), m.group("func"), bool(LIBRARY_PATH.search(path)), line)


def failing_frame(frames: list[LogLine]) -> tuple[Frame | None, Frame | None]:
    """The last frame that is not a wrapper, and (when it is a library's) the user's last frame."""
    parsed = [f for f in (parse_frame(ln) for ln in frames) if f is not None]
    real = [f for f in parsed if not WRAPPER_FRAMES.search(f.file)]
    if not real:
        return None, None
    frame = real[-1]
    caller = next((f for f in reversed(real) if not f.library), None) if frame.library else None
    return frame, caller


def logged_frame(line: LogLine) -> Frame | None:
    """The place a logged error names (its logger's location field) as a frame; a package's logger
    (DeepSpeed, LLaMA-Factory, transformers, torch's c10d) means library code."""
    origin = logged_origin(line.text)
    if origin is None:
        return None
    file, no, func, package = origin
    return Frame(file, no, func, package in KNOWN_PACKAGES, line, logged_by=package)


KNOWN_PACKAGES = {"llamafactory", "transformers", "deepspeed", "torch", "accelerate", "peft", "trl", "datasets"}


def advise(root: FailureEvent | None, root_line: LogLine | None, kind: str | None, phase: str | None,
           consequences: list[LogLine], llamafactory: bool = False) -> Advice:
    """llamafactory: the log shows a LLaMA-Factory run (its version or its frames), so steps may
    name its YAML keys and dataset_info.json."""
    frames = root.traceback.frames if root is not None and root.traceback is not None else []
    frame, caller = failing_frame(frames)
    if frame is None and root is not None and root.kind == "logged":
        frame = logged_frame(root.line)
    text = root_line.text.strip() if root_line is not None else ""
    if root is not None and root.kind == "logged":
        text = logged_message(text)  # what the logger said, not when and where: the kind is read from it
    key = yaml_key(text)
    error_kind = classify(text, kind, frame, phase)
    lf = llamafactory or any(_LLAMAFACTORY.search(f.text) for f in frames) or key is not None
    steps = next_steps(error_kind, text, frame, caller, key, consequences, phase, lf)
    return Advice(frame, caller, key, error_kind, steps)


# (kind, test on the root line's text); the first that holds names the kind. Root kinds from
# failures.py (compiler, oom-killer, signal, exit, cli, nccl, cuda) are read first.
_KIND_TEXT: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu-memory", re.compile(r"CUDA out of memory|OutOfMemoryError|HIP out of memory")),
    ("host-memory", re.compile(r"exitcode\s*:?\s*-9\b|exit code -9\b|return code = -9\b|^Killed\b|Out of memory: Kill|oom-kill")),
    ("stopped", re.compile(r"SignalException: Process \d+ got signal: (?:15|2|1)\b|Signal (?:15|2|1) \(SIG(?:TERM|INT|HUP)\) received")),
    ("crash", re.compile(r"exitcode\s*:?\s*-(?:11|6|7)\b|return code = -(?:11|6|7)\b|Segmentation fault|Bus error|Fatal Python error|^Aborted")),
    ("cuda", re.compile(r"CUDA error|CUBLAS_STATUS|CUDNN_STATUS|cudaError|device-side assert|no CUDA GPUs|invalid device ordinal")),
    ("import", re.compile(r"^(?:[\w.]+\.)?(?:ModuleNotFoundError|ImportError)\b|cannot import name|No module named|"
                          r"^AttributeError: module '[\w.]+' has no attribute")),
    ("distributed", re.compile(r"NCCL|ProcessGroup|DistBackendError|DistNetworkError|DistStoreError|\bc10d\b|gloo|"
                               r"Socket Timeout|rendezvous|Rendezvous|TCPStore")),
)
_DATA_FRAMES = re.compile(r"llamafactory/data/|/datasets/|/pyarrow/|/tokenizers/|tokenization_utils")
_DATA_WORDS = re.compile(r"\bdataset|dataset_info|\btemplate\b|\bcolumns?\b|\bsample\b|\bexamples?\b|input_ids|\blabels\b|tokeni[sz]")
_CONFIG_FRAMES = re.compile(r"llamafactory/hparams/|transformers/(?:training_args|hf_argparser|integrations/deepspeed)\.py|"
                            r"accelerate/(?:accelerator|utils/dataclasses|state)\.py|deepspeed/runtime/(?:config|zero/config)\.py")
_FILES = re.compile(r"FileNotFoundError|No such file or directory|does not appear to have a file named|Can't load|"
                    r"is not a valid model identifier|not a local folder")
_DATA_TYPES = re.compile(r"^(?:[\w.]+\.)?(?:KeyError|ValueError|IndexError|TypeError|AssertionError|ArrowInvalid|"
                         r"ArrowTypeError|DatasetGenerationError|JSONDecodeError|UnicodeDecodeError|SchemaInferenceError|StopIteration)\b")


def classify(text: str, root_kind: str | None, frame: Frame | None, phase: str | None) -> str:
    """The kind of error, which decides the next steps."""
    if root_kind == "compiler":
        return "build"
    if root_kind == "cli":
        return "command-line"
    if root_kind == "oom-killer":
        return "host-memory"
    for kind, pattern in _KIND_TEXT:
        if pattern.search(text):
            return kind
    if root_kind == "nccl":
        return "distributed"
    in_data = frame is not None and bool(_DATA_FRAMES.search(frame.file))
    if _DATA_TYPES.match(text) and (in_data or phase == "data loading" or
                                    (_DATA_WORDS.search(text) and not (frame and _CONFIG_FRAMES.search(frame.file)))):
        return "data"
    if frame is not None and _CONFIG_FRAMES.search(frame.file) or (yaml_key(text) and phase == "start-up"):
        return "config"
    if _FILES.search(text):
        return "files"
    if frame is not None and not frame.library:
        return "user-code"
    if yaml_key(text):
        return "config"
    return "unknown"


CHECK = "Run `mgft-doctor check your_train.yaml` to probe the GPUs, NCCL, DeepSpeed, the versions and the config."


def next_steps(kind: str, text: str, frame: Frame | None, caller: Frame | None, key: str | None,
               consequences: list[LogLine], phase: str | None = None, llamafactory: bool = True) -> list[str]:
    """Steps in order, fitted to the kind of error; none of them about another kind."""
    if kind == "data" and not llamafactory:
        steps = list(_plain_data_steps(text, frame, key))
    else:
        steps = list(_STEPS.get(kind, _STEPS["unknown"])(text, frame, key))
    if phase == "saving" and kind not in ("gpu-memory", "distributed"):
        steps.insert(0, "It failed while saving: check the free space and quota under `output_dir` (`df -h`) and "
                        "that every rank may write there.")
    if frame is not None and frame.library and caller is not None and kind not in ("import", "build"):
        steps.append(f"Your code called into it at {caller.where()}: check what it passed there.")
    if consequences:
        echo = consequences[0]
        who = f"rank {echo.rank}" if echo.rank is not None else "another rank"
        steps.insert(0, f"Fix this error first: what {who} printed at line {echo.no} (a timeout or a lost "
                        "connection) is its consequence, not a second problem.")
    return steps


def _data_steps(text, frame, key):
    if frame is not None and not frame.library:
        yield f"The error is raised in your code at {frame.where()}: check what it does with this sample."
    if key:
        yield f"The message names `{key}`: check its value in your YAML against the samples it is applied to."
    yield ("Check the dataset's entry in dataset_info.json (the `dataset` key names it, `dataset_dir` says where): "
           "its `formatting` and `columns` must match the fields of the file, row by row.")
    yield ("Re-run with `preprocessing_num_workers: 1` and `overwrite_cache: true`: the failing sample's error is then "
           "not hidden behind a worker pool or a stale cache. Data is read the same way on one GPU.")
    yield "Check that `template` fits the model: each template accepts only some roles and needs its special tokens."


def _plain_data_steps(text, frame, key):
    if frame is not None and not frame.library:
        yield f"The error is raised in your code at {frame.where()}: check what it does with this sample."
    yield ("Find the sample it failed on and compare its fields with what the preprocessing expects "
           "(column names, empty or over-long texts).")
    yield ("Re-run the preprocessing in one process (`num_proc=1`, no DataLoader workers): the error then "
           "shows the sample. Data is read the same way on one GPU.")


def _config_steps(text, frame, key):
    if key:
        yield f"Change `{key}` in your YAML (or on the command line): the message above says what it accepts."
    else:
        yield "Change the argument the message above names: an argument check raised it before training started."
    where = f" ({frame.where()})" if frame is not None else ""
    yield f"The check that raised it is in the source{where}; `llamafactory-cli train -h` lists every argument with its help."
    yield CHECK


def _import_steps(text, frame, key):
    m = _MISSING_MODULE.search(text)
    module = next((g for g in (m.groups() if m else ()) if g), None)
    binary = _BINARY.search(text)
    pkg = (module.split(".")[0] if module else _extension_package(binary.group(1)) if binary
           else frame.package if frame is not None and frame.package else None)
    rebuild = (f"reinstall it against the installed torch: `pip install --no-build-isolation --force-reinstall {pkg or '<package>'}`")
    if binary:  # a compiled extension built for another torch/CUDA/Python: its symbols do not resolve
        yield (f"A compiled extension{f' of {pkg}' if pkg else ''} does not fit the installed torch (built for another "
               f"torch, CUDA or Python): {rebuild}.")
    else:
        what = f"`{module}`" if module else f"`{pkg}`" if pkg else "The module"
        show = f"`pip show {pkg}`" if pkg else "`pip list`"
        yield (f"{what} is missing or is a version without this name: {show}, then install a version that "
               "LLaMA-Factory supports (`llamafactory-cli env` prints the installed stack).")
    yield "Run `mgft-doctor check` (versions.compat) to compare the installed versions with known-bad combinations."
    if not binary:
        yield f"If it names a compiled extension (flash_attn, deepspeed ops, bitsandbytes), {rebuild}."


_BINARY = re.compile(r"([\w.-]+)\.(?:cpython-\d+[\w-]*\.)?so(?:\.\d+)*: (?:undefined symbol|cannot open shared object file|"
                     r"wrong ELF class|invalid ELF header|version `[^']+' not found)|undefined symbol: ")


def _extension_package(name: str | None) -> str | None:
    """The package of an extension module's file name: flash_attn_2_cuda -> flash_attn, _C -> None."""
    if not name:
        return None
    for pkg in ("flash_attn", "bitsandbytes", "deepspeed", "apex", "xformers", "vllm", "torchvision", "torchaudio", "torch"):
        if name.lstrip("_").startswith(pkg.lstrip("_")) or name.startswith("lib" + pkg):
            return pkg
    return None


def _distributed_steps(text, frame, key):
    yield ("Re-run with NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL: NCCL then says which transport "
           "(P2P, SHM, IB, socket) failed and why.")
    yield "Run `mgft-doctor check` to probe NCCL all-reduce, P2P and /dev/shm on this machine."
    yield "On several nodes: check that MASTER_ADDR:MASTER_PORT is reachable from each and set NCCL_SOCKET_IFNAME."


def _gpu_memory_steps(text, frame, key):
    yield ("Lower `per_device_train_batch_size` (keep the global batch with `gradient_accumulation_steps`) "
           "or `cutoff_len`.")
    yield ("Keep gradient checkpointing on (LLaMA-Factory's default), and shard with ZeRO-3 "
           "(`deepspeed: examples/deepspeed/ds_z3_config.json`) or offload to the CPU.")
    yield "`mgft-doctor check your_train.yaml` estimates the memory per GPU that the YAML needs."


def _host_memory_steps(text, frame, key):
    yield ("The kernel's OOM killer most likely ended the process (exit -9): `dmesg -T | grep -i -E "
           "'killed process|out of memory'` shows it.")
    yield ("Lower host RAM use: `preprocessing_num_workers`, `dataloader_num_workers`, fewer ranks per node; "
           "ZeRO offload to the CPU needs RAM for every rank's share.")


def _cuda_steps(text, frame, key):
    yield ("Re-run with CUDA_LAUNCH_BLOCKING=1: CUDA reports errors asynchronously, so the frame above may not "
           "be the kernel that failed.")
    yield "Check that torch's CUDA build fits the driver (`nvidia-smi`; `mgft-doctor check` probes it)."


def _crash_steps(text, frame, key):
    yield "Re-run with PYTHONFAULTHANDLER=1 to get the Python stack of the thread that crashed."
    yield ("A crash in native code is most often a binary mismatch: reinstall compiled extensions (flash_attn, "
           "deepspeed ops, bitsandbytes) against the installed torch; `mgft-doctor check` compares the versions.")


def _stopped_steps(text, frame, key):
    yield ("The launcher was stopped from outside (SIGTERM, Ctrl-C or SIGHUP) and took the workers down with it: "
           "find who sent it (a scheduler's time limit or preemption: `sacct -j <job>`, pod events; a closed SSH session).")
    yield ("Resume from the last checkpoint (`resume_from_checkpoint`, saved every `save_steps`), and run long jobs "
           "detached (`nohup`, tmux) or with a longer time limit.")


def _build_steps(text, frame, key):
    yield "Read the compiler's first error above: it names the missing header, compiler or CUDA toolkit."
    yield "Check gcc and nvcc against torch's CUDA (`nvcc --version`, `ds_report`); `mgft-doctor check` runs the op builds."


def _cli_steps(text, frame, key):
    yield "The command line was rejected: compare its flags with the `--help` of the command that printed the usage."


def _files_steps(text, frame, key):
    yield ("A path does not exist where the run looks for it: check `model_name_or_path`, `dataset_dir` and "
           "`output_dir` (relative paths start where the command runs) and that every node sees them.")


def _user_code_steps(text, frame, key):
    yield f"The error is raised in your code at {frame.where()}: start there."
    yield ("Re-run on one GPU without DeepSpeed: if it fails the same way, the cause is in the script, model or "
           "data, not in the distributed setup.")


def _unknown_steps(text, frame, key):
    yield ("Re-run on one GPU without DeepSpeed (or with ZeRO-0): if it passes, the failure is in the distributed "
           "setup; if it fails the same way, it is in the model, data or script.")
    if frame is not None and frame.package:
        yield f"Search the exact message in {frame.package}'s issue tracker: its frame raised it ({frame.where()})."
    yield CHECK


_STEPS = {
    "data": _data_steps, "config": _config_steps, "import": _import_steps, "distributed": _distributed_steps,
    "gpu-memory": _gpu_memory_steps, "host-memory": _host_memory_steps, "cuda": _cuda_steps, "crash": _crash_steps,
    "stopped": _stopped_steps,
    "build": _build_steps, "command-line": _cli_steps, "files": _files_steps, "user-code": _user_code_steps,
    "unknown": _unknown_steps,
}
