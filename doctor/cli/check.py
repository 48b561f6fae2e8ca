"""`mgft-doctor check` (the default command): run the probes that apply to this machine and the
given run config, show them as flutter-doctor rows, or print the mgft-doctor/check/1 JSON."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

from rich.console import Console

from .. import __version__
from ..check.context import Context, Options
from ..errors import EXIT_CRASH, EXIT_FAILURE, EXIT_OK, DoctorError, InputError
from ..runconfig.model_config import missing_model
from ..runconfig.reading import path_is_file
from ..check.probe import Status
from ..check.registry import select
from ..check.runner import run_all, would_skip
from ..text import mask_data, split_csv, truthy
from .share import add_share_option, share_check

SCHEMA = "mgft-doctor/check/1"


def add_check_arguments(p) -> None:
    p.add_argument("config", nargs="?", help="LLaMA-Factory train YAML or DeepSpeed JSON: adds the run-specific probes")
    p.add_argument("--model", help="model folder (or hub id) whose architecture zero3.model tries under ZeRO-3")
    p.add_argument("--deepspeed", help="DeepSpeed JSON (overrides the one the YAML names)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code to run")
    p.add_argument("--rehearse", action="store_true",
                   help="also run the YAML in miniature: real llamafactory-cli train, shrunk model, a few steps (a minute or more)")
    p.add_argument("--json", action="store_true", help="print the mgft-doctor/check/1 JSON object")
    p.add_argument("-v", "--verbose", action="store_true", help="show what each probe ran and saw")
    p.add_argument("--only", action="append", default=[], metavar="ID",
                   help="run only these probe ids or families (repeatable, comma-separated): --only nccl")
    p.add_argument("--skip", action="append", default=[], metavar="ID", help="skip these probe ids or families")
    p.add_argument("--nproc", type=int, default=None, help="ranks per node for multi-rank probes (default: one per visible GPU; 2 gloo ranks without a GPU)")
    p.add_argument("--timeout", type=float, default=None,
                   help="time limit in seconds for each multi-rank run or build (default 300; without this option "
                        "a first JIT build that is still compiling goes on, up to 30 minutes)")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit code 1)")
    p.add_argument("--python", default=sys.executable, help="the Python of the training environment (default: this one)")
    p.add_argument("--nnodes", type=int, default=None, help="nodes in the run (default $NNODES or 1)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (default $NODE_RANK or 0)")
    p.add_argument("--master-addr", default=None, help="rendezvous host (default $MASTER_ADDR or 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=None, help="rendezvous port (default $MASTER_PORT or a free one)")
    p.add_argument("--list", action="store_true", help="list the probes and exit")
    add_share_option(p)


def options_from_args(args) -> Options:
    options = Options.from_env(
        nproc=args.nproc, timeout=300.0 if args.timeout is None else args.timeout,
        hard_timeout=args.timeout is not None, python=args.python, nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, config=args.config, model=args.model,
        deepspeed=args.deepspeed, trust_remote_code=args.trust_remote_code)
    options.rehearse = bool(getattr(args, "rehearse", False))
    return options


def exit_code(results, strict: bool) -> int:
    from ..check.report import is_warning

    statuses = {r.status for r in results}
    if Status.FAIL in statuses or (strict and any(map(is_warning, results))):
        return EXIT_FAILURE
    if Status.ERROR in statuses:
        return EXIT_CRASH
    return EXIT_OK


def list_probes(probes, ctx: Context | None) -> int:
    """One line per probe; with a run config, also why a probe would skip for it. Only then are the
    probes asked (applies() may read torch's facts: a subprocess of a few seconds)."""
    for p in probes:
        print(f"{p.id:22} {p.title}")
        reason = would_skip(p, ctx) if ctx is not None else None
        if reason:
            print(f"{'':22} would skip: {reason}")
    return EXIT_OK


LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
_LOG_LINE = re.compile(r"Traceback \(most recent call last\)|^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d|^\[rank\d+\]"
                       r"|^\S*(?:INFO|WARNING|ERROR)\b|\d+%\|", re.M)


def usage_mistakes(args) -> None:
    """Mistakes of the command line that would give a green or a confusing result, as exit 2 with
    a pointer: a --model that is not there, a log given where a run config goes."""
    if args.model:
        why = missing_model(args.model)
        if why:
            raise DoctorError(why)
        if not os.path.exists(os.path.expanduser(args.model)):
            sys.stderr.write(f"mgft-doctor: --model {args.model}: not a local folder, taken as a hub id (only its "
                             "config.json is read, from the Hugging Face cache or the hub)\n")
    config = args.config or ""
    if _name_of_a_log(config):
        raise DoctorError(f"{config}: a log file, not a run config; did you mean `mgft-doctor explain {config}`?")


def _name_of_a_log(path: str) -> bool:
    name = path.lower()
    for packed in (".gz", ".bz2", ".xz"):
        name = name.removesuffix(packed)
    return name.endswith(LOG_SUFFIXES)


def log_hint(config: str | None, exc: InputError) -> DoctorError:
    """A config that cannot be read as one: when it reads like a training log, point at explain."""
    if config and path_is_file(config):
        try:
            with open(config, "rb") as f:
                head = f.read(1 << 16).decode("utf-8", "replace")
        except OSError:
            return exc
        if _LOG_LINE.search(head):
            return DoctorError(f"{config} reads like a training log, not a run config; did you mean "
                               f"`mgft-doctor explain {config}`?")
    return exc


def run_check(args) -> int:
    from ..check.registry import all_probes
    from ..check.report import Progress, is_note, overall, render_results

    usage_mistakes(args)
    probes = all_probes()
    if args.list and not (args.config or args.deepspeed or args.model):
        return list_probes(probes, None)
    options = options_from_args(args)
    found = options.python if os.path.isfile(options.python) else shutil.which(options.python)
    if not found:
        raise DoctorError(f"--python {options.python}: no such interpreter")
    options.python = found
    ctx = Context(options)
    if options.config or options.deepspeed:
        try:
            _ = ctx.run_config  # a broken YAML/JSON is bad input: exit 2 before any probe runs
        except InputError as exc:
            raise log_hint(options.config, exc) from None
    if args.list:
        return list_probes(probes, ctx)
    selected = select(probes, split_csv(args.only), split_csv(args.skip))
    console = Console(stderr=True, highlight=False)
    progress = Progress(console, enabled=not args.json and console.is_terminal)
    serial = truthy(os.environ.get("MGFT_DOCTOR_SERIAL", ""))  # one probe at a time (bench, debugging)
    started = time.perf_counter()
    results = run_all(selected, ctx, on_start=progress.start, on_done=progress.done, parallel=not serial)
    wall_s = time.perf_counter() - started
    progress.stop()
    results = mask_data(results)  # no secret of the environment in any output
    if args.share is not None:
        share_check(results, args.share)
    code = exit_code(results, args.strict)
    if args.json:
        sys.stdout.write(json.dumps({"schema": SCHEMA, "version": __version__, "status": overall(results), "exit_code": code,
                                     "wall_s": round(wall_s, 2), "notes": [r.id for r in results if is_note(r)],
                                     "probes": [r.to_json() for r in results]}, ensure_ascii=False) + "\n")
    else:
        render_results(results, Console(highlight=False), verbose=args.verbose, wall_s=wall_s)
    return code
