"""`mgft-doctor explain LOG...`: the root cause of a failed training log, as a report or the
mgft-doctor/explain/1 JSON object. Exit 0 no failure, 1 a failure, 2 unreadable input."""

from __future__ import annotations

import json
import sys

from rich.console import Console

from ..errors import EXIT_FAILURE, EXIT_OK
from .share import add_share_option, share_explain


def add_arguments(e) -> None:
    e.add_argument("logs", nargs="+", metavar="LOG", help="log file(s); '-' reads stdin; .gz/.bz2/.xz are read directly")
    e.add_argument("--json", action="store_true", help="print the mgft-doctor/explain/1 JSON object")
    e.add_argument("--installed", action="store_true",
                   help="also use the versions installed here to pick version-aware fixes")
    e.add_argument("-v", "--verbose", action="store_true", help="show every diagnosis and all evidence")
    add_share_option(e)


def run_explain(args) -> int:
    from ..explain import explain_paths
    from ..explain.render import render

    report = explain_paths(args.logs, use_installed=args.installed)
    if args.share is not None:
        share_explain(report, args.share)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), ensure_ascii=False) + "\n")
    else:
        render(report, Console(highlight=False), verbose=args.verbose)
    return EXIT_FAILURE if report.failure else EXIT_OK
