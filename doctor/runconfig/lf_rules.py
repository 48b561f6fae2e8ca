"""LLaMA-Factory 0.9.5's pre-flight, before any process starts: what its argument parser, data
loader and model loader refuse (read in its installed source; each rule names the file and
function it mirrors), and what they let through that fails later (a dataset's columns, LoRA
targets the architecture does not have, a number written as a string, an output folder that
holds a finished model). Pure functions over the YAML as LLaMA-Factory reads it, the files it
names and facts about the examined Python (Env, gathered by config.llamafactory's worker): no
import of torch or llamafactory, no run, milliseconds."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path

from ..errors import InputError
from . import RunConfig, codes
from .ds_rules import Problem
from .reading import YAML_EXPECT, is_number_text, parse_json, path_is_file, read_text

SRC = "llamafactory/hparams/parser.py"
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
FINETUNING_TYPES = ("lora", "oft", "freeze", "full")


@dataclass
class Env:
    """What the rules know about the examined Python; None where it could not be read."""

    versions: dict[str, str] = field(default_factory=dict)  # distribution name -> version
    fields: dict[str, str] | None = None  # the train parser's argument -> its annotation
    templates: frozenset[str] | None = None
    bnb_min: str | None = None  # transformers' BITSANDBYTES_MIN_VERSION
    integrations: list[str] | None = None  # transformers' report_to names
    imports: dict[str, dict] = field(default_factory=dict)  # module -> {"ok": ..} or error fields
    devices: list[str] | None = None  # torch's devices (cpu, cuda, ...), read when a backend was imported
    cwd: str = field(default_factory=os.getcwd)  # where llamafactory-cli is assumed to start

    def has(self, dist: str) -> bool:
        return _norm(dist) in {_norm(k) for k in self.versions}

    def version(self, dist: str) -> str | None:
        return next((v for k, v in self.versions.items() if _norm(k) == _norm(dist)), None)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class LfRun:
    """The run as LLaMA-Factory will see it: its arguments, the DeepSpeed stage, the world size."""

    rc: RunConfig
    args: dict
    world: int = 1
    model_cfg: dict | None = None

    def get(self, key: str, default=None):
        value = self.args.get(key, default)
        return default if value is None else value

    def on(self, key: str) -> bool:
        """The flag as LLaMA-Factory tests it (`if args.x:`): a quoted "false" is true there too."""
        return bool(self.args.get(key))

    @property
    def stage(self) -> str:
        return str(self.get("stage", "sft"))

    @property
    def finetuning_type(self) -> str:
        return str(self.get("finetuning_type", "lora"))

    @property
    def zero3(self) -> bool:
        return self.rc.ds is not None and self.rc.zero_stage == 3

    def split(self, key: str) -> list[str]:
        """A comma-separated argument as LLaMA-Factory splits it (split_arg in hparams/*.py)."""
        value = self.args.get(key)
        if value is None:
            return []
        return [s.strip() for s in str(value).split(",")] if not isinstance(value, list) else [str(v) for v in value]


# -- the YAML as LLaMA-Factory reads it ------------------------------------------------------------

def llamafactory_args(rc: RunConfig) -> dict:
    """The YAML's keys and values as llamafactory-cli train passes them to HfArgumentParser.parse_dict:
    rc.yaml as the reader built it (bounded in size and nesting, with OmegaConf's scalar rules, as
    hparams/parser.py read_args loads it); the file is never read a second time."""
    return dict(rc.yaml)


# -- the parser: keys and types --------------------------------------------------------------------

def unknown_keys(run: LfRun, env: Env) -> list[Problem]:
    """transformers/hf_argparser.py HfArgumentParser.parse_dict(allow_extra_keys=False), as
    hparams/parser.py _parse_train_args calls it: a key no argument dataclass has stops the run."""
    if env.fields is None or os.environ.get("ALLOW_EXTRA_ARGS", "").lower() in ("1", "true", "y", "yes"):
        return []
    unknown = sorted(k for k in run.args if k not in env.fields)
    if not unknown:
        return []
    hints = []
    for k in unknown:
        near = get_close_matches(k, list(env.fields), n=1, cutoff=0.75)
        hints.append(f"{k} -> {near[0]}" if near else k)
    return [Problem(codes.LF_UNKNOWN_KEY,
                    f"LLaMA-Factory's parser stops at key(s) no argument has: \"Some keys are not used by the "
                    f"HfArgumentParser: {unknown}\" (transformers hf_argparser.py parse_dict)",
                    f"Fix the spelling ({', '.join(hints)}) or remove the key; ALLOW_EXTRA_ARGS=1 makes "
                    "LLaMA-Factory ignore unknown keys.")]


# where a quoted number first breaks (seen in runs of LLaMA-Factory 0.9.5, tests/test_runconfig_lf_rules.py)
FIRST_USE = {
    "learning_rate": "at the first step: \"TypeError: '<=' not supported between instances of 'float' and 'str'\" "
                     "(torch/optim/adam.py, AdamW's learning-rate check)",
    "warmup_steps": "while the arguments are parsed: \"TypeError: '<' not supported between instances of 'str' and "
                    "'int'\" (transformers/training_args.py TrainingArguments._validate_args)",
    "lora_rank": "when the adapter is made: \"TypeError: '<=' not supported between instances of 'str' and 'int'\" "
                 "(peft/tuners/lora/layer.py update_layer)",
}
FLOAT_FOR_INT = {  # where a float in an int argument first breaks (tests/test_runconfig_lf_rules.py runs it)
    "per_device_train_batch_size": "when the DataLoader is built: \"ValueError: batch_size should be a positive "
                                   "integer value, but got batch_size=...\" (torch/utils/data/sampler.py BatchSampler)",
}


def _kind(annotation: str) -> str | None:
    """'int', 'number', 'bool' or None for an argument's annotation as written in the source."""
    words = set(re.findall(r"[A-Za-z_]+", annotation))
    if words & {"str", "dict", "Any", "list"}:
        return None
    if "float" in words:
        return "number"
    if "int" in words:
        return "int"
    return "bool" if "bool" in words else None


def _kinds(env: Env) -> dict[str, str]:
    """Each argument's kind: from the examined Python's annotations, else the reader's table of the
    keys it knows (a quoted number is reported even when LLaMA-Factory could not be read)."""
    if env.fields is not None:
        return {k: kind for k, a in env.fields.items() if (kind := _kind(a))}
    return {k: e.kind for k, e in YAML_EXPECT.items() if e.kind in ("int", "number")}


def strings_for_numbers(run: LfRun, env: Env) -> list[Problem]:
    """transformers/hf_argparser.py HfArgumentParser.parse_dict builds the dataclasses with the
    values as given (no type conversion), so a number quoted in the YAML reaches torch or peft as a str: AdamW raises
    "'<=' not supported between instances of 'float' and 'str'" at the first step; a quoted
    "false" is a true value for a bool argument; a float (`1e2` is 100.0 under OmegaConf) stays a
    float in an int argument, and the DataLoader refuses a float batch size."""
    kinds = _kinds(env)
    numbers, bools, floats = [], [], []
    for key, value in run.args.items():
        kind = kinds.get(key)
        if kind == "int" and isinstance(value, float):
            floats.append(f"{key}: {value!r}")
        if not isinstance(value, str):
            continue
        if kind in ("int", "number") and is_number_text(value):
            numbers.append(f"{key}: {value!r}")
        elif kind == "bool" and value.strip().lower() in ("false", "no", "off", "0", "true", "yes", "on", "1"):
            bools.append(f"{key}: {value!r}")
    out = []
    if numbers:
        first = numbers[0].split(":")[0]
        where = FIRST_USE.get(first, "where it is first used (a comparison or arithmetic with a str)")
        out.append(Problem(codes.LF_STRING_NUMBER,
                           f"{', '.join(numbers)}: a number in quotes stays a string (HfArgumentParser.parse_dict does "
                           f"not convert), and the run fails {where}",
                           "Write the number without quotes (learning_rate: 1.0e-4); LLaMA-Factory reads its YAML "
                           "with OmegaConf, where 1e-4 unquoted is a float."))
    if floats:
        first = floats[0].split(":")[0]
        fails = FLOAT_FOR_INT.get(first)
        out.append(Problem(codes.LF_STRING_NUMBER,
                           f"{', '.join(floats)}: a float where the argument is an int (HfArgumentParser.parse_dict "
                           "does not convert; under OmegaConf `1e2` is the float 100.0)"
                           + (f", and the run fails {fails}" if fails else ", which code that counts with it may refuse"),
                           "Write a whole number without a dot or exponent (per_device_train_batch_size: 4, max_steps: 100).",
                           "fail" if fails else "warn"))
    if bools:
        out.append(Problem(codes.LF_STRING_NUMBER,
                           f"{', '.join(bools)}: a quoted flag is a non-empty string, which Python takes as true "
                           "(HfArgumentParser.parse_dict does not convert it)",
                           "Write true / false without quotes.", "warn"))
    return out


# -- the parser: combinations it refuses --------------------------------------------------------------
# (where, LLaMA-Factory's message, does it apply to this run?, the fix). ZeRO-3 and distributed
# optimizer guards are config.zero3_guards' (probes/config_zero3_guards.py), not repeated here.

def _ref_model(run: LfRun) -> bool:  # finetuning_args.py: use_ref_model
    return run.stage == "dpo" and run.get("pref_loss", "sigmoid") not in ("orpo", "simpo")


def _no_eval_data(run: LfRun) -> bool:
    return run.get("eval_dataset") is None and float(run.get("val_size", 0.0) or 0.0) < 1e-6


def _n_optims(run: LfRun) -> int:
    return sum(run.on(k) for k in ("use_galore", "use_apollo", "use_badam"))


FT = "hparams/finetuning_args.py FinetuningArguments.__post_init__"
DA = "hparams/data_args.py DataArguments.__post_init__"
GT = f"{SRC} get_train_args"
VM = f"{SRC} _verify_model_args"
COMBINATIONS = (
    ("hparams/model_args.py BaseModelArguments.__post_init__", "Please provide `model_name_or_path`.",
     lambda r: r.args.get("model_name_or_path") is None, "Add model_name_or_path: <hub id or local folder>."),
    (FT, "Invalid fine-tuning method.", lambda r: r.finetuning_type not in FINETUNING_TYPES,
     f"finetuning_type is one of {', '.join(FINETUNING_TYPES)}."),
    (FT, "`reward_model` is necessary for PPO training.", lambda r: r.stage == "ppo" and r.args.get("reward_model") is None,
     "Train a reward model first (stage: rm) and give it as reward_model: <its output_dir>."),
    (FT, "`reward_model_type` cannot be lora for Freeze/Full PPO training.",
     lambda r: r.stage == "ppo" and r.get("reward_model_type", "lora") == "lora" and r.finetuning_type != "lora",
     "Use finetuning_type: lora, or reward_model_type: full."),
    (FT, "`dpo_label_smoothing` is only valid for sigmoid loss function.",
     lambda r: r.stage == "dpo" and r.get("pref_loss", "sigmoid") != "sigmoid" and float(r.get("dpo_label_smoothing", 0) or 0) > 1e-6,
     "Remove dpo_label_smoothing or use pref_loss: sigmoid."),
    (FT, "`use_llama_pro` is only valid for Freeze or LoRA training.", lambda r: r.on("use_llama_pro") and r.finetuning_type == "full",
     "Use finetuning_type: freeze (LLaMA Pro trains the expanded blocks) or drop use_llama_pro."),
    (FT, "Cannot use LoRA with GaLore, APOLLO or BAdam together.", lambda r: r.finetuning_type == "lora" and _n_optims(r) > 0,
     "GaLore/APOLLO/BAdam are full-parameter optimizers: set finetuning_type: full, or drop them for LoRA."),
    (FT, "Cannot use GaLore, APOLLO or BAdam together.", lambda r: _n_optims(r) > 1, "Keep one of use_galore, use_apollo, use_badam."),
    (FT, "Cannot use PiSSA for current training stage.",
     lambda r: r.on("pissa_init") and (r.stage in ("ppo", "kto") or _ref_model(r)), "Drop pissa_init for this stage."),
    (FT, "`loraplus_lr_ratio` is only valid for LoRA training.",
     lambda r: r.finetuning_type != "lora" and r.args.get("loraplus_lr_ratio") is not None, "Drop loraplus_lr_ratio."),
    (FT, "`use_rslora` is only valid for LoRA training.", lambda r: r.finetuning_type != "lora" and r.on("use_rslora"), "Drop use_rslora."),
    (FT, "`use_dora` is only valid for LoRA training.", lambda r: r.finetuning_type != "lora" and r.on("use_dora"), "Drop use_dora."),
    (FT, "`pissa_init` is only valid for LoRA training.", lambda r: r.finetuning_type != "lora" and r.on("pissa_init"), "Drop pissa_init."),
    (DA, "Cannot specify `val_size` if `dataset` is None.",
     lambda r: r.args.get("dataset") is None and float(r.get("val_size", 0) or 0) > 1e-6, "Give dataset: or drop val_size."),
    (DA, "Cannot specify `val_size` if `eval_dataset` is not None.",
     lambda r: r.args.get("eval_dataset") is not None and float(r.get("val_size", 0) or 0) > 1e-6, "Keep either val_size or eval_dataset."),
    (DA, "`interleave_probs` is only valid for interleaved mixing.",
     lambda r: r.args.get("interleave_probs") is not None and r.get("mix_strategy", "concat") == "concat",
     "Set mix_strategy: interleave_under (or interleave_over), or drop interleave_probs."),
    (DA, "Streaming mode should have an integer val size.",
     lambda r: r.on("streaming") and 1e-6 < float(r.get("val_size", 0) or 0) < 1, "Give val_size as a number of samples (e.g. 1000)."),
    (DA, "`max_samples` is incompatible with `streaming`.", lambda r: r.on("streaming") and r.args.get("max_samples") is not None,
     "Drop max_samples (or streaming)."),
    (DA, "`mask_history` is incompatible with `train_on_prompt`.", lambda r: r.on("mask_history") and r.on("train_on_prompt"),
     "Keep one of mask_history and train_on_prompt."),
    (GT, "`predict_with_generate` cannot be set as True except SFT.", lambda r: r.stage != "sft" and r.on("predict_with_generate"),
     "Drop predict_with_generate (it is for stage: sft)."),
    (GT, "`neat_packing` cannot be set as True except SFT.", lambda r: r.stage != "sft" and r.on("neat_packing"), "Drop neat_packing."),
    (GT, "`train_on_prompt` or `mask_history` cannot be set as True except SFT.",
     lambda r: r.stage != "sft" and (r.on("train_on_prompt") or r.on("mask_history")), "Drop train_on_prompt / mask_history."),
    (GT, "Please enable `predict_with_generate` to save model predictions.",
     lambda r: r.stage == "sft" and r.on("do_predict") and not r.on("predict_with_generate"), "Add predict_with_generate: true."),
    (GT, "RM and PPO stages do not support `load_best_model_at_end`.",
     lambda r: r.stage in ("rm", "ppo") and r.on("load_best_model_at_end"), "Drop load_best_model_at_end."),
    (GT, "PPO training does not support evaluation, use the SFT stage to evaluate models.",
     lambda r: r.stage == "ppo" and not r.on("do_train"), "Set do_train: true for PPO; evaluate with stage: sft."),
    (GT, "PPO training is incompatible with S^2-Attn.", lambda r: r.stage == "ppo" and r.on("shift_attn"), "Drop shift_attn."),
    (GT, "Please specify `max_steps` in streaming mode.", lambda r: r.on("streaming") and int(r.get("max_steps", -1) or -1) == -1,
     "Add max_steps: N (a streamed dataset has no length)."),
    (GT, "Please specify dataset for training.", lambda r: r.on("do_train") and r.args.get("dataset") is None, "Add dataset: <name>."),
    (GT, "Please make sure eval_dataset be provided or val_size >1e-6",
     lambda r: (r.on("do_eval") or r.on("do_predict") or r.on("predict_with_generate")) and _no_eval_data(r),
     "Add eval_dataset: <name> or val_size: 0.1."),
    (GT, "Cannot use `predict_with_generate` and `compute_accuracy` together.",
     lambda r: r.on("predict_with_generate") and r.on("compute_accuracy"), "Keep one of them."),
    (GT, "Cannot use device map for quantized models in training.",
     lambda r: r.on("do_train") and r.args.get("quantization_device_map") == "auto", "Drop quantization_device_map for training."),
    (GT, "FP8 training is not compatible with quantization. Please disable one of them.",
     lambda r: r.on("fp8") and r.args.get("quantization_bit") is not None, "Drop fp8 or quantization_bit."),
    (GT, "vLLM/SGLang backend is only available for API, CLI and Web.",
     lambda r: str(r.get("infer_backend", "huggingface")) != "huggingface", "Drop infer_backend for training."),
    (VM, "Adapter is only valid for the LoRA method.",
     lambda r: r.args.get("adapter_name_or_path") is not None and r.finetuning_type != "lora", "Use finetuning_type: lora."),
    (VM, "Quantization is only compatible with the LoRA or OFT method.",
     lambda r: r.args.get("quantization_bit") is not None and r.finetuning_type not in ("lora", "oft"),
     "Use finetuning_type: lora (QLoRA), or drop quantization_bit for full/freeze training."),
    (VM, "Please use scripts/pissa_init.py to initialize PiSSA for a quantized model.",
     lambda r: r.args.get("quantization_bit") is not None and r.on("pissa_init"), "Run scripts/pissa_init.py first."),
    (VM, "Cannot resize embedding layers of a quantized model.",
     lambda r: r.args.get("quantization_bit") is not None and r.on("resize_vocab"), "Drop resize_vocab or quantization_bit."),
    (VM, "Cannot create new adapter upon a quantized model.",
     lambda r: r.args.get("quantization_bit") is not None and r.args.get("adapter_name_or_path") is not None and r.on("create_new_adapter"),
     "Drop create_new_adapter."),
    (VM, "Quantized model only accepts a single adapter. Merge them first.",
     lambda r: r.args.get("quantization_bit") is not None and len(r.split("adapter_name_or_path")) > 1,
     "Merge the adapters (llamafactory-cli export) and give one."),
    ("llamafactory/train/tuner.py _training_function", None, lambda r: r.stage not in STAGES,
     f"stage is one of {', '.join(STAGES)}."),
)


def refused_combinations(run: LfRun, env: Env) -> list[Problem]:
    """Each refusal of LLaMA-Factory's argument checks (hparams/parser.py, hparams/*_args.py
    __post_init__, train/tuner.py: the table above, in the order it checks)."""
    out = []
    for where, message, applies, fix in COMBINATIONS:
        try:
            hit = applies(run)
        except (TypeError, ValueError):  # a value of the wrong type: strings_for_numbers says so
            continue
        if hit:
            said = message or f"Unknown task: {run.stage}."
            out.append(Problem(codes.LF_ARG_REFUSED, f"LLaMA-Factory refuses this before loading anything: \"{said}\" "
                               f"({where})", fix))
    return out


def nothing_to_do(run: LfRun, env: Env) -> list[Problem]:
    """The workflows (llamafactory/train/*/workflow.py) train only under do_train, and the HF default
    is false: a YAML without do_train/do_eval/do_predict loads the model and the data and exits 0."""
    if any(run.on(k) for k in ("do_train", "do_eval", "do_predict")) or not run.rc.yaml_path:
        return []
    return [Problem(codes.LF_ARG_REFUSED, "none of do_train, do_eval, do_predict is true: LLaMA-Factory loads the model "
                    "and the data, trains nothing and exits 0 (llamafactory/train/sft/workflow.py run_sft trains only "
                    "`if training_args.do_train`)", "Add do_train: true.", "warn")]


# -- datasets --------------------------------------------------------------------------------------------
FILE_TYPES = {"arrow": "arrow", "csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet", "txt": "text"}
ROWS_READ = 200  # rows of a dataset file read to check its columns (the first ones, as align_dataset reads them)
JSON_WHOLE_LIMIT = 32 << 20  # a .json array larger than this is not parsed here
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output"}
COLUMN_NAMES = ("prompt", "query", "response", "history", "messages", "system", "tools", "images", "videos",
                "audios", "chosen", "rejected", "kto_tag")
TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
        "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}


def find_dataset_dir(run: LfRun, env: Env) -> tuple[Path | None, str]:
    """Where dataset_info.json is, as llamafactory-cli would open it from env.cwd (data/parser.py
    get_dataset_list: os.path.join(dataset_dir, "dataset_info.json")), else in the YAML's folder or
    the LLaMA-Factory checkout above it (a folder with examples/ or src/llamafactory/); and how it
    was found."""
    ddir = str(run.get("dataset_dir", "data"))
    here = Path(env.cwd) / ddir
    if (here / "dataset_info.json").is_file():
        return here, "from the working directory"
    if run.rc.yaml_path and not os.path.isabs(ddir):
        base = Path(run.rc.yaml_path).resolve().parent
        for folder in (base, *base.parents):
            checkout = folder == base or (folder / "examples").is_dir() or (folder / "src" / "llamafactory").is_dir()
            if checkout and (folder / ddir / "dataset_info.json").is_file():
                return folder / ddir, f"near the YAML (llamafactory-cli must start in {folder})"
    return None, "not found"


def _dataset_names(run: LfRun) -> list[tuple[str, str]]:
    return [(key, n) for key in ("dataset", "eval_dataset") for n in run.split(key) if n]


def datasets_defined(run: LfRun, env: Env) -> list[Problem]:
    """data/parser.py get_dataset_list (the name in dataset_info.json) and data/loader.py
    _load_single_dataset (the file), _get_merged_dataset (a ranking dataset for rm/dpo only)."""
    names = _dataset_names(run)
    ddir_arg = str(run.get("dataset_dir", "data"))
    if not names or ddir_arg == "ONLINE" or ddir_arg.startswith("REMOTE:") or _tokenized(run, env):
        return []
    ddir, how = find_dataset_dir(run, env)
    if ddir is None:
        return [Problem(codes.LF_DATASET, f"dataset_dir {ddir_arg!r}: no dataset_info.json in {env.cwd} nor near the YAML; "
                        f"started here LLaMA-Factory stops with \"Cannot open {os.path.join(ddir_arg, 'dataset_info.json')} "
                        "due to [Errno 2] No such file or directory\" (data/parser.py get_dataset_list)",
                        "Run from the folder that holds it (a LLaMA-Factory checkout has data/), or give an absolute "
                        "dataset_dir.", "warn")]
    try:  # the reader's bounds (a regular file of at most 16 MB), never an unbounded read
        where = str(ddir / "dataset_info.json")
        info = parse_json(read_text(where, "dataset_info.json"), where)
    except InputError as exc:
        return [Problem(codes.LF_DATASET, f"{exc}: LLaMA-Factory stops with \"Cannot open ... due to ...\" "
                        "(data/parser.py get_dataset_list)", "Fix the JSON (one object of dataset entries).")]
    out = []
    for key, name in names:
        if not isinstance(info, dict) or name not in info:
            near = get_close_matches(name, list(info) if isinstance(info, dict) else [], n=1)
            out.append(Problem(codes.LF_DATASET, f"{key}: {name} — \"Undefined dataset {name} in dataset_info.json.\" "
                               f"({ddir / 'dataset_info.json'}, found {how}; data/parser.py get_dataset_list)",
                               (f"Did you mean {near[0]}? " if near else "") + "Add an entry: "
                               f"\"{name}\": {{\"file_name\": \"{name}.json\"}} to dataset_info.json."))
            continue
        out += _dataset_entry(run, ddir, key, name, info[name])
    return out


def _tokenized(run: LfRun, env: Env) -> bool:
    """A tokenized_path that holds data: LLaMA-Factory loads it and reads no dataset (data/loader.py get_dataset)."""
    tp = run.args.get("tokenized_path")
    return bool(tp) and (Path(env.cwd) / str(tp)).is_dir() and any((Path(env.cwd) / str(tp)).iterdir())


def _dataset_entry(run: LfRun, ddir: Path, key: str, name: str, entry: dict) -> list[Problem]:
    if not isinstance(entry, dict) or not any(k in entry for k in ("hf_hub_url", "ms_hub_url", "om_hub_url",
                                                                      "script_url", "cloud_file_name", "file_name")):
        return [Problem(codes.LF_DATASET, f"{key}: {name} has no file_name (nor a hub URL) in dataset_info.json",
                        "Give \"file_name\": \"<file or folder under dataset_dir>\".")]
    out = []
    wants_ranking = run.stage in ("rm", "dpo")
    if bool(entry.get("ranking", False)) != wants_ranking:
        out.append(Problem(codes.LF_DATASET, f"{key}: {name} is {'' if entry.get('ranking') else 'not '}a ranking "
                           f"(preference) dataset and stage is {run.stage}: \"The dataset is not applicable in the "
                           "current training stage.\" (data/loader.py _get_merged_dataset)",
                           "stage rm/dpo need \"ranking\": true datasets (chosen/rejected); the other stages need "
                           "ranking: false." if wants_ranking else "Use a non-ranking dataset for this stage (or stage: dpo/rm)."))
    if "file_name" not in entry or any(k in entry for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")):
        return out  # hub, script and cloud datasets are read where the run starts
    local = ddir / str(entry["file_name"])
    files = sorted(local.iterdir()) if local.is_dir() else [local] if local.is_file() else []
    if not files:
        shown = os.path.join(str(run.get("dataset_dir", "data")), str(entry["file_name"]))
        return out + [Problem(codes.LF_DATASET, f"{key}: {name} — \"File {shown} not found.\" (data/loader.py "
                              "_load_single_dataset)", f"Put the file at {local} or fix file_name in dataset_info.json.")]
    types = {FILE_TYPES.get(f.suffix[1:]) for f in files}
    if None in types or len(types) > 1:
        return out + [Problem(codes.LF_DATASET, f"{key}: {name} — " + ("\"Allowed file types: "
                              f"{','.join(FILE_TYPES)}.\"" if None in types else "\"File types should be identical.\"")
                              + " (data/loader.py _load_single_dataset)", "Use .json/.jsonl/.csv/.parquet/.arrow/.txt files.")]
    return out + dataset_columns(run, key, name, entry, files[0])


def _first_rows(path: Path) -> tuple[list[dict] | None, bool]:
    """(the first rows of a json/jsonl/csv file, whether that is the whole file); None: not read here."""
    if not path_is_file(path):  # a FIFO or device in a dataset folder would block or never end
        return None, False
    try:
        if path.suffix == ".jsonl":
            rows, budget = [], JSON_WHOLE_LIMIT  # the bytes read here are bounded, however long a line
            with path.open(encoding="utf-8", errors="replace") as f:
                while budget > 0 and (line := f.readline(budget)):
                    budget -= len(line)
                    if not line.endswith("\n") and budget <= 0:
                        return (rows or None), False  # one line longer than the bound: not read here
                    if line.strip():
                        rows.append(json.loads(line))
                    if len(rows) >= ROWS_READ:
                        return rows, f.read(1) == ""
            return rows, budget > 0
        if path.suffix == ".json" and path.stat().st_size <= JSON_WHOLE_LIMIT:
            data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
            rows = data if isinstance(data, list) else [data]
            return rows[:ROWS_READ], len(rows) <= ROWS_READ
        if path.suffix == ".csv":
            import csv

            with path.open(encoding="utf-8", errors="replace", newline="") as f:
                return [dict.fromkeys(next(csv.reader(f), []), "")], False
    except (OSError, ValueError):
        return None, False
    return None, False


def declared_columns(entry: dict) -> dict[str, str]:
    """The columns LLaMA-Factory will read for this entry (data/parser.py DatasetAttr and .join):
    the alpaca/sharegpt defaults, or exactly what "columns" lists."""
    cols = entry.get("columns")
    if isinstance(cols, dict):
        return {k: cols[k] for k in COLUMN_NAMES if cols.get(k)}
    if entry.get("formatting", "alpaca") == "alpaca":
        return dict(ALPACA_COLUMNS)
    return {"messages": "conversations"}


def _used(fmt: str, attr: str, ranking: bool) -> bool:
    """Whether the converter for fmt indexes example[column] for this attribute (data/converter.py)."""
    if attr in ("chosen", "rejected"):
        return ranking
    if fmt == "alpaca":
        return attr != "messages" and not (attr == "response" and ranking)
    return attr not in ("prompt", "query", "response", "history")


def dataset_columns(run: LfRun, key: str, name: str, entry: dict, path: Path) -> list[Problem]:
    """data/converter.py align_dataset maps the format's converter over every row: a column it
    indexes that the file does not have is a KeyError; sharegpt rows whose roles do not alternate
    are skipped, and none left is "Cannot find valid samples" (data/loader.py _get_preprocessed_dataset)."""
    rows, whole = _first_rows(path)
    if not rows or not all(isinstance(r, dict) for r in rows):
        return []
    fmt = str(entry.get("formatting", "alpaca"))
    ranking = bool(entry.get("ranking", False))
    declared = declared_columns(entry)
    have = set().union(*(r.keys() for r in rows))
    missing = [f"{attr} -> {col!r}" for attr, col in declared.items() if _used(fmt, attr, ranking) and col not in have]
    if ranking and not {"chosen", "rejected"} <= set(declared) and fmt == "alpaca":
        missing.append("chosen/rejected (not declared in \"columns\")")
    read = f"the {len(rows)} rows read" if whole else f"the first {len(rows)} rows"
    if missing:
        return [Problem(codes.LF_DATASET_FORMAT,
                        f"{key}: {name} ({fmt}) reads column(s) {', '.join(missing)} that {path.name} does not have "
                        f"(keys in {read}: {', '.join(sorted(have)[:8])}): the format conversion fails with "
                        f"KeyError: {missing[0].split(' -> ')[-1]} (data/converter.py align_dataset)",
                        "Map your columns in dataset_info.json, e.g. \"columns\": {\"prompt\": \"question\", \"response\": "
                        "\"answer\"}, or rename the keys in the file; formats: LLaMA-Factory's data/README.md.")]
    if fmt == "sharegpt" and "messages" in declared:
        return _sharegpt_rows(run, key, name, entry, rows, declared["messages"], read, whole)
    return []


def _sharegpt_check(messages, tags: dict, ranking: bool) -> str | None:
    """SharegptDatasetConverter on one example (data/converter.py): None when it is kept; "skip" when
    it is skipped (roles must alternate user/observation then assistant/function after an optional
    system turn; a non-ranking example has an even number of turns); "KeyError: 'x'" when a turn
    lacks the role or content key (message[role_tag] raises)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "skip"
    role, content, sys_tag = tags["role_tag"], tags["content_tag"], tags["system_tag"]
    if messages and role not in messages[0]:
        return f"KeyError: {role!r}"
    if messages and messages[0][role] == sys_tag:
        messages = messages[1:]
    accept = ((tags["user_tag"], tags["observation_tag"]), (tags["assistant_tag"], tags["function_tag"]))
    for i, m in enumerate(messages):
        if role not in m:
            return f"KeyError: {role!r}"
        if m[role] not in accept[i % 2]:
            return "skip"
        if content not in m:
            return f"KeyError: {content!r}"
    odd = len(messages) % 2 != 0
    return "skip" if (odd if not ranking else not odd) else None


def _tags_hint(first, tags: dict, row: int) -> str:
    """The "tags" entry that would make this row readable, guessed from its keys and roles."""
    msgs = [m for m in first if isinstance(m, dict)] if isinstance(first, list) else []
    keys = {k for m in msgs for k in m}
    role = tags["role_tag"] if tags["role_tag"] in keys else next((k for k in ("role", "from") if k in keys), "role")
    content = tags["content_tag"] if tags["content_tag"] in keys else next(
        (k for k in ("content", "value", "text") if k in keys), "content")
    roles = [m.get(role) for m in msgs if m.get(role) != tags["system_tag"]]
    want = {"role_tag": role, "content_tag": content, "user_tag": roles[0] if roles else "user",
            "assistant_tag": roles[1] if len(roles) > 1 else "assistant"}
    hint = {k: v for k, v in want.items() if v != tags[k]}
    if not msgs:
        return "Each row needs a list of turns under the messages column (see LLaMA-Factory's data/README.md)."
    return (f"Row {row} has keys {sorted(keys)} and roles {roles[:4]}: give dataset_info.json \"tags\": "
            f"{json.dumps(hint or want)} for this dataset, and let turns alternate user, assistant.")


def _sharegpt_rows(run, key, name, entry, rows, column, read, whole) -> list[Problem]:
    tags = dict(TAGS, **{k: v for k, v in (entry.get("tags") or {}).items() if k in TAGS})
    ranking = bool(entry.get("ranking", False))
    verdicts = [_sharegpt_check(r.get(column), tags, ranking) for r in rows]
    broken = [i for i, v in enumerate(verdicts) if v]
    if not broken:
        return []
    fix = _tags_hint(rows[broken[0]].get(column), tags, broken[0])
    crash = next((v for v in verdicts if v and v.startswith("KeyError")), None)
    if crash:
        return [Problem(codes.LF_DATASET_FORMAT, f"{key}: {name}: a turn in {read} has no {crash.split(': ')[1]} key: "
                        f"the format conversion fails with {crash} (data/converter.py SharegptDatasetConverter)", fix)]
    every = len(broken) == len(rows)
    said = (f"LLaMA-Factory skips them (\"Invalid role tag in ...\", \"Skipping this abnormal example.\"); "
            f"{'none is left' if every and whole else 'if none is left'}: \"Cannot find valid samples, check "
            "`data/README.md` for the data format.\" (data/converter.py, data/loader.py)")
    return [Problem(codes.LF_DATASET_FORMAT, f"{key}: {name}: {len(broken)} of {read} are not valid sharegpt "
                    f"conversations: {said}", fix, "fail" if every else "warn")]


# -- template, attention, LoRA targets -------------------------------------------------------------------

def template_known(run: LfRun, env: Env) -> list[Problem]:
    """data/template.py get_template_and_fix_tokenizer: a template name that register_template never
    registered stops the run after the tokenizer is loaded."""
    name = run.args.get("template")
    if name is None or env.templates is None or str(name) in env.templates:
        return []
    near = get_close_matches(str(name), sorted(env.templates), n=3, cutoff=0.6)
    return [Problem(codes.LF_TEMPLATE, f"template: {name} — \"Template {name} does not exist.\" "
                    "(data/template.py get_template_and_fix_tokenizer)",
                    (f"Did you mean {' or '.join(near)}? " if near else "") + "Use a template registered in "
                    "llamafactory/data/template.py (the model's README names it), or drop template: to use the "
                    "tokenizer's own chat template.")]


ATTENTION = ("auto", "disabled", "sdpa", "fa2")


def attention(run: LfRun, env: Env) -> list[Problem]:
    """model/model_utils/attention.py configure_attn_implementation: a flash_attn value other than
    auto/disabled/sdpa/fa2 raises NotImplementedError at model load (gpt-oss excepted: it uses its
    FA3 kernel); fa2 without flash-attn is a warning, and the run uses the default attention."""
    value = str(run.get("flash_attn", "auto"))
    if (run.model_cfg or {}).get("model_type") == "gpt_oss":
        return []
    if value not in ATTENTION:
        return [Problem(codes.LF_ARG_REFUSED, f"flash_attn: {value} — \"NotImplementedError: Unknown attention type: "
                        f"{value}\" when the model is loaded (model/model_utils/attention.py configure_attn_implementation)",
                        f"flash_attn is one of {', '.join(ATTENTION)} (fa2 needs the flash-attn package).")]
    if value == "fa2" and env.versions and not env.has("flash-attn") and not env.has("flash_attn"):
        return [Problem(codes.LF_EXTRA_MISSING, "flash_attn: fa2 but flash-attn is not installed: LLaMA-Factory logs "
                        "\"FlashAttention-2 is not installed.\" and loads the model with the default attention (SDPA), "
                        "slower and with more memory at long cutoff_len (model/model_utils/attention.py)",
                        "pip install flash-attn --no-build-isolation (a wheel matching torch and CUDA), or flash_attn: sdpa.",
                        "warn")]
    return []


LLAMA_LIKE = frozenset("q_proj k_proj v_proj o_proj gate_proj up_proj down_proj embed_tokens lm_head".split())
ATTN_ONLY = frozenset("q_proj k_proj v_proj o_proj embed_tokens lm_head".split())
# module names (last component) of the decoder models transformers 5 builds, per model_type; a test
# builds each on the meta device and compares. MoE experts are fused parameters there (no Linear).
MODULE_NAMES = {
    **dict.fromkeys(("llama", "mistral", "ministral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo",
                     "olmo2", "cohere", "granite", "exaone4", "ernie4_5", "seed_oss", "smollm3", "hunyuan_v1_dense"),
                    LLAMA_LIKE),
    "qwen2_moe": LLAMA_LIKE | {"shared_expert_gate"},
    **dict.fromkeys(("qwen3_moe", "mixtral", "olmoe"), ATTN_ONLY),
    "phi3": frozenset("qkv_proj o_proj gate_up_proj down_proj embed_tokens lm_head".split()),
    **dict.fromkeys(("glm", "glm4"), frozenset("q_proj k_proj v_proj o_proj gate_up_proj down_proj embed_tokens lm_head".split())),
    "phi": frozenset("q_proj k_proj v_proj dense fc1 fc2 embed_tokens lm_head".split()),
    "gpt2": frozenset("c_attn c_proj c_fc wte wpe lm_head".split()),
    **dict.fromkeys(("falcon", "bloom"), frozenset("query_key_value dense dense_h_to_4h dense_4h_to_h word_embeddings lm_head".split())),
    "gpt_neox": frozenset("query_key_value dense dense_h_to_4h dense_4h_to_h embed_in embed_out".split()),
    "starcoder2": frozenset("q_proj k_proj v_proj o_proj c_fc c_proj embed_tokens lm_head".split()),
    "opt": frozenset("q_proj k_proj v_proj out_proj fc1 fc2 embed_tokens embed_positions lm_head".split()),
}


def lora_targets(run: LfRun, env: Env) -> list[Problem]:
    """model/adapter.py _setup_lora_tuning passes lora_target to peft's LoraConfig: when none of the
    names is a module of the model, peft raises "Target modules {...} not found in the base model"
    (peft/tuners/tuners_utils.py inject_adapter); a name that matches nothing next to ones that do
    is dropped without a word."""
    if run.finetuning_type != "lora" or not run.on("do_train"):
        return []
    targets = [t for t in run.split("lora_target") or ["all"] if t]
    mtype = str((run.model_cfg or {}).get("model_type", ""))
    names = MODULE_NAMES.get(mtype)
    major = (env.version("transformers") or "5").split(".")[0]
    if targets == ["all"] or names is None or major != "5":
        return []
    unknown = [t for t in targets if t.split(".")[-1] not in names]
    if not unknown:
        return []
    fused = " (transformers 5 fuses MoE experts into one parameter: no per-expert Linear to target)" \
        if names is ATTN_ONLY else ""
    msg = f"lora_target {', '.join(unknown)}: no such module in a {mtype} model{fused}; its modules: {', '.join(sorted(names))}"
    if len(unknown) == len(targets):
        return [Problem(codes.LF_LORA_TARGET, f"{msg} — peft stops with \"Target modules {set(unknown)} not found in the "
                        "base model. Please check the target modules and try again.\" (model/adapter.py _setup_lora_tuning)",
                        "Use lora_target: all (every linear layer but the head), or names from the list above.")]
    return [Problem(codes.LF_LORA_TARGET, f"{msg} — peft ignores them and trains LoRA on the others only",
                    f"Drop {', '.join(unknown)} or use lora_target: all.", "warn")]


# -- packages the options need ----------------------------------------------------------------------------
# option -> the requirement LLaMA-Factory checks with check_version(..., mandatory=True), as it writes
# it (hparams/parser.py _check_extra_dependencies)
EXTRAS = (
    ("use_unsloth", "unsloth"), ("enable_liger_kernel", "liger-kernel"), ("mixture_of_depths", "mixture-of-depth>=1.1.6"),
    ("use_galore", "galore_torch"), ("use_apollo", "apollo_torch"), ("use_badam", "badam>=1.2.1"),
    ("use_adam_mini", "adam-mini"), ("use_swanlab", "swanlab"), ("plot_loss", "matplotlib"),
    ("predict_with_generate", "jieba"), ("predict_with_generate", "nltk"), ("predict_with_generate", "rouge_chinese"),
    ("use_kt", "kt-kernel"), ("use_kt", "transformers-kt"), ("use_kt", "accelerate-kt"),
)


def split_requirement(req: str) -> tuple[str, str | None]:
    """'badam>=1.2.1' -> ('badam', '1.2.1'); 'unsloth' -> ('unsloth', None)."""
    name, _, low = req.partition(">=")
    return name, low or None


# report_to name -> the distributions its callback needs (transformers/integrations/integration_utils.py)
REPORTERS = {"wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX"), "mlflow": ("mlflow",),
             "comet_ml": ("comet-ml",), "neptune": ("neptune",), "clearml": ("clearml",), "dvclive": ("dvclive",),
             "swanlab": ("swanlab",), "trackio": ("trackio",), "codecarbon": ("codecarbon",)}


REPORTER_MESSAGES = {"wandb": "WandbCallback requires wandb to be installed. Run `pip install wandb`.",
                     "tensorboard": "TensorBoardCallback requires tensorboard to be installed. Either update your "
                                    "PyTorch version or install tensorboardX."}


def _older(have: str, want: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(have) < Version(want)
    except InvalidVersion:
        return False


def extras(run: LfRun, env: Env) -> list[Problem]:
    """hparams/parser.py _check_extra_dependencies: the package an option needs, missing or too old,
    stops the run ("The 'unsloth' distribution was not found and is required by this application");
    deepspeed's own finding is MGD907 (deepspeed.install reports it too)."""
    if not env.versions:
        return []
    out = []
    needs = [(opt, req) for opt, req in EXTRAS if run.on(opt) or (opt == "mixture_of_depths" and run.args.get(opt))]
    if run.args.get("deepspeed"):
        needs.append(("deepspeed", "deepspeed"))
    for opt, req in needs:
        dist, low = split_requirement(req)
        have = env.version(dist)
        if have is not None and not (low and _older(have, low)):
            continue
        said = (f"\"The '{req}' distribution was not found and is required by this application.\"" if have is None
                else f"{dist} {have} is older than {low} (\"{req} is required\")")
        code = codes.DS_MISSING if dist == "deepspeed" else codes.LF_EXTRA_MISSING
        out.append(Problem(code, f"{opt} needs {req}: LLaMA-Factory stops before training: {said} "
                           f"({SRC} _check_extra_dependencies)", f"pip install '{req}' in this environment, or drop {opt}."))
    return out + _reporters(run, env)


def _reporters(run: LfRun, env: Env) -> list[Problem]:
    """TrainingArguments.report_to -> transformers' get_reporting_integration_callbacks: an unknown
    name is refused ("X is not supported, only ... are supported."), a known one whose package is
    missing fails when the Trainer is built ("WandbCallback requires wandb to be installed")."""
    value = run.args.get("report_to")
    names = value if isinstance(value, list) else [value] if value is not None else []
    out = []
    for name in (str(n) for n in names):
        if name in ("none", "all"):
            continue
        if env.integrations is not None and name not in env.integrations:
            out.append(Problem(codes.LF_EXTRA_MISSING, f"report_to: {name} — \"{name} is not supported, only "
                               f"{', '.join(env.integrations)} are supported.\" (transformers integration_utils.py)",
                               "Give one name per list item (report_to: [wandb, tensorboard]), or none."))
        elif name in REPORTERS and not any(env.has(d) for d in REPORTERS[name]):
            said = REPORTER_MESSAGES.get(name, f"the {name} callback needs {REPORTERS[name][0]}")
            out.append(Problem(codes.LF_EXTRA_MISSING, f"report_to: {name} but {REPORTERS[name][0]} is not installed: "
                               f"the Trainer stops after the model is loaded (\"{said}\", transformers "
                               "integrations/integration_utils.py)", f"pip install {REPORTERS[name][0]}, or report_to: none."))
    return out


# -- quantization -------------------------------------------------------------------------------------------
QSRC = "model/model_utils/quantization.py configure_quantization"
ON_THE_FLY = {"bnb": "bitsandbytes", "hqq": "hqq", "eetq": "eetq"}  # quantization_method -> backend package


def quantization_backend(run: LfRun) -> str | None:
    """The package LLaMA-Factory quantizes with for this YAML (None: no on-the-fly quantization)."""
    if run.args.get("quantization_bit") is None:
        return None
    return ON_THE_FLY.get(str(run.get("quantization_method", "bnb")))


# a pre-quantized checkpoint's quant_method -> (the distribution LLaMA-Factory checks as mandatory, its minimum)
PTQ_BACKENDS = {"gptq": ("gptqmodel", "2.0.0"), "awq": ("autoawq", None), "aqlm": ("aqlm", "1.1.0")}


def _ptq_backend(env: Env, method: str) -> list[Problem]:
    """configure_quantization's PTQ branch: loading a GPTQ/AWQ/AQLM checkpoint needs its kernel package."""
    if method not in PTQ_BACKENDS or not env.versions:
        return []
    dist, low = PTQ_BACKENDS[method]
    have = env.version(dist)
    if have is not None and not (low and _older(have, low)):
        return []
    req = dist + (f">={low}" if low else "")
    said = (f"\"The '{req}' distribution was not found and is required by this application.\"" if have is None
            else f"{dist} {have} is older than {low}")
    return [Problem(codes.LF_QUANT_BACKEND, f"the model is a {method.upper()} checkpoint (quantization_config in "
                    f"config.json): LLaMA-Factory checks {req} before loading it: {said} ({QSRC})",
                    f"pip install '{req}'" + (" --no-build-isolation" if method == "awq" else "") + " in this environment.")]


def _bnb_requirement(run: LfRun, bit) -> str:
    sharded = run.zero3 or run.args.get("quantization_device_map") == "auto"
    return "0.43.0" if sharded else "0.37.0" if bit == 8 else "0.39.0"


def quantization(run: LfRun, env: Env) -> list[Problem]:
    """model/model_utils/quantization.py configure_quantization (on the fly: bnb 4/8-bit, HQQ, EETQ)
    and transformers' quantizers' validate_environment (bitsandbytes version and devices, HQQ off
    the CPU, EETQ on a GPU), checked against the examined Python."""
    bit = run.args.get("quantization_bit")
    ptq = (run.model_cfg or {}).get("quantization_config")
    if isinstance(ptq, dict):
        return _ptq_backend(env, str(ptq.get("quant_method", "")).lower())  # its ZeRO-3 rule: quantization.py
    if bit is None:
        return []
    method = str(run.get("quantization_method", "bnb"))
    if method not in ON_THE_FLY:
        return [Problem(codes.LF_QUANT_BACKEND, f"quantization_bit: {bit} with quantization_method: {method}: "
                        "LLaMA-Factory quantizes on the fly only with bnb, hqq or eetq, so this model is loaded and "
                        f"trained unquantized, without a word ({QSRC})",
                        "quantization_method: bnb (QLoRA, 4-bit), or a checkpoint already quantized with "
                        f"{method} (its config.json carries quantization_config).", "warn")]
    valid = {"bnb": (4, 8), "hqq": (8, 6, 5, 4, 3, 2, 1), "eetq": (8,)}[method]
    if bit not in valid:  # a quoted "4" is not 4 either (strings_for_numbers explains why)
        said = {"bnb": "Bitsandbytes only accepts 4-bit or 8-bit quantization.",
                "hqq": "HQQ only accepts 1/2/3/4/5/6/8-bit quantization.", "eetq": "EETQ only accepts 8-bit quantization."}
        return [Problem(codes.LF_QUANT_BACKEND, f"quantization_bit: {bit!r} with {method}: \"{said[method]}\" ({QSRC})",
                        f"quantization_bit is one of {', '.join(map(str, valid))} for {method}, written without quotes.")]
    return _backend_installed(run, env, method, bit)


def _backend_installed(run: LfRun, env: Env, method: str, bit) -> list[Problem]:
    dist = ON_THE_FLY[method]
    if not env.versions:
        return []
    have = env.version(dist)
    low = _bnb_requirement(run, bit) if method == "bnb" else None
    req = dist + (f">={low}" if low else "")
    want = low if not (low and env.bnb_min and _older(low, env.bnb_min)) else env.bnb_min
    fix = f"pip install -U '{dist}{'>=' + want if want else ''}' in this environment."
    if have is None:
        return [Problem(codes.LF_QUANT_BACKEND, f"quantization_bit: {bit} ({method}) needs {dist}, not installed here: "
                        f"\"The '{req}' distribution was not found and is required by this application.\" ({QSRC})", fix)]
    if low and _older(have, low):
        return [Problem(codes.LF_QUANT_BACKEND, f"{dist} {have} is older than LLaMA-Factory's {req} for "
                        f"{bit}-bit{' under ZeRO-3' if run.zero3 else ''} ({QSRC})", fix)]
    if method == "bnb" and env.bnb_min and _older(have, env.bnb_min):
        return [Problem(codes.LF_QUANT_BACKEND, f"bitsandbytes {have}: transformers stops at model load with \"Using "
                        f"`bitsandbytes` {bit}-bit quantization requires bitsandbytes: `pip install -U "
                        f"bitsandbytes>={env.bnb_min}`\" (quantizers/quantizer_bnb_{bit}bit.py validate_environment)", fix)]
    return _backend_runs(env, method, dist)


def _backend_runs(env: Env, method: str, dist: str) -> list[Problem]:
    imp = env.imports.get(dist)
    if imp is not None and not imp.get("ok"):
        return [Problem(codes.LF_QUANT_BACKEND, f"{dist} is installed but does not import: {imp.get('error_type')}: "
                        f"{(imp.get('error') or '').splitlines()[0][:300] if imp.get('error') else ''}",
                        f"Reinstall {dist} for this torch/CUDA (pip install -U --force-reinstall {dist}).")]
    devices = env.devices
    if devices is None:
        return []
    gpu = any(d != "cpu" for d in devices)
    if method == "bnb" and imp is not None and not set(devices) & set(imp.get("supported_devices") or []):
        return [Problem(codes.LF_QUANT_BACKEND, f"bitsandbytes supports {imp.get('supported_devices') or 'no device'} "
                        f"and torch has {devices}: transformers stops at model load with \"None of the available devices "
                        "... are supported by the bitsandbytes version you have installed\" (integrations/bitsandbytes.py "
                        "validate_bnb_backend_availability)", "Install a bitsandbytes build for this device (CUDA wheels "
                        "from PyPI), or train without quantization_bit here.", "warn")]
    if method in ("hqq", "eetq") and not gpu:
        said = ("\"You are attempting to use an HQQ model with a device_map that contains a CPU or disk device.\""
                if method == "hqq" else "\"No GPU found. A GPU is needed for quantization.\"")
        return [Problem(codes.LF_QUANT_BACKEND, f"{method.upper()} quantization without a GPU here: transformers stops "
                        f"at model load with {said} (quantizers/quantizer_{method}.py validate_environment)",
                        "Run it where torch sees a GPU, or use bnb 4-bit.", "warn")]
    return []


# -- the output folder and checkpoints ------------------------------------------------------------------------
CHECKPOINT_NAMES = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors.index.json",
                    "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")  # extras/constants.py
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def _last_checkpoint(folder: Path) -> Path | None:
    """transformers/trainer_utils.py get_last_checkpoint: the checkpoint-N folder with the largest N."""
    found = [p for p in folder.iterdir() if _CKPT.match(p.name) and p.is_dir()]
    return max(found, key=lambda p: int(_CKPT.match(p.name).group(1))) if found else None


def _valid_checkpoint(folder: Path) -> bool:
    """transformers/trainer.py _load_from_checkpoint: a folder with model or adapter weights (or FSDP/adapter subfolders)."""
    names = {"pytorch_model.bin", "model.safetensors", "pytorch_model.bin.index.json", "model.safetensors.index.json",
             "adapter_model.bin", "adapter_model.safetensors"}
    return folder.is_dir() and (any((folder / n).is_file() for n in names)
                                or any(p.is_dir() and (p / "adapter_model.safetensors").is_file() for p in folder.iterdir()))


def output_dir(run: LfRun, env: Env) -> list[Problem]:
    """hparams/parser.py get_train_args, its last block: an existing output_dir with a saved model
    and no checkpoint-N stops the run unless overwrite_output_dir; with a checkpoint-N the run
    resumes from it silently. transformers/trainer.py train: a resume_from_checkpoint that holds
    no checkpoint stops it after the model is loaded."""
    if not run.on("do_train") or not run.args.get("output_dir"):
        return []
    out_dir = Path(env.cwd) / str(run.args["output_dir"])
    resume = run.args.get("resume_from_checkpoint")
    resumable = not (run.stage in ("rm", "ppo") and run.finetuning_type in ("full", "freeze"))
    if isinstance(resume, str) and resumable:
        target = Path(env.cwd) / resume
        if not _valid_checkpoint(target):
            return [Problem(codes.LF_OUTPUT_DIR, f"resume_from_checkpoint: {resume} — {'no such folder' if not target.exists() else 'no weights in it'}"
                            f": the Trainer stops after loading the model with \"Can't find a valid checkpoint at {resume}\" "
                            "(transformers/trainer.py _load_from_checkpoint)",
                            "Point it at a checkpoint-N folder of an earlier run, or drop it to start afresh.")]
        return []
    if resume is True and resumable and (not out_dir.is_dir() or _last_checkpoint(out_dir) is None):
        return [Problem(codes.LF_OUTPUT_DIR, f"resume_from_checkpoint: true but {out_dir} holds no checkpoint-N folder: "
                        f"\"No valid checkpoint found in output directory ({run.args['output_dir']})\" (transformers/trainer.py train)",
                        "Drop resume_from_checkpoint for a first run, or give the checkpoint folder.")]
    if resume is not None or run.on("overwrite_output_dir") or not out_dir.is_dir() or not resumable:
        return []
    last = _last_checkpoint(out_dir)
    if last is None and any((out_dir / n).is_file() for n in CHECKPOINT_NAMES):
        return [Problem(codes.LF_OUTPUT_DIR, f"output_dir {run.args['output_dir']} already holds a saved model: "
                        "\"Output directory already exists and is not empty. Please set `overwrite_output_dir`.\" "
                        f"({SRC} get_train_args)", "Choose a new output_dir, or overwrite_output_dir: true to replace it.")]
    if last is not None and not _valid_checkpoint(last):
        return [Problem(codes.LF_OUTPUT_DIR, f"output_dir {run.args['output_dir']} holds {last.name} without weights: "
                        f"LLaMA-Factory resumes from it ({SRC} get_train_args) and the Trainer stops with \"Can't find a "
                        f"valid checkpoint at {last}\" (transformers/trainer.py _load_from_checkpoint)",
                        f"Remove the broken {last.name}, or set overwrite_output_dir: true.")]
    if last is not None:
        return [Problem(codes.LF_OUTPUT_DIR, f"output_dir {run.args['output_dir']} holds {last.name}: LLaMA-Factory resumes "
                        f"from it without asking (\"Resuming training from {last}.\", {SRC} get_train_args) — with its "
                        "optimizer state, step count and the world size it was saved with",
                        "Keep it to resume; for a new run choose another output_dir or set overwrite_output_dir: true.",
                        "warn")]
    return []


RULES = (unknown_keys, strings_for_numbers, refused_combinations, nothing_to_do, datasets_defined, template_known,
         attention, lora_targets, extras, quantization, output_dir)


def check(rc: RunConfig, env: Env, world: int = 1, model_cfg: dict | None = None) -> list[Problem]:
    """Every rule over the YAML (nothing without one)."""
    if not rc.yaml_path:
        return []
    run = LfRun(rc, llamafactory_args(rc), world, model_cfg)
    out = []
    for rule in RULES:
        out += rule(run, env)
    return out
