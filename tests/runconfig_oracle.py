"""The real libraries as the judge of the run-config rules: a plain script the slow tests start in
the test Python (torch, transformers, accelerate, llamafactory imported once for all cases), which
runs each case the way a training run meets it and prints what the library did, one JSON object.

    python runconfig_oracle.py CASES.json   -> {"name": {"ok": bool, "type", "msg", "where"}, ...}

Cases (a JSON object name -> case), each run in its own `cwd`:
- {"mode": "run", "args": {...}}: llamafactory.train.tuner.run_exp(args), in process, as
  `llamafactory-cli train` calls it on one CPU process (a tiny model, a few steps).
- {"mode": "pair", "yaml": "t.yaml", "ds": "x.json", "hidden": 64, "steps": 10}: the Trainer's
  DeepSpeed path without a Trainer: LLaMA-Factory's get_train_args on the YAML (without its
  deepspeed key, with use_cpu on a CPU machine, and pure_bf16's GPU check answered yes), then what
  TrainingArguments.__post_init__, Trainer.__init__ and deepspeed_init do with the JSON, in their
  order: HfTrainerDeepSpeedConfig + trainer_config_process, accelerate's DeepSpeedPlugin,
  set_mixed_precision(args.mixed_precision), trainer_config_finalize.
A "yaml" file is read as llamafactory-cli reads it (OmegaConf); "args" are passed as they are.
- {"mode": "args", "yaml": ...}: LLaMA-Factory's get_train_args alone (its parser and checks).
- {"mode": "build", "out": "folder"}: a tiny LLaMA with a BPE tokenizer (the run cases' model);
  {"mode": "copy_model", "src", "out", "config": {...}}: a copy with keys merged into config.json.
"""

import json
import os
import random
import sys
import traceback


def build(out):
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = "the a of to in is model data train step loss rank node gpu batch token text answer question".split()
    rng = random.Random(0)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(8)) for _ in range(300)],
                            trainer=trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=len(fast), max_position_embeddings=256)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(out)


def read_yaml(case):
    """The case's arguments: its YAML file read as llamafactory-cli reads it (hparams/parser.py
    read_args: OmegaConf), or its "args"."""
    if "yaml" not in case:
        return dict(case["args"])
    from pathlib import Path

    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(Path(case["yaml"]).absolute()))


def on_this_cpu(args: dict) -> dict:
    """pure_bf16's device check (This device does not support `pure_bf16`) answered yes on a machine
    without a GPU: it is this machine's fact, not the case's."""
    import torch

    if args.get("pure_bf16") and not torch.cuda.is_available():
        import llamafactory.hparams.parser as parser

        parser.is_torch_bf16_gpu_available = lambda: True
    return args


def run(case):
    from llamafactory.train.tuner import run_exp

    run_exp(on_this_cpu(read_yaml(case)))


def args_only(case):
    """LLaMA-Factory's argument parser and its checks alone (hparams/parser.py get_train_args)."""
    from llamafactory.hparams import get_train_args

    parsed = get_train_args(on_this_cpu(read_yaml(case)))
    if case.get("show"):  # the argument as the parser left it (repr), for the test to compare
        case["shown"] = next(repr(getattr(a, case["show"])) for a in parsed if hasattr(a, case["show"]))


def copy_model(case):
    """A copy of a built model whose config.json gets case["config"] merged in (e.g. a quantization_config)."""
    import shutil

    shutil.copytree(case["src"], case["out"], dirs_exist_ok=True)
    path = os.path.join(case["out"], "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(case["config"])
    with open(path, "w") as f:
        json.dump(cfg, f)


def pair(case):
    """The DeepSpeed checks of a Trainer run on the YAML's TrainingArguments, in the Trainer's order."""
    import torch
    from accelerate.utils import DeepSpeedPlugin
    from llamafactory.hparams import get_train_args
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = on_this_cpu({k: v for k, v in read_yaml(case).items() if k != "deepspeed"})
    if not torch.cuda.is_available():
        args["use_cpu"] = True
    training_args = get_train_args(args)[2]
    hf = HfTrainerDeepSpeedConfig(case["ds"])  # TrainingArguments.__post_init__, section 12
    hf.trainer_config_process(training_args)
    plugin = DeepSpeedPlugin(hf_ds_config=hf)
    plugin.set_mixed_precision(training_args.mixed_precision)  # AcceleratorState, when the Trainer builds it

    class Model:  # trainer_config_finalize reads model.config.hidden_size only
        class config:
            hidden_size = case.get("hidden", 64)

    steps = training_args.max_steps if training_args.max_steps > 0 else case.get("steps", 100)
    hf.trainer_config_finalize(training_args, Model, steps)  # deepspeed_init, at train()


def outcome(fn, case):
    try:
        fn(case)
        return {"ok": True, **({"shown": case["shown"]} if "shown" in case else {})}
    except BaseException as exc:  # noqa: BLE001 - every failure is the answer
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].name}" if tb else ""
        return {"ok": False, "type": type(exc).__name__, "msg": str(exc)[:2000], "where": where}
    finally:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()


ENV = {"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "DISABLE_VERSION_CHECK": "1", "WANDB_DISABLED": "true"}


def ask(cases: dict, folder, timeout: float = 900) -> dict:
    """Run the cases in a fresh test Python (the tests' side): {name: outcome}."""
    import subprocess

    path = os.path.join(str(folder), "oracle-cases.json")
    with open(path, "w") as f:
        json.dump(cases, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MGFT_DOCTOR_", "PYTEST_"))}
    env.update(ENV, HF_HOME=os.path.join(str(folder), ".hf"), XDG_CACHE_HOME=os.path.join(str(folder), ".cache"))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), path], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(folder))
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    cases = json.load(open(sys.argv[1]))
    results = {}
    start = os.getcwd()
    for name, case in cases.items():
        os.chdir(case.get("cwd", start))
        fn = {"run": run, "args": args_only, "pair": pair, "copy_model": copy_model,
              "build": lambda c: build(c["out"])}[case["mode"]]
        results[name] = outcome(fn, case)
        print(f"oracle: {name}: {results[name]}", file=sys.stderr, flush=True)
    os.chdir(start)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
