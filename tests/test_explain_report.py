"""What explain says beside the diagnosis: the phase the run failed in and its numbers, read
from the log (never contradicting it)."""

import json
import subprocess
import sys

import pytest

from mgft_doctor.explain import explain_text, phase as phase_mod
from mgft_doctor.explain.phase import PhaseTracker
from mgft_doctor.explain.render import when_it_failed

# A LLaMA-Factory run as it prints itself (transformers' Trainer, datasets' map progress).
HEAD = """[INFO|2025-01-07 10:00:01] llamafactory.hparams.parser:406 >> Process rank: 0, world size: 2, device: cuda:0, distributed training: True, compute dtype: torch.bfloat16
[INFO|2025-01-07 10:00:02] llamafactory.data.loader:143 >> Loading dataset identity.json...
Converting format of dataset (num_proc=16): 100%|##########| 91/91 [00:00<00:00, 412.10 examples/s]
Running tokenizer on dataset (num_proc=16): 100%|##########| 91/91 [00:01<00:00, 60.32 examples/s]
[INFO|modeling_utils.py:1151] 2025-01-07 10:00:10,001 >> loading weights file model.safetensors
Loading checkpoint shards: 100%|##########| 2/2 [00:03<00:00,  1.52s/it]
[INFO|2025-01-07 10:00:20] llamafactory.model.loader:143 >> trainable params: 20,971,520 || all params: 8,051,232,768 || trainable%: 0.2605
[INFO|trainer.py:2128] 2025-01-07 10:00:21,000 >> ***** Running training *****
[INFO|trainer.py:2129] 2025-01-07 10:00:21,000 >>   Num examples = 91
[INFO|trainer.py:2135] 2025-01-07 10:00:21,000 >>   Total optimization steps = {total:,}
[INFO|trainer.py:2136] 2025-01-07 10:00:21,000 >>   Number of trainable parameters = 20,971,520
"""
SAVE_TRACEBACK = """Traceback (most recent call last):
  File "/opt/LLaMA-Factory/src/llamafactory/launcher.py", line 23, in <module>
    launch()
  File "/usr/lib/python3.11/site-packages/transformers/trainer.py", line 2241, in train
    return inner_training_loop(
  File "/usr/lib/python3.11/site-packages/transformers/trainer.py", line 2612, in _inner_training_loop
    self._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval)
  File "/usr/lib/python3.11/site-packages/transformers/trainer.py", line 3092, in _save_checkpoint
    self.save_model(output_dir, _internal_call=True)
  File "/usr/lib/python3.11/site-packages/torch/serialization.py", line 651, in save
    with _open_zipfile_writer(f) as opened_zipfile:
RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 4736 vs 4630
"""


def head(total=3000):
    return HEAD.replace("{total:,}", f"{total:,}")


def steps(first, last, total=3000, loss_every=10):
    """The Trainer's bar redrawn once a step (\\r), a loss dict every loss_every steps."""
    out = []
    for s in range(first, last + 1):
        out.append(f" {100 * s // total:3d}%|#         | {s}/{total} [01:02<2:00:00,  2.10s/it]\r")
        if s and s % loss_every == 0:
            out.append(f"\n{{'loss': 1.{s % 97:04d}, 'grad_norm': 0.33, 'learning_rate': 1e-05, 'epoch': {s / 1000:.2f}}}\n")
    return "".join(out) + "\n"


CASES = {
    "start-up": ("Traceback (most recent call last):\n"
                 '  File "/opt/LLaMA-Factory/src/llamafactory/hparams/parser.py", line 226, in get_train_args\n'
                 '    raise ValueError("Please specify `max_steps` in streaming mode.")\n'
                 "ValueError: Please specify `max_steps` in streaming mode.\n", None),
    "data loading": (head().split("Running tokenizer")[0]
                     + "Running tokenizer on dataset (num_proc=16):  45%|####      | 41/91 [00:01<00:01, 60.32 examples/s]\n"
                     "Traceback (most recent call last):\n"
                     '  File "/opt/LLaMA-Factory/src/llamafactory/data/processor/supervised.py", line 99, in preprocess_dataset\n'
                     "KeyError: 'output'\n", None),
    "model loading": (head().split("Loading checkpoint shards")[0]
                      + "Loading checkpoint shards:  50%|#####     | 1/2 [00:21<00:21, 21.40s/it]\n"
                      "E0615 02:11:40.533000 1 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
                      "local_rank: 1 (pid: 50313) of binary: /usr/bin/python\n", None),
    "first step": (head() + steps(0, 0) + "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", None),
    "mid-training": (head() + steps(0, 1234) + "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n", (1234, 3000)),
    "saving": (head() + steps(0, 1200) + "[INFO|trainer.py:3801] 2025-01-07 11:00:00,000 >> Saving model checkpoint to "
               "saves/llama3/checkpoint-1200\n" + SAVE_TRACEBACK, (1200, 3000)),
    "exit": (head(300) + steps(0, 300, 300) + "[INFO|trainer.py:2400] >> \n\nTraining completed. Do not forget to share your model "
             "on huggingface.co/models =)\n\n" + steps(300, 300, 300) + "[INFO|trainer.py:3801] >> Saving model checkpoint to saves/x\n"
             "***** train metrics *****\n  epoch = 3.0\n[rank0]: RuntimeError: Connection refused while destroying the process group\n",
             (300, 300)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_phase_and_step_come_from_the_log(name):
    log, progress = CASES[name]
    r = explain_text(log)
    assert r.failure and r.phase is not None and r.phase.name == name, (r.root_error, r.phase)
    assert (None if r.phase.step is None else (r.phase.step, r.phase.total)) == progress
    data = r.to_json()
    assert data["phase"] == name
    assert data["progress"] == (None if progress is None else {"step": progress[0], "total_steps": progress[1]})


def test_the_report_says_when_with_the_logs_numbers():
    r = explain_text(CASES["saving"][0])
    assert when_it_failed(r) == "failed while saving, at step 1200 of 3000"
    r = explain_text(CASES["mid-training"][0])
    assert when_it_failed(r) == "failed mid-training, at step 1234 of 3000, on rank 1"


def test_a_healthy_log_has_no_phase():
    r = explain_text(head() + steps(0, 50))
    assert not r.failure and r.phase is None and "phase" not in r.to_json()  # explain/1 as it was


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 KB instead of 4 MB, so that a short log spans many of them."""
    monkeypatch.setattr(PhaseTracker, "block_size", 64 << 10)
    monkeypatch.setattr(phase_mod, "TAIL_BYTES", 4 << 10)


def test_root_in_an_early_block_of_a_long_log_gets_its_exact_step(small_blocks):
    log = (head(20000) + steps(0, 4000, 20000) + "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
           + "".join(f"[rank0]: still waiting {i}\n" for i in range(40000)))
    r = explain_text(log)
    assert r.phase.name == "mid-training" and (r.phase.step, r.phase.total) == (4000, 20000)


def test_root_in_a_block_no_longer_kept_still_gets_the_phase(small_blocks, monkeypatch):
    monkeypatch.setattr(phase_mod, "PIN_BLOCKS", 0)
    log = (head(20000) + steps(0, 4000, 20000) + "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
           + "".join(f"[rank0]: still waiting {i}\n" for i in range(40000)))
    r = explain_text(log)
    # the root's own block is gone: the step is the last one a block's tail showed before it
    assert r.phase.name == "mid-training" and r.phase.total == 20000 and 2500 <= r.phase.step <= 4000


def test_a_save_between_blocks_and_progress_after_it(small_blocks):
    log = (head(20000) + steps(0, 3000, 20000) + "[INFO|trainer.py:3801] >> Saving model checkpoint to saves/checkpoint-3000\n"
           + steps(3001, 6000, 20000) + "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    r = explain_text(log)
    assert r.phase.name == "mid-training" and r.phase.step == 6000
    log = (head(20000) + steps(0, 3000, 20000) + "[INFO|trainer.py:3801] >> Saving model checkpoint to saves/checkpoint-3000\n"
           + "".join(f"[INFO|configuration_utils.py:420] >> Configuration saved in saves/checkpoint-3000/config{i}.json\n" for i in range(30))
           + "[rank0]: RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 4736 vs 4630\n")
    r = explain_text(log)
    assert r.phase.name == "saving" and (r.phase.step, r.phase.total) == (3000, 20000)


# --- when nothing matches: the frame, the YAML key, next steps by kind ---

def tb(frames, exc):
    body = "".join(f'  File "{f}", line {n}, in {fn}\n    pass\n' for f, n, fn in frames)
    return "Traceback (most recent call last):\n" + body + exc + "\n"


SITE = "/opt/conda/lib/python3.11/site-packages"
LF = "/opt/LLaMA-Factory/src/llamafactory"


def test_a_data_error_names_its_frame_and_gets_data_steps_only():
    log = tb([(f"{LF}/launcher.py", 23, "<module>"), (f"{LF}/data/loader.py", 313, "get_dataset"),
              (f"{SITE}/datasets/arrow_dataset.py", 3073, "map"), (f"{LF}/data/converter.py", 112, "__call__")],
             "KeyError: 'conversations'")
    r = explain_text(log, entries=[])  # what explain says when the catalog does not know it
    data = r.to_json()
    assert data["diagnoses"] == [] and r.advice.kind == "data"
    assert data["root_error"]["frame"] == {"file": f"{LF}/data/converter.py", "line": 112, "function": "__call__", "library": True}
    assert "yaml_key" not in data["root_error"]  # 'conversations' is a column, not an argument
    steps = " ".join(data["next_steps"])
    assert "dataset_info.json" in steps and "NCCL" not in steps


def test_a_chained_error_takes_its_phase_from_the_whole_chain():
    """raise ... from e: the first link's traceback holds only the inner frames (a validator); the
    outer ones (load_model) come in the link Python prints after it. The log's last marker says data."""
    inner = tb([(f"{SITE}/huggingface_hub/dataclasses.py", 615, "_validate_simple_type")],
               "TypeError: Field 'max_position_embeddings' expected int, got float (value: 2048.0)")
    outer = tb([(f"{LF}/launcher.py", 23, "<module>"), (f"{LF}/model/loader.py", 141, "load_model"),
                (f"{LF}/model/patcher.py", 328, "patch_config"), (f"{LF}/model/model_utils/rope.py", 71, "configure_rope"),
                (f"{SITE}/huggingface_hub/dataclasses.py", 146, "__strict_setattr__")],
               "huggingface_hub.errors.StrictDataclassFieldValidationError: Validation error for field 'max_position_embeddings':")
    log = ("Running tokenizer on dataset (num_proc=1): 100%|##########| 32/32\n" + inner
           + "\nThe above exception was the direct cause of the following exception:\n\n" + outer)
    r = explain_text(log, entries=[])
    assert r.root_error.text.startswith("huggingface_hub.errors.StrictDataclassFieldValidationError")  # the raise ... from
    assert r.phase is not None and r.phase.name == "model loading", r.phase
    alone = explain_text("Running tokenizer on dataset (num_proc=1): 100%|##########| 32/32\n" + inner, entries=[])
    assert alone.phase is not None and alone.phase.name == "data loading"  # without the chain: the log's marker

def test_a_config_error_names_the_yaml_key():
    log = tb([(f"{LF}/hparams/parser.py", 226, "get_train_args")], "ValueError: Please specify `max_steps` in streaming mode.")
    r = explain_text(log)
    assert r.advice.yaml_key == "max_steps" and r.advice.kind == "config" and r.phase.name == "start-up"
    assert r.to_json()["root_error"]["yaml_key"] == "max_steps"
    assert r.advice.next_steps[0].startswith("Change `max_steps`")


def test_an_import_error_gets_a_version_step_and_no_nccl_advice():
    log = tb([(f"{SITE}/transformers/utils/import_utils.py", 2045, "_get_module")],
             "ModuleNotFoundError: No module named 'flash_attn'")
    r = explain_text(log)
    steps = " ".join(r.advice.next_steps)
    assert r.advice.kind == "import" and "pip show flash_attn" in steps and "NCCL" not in steps


def test_an_extension_built_for_another_torch_gets_a_rebuild_step_for_its_package():
    log = tb([("/home/me/train.py", 3, "<module>"), (f"{SITE}/flash_attn/__init__.py", 3, "<module>")],
             f"ImportError: {SITE}/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")
    r = explain_text(log, entries=[])
    steps = " ".join(r.advice.next_steps)
    assert r.advice.kind == "import" and "--force-reinstall flash_attn" in steps
    assert "the package" not in steps and "The module" not in steps and "NCCL" not in steps


def test_a_cuda_error_gets_cuda_launch_blocking_and_no_other_kind_of_advice():
    log = tb([("/home/me/model.py", 88, "forward")], "RuntimeError: CUDA error: an illegal memory access was encountered")
    r = explain_text(log, entries=[])
    steps = " ".join(r.advice.next_steps)
    assert r.advice.kind == "cuda" and "CUDA_LAUNCH_BLOCKING=1" in steps
    assert "NCCL_DEBUG" not in steps and "dataset_info" not in steps


def test_a_logged_data_error_is_classified_by_its_message_and_names_the_logger_location():
    log = ("[rank0]: [ERROR|2026-12-01 14:02:11] llamafactory.data.loader:99 >> ValueError: Invalid `cutoff_len` for sample 17\n"
           "E1201 14:03:23.533000 50300 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
           "local_rank: 0 (pid: 50313) of binary: /opt/venv/bin/python\n")
    r = explain_text(log, entries=[])
    assert r.advice.kind == "data" and r.advice.yaml_key == "cutoff_len"
    assert r.to_json()["root_error"]["frame"] == {"file": "llamafactory/data/loader.py", "line": 99, "function": "", "library": True}
    assert any("dataset_info.json" in s for s in r.advice.next_steps)


def test_an_nccl_error_gets_nccl_debug():
    log = ("[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, "
           "invalid argument (run with NCCL_DEBUG=WARN for details), NCCL version 2.26.2\n")
    r = explain_text(log)
    if r.diagnoses:  # the catalog may know it; the steps are there all the same
        pass
    assert r.advice.kind == "distributed" and any("NCCL_DEBUG=INFO" in s for s in r.advice.next_steps)


def test_wrapper_frames_are_not_the_failing_frame_and_user_code_is_said():
    log = tb([("/home/me/train.py", 42, "main"), (f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper"),
              ("/home/me/model.py", 17, "forward"), (f"{SITE}/torch/nn/modules/module.py", 1775, "_call_impl")],
             "RuntimeError: shapes don't line up: 4096 vs 4097")
    r = explain_text(log)
    assert (r.advice.frame.file, r.advice.frame.function, r.advice.frame.library) == ("/home/me/model.py", "forward", False)
    assert r.advice.kind == "user-code" and "/home/me/model.py:17 in forward" in r.advice.next_steps[0]


def test_a_library_frame_says_where_the_users_code_called_it():
    log = tb([("/home/me/train.py", 42, "main"), (f"{SITE}/deepspeed/runtime/engine.py", 1997, "no_sync")],
             "RuntimeError: something only this engine knows")
    r = explain_text(log)
    assert r.advice.frame.library and r.advice.frame.package == "deepspeed"
    assert r.advice.caller.where() == "/home/me/train.py:42 in main"


@pytest.mark.parametrize("name", ["r1_raises_r0_times_out", "tee_r0_raises_r1_times_out"])
def test_cross_rank_fixture_names_the_failing_frame_and_the_consequence(name):
    from pathlib import Path

    from mgft_doctor.explain import explain_paths

    r = explain_paths([str(Path(__file__).parent / "fixtures" / "ranks" / f"{name}.log")])
    assert (r.advice.frame.function, r.advice.frame.line, r.advice.frame.library) == ("load_batch", 19, False)
    assert r.advice.next_steps[0].startswith("Fix this error first")
    assert not any("NCCL_DEBUG" in s for s in r.advice.next_steps)


def test_the_argument_names_are_those_of_the_installed_llamafactory():
    from mgft_doctor.explain import _llamafactory_args, argnames

    found = argnames.installed()
    if found is None or found[0] != _llamafactory_args.SOURCE:
        pytest.skip("another llamafactory/transformers than the list was generated from")
    assert found[1] == _llamafactory_args.NAMES
    assert {"template", "cutoff_len", "per_device_train_batch_size", "deepspeed"} <= _llamafactory_args.NAMES
    assert "compute_dtype" not in _llamafactory_args.NAMES  # field(init=False): set by the code


def test_datasets_map_progress_is_data_loading():
    log = ("Map (num_proc=8):  45%|####5     | 450/1000 [00:02<00:03, 180.00 examples/s]\n"
           + tb([("/home/me/train.py", 30, "main"), ("/home/me/train.py", 12, "tokenize")], "KeyError: 'text'"))
    r = explain_text(log)
    assert r.phase.name == "data loading" and r.advice.kind == "data"


# --- a report that fits: 40 lines at 80 columns, whole lines off a terminal ---

import io

from rich.console import Console

from mgft_doctor.catalog import load_catalog
from mgft_doctor.explain.render import render

LONG_PATH = "/very/long/" + "nested/" * 30 + "site-packages/transformers/models/qwen2/modeling_qwen2.py"


def rendered(report, terminal: bool, width: int = 80, verbose: bool = False) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=terminal, color_system=None, highlight=False)
    assert console.is_terminal is terminal
    render(report, console, verbose=verbose)
    return buf.getvalue()


def test_a_typical_report_fits_40_lines_at_80_columns():
    entries = load_catalog()
    counts = sorted(rendered(explain_text(e.examples_match[0], entries), terminal=True).count("\n")
                    for e in entries if e.examples_match)
    assert counts[len(counts) // 2] <= 40, counts
    assert sum(c <= 40 for c in counts) >= 0.8 * len(counts), counts



def test_every_lab_report_fits_40_lines_at_80_columns():
    """The reports of the logs that real runs recorded (tests/lab/<id>/{cpu,gpu}.log) on a terminal."""
    from pathlib import Path

    from mgft_doctor.explain import explain_paths
    logs = sorted(Path(__file__).parent.joinpath("lab").glob("*/*.log"))
    assert len(logs) >= 80
    too_long = {}
    for log in logs:
        report = explain_paths([str(log)])
        n = rendered(report, terminal=True).count("\n")
        if n > 40:
            too_long[f"{log.parent.name}/{log.name}"] = (n, report.diagnoses[0].code if report.diagnoses else None)
    assert not too_long, too_long

def test_the_top_diagnosis_in_full_the_others_one_line_each():
    entries = load_catalog()
    report = next(r for r in (explain_text(ex, entries) for e in entries for ex in e.examples_match)
                  if len(r.diagnoses) >= 2)
    text = rendered(report, terminal=True)
    top, others = report.diagnoses[0], report.diagnoses[1:]
    flat = " ".join(text.split())
    assert all(" ".join(f.split()) in flat for f in top.fixes)  # every fix of the top one, whole
    for d in others:
        mentions = [ln for ln in text.splitlines() if d.code in ln]
        assert len(mentions) == 1 and len(mentions[0]) <= 80  # one line, no explanation, no fixes
        assert not any(" ".join(f.split())[:60] in flat for f in d.fixes if f not in top.fixes)
    full = " ".join(rendered(report, terminal=True, verbose=True).split())
    assert all(" ".join(f.split()) in full for d in report.diagnoses for f in d.fixes)  # -v: everything
    piped = rendered(report, terminal=False, verbose=True)
    assert all(ref in piped for d in report.diagnoses for ref in d.references)


def test_off_a_terminal_no_line_is_wrapped():
    log = tb([("/home/me/train.py", 3, "main"), (LONG_PATH, 812, "forward")],
             f"RuntimeError: The size of tensor a (4096) must match the size of tensor b (4097) at non-singleton dimension 1 in {LONG_PATH}")
    r = explain_text(log)
    text = rendered(r, terminal=False)
    lines = text.splitlines()
    assert any(ln.strip() == r.root_error.text for ln in lines)  # the error line, whole
    assert any(LONG_PATH + ":812 in forward" in ln for ln in lines)  # the frame line, whole
    assert max(map(len, lines)) > 200


def test_on_a_terminal_wrapped_lines_indent_under_their_text():
    # a save failure no entry knows, so that the report ends in next steps ("unexpected pos" is MGD824's disk-full sign)
    r = explain_text(CASES["saving"][0].replace("unexpected pos 4736 vs 4630", "writer stopped at record 4736"))
    assert not r.diagnoses
    text = rendered(r, terminal=True, width=60)
    lines = text.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 60
    steps = lines.index("  Next steps:")
    item = [ln for ln in lines[steps + 1:] if ln.startswith("    1. ")]
    assert item, text
    first = lines.index(item[0])
    follow = lines[first + 1]
    assert follow.startswith(" " * 7) and follow[7] != " "  # under the text, after '    1. '


def test_an_error_line_is_never_cut_without_an_ellipsis():
    long_error = "ValueError: " + "the batch holds a sample longer than cutoff_len " * 20
    r = explain_text("Traceback (most recent call last):\n" + f'  File "{LONG_PATH}", line 5, in f\n' + long_error + "\n")
    for terminal in (True, False):
        text = rendered(r, terminal=terminal)
        flat = " ".join(text.split())
        assert " ".join(long_error.split()) in flat or "…" in text
        assert " ".join(long_error.split())[:250] in flat
    entries = load_catalog()
    report = next(r for r in (explain_text(ex, entries) for e in entries for ex in e.examples_match)
                  if r.diagnoses and any(len(ev.text) > 90 and ev.no != r.root_error.no for ev in r.diagnoses[0].evidence[:2]))
    text = rendered(report, terminal=True)
    cut = [ln for ln in text.splitlines() if ln.lstrip().startswith(("Evidence:", "line ")) and len(ln) >= 79]
    assert cut and all(ln.rstrip().endswith("…") for ln in cut)


def test_the_cli_keeps_whole_lines_in_a_pipe(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(CASES["saving"][0].replace("saves/llama3/checkpoint-1200", LONG_PATH))
    proc = subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", str(log)], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"})
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == "✗ Training failed while saving, at step 1200 of 3000"
    assert any(ln.strip() == "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 4736 vs 4630" for ln in lines)
    assert any(ln.startswith("    1. ") and len(ln) > 80 for ln in lines)  # a step, not wrapped at 80
    assert len(lines) <= 40


def test_the_root_header_names_the_log_only_when_several_were_read(tmp_path):
    from mgft_doctor.explain import explain_paths

    a, b = tmp_path / "rank0.log", tmp_path / "rank1.log"
    a.write_text("{'loss': 1.0, 'epoch': 0.1}\n")
    b.write_text(tb([("/home/me/train.py", 9, "main")], "KeyError: 'labels'"))
    one = rendered(explain_paths([str(b)]), terminal=True)
    assert "Root error, line 4 (4 lines read):" in one and "rank1.log" not in one
    both = rendered(explain_paths([str(a), str(b)]), terminal=True, width=200)
    assert f"Root error, line 4 of {b} (5 lines read):" in both


LAB = __import__("pathlib").Path(__file__).parent / "lab"


@pytest.mark.parametrize("fault, job, words", [
    ("export-adapter-path-full-model", "export", "Export failed while loading the model"),
    ("ckpt-zero-to-fp32-rank-file-missing", "checkpoint conversion", "Checkpoint conversion failed"),
    ("zero3-lm-head-weight-in-custom-loss", "training", "Training failed"),
])
def test_the_headline_names_the_program_that_failed(fault, job, words):
    """llamafactory-cli export and zero_to_fp32.py are not training runs: the report says what failed,
    and an offline conversion gets none of a training run's phases (it said 'Training failed while saving')."""
    log = LAB / fault / "cpu.log"
    out = subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", str(log)], capture_output=True, text=True)
    assert out.stdout.splitlines()[0].lstrip("✗ ").startswith(words)
    data = json.loads(subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", "--json", str(log)],
                                     capture_output=True, text=True).stdout)
    assert data["job"] == job and (data["phase"] is None if job == "checkpoint conversion" else True)


def test_a_fix_for_another_form_of_the_error_is_left_to_verbose():
    """MGD942's fixes each name one renamed argument (if_log): a log that names no_cuda shows the
    transformers 5 rename on a terminal, not the dispatch_batches advice; -v and --json keep all."""
    from pathlib import Path

    from mgft_doctor.explain import explain_paths
    log = Path(__file__).parent / "lab" / "hf-trainer-no-cuda-removed" / "cpu.log"
    report = explain_paths([str(log)])
    top = report.diagnoses[0]
    assert top.code == "MGD942" and top.focus is not None
    shown = rendered(report, terminal=True)
    assert "use_cpu=True" in shown and "dispatch_batches / split_batches:" not in shown
    assert "more fixes for other forms of this error: -v" in shown
    full = rendered(report, terminal=True, verbose=True)
    assert "dispatch_batches / split_batches:" in full and "more fixes for other" not in full
    assert any(f.startswith("dispatch_batches") for f in top.fixes)  # what --json carries


def test_a_fix_condition_that_is_no_regex_names_file_and_field(tmp_path):
    from mgft_doctor.catalog import load_file
    from mgft_doctor.errors import CatalogError
    bad = tmp_path / "MGD998.yaml"
    bad.write_text("code: MGD998\ntitle: t\narea: nccl\nmatch:\n  signatures: ['boom']\n"
                   "explanation: x\nfixes: [a, {text: b, if_log: '(unclosed'}]\nreferences: ['https://x']\n"
                   "examples: {match: [boom], no_match: [b]}\n")
    with pytest.raises(CatalogError) as err:
        load_file(bad)
    assert "MGD998.yaml" in str(err.value) and "fixes[1].if_log" in str(err.value)


# Custom loops and other libraries print their progress in their own words; the phase must not fall back
# to the last start-up marker (torchrun's banner) when the log shows training (or data preparation).
BANNER = ("W0312 10:02:12.551000 2133 torch/distributed/run.py:803] Setting OMP_NUM_THREADS environment variable for each "
          "process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal "
          "performance in your application as needed. \n")
TIMEOUT = ("[rank1]:[E0312 11:42:28.858931807 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=4431, OpType=ALLREDUCE, NumelIn=20123712, NumelOut=20123712, Timeout(ms)=1800000) ran for "
           "1800047 milliseconds before timing out.\n")
OWN_PROGRESS = {
    # (progress lines, phase, (step, total) or None)
    "lightning-epoch-bar": ("Epoch 3:  45%|####5     | 450/1000 [02:10<02:39,  3.45it/s, v_num=0, train_loss=0.123]\n", "mid-training", None),
    "epoch-of-bar": ("Epoch 1/30: 100%|##########| 2212/2212 [41:08<00:00,  1.12s/it]\n"
                     "Running predictions on sample ttbar on rank=0:  40%|####      | 2/5 [21:12<31:48, 636.0s/it]\n", "mid-training", None),
    "steps-bar": ("Steps:  10%|#         | 521/5210 [12:31<1:52:44,  1.44s/it, lr=0.0001, step_loss=0.0912]\n", "mid-training", (521, 5210)),
    "icefall": ("2025-03-04 11:02:40,127 INFO [train.py:712] Epoch 0, batch 3000, loss[loss=0.1799, over 9977.00 frames. ], batch size: 58\n",
                "mid-training", None),
    "funasr": ("train, rank: 0, epoch: 0/50, step_in_epoch: 15600, total step: 15600, (loss_avg_rank: 0.212), (acc_avg_slice: 0.911)\n",
               "mid-training", None),
    "itr": ("09-05 10:23:02 Epoch 0/40 itr 120/3406: lr: 0.0001 speed: 0.71(0.22)s/itr loss_nce: 1.2211\n", "mid-training", None),
    "datasets-map-with-desc": ("Tokenizing Prompts (num_proc=64):  71%|#######1  | 255912/359152 [29:46<14:46, 116.42 examples/s]\n",
                               "data loading", None),
}


@pytest.mark.parametrize("name", sorted(OWN_PROGRESS))
def test_progress_printed_in_a_loops_own_words_names_the_phase(name):
    progress, phase, numbers = OWN_PROGRESS[name]
    r = explain_text(BANNER + progress + TIMEOUT)
    assert r.failure and r.phase is not None and r.phase.name == phase, (name, r.phase)
    assert (None if r.phase.step is None else (r.phase.step, r.phase.total)) == numbers


def test_a_config_dump_naming_batch_and_loss_is_no_progress():
    dump = "per_device_train_batch_size 8, loss_type sigmoid, max_steps 1000\nbatch 8 loss sigmoid\n"
    r = explain_text(BANNER + dump + TIMEOUT)
    assert r.phase is not None and r.phase.name == "start-up", r.phase
