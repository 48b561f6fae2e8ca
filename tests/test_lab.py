"""The fault lab (DESIGN.md §5c): every log that a real run recorded under tests/lab/<id>/ must be
diagnosed with the fault's expected code (explain's CLI, the stable contract); three fast faults are
reproduced live end to end so the lab cannot rot.

A fault whose log explain does not yet get right carries `xfail: "reason"` (or `xfail: {cpu: ..., gpu:
...}`) in its fault.yaml: the test is then xfail(strict=True) and turns into a failure once it passes.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "tests" / "lab"
RUNNER = REPO / "bench" / "lab.py"


def _faults():
    for d in sorted(LAB.iterdir()):
        if (d / "fault.yaml").is_file():
            yield d.name, yaml.safe_load((d / "fault.yaml").read_text())


FAULTS = dict(_faults())


def _expected(fault, dev):
    per = fault.get(dev) or {}
    return per["expect"] if "expect" in per else fault["expect"]


def _xfail(fault, dev):
    x = fault.get("xfail")
    return x.get(dev) if isinstance(x, dict) else x


def _explain(log: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", str(log), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _check(fault, dev, report):
    diags = [d["code"] for d in report["diagnoses"]]
    assert report["failure"], "explain saw no failure in a log of a failed run"
    expect = _expected(fault, dev)
    if expect is None:
        assert not diags, f"expected no catalog diagnosis, got {diags}"
    else:
        assert diags and diags[0] == expect, f"expected {expect} first, got {diags}; root: {report['root_error']}"
    if fault.get("root"):
        root = (report.get("root_error") or {}).get("text") or ""
        assert re.search(fault["root"], root), f"root error {root!r} does not match {fault['root']!r}"


LOGS = []
for fid, fault in FAULTS.items():
    for dev in ("cpu", "gpu"):
        if (LAB / fid / f"{dev}.log").is_file():
            reason = _xfail(fault, dev)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            LOGS.append(pytest.param(fid, dev, id=f"{fid}-{dev}", marks=marks))


@pytest.mark.parametrize("fid,dev", LOGS)
def test_recorded_log_gets_the_expected_code(fid, dev):
    _check(FAULTS[fid], dev, _explain(LAB / fid / f"{dev}.log"))


# A fault's fix rerun that exited 0 (<id>/cpu.fix.log, gpu.fix.log), and planted faults that turned out not to
# fail (_healthy/: the stack accepted the setup, so the run is healthy, with the warnings it printed).
HEALTHY = ([pytest.param(LAB / fid / f"{dev}.fix.log", id=f"{fid}-{dev}-fix") for fid in FAULTS
            for dev in ("cpu", "gpu") if (LAB / fid / f"{dev}.fix.log").is_file()]
           + [pytest.param(p, id=f"_healthy-{p.name}") for p in sorted((LAB / "_healthy").glob("*.log"))])


@pytest.mark.parametrize("log", HEALTHY)
def test_a_passing_run_is_healthy(log):
    """A run that exited 0: its log (warnings, NCCL and DeepSpeed chatter, fallbacks) is no failure."""
    report = _explain(log)
    assert report["failure"] is False and not report["diagnoses"], (
        f"a passing run was reported as a failure: {[d['code'] for d in report['diagnoses']]};"
        f" root: {report.get('root_error')}")


def test_lab_is_large_and_well_formed():
    codes = {c["code"] for c in json.loads(subprocess.run(
        [sys.executable, "-m", "mgft_doctor", "codes", "--json"], capture_output=True, text=True,
        timeout=120).stdout)}
    assert len(FAULTS) >= 60
    for fid, fault in FAULTS.items():
        assert fault["id"] == fid
        for dev in ("cpu", "gpu"):
            if (LAB / fid / f"{dev}.log").is_file():
                exp = _expected(fault, dev)
                assert exp is None or exp in codes, f"{fid}: expect {exp} is not a catalog code"
        assert fault.get("fix") and fault["fix"].get("what"), f"{fid}: no fix described"
        logs = [d for d in ("cpu", "gpu") if (LAB / fid / f"{d}.log").is_file()]
        assert logs, f"{fid}: no recorded log"
        verified = fault.get("fix_verified") if "cpu" in logs else fault.get("gpu_fix_verified",
                                                                              fault.get("fix_verified"))
        assert verified is True, f"{fid}: the fix was not verified by a rerun"
        for d in logs:
            assert (LAB / fid / f"{d}.log").stat().st_size <= 310_000, f"{fid}/{d}.log is not trimmed"


# Three fast faults from three areas, each through another launcher: plain torchrun + gloo (nccl-hang),
# torchrun + a DeepSpeed script (ds-config), llamafactory-cli with FORCE_TORCHRUN (llamafactory). Each takes well under a minute on two CPU cores.
LIVE = ["hang-rank1-crashes-peer-waits", "ds-batch-arithmetic", "hparam-unknown-key"]


@pytest.mark.slow
@pytest.mark.parametrize("fid", LIVE)
def test_fault_reproduces_live(fid, tmp_path):
    pytest.importorskip("deepspeed")
    pytest.importorskip("llamafactory")
    env = dict(os.environ, MGFT_LAB_WORK=str(tmp_path / "work"))
    proc = subprocess.run([sys.executable, str(RUNNER), "run", fid, "--out", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = tmp_path / "logs" / f"{fid}.cpu.log"
    assert log.is_file() and log.stat().st_size > 0
    _check(FAULTS[fid], "cpu", _explain(log))
