"""The probe list and how a selection is made from it: the ordered MODULES of mgft_doctor.probes
(order matters: a probe runs after the probes it needs), --only/--skip by id or family, and the
closure over `needs` that the pytest marker uses."""

from __future__ import annotations

import importlib
from typing import Iterable

from ..errors import DoctorError
from .probe import Probe


PROBES_PACKAGE = "mgft_doctor.probes"  # loaded by name, as pytest loads its default plugins


def all_probes() -> list[Probe]:
    modules = importlib.import_module(PROBES_PACKAGE).MODULES
    return [importlib.import_module(f"{PROBES_PACKAGE}.{name}").PROBE for name in modules]


def matches(probe_id: str, selectors: Iterable[str]) -> bool:
    return any(probe_id == s or probe_id.startswith(s.rstrip(".") + ".") for s in selectors)


def select(probes: list[Probe], only: list[str] | None, skip: list[str] | None) -> list[Probe]:
    known = {p.id for p in probes} | {p.family for p in probes}
    for s in [*(only or []), *(skip or [])]:
        if s.rstrip(".") not in known:
            raise DoctorError(f"unknown probe id or family {s!r}; known: {', '.join(sorted(known))}")
    chosen = [p for p in probes if not only or matches(p.id, only)]
    return [p for p in chosen if not skip or not matches(p.id, skip)]


def with_needs(registry: list[Probe], chosen: list[Probe]) -> list[Probe]:
    """chosen plus every probe they need, transitively, in registry order."""
    by_id = {p.id: p for p in registry}
    want: set[str] = set()
    todo = [p.id for p in chosen]
    while todo:
        pid = todo.pop()
        if pid in want or pid not in by_id:
            continue
        want.add(pid)
        todo.extend(by_id[pid].needs)
    return [p for p in registry if p.id in want]
