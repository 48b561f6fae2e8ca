"""How `check` speaks to a person: one row per probe in the flutter-doctor manner
([✓] pass, [!] warning, [✗] failure, [-] skipped, [E] the probe crashed), findings with their
code and fix under the row, -v for what each probe ran and saw, and a one-line summary."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from .probe import Finding, Probe, ProbeResult, Status, finding_lines

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


def finding_text_lines(f: Finding, indent: str = "    ") -> list[Text]:
    """probe.finding_lines (the one rendering of a finding, which the pytest plugin prints too),
    with the mark in the severity's colour and the code in cyan."""
    head, fix = (Text(line) for line in finding_lines(f, indent))
    head.stylize(STYLE[f.severity], len(indent), len(indent) + 1)
    head.stylize("cyan", len(indent) + 2, len(indent) + 2 + len(f.code))
    return [head, fix]


def render_results(results: list[ProbeResult], console: Console, verbose: bool = False) -> None:
    if not verbose:
        console.print("Doctor summary (to see all details, run mgft-doctor -v):")
    for r in results:
        st = STYLE[r.status]
        console.print(f"[{st}]\\[{r.status.mark}][/] [bold]{escape(r.title)}[/] [dim]({r.id}, {r.duration_s:.1f} s)[/]")
        console.print(f"    {escape(r.summary)}")
        for f in r.findings:
            console.print(*finding_text_lines(f), sep="\n")
        if verbose:
            for d in r.details:
                console.print(f"      [dim]{escape(d)}[/]")
            for k, v in r.metrics.items():
                if not isinstance(v, (list, dict)):
                    console.print(f"      [dim]{k} = {v}[/]")
    failed = sum(r.status is Status.FAIL for r in results)
    warned = sum(r.status is Status.WARN for r in results)
    crashed = sum(r.status is Status.ERROR for r in results)
    total = sum(r.duration_s for r in results)
    console.print()
    if not failed and not crashed and not warned:
        console.print(f"[green]•[/] No issues found! ({len(results)} probes, {total:.1f} s)")
    else:
        parts = [f"{n} {w}" for n, w in ((failed, "failed"), (warned, "with warnings"), (crashed, "crashed")) if n]
        console.print(f"[{'red' if failed or crashed else 'yellow'}]![/] Doctor found issues: {', '.join(parts)} "
                      f"({len(results)} probes, {total:.1f} s). `mgft-doctor codes CODE` explains a code.")
