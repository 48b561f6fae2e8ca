"""config.llamafactory's rules (runconfig/lf_rules.py) against LLaMA-Factory itself: each planted
mistake in a tiny local run (a LLaMA of two layers, a BPE tokenizer and alpaca/sharegpt files
built here) is found by the rule with the code the catalog gives it, and really fails in
LLaMA-Factory 0.9.5 (llamafactory.train.tuner.run_exp in process, as `llamafactory-cli train`
calls it on one CPU process; two cases through the real CLI) with the message the finding
quotes; each near-miss passes both."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from mgft_doctor.launch import worker_script
from mgft_doctor.launch.script import run_script
from mgft_doctor.runconfig import RunConfig, codes, lf_rules, load_run_config

BASE = {"model_name_or_path": "model", "stage": "sft", "do_train": True, "finetuning_type": "lora", "lora_rank": 4,
        "lora_target": "all", "dataset": "tiny", "dataset_dir": "data", "template": "qwen", "cutoff_len": 64,
        "overwrite_cache": True, "preprocessing_num_workers": 1, "output_dir": "out", "overwrite_output_dir": True,
        "max_steps": 1, "per_device_train_batch_size": 1, "report_to": "none", "save_strategy": "no"}
FAIL, WARN = "fail", "warn"

# name -> (changes to BASE (None drops a key), YAML lines written as text, (our code, severity) or None,
#          a piece of what LLaMA-Factory says when it stops, or None when the run passes)
CASES = {
    "base": ({}, "", None, None),
    "unknown_key": ({"learning_rat": 1e-4}, "", (codes.LF_UNKNOWN_KEY, FAIL),
                    "Some keys are not used by the HfArgumentParser: ['learning_rat']"),
    "quoted_lr": ({}, 'learning_rate: "1e-4"\n', (codes.LF_STRING_NUMBER, FAIL),
                  "'<=' not supported between instances of 'float' and 'str'"),
    "unquoted_lr_1e-4": ({}, "learning_rate: 1e-4\n", None, None),  # a string in PyYAML, a float in OmegaConf
    "quoted_rank": ({"lora_rank": None}, 'lora_rank: "8"\n', (codes.LF_STRING_NUMBER, FAIL),
                    "'<=' not supported between instances of 'str' and 'int'"),
    "quoted_warmup": ({}, "warmup_steps: '2'\n", (codes.LF_STRING_NUMBER, FAIL),
                      "'<' not supported between instances of 'str' and 'int'"),
    "warmup_ratio_as_steps": ({}, "warmup_steps: 0.1\n", None, None),  # a float in transformers 5: a ratio below 1
    "warmup_exponent": ({"max_steps": None}, "max_steps: 2\nwarmup_steps: 1e0\n", None, None),  # 1.0 under OmegaConf
    "float_batch": ({"per_device_train_batch_size": None}, "per_device_train_batch_size: 1e0\n",
                    (codes.LF_STRING_NUMBER, FAIL), "batch_size should be a positive integer value"),
    # a quoted "false" is a true str: LLaMA-Factory trains (and saves) although the YAML seems to say no
    "quoted_false_do_train": ({"do_train": None, "output_dir": "out_quoted_false"}, 'do_train: "false"\n',
                              (codes.LF_STRING_NUMBER, WARN), None),
    "quant_full": ({"quantization_bit": 4, "finetuning_type": "full"}, "", (codes.LF_ARG_REFUSED, FAIL),
                   "Quantization is only compatible with the LoRA or OFT method."),
    "eval_without_data": ({"do_eval": True}, "", (codes.LF_ARG_REFUSED, FAIL),
                          "Please make sure eval_dataset be provided or val_size >1e-6"),
    "eval_with_val_size": ({"do_eval": True, "val_size": 0.25, "eval_strategy": "steps", "eval_steps": 1}, "", None, None),
    "stage_typo": ({"stage": "stf"}, "", (codes.LF_ARG_REFUSED, FAIL), "Unknown task: stf."),
    "generate_outside_sft": ({"stage": "pt", "predict_with_generate": True}, "", (codes.LF_ARG_REFUSED, FAIL),
                             "`predict_with_generate` cannot be set as True except SFT."),
    "dora_with_full": ({"finetuning_type": "full", "use_dora": True}, "", (codes.LF_ARG_REFUSED, FAIL),
                       "`use_dora` is only valid for LoRA training."),
    "attention_fa3": ({"flash_attn": "fa3"}, "", (codes.LF_ARG_REFUSED, FAIL), "Unknown attention type: fa3"),
    "attention_fa2_missing": ({"flash_attn": "fa2"}, "", (codes.LF_EXTRA_MISSING, WARN), None),
    "no_do_train": ({"do_train": None}, "", (codes.LF_ARG_REFUSED, WARN), None),
    "undefined_dataset": ({"dataset": "nope"}, "", (codes.LF_DATASET, FAIL), "Undefined dataset nope in dataset_info.json."),
    "missing_file": ({"dataset": "missing"}, "", (codes.LF_DATASET, FAIL), "File data/missing.json not found."),
    "ranking_for_dpo": ({"stage": "dpo"}, "", (codes.LF_DATASET, FAIL),
                        "The dataset is not applicable in the current training stage."),
    "no_dataset_info": ({"dataset_dir": "nodata"}, "", (codes.LF_DATASET, WARN),
                        "Cannot open nodata/dataset_info.json due to"),
    "alpaca_without_input": ({"dataset": "noinput"}, "", (codes.LF_DATASET_FORMAT, FAIL), "'input'"),
    "alpaca_columns_mapped": ({"dataset": "qa_mapped"}, "", None, None),
    "sharegpt_roles": ({"dataset": "badroles"}, "", (codes.LF_DATASET_FORMAT, FAIL),
                       "Cannot find valid samples, check `data/README.md` for the data format."),
    "sharegpt_openai_keys": ({"dataset": "openai_default"}, "", (codes.LF_DATASET_FORMAT, FAIL), "'from'"),
    "sharegpt_with_tags": ({"dataset": "openai_tags"}, "", None, None),
    "template_unknown": ({"template": "qwen9"}, "", (codes.LF_TEMPLATE, FAIL), "Template qwen9 does not exist."),
    "lora_targets_none_exist": ({"lora_target": "query_key_value"}, "", (codes.LF_LORA_TARGET, FAIL),
                                "Target modules {'query_key_value'} not found in the base model."),
    "lora_targets_one_exists": ({"lora_target": "q_proj,query_key_value"}, "", (codes.LF_LORA_TARGET, WARN), None),
    "unsloth_missing": ({"use_unsloth": True}, "", (codes.LF_EXTRA_MISSING, FAIL),
                        "The 'unsloth' distribution was not found and is required by this application."),
    "wandb_missing": ({"report_to": "wandb"}, "", (codes.LF_EXTRA_MISSING, FAIL), "WandbCallback requires wandb to be installed."),
    "report_to_comma_string": ({"report_to": "wandb,tensorboard"}, "", (codes.LF_EXTRA_MISSING, FAIL),
                               "wandb,tensorboard is not supported, only"),
    "bnb_missing": ({"quantization_bit": 4}, "", (codes.LF_QUANT_BACKEND, FAIL),
                    "The 'bitsandbytes>=0.39.0' distribution was not found and is required by this application."),
    "bnb_3bit": ({"quantization_bit": 3}, "", (codes.LF_QUANT_BACKEND, FAIL),
                 "Bitsandbytes only accepts 4-bit or 8-bit quantization."),
    "quant_method_gptq_on_the_fly": ({"quantization_bit": 4, "quantization_method": "gptq"}, "",
                                     (codes.LF_QUANT_BACKEND, WARN), None),  # trains unquantized, says nothing
    "output_dir_holds_a_model": ({"output_dir": "done", "overwrite_output_dir": None}, "", (codes.LF_OUTPUT_DIR, FAIL),
                                 "Output directory already exists and is not empty. Please set `overwrite_output_dir`."),
    "output_dir_overwritten": ({"output_dir": "done2"}, "", None, None),
    "resume_from_nowhere": ({"resume_from_checkpoint": "out/checkpoint-99"}, "", (codes.LF_OUTPUT_DIR, FAIL),
                            "Can't find a valid checkpoint at out/checkpoint-99"),
    "resume_true_without_checkpoint": ({"resume_from_checkpoint": True, "output_dir": "fresh"}, "",
                                       (codes.LF_OUTPUT_DIR, FAIL), "No valid checkpoint found in output directory (fresh)"),
}

ROWS = [{"instruction": f"say {w} twice", "input": "", "output": f"{w} {w}"} for w in "a the model data gpu rank".split()]
CHAT = [[{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": r["output"]}] for r in ROWS]
DATASETS = {
    "tiny": ({"file_name": "tiny.json"}, ROWS),
    "noinput": ({"file_name": "noinput.json"}, [{"instruction": r["instruction"], "output": r["output"]} for r in ROWS]),
    "qa_mapped": ({"file_name": "qa.json", "columns": {"prompt": "question", "response": "answer"}},
                  [{"question": r["instruction"], "answer": r["output"]} for r in ROWS]),
    "badroles": ({"file_name": "badroles.json", "formatting": "sharegpt"},
                 [{"conversations": [{"from": m["role"], "value": m["content"]} for m in c]} for c in CHAT]),
    "openai_default": ({"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "messages"}},
                       [{"messages": c} for c in CHAT]),
    "openai_tags": ({"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "messages"},
                     "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                              "assistant_tag": "assistant"}}, None),
    "missing": ({"file_name": "missing.json"}, None),
}


def write_lab(folder: Path) -> Path:
    """The files a LLaMA-Factory checkout would hold for these runs (model weights: the oracle builds them)."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "model").mkdir(exist_ok=True)
    (folder / "model" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    info = {}
    for name, (entry, rows) in DATASETS.items():
        info[name] = entry
        if rows is not None:
            (folder / "data" / entry["file_name"]).write_text(json.dumps(rows))
    (folder / "data" / "dataset_info.json").write_text(json.dumps(info, indent=1))
    (folder / "done").mkdir(exist_ok=True)
    (folder / "done" / "adapter_model.safetensors").write_bytes(b"")
    (folder / "done2").mkdir(exist_ok=True)
    (folder / "done2" / "adapter_model.safetensors").write_bytes(b"")
    for name, (changes, raw, _, _) in CASES.items():
        args = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(args, sort_keys=False) + raw)
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return write_lab(tmp_path_factory.mktemp("lflab"))


@pytest.fixture(scope="module")
def env(lab):
    """The examined Python's facts, read by config.llamafactory's own worker (no import: fast)."""
    res = run_script(sys.executable, worker_script("lf_env"), {"packages": ["unsloth", "wandb", "tensorboard",
                     "bitsandbytes", "flash-attn", "transformers", "llamafactory", "deepspeed"], "imports": []}, 60)
    d = res.payload
    assert d and d.get("fields") and d.get("templates"), res.log[-2000:]
    return lf_rules.Env(versions=d["versions"], fields=d["fields"], templates=frozenset(d["templates"]),
                        bnb_min=d.get("bnb_min"), integrations=d.get("integrations"), cwd=str(lab))


def problems(lab: Path, env, name: str):
    rc = load_run_config(str(lab / f"{name}.yaml"))  # read once, as the CLI reads it; the rules never reread
    cfg = json.loads((lab / "model" / "config.json").read_text())
    return lf_rules.check(rc, env, model_cfg=cfg)


@pytest.mark.parametrize("name", list(CASES))
def test_the_rules_on_each_case(lab, env, name):
    expected = CASES[name][2]
    found = problems(lab, env, name)
    if expected is None:
        assert found == [], [(p.code, p.message) for p in found]
        return
    assert found and (found[0].code, found[0].severity) == expected, [(p.code, p.severity, p.message) for p in found]
    said = CASES[name][3]
    if said and expected[1] == FAIL:
        assert said.strip("'") in found[0].message, found[0].message  # the library's words, quoted


def test_every_rule_names_the_source_it_mirrors():
    for rule in lf_rules.RULES:
        assert rule.__doc__ and ".py" in rule.__doc__, rule.__name__
    for where, *_ in lf_rules.COMBINATIONS:
        assert ".py" in where


def test_the_yaml_is_read_as_llamafactory_cli_reads_it(tmp_path):
    """OmegaConf's rules, not PyYAML's: an exponent without a dot is a float, a date stays a string."""
    p = tmp_path / "t.yaml"
    p.write_text("learning_rate: 1e-4\nwarmup_steps: 1e2\nquoted: \"1e-4\"\nrun_name: 2024-01-01\nbf16: true\n")
    args = lf_rules.llamafactory_args(load_run_config(str(p)))
    assert args == {"learning_rate": 1e-4, "warmup_steps": 100.0, "quoted": "1e-4", "run_name": "2024-01-01", "bf16": True}
    from omegaconf import OmegaConf

    assert args == OmegaConf.to_container(OmegaConf.load(p))


def test_module_names_per_model_type_are_what_transformers_builds():
    """The LoRA-target table against the real modules, built on the meta device (Linear, Embedding, Conv1D)."""
    import torch
    import transformers

    small = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, pad_token_id=0, head_dim=16)
    wrong = {}
    for mtype, names in lf_rules.MODULE_NAMES.items():
        try:
            cfg = transformers.AutoConfig.for_model(mtype, **small)
        except AttributeError:  # a config whose head_dim is derived
            cfg = transformers.AutoConfig.for_model(mtype, **{k: v for k, v in small.items() if k != "head_dim"})
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        kinds = (torch.nn.Linear, torch.nn.Embedding, transformers.pytorch_utils.Conv1D)
        real = {n.split(".")[-1] for n, m in model.named_modules() if n and isinstance(m, kinds)}
        if real != set(names):
            wrong[mtype] = sorted(real ^ set(names))
    assert wrong == {}


def test_rules_take_milliseconds(lab, env):
    """Well under a second for every case together, with no process started (the worker is apart)."""
    import time

    t0 = time.perf_counter()
    for name in CASES:
        problems(lab, env, name)
    per_case_ms = (time.perf_counter() - t0) * 1000 / len(CASES)
    assert per_case_ms < 100, per_case_ms


@pytest.mark.slow
def test_llamafactory_fails_on_every_planted_case_and_passes_every_near_miss(lab):
    from runconfig_oracle import ask

    cases = {"build": {"mode": "build", "out": str(lab / "model")}}
    cases.update({name: {"mode": "run", "yaml": str(lab / f"{name}.yaml"), "cwd": str(lab)} for name in CASES})
    got = ask(cases, lab)
    assert got["build"]["ok"], got["build"]
    wrong = {}
    for name, (_, _, expected, said) in CASES.items():
        r = got[name]
        if said is None and not r["ok"]:
            wrong[name] = f"LLaMA-Factory failed: {r}"
        elif said is not None and (r["ok"] or said not in r["msg"]):
            wrong[name] = f"expected {said!r}, got {r}"
    assert wrong == {}
    assert (lab / "out_quoted_false" / "adapter_model.safetensors").is_file()  # it trained


@pytest.mark.slow
@pytest.mark.parametrize("name", ["template_unknown", "alpaca_without_input"])
def test_llamafactory_cli_train_fails_as_the_rule_says(lab, name):
    """The real CLI on one CPU process (after the oracle's model build, or its own)."""
    import subprocess

    from runconfig_oracle import ENV, ask
    from test_watch_runs import find_tool

    cli = find_tool("llamafactory-cli")
    if not (lab / "model" / "model.safetensors").exists():
        ask({"build": {"mode": "build", "out": str(lab / "model")}}, lab)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MGFT_DOCTOR_", "PYTEST_"))}
    env.update(ENV, HF_HOME=str(lab / ".hf"))
    proc = subprocess.run([str(cli), "train", f"{name}.yaml"], cwd=lab, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0
    assert CASES[name][3] in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


# every entry of lf_rules.COMBINATIONS, planted alone on BASE (None drops a key): its message is
# what LLaMA-Factory's parser raises
PLANTS = {
    "Please provide `model_name_or_path`.": {"model_name_or_path": None},
    "Invalid fine-tuning method.": {"finetuning_type": "qlora"},
    "`reward_model` is necessary for PPO training.": {"stage": "ppo"},
    "`reward_model_type` cannot be lora for Freeze/Full PPO training.": {"stage": "ppo", "reward_model": "rm",
                                                                         "finetuning_type": "full"},
    "`dpo_label_smoothing` is only valid for sigmoid loss function.": {"stage": "dpo", "pref_loss": "hinge",
                                                                       "dpo_label_smoothing": 0.1},
    "`use_llama_pro` is only valid for Freeze or LoRA training.": {"finetuning_type": "full", "use_llama_pro": True},
    "Cannot use LoRA with GaLore, APOLLO or BAdam together.": {"use_galore": True},
    "Cannot use GaLore, APOLLO or BAdam together.": {"finetuning_type": "full", "use_galore": True, "use_apollo": True},
    "Cannot use PiSSA for current training stage.": {"stage": "kto", "pissa_init": True},
    "`loraplus_lr_ratio` is only valid for LoRA training.": {"finetuning_type": "full", "loraplus_lr_ratio": 16.0},
    "`use_rslora` is only valid for LoRA training.": {"finetuning_type": "full", "use_rslora": True},
    "`use_dora` is only valid for LoRA training.": {"finetuning_type": "full", "use_dora": True},
    "`pissa_init` is only valid for LoRA training.": {"finetuning_type": "full", "pissa_init": True},
    "Cannot specify `val_size` if `dataset` is None.": {"dataset": None, "val_size": 0.1},
    "Cannot specify `val_size` if `eval_dataset` is not None.": {"eval_dataset": "tiny", "val_size": 0.1},
    "`interleave_probs` is only valid for interleaved mixing.": {"interleave_probs": "1.0"},
    "Streaming mode should have an integer val size.": {"streaming": True, "val_size": 0.1},
    "`max_samples` is incompatible with `streaming`.": {"streaming": True, "max_samples": 10},
    "`mask_history` is incompatible with `train_on_prompt`.": {"mask_history": True, "train_on_prompt": True},
    "`predict_with_generate` cannot be set as True except SFT.": {"stage": "pt", "predict_with_generate": True},
    "`neat_packing` cannot be set as True except SFT.": {"stage": "pt", "neat_packing": True},
    "`train_on_prompt` or `mask_history` cannot be set as True except SFT.": {"stage": "pt", "train_on_prompt": True},
    "Please enable `predict_with_generate` to save model predictions.": {"do_predict": True, "eval_dataset": "tiny"},
    "RM and PPO stages do not support `load_best_model_at_end`.": {
        "stage": "rm", "load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps",
        "eval_steps": 1, "save_steps": 1, "eval_dataset": "tiny"},
    "PPO training does not support evaluation, use the SFT stage to evaluate models.": {
        "stage": "ppo", "reward_model": "rm", "do_train": None},
    "PPO training is incompatible with S^2-Attn.": {"stage": "ppo", "reward_model": "rm", "shift_attn": True},
    "Please specify `max_steps` in streaming mode.": {"streaming": True, "max_steps": None},
    "Please specify dataset for training.": {"dataset": None},
    "Please make sure eval_dataset be provided or val_size >1e-6": {"do_eval": True},
    "Cannot use `predict_with_generate` and `compute_accuracy` together.": {
        "predict_with_generate": True, "compute_accuracy": True, "eval_dataset": "tiny"},
    "Cannot use device map for quantized models in training.": {"quantization_bit": 4, "quantization_device_map": "auto"},
    "FP8 training is not compatible with quantization. Please disable one of them.": {"fp8": True, "quantization_bit": 4},
    "vLLM/SGLang backend is only available for API, CLI and Web.": {"infer_backend": "vllm"},
    "Adapter is only valid for the LoRA method.": {"finetuning_type": "full", "adapter_name_or_path": "adapter"},
    "Quantization is only compatible with the LoRA or OFT method.": {"quantization_bit": 4, "finetuning_type": "full"},
    "Please use scripts/pissa_init.py to initialize PiSSA for a quantized model.": {"quantization_bit": 4, "pissa_init": True},
    "Cannot resize embedding layers of a quantized model.": {"quantization_bit": 4, "resize_vocab": True},
    "Cannot create new adapter upon a quantized model.": {"quantization_bit": 4, "adapter_name_or_path": "adapter",
                                                          "create_new_adapter": True},
    "Quantized model only accepts a single adapter. Merge them first.": {"quantization_bit": 4,
                                                                         "adapter_name_or_path": "a1,a2"},
}


def _plant(folder: Path, message: str) -> Path:
    name = "plant_" + re.sub(r"\W+", "_", message)[:50]
    args = {k: v for k, v in {**BASE, **PLANTS[message]}.items() if v is not None}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(args, sort_keys=False))
    return path


def test_every_combination_has_a_plant():
    assert set(PLANTS) == {m for _, m, _, _ in lf_rules.COMBINATIONS if m}


@pytest.mark.parametrize("message", list(PLANTS))
def test_each_combination_refused_alone(lab, env, message):
    rc = load_run_config(str(_plant(lab, message)))
    run = lf_rules.LfRun(rc, lf_rules.llamafactory_args(rc))
    said = [p.message for p in lf_rules.refused_combinations(run, env)]
    assert said and f"\"{message}\"" in said[0], said


@pytest.mark.slow
def test_llamafactory_parser_refuses_each_combination_with_its_message(lab):
    from runconfig_oracle import ask

    cases = {m: {"mode": "args", "yaml": str(_plant(lab, m)), "cwd": str(lab)} for m in PLANTS}
    got = ask(cases, lab)
    wrong = {m: r for m, r in got.items() if r["ok"] or m not in r["msg"]}
    assert wrong == {}


def test_deepspeed_missing_is_its_own_code(tmp_path):
    """deepspeed: in the YAML without the package: check_version("deepspeed", mandatory=True) in
    _check_extra_dependencies (installed here, so only the rule is shown; MGD907's examples hold the
    library's message)."""
    p = tmp_path / "t.yaml"
    p.write_text("stage: sft\ndo_train: true\ndeepspeed: ds.json\n")
    rc = load_run_config(str(p))
    found = lf_rules.extras(lf_rules.LfRun(rc, lf_rules.llamafactory_args(rc)), lf_rules.Env(versions={"torch": "2.14.1"}))
    assert [p.code for p in found] == [codes.DS_MISSING] and "'deepspeed'" in found[0].message


def test_the_readers_number_kinds_are_the_arguments_annotations(env):
    """reading.YAML_EXPECT's int/number keys carry the annotation of the argument classes that
    LLaMA-Factory's train parser builds (TrainingArguments of transformers 5 types warmup_steps as a
    float: 0.1 is a ratio), read from the installed source by config.llamafactory's worker."""
    from mgft_doctor.runconfig.reading import YAML_EXPECT

    numeric = {k: e.kind for k, e in YAML_EXPECT.items() if e.kind in ("int", "number")}
    assert numeric and {k: lf_rules._kind(env.fields[k]) for k in numeric} == numeric
    assert all(YAML_EXPECT[k].quoted and YAML_EXPECT[k].loose for k in numeric)  # get_train_args converts none


def test_dataset_files_are_read_within_the_readers_bounds(tmp_path):
    """dataset_info.json through the reader (a regular file, at most 16 MB); a FIFO among a dataset
    folder's files and a jsonl line longer than the bound are not read: the rules finish at once."""
    import threading

    data = tmp_path / "data"
    (data / "rows").mkdir(parents=True)
    os.mkfifo(data / "rows" / "a.json")
    (data / "long.jsonl").write_text('{"instruction": "' + "x" * (lf_rules.JSON_WHOLE_LIMIT + 10) + '"}\n')
    (data / "dataset_info.json").write_text(json.dumps({"fifo": {"file_name": "rows"}, "long": {"file_name": "long.jsonl"}}))
    (tmp_path / "t.yaml").write_text("stage: sft\ndataset: fifo,long\ndataset_dir: data\n")
    rc = load_run_config(str(tmp_path / "t.yaml"))
    found: list = []
    t = threading.Thread(target=lambda: found.append(lf_rules.datasets_defined(
        lf_rules.LfRun(rc, lf_rules.llamafactory_args(rc)), lf_rules.Env(cwd=str(tmp_path)))), daemon=True)
    t.start()
    t.join(20)
    assert found, "the rules blocked on a FIFO or read without a bound"
    assert found[0] == []  # neither is read, so neither is judged (their columns are LLaMA-Factory's to find)
    (data / "dataset_info.json").unlink()
    os.mkfifo(data / "dataset_info.json")  # not a regular file: not found there, as LLaMA-Factory's open would block
    t = threading.Thread(target=lambda: found.append(lf_rules.datasets_defined(
        lf_rules.LfRun(rc, lf_rules.llamafactory_args(rc)), lf_rules.Env(cwd=str(tmp_path)))), daemon=True)
    t.start()
    t.join(20)
    assert len(found) == 2 and found[1] and found[1][0].code == codes.LF_DATASET
