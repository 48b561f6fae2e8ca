"""versions.compat, for real: LLaMA-Factory's ranges are read from the installed LLaMA-Factory's
own source, and the probe runs against this environment and against environments whose
installed versions break those ranges (a venv that sees this stack through a .pth file, with
one package's metadata saying another version: what a half-finished pip install leaves), plus
the catalog's known-bad combinations (`affects`)."""

import importlib.util
import os
import sys
import sysconfig
import venv
from importlib import metadata

import pytest
from mgft_doctor.catalog import CatalogError, load_catalog, parse_entry
from mgft_doctor.check.context import Context, Options
from mgft_doctor.check.probe import Status
from mgft_doctor.probes import _codes
from mgft_doctor.probes import versions_compat as vc
from mgft_doctor.check.runner import run_probe
from mgft_doctor.runconfig import load_run_config
from recorded_runs import payload


def lf_source() -> str:
    spec = importlib.util.find_spec("llamafactory")
    with open(os.path.join(next(iter(spec.submodule_search_locations)), "extras", "misc.py"), encoding="utf-8") as f:
        return f.read()


def installed() -> dict:
    out = {vc.norm(p): metadata.version(p) for p in vc.WATCHED if importlib.util.find_spec(p.replace("-", "_"))}
    out["python"] = "{}.{}.{}".format(*sys.version_info[:3])
    return out


def probe(python=sys.executable, config=None):
    return run_probe(vc.PROBE, Context(Options(python=python, config=config, timeout=120)))


def shadowed_env(tmp_path, fake: dict[str, str]) -> str:
    """A venv that sees this environment's packages through a .pth file, with its own
    dist-info for `fake` packages in front: importlib.metadata reports those versions."""
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    site = next((env / "lib").glob("python3*/site-packages"))
    # every site-packages folder this Python sees (a venv may itself reach its stack through a .pth)
    stack = [p for p in sys.path if p.rstrip("/").endswith("-packages")] or [sysconfig.get_paths()["purelib"]]
    (site / "stack.pth").write_text("\n".join(stack) + "\n")
    for name, version in fake.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(env / "bin" / "python")


# LLaMA-Factory's own ranges, read from its source -------------------------------------------

def test_pins_are_read_from_the_installed_llamafactory():
    pins = vc.lf_runtime_pins(lf_source())
    names = {vc.parse_pin(p)[0] for p in pins}
    assert {"transformers", "datasets", "accelerate", "peft", "trl"} <= names, pins
    assert not vc.check_pins(pins, installed(), "llamafactory")  # this stack is inside them


def test_a_version_outside_the_pin_is_a_violation():
    pins = vc.lf_runtime_pins(lf_source())
    versions = dict(installed(), transformers="4.40.0")
    bad = vc.check_pins(pins, versions, "llamafactory")
    assert [v.package for v in bad] == ["transformers"]
    assert bad[0].installed == "4.40.0" and bad[0].requirement.startswith("transformers>=")
    missing = vc.check_pins(pins, {k: v for k, v in installed().items() if k != "peft"}, "llamafactory")
    assert [(v.package, v.installed) for v in missing] == [("peft", None)]


def test_pins_of_an_older_release_style():
    # LLaMA-Factory 0.9.1's check_dependencies: require_version under an env switch
    source = '''
def check_dependencies() -> None:
    if os.getenv("DISABLE_VERSION_CHECK", "0").lower() in ["true", "1"]:
        logger.warning_once("Version checking has been disabled, may lead to unexpected behaviors.")
    else:
        require_version("transformers>=4.41.2,<=4.46.1", "To fix: pip install transformers>=4.41.2,<=4.46.1")
        require_version("datasets>=2.16.0,<=3.1.0", "To fix: pip install datasets>=2.16.0,<=3.1.0")
        require_version("accelerate>=0.34.0,<=1.0.1", "To fix: pip install accelerate>=0.34.0,<=1.0.1")
        require_version("peft>=0.11.1,<=0.12.0", "To fix: pip install peft>=0.11.1,<=0.12.0")
        require_version("trl>=0.8.6,<=0.9.6", "To fix: pip install trl>=0.8.6,<=0.9.6")
'''
    pins = vc.lf_runtime_pins(source)
    assert pins[0] == "transformers>=4.41.2,<=4.46.1" and len(pins) == 5
    bad = vc.check_pins(pins, {"transformers": "4.46.2", "datasets": "3.1.0", "accelerate": "1.0.1",
                               "peft": "0.12.0", "trl": "0.9.6"}, "llamafactory 0.9.1")
    assert [v.package for v in bad] == ["transformers"]
    # a source that no longer parses still yields its pins
    assert vc.lf_runtime_pins(source + "\ndef broken(:\n") == pins


# Known-bad combinations from the catalog ------------------------------------------------------

def test_catalog_affects_marks_deepspeed_016_with_old_transformers():
    entries = load_catalog()
    hit = lambda **v: [e.code for e in vc.known_bad(entries, v)]
    assert "MGD601" in hit(deepspeed="0.16.0", transformers="4.46.1")
    assert "MGD601" in hit(deepspeed="0.16.4", transformers="4.47.0")
    assert "MGD601" not in hit(deepspeed="0.16.0", transformers="4.47.1")  # first release with the Trainer fix
    assert "MGD601" not in hit(deepspeed="0.15.4", transformers="4.46.1")  # before the assertion
    assert "MGD601" not in hit(transformers="4.46.1")  # no deepspeed: nothing to hit


def test_the_probe_reads_every_entry_with_affects_and_only_those():
    """versions.compat loads the entries with `affects` alone (the whole catalog compiles every
    pattern): the same entries as the full load has."""
    subset = vc.entries_with_affects()
    assert [e.code for e in subset] == [e.code for e in load_catalog() if e.affects]
    assert "MGD601" in {e.code for e in subset}


def test_affects_is_validated():
    base = {"code": "MGD999", "title": "t", "area": "versions", "match": {"signatures": ["x"]},
            "explanation": "e", "fixes": ["f"], "references": ["https://example.org"],
            "examples": {"match": ["x"], "no_match": ["y"]}}
    assert parse_entry(dict(base, affects=["deepspeed>=0.16", "torch<2.6"]), "<t>").affects[1].package == "torch"
    for bad in ("deepspeed>=0.16", ["deepspeed"], ["deepspeed>=0.16", "deepspeed<0.17"], []):
        with pytest.raises(CatalogError):
            parse_entry(dict(base, affects=bad), "<t>")


# The sections on recorded payloads (fast) -----------------------------------------------------

def versions_of(d):
    return dict({vc.norm(k): v for k, v in d["versions"].items()}, python=d["python"])


def test_sections_pass_on_this_stacks_payload():
    d = payload("versions_here")
    v = vc.judge(d, d["executable"], None, 0.4)
    assert v.status is Status.PASS and "within llamafactory" in v.summary and "no known-bad combination" in v.summary
    assert vc.lf_ranges(d, versions_of(d), d["requires"], d["markers"], None)[0] == []


def test_lf_ranges_on_a_payload_with_transformers_440():
    d = payload("versions_transformers_4.40")
    requires = {vc.norm(k): r for k, r in d["requires"].items()}
    found, details = vc.lf_ranges(d, versions_of(d), requires, d["markers"], None)
    assert [(f.code, f.severity) for f in found] == [(_codes.VERSION_OUTSIDE_PIN, Status.FAIL)]
    assert "found transformers 4.40.0" in found[0].message and "refuses to start" in found[0].message
    assert details[0].startswith(f"llamafactory {d['versions']['llamafactory']}: check_dependencies() requires")
    relaxed = dict(d, env={"DISABLE_VERSION_CHECK": "1"})
    assert [f.severity for f in vc.lf_ranges(relaxed, versions_of(d), requires, d["markers"], None)[0]] == [Status.WARN]
    conflicts = vc.requirement_conflicts(versions_of(d), requires, d["markers"])
    assert conflicts and all(f.severity is Status.WARN for f in conflicts) and any("trl" in f.message for f in conflicts)


def test_known_bad_section_against_the_run(tmp_path):
    d = payload("versions_here")
    versions = dict(versions_of(d), transformers="4.46.1")
    bad = vc.known_bad(load_catalog(), versions)
    found, _ = vc.known_bad_for_this_run(bad, versions, None)
    assert [(f.code, f.severity) for f in found if f.code == "MGD601"] == [("MGD601", Status.WARN)]
    (tmp_path / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3}}')
    (tmp_path / "train.yaml").write_text("model_name_or_path: x\nstage: sft\ndeepspeed: ds_z3.json\n"
                                         "gradient_accumulation_steps: 8\n")
    found, _ = vc.known_bad_for_this_run(bad, versions, load_run_config(str(tmp_path / "train.yaml")))
    assert [(f.code, f.severity) for f in found if f.code == "MGD601"] == [("MGD601", Status.FAIL)]


def test_a_bare_pythons_payload(tmp_path):
    d = payload("versions_bare")
    v = vc.judge(d, "/bare/python", None, 0.3)
    assert v.status is Status.PASS and "llamafactory is not installed: its ranges are not checked" in v.details
    (tmp_path / "train.yaml").write_text("model_name_or_path: x\nstage: sft\n")
    found, _ = vc.lf_ranges(d, versions_of(d), {}, d["markers"], load_run_config(str(tmp_path / "train.yaml")))
    assert [f.code for f in found] == [_codes.LF_MISSING] and "llamafactory is not installed" in found[0].message


# Real runs -----------------------------------------------------------------------------------

def test_passes_with_this_stack():
    r = probe()
    assert r.status is Status.PASS, (r.summary, r.findings)
    assert r.metrics["versions"]["llamafactory"] == metadata.version("llamafactory")
    assert "within llamafactory" in r.summary and "no known-bad combination" in r.summary
    assert any("check_dependencies() requires transformers>=" in d for d in r.details)


def test_fails_when_llamafactorys_pin_is_violated(tmp_path, monkeypatch):
    monkeypatch.delenv("DISABLE_VERSION_CHECK", raising=False)
    python = shadowed_env(tmp_path, {"transformers": "4.40.0"})
    r = probe(python=python)
    assert r.status is Status.FAIL, (r.summary, r.findings)
    pin = [f for f in r.findings if f.code == _codes.VERSION_OUTSIDE_PIN and f.severity is Status.FAIL]
    assert len(pin) == 1 and "found transformers 4.40.0" in pin[0].message and "refuses to start" in pin[0].message
    assert "pip install 'transformers>=" in pin[0].fix
    # trl declares transformers>= too: what pip check sees, as a warning
    assert any(f.code == _codes.VERSION_OUTSIDE_PIN and "trl" in f.message for f in r.findings)
    # with LLaMA-Factory's own switch off, it starts: a warning
    monkeypatch.setenv("DISABLE_VERSION_CHECK", "1")
    r = probe(python=python)
    assert r.status is Status.WARN
    assert all(f.severity is Status.WARN for f in r.findings)


def test_known_bad_combination_warns_and_fails_for_a_run_that_hits_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DISABLE_VERSION_CHECK", "1")  # transformers 4.46.1 is also outside LLaMA-Factory's pins
    python = shadowed_env(tmp_path, {"transformers": "4.46.1"})
    r = probe(python=python)
    mgd601 = [f for f in r.findings if f.code == "MGD601"]
    assert len(mgd601) == 1 and mgd601[0].severity is Status.WARN
    assert "transformers 4.46.1" in mgd601[0].message and "deepspeed " in mgd601[0].message
    # the user's run: ZeRO-3 with accumulation -> certain
    (tmp_path / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": "auto"}')
    (tmp_path / "train.yaml").write_text("model_name_or_path: x\nstage: sft\ndeepspeed: ds_z3.json\n"
                                         "gradient_accumulation_steps: 8\n")
    r = probe(python=python, config=str(tmp_path / "train.yaml"))
    mgd601 = [f for f in r.findings if f.code == "MGD601"]
    assert r.status is Status.FAIL and mgd601[0].severity is Status.FAIL
    assert "ZeRO-3, gradient_accumulation_steps 8" in mgd601[0].message
    # ZeRO-3 without accumulation: does not apply to this run
    (tmp_path / "train1.yaml").write_text("model_name_or_path: x\nstage: sft\ndeepspeed: ds_z3.json\n")
    r = probe(python=python, config=str(tmp_path / "train1.yaml"))
    assert not [f for f in r.findings if f.code == "MGD601"]
    assert any("MGD601" in d and "not this run" in d for d in r.details)


def test_a_python_without_the_stack_is_read_without_crashing(tmp_path):
    env = tmp_path / "bare"
    venv.create(env, with_pip=False)
    r = probe(python=str(env / "bin" / "python"))
    assert r.status is Status.PASS, (r.summary, r.findings)
    assert any("llamafactory is not installed" in d for d in r.details)
