"""The shared worker (doctor/check/shared.py): sections read as the worker prints them, each with
its own output, phases and limit; a section past its limit stops the whole worker (no process
left); a worker that dies mid-section gives that section its exit code and output; a section
never begun is None (the probe then runs its own worker). Real processes: small scripts that
speak the workers' protocol (probes/workers/_protocol.py), run through run_limited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from mgft_doctor.check.shared import Limit, SharedWorker
from mgft_doctor.launch.processes import processes_with_token
from mgft_doctor.launch import workers_dir


def script(tmp_path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(workers_dir())!r})
        from _protocol import emit, phase
        def begin(name): phase("section:" + name)
        def answer(name, payload): emit({{"section": name, "payload": payload}})
    """) + textwrap.dedent(body))
    return str(path)


def worker(tmp_path, body: str, limits: list[Limit]) -> SharedWorker:
    return SharedWorker(sys.executable, {}, limits, script=script(tmp_path, body)).start()


def test_sections_come_in_order_each_with_its_own_output_and_phases(tmp_path):
    w = worker(tmp_path, """
        begin("facts"); print("reading facts"); phase("import_torch")
        answer("facts", {"device_count": 0})
        begin("ds_install"); print("ds says hi"); time.sleep(0.3)
        answer("ds_install", {"deepspeed": "0.1"})
    """, [Limit("facts", 60), Limit("ds_install", 60)])
    facts = w.section("facts")
    assert facts.payload == {"device_count": 0} and facts.phases == ["import_torch"]
    assert facts.log.strip() == "reading facts"
    install = w.section("ds_install")
    assert install.payload == {"deepspeed": "0.1"} and install.log.strip() == "ds says hi" and install.phases == []
    assert 0.25 < install.wall_s < 30
    assert w.section("op:cpu_adam") is None  # not asked for: the probe runs its own worker at once
    w.close()
    assert w.ended and processes_with_token(w.token) == []


def test_a_section_past_its_limit_stops_the_whole_worker(tmp_path):
    t0 = time.monotonic()
    w = worker(tmp_path, """
        import subprocess
        begin("facts"); answer("facts", {"device_count": 0})
        begin("ds_install"); phase("import_deepspeed")
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child of the hung section
        time.sleep(600)
    """, [Limit("facts", 60), Limit("ds_install", 1.5), Limit("op:", 60, group="ops")])
    assert w.section("facts").payload == {"device_count": 0}
    hung = w.section("ds_install")
    assert hung.timed_out and hung.payload is None and hung.phases == ["import_deepspeed"]
    assert 1.5 <= hung.wall_s < 30 and time.monotonic() - t0 < 40
    assert w.section("op:cpu_adam") is None  # never begun: the probe builds it in its own worker
    w.close()
    assert processes_with_token(w.token) == []


def test_a_hang_before_the_first_answer_is_the_first_sections(tmp_path):
    w = worker(tmp_path, "time.sleep(600)\n", [Limit("facts", 1.0), Limit("ds_install", 60)])
    facts = w.section("facts")
    assert facts.timed_out and facts.payload is None
    assert w.section("ds_install") is None
    w.close()


def test_a_worker_that_dies_mid_section_gives_its_exit_code_and_output(tmp_path):
    w = worker(tmp_path, """
        begin("facts"); answer("facts", {"device_count": 0})
        begin("op:cpu_adam"); phase("build"); print("g++: fatal error: killed", flush=True)
        os._exit(7)
    """, [Limit("facts", 60), Limit("op:", 60, group="ops")])
    died = w.section("op:cpu_adam")
    assert not died.timed_out and died.payload is None and died.returncode == 7
    assert "fatal error" in died.log and died.phases == ["build"]
    assert w.section("op:fused_adam") is None
    w.close()


def test_a_busy_section_goes_on_past_its_limit(tmp_path, monkeypatch):
    """As run_script's busy_limit: a section still using CPU at its limit (a compiler) goes on."""
    from mgft_doctor.check import shared

    monkeypatch.setattr(shared, "BUSY_WINDOW_S", 0.5)
    monkeypatch.setattr(shared, "BUSY_MIN_CPU_S", 0.1)
    w = worker(tmp_path, """
        begin("facts"); answer("facts", {})
        begin("op:cpu_adam"); t = time.monotonic()
        while time.monotonic() - t < 3: pass
        answer("op:cpu_adam", {"stage": "done"})
    """, [Limit("facts", 60), Limit("op:", 1.0, busy_s=60, group="ops")])
    done = w.section("op:cpu_adam")
    assert done.payload == {"stage": "done"} and not done.timed_out
    w.close()


def test_a_python_that_cannot_start(tmp_path):
    w = SharedWorker(str(tmp_path / "no-python"), {}, [Limit("facts", 60)]).start()
    facts = w.section("facts")
    assert facts.payload is None and facts.log.startswith(f"cannot run {tmp_path / 'no-python'}: ")
    w.close()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
                         ids=["sigint", "sigterm"])
def test_the_whole_check_stopped_while_the_shared_worker_runs(tmp_path, sig, code, word):
    """Ctrl-C or SIGTERM while the shared worker reads the facts: one line, no process left."""
    from launch_helpers import MARK_VAR, kill_marked, marked_processes, new_mark, wait_until

    mark = new_mark()
    env = dict(os.environ, **{MARK_VAR: mark})
    doctor = subprocess.Popen([sys.executable, "-m", "mgft_doctor", "check", "--json"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: any("stack.py" in cmd for _, cmd in marked_processes(mark)), 60)
        doctor.send_signal(sig)
        out, err = doctor.communicate(timeout=60)
    finally:
        doctor.kill()
        left = marked_processes(mark)
        kill_marked(mark)
    assert doctor.returncode == code and err == f"mgft-doctor: {word}\n" and out == ""
    assert left == []
