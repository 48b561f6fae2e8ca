"""How `check` speaks to a person: one row per probe in the flutter-doctor manner
([✓] pass, [!] warning, [✗] failure, [-] skipped, [E] the probe crashed), findings with their
code and fix under the row, -v for what each probe ran and saw, and a one-line summary."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.markup import escape

from ..terminal import Out
from .probe import Probe, ProbeResult, Status

STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "red", Status.SKIP: "dim", Status.ERROR: "magenta"}


class Progress:
    """A spinner naming the probes that run, each with its seconds so far and, for a probe that
    can take minutes, what it is waiting for (Probe.hint); the probes run side by side."""

    def __init__(self, console: Console, enabled: bool):
        self.console = console
        self.enabled = enabled
        self._status = None
        self._running: dict[str, tuple[Probe, float]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self, probe: Probe) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._running[probe.id] = (probe, time.monotonic())
        if self._status is None:
            self._status = self.console.status(escape(self._text()))
            self._status.start()
            threading.Thread(target=self._tick, name="mgft-progress", daemon=True).start()
        else:
            self._status.update(escape(self._text()))

    def _text(self) -> str:
        now = time.monotonic()
        with self._lock:
            running = list(self._running.values())
        parts = []
        for probe, t0 in running:
            secs = now - t0
            part = f"{probe.id} {secs:.0f} s"
            if probe.hint and secs >= HINT_AFTER_S:
                part += f" ({probe.hint})"
            parts.append(part)
        return "running " + (", ".join(parts) if parts else "…")

    def _tick(self) -> None:
        while not self._stopped.wait(1.0):
            if self._status is not None:
                self._status.update(escape(self._text()))

    def done(self, res: ProbeResult) -> None:
        if self.enabled:
            with self._lock:
                self._running.pop(res.id, None)
            self.console.print(f"[{STYLE[res.status]}]{res.status.mark}[/] {res.id} ({res.duration_s:.1f} s)")

    def stop(self) -> None:
        self._stopped.set()
        if self._status is not None:
            self._status.stop()


HINT_AFTER_S = 10  # a probe's hint shows once it has run this long


def render_results(results: list[ProbeResult], console: Console, verbose: bool = False,
                   wall_s: float | None = None) -> None:
    """The rows, then one summary line. Off a terminal every line is whole (terminal.Out)."""
    out = Out(console)
    if not verbose:
        out.item(0, "", "Doctor summary (to see all details, run mgft-doctor -v):")
    for r in results:
        out.item(0, f"[{STYLE[r.status]}]\\[{r.status.mark}][/] ", f"[bold]{escape(r.title)}[/] [dim]({r.id}, {r.duration_s:.1f} s)[/]")
        out.item(4, "", escape(r.summary))
        for f in r.findings:
            out.item(4, f"[{STYLE[f.severity]}]{f.severity.mark}[/] [cyan]{f.code}[/] ", escape(f.message))
            out.item(6, "fix: ", escape(f.fix))
        if verbose:  # what the probe ran and saw; its metrics are in --json
            for d in r.details:
                out.item(6, "", f"[dim]{escape(d)}[/]")
    out.blank()
    out.item(0, "", summary_line(results, wall_s))


def is_note(r: ProbeResult) -> bool:
    """A warning with no finding says what this machine is (no GPU here: the ranks run on gloo),
    not that something is wrong with it: the summary counts it apart and --strict lets it pass."""
    return r.status is Status.WARN and not r.findings


def is_warning(r: ProbeResult) -> bool:
    """A warning about something here (a finding of warning weight), not a note."""
    return r.status is Status.WARN and bool(r.findings)


def overall(results: list[ProbeResult]) -> str:
    """fail, error (a probe crashed), warn (a finding of warning weight) or pass (notes included)."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return "fail"
    if Status.ERROR in statuses:
        return "error"
    return "warn" if any(map(is_warning, results)) else "pass"


def summary_line(results: list[ProbeResult], wall_s: float | None = None) -> str:
    """The verdict in one line; the time is the check's wall time (probes run side by side, so the
    sum of their times overstates it), the sum only where the caller has no wall time."""
    total = wall_s if wall_s is not None else sum(r.duration_s for r in results)
    counts = f"{len(results)} probes, {total:.1f} s"
    notes = [r.id for r in results if is_note(r)]
    noted = (f"; {len(notes)} note{'s' if len(notes) > 1 else ''} on what this machine is, not a problem "
             f"({', '.join(notes)})") if notes else ""
    if overall(results) == "pass":
        return f"[green]•[/] No issues found! ({counts}){noted}"
    failed = sum(r.status is Status.FAIL for r in results)
    warned = sum(map(is_warning, results))
    crashed = sum(r.status is Status.ERROR for r in results)
    parts = [f"{n} {w}" for n, w in ((failed, "failed"), (warned, "with warnings"), (crashed, "crashed")) if n]
    codes = sorted({f.code for r in results for f in r.findings})
    pointer = ""
    if len(codes) == 1:
        pointer = f" `mgft-doctor codes {codes[0]}` explains {codes[0]}."
    elif codes:
        pointer = f" Codes {', '.join(codes)}: `mgft-doctor codes CODE` explains one."
    return (f"[{'red' if failed or crashed else 'yellow'}]![/] Doctor found issues: {', '.join(parts)} "
            f"({counts}){noted}.{pointer}")
