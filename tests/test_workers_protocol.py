"""The workers' side of the protocol (probes/workers/_protocol.py): every worker is a plain
script that imports nothing of mgft_doctor, speaks through _protocol (no MARK of its own), and
runs through the launch package, so a hung one is killed with its whole process tree."""

import ast
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from mgft_doctor.check.facts import read_facts
from mgft_doctor.launch import script, worker_script, workers_dir
from mgft_doctor.probes.workers import _protocol

WORKERS = Path(workers_dir())
NAMES = sorted(p.stem for p in WORKERS.glob("*.py") if p.stem != "__init__")
SCRIPTS = [n for n in NAMES if not n.startswith("_")]  # what the doctor runs; _name: the helpers they import


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in a file, relative ones as '.name'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(("." * node.level + (node.module or ""), node.lineno))
    return found


def test_the_workers_folder_is_found():
    assert {"_protocol", "facts", "p2p", "zero3_model"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_worker_imports_nothing_of_the_package(name):
    bad = [f"{name}.py:{line} imports {mod}" for mod, line in imported_modules(WORKERS / f"{name}.py")
           if mod.startswith(".") or mod.split(".")[0] == "mgft_doctor"]
    assert not bad, "workers run in the examined Python, which need not have mgft-doctor:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_worker_speaks_through_the_protocol_module(name):
    source = (WORKERS / f"{name}.py").read_text(encoding="utf-8")
    assert "_protocol" in {mod for mod, _ in imported_modules(WORKERS / f"{name}.py")}
    assert _protocol.MARK.strip() not in source and _protocol.PHASE.strip() not in source  # no MARK of its own
    assert "sys.argv" not in source  # arguments come through parse_argv / script_args


def test_both_ends_read_the_same_lines():
    assert (script.MARK, script.PHASE) == (_protocol.MARK, _protocol.PHASE)


def test_workers_import_without_the_package_installed(tmp_path):
    """Run as the examined Python runs them: the workers' folder on sys.path, mgft_doctor absent.
    Importing a worker runs only its imports (main() waits for __name__ == '__main__').
    run_function goes last: it takes the workers' folder off sys.path (the user's modules come first)."""
    order = [n for n in NAMES if n != "run_function"] + ["run_function"]
    code = textwrap.dedent(f"""
        import importlib, sys
        class NoDoctor:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "mgft_doctor":
                    raise ImportError("mgft_doctor is not installed here")
        sys.meta_path.insert(0, NoDoctor())
        sys.path.insert(0, {str(WORKERS)!r})
        for name in {order!r}:
            importlib.import_module(name)
        assert sys.modules["_moe"]._shrink is sys.modules["_shrink"]
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_error_fields_give_type_message_and_traceback_tail():
    try:
        raise ValueError("x" * 50)
    except ValueError as exc:
        fields = _protocol.error_fields(exc, error_chars=10, traceback_chars=40)
    assert fields["error_type"] == "ValueError" and fields["error"] == "x" * 10
    assert fields["traceback"] == "x" * 39 + "\n"  # the tail of "ValueError: xxx...x"


def test_a_single_process_worker_reports_through_mark_and_phase(tmp_path):
    """p2p on this machine: a MARK line read by run_script, the phases it announced on the way."""
    res = script.run_script(sys.executable, worker_script("p2p"), {"size_mb": 1}, timeout=120)
    assert res.ok, res.log[-2000:]
    n = res.payload["device_count"]
    assert len(res.payload["pairs"]) == n * (n - 1)
    assert res.phases[0] == "import_torch"
    assert _protocol.MARK not in res.log and _protocol.PHASE not in res.log


def test_facts_read_through_the_launch_package():
    facts = read_facts(sys.executable)
    assert facts.torch_ok, facts.raw
    assert {"python", "executable", "cuda_visible_devices", "torch", "torch_cuda", "torch_file", "distributed",
            "nccl_available", "nccl_version", "cuda_available", "device_count", "devices"} <= set(facts.raw)


def test_facts_from_a_python_that_cannot_start():
    facts = read_facts("/nonexistent/bin/python")
    assert facts.raw["facts_error"].startswith("cannot run /nonexistent/bin/python: ")
    assert not facts.torch_ok and facts.gpu_count == 0


def test_facts_from_a_python_that_hangs_are_killed_with_its_children(tmp_path):
    seconds = 30000 + uuid.uuid4().int % 10000  # names this test's sleeps in ps
    hanging = tmp_path / "python"
    hanging.write_text(f"#!/bin/sh\nsleep {seconds} &\nexec sleep {seconds + 1}\n")
    hanging.chmod(0o755)
    facts = read_facts(str(hanging), timeout=2)
    assert facts.raw == {"facts_error": "reading torch's facts took over 2 s (a hung driver or import)"}
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout.splitlines()
    assert not [ln for ln in ps if ln.strip() in (f"sleep {seconds}", f"sleep {seconds + 1}")]
