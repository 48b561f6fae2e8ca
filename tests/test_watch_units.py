"""The parts of `mgft-doctor run` that need no real run: reading faulthandler and py-spy dumps,
reading Flight Recorder dumps (torch's JSON and pickle), the who-is-where analysis and its
catalog entry per pattern, the rank-side sitecustomize (chaining, registration), the run's
environment, and the command line's bad input (a missing command, an unwritable log)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from mgft_doctor.watch import analysis, stacks, traces
from mgft_doctor.watch.folder import make_run_folder, run_environment, sitecustomize_dir
from mgft_doctor.watch.procs import Proc

DOCTOR = [sys.executable, "-m", "mgft_doctor"]

FAULTHANDLER = '''\
Thread 0x00007f5c2effd640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/opt/venv/lib/python3.11/site-packages/tqdm/_monitor.py", line 60 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f5c3a1fb740 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4635 in barrier
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/opt/venv/lib/python3.11/site-packages/transformers/training_args.py", line 2410 in main_process_first
  File "/usr/lib/python3.11/contextlib.py", line 137 in __enter__
  File "/opt/venv/lib/python3.11/site-packages/llamafactory/data/loader.py", line 302 in get_dataset
  File "/srv/train.py", line 40 in main
  File "/srv/train.py", line 50 in <module>
'''

PY_SPY = '''\
Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    _map_single (datasets/arrow_dataset.py:3350)
    map (datasets/arrow_dataset.py:3000)
    tokenize_all (/srv/train.py:22)
    <module> (/srv/train.py:50)
Thread 4250 (idle): "Thread-1"
    wait (threading.py:331)
'''


def test_faulthandler_dump_main_thread_and_collective():
    threads = stacks.parse_faulthandler(FAULTHANDLER)
    assert len(threads) == 2
    main = stacks.main_thread(threads)
    assert main.frames[0].func == "barrier" and main.frames[-1].func == "<module>"
    call, caller = stacks.collective_frame(main.frames)
    assert call.func == "barrier" and caller.func == "main_process_first"
    assert stacks.users_frame(main.frames).short() == "main (srv/train.py:40)"


def test_py_spy_dump_and_top_frame():
    threads = stacks.parse_py_spy(PY_SPY)
    main = stacks.main_thread(threads)
    assert main.name == "MainThread"
    assert stacks.top_frame(main.frames).short() == "_map_single (datasets/arrow_dataset.py:3350)"
    assert stacks.collective_frame(main.frames) is None


def test_top_frame_skips_the_stdlibs_waiting_machinery():
    frames = [stacks.Frame("/usr/lib/python3.11/threading.py", 320, "wait"),
              stacks.Frame("/usr/lib/python3.11/queue.py", 171, "get"),
              stacks.Frame("/srv/train.py", 12, "next_batch")]
    assert stacks.top_frame(frames).func == "next_batch"


def _fr_dump(enqueued, completed, entries):
    return {"version": "2.10", "pg_config": {}, "pg_status": {"0": {
        "last_enqueued_collective": enqueued, "last_started_collective": -1, "last_completed_collective": completed}},
        "entries": [{"pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
                     "profiling_name": name, "state": "scheduled", "is_p2p": False} for seq, name in entries]}


def test_flight_recorder_json_and_pickle_give_the_pending_collective(tmp_path):
    fr = tmp_path / "fr"
    fr.mkdir()
    # the rank side's JSON (values as strings, as torch writes them) and torch's own pickle
    dump = _fr_dump("7", "6", [(6, "nccl:all_reduce"), (7, "nccl:_ALLGATHER_BASE")])
    (fr / "rank1.fr.json").write_text(json.dumps(dump))
    (fr / "nccl_trace_rank_0").write_bytes(pickle.dumps(_fr_dump(6, 6, [(6, "nccl:all_reduce")])))
    got = traces.read_traces(fr, [str(fr / "nccl_trace_rank_")], [0, 1])
    assert got[1].pending()[0].describe() == "nccl:_ALLGATHER_BASE #7"
    assert got[0].pending() == [] and got[0].last_seq("0") == 6


def test_a_flight_recorder_pickle_with_objects_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"entries": [Evil()]}))
    assert traces.load_dump(path) is None


def _state(rank, frames, pending=None, last=None, alive=True):
    proc = Proc(pid=1000 + rank, rank=rank, local_rank=rank, role="rank")
    s = analysis.RankState(proc, alive=alive, frames=frames, answered=True)
    s.top, s.users = stacks.top_frame(frames), stacks.users_frame(frames)
    if pending:
        s.waiting = traces.Op("0", "default_pg", pending[0], pending[1])
    if last is not None:
        s.trace = traces.RankTrace(rank, enqueued={"0": last}, completed={"0": last})
    call = stacks.collective_frame(frames)
    if call:
        s.called_from = call[1]
        if s.waiting is None:
            s.waiting = traces.Op("", "", -1, call[0].func)
    return s


F = stacks.Frame
BARRIER = [F("/v/site-packages/torch/distributed/distributed_c10d.py", 4635, "barrier"),
           F("/srv/train.py", 30, "step")]


@pytest.mark.parametrize("outlier_frames, pattern, code", [
    ([F("/v/site-packages/datasets/arrow_dataset.py", 3350, "_map_single"), F("/srv/train.py", 9, "main")],
     "rank0-preprocessing", "MGD302"),
    ([F("/v/site-packages/torch/serialization.py", 900, "save"), F("/v/site-packages/transformers/trainer.py", 1, "save_model")],
     "main-only-save", "MGD301"),
    ([F("/srv/train.py", 12, "wait_for_my_shards")], "rank-elsewhere", "MGD301"),
])
def test_the_rank_not_in_the_collective_is_named_with_the_catalogs_fix(outlier_frames, pattern, code):
    states = [_state(0, outlier_frames, last=4), _state(1, BARRIER, pending=(5, "nccl:barrier"))]
    f = analysis.analyse(states)
    assert (f.pattern, f.code, f.outliers) == (pattern, code, [0])
    assert "nccl:barrier #5 that rank 1 waits in" in f.summary
    assert f.fix and f.title


def test_all_ranks_in_the_same_collective_is_a_communication_hang():
    f = analysis.analyse([_state(r, BARRIER, pending=(5, "nccl:all_reduce")) for r in (0, 1)])
    assert (f.pattern, f.code, f.outliers) == ("all-arrived", "MGD304", [])
    assert "P2P" in f.fix


def test_ranks_in_different_collectives_are_mismatched():
    f = analysis.analyse([_state(0, BARRIER, pending=(9, "nccl:all_reduce")),
                          _state(1, BARRIER, pending=(8, "nccl:broadcast")),
                          _state(2, BARRIER, pending=(9, "nccl:all_reduce"))])
    assert (f.pattern, f.code, f.outliers) == ("mismatched", "MGD301", [1])
    assert "mismatched collectives" in f.fix


def test_a_dead_peer():
    f = analysis.analyse([_state(0, [], alive=False), _state(1, BARRIER, pending=(3, "gloo:barrier"))])
    assert (f.pattern, f.outliers) == ("dead-peer", [0])


def test_nobody_in_a_collective_jit_lock_and_rendezvous():
    lock = [F("/v/site-packages/torch/utils/file_baton.py", 42, "wait"), F("/srv/t.py", 3, "main")]
    assert analysis.analyse([_state(0, lock), _state(1, lock)]).code == "MGD305"
    rdzv = [F("/v/site-packages/torch/distributed/distributed_c10d.py", 1, "_store_based_barrier")]
    assert analysis.analyse([_state(0, rdzv)]).code == "MGD306"
    f = analysis.analyse([_state(0, [F("/srv/t.py", 3, "spin")])])
    assert f.pattern == "no-collective" and f.code is None


def test_run_environment_keeps_the_users_values(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = make_run_folder(None)
    base = {"PYTHONPATH": "/mine", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/pipe_", "PYTHONUNBUFFERED": ""}
    env, fr = run_environment(base, folder, "TOK", "abc")
    assert env["PYTHONPATH"] == sitecustomize_dir() + os.pathsep + "/mine"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/x/pipe_" and fr["pipe_prefix"] == "/x/pipe_"
    assert env["PYTHONUNBUFFERED"] == "" and env["TOK"] == "abc"
    assert os.listdir(sitecustomize_dir()) in (["sitecustomize.py"], ["sitecustomize.py", "__pycache__"],
                                               ["__pycache__", "sitecustomize.py"])


def test_sitecustomize_registers_a_rank_and_still_runs_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = make_run_folder(None)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env, _ = run_environment(dict(os.environ, PYTHONPATH=str(theirs)), folder, "TOK", "abc")
    env.update(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4")
    code = "import os, sys, faulthandler; print(os.environ.get('THEIRS_RAN'), sys.modules['sitecustomize'].__file__)"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    ran, module = p.stdout.split()
    assert ran == "1" and module == str(theirs / "sitecustomize.py")
    (reg,) = [json.loads(x.read_text()) for x in folder.sub("procs").glob("*.json")]
    assert (reg["rank"], reg["local_rank"], reg["role"], reg["world_size"]) == ("3", "1", "rank", "4")
    assert Path(reg["stack_file"]).name.startswith("rank3-")


def test_sitecustomize_does_nothing_outside_a_run():
    env = dict(os.environ, PYTHONPATH=sitecustomize_dir())
    env.pop("MGFT_DOCTOR_WATCH", None)
    code = "import threading; print(threading.active_count())"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "1" and p.stderr == ""


def test_a_missing_command_is_127_in_one_line(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    p = subprocess.run(DOCTOR + ["run", "--", "no-such-command-xyz", "a"], env=env, capture_output=True, text=True)
    assert p.returncode == 127
    assert p.stderr == "mgft-doctor: no-such-command-xyz: command not found\n"


def test_an_unwritable_log_is_2_in_one_line(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    p = subprocess.run(DOCTOR + ["run", "--log", str(tmp_path / "no" / "such" / "x.log"), "--", "true"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "cannot write the log file" in p.stderr


def test_no_command_and_a_bad_stall_are_usage_errors(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    assert subprocess.run(DOCTOR + ["run"], env=env, capture_output=True).returncode == 2
    assert subprocess.run(DOCTOR + ["run", "--stall", "0", "--", "true"], env=env, capture_output=True).returncode == 2


def test_the_commands_exit_code_and_output_pass_through(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    p = subprocess.run(DOCTOR + ["run", "--", sys.executable, "-c",
                                 "import sys; print('out'); print('err', file=sys.stderr); sys.exit(0)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "out\n"
    assert p.stderr.endswith("err\n")
    p = subprocess.run(DOCTOR + ["run", "--", "sh", "-c", "exit 7"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 7 and "exited with code 7" in p.stderr


def test_py_spy_is_used_when_installed(tmp_path, monkeypatch):
    """A py-spy on PATH is run per rank and its dump read (a stand-in that prints py-spy's format)."""
    from mgft_doctor.watch.dump import request_dumps
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncat <<'DUMP'\n" + PY_SPY + "DUMP\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = Proc(pid=sleeper.pid, rank=0, local_rank=0, role="unregistered")
        (dump,) = request_dumps([proc], tmp_path, None, lambda s: __import__("time").sleep(s))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert dump.answered and dump.py_spy_file
    state = analysis.rank_state(dump, proc, None)
    assert state.top.func == "_map_single" and state.users.func == "tokenize_all"


def test_only_the_newest_run_folders_are_kept(tmp_path):
    from mgft_doctor.watch.folder import prune_runs
    for i in range(25):
        (tmp_path / f"20260101-0000{i:02d}-1").mkdir()
    (tmp_path / "notes").mkdir()
    prune_runs(tmp_path, keep=20)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 21 and "notes" in left and "20260101-000000-1" not in left
