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


# torch 2.2-2.5 print ProcessGroupNCCL's own account of the timed-out work before the watchdog line
# ('Timeout at NCCL work: N, last enqueued NCCL work: M, last completed NCCL work: K.'); it is the
# same timeout, a consequence like the watchdog line (blind6 acc-2912 showed it taken as the root)
TIMEOUT_AT_WORK = (
    "[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 6075, last enqueued NCCL work: 6139, last completed NCCL work: 6074.\n"
    "[rank1]:[E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
    "subsequent GPU operations might run on corrupted/incomplete data.\n"
    "[rank1]:[E ProcessGroupNCCL.cpp:583] [Rank 1] To avoid data inconsistency, we are taking the entire process down.\n"
    "[rank1]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=6075, OpType=_ALLGATHER_BASE, NumelIn=1366, NumelOut=4098, Timeout(ms)=1800000) "
    "ran for 2954391 milliseconds before timing out.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    "E0708 12:59:42.070000 140211 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: -6) local_rank: 1 (pid: 88202) of binary: /usr/bin/python\n"
)


@pytest.mark.parametrize("first", [
    "[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 6075, last enqueued NCCL work: 6139, last completed NCCL work: 6074.",
    "[rank1]:[E1202 10:40:02.119000 7711 ProcessGroupNCCL.cpp:1537] [PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at NCCL work: 12, "
    "last enqueued NCCL work: 12, last completed NCCL work: 11.",
])
def test_timeout_at_nccl_work_with_no_own_error_is_the_watchdog_timeout(first):
    r = explain_text(first + "\n" + TIMEOUT_AT_WORK.split("\n", 1)[1])
    assert r.failure and "Timeout at NCCL work" in r.root_error.text
    assert r.diagnoses and r.diagnoses[0].code == "MGD301", [d.code for d in r.diagnoses]


def test_timeout_at_nccl_work_after_another_ranks_error_is_its_consequence():
    log = ("[rank0]: Traceback (most recent call last):\n"
           '[rank0]:   File "/opt/LLaMA-Factory/src/llamafactory/train/sft/workflow.py", line 96, in run_sft\n'
           "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB\n"
           + TIMEOUT_AT_WORK)
    r = explain_text(log)
    assert r.root_error.text.startswith("torch.OutOfMemoryError"), r.root_error
    assert r.failed_rank == 0
    assert not any(d.code in ("MGD301", "MGD207") for d in r.diagnoses)


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


# --- a rank's own error-level log lines (logger formats from deepspeed/utils/logging.py,
# llamafactory/extras/logging.py, transformers/utils/logging.py and c10's glog-style prefix) ---

def _summary(rank: int, code: int = 1) -> str:
    return (TORCHRUN_SUMMARY.replace("local_rank: 1", f"local_rank: {rank}").replace("rank      : 1", f"rank      : {rank}")
            .replace("exitcode: 1)", f"exitcode: {code})").replace("exitcode  : 1", f"exitcode  : {code}"))


def test_deepspeed_logged_error_is_the_root_and_its_traceback_gives_the_frame():
    log = ("[2026-12-01 14:02:10,001] [INFO] [comm.py:652:init_distributed] cdb=None\n"
           "[rank1]: [2026-12-01 14:03:22,123] [ERROR] [engine.py:2516:_configure_basic_optimizer] Install mup to use MuAdam optimizer\n"
           "[rank1]: Traceback (most recent call last):\n"
           '[rank1]:   File "/opt/LLaMA-Factory/src/train.py", line 28, in <module>\n'
           '[rank1]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 2517, in _configure_basic_optimizer\n'
           "[rank1]: UnboundLocalError: cannot access local variable 'MuAdam' where it is not associated with a value\n"
           + TORCHRUN_SUMMARY)
    r = explain_text(log)
    assert r.root_kind == "logged" and r.root_error.no == 2 and r.root_error.rank == 1 and r.failed_rank == 1
    assert "Install mup to use MuAdam optimizer" in r.root_error.text
    assert r.advice.frame.function == "_configure_basic_optimizer" and r.advice.frame.line == 2517  # the traceback's
    assert r.diagnoses and r.diagnoses[0].code != "MGD113"


def test_a_logged_error_then_only_an_exit_code_beats_the_exit_code_fallback():
    log = ("[INFO|2026-12-01 14:02:10] llamafactory.hparams.parser:143 >> Process rank: 1, world size: 2, device: cuda:1\n"
           "[rank1]: [2026-12-01 14:03:22,123] [ERROR] [engine.py:5363:_create_checkpoint_file] "
           "Failed saving model checkpoint to /out/checkpoint-100 with tag global_step100\n" + TORCHRUN_SUMMARY)
    r = explain_text(log)
    assert r.root_kind == "logged" and r.root_error.no == 2
    assert "MGD113" not in [d.code for d in r.diagnoses]  # 'printed no error of its own' would contradict the log
    frame = r.advice.frame  # no traceback: the logger's own location field
    assert (frame.file, frame.line, frame.function, frame.package, frame.library) == (
        "engine.py", 5363, "_create_checkpoint_file", "deepspeed", True)


def test_llamafactory_and_transformers_error_lines_are_errors_their_warnings_are_noise():
    lf = ("[WARNING|2026-12-01 14:02:10] llamafactory.hparams.parser:148 >> `ddp_find_unused_parameters` needs to be set as False for LoRA in DDP training.\n"
          "[rank1]: [ERROR|2026-12-01 14:02:11] llamafactory.hparams.model_args:251 >> Failed to load special tokens config "
          "from 'tokens.yaml': [Errno 2] No such file or directory: 'tokens.yaml'\n" + TORCHRUN_SUMMARY)
    r = explain_text(lf)
    assert r.root_kind == "logged" and r.root_error.no == 2 and r.root_error.rank == 1
    assert r.advice.frame.file == "llamafactory/hparams/model_args.py" and r.advice.frame.line == 251
    tf = ("[rank0]: [ERROR|modeling_utils.py:3298] 2026-12-01 14:02:11,004 >> Provided path (/out/model.bin) should be a directory, not a file\n"
          + _summary(0))
    r = explain_text(tf)
    assert r.root_kind == "logged" and "should be a directory" in r.root_error.text
    assert r.advice.frame.package == "transformers"
    warn_only = lf.splitlines(keepends=True)[0] + TORCHRUN_SUMMARY
    assert explain_text(warn_only).root_kind == "exit"  # a warning is not the rank's error


def test_glog_error_of_the_failing_rank_is_the_root_and_the_peers_watchdog_its_consequence():
    log = ("[rank0]:[W1201 14:03:20.123456 12345 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 to "
           "perform barrier as devices used by this process are currently unknown.\n"
           "[rank1]:E1201 14:03:22.123456 12346 ProcessGroupNCCL.cpp:1234] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
           "ProcessGroupNCCL encountered a CUDA error in the communicator: unspecified launch failure\n"
           "[rank0]:[E1201 14:33:22.118000 12345 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800043 milliseconds before timing out.\n"
           "[rank0]:[E1201 14:33:22.119000 12345 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 0] failure "
           "detected by watchdog at work sequence id: 7 PG status: last enqueued work: 7, last completed work: 6\n"
           + _summary(0, -6))
    r = explain_text(log)
    assert r.root_error.no == 2 and r.root_error.rank == 1 and r.failed_rank == 1
    assert [c.no for c in r.consequences] == [3]
    assert r.advice.frame.file == "ProcessGroupNCCL.cpp" and r.advice.kind == "cuda"
    assert not any(d.code in ("MGD301", "MGD302") for d in r.diagnoses)


def test_older_torch_error_prefix_is_an_own_error():
    log = ("[E socket.cpp:957] [c10d] The client socket has timed out after 900s while trying to connect to (10.0.0.1, 29500).\n"
           + _summary(0))
    r = explain_text(log)
    assert r.root_kind == "logged" and r.root_error.no == 1
    assert r.advice.frame.file == "socket.cpp" and r.advice.frame.line == 957


def test_logged_errors_of_a_healthy_run_or_long_before_the_failure_are_not_the_root():
    ds = "[2026-12-01 14:02:11,004] [ERROR] [config_utils.py:78:_process_deprecated_field] Tried removing deprecated 'cpu_offload' from config\n"
    healthy = ds + "{'train_runtime': 1210.4, 'train_loss': 1.02, 'epoch': 3.0}\n"
    r = explain_text(healthy)
    assert not r.failure and r.diagnoses == []
    late = (ds + "{'loss': 1.1, 'epoch': 0.1}\n" * 600 + "[rank1]: Traceback (most recent call last):\n"
            '[rank1]:   File "train.py", line 9, in <module>\n' "[rank1]: KeyError: 'labels'\n" + TORCHRUN_SUMMARY)
    r = explain_text(late)
    assert r.root_error.text == "KeyError: 'labels'"
    other_rank = ("[rank0]: " + ds + "[rank1]: Traceback (most recent call last):\n"
                  '[rank1]:   File "train.py", line 9, in <module>\n' "[rank1]: KeyError: 'labels'\n" + TORCHRUN_SUMMARY)
    r = explain_text(other_rank)  # torchrun names rank 1: rank 0's logged error is not its error
    assert r.root_error.text == "KeyError: 'labels'"
    launcher = ("[2024-09-11 08:01:02,500] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
                "'--local_rank=1'] exits with return code = 1\n")
    assert explain_text(launcher).root_kind == "exit"  # the deepspeed launcher's own line is no rank's error


# --- torchrun stopped by a signal, and tracebacks that rich drew in a box ---

TORCHRUN_GOT_SIGTERM = (
    "{'loss': 1.2345, 'grad_norm': 0.51, 'learning_rate': 4.9e-05, 'epoch': 0.31}\n"
    " 31%|███       | 310/1000 [1:02:11<2:18:22, 12.03s/it]\n"
    "W1201 14:03:22.123000 50300 torch/distributed/elastic/agent/server/api.py:753] Received Signals.SIGTERM death signal, shutting down workers\n"
    "W1201 14:03:22.124000 50300 torch/distributed/elastic/multiprocessing/api.py:1029] Sending process 50313 closing signal SIGTERM\n"
    "Traceback (most recent call last):\n"
    '  File "/opt/venv/bin/torchrun", line 8, in <module>\n'
    "    sys.exit(main())\n"
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 357, in wrapper\n'
    "    return f(*args, **kwargs)\n"
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 747, in run\n'
    "    result = self._invoke_run(role)\n"
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler\n'
    '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)\n'
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 50300 got signal: 15\n"
)


def test_torchrun_stopped_by_sigterm_is_read_as_its_traceback():
    r = explain_text(TORCHRUN_GOT_SIGTERM)
    assert r.failure and r.root_kind == "signal"
    assert r.root_error.text.endswith("SignalException: Process 50300 got signal: 15") and r.root_error.no == 14
    assert r.advice.frame.function == "_terminate_process_handler" and r.advice.caller is None  # torchrun is no user code
    assert r.advice.kind == "stopped" and "time limit" in r.advice.next_steps[0]
    assert r.phase.name == "mid-training" and r.phase.step == 310
    assert r.diagnoses and r.diagnoses[0].code == "MGD125"


def test_a_sigkill_summary_is_the_root_and_not_the_sigterm_of_the_others():
    log = ("Loading checkpoint shards:  50%|#####     | 2/4 [00:21<00:21, 10.70s/it]\n"
           "W1201 14:03:22.124000 50300 torch/distributed/elastic/multiprocessing/api.py:1029] Sending process 50314 closing signal SIGTERM\n"
           "E1201 14:03:23.533000 50300 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 50313) of binary: /opt/venv/bin/python\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
           "Failures:\n[1]:\n  time      : 2026-12-01_14:03:22\n  host      : gpu-a\n  rank      : 1 (local_rank: 1)\n"
           "  exitcode  : -15 (pid: 50314)  (SIGTERM)\n  error_file: <N/A>\n  traceback : Signal 15 (SIGTERM) received by PID 50314\n"
           "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_14:03:22\n  host      : gpu-a\n"
           "  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 50313)  (SIGKILL)\n  error_file: <N/A>\n"
           "  traceback : Signal 9 (SIGKILL) received by PID 50313\n")
    r = explain_text(log)
    assert r.root_kind == "exit" and "exitcode: -9" in r.root_error.text and r.failed_rank == 0
    assert r.diagnoses and r.diagnoses[0].code == "MGD705"
    # with torchrun's own SignalException too, the -9 of a rank still says more than the signal
    r = explain_text(TORCHRUN_GOT_SIGTERM + log)
    assert r.root_kind == "exit" and "exitcode: -9" in r.root_error.text


def test_an_error_file_traceback_in_torchruns_summary_is_a_traceback():
    log = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
           "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_14:03:22\n  host      : gpu-a\n"
           "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 50314)\n"
           "  error_file: /tmp/torchelastic_abc/none_x/attempt_0/1/error.json\n"
           "  traceback : Traceback (most recent call last):\n"
           '    File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 357, in wrapper\n'
           "      return f(*args, **kwargs)\n"
           '    File "/opt/proj/train.py", line 41, in main\n'
           "      batch = collate(samples)\n"
           "  KeyError: 'labels'\n")
    r = explain_text(log)
    assert r.root_error.text.strip() == "KeyError: 'labels'" and r.failed_rank == 1
    assert r.advice.frame.where() == "/opt/proj/train.py:41 in main" and not r.advice.frame.library


RICH_TRACEBACK = (
    "[rank0]: ╭───────────────────── Traceback (most recent call last) ─────────────────────╮\n"
    "[rank0]: │ /opt/LLaMA-Factory/src/train.py:28 in main                                   │\n"
    "[rank0]: │                                                                              │\n"
    "[rank0]: │   25 │                                                                       │\n"
    "[rank0]: │ ❱ 28 │   run_exp()                                                           │\n"
    "[rank0]: │                                                                              │\n"
    "[rank0]: │ /opt/venv/lib/python3.11/site-packages/datasets/arrow_dataset.py:3112 in map │\n"
    "[rank0]: │                                                                              │\n"
    "[rank0]: │ /opt/my_project/preprocess.py:41 in tokenize_fn                              │\n"
    "[rank0]: │                                                                              │\n"
    "[rank0]: │   40 │   for ex in batch[\"conversations\"]:                                   │\n"
    "[rank0]: │ ❱ 41 │   │   text = ex[\"value\"]                                              │\n"
    "[rank0]: │ ╭──────── locals ────────╮                                                   │\n"
    "[rank0]: │ │ ex = {'from': 'human'} │                                                   │\n"
    "[rank0]: │ ╰────────────────────────╯                                                   │\n"
    "[rank0]: ╰──────────────────────────────────────────────────────────────────────────────╯\n"
    "[rank0]: KeyError: 'value'\n"
    "E1201 14:03:23.533000 50300 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 "
    "(pid: 50313) of binary: /opt/venv/bin/python\n")


def test_a_rich_boxed_traceback_has_frames_and_its_exception_is_the_root():
    r = explain_text(RICH_TRACEBACK)
    assert r.root_error.text == "KeyError: 'value'" and r.root_error.no == 17 and r.root_error.rank == 0
    assert r.advice.frame.text.no == 9  # the frame's own line of the log
    assert r.advice.frame.where() == "/opt/my_project/preprocess.py:41 in tokenize_fn" and not r.advice.frame.library
    assert r.advice.kind == "data" and r.phase.name == "data loading"  # datasets' map frame
    assert not any("NCCL" in s for s in r.advice.next_steps)


def test_a_frame_line_that_rich_wrapped_is_joined():
    log = ("╭───────────────────── Traceback (most recent call last) ─────────────────────╮\n"
           "│ /opt/conda/lib/python3.8/site-packages/deepspeed/runtime/config.py:         │\n"
           "│ 869 in _batch_assertion                                                     │\n"
           "│                                                                              │\n"
           "│   866 │   │   assert train_batch == micro_batch * grad_acc * self.world_size, ( │\n"
           "╰────────────────────────────────────────────────────────────────────────────╯\n"
           "AssertionError: Check batch related parameters. train_batch_size is not equal to "
           "micro_batch_per_gpu * gradient_acc_step * world_size 16 != 2 * 4 * 3\n")
    r = explain_text(log)
    assert r.root_error.text.startswith("AssertionError: Check batch related parameters")
    f = r.advice.frame
    assert (f.file, f.line, f.function, f.package) == (
        "/opt/conda/lib/python3.8/site-packages/deepspeed/runtime/config.py", 869, "_batch_assertion", "deepspeed")
    assert r.diagnoses and r.diagnoses[0].code == "MGD502"


def test_a_traceback_ending_in_a_bare_stopiteration_is_the_root():
    """LLaMA-Factory's align_dataset reads next(iter(dataset)) of a streamed dataset with no rows."""
    log = ("[rank0]: Traceback (most recent call last):\n"
           '[rank0]:   File "/opt/LLaMA-Factory/src/llamafactory/data/converter.py", line 421, in align_dataset\n'
           "[rank0]:     column_names = list(next(iter(dataset)).keys())\n"
           "[rank0]:                         ^^^^^^^^^^^^^^^^^^^^\n"
           "[rank0]: StopIteration\n" + _summary(0))
    r = explain_text(log)
    assert r.root_kind == "exception" and r.root_error.text == "StopIteration" and r.root_error.no == 5
    assert r.advice.frame.function == "align_dataset" and r.advice.kind == "data"  # an empty dataset: data steps


def test_a_logged_error_the_rank_went_on_after_is_not_the_root_of_its_later_failure():
    ds = ("[rank1]: [2026-12-01 14:02:11,004] [ERROR] [config_utils.py:78:_process_deprecated_field] "
          "Tried removing deprecated 'cpu_offload' from config\n")
    log = (ds + "[rank1]: {'loss': 1.1, 'epoch': 0.1}\n" * 100 + "[rank1]: Traceback (most recent call last):\n"
           '[rank1]:   File "/home/me/train.py", line 9, in <module>\n'
           "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB\n"
           + TORCHRUN_SUMMARY)
    r = explain_text(log)
    assert r.root_error.text.startswith("torch.OutOfMemoryError") and r.root_error.rank == 1
    assert r.diagnoses and r.diagnoses[0].code.startswith("MGD7")


def test_the_launchers_exit_line_right_after_a_logged_error_does_not_make_it_silent():
    log = ("[2026-12-01 14:03:22,123] [ERROR] [engine.py:5363:_create_checkpoint_file] Failed saving model checkpoint "
           "to /out/checkpoint-100 with tag global_step100\n"
           "[2026-12-01 14:03:22,331] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 40112\n"
           "[2026-12-01 14:03:22,500] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
           "'--local_rank=1'] exits with return code = 1\n")
    r = explain_text(log)
    assert r.root_kind == "logged" and r.root_error.no == 1 and 1 in r.exit_codes
    assert "MGD113" not in [d.code for d in r.diagnoses]  # 'printed no error of its own': it did


# torch >= 2.3: the heartbeat monitor takes the process down when the watchdog thread itself is
# stuck (ProcessGroupNCCL.cpp's wording); with no other error it is the failure, not torchrun's -6
HEARTBEAT_ONLY = (
    "[rank0]:[E1201 10:40:01.123456 150 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1463] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
    "Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1\n"
    "[rank0]:[F1201 10:50:01.223456 150 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1668] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
    "Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.\n"
    "W1201 10:50:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:908] Sending process 151 closing signal SIGTERM\n"
    "E1201 10:50:06.000000 140 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -6) local_rank: 0 (pid: 150) of binary: /usr/bin/python3\n"
)


@pytest.mark.parametrize("first", [HEARTBEAT_ONLY.splitlines(True)[0],
                                   "[rank0]:[E1201 10:40:01.123456 150 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
                                   "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.\n"])
def test_a_heartbeat_monitor_abort_alone_is_the_root_and_a_watchdog_hang(first):
    r = explain_text(first + "".join(HEARTBEAT_ONLY.splitlines(True)[1:]))
    assert r.failure and r.root_error.no == 1 and r.root_error.rank == 0
    assert r.diagnoses and r.diagnoses[0].code == "MGD301"


def test_a_heartbeat_abort_after_a_watchdog_timeout_leaves_the_timeout_the_root():
    timeout = ("[rank1]:[E1201 10:30:00.000000 151 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
               "WorkNCCL(SeqNum=412, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600005 milliseconds before timing out.\n")
    r = explain_text(timeout + HEARTBEAT_ONLY)
    assert r.root_error.no == 1 and "Watchdog caught collective operation timeout" in r.root_error.text
    assert r.diagnoses and r.diagnoses[0].code == "MGD301"


# Python's chained tracebacks: the trainer re-raises a bare KeyError with its own explanation
# (transformers' Trainer._determine_best_metric) below a long traceback; a class that knows only
# the later wording
CHAINED = (
    "Traceback (most recent call last):\n"
    '  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 3124, in _determine_best_metric\n'
    "    metric_value = metrics[metric_to_check]\n"
    "KeyError: 'eval_accuracy'\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "Traceback (most recent call last):\n"
    + "".join(f'  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line {n}, in step_{n}\n'
              f"    self.step_{n + 1}()\n" for n in range(2100, 2106))
    + '  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 3126, in _determine_best_metric\n'
    "    raise KeyError(\n"
    "KeyError: \"The `metric_for_best_model` training argument is set to 'eval_accuracy', which is not found in the "
    "evaluation metrics. The available evaluation metrics are: ['eval_loss']. Consider changing the "
    "`metric_for_best_model` via the TrainingArguments.\"\n"
)


def _entry(signature: str):
    from mgft_doctor.catalog.entry import parse_entry

    return parse_entry({"code": "MGD999", "title": "t", "area": "checkpoint", "match": {"signatures": [signature]},
                        "explanation": "e", "fixes": ["f"], "references": ["https://example.org"],
                        "examples": {"match": ["x"], "no_match": ["y"]}}, "<test>")


def test_a_chained_exception_is_read_with_its_root():
    later = _entry("metric_for_best_model. training argument is set to '[^']+', which is not found")
    r = explain_text(CHAINED, [later])
    # raise ... from ...: the root shown is the exception the library raised to explain the first
    assert r.root_error.text.startswith("KeyError: \"The `metric_for_best_model` training argument")
    assert r.diagnoses and r.diagnoses[0].confidence >= 0.75  # the later link's signature counts as the root's
    unchained = CHAINED.replace("The above exception was the direct cause of the following exception:", "")
    r = explain_text(unchained, [later])
    assert not r.diagnoses or r.diagnoses[0].confidence < 0.75  # two separate errors: the second one is not the root


BARE_ASSERT = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 1571, in _configure_zero_optimizer\n'
    "[rank1]:     optimizer = DeepSpeedZeroOptimizer_Stage3(\n"
    "[rank1]:                 ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '[rank1]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/stage3.py", line 604, in defragment\n'
    "[rank1]:     assert len(set(t.dtype for t in tensors)) == 1\n"
    "[rank1]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "[rank1]: AssertionError\n" + TORCHRUN_SUMMARY)


def test_the_assert_statement_above_an_assertion_error_is_part_of_the_root():
    entry = _entry(r"assert len\(set\(t\.dtype for t in tensors\)\) == 1")
    r = explain_text(BARE_ASSERT, [entry])
    assert r.root_error.text == "AssertionError" and r.failed_rank == 1  # the exception line stays the root shown
    assert [ln.text.strip() for ln in r.root_detail] == ["assert len(set(t.dtype for t in tensors)) == 1"]  # not the carets
    assert r.diagnoses and r.diagnoses[0].confidence >= 0.75  # a signature on the assert counts as one on the root
    assert r.to_json()["root_error"]["detail"][0]["text"].startswith("assert len(")
    other = BARE_ASSERT.replace("AssertionError\n", "ValueError: bad group\n")  # not an assert: the statement is no message
    assert not explain_text(other, [entry]).root_detail


def test_the_lines_under_a_header_exception_carry_its_message():
    log = ("[rank0]: Traceback (most recent call last):\n"
           '[rank0]:   File "/opt/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4902, in _load_pretrained_model\n'
           '[rank0]:     raise RuntimeError(f"Error(s) in loading state_dict for {model.__class__.__name__}:\\n\\t{error_msg}")\n'
           "[rank0]: RuntimeError: Error(s) in loading state_dict for Qwen2ForCausalLM:\n"
           '[rank0]: \tWhile copying the parameter named "lm_head.weight", whose dimensions in the model are torch.Size([151936, 896]) and '
           "whose dimensions in the checkpoint are torch.Size([151936, 896]), an exception occurred : ('Cannot copy out of meta tensor; no data!',).\n"
           "E0405 09:31:44.100000 7001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 7010) of binary: /usr/bin/python\n")
    r = explain_text(log, [])
    assert r.root_error.text.startswith("RuntimeError: Error(s) in loading state_dict")  # a log line, whole
    assert len(r.root_detail) == 1 and "Cannot copy out of meta tensor" in r.root_detail[0].text  # not the launcher's line
    plain = explain_text("[rank0]: Traceback (most recent call last):\n"
                         '[rank0]:   File "train.py", line 9, in <module>\n'
                         "[rank0]: KeyError: 'labels'\n"
                         "[rank0]: \tsome later output\n", [])
    assert plain.root_error.text == "KeyError: 'labels'" and not plain.root_detail  # no header: nothing to add


def test_a_bare_exception_heading_a_chain_shows_the_link_that_says_what_failed():
    """importlib's next() raises a bare StopIteration; transformers' require_version, handling it,
    raises the PackageNotFoundError that names the package: that is the root a person reads."""
    log = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/usr/lib/python3.11/importlib/metadata/__init__.py", line 563, in from_name\n'
        "[rank1]:     return next(cls.discover(name=name))\n"
        "[rank1]: StopIteration\n"
        "\n"
        "[rank1]: During handling of the above exception, another exception occurred:\n"
        "\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/opt/venv/lib/python3.11/site-packages/llamafactory/extras/misc.py", line 92, in check_version\n'
        "[rank1]:     require_version(requirement, hint)\n"
        '[rank1]:   File "/opt/venv/lib/python3.11/site-packages/transformers/utils/versions.py", line 103, in require_version\n'
        "[rank1]:     raise importlib.metadata.PackageNotFoundError(\n"
        "[rank1]: importlib.metadata.PackageNotFoundError: No package metadata was found for The 'liger-kernel' "
        "distribution was not found and is required by this application. \n"
    )
    r = explain_text(log)
    assert r.root_error.text.endswith("is required by this application.") and "liger-kernel" in r.root_error.text
    assert r.root_error.no == 13
    # an error raised while handling another one, the first with a message of its own: the first stays the root
    handled = CHAINED.replace("The above exception was the direct cause of the following exception:",
                              "During handling of the above exception, another exception occurred:")
    assert explain_text(handled, [_entry("x")]).root_error.text == "KeyError: 'eval_accuracy'"


def test_cpp_backtrace_frame_of_a_watchdog_dump_is_no_error():
    # node 2's rank 11 ran out of memory; node 0's rank 2 timed out later and its c10::Error dump
    # prints unprefixed C++ frames ('frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(...)'):
    # a function name that mentions a timeout, not an error of its own
    log = ("[rank11]: Traceback (most recent call last):\n"
           '[rank11]:   File "/x/transformers/integrations/sdpa_attention.py", line 96, in sdpa_attention_forward\n'
           "[rank11]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB. GPU 3 has a total capacity of 63.42 GiB of which 1.70 GiB is free.\n"
           "E1026 03:51:32.904000 2521679 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 3 (pid: 2521736) of binary: /usr/bin/python3\n"
           "[rank2]:[E1026 04:21:33.019004421 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1911, OpType=_ALLGATHER_BASE, NumelIn=10485760, NumelOut=10485760, Timeout(ms)=1800000) ran for 1800090 milliseconds before timing out.\n"
           "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 (most recent call first):\n"
           "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f87a2d785e8 in /x/torch/lib/libc10.so)\n"
           "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x23d (0x7f874dbcba6d in /x/torch/lib/libtorch_cuda.so)\n"
           "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0xc80 (0x7f874dbcd7f0 in /x/torch/lib/libtorch_cuda.so)\n"
           "terminate called after throwing an instance of 'c10::DistBackendError'\n")
    r = explain_text(log)
    assert r.root_error.text.startswith("torch.OutOfMemoryError") and r.root_error.rank == 11


def test_mp_spawn_parent_exception_is_a_wrapper_of_the_workers_error():
    # torch.multiprocessing.spawn (torch < 1.9) re-raises a worker's failure as a bare Exception whose
    # message is the worker's traceback; the worker's exception is the root
    log = ("Traceback (most recent call last):\n"
           '  File "main.py", line 110, in main\n'
           "    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))\n"
           '  File "/opt/conda/lib/python3.6/site-packages/torch/multiprocessing/spawn.py", line 114, in join\n'
           "    raise Exception(msg)\n"
           "Exception: \n\n-- Process 2 terminated with the following error:\n"
           "Traceback (most recent call last):\n"
           '  File "/opt/conda/lib/python3.6/site-packages/torch/multiprocessing/spawn.py", line 19, in _wrap\n'
           "    fn(i, *args)\n"
           '  File "/workspace/main.py", line 151, in main_worker\n'
           "    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])\n"
           "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:260, unhandled cuda error\n")
    r = explain_text(log)
    assert r.root_error.text.startswith("RuntimeError: NCCL error in:")
    new = log.replace("Exception: ", "torch.multiprocessing.spawn.ProcessRaisedException: ")
    assert explain_text(new).root_error.text.startswith("RuntimeError: NCCL error in:")


def test_nccl_tests_failure_line_is_a_failure():
    log = ("# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
           "#  Rank  0 Pid   1688 on    fastmoe device  0 [0x18] GeForce RTX 2080 Ti\n"
           "fastmoe: Test NCCL failure common.cu:777 'unhandled system error'\n")
    r = explain_text(log)
    assert r.failure and "Test NCCL failure" in r.root_error.text


def test_watchdog_carrying_a_cuda_error_is_the_ranks_own_error():
    # the watchdog is where an asynchronous kernel fault surfaced: a CUDA error of this rank, no timeout echo
    log = (" 94%|#########4| 837/888 [9:42:50<34:08, 40.17s/it][rank7]:[E ProcessGroupNCCL.cpp:1182] [Rank 7] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
           "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
           "frame #3: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x52 (0x7f5c10a91a12 in /x/torch/lib/libtorch_cuda.so)\n"
           "terminate called after throwing an instance of 'c10::DistBackendError'\n"
           "  what():  [Rank 7] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
           "[2024-04-03 22:11:55,660] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) local_rank: 7 (pid: 41008) of binary: /usr/bin/python\n")
    r = explain_text(log)
    assert "illegal memory access" in r.root_error.text and r.root_error.rank == 7
    # a timeout carried by the same wording stays an echo
    from mgft_doctor.explain.failures import is_consequence
    assert is_consequence("[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)")
    assert not is_consequence("[Rank 7] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered")


def test_summary_global_rank_replaces_the_launchers_local_rank():
    # node 1 of a 2-node job (global ranks 8-15): the agent's 'failed ... local_rank: 3' names local rank 3,
    # its summary names global rank 11, the rank that failed first: its own error is the root, not rank 9's
    log = ("[rank9]: Traceback (most recent call last):\n"
           '[rank9]:   File "/w/train.py", line 91, in <module>\n'
           "[rank9]: ValueError: loss is nan\n"
           "[rank11]: Traceback (most recent call last):\n"
           '[rank11]:   File "/w/train.py", line 80, in <module>\n'
           "[rank11]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB. GPU 3 has a total capacity of 79.10 GiB of which 1.70 GiB is free.\n"
           "E1026 03:51:32.904000 2521679 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 3 (pid: 2521736) of binary: /usr/bin/python3\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
           "Root Cause (first observed failure):\n[0]:\n  time      : 2025-10-26_03:51:31\n"
           "  rank      : 11 (local_rank: 3)\n  exitcode  : 1 (pid: 2521736)\n")
    r = explain_text(log)
    assert r.root_error.text.startswith("torch.OutOfMemoryError") and r.root_error.rank == 11


def test_tcpstore_warnings_of_ranks_exiting_at_different_times_are_no_failure():
    # torch 2.4+: a rank's heartbeat thread still polls the store after rank 0 (its server) exited
    log = ("{'train_runtime': 3021.4, 'train_samples_per_second': 41.2, 'train_loss': 0.8121, 'epoch': 3.0}\n"
           "100%|##########| 1500/1500 [50:21<00:00,  2.01s/it]\n"
           "[rank3]:[W625 23:35:35.311127584 ProcessGroupNCCL.cpp:1662] [PG ID 0 PG GUID 0(default_pg) Rank 3] Failed to check the \"should dump\" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: Connection reset by peer\n"
           "[rank2]:[W625 23:35:35.303797152 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=6, addr=[::ffff:127.0.0.1]:37468, remote=[::ffff:127.0.0.1]:6006): Connection reset by peer\n"
           "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:678 (most recent call first):\n"
           "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f65dc7785e8 in /x/torch/lib/libc10.so)\n"
           "[rank0]:[W625 23:35:36.118000 ProcessGroupNCCL.cpp:1496] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.\n")
    r = explain_text(log)
    assert not r.failure and r.diagnoses == []


def test_warning_level_socket_line_then_the_error_is_still_a_failure():
    log = ("[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:25641 (errno: 98 - Address already in use).\n"
           "[E socket.cpp:462] [c10d] The server socket has failed to listen on any local network address.\n"
           "RuntimeError: The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:25641 (errno: 98 - Address already in use).\n")
    r = explain_text(log)
    assert r.failure and r.diagnoses and r.diagnoses[0].code == "MGD101"
