"""`mgft-doctor codes`: the catalog as a list and one page per code (as `rustc --explain`),
and the Markdown pages under docs/codes/ generated from the same data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .catalog import AREAS, Entry, find_entry, load_catalog
from .errors import EXIT_OK, DoctorError


def entry_markdown(e: Entry) -> str:
    lines = [f"# {e.code}: {e.title}", "", f"Area: {AREAS[e.area]} (`{e.area}`)", "",
             "## What happened", "", e.explanation, "", "## Fixes, in order of preference", ""]
    for i, fix in enumerate(e.fixes, 1):
        cond = f" *(when {', '.join(c.text for c in fix.when)})*" if fix.when else ""
        lines.append(f"{i}. {fix.text}{cond}")
    lines += ["", "## Example", "", "A log excerpt that `mgft-doctor explain` diagnoses as this code:", "", "```text",
              e.examples_match[0].rstrip(), "```", "", "## References", ""]
    lines += [f"- <{r}>" for r in e.references]
    return "\n".join(lines) + "\n"


def index_markdown(entries: list[Entry]) -> str:
    lines = ["# The known-errors catalog", "",
             "Generated from `known_errors/` by `python -m mgft_doctor.codes docs/codes`; a test keeps it in sync.", ""]
    for area, label in AREAS.items():
        mine = [e for e in entries if e.area == area]
        if not mine:
            continue
        lines += [f"## {label}", ""]
        lines += [f"- [{e.code}]({e.code}.md): {e.title}" for e in mine]
        lines.append("")
    return "\n".join(lines)


def render_docs(entries: list[Entry]) -> dict[str, str]:
    pages = {f"{e.code}.md": entry_markdown(e) for e in entries}
    pages["README.md"] = index_markdown(entries)
    return pages


def write_docs(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    pages = render_docs(load_catalog())
    for old in directory.glob("MGD*.md"):
        if old.name not in pages:
            old.unlink()
    for name, text in pages.items():
        (directory / name).write_text(text, encoding="utf-8")


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


if __name__ == "__main__":  # python -m mgft_doctor.codes docs/codes
    write_docs(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/codes"))
