"""Builds the rehearsal's miniature in the examined Python, in the rehearsal's own folder: the
model shrunk from its config.json (2 layers, small widths, the same architecture, random
weights saved as a checkpoint LLaMA-Factory loads), the user's tokenizer when it is local (its
files copied) or a small byte-level BPE built here, the datasets (_mini_data), and the YAML and
DeepSpeed JSON (_mini_config). The doctor then runs the real `llamafactory-cli train` on it.
Reads the user's files, writes only under --args' `folder`."""

import glob
import json
import os
import shutil
import sys

WORKERS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, WORKERS_DIR)
from _mini_config import mini_ds_config, mini_yaml
from _mini_data import build_datasets, dataset_names
from _protocol import emit, error_fields, phase, script_args
from _shrink import shrink_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.txt",
                   "spiece.model", "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                  "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "[INST]",
                  "[/INST]", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
VOCAB_HEADROOM = 64  # room for the stop words a template adds to the tokenizer (LLaMA-Factory's fix_special_tokens)
QUANT_PACKAGES = {"bnb": "bitsandbytes", "bitsandbytes": "bitsandbytes", "hqq": "hqq", "eetq": "eetq"}


class Stopped(Exception):
    """The miniature cannot be built; `step` says where."""

    def __init__(self, step: str, exc: BaseException):
        super().__init__(str(exc))
        self.step, self.exc = step, exc


def step(name: str, fn, *args):
    phase(name)
    try:
        return fn(*args)
    except Exception as exc:  # reported with the step's name
        raise Stopped(name, exc) from exc


# ---- where the real tools are -----------------------------------------------------------------------

def console_script(dist_name: str, script: str) -> str | None:
    """The console script a distribution installed (its RECORD), else the one on PATH."""
    from importlib import metadata

    try:
        files = metadata.distribution(dist_name).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == script:
            path = os.path.abspath(str(f.locate()))
            if os.path.isfile(path):
                return path
    return shutil.which(script)


def find_tools() -> dict:
    import llamafactory  # noqa: F401 - llamafactory missing is the first thing to say

    cli = console_script("llamafactory", "llamafactory-cli")
    torchrun = console_script("torch", "torchrun")
    if not cli or not torchrun:
        raise FileNotFoundError(f"console scripts not found: llamafactory-cli={cli}, torchrun={torchrun}")
    return {"cli": cli, "torchrun": torchrun, "llamafactory": llamafactory.__version__ if hasattr(llamafactory, "__version__") else None}


# ---- tokenizer ---------------------------------------------------------------------------------------

def copy_tokenizer(src: str, dst: str) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
            copied.append(name)
    copied += [os.path.basename(p) for p in glob.glob(os.path.join(src, "*.tiktoken"))
               if shutil.copy2(p, os.path.join(dst, os.path.basename(p)))]
    return copied


def build_tokenizer(dst: str):
    """A byte-level BPE of a few hundred tokens with the special tokens chat templates use."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from _mini_data import WORDS

    rng = random.Random(0)
    text = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(400)]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainer=trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(dst)
    return fast


def prepare_tokenizer(a: dict, model_dir: str) -> dict:
    """The user's tokenizer files when the model folder has them, else a small one built here."""
    src = a.get("model_dir")
    if src and a.get("use_tokenizer") and os.path.isdir(src):
        copied = copy_tokenizer(src, model_dir)
        if copied:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=bool(a.get("trust_remote_code")))
            return {"kind": "yours", "files": copied, "len": len(tok), "class": type(tok).__name__, "tokenizer": tok}
    tok = build_tokenizer(model_dir)
    return {"kind": "built", "len": len(tok), "class": type(tok).__name__, "tokenizer": tok}


# ---- model -------------------------------------------------------------------------------------------

def small_config_dict(a: dict, tok: dict) -> tuple[dict, list[str]]:
    """The shrunk config.json: the user's vocabulary with the user's tokenizer, else the built
    tokenizer's size plus room for a template's stop words, its special-token ids."""
    cfg = dict(a["config_dict"])
    notes = []
    if cfg.get("auto_map") and not a.get("trust_remote_code"):
        cfg.pop("auto_map")
        notes.append("the model's own code (auto_map) is not run without --trust-remote-code: transformers' "
                     f"built-in {cfg.get('model_type')} is used")
    small, shrink_notes = shrink_config(cfg, keep_vocab=tok["kind"] == "yours")
    if tok["kind"] == "built":
        vocab = -(-(tok["len"] + VOCAB_HEADROOM) // 64) * 64
        t = tok["tokenizer"]
        for d in (small, small.get("text_config")):
            if isinstance(d, dict) and "vocab_size" in d:
                d["vocab_size"] = vocab
                d.update({k: v for k, v in (("eos_token_id", t.eos_token_id), ("pad_token_id", t.pad_token_id),
                                            ("bos_token_id", None)) if k in d})
    return small, notes + shrink_notes


def model_class(config):
    """The class LLaMA-Factory's load_model picks for this config (model/loader.py)."""
    from transformers import (AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM,
                              AutoModelForTextToWaveform)

    for cls in (AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoModelForTextToWaveform):
        if type(config) in cls._model_mapping.keys():
            return cls
    return AutoModelForCausalLM


def build_model(a: dict, model_dir: str, small: dict) -> dict:
    """The shrunk model with random weights, saved where LLaMA-Factory's model_name_or_path points."""
    import torch
    from transformers import AutoConfig

    trust = bool(a.get("trust_remote_code"))
    if trust and small.get("auto_map") and a.get("model_dir"):
        for p in glob.glob(os.path.join(a["model_dir"], "*.py")):
            shutil.copy2(p, model_dir)
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(small, f, indent=1)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust)
    dtype_name = str(a["config_dict"].get("torch_dtype") or a["config_dict"].get("dtype") or "float32")
    dtype = getattr(torch, dtype_name.replace("torch.", ""), torch.float32)
    torch.manual_seed(0)
    cls = model_class(config)
    model = cls.from_config(config, trust_remote_code=trust, dtype=dtype)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"model_type": small.get("model_type"), "class": type(model).__name__, "loader": cls.__name__,
            "params": params, "dtype": str(dtype).replace("torch.", ""), "vocab_size": small.get("vocab_size")}


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def needs_processor(model: dict, tok: dict) -> None:
    """A multimodal model is trained by LLaMA-Factory through its processor (the image/video
    preprocessor with the tokenizer): without the model folder's processor files the miniature
    would fail where the real run does not ('Processor was not found'), so it is not built."""
    if model.get("loader") != "AutoModelForImageTextToText":
        return
    if not any(f in PROCESSOR_FILES for f in tok.get("files") or ()):
        raise FileNotFoundError(f"{model.get('model_type')} is multimodal and its processor files "
                                f"({' / '.join(PROCESSOR_FILES)}) are not in a local model folder")


# ---- YAML and DeepSpeed JSON -------------------------------------------------------------------------

def quantization_ok(a: dict) -> bool:
    import importlib.util

    y = a["yaml"]
    if y.get("quantization_bit") is None:
        return True
    package = QUANT_PACKAGES.get(str(y.get("quantization_method", "bnb")).lower())
    return bool(a.get("on_gpu")) and package is not None and importlib.util.find_spec(package) is not None


def read_user_yaml(a: dict) -> dict:
    """The user's YAML as LLaMA-Factory reads it (OmegaConf: hparams/parser.py read_args), so a
    value like 1e-4 is what the real run gets; the doctor's PyYAML reading when OmegaConf is absent."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return a["yaml"]
    return OmegaConf.to_container(OmegaConf.load(os.path.abspath(a["yaml_path"])))


def write_configs(a: dict, folder: str, model_dir: str, data_dir: str | None) -> tuple[str, list[str]]:
    notes = []
    ds_path = None
    if a.get("ds") is not None:
        ds, ds_notes = mini_ds_config(a["ds"], yaml=a["yaml"], on_gpu=bool(a.get("on_gpu")), scratch_dir=folder)
        notes += ds_notes
        ds_path = os.path.join(folder, "ds_config.json")
        with open(ds_path, "w", encoding="utf-8") as f:
            json.dump(ds, f, indent=1)
    y, y_notes = mini_yaml(a["yaml"], model_dir=model_dir, data_dir=data_dir, out_dir=folder, ds=a.get("ds"),
                           ds_path=ds_path, on_gpu=bool(a.get("on_gpu")), bf16_ok=bool(a.get("bf16_ok")),
                           quantization_ok=quantization_ok(a))
    notes = y_notes + notes
    import yaml

    path = os.path.join(folder, "rehearsal.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(y, f, sort_keys=False)  # floats keep their dot (1.0e-05): OmegaConf reads them back as floats
    return path, notes


def build(a: dict) -> dict:
    folder = a["folder"]
    model_dir = os.path.join(folder, "model")
    data_dir = os.path.join(folder, "data")
    os.makedirs(model_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    out = {"tools": step("find_tools", find_tools)}
    if a.get("yaml_path"):
        a["yaml"] = step("read_yaml", read_user_yaml, a)
    step("import_torch", __import__, "torch")
    tok = step("tokenizer", prepare_tokenizer, a, model_dir)
    small, notes = step("shrink", small_config_dict, a, tok)
    out["model"] = step("build_model", build_model, a, model_dir, small)
    step("processor", needs_processor, out["model"], tok)
    names = dataset_names(a["yaml"].get("dataset"))
    out["datasets"], data_notes = step("datasets", build_datasets, names, a.get("dataset_dir"),
                                       str(a["yaml"].get("stage", "sft")), data_dir)
    out["yaml_path"], config_notes = step("configs", write_configs, a, folder, model_dir, data_dir if names else None)
    out["tokenizer"] = {k: v for k, v in tok.items() if k != "tokenizer"}
    out["notes"] = data_notes + config_notes
    out["shrink_notes"] = notes
    return out


def main() -> None:
    a = script_args()
    try:
        payload = {"ok": True, **build(a)}
    except Stopped as exc:
        payload = {"ok": False, "step": exc.step, **error_fields(exc.exc, error_chars=1500, traceback_chars=4000)}
    emit(payload)


if __name__ == "__main__":
    main()
