"""How `explain` speaks to a person: when and where the run failed, the root error, then the
most likely diagnosis in full (what happened, the fixes in order, the evidence) and the others
one line each; with nothing known, the frame that raised the error and next steps.

A typical report fits 40 lines of 80 columns; -v shows everything. When stdout is not a
terminal (a file, a pipe, a CI log) no line is wrapped: each stays whole, to be grepped. On a
terminal, long lines wrap with their continuation indented under their text. A line that is
shortened says so with an ellipsis."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from ..terminal import Out
from ..text import mask_data
from . import ExplainReport
from .report import Diagnosis

GENERIC_STEPS = [
    "Re-run on one GPU without DeepSpeed (or with ZeRO-0): if it passes, the failure is in the "
    "distributed setup; if it fails the same way, it is in the model, data or script.",
    "Run `mgft-doctor check your_train.yaml` to probe GPUs, NCCL, DeepSpeed and the config.",
]
ELLIPSIS = "…"
ROOT_CHARS = 320  # of the root error's text on a terminal (-v, or off a terminal: all that was read)
EVIDENCE_CHARS = 200
DETAIL_CHARS = 150  # of each line that carries the root's message, shown under it on a terminal
FULL_CHARS = 4000  # as much as explain reads of a line
EVIDENCE_LINES = 2  # per diagnosis (-v: 8)

# How the report names each phase (doctor/explain/phase.py): "failed <words>".
PHASE_WORDS = {
    "start-up": "at start-up (arguments, imports, launch)",
    "data loading": "while loading the data",
    "model loading": "while loading the model",
    "first step": "before its first training step",
    "mid-training": "mid-training",
    "saving": "while saving",
    "exit": "at exit, after training completed",
}


def clip(text: str, limit: int) -> str:
    """text, or its first limit characters and an ellipsis."""
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + ELLIPSIS


def when_it_failed(report: ExplainReport) -> str:
    """'failed while saving, at step 1200 of 3000, on rank 1 (exit code 1)': every number from the log."""
    parts = []
    phase = report.phase
    if phase is not None:
        words = PHASE_WORDS.get(phase.name, phase.name)
        if phase.step is not None:
            words += f", at step {phase.step}" + (f" of {phase.total}" if phase.total else "")
        parts.append("failed " + words)
    else:
        parts.append("failed")
    if report.failed_rank is not None:
        parts.append(f"on rank {report.failed_rank}")
    text = ", ".join(parts)
    codes = sorted({c for c in report.exit_codes if c != 0})
    if codes:
        text += " (exit code " + ", ".join(str(c) for c in codes) + ")"
    return text


def frame_words(frame) -> str:
    owner = f"{frame.package} (library)" if frame.library and frame.package else "a library" if frame.library else "your code"
    return f"{owner}, {frame.where()}"


def render(report: ExplainReport, console: Console, verbose: bool = False) -> None:
    report = mask_data(report)  # no secret of the log reaches the screen
    out = Out(console)
    names = ", ".join(report.sources)
    if not report.failure:
        out.item(0, "[green]✓[/] ", f"No failure found in {escape(names)} ({report.lines_read:,} lines read).")
        return
    out.item(0, "[bold red]✗[/] ", f"[bold red]{report.job.capitalize()} {escape(when_it_failed(report))}[/]")
    _root(out, report, verbose)
    out.blank()
    if not report.diagnoses:
        _unmatched(out, report)
        return
    top = report.diagnoses[0]
    _diagnosis(out, top, "Most likely", report, verbose)
    others = report.diagnoses[1:]
    if verbose:
        for d in others:
            out.blank()
            _diagnosis(out, d, "Also possible", report, verbose)
        return
    if others:
        out.item(0, "", "[bold]Also possible:[/]")
        for d in others:
            out.one_line(2, f"[cyan]{d.code}[/] {escape(d.title)}  [dim]({d.confidence:.2f})[/]")
    out.item(0, "", "[dim]-v: every diagnosis in full, all evidence, references.[/]")


def _root(out: Out, report: ExplainReport, verbose: bool) -> None:
    r = report.root_error
    # the log's name only when several were read (one: the user just named it), or with -v
    where = f" of {escape(report.sources[r.source])}" if len(report.sources) > 1 or verbose else ""
    out.item(2, "", f"Root error, line {r.no:,}{where}" + f" ({report.lines_read:,} lines read)"
             + (f", rank {r.rank}" if r.rank is not None else "") + ":")
    out.item(4, "", f"[red]{escape(clip(r.text, ROOT_CHARS if out.tty and not verbose else FULL_CHARS))}[/]")
    for ln in report.root_detail[: None if verbose else 1]:  # the message the root's own line does not carry
        out.item(4, "", f"[red]{escape(clip(ln.text.strip(), DETAIL_CHARS if out.tty and not verbose else FULL_CHARS))}[/]")
    advice = report.advice
    if advice is not None and advice.frame is not None and (verbose or not report.diagnoses):
        out.item(2, "Logged in: " if advice.frame.logged_by else "Raised in: ", escape(frame_words(advice.frame)))
        if advice.caller is not None:
            out.item(2, "Called from your code at ", escape(advice.caller.where()))
    if report.consequences:
        echo = report.consequences[0]
        who = f"rank {echo.rank}" if echo.rank is not None else "another rank"
        named = (f"; torchrun's summary names rank {report.launcher_rank}, the first to exit"
                 if report.launcher_rank is not None and report.launcher_rank != report.failed_rank else "")
        out.item(2, "", f"Then {who} failed waiting for it (line {echo.no}: a consequence){named}.")
    if verbose and report.phase is not None and report.phase.line is not None:
        out.item(2, "Phase seen at ", f"line {report.phase.line}: [dim]{escape(clip(report.phase.text, EVIDENCE_CHARS))}[/]")
    if verbose and report.versions:
        out.item(2, "Versions: ", ", ".join(f"{k} {v} ({report.version_origin.get(k, 'log')})"
                                            for k, v in sorted(report.versions.items())))


def _diagnosis(out: Out, d: Diagnosis, label: str, report: ExplainReport, verbose: bool) -> None:
    out.item(0, "", f"[bold]{label}: [cyan]{d.code}[/] {escape(d.title)}[/]  [dim](confidence {d.confidence:.2f})[/]")
    out.item(2, "", escape(d.explanation.strip()))
    out.item(2, "", "[bold]Fix:[/]")
    shown = range(len(d.fixes)) if verbose or d.focus is None else d.focus
    for n, i in enumerate(shown, 1):
        out.item(4, f"{n}. ", escape(d.fixes[i]))
    if len(shown) < len(d.fixes):
        other = len(d.fixes) - len(shown)
        out.item(4, "", f"[dim]({other} more fix{'es' if other > 1 else ''} for other forms of this error: -v)[/]")
    root = report.root_error
    shown = [ev for ev in d.evidence if verbose or root is None or (ev.source, ev.no) != (root.source, root.no)]
    for i, ev in enumerate(shown[: 8 if verbose else EVIDENCE_LINES]):
        body = f"line {ev.no}: [dim]{escape(clip(ev.text, EVIDENCE_CHARS if out.tty and not verbose else FULL_CHARS))}[/]"
        out.one_line(2, ("[bold]Evidence:[/] " if i == 0 else "          ") + body)
    if verbose:
        for ref in d.references:
            out.item(2, "See ", f"[dim]{escape(ref)}[/]")


def _unmatched(out: Out, report: ExplainReport) -> None:
    out.item(0, "", "[yellow]No known failure class matched this log.[/]")
    advice = report.advice
    if advice is not None and advice.yaml_key:
        out.item(2, "", f"The message names the YAML key `{escape(advice.yaml_key)}`.")
    out.item(2, "", "Next steps:")
    for i, step in enumerate(advice.next_steps if advice and advice.next_steps else GENERIC_STEPS, 1):
        out.item(4, f"{i}. ", escape(step))
