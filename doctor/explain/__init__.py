"""`explain`: from a failed training log to the root-cause error and the known failure class.

Pipeline: open (source) -> salient lines (scan, lines) -> failure events and root error
(failures) + catalog evidence (match) + versions (versions) + the run's phase (phase, which
also peeks at the byte blocks) -> a report (report) -> render. A traceback printed under
torchrun's rank tag in its plain form is read as one record (scan.Record) that the readers
share; its lines are made only where a reader needs them (_Compactor, FailureReader.feed_record)."""

from __future__ import annotations

import gc
import io
from itertools import compress
from dataclasses import dataclass

from ..catalog import Entry, load_catalog
from ..catalog.fixes import fixes_in_focus, kept_fixes
from .advice import advise
from .failures import FailureAnalysis, FailureReader, is_consequence
from .lines import LogLine
from .match import CACHE_MAX_CHARS, KEEP_FIRST, KEEP_LAST, Candidate, Matcher
from .phase import TRIGGERS as PHASE_TRIGGERS
from .phase import PhaseTracker, job_of, names_no_phase
from .report import SCHEMA, Diagnosis, ExplainReport
from .scan import Record, compile_triggers, scan_records
from .source import LogSource, open_log
from .versions import LogVersions, installed_versions, version_blind

__all__ = ["SCHEMA", "Diagnosis", "ExplainReport", "explain_paths", "explain_sources", "explain_text"]
MAX_DIAGNOSES = 5


def _triggers(entries: list[Entry]):
    return compile_triggers([*(t for e in entries for t in e.triggers), *PHASE_TRIGGERS])


@dataclass
class _Read:
    """What one pass over the logs found."""

    analysis: FailureAnalysis
    matcher: Matcher
    versions: LogVersions
    phases: PhaseTracker
    line_totals: dict[int, int]
    stats: dict


GC_THRESHOLD = 100_000  # allocations between young collections while reading (Python's default: 700)


def _read(sources: list[LogSource], entries: list[Entry]) -> _Read:
    """One streaming pass (see _read_lines), with the cyclic collector run less often: the pass
    makes many small objects and almost no cycles, and at Python's default threshold collecting
    them cost 12-15% of the pass on trigger-dense logs (timed with gc.callbacks)."""
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], GC_THRESHOLD), *threshold[1:])
    try:
        return _read_lines(sources, entries)
    finally:
        gc.set_threshold(*threshold)


def _match_block(matcher: Matcher, lines: list[LogLine], _known: dict | None = None) -> None:
    """Feed a block's lines to the matcher, which keeps, for each set of patterns that matched
    a line, the first KEEP_FIRST and the last KEEP_LAST lines it was fed (match.Hits). Of the
    lines of one block with the same set, only the first KEEP_FIRST and the last KEEP_LAST are
    fed, in order: that keeps the same lines (the first ones of the log are among the first of
    some blocks, the last ones among the last), and a warning printed at every step costs a
    dict lookup in the matcher's own memo (text -> the slots that match it; its answer for a
    text does not change). A line longer than the matcher remembers would be searched again
    when asked about: a block with one is fed whole, as it comes. (_known: once a memo of
    this function's own, now the matcher's; still taken, not used.)"""
    groups: dict[tuple[int, ...], list[LogLine]] = {}
    get = matcher.memo.get
    slots_of = matcher.matching_slots
    for line in lines:
        text = line.text
        slots = get(text)
        if slots is None:
            if len(text) > CACHE_MAX_CHARS:
                for line in lines:
                    if get(line.text) != ():
                        matcher.feed(line)
                return
            slots = slots_of(text)
        if not slots:
            continue
        group = groups.get(slots)
        if group is None:
            groups[slots] = [line]
        else:
            group.append(line)
    add = matcher.add
    for slots, group in groups.items():
        if len(group) > KEEP_FIRST + KEEP_LAST:
            group = group[:KEEP_FIRST] + group[-KEEP_LAST:]
        add(slots, group)


RECORDS_KEPT = 4  # records of one key kept at each end of a block for the readers of lines (>= KEEP_FIRST, KEEP_LAST)
SHAPES_KNOWN = 4_096  # record keys remembered with whether their middle records may be passed over
RECORD_MAX_BYTES = 4_096  # longer records are always given (their keys are not worth remembering)


class _Compactor:
    """Which tracebacks read as records the matcher, the version finder and the phase tracker
    are given the lines of. Records with one key (Record.key: their bytes, digits aside) have
    lines of one shape each. The version finder and the phase tracker cannot tell those apart
    where they name no version in a way digits change and no phase; the matcher where its
    patterns match the same lines of each (for most lines the shape says it: no pattern that
    tells digits apart may match them; for the others, the matcher is asked). Of the records of
    one key in a block that are alike so, only the first RECORDS_KEPT and the last RECORDS_KEPT
    are given, which changes nothing the readers keep: the matcher keeps the first and the last
    lines of each set of patterns in a block, the version finder the last version named. The
    phase tracker also gets the block's lines and records as read, and makes the records' lines
    if it walks back that far; the failure reader gets every record."""

    def __init__(self, matcher: Matcher):
        self.matcher = matcher
        # key -> None (never passed over), or the lines the matcher must be asked about:
        # (start, end in the record's bytes, the literal gate or None, the slots it must match,
        # whether those are the slots when the gate finds nothing)
        self.known: dict[bytes, tuple | None] = {}
        self.seen: dict[bytes, tuple[int, ...]] = {}  # a line's bytes (after its tag) -> the matcher's answer

    def _probe(self, rec: Record) -> tuple | None:
        matcher = self.matcher
        probe = []
        at = 0
        data = rec.data
        for ln in rec.lines():
            end = data.index(b"\n", at)
            text = ln.text
            if len(text) > CACHE_MAX_CHARS or not version_blind(text) or not names_no_phase(text):
                return None
            found = matcher.shape_probe(text)
            if found is not None:
                blind, gate = found
                want = matcher.matching_slots(text)
                probe.append((at + rec.tag, end, gate, want, want == blind))
            at = end + 1
        return tuple(probe)

    def compact(self, lines: list[LogLine], records: list[tuple[int, Record]]) -> list[LogLine]:
        """The lines with the lines of the records that are given put in where they were read."""
        n = len(records)
        by_key: dict[bytes, list[int]] = {}
        for j, (_, rec) in enumerate(records):
            group = by_key.get(rec.key)
            if group is None:
                by_key[rec.key] = [j]
            else:
                group.append(j)
        mask = None
        k = RECORDS_KEPT
        known = self.known
        for key, group in by_key.items():
            if len(group) <= 2 * k or len(key) > RECORD_MAX_BYTES:
                continue
            if key in known:
                probe = known[key]
            else:
                probe = self._probe(records[group[0]][1])
                if len(known) >= SHAPES_KNOWN:
                    known.clear()
                known[key] = probe
            if probe is None:
                continue
            if probe:
                group = self._alike(records, group, probe)
                if len(group) <= 2 * k:
                    continue
            if mask is None:
                mask = bytearray(b"\x01") * n
            for j in group[k:-k]:
                mask[j] = 0
        if mask is None:
            return _expand(lines, records)
        out: list[LogLine] = []
        at = 0
        for j in compress(range(n), mask):
            pos, rec = records[j]
            if pos > at:
                out += lines[at:pos]
                at = pos
            out += rec.lines()
        out += lines[at:]
        return out

    def _slots(self, line: bytes) -> tuple[int, ...]:
        """The matcher's answer for a record's line (its bytes after the tag)."""
        slots = self.seen.get(line)
        if slots is None:
            slots = self.matcher.matching_slots(line.decode("ascii").rstrip())
            if len(self.seen) >= SHAPES_KNOWN:
                self.seen.clear()
            self.seen[line] = slots
        return slots

    def _alike(self, records: list[tuple[int, Record]], group: list[int], probe: tuple) -> list[int]:
        """The records of group (indexes in records, of one key, the first among them probed)
        for which the matcher answers at each probed line as it did for the first. They have
        one length and layout: a literal gate runs once over all of them joined; a line that
        holds a literal is asked about once for each distinct text."""
        datas = [records[j][1].data for j in group]
        bad: set[int] = set()
        for start, end, gate, want, bare in probe:
            lines = [d[start:end] for d in datas]
            if bare and gate is not None and gate.search(lines[0].lower()) is None:
                # the first holds none of the literals: find the others that do, all at once
                # (the lines are of one length: where a literal is says whose line it is in)
                width = end - start + 1
                check = set()
                for m in gate.finditer(b"\n".join(lines).lower()):
                    check.add(m.start() // width)
                    check.add((m.end() - 1) // width)
                values = {i: lines[i] for i in check if i < len(lines)}
            else:
                values = dict(enumerate(lines))
            wrong = {line for line in set(values.values()) if self._slots(line) != want}
            if wrong:
                bad.update(i for i, line in values.items() if line in wrong)
        if not bad:
            return group
        return [j for i, j in enumerate(group) if i not in bad]


def _expand(lines, records):
    from .scan import expand

    return expand(lines, records)


def _read_lines(sources: list[LogSource], entries: list[Entry]) -> _Read:
    """Every salient line goes to the failure reader, the matcher, the version finder and the
    phase tracker (which also peeks at the blocks). The scanner hands them a block's lines at a
    time, and each reader takes the block in one call: none of them depends on another (the
    tracker keeps a block whose lines hold an error, which is a block's matter too), so each
    goes through the block on its own, and a line that each has seen before and found to
    change nothing costs it one set lookup. Tracebacks read as records (scan.Record) go to the
    failure reader as such, and to the others as _Compactor says."""
    triggers = _triggers(entries)
    matcher = Matcher(entries)
    reader = FailureReader()
    versions = LogVersions()
    phases = PhaseTracker()
    compactor = _Compactor(matcher)
    stats: dict = {}
    line_totals: dict[int, int] = {}
    for index, source in enumerate(sources):
        before = stats.get("lines", 0)
        for lines, records in scan_records(None, triggers, index, stats, phases.blocks(source, index)):
            pin = reader.feed_block(lines, records)
            if pin is not None:
                phases.pin(pin)
            given = compactor.compact(lines, records) if records else lines
            _match_block(matcher, given)
            versions.feed_block(given)
            phases.feed_block(given, (lines, records) if records else None)
        line_totals[index] = stats.get("lines", 0) - before
    return _Read(reader.finish(), matcher, versions, phases, line_totals, stats)


def explain_sources(sources: list[LogSource], use_installed: bool = False,
                    entries: list[Entry] | None = None) -> ExplainReport:
    entries = load_catalog() if entries is None else entries
    read = _read(sources, entries)
    analysis = read.analysis
    found, origin = _versions(read.versions, use_installed)
    root_line = analysis.root.line if analysis.root else None
    root_kind = analysis.root.kind if analysis.root else None
    if analysis.failure:
        candidates = read.matcher.rank(analysis.root_lines, _root_followers(analysis),
                                       analysis.root.line.rank if analysis.root else None,
                                       echo=is_consequence if analysis.consequences else None)
    else:
        # no error was printed; only entries that recognise a silent failure (a hang seen in a
        # stack dump, training on the CPU) may still call it one
        candidates = [c for c in read.matcher.rank(set()) if c.entry.standalone]
        if candidates:
            root_line, root_kind = candidates[0].evidence[0], "anomaly"
    root_texts = [ln.text for ln in ([root_line] if root_line is not None else []) + list(analysis.root_detail)]
    diagnoses = [_diagnosis(cand, found, root_texts) for cand in candidates[:MAX_DIAGNOSES]]
    phase = advice = None
    job = "training"
    consequences = [e.line for e in analysis.consequences]
    if root_line is not None:
        frames = analysis.root.traceback.frames if analysis.root and analysis.root.traceback else []
        # a chained exception's traceback holds the outer frames of the same call (raise ... from e):
        # where the run was comes from the whole chain, not only from the innermost link
        frames = list(frames) + [f for e in analysis.chained if e.traceback for f in e.traceback.frames]
        phase = read.phases.phase_at(root_line, frames, read.line_totals.get(root_line.source))
        job = job_of(frames)
        if job == "checkpoint conversion":
            phase = None  # an offline conversion has none of a training run's phases
        advice = advise(analysis.root if root_kind != "anomaly" else None, root_line, root_kind,
                        phase.name if phase else None, consequences, llamafactory="llamafactory" in found)
    return ExplainReport(
        sources=[s.name for s in sources], failure=root_line is not None, diagnoses=diagnoses,
        root_error=root_line, root_kind=root_kind,
        failed_rank=analysis.failed_rank, exit_codes=analysis.exit_codes, versions=found,
        version_origin=origin, bytes_read=read.stats.get("bytes", 0), lines_read=read.stats.get("lines", 0),
        launcher_rank=analysis.launcher_rank, consequences=consequences, phase=phase, advice=advice, job=job,
        root_detail=analysis.root_detail if root_kind not in (None, "anomaly") else [],
    )


def _versions(versions: LogVersions, use_installed: bool) -> tuple[dict[str, str], dict[str, str]]:
    """The versions the log reveals, completed with the installed ones when asked; and where each came from."""
    found = dict(versions.found)
    origin = {k: "log" for k in found}
    if use_installed:
        for k, v in installed_versions().items():
            if k not in found:
                found[k] = v
                origin[k] = "installed"
    return found, origin


def _root_followers(analysis) -> set[tuple[int, int]]:
    """The lines right after the root error: its message continues there (if the same rank printed them)."""
    root = analysis.root
    if root is None:
        return set()
    # the launcher's exit lines right after a rank's own error only echo it ('exits with return code')
    echoes = {(e.line.source, e.line.no) for e in analysis.events if e.kind == "exit"} if root.kind != "exit" else set()
    return {(root.line.source, n) for n in range(root.line.no + 1, root.line.no + 8)} - echoes


FOCUS_EVIDENCE = 3  # the first evidence lines (the matched message, not every context line) pick the fixes shown


def _diagnosis(cand: Candidate, versions: dict[str, str], root_texts: list[str]) -> Diagnosis:
    e = cand.entry
    confidence = round(min(0.97, 1 - 0.5 ** cand.score), 2)
    kept = kept_fixes(e.fixes, versions)
    focus = fixes_in_focus(kept, root_texts + [ln.text for ln in cand.evidence[:FOCUS_EVIDENCE]])
    return Diagnosis(e.code, e.title, confidence, e.explanation, [text for _, text in kept],
                     cand.evidence, cand.rank, e.references, focus)


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
