import json
import os
import subprocess
import sys

import pytest


def doctor(*args, env=None, timeout=600, input=None):
    """Run the real CLI; returns (exit code, stdout, stderr)."""
    full_env = dict(os.environ)
    full_env.pop("MGFT_DOCTOR_INJECT_FAULT", None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "mgft_doctor", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, input=input)
    return proc.returncode, proc.stdout, proc.stderr


def check_json(*args, env=None, timeout=600):
    code, out, err = doctor(*args, "--json", env=env, timeout=timeout)
    assert out.strip(), f"no JSON (exit {code}): {err[-2000:]}"
    data = json.loads(out)
    assert data["schema"] == "mgft-doctor/check/1"
    return code, {p["id"]: p for p in data["probes"]}, err


@pytest.fixture
def run_doctor():
    return doctor


@pytest.fixture
def run_check():
    return check_json
