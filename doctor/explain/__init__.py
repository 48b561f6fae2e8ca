"""`explain`: from a failed training log to the root-cause error and the known failure class.

Pipeline: open (source) -> salient lines (scan, lines) -> failure events and root error
(failures) + catalog evidence (match) + versions (versions) -> a report (report) -> render."""

from __future__ import annotations

import io

from ..catalog import Entry, load_catalog
from ..catalog.fixes import choose_fixes
from .failures import FailureReader, is_consequence
from .match import Candidate, Matcher
from .report import SCHEMA, Diagnosis, ExplainReport
from .scan import compile_triggers, scan
from .source import LogSource, open_log
from .versions import LogVersions, installed_versions

__all__ = ["SCHEMA", "Diagnosis", "ExplainReport", "explain_paths", "explain_sources", "explain_text"]
MAX_DIAGNOSES = 5


def _triggers(entries: list[Entry]):
    return compile_triggers(t for e in entries for t in e.triggers)


def explain_sources(sources: list[LogSource], use_installed: bool = False,
                    entries: list[Entry] | None = None) -> ExplainReport:
    entries = load_catalog() if entries is None else entries
    triggers = _triggers(entries)
    matcher = Matcher(entries)
    reader = FailureReader()
    versions = LogVersions()
    stats: dict = {}
    for index, source in enumerate(sources):
        for line in scan(source, triggers, index, stats):
            reader.feed(line)
            matcher.feed(line)
            versions.feed(line.text)
    analysis = reader.finish()
    found = dict(versions.found)
    origin = {k: "log" for k in found}
    if use_installed:
        for k, v in installed_versions().items():
            if k not in found:
                found[k] = v
                origin[k] = "installed"
    diagnoses: list[Diagnosis] = []
    root_line = analysis.root.line if analysis.root else None
    root_kind = analysis.root.kind if analysis.root else None
    if analysis.failure:
        candidates = matcher.rank(analysis.root_lines, _root_followers(analysis),
                                  analysis.root.line.rank if analysis.root else None,
                                  echo=is_consequence if analysis.consequences else None)
    else:
        # no error was printed; only entries that recognise a silent failure (a hang seen in a
        # stack dump, training on the CPU) may still call it one
        candidates = [c for c in matcher.rank(set()) if c.entry.standalone]
        if candidates:
            root_line, root_kind = candidates[0].evidence[0], "anomaly"
    for cand in candidates[:MAX_DIAGNOSES]:
        diagnoses.append(_diagnosis(cand, found))
    failure = root_line is not None
    return ExplainReport(
        sources=[s.name for s in sources], failure=failure, diagnoses=diagnoses,
        root_error=root_line, root_kind=root_kind,
        failed_rank=analysis.failed_rank, exit_codes=analysis.exit_codes, versions=found,
        version_origin=origin, bytes_read=stats.get("bytes", 0), lines_read=stats.get("lines", 0),
        launcher_rank=analysis.launcher_rank, consequences=[e.line for e in analysis.consequences],
    )


def _root_followers(analysis) -> set[tuple[int, int]]:
    """The lines right after the root error: its message continues there (if the same rank printed them)."""
    root = analysis.root
    if root is None:
        return set()
    return {(root.line.source, n) for n in range(root.line.no + 1, root.line.no + 8)}


def _diagnosis(cand: Candidate, versions: dict[str, str]) -> Diagnosis:
    e = cand.entry
    confidence = round(min(0.97, 1 - 0.5 ** cand.score), 2)
    return Diagnosis(e.code, e.title, confidence, e.explanation, choose_fixes(e.fixes, versions),
                     cand.evidence, cand.rank, e.references)


def explain_paths(paths: list[str], use_installed: bool = False) -> ExplainReport:
    sources = []
    try:
        for p in paths:
            sources.append(open_log(p))
        return explain_sources(sources, use_installed)
    finally:
        for s in sources:
            s.close()


def explain_text(text: str, entries: list[Entry] | None = None, use_installed: bool = False) -> ExplainReport:
    """Explain a log held in memory (catalog examples, the pytest plugin's captured output)."""
    source = LogSource("<text>", io.BufferedReader(io.BytesIO(text.encode("utf-8", "replace"))), "utf-8")
    return explain_sources([source], use_installed, entries)
