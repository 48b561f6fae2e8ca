"""The `mgft-doctor` command: the top parser and dispatch; one module per command (check, the
default; explain; codes; fix; run). Every failure of the doctor's input ends as one line on stderr and
a documented exit code, never a traceback."""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from .. import __version__
from ..errors import EXIT_CRASH, EXIT_OK, EXIT_USAGE, DoctorError

COMMANDS = ("check", "explain", "codes", "fix", "run")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own exit code is 2 as well; keep one line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"mgft-doctor: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


_HELP = {
    "check": "probe this machine (the default command)",
    "explain": "find the root cause of a failed training log",
    "codes": "list the known-errors catalog, or show one code's page",
    "fix": "show the repair of a DeepSpeed JSON or LLaMA-Factory YAML as a diff",
    "run": "run a training command and watch it (stalls, failures)",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only`, every command is listed but only that one gets its
    arguments, so that a run imports only its own command's modules (`explain` does not pay
    for the imports of `check`: a quarter of its start-up)."""
    p = _Parser(prog="mgft-doctor", description="Diagnose multi-GPU fine-tuning before and after it fails.")
    p.add_argument("--version", action="version", version=f"mgft-doctor {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    for name in COMMANDS:
        command = sub.add_parser(name, help=_HELP[name])
        if only is not None and name != only:
            continue
        if name == "check":
            from .check import add_check_arguments
            add_check_arguments(command)
        else:
            import importlib
            importlib.import_module(f".{name}", __name__).add_arguments(command)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. Ctrl-C and SIGTERM at any moment end with one line and exit 130 / 143
    (the launches kill their process trees on the way out); stdout's troubles keep the verdict."""
    from .ends import catch_signals, guard_streams, interrupted

    restore_signals, restore_streams = catch_signals(), guard_streams()
    try:
        try:
            return _run(argv)
        finally:
            restore_streams()  # the last flush, where a closed pipe shows, is still covered below
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM turned into it by catch_signals
        return interrupted(exc)
    finally:
        restore_signals()


def _run(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and (near := _misspelt_command(argv[0])):
        sys.stderr.write(f"mgft-doctor: unknown command {argv[0]!r}; did you mean {near!r}?\n")
        return EXIT_USAGE
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "check")
    parser = build_parser(argv[0] if argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except DoctorError as exc:
        sys.stderr.write(f"mgft-doctor: {exc}\n")
        return exc.exit_code
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # the doctor itself crashed: say so in one line, details on request
        if os.environ.get("MGFT_DOCTOR_DEBUG"):
            raise
        sys.stderr.write(f"mgft-doctor: internal error: {type(exc).__name__}: {exc} "
                         "(set MGFT_DOCTOR_DEBUG=1 for the traceback)\n")
        return EXIT_CRASH


def _misspelt_command(word: str) -> str | None:
    """The command a word misspells ('explian' -> 'explain'); never for a path or an option, which
    go to check as they always did (`mgft-doctor train.yaml`)."""
    if word in COMMANDS or word.startswith("-") or "/" in word or "." in word or os.path.exists(word):
        return None
    near = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    return near[0] if near else None


def _dispatch(args) -> int:
    if args.command == "explain":
        from .explain import run_explain
        return run_explain(args)
    if args.command == "codes":
        from .codes import run_codes
        return run_codes(args)
    if args.command == "fix":
        from .fix import run_fix
        return run_fix(args)
    if args.command == "run":
        from .run import run_run
        return run_run(args)
    from .check import run_check
    return run_check(args)
