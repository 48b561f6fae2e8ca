"""The explain/1 contract: a diagnosis, the report, and its JSON (DESIGN.md §5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..text import mask_data
from .advice import Advice
from .lines import LogLine
from .phase import Phase

SCHEMA = "mgft-doctor/explain/1"


@dataclass
class Diagnosis:
    code: str
    title: str
    confidence: float
    explanation: str
    fixes: list[str]
    evidence: list[LogLine]
    rank: int | None
    references: list[str]
    focus: list[int] | None = None  # the fixes a terminal report shows without -v (None: all)


@dataclass
class ExplainReport:
    sources: list[str]
    failure: bool
    diagnoses: list[Diagnosis]
    root_error: LogLine | None
    root_kind: str | None
    failed_rank: int | None
    exit_codes: list[int]
    versions: dict[str, str]
    version_origin: dict[str, str] = field(default_factory=dict)
    launcher_rank: int | None = None  # the rank torchrun's summary named (the first to exit)
    consequences: list[LogLine] = field(default_factory=list)  # other ranks' timeouts/lost peers after the root
    phase: Phase | None = None  # what the run was doing when the root error came
    advice: Advice | None = None  # the frame that raised it, the YAML key it names, next steps
    root_detail: list[LogLine] = field(default_factory=list)  # the lines carrying the root's message (header continuation, assert statement)
    job: str = "training"  # or "export", "checkpoint conversion": what the failed program was
    bytes_read: int = 0
    lines_read: int = 0

    def to_json(self) -> dict:
        self = mask_data(self)  # no secret of the log leaves in the JSON (masked before any cut)
        multi = len(self.sources) > 1

        def ev(line: LogLine) -> dict:
            d = {"line": line.no, "text": line.text.strip()[:500]}
            if multi:
                d["file"] = self.sources[line.source]
            return d

        out = {
            "schema": SCHEMA,
            "failure": self.failure,
            "diagnoses": [
                {"code": d.code, "title": d.title, "confidence": d.confidence,
                 "explanation": d.explanation, "fixes": d.fixes,
                 "evidence": [ev(e) for e in d.evidence], "rank": d.rank,
                 "references": d.references}
                for d in self.diagnoses
            ],
            "root_error": ev(self.root_error) if self.root_error else None,
            "failed_rank": self.failed_rank,
            "exit_codes": sorted(set(self.exit_codes)),
            "versions": self.versions,
        }
        if self.failure:  # additive fields of explain/1, present when there is a failure to place
            out["job"] = self.job
            out["phase"] = self.phase.name if self.phase else None
            out["progress"] = self.phase.progress_json() if self.phase else None
            out["next_steps"] = self.advice.next_steps if self.advice else []
            if out["root_error"] is not None and self.advice is not None:
                if self.advice.frame is not None:
                    out["root_error"]["frame"] = self.advice.frame.to_json()
                if self.advice.yaml_key:
                    out["root_error"]["yaml_key"] = self.advice.yaml_key
            if out["root_error"] is not None and self.root_detail:
                out["root_error"]["detail"] = [ev(ln) for ln in self.root_detail]
        return out
