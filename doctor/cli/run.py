"""`mgft-doctor run [--stall S] [--log FILE] [--keep-running] -- CMD ...`: run the user's
training command under the doctor's watch (DESIGN.md §5b). Exit: the command's own code; 124
when the doctor stopped a stall; 127/126 when CMD cannot be run; 2 bad usage or log path;
130/143 after Ctrl-C/SIGTERM."""

from __future__ import annotations

import argparse

DEFAULT_STALL_S = 300.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def add_arguments(p) -> None:
    p.add_argument("--stall", type=_seconds, default=DEFAULT_STALL_S, metavar="SECONDS",
                   help=f"no output for this long is a stall (default {DEFAULT_STALL_S:g})")
    p.add_argument("--log", metavar="FILE", help="copy the output here (default: a file in the run folder "
                                                 "under ~/.cache/mgft-doctor/runs/)")
    p.add_argument("--keep-running", action="store_true",
                   help="after a stall report, leave the run running instead of stopping it")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the training command as you would type it (llamafactory-cli, torchrun, deepspeed, "
                        "accelerate launch)")


def run_run(args) -> int:
    from ..watch import RunOptions, supervise

    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    return supervise(RunOptions(command=command, stall_s=args.stall, log=args.log,
                                keep_running=args.keep_running))
