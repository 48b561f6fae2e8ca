"""The `mgft-doctor` command: check (default), explain, codes, fix. Every failure of the
doctor's input ends as one line on stderr and a documented exit code, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rich.console import Console

from . import __version__
from .errors import EXIT_CRASH, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, DoctorError

COMMANDS = ("check", "explain", "codes", "fix")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own exit code is 2 as well; keep one line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"mgft-doctor: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mgft-doctor", description="Diagnose multi-GPU fine-tuning before and after it fails.")
    p.add_argument("--version", action="version", version=f"mgft-doctor {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    from .check_cli import add_check_arguments
    add_check_arguments(sub.add_parser("check", help="probe this machine (the default command)"))

    e = sub.add_parser("explain", help="find the root cause of a failed training log")
    e.add_argument("logs", nargs="+", metavar="LOG", help="log file(s); '-' reads stdin; .gz/.bz2/.xz are read directly")
    e.add_argument("--json", action="store_true", help="print the mgft-doctor/explain/1 JSON object")
    e.add_argument("--installed", action="store_true",
                   help="also use the versions installed here to pick version-aware fixes")
    e.add_argument("-v", "--verbose", action="store_true", help="show every diagnosis and all evidence")

    c = sub.add_parser("codes", help="list the known-errors catalog, or show one code's page")
    c.add_argument("code", nargs="?", help="a code such as MGD201")
    c.add_argument("--json", action="store_true")
    c.add_argument("--markdown", action="store_true", help="print the page as Markdown")

    f = sub.add_parser("fix", help="show the repair of a DeepSpeed JSON or LLaMA-Factory YAML as a diff")
    f.add_argument("config", help="ds_config.json or train.yaml")
    f.add_argument("--write", action="store_true", help="apply the repair (the original is kept as FILE.bak)")
    f.add_argument("--world-size", type=int, default=None, help="number of GPUs the run uses (for batch arithmetic)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "check")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except DoctorError as exc:
        sys.stderr.write(f"mgft-doctor: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("mgft-doctor: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # the doctor itself crashed: say so in one line, details on request
        if os.environ.get("MGFT_DOCTOR_DEBUG"):
            raise
        sys.stderr.write(f"mgft-doctor: internal error: {type(exc).__name__}: {exc} "
                         "(set MGFT_DOCTOR_DEBUG=1 for the traceback)\n")
        return EXIT_CRASH


def _dispatch(args) -> int:
    if args.command == "explain":
        return _explain(args)
    if args.command == "codes":
        from .codes import run_codes
        return run_codes(args)
    if args.command == "fix":
        from .fix import run_fix
        return run_fix(args)
    from .check_cli import run_check
    return run_check(args)


def _explain(args) -> int:
    from .explain import explain_paths
    from .render_explain import render

    report = explain_paths(args.logs, use_installed=args.installed)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), ensure_ascii=False) + "\n")
    else:
        render(report, Console(highlight=False), verbose=args.verbose)
    return EXIT_FAILURE if report.failure else EXIT_OK
