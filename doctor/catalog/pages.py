"""One Markdown page per code (as rustc's error index) and the index page, generated from the
catalog into docs/codes/ by `python -m mgft_doctor.catalog docs/codes`; a test keeps them in sync."""

from __future__ import annotations

from pathlib import Path

from . import AREAS, Entry, load_catalog


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
             "Generated from `known_errors/` by `python -m mgft_doctor.catalog docs/codes`; a test keeps it in sync.", ""]
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
