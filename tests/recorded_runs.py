"""Worker runs recorded for real (tests/fixtures/payloads/record.py runs each worker once, here or
in an environment made broken for real, and saves it), for the fast tests of the probes' section
functions: the same verdict code as a real run, in milliseconds."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from mgft_doctor.launch.script import ScriptRun

PAYLOADS = Path(__file__).parent / "fixtures" / "payloads"


def recorded(name: str) -> ScriptRun:
    data = json.loads((PAYLOADS / f"{name}.json").read_text(encoding="utf-8"))
    return ScriptRun(command=[], returncode=data["returncode"], timed_out=data["timed_out"], wall_s=data["wall_s"],
                     log=data["log"], payload=data["payload"], phases=data.get("phases", []))


def payload(name: str, **changes) -> dict:
    """A recorded payload, with `changes` (what another machine would have said) applied on top."""
    d = copy.deepcopy(recorded(name).payload)
    d.update(changes)
    return d
