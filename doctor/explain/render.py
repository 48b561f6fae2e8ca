"""How `explain` speaks to a person: the root error with its line, then each diagnosis with
what happened, the fixes in order and the evidence lines."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from . import ExplainReport

GENERIC_STEPS = [
    "Read the root-cause error above: it is the first failing rank's own error; the SIGTERMs and "
    "ChildFailedError that follow it are only the launcher stopping the other ranks.",
    "Re-run on one GPU without DeepSpeed (or with ZeRO-0): if it passes, the failure is in the "
    "distributed setup; if it fails the same way, it is in the model, data or script.",
    "Re-run with NCCL_DEBUG=WARN and TORCH_DISTRIBUTED_DEBUG=DETAIL to get each rank's own error.",
    "Run `mgft-doctor check your_train.yaml` to probe GPUs, NCCL, DeepSpeed and the config.",
]


# How the report names each phase (doctor/explain/phase.py): "failed <words>".
PHASE_WORDS = {
    "start-up": "at start-up (arguments, imports, launch)",
    "data loading": "while loading the data",
    "model loading": "while loading the model",
    "first step": "in the first training step (none was logged)",
    "mid-training": "mid-training",
    "saving": "while saving",
    "exit": "at exit, after training completed",
}


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
    names = ", ".join(report.sources)
    if not report.failure:
        console.print(f"[green]✓[/] No failure found in {escape(names)} ({report.lines_read:,} lines read).")
        return
    where = []
    if report.failed_rank is not None:
        where.append(f"first failing rank {report.failed_rank}")
    codes = sorted({c for c in report.exit_codes if c != 0})
    if codes:
        where.append("exit code " + ", ".join(str(c) for c in codes))
    console.print(f"[bold red]✗ Training failed[/] in {escape(names)}" + (f" ({'; '.join(where)})" if where else ""))
    if report.root_error is not None:
        r = report.root_error
        console.print(f"  Root error, line {r.no}" + (f" (rank {r.rank})" if r.rank is not None else "") + ":")
        console.print(f"    [red]{escape(r.text.strip()[:400])}[/]")
        console.print(f"  The run {escape(when_it_failed(report))}.")
        if report.consequences:
            echo = report.consequences[0]
            who = f"rank {echo.rank}" if echo.rank is not None else "another rank"
            named = (f"; torchrun's summary names rank {report.launcher_rank}, the first to exit"
                     if report.launcher_rank is not None and report.launcher_rank != report.failed_rank else "")
            console.print(f"  Then {who} failed waiting for it (line {echo.no}: a consequence){named}.")
    if report.versions and verbose:
        console.print("  Versions: " + ", ".join(f"{k} {v} ({report.version_origin.get(k, 'log')})" for k, v in sorted(report.versions.items())))
    console.print()
    if not report.diagnoses:
        console.print("[yellow]No known failure class matched this log.[/]")
        advice = report.advice
        if advice is not None and advice.frame is not None:
            console.print(f"  Raised in: {escape(frame_words(advice.frame))}")
            if advice.caller is not None:
                console.print(f"  Called from your code at {escape(advice.caller.where())}")
        if advice is not None and advice.yaml_key:
            console.print(f"  The message names the YAML key `{escape(advice.yaml_key)}`.")
        console.print("  Next steps:")
        for i, step in enumerate(advice.next_steps if advice else GENERIC_STEPS, 1):
            console.print(f"    {i}. {escape(step)}")
        return
    shown = report.diagnoses if verbose else report.diagnoses[:2]
    for n, d in enumerate(shown):
        label = "Most likely" if n == 0 else "Also possible"
        console.print(f"[bold]{label}: [cyan]{d.code}[/] {escape(d.title)}[/]  [dim](confidence {d.confidence:.2f})[/]")
        console.print(f"  [bold]What happened:[/] {escape(d.explanation)}")
        console.print("  [bold]Fix:[/]")
        for i, fix in enumerate(d.fixes, 1):
            console.print(f"    {i}. {escape(fix)}")
        console.print("  [bold]Evidence:[/]")
        for ev in d.evidence[: 8 if verbose else 3]:
            console.print(f"    line {ev.no}: [dim]{escape(ev.text.strip()[:200])}[/]")
        console.print(f"  More: [cyan]mgft-doctor codes {d.code}[/]")
        console.print()
    rest = len(report.diagnoses) - len(shown)
    if rest > 0:
        console.print(f"[dim]{rest} less likely diagnoses hidden; -v shows them.[/]")
