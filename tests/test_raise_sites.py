"""bench/raise_sites.py: the libraries' own error sites, matched through the real explain
pipeline. The LLaMA-Factory and transformers/accelerate DeepSpeed groups are fast (a few
seconds) and must stay >= 95% matched; DeepSpeed and torch.distributed take longer (marked slow)
and must stay >= 60%. A planted package proves that an unknown message is reported unmatched."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "raise_sites.py"
FLOORS = {"llamafactory": 0.95, "hf-deepspeed": 0.95, "deepspeed": 0.60, "torch-distributed": 0.60}


def _load():
    spec = importlib.util.spec_from_file_location("raise_sites", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["raise_sites"] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


rs = _load()
ROOT = rs.site_packages()


def _group(name: str):
    marker = {"llamafactory": "llamafactory", "hf-deepspeed": "transformers", "deepspeed": "deepspeed",
              "torch-distributed": "torch"}[name]
    if not (ROOT / marker).is_dir():
        pytest.skip(f"{marker} is not installed in {ROOT}")
    return rs.GROUPS[name]


def _coverage(name: str):
    sites = rs.run(ROOT, [_group(name)], jobs=1)
    summary = rs.summarise(sites)[name]
    return sites, summary


@pytest.mark.parametrize("name", ["llamafactory", "hf-deepspeed"])
def test_fast_groups_meet_their_floor(name):
    sites, summary = _coverage(name)
    considered = summary["total"] - summary["excluded"]
    assert considered > 40, f"{name}: only {considered} sites found; did the scanner break?"
    unmatched = [f"{s.where} {s.template[:90]!r}" for s in sites if not s.excluded and not s.code]
    assert rs.coverage(summary) >= FLOORS[name], f"{name}: {summary}; unmatched:\n" + "\n".join(unmatched)
    # every exclusion names one of the documented rules
    assert all(s.excluded in rs.EXCLUSION_RULES for s in sites if s.excluded)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepspeed", "torch-distributed"])
def test_slow_groups_meet_their_floor(name):
    sites, summary = _coverage(name)
    assert summary["total"] - summary["excluded"] > 100
    assert rs.coverage(summary) >= FLOORS[name], summary


PLANTED = '''
import logging

logger = logging.getLogger(__name__)


def load(cfg):
    if cfg.get("zorp"):
        raise ValueError(f"The flux capacitor {cfg['zorp']} refuses to quibble with the gradient gnomes.")
    if cfg.get("deepspeed") and not cfg.get("torchrun"):
        raise ValueError("Please use `FORCE_TORCHRUN=1` to launch DeepSpeed training.")
    assert cfg.get("wibble"), "Wibble sprockets must be aligned before the frobnication."


class Base:
    def step(self):
        raise NotImplementedError
'''


def test_planted_site_is_reported_unmatched(tmp_path):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(PLANTED)
    group = rs.Group("planted", [rs.Spec("fakepkg/**/*.py")])
    sites = rs.run(tmp_path, [group])
    by_message = {s.template: s for s in sites}

    flux = by_message["The flux capacitor {…} refuses to quibble with the gradient gnomes."]
    assert flux.excluded is None and flux.code is None, (flux.diagnoses, flux.evidence)
    assert flux.where == "fakepkg/train.py:9" and flux.function == "load" and flux.exc_type == "ValueError"
    wibble = by_message["Wibble sprockets must be aligned before the frobnication."]
    assert wibble.kind == "assert" and wibble.code is None

    # a known message planted next to them is matched (the scanner is not blind)
    known = by_message["Please use `FORCE_TORCHRUN=1` to launch DeepSpeed training."]
    assert known.code == "MGD906"

    # the abstract method is excluded, and counted as such
    summary = rs.summarise(sites)["planted"]
    assert summary == {"total": 4, "matched": 1, "excluded": 1, "excluded_by": {"abstract": 1}}


def test_cli_json_lists_unmatched_sites(tmp_path, capsys):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "train.py").write_text(PLANTED)
    rs.GROUPS["planted-cli"] = rs.Group("planted-cli", [rs.Spec("fakepkg/**/*.py")])
    try:
        assert rs.main(["--site-packages", str(tmp_path), "--group", "planted-cli", "--json", "--unmatched",
                        "--jobs", "1"]) == 0
    finally:
        del rs.GROUPS["planted-cli"]
    out = json.loads(capsys.readouterr().out)
    assert out["groups"]["planted-cli"]["total"] == 4
    assert {s["template"] for s in out["sites"]} == {
        "The flux capacitor {…} refuses to quibble with the gradient gnomes.",
        "Wibble sprockets must be aligned before the frobnication.",
    }


@pytest.mark.slow
def test_full_torchrun_summary_gives_the_same_verdicts():
    """The default site log ends at torchrun's line for the failed rank; with the whole
    ChildFailedError summary after it the matcher must reach the same verdicts."""
    group = _group("hf-deepspeed")
    short = rs.run(ROOT, [group])
    rs.FULL_SUMMARY = True
    try:
        full = rs.run(ROOT, [group])
    finally:
        rs.FULL_SUMMARY = False
    assert [(s.where, s.code) for s in short] == [(s.where, s.code) for s in full]
