"""The root-error choice on multi-rank logs: the first failing rank's own error, not the
launcher's echo, not a warning of a healthy run."""

from pathlib import Path

import pytest

from mgft_doctor.explain import explain_paths, explain_text

TORCHRUN_SUMMARY = """E0301 09:41:20.533000 50300 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 50313) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2024-03-01_09:41:20
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 50313)
"""


def test_first_failing_ranks_error_beats_the_others_echo():
    log = ("[rank0]: RuntimeError: [Rank 0] NCCL watchdog thread terminated\n"
           "[rank1]: Traceback (most recent call last):\n"
           '[rank1]:   File "train.py", line 9, in <module>\n'
           "[rank1]: KeyError: 'labels'\n" + TORCHRUN_SUMMARY)
    r = explain_text(log)
    assert r.failure and r.failed_rank == 1
    assert r.root_error.text == "KeyError: 'labels'" and r.root_error.rank == 1
    assert 1 in r.exit_codes


def test_benign_nccl_warning_and_destructor_errors_are_not_failures():
    log = ("box:2337:2337 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
           "{'loss': 0.91, 'epoch': 3.0}\n"
           "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3a2c1d5e40>\n"
           "Traceback (most recent call last):\n"
           '  File "/usr/lib/python3.10/multiprocessing/process.py", line 160, in is_alive\n'
           "AssertionError: can only join a child process\n"
           "[2024-03-01 10:00:00,000] [INFO] [launch.py:351:main] Process 40112 exits successfully.\n")
    r = explain_text(log)
    assert not r.failure and r.diagnoses == []


def test_nccl_warning_just_before_the_error_is_its_root():
    log = ("host:3312:3345 [0] include/socket.h:409 NCCL WARN Net : Connect to 172.19.0.1<41267> failed : Connection refused\n"
           "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:957, unhandled system error\n"
           + TORCHRUN_SUMMARY.replace("rank      : 1", "rank      : 0"))
    r = explain_text(log)
    assert r.root_error.no == 1 and "Connection refused" in r.root_error.text


def test_compiler_error_before_the_build_traceback_is_the_root():
    log = ("FAILED: multi_tensor_adam.cuda.o\n"
           "/x/torch/include/c10/util/C++17.h:13:2: error: #error \"You're trying to build PyTorch with a too old version of GCC. We need GCC 9 or later.\"\n"
           "ninja: build stopped: subcommand failed.\n"
           "Traceback (most recent call last):\n"
           '  File "/x/torch/utils/cpp_extension.py", line 2209, in _run_ninja_build\n'
           "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.\n"
           "RuntimeError: Error building extension 'fused_adam'\n")
    r = explain_text(log)
    # the compiler's own message, not ninja's 'FAILED: <target>' that announces it
    assert r.root_error.no == 2 and "GCC 9 or later" in r.root_error.text and r.root_kind == "compiler"


def test_pdsh_host_prefixes_and_rich_boxes_are_read():
    log = ("gpu-a: [rank2]:[E605 10:00:01.1 ProcessGroupNCCL.cpp:1385] [PG 0 Rank 2] Heartbeat monitor timed out!\n"
           "gpu-b: Traceback (most recent call last):\n"
           'gpu-b:   File "/x/deepspeed/ops/op_builder/builder.py", line 520, in jit_load\n'
           "gpu-b: RuntimeError: Ninja is required to load C++ extensions\n")
    r = explain_text(log)
    assert r.root_error.text == "RuntimeError: Ninja is required to load C++ extensions"
    boxed = ("╭───────────────────── Traceback (most recent call last) ─────────────────────╮\n"
             "│ /opt/venv/lib/python3.11/site-packages/deepspeed/runtime/config.py:889 in _batch_assertion │\n"
             "╰────────────────────────────────────────────────────────────────────────────╯\n"
             "AssertionError: Check batch related parameters. train_batch_size is not equal to "
             "micro_batch_per_gpu * gradient_acc_step * world_size 16 != 2 * 4 * 3\n")
    r = explain_text(boxed)
    assert r.root_error.text.startswith("AssertionError: Check batch related parameters")
    assert r.diagnoses and r.diagnoses[0].code == "MGD502"


def test_killed_rank_without_traceback_is_root_by_exit_code():
    log = ("Loading checkpoint shards:  50%|#####     | 1/2 [00:21<00:21, 21.40s/it]\n"
           "W0615 02:11:40.018000 1 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 22930 closing signal SIGTERM\n"
           + TORCHRUN_SUMMARY.replace("exitcode: 1)", "exitcode: -9)").replace("exitcode  : 1", "exitcode  : -9"))
    r = explain_text(log)
    assert r.failure and -9 in r.exit_codes and r.root_kind == "exit"


def test_error_glued_to_a_progress_bar_is_split_off():
    log = ("Running tokenizer on dataset: 40%|####      | 400/1000 [00:02<00:03, 155.57 examples/s]"
           "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
           "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800512 milliseconds before timing out.\n")
    r = explain_text(log)
    assert r.root_error.text.startswith("[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog")
    assert r.root_error.rank == 2


# --- the root across ranks: real two-rank gloo runs (tests/fixtures/ranks/make_logs.sh) ---

RANKS = Path(__file__).parent / "fixtures" / "ranks"
# fixture -> (rank that raised, rank torchrun's summary names, rank prefix printed on the root line)
CROSS_RANK = {
    "r1_raises_r0_peer_closed": (1, 1, 1),
    "r0_raises_r1_peer_closed": (0, 0, 0),
    "r1_raises_r0_times_out": (1, 0, None),  # printed with traceback.print_exc: no [rankN]: prefix
    "r0_raises_r1_times_out": (0, 1, None),
    "tee_r1_raises_r0_peer_closed": (1, 1, 1),
    "tee_r0_raises_r1_peer_closed": (0, 0, 0),
    "tee_r1_raises_r0_times_out": (1, 0, 1),
    "tee_r0_raises_r1_times_out": (0, 1, 0),
}


@pytest.mark.parametrize("name", sorted(CROSS_RANK))
def test_own_error_before_a_peers_timeout_or_lost_connection_is_the_root(name):
    raised, named, prefix = CROSS_RANK[name]
    r = explain_paths([str(RANKS / f"{name}.log")])
    assert r.failure and r.root_error.text.startswith("ValueError: Invalid sample at step 3"), r.root_error
    assert r.root_error.rank == prefix
    launcher = [ln for ln in (RANKS / f"{name}.log").read_text().splitlines() if ln.startswith("  rank      :")][-1]
    assert launcher.startswith(f"  rank      : {named} "), launcher  # the fixture is what it claims
    # the failing rank is the one that raised, also when torchrun's summary names the one that timed out
    assert r.failed_rank in ((raised,) if prefix is not None else (raised, None))
    assert r.failed_rank != named or named == raised
    assert not any(d.code in ("MGD301", "MGD207") for d in r.diagnoses)


NCCL_TIMEOUT_AFTER_OWN_ERROR = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "/opt/LLaMA-Factory/src/llamafactory/data/processor/supervised.py", line 51, in _encode_data_example\n'
    "[rank1]: ValueError: Template qwen does not support the `system` role.\n"
    "[rank0]:[E1201 10:40:02.118000 7711 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.\n"
    "[rank0]:[E1201 10:40:02.119000 7711 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 0] failure detected by watchdog at work sequence id: 7 PG status: last enqueued work: 7, last completed work: 6\n"
    "[rank0]:[E1201 10:40:02.119000 7711 ProcessGroupNCCL.cpp:670] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
    "[rank0]:[E1201 10:40:02.119000 7711 ProcessGroupNCCL.cpp:676] To avoid data inconsistency, we are taking the entire process down.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.\n"
    "Fatal Python error: Aborted\n"
    + TORCHRUN_SUMMARY.replace("local_rank: 1", "local_rank: 0").replace("rank      : 1", "rank      : 0")
    .replace("exitcode: 1)", "exitcode: -6)").replace("exitcode  : 1", "exitcode  : -6")
)


def test_nccl_watchdog_abort_after_another_ranks_error_is_its_consequence():
    """Wording of torch 2.x's ProcessGroupNCCL (compiled into libtorch_cuda.so); torchrun names rank 0."""
    r = explain_text(NCCL_TIMEOUT_AFTER_OWN_ERROR)
    assert r.root_error.text.startswith("ValueError: Template qwen") and r.failed_rank == 1
    assert -6 in r.exit_codes
    assert not any(d.code in ("MGD301", "MGD302", "MGD207") for d in r.diagnoses)


def test_nccl_remote_error_and_store_reset_after_a_crash_are_consequences():
    log = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB\n"
           "[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
           "remote process exited or there was a network error, NCCL version 2.21.5\n"
           "[rank1]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
           "[rank2]: torch.distributed.DistBackendError: [2] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
           "via c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer\n"
           + TORCHRUN_SUMMARY)
    r = explain_text(log)
    assert r.root_error.text.startswith("torch.OutOfMemoryError") and r.failed_rank == 0


def test_a_rank_killed_without_a_word_is_the_root_not_its_peers_lost_connection():
    log = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:46011\n"
           + TORCHRUN_SUMMARY.replace("exitcode: 1)", "exitcode: -9)").replace("exitcode  : 1", "exitcode  : -9"))
    r = explain_text(log)
    assert r.root_kind == "exit" and "exitcode: -9" in r.root_error.text and r.failed_rank == 1
    assert r.diagnoses and r.diagnoses[0].code == "MGD705"  # host RAM: the kernel's OOM killer


def test_a_timeout_with_no_own_error_before_it_stays_the_root():
    log = ("Running tokenizer on dataset (num_proc=16):  40%|####      | 400/1000 [00:02<00:03, 155.57 examples/s]\n"
           "[rank1]:[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
           "OpType=BARRIER, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800512 milliseconds before timing out.\n"
           + TORCHRUN_SUMMARY)
    r = explain_text(log)
    assert "Watchdog caught collective operation timeout" in r.root_error.text and r.failed_rank == 1
    assert r.diagnoses and r.diagnoses[0].code == "MGD302"
