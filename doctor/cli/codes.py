"""`mgft-doctor codes [CODE]`: the catalog as a list, or one code's page (as `rustc --explain`)."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..catalog import AREAS, find_entry, load_catalog
from ..catalog.pages import entry_markdown
from ..errors import EXIT_OK, DoctorError


def add_arguments(c) -> None:
    c.add_argument("code", nargs="?", help="a code such as MGD201")
    c.add_argument("--json", action="store_true")
    c.add_argument("--markdown", action="store_true", help="print the page as Markdown")


def run_codes(args) -> int:
    entries = load_catalog()
    console = Console(highlight=False)
    if args.code:
        e = find_entry(args.code, entries)
        if e is None:
            raise DoctorError(f"unknown code {args.code!r}; `mgft-doctor codes` lists them")
        if args.json:
            sys.stdout.write(json.dumps({"code": e.code, "title": e.title, "area": e.area,
                                         "explanation": e.explanation,
                                         "fixes": [{"text": f.text, "when": [c.text for c in f.when]} for f in e.fixes],
                                         "references": e.references}, ensure_ascii=False) + "\n")
        elif args.markdown:
            sys.stdout.write(entry_markdown(e))
        else:
            console.print(f"[bold cyan]{e.code}[/] [bold]{escape(e.title)}[/]  [dim]({AREAS[e.area]})[/]\n")
            console.print("[bold]What happened[/]")
            console.print(escape(e.explanation) + "\n")
            console.print("[bold]Fixes, in order of preference[/]")
            for i, fix in enumerate(e.fixes, 1):
                cond = f" [dim](when {', '.join(c.text for c in fix.when)})[/]" if fix.when else ""
                console.print(f"  {i}. {escape(fix.text)}{cond}")
            console.print("\n[bold]Example[/]")
            console.print(escape(e.examples_match[0].rstrip()), style="dim")
            console.print("\n[bold]References[/]")
            for r in e.references:
                console.print(f"  {r}")
        return EXIT_OK
    if args.json:
        sys.stdout.write(json.dumps([{"code": e.code, "area": e.area, "title": e.title} for e in entries]) + "\n")
        return EXIT_OK
    table = Table(title=f"mgft-doctor known errors ({len(entries)} codes)", show_lines=False)
    table.add_column("code", style="cyan", no_wrap=True)
    table.add_column("area", style="dim")
    table.add_column("title")
    for e in entries:
        table.add_row(e.code, e.area, escape(e.title))
    console.print(table)
    return EXIT_OK
