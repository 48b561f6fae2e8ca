"""A catalog entry as typed data, and its validation: every field is checked and a mistake
names the file and the field (as rustc's tidy names the error code)."""

from __future__ import annotations

import re as stdlib_re
from dataclasses import dataclass, field
from pathlib import Path

import regex
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ..errors import CatalogError
from .patterns import Pattern

CODE_FORMAT = stdlib_re.compile(r"^MGD\d{3}$")
AREAS = {
    "launch": "Launch and torchrun",
    "nccl": "NCCL, P2P, shared memory and the network",
    "hang": "Hangs and watchdog time-outs",
    "ds-build": "DeepSpeed install and op JIT builds",
    "ds-config": "DeepSpeed configuration",
    "zero3": "ZeRO-3 and the model",
    "grad-accum": "Gradient accumulation under ZeRO",
    "memory": "Out of memory (GPU and host)",
    "offload": "CPU and NVMe offload",
    "checkpoint": "Saving checkpoints",
    "precision": "Precision (fp16, bf16)",
    "versions": "Versions and installs",
    "llamafactory": "LLaMA-Factory's own guards",
}
_PACKAGE_CONDITION = stdlib_re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*((?:[<>=!~]=?|===)\s*[^,]+(?:,\s*(?:[<>=!~]=?)\s*[^,]+)*)\s*$")


@dataclass(frozen=True)
class VersionCondition:
    """'deepspeed>=0.16.0,<0.16.2': a fix that holds only for these versions."""

    package: str
    spec: SpecifierSet
    text: str

    def holds(self, version: str) -> bool:
        return self.spec.contains(version, prereleases=True)


@dataclass(frozen=True)
class Fix:
    text: str
    when: tuple[VersionCondition, ...] = ()
    # a fix for one form of the error: shown on a terminal only when this matches the root error or
    # the evidence (-v and --json keep every fix); None: the fix fits every form
    if_log: stdlib_re.Pattern[str] | None = None


@dataclass
class Entry:
    code: str
    title: str
    area: str
    explanation: str
    fixes: list[Fix]
    references: list[str]
    signatures: list[Pattern]
    requires: list[list[Pattern]] = field(default_factory=list)
    context: list[Pattern] = field(default_factory=list)
    excludes: list[Pattern] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    priority: float = 0.0
    standalone: bool = False  # a match is a failure even when no error line was printed (hangs, silent CPU runs)
    # an exclude counts only on a line after the entry's last signature line (a later line undoes
    # the failure; an earlier one belongs to what came before it, e.g. an op loaded before another hangs)
    excludes_only_after: bool = False
    # lines that undo the excludes printed before them (a new tokenizing pass after one that finished)
    excludes_undone_by: list[Pattern] = field(default_factory=list)
    examples_match: list[str] = field(default_factory=list)
    examples_no_match: list[str] = field(default_factory=list)
    path: str = ""
    # Known-bad combination: the installed versions that make this failure certain to be met
    # (all must hold), e.g. deepspeed>=0.16.0 with transformers<4.47.1. Read by versions.compat.
    affects: tuple[VersionCondition, ...] = ()

    def all_patterns(self) -> list[Pattern]:
        return [*self.signatures, *(p for g in self.requires for p in g), *self.context, *self.excludes,
                *self.excludes_undone_by]


def _need(data: dict, key: str, kind: type, path: str, optional: bool = False):
    if key not in data:
        if optional:
            return None
        raise CatalogError(path, key, "missing")
    value = data[key]
    if not isinstance(value, kind):
        raise CatalogError(path, key, f"must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def _patterns(raw, path: str, fieldname: str) -> list[Pattern]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise CatalogError(path, fieldname, "must be a list of patterns")
    out = []
    for i, item in enumerate(raw):
        where = f"{fieldname}[{i}]"
        if isinstance(item, str):
            src, fuzzy = item, 0
        elif isinstance(item, dict) and isinstance(item.get("re"), str):
            src, fuzzy = item["re"], item.get("fuzzy", 0)
            if not isinstance(fuzzy, int) or not 0 <= fuzzy <= 5:
                raise CatalogError(path, where + ".fuzzy", "must be an integer from 0 to 5")
        else:
            raise CatalogError(path, where, "must be a regex string or {re: ..., fuzzy: N}")
        try:
            out.append(Pattern.compile(src, fuzzy))
        except (regex.error, OverflowError, RecursionError) as exc:
            raise CatalogError(path, where, f"invalid regex: {exc}")
    return out


def _conditions(raw, path: str, where: str) -> tuple[VersionCondition, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        m = _PACKAGE_CONDITION.match(item) if isinstance(item, str) else None
        if not m:
            raise CatalogError(path, where, f"version condition must look like 'deepspeed>=0.16,<0.17', got {item!r}")
        try:
            spec = SpecifierSet(m.group(2).replace(" ", ""))
        except InvalidSpecifier as exc:
            raise CatalogError(path, where, f"invalid version range: {exc}")
        out.append(VersionCondition(m.group(1).lower().replace("_", "-"), spec, item.strip()))
    return tuple(out)


def _affects(raw, path: str) -> tuple[VersionCondition, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise CatalogError(path, "affects", "must be a non-empty list of version conditions, e.g. ['deepspeed>=0.16.0']")
    conditions = _conditions(raw, path, "affects")
    packages = [c.package for c in conditions]
    if len(set(packages)) != len(packages):
        raise CatalogError(path, "affects", "name each package once (join its bounds with a comma: 'torch>=2.4,<2.6')")
    return conditions


def _if_log(value, path: str, field_name: str) -> stdlib_re.Pattern[str] | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise CatalogError(path, field_name, "must be a regular expression (a string)")
    try:
        return stdlib_re.compile(value, stdlib_re.IGNORECASE)
    except stdlib_re.error as exc:
        raise CatalogError(path, field_name, f"not a valid regular expression: {exc}")


def parse_entry(data, path: str) -> Entry:
    if not isinstance(data, dict):
        raise CatalogError(path, "<root>", "must be a mapping")
    code = _need(data, "code", str, path)
    if not CODE_FORMAT.match(code):
        raise CatalogError(path, "code", f"must look like MGD123, got {code!r}")
    if Path(path).stem != code and not path.startswith("<"):
        raise CatalogError(path, "code", f"file must be named {code}.yaml")
    area = _need(data, "area", str, path)
    if area not in AREAS:
        raise CatalogError(path, "area", f"unknown area {area!r}; one of {', '.join(sorted(AREAS))}")
    match = _need(data, "match", dict, path)
    signatures = _patterns(match.get("signatures"), path, "match.signatures")
    if not signatures:
        raise CatalogError(path, "match.signatures", "needs at least one pattern")
    requires_raw = match.get("requires") or []
    if not isinstance(requires_raw, list):
        raise CatalogError(path, "match.requires", "must be a list of pattern lists")
    requires = []
    for i, group in enumerate(requires_raw):
        group = group if isinstance(group, list) else [group]
        requires.append(_patterns(group, path, f"match.requires[{i}]"))
    triggers = match.get("triggers") or []
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise CatalogError(path, "match.triggers", "must be a list of non-empty strings")
    priority = match.get("priority", 0)
    if not isinstance(priority, (int, float)):
        raise CatalogError(path, "match.priority", "must be a number")
    standalone = match.get("standalone", False)
    if not isinstance(standalone, bool):
        raise CatalogError(path, "match.standalone", "must be true or false")
    excludes_only_after = match.get("excludes_only_after", False)
    if not isinstance(excludes_only_after, bool):
        raise CatalogError(path, "match.excludes_only_after", "must be true or false")
    fixes = []
    for i, item in enumerate(_need(data, "fixes", list, path)):
        if isinstance(item, str):
            fixes.append(Fix(item.strip()))
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            fixes.append(Fix(item["text"].strip(), _conditions(item.get("when"), path, f"fixes[{i}].when"),
                             _if_log(item.get("if_log"), path, f"fixes[{i}].if_log")))
        else:
            raise CatalogError(path, f"fixes[{i}]", "must be a string or {text: ..., when: ..., if_log: ...}")
    if not fixes:
        raise CatalogError(path, "fixes", "needs at least one fix")
    refs = _need(data, "references", list, path)
    if not refs or not all(isinstance(r, str) and r.startswith("http") for r in refs):
        raise CatalogError(path, "references", "needs at least one URL")
    examples = _need(data, "examples", dict, path)
    ex_match = examples.get("match") or []
    ex_no = examples.get("no_match") or []
    if not ex_match or not all(isinstance(e, str) and e.strip() for e in ex_match):
        raise CatalogError(path, "examples.match", "needs at least one log excerpt")
    if not ex_no or not all(isinstance(e, str) and e.strip() for e in ex_no):
        raise CatalogError(path, "examples.no_match", "needs at least one near-miss excerpt")
    title = _need(data, "title", str, path).strip()
    explanation = _need(data, "explanation", str, path).strip()
    if not title:
        raise CatalogError(path, "title", "must not be empty")
    if not explanation:
        raise CatalogError(path, "explanation", "must not be empty")
    return Entry(
        code=code, title=title, area=area, explanation=" ".join(explanation.split()),
        fixes=fixes, references=refs, signatures=signatures, requires=requires,
        context=_patterns(match.get("context"), path, "match.context"),
        excludes=_patterns(match.get("excludes"), path, "match.excludes"),
        excludes_undone_by=_patterns(match.get("excludes_undone_by"), path, "match.excludes_undone_by"),
        triggers=list(triggers), priority=float(priority), standalone=standalone,
        excludes_only_after=excludes_only_after, examples_match=ex_match, examples_no_match=ex_no, path=path,
        affects=_affects(data.get("affects"), path),
    )
