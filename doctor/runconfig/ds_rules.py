"""Rules over a DeepSpeed JSON (and the LLaMA-Factory YAML that uses it): what is wrong, and
the repair. The config probes report the problems; `mgft-doctor fix` applies the repairs.
Each rule is a function (RunConfig, world_size, gpu_bf16) -> list[Problem].

A repair is labelled as ruff labels its fixes: safe (the run keeps its meaning: a flag that
only saves what training made, "auto" where the Trainer fills the value from the YAML) or
unsafe (the doctor picks a number the user did not write: a global batch, a time limit, a
learning rate); `fix` applies the unsafe ones only with --unsafe. "auto" in a JSON that the HF
Trainer, accelerate or LLaMA-Factory read is legal and never replaced; only `fix --no-trainer`
(a script that hands the JSON to deepspeed.initialize) writes numbers for it. No repair turns
mixed precision off."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from . import RunConfig, codes

AUTO_KEYS_INFO = "the HF Trainer (and accelerate) replace \"auto\" from TrainingArguments; deepspeed.initialize does not"
HUGE_DDP_TIMEOUT_S = 6 * 3600
BOUNDED_DDP_TIMEOUT_S = 7200  # what the repair of a huge ddp_timeout writes (unsafe: it may be too short)
REMOVE = object()  # a repair value: drop the key, DeepSpeed's own default or derivation applies


@dataclass
class Problem:
    code: str  # the catalog code (a constant of runconfig/codes.py)
    message: str
    fix: str
    severity: str = "fail"  # 'fail' or 'warn'
    repair: Callable[[dict], None] | None = None  # edits the `target` config dict in place
    paths: list[str] = field(default_factory=list)
    safe: bool = False  # ruff's label: unsafe repairs (picked numbers) need `fix --unsafe`
    target: str = "deepspeed"  # the file the repair edits: "deepspeed" (the JSON) or "yaml"

    @property
    def label(self) -> str:
        return "no automatic repair" if self.repair is None else ("safe" if self.safe else "unsafe")


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _auto_paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(node, str) and node.strip().lower() == "auto":
        out.append(prefix)
    return out


def _set(d: dict, path: str, value) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    if value is REMOVE:
        d.pop(keys[-1], None)
    else:
        d[keys[-1]] = value


def _get(d: dict, path: str, default=None):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _num(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    return None


def _fill(values: dict) -> Callable[[dict], None]:
    def repair(d: dict) -> None:
        for path, value in values.items():
            _set(d, path, value)
    return repair


def auto_values(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    ds = rc.ds or {}
    paths = _auto_paths(ds)
    if not paths:
        return []
    if rc.yaml_path:
        return []  # LLaMA-Factory runs the HF Trainer, which fills every "auto"
    message = (f"{len(paths)} value(s) are \"auto\" ({', '.join(paths[:6])}{'…' if len(paths) > 6 else ''}): "
               f"assumed this JSON is used through the HF Trainer/accelerate/LLaMA-Factory, which fill them; "
               f"{AUTO_KEYS_INFO}, so a script calling it directly fails")
    if not rc.for_initialize:
        return [Problem(
            codes.DS_AUTO_OUTSIDE_TRAINER, message,
            "Keep \"auto\" for HF Trainer / LLaMA-Factory runs (plain `mgft-doctor fix` never replaces it); for a "
            "script that calls deepspeed.initialize itself, set the numbers the run uses (`mgft-doctor fix CONFIG "
            "--no-trainer` writes DeepSpeed's defaults, and with --unsafe also picks batch sizes, learning rates "
            "and step counts).", "warn", None, paths)]
    safe, unsafe = _initialize_values(ds, paths, world, gpu_bf16)
    left = [p for p in paths if p not in safe and p not in unsafe]
    out = []
    for is_safe, values in ((True, safe), (False, unsafe)):
        if values:
            out.append(Problem(
                codes.DS_AUTO_OUTSIDE_TRAINER, f"{message}; for deepspeed.initialize: "
                + ", ".join(f"{p} -> {'(removed: DeepSpeed derives it)' if v is REMOVE else v}" for p, v in values.items()),
                "Set numbers for deepspeed.initialize (no Trainer fills \"auto\").", "warn", _fill(values), list(values),
                safe=is_safe))
    if left:
        out.append(Problem(codes.DS_AUTO_OUTSIDE_TRAINER, f"\"auto\" with no known value for deepspeed.initialize: "
                           f"{', '.join(left)}", "Replace each with the number the run uses.", "warn", None, left))
    return out


_DEEPSPEED_DEFAULTS = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                       "zero_optimization.stage3_param_persistence_threshold", "zero_optimization.allgather_bucket_size")
_PICKED = {  # HF TrainingArguments' defaults, which a Trainer run would have used: numbers the user did not write
    "gradient_clipping": 1.0, "optimizer.params.lr": 1e-5, "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8, "optimizer.params.weight_decay": 0.0, "scheduler.params.warmup_min_lr": 0,
    "scheduler.params.warmup_max_lr": 1e-5, "scheduler.params.warmup_num_steps": 0,
    "scheduler.params.total_num_steps": 1000,
}
_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _initialize_values(ds: dict, paths: list[str], world: int, gpu_bf16: bool | None) -> tuple[dict, dict]:
    """(safe, unsafe) values for the "auto" paths under deepspeed.initialize: DeepSpeed's own
    defaults and derivations are safe (the key is removed); precision follows the GPUs when they
    are known (unsafe when assumed); batch sizes, clipping, learning rates, steps are picked."""
    safe, unsafe = {}, {}
    for p in paths:
        if p in _DEEPSPEED_DEFAULTS or p in _BATCH:
            safe[p] = REMOVE
        elif p in _PICKED:
            unsafe[p] = _PICKED[p]
    if not any(_num(ds.get(k)) is not None for k in _BATCH) and any(p in _BATCH for p in paths):
        unsafe["train_micro_batch_size_per_gpu"] = 1  # DeepSpeed needs one of the three
        safe.pop("train_micro_batch_size_per_gpu", None)
    autos = [p for p in ("bf16.enabled", "fp16.enabled") if p in paths]
    if autos:
        chosen, known = _precision_for(ds, gpu_bf16)
        for p in autos:
            (safe if known else unsafe)[p] = p.startswith(chosen)
    return safe, unsafe


def _precision_for(ds: dict, gpu_bf16: bool | None) -> tuple[str, bool]:
    """('bf16' or 'fp16', decided by what the JSON or the GPUs say): never fp32 when the JSON asks
    for mixed precision with "auto"."""
    if _get(ds, "bf16.enabled") is True:
        return "bf16", True
    if _get(ds, "fp16.enabled") is True:
        return "fp16", True
    if gpu_bf16 is False or _get(ds, "bf16.enabled") is False:
        return "fp16", gpu_bf16 is not None or _get(ds, "bf16.enabled") is False
    return "bf16", gpu_bf16 is True


def bf16_enters(rc: RunConfig) -> bool:
    """Whether the GPUs' bf16 decides a repair or its label (fix reads the GPUs only then)."""
    ds = rc.ds or {}
    both = _get(ds, "fp16.enabled") is True and _get(ds, "bf16.enabled") is True
    auto = any(p in ("bf16.enabled", "fp16.enabled") for p in _auto_paths(ds))
    return not rc.yaml_path and (both or (rc.for_initialize and auto))


_HF_NAME = {"train_micro_batch_size_per_gpu": "per_device_train_batch_size",
            "gradient_accumulation_steps": "gradient_accumulation_steps"}  # fill_match's hf names


def batch_arithmetic(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    ds = rc.ds or {}
    tb, micro, gas = (_num(ds.get(k)) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))
    out = []
    if rc.yaml_path:
        y_micro = rc.yaml.get("per_device_train_batch_size", 8)  # TrainingArguments' default
        y_gas = rc.yaml.get("gradient_accumulation_steps", 1)
        for key, ds_v, y_v in (("train_micro_batch_size_per_gpu", micro, y_micro), ("gradient_accumulation_steps", gas, y_gas)):
            if ds_v is not None and isinstance(y_v, int) and ds_v != y_v:
                out.append(Problem(
                    codes.DS_HF_MISMATCH,
                    f"{key} is {ds_v:g} in the DeepSpeed JSON but the YAML gives {y_v}: the HF Trainer stops with "
                    "'Please correct the following DeepSpeed config values that mismatch TrainingArguments values:"
                    f"\n- ds {key}={ds.get(key)} vs hf {_HF_NAME[key]}={y_v}'",
                    f"Set \"{key}\": \"auto\" in the DeepSpeed JSON (the Trainer fills it from the YAML).",
                    "fail", _fill({key: "auto"}), [key], safe=True))
        if tb is not None and isinstance(y_micro, int) and isinstance(y_gas, int) and tb != y_micro * y_gas * world:
            out.append(Problem(
                codes.DS_HF_MISMATCH,
                f"train_batch_size {tb:g} != per_device_train_batch_size {y_micro} × gradient_accumulation_steps {y_gas} × "
                f"{world} GPU(s) = {y_micro * y_gas * world}: the HF Trainer stops with 'Please correct the following "
                f"DeepSpeed config values that mismatch TrainingArguments values:\n- ds train_batch_size={ds.get('train_batch_size')}"
                f" vs hf train_batch_size (calculated)={y_micro * y_gas * world}'",
                "Set \"train_batch_size\": \"auto\" in the DeepSpeed JSON.", "fail",
                _fill({"train_batch_size": "auto"}), ["train_batch_size"], safe=True))
        return out
    if tb is not None and micro is not None and gas is not None and tb != micro * gas * world:
        out.append(Problem(
            codes.DS_BATCH_ARITHMETIC,
            f"train_batch_size {tb:g} != train_micro_batch_size_per_gpu {micro:g} × gradient_accumulation_steps {gas:g} × "
            f"world size {world} = {micro * gas * world:g}: DeepSpeed asserts 'Check batch related parameters'",
            f"Make train_batch_size = micro × accumulation × GPUs ({micro * gas * world:g} on {world} GPU(s)), or give only "
            "two of the three and let DeepSpeed derive the third.", "fail",
            _fill({"train_batch_size": int(micro * gas * world)})))  # unsafe: the global batch changes
    elif tb is not None and micro is not None and gas is None and tb % (micro * world):
        out.append(Problem(
            codes.DS_BATCH_ARITHMETIC,
            f"train_batch_size {tb:g} is not a multiple of micro batch {micro:g} × {world} GPU(s): DeepSpeed cannot derive "
            "an integer gradient_accumulation_steps", "Choose train_batch_size as a multiple of micro × GPUs.", "fail"))
    return out


def precision(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    ds = rc.ds or {}
    fp16 = _get(ds, "fp16.enabled") is True
    bf16 = _get(ds, "bf16.enabled") is True
    out = []
    if fp16 and bf16:
        out.append(_both_precisions(rc, gpu_bf16))
    wants_bf16 = bf16 or rc.yaml.get("bf16") is True or rc.yaml.get("pure_bf16") is True
    if wants_bf16 and gpu_bf16 is False:
        out.append(Problem(codes.BF16_UNSUPPORTED, "bf16 is asked for but these GPUs have no bf16 (compute capability < 8.0)",
                           "Use fp16 (fp16: true in the YAML; \"fp16\": {\"enabled\": \"auto\"}) or fp32 on this GPU.", "fail"))
    return out


def _both_precisions(rc: RunConfig, gpu_bf16: bool | None) -> Problem:
    """fp16 and bf16 both on: under a YAML that names its precision, "auto" for both lets the
    Trainer take it (safe); alone, keep bf16 where the GPUs have it (safe when they are known)."""
    message = "fp16.enabled and bf16.enabled are both true: DeepSpeed refuses both"
    if rc.yaml_path:
        if any(rc.yaml.get(k) is True for k in ("bf16", "fp16", "pure_bf16")):
            return Problem(codes.DS_CONFIG_INVALID, message, "Set both to \"auto\": the Trainer takes the YAML's precision.",
                           "fail", _fill({"fp16.enabled": "auto", "bf16.enabled": "auto"}), safe=True)
        return Problem(codes.DS_CONFIG_INVALID, message, "Say the precision in the YAML (bf16: true on Ampere or newer, "
                       "else fp16: true) and set both to \"auto\" in the JSON.", "fail")
    keep = "fp16" if gpu_bf16 is False else "bf16"
    drop = "bf16" if keep == "fp16" else "fp16"
    return Problem(codes.DS_CONFIG_INVALID, message, f"Enable one of them ({keep} on these GPUs; bf16 on Ampere or newer).",
                   "fail", _fill({f"{drop}.enabled": False}), safe=gpu_bf16 is not None)


def zero_sections(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    z = rc.zero
    out = []
    stage = z.get("stage", 0)
    if not isinstance(stage, int) or isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        out.append(Problem(codes.DS_CONFIG_INVALID, f"zero_optimization.stage is {stage!r}; DeepSpeed knows 0, 1, 2, 3",
                           "Set an integer stage: 2 shards gradients and optimizer states, 3 the parameters too.", "fail"))
        return out
    for which in ("offload_optimizer", "offload_param"):
        sec = z.get(which)
        if isinstance(sec, dict) and str(sec.get("device", "")).lower() == "nvme" and not sec.get("nvme_path"):
            out.append(Problem(codes.DS_CONFIG_INVALID, f"zero_optimization.{which} offloads to nvme without nvme_path",
                               f"Add \"nvme_path\": \"/local_nvme\" (a fast local disk) to {which}.", "fail"))
    if which_param := z.get("offload_param"):
        if isinstance(which_param, dict) and str(which_param.get("device", "none")).lower() != "none" and stage != 3:
            out.append(Problem(codes.DS_CONFIG_INVALID, f"offload_param is set but stage is {stage}: DeepSpeed offloads parameters only with ZeRO-3",
                               "Use stage 3, or remove offload_param (offload_optimizer works with stage 2).", "warn"))
    if stage == 3:
        gather = z.get("stage3_gather_16bit_weights_on_model_save", z.get("gather_16bit_weights_on_model_save"))
        if gather is not True:
            out.append(Problem(
                codes.ZERO3_EMPTY_SAVE,
                "ZeRO-3 without stage3_gather_16bit_weights_on_model_save: true: save_model() writes no usable "
                "weights (empty/size-0 tensors, a 40-byte adapter) and you must rebuild them with zero_to_fp32.py",
                "Set \"stage3_gather_16bit_weights_on_model_save\": true in zero_optimization.", "warn",
                _fill({"zero_optimization.stage3_gather_16bit_weights_on_model_save": True}), safe=True))
    return out


def yaml_rules(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    out = []
    if rc.ds_error:
        unreadable = rc.ds_path is not None or rc.ds_inline  # found, but its content cannot be used
        out.append(Problem(codes.DS_CONFIG_INVALID, rc.ds_error,
                           "Correct that value: DeepSpeed and the HF Trainer read the config as it is." if unreadable else
                           "Give the path as llamafactory-cli will see it from its working directory "
                           "(e.g. examples/deepspeed/ds_z3_config.json) or an absolute path.", "fail"))
    timeout = rc.yaml.get("ddp_timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > HUGE_DDP_TIMEOUT_S:
        out.append(Problem(
            codes.NCCL_WATCHDOG_TIMEOUT,
            f"ddp_timeout: {timeout:g} s ({timeout / 86400:,.0f} days): a rank that hangs in a collective never times out, "
            "the job burns GPU hours silently instead of failing",
            "Use a bound that covers your longest data preprocessing, e.g. ddp_timeout: 7200, and preprocess once with "
            "tokenized_path so ranks do not wait on rank 0.", "warn",
            _fill({"ddp_timeout": BOUNDED_DDP_TIMEOUT_S}), target="yaml"))  # unsafe: a bound the doctor picks
    return out


# -- what the HF Trainer and accelerate refuse in a YAML + JSON pair (LLaMA-Factory runs the Trainer) --
TRAINER_MISMATCH = ("Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n"
                    "{lines}\nThe easiest method is to set these DeepSpeed config values to 'auto'.")
HF_DEFAULTS = {"max_grad_norm": 1.0, "learning_rate": 5e-5, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
               "weight_decay": 0.0, "warmup_steps": 0, "max_steps": -1}  # transformers 5 TrainingArguments


def _trainer_args(rc: RunConfig) -> dict:
    """The YAML as LLaMA-Factory hands it to TrainingArguments (OmegaConf's YAML rules), defaults filled."""
    from .lf_rules import llamafactory_args

    args = dict(HF_DEFAULTS)
    args.update({k: v for k, v in llamafactory_args(rc).items() if v is not None})
    return args


def _num_training_steps(a: dict) -> int | None:
    """What Trainer.train passes to trainer_config_finalize, when the YAML alone decides it (max_steps)."""
    steps = a.get("max_steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None


def _warmup_steps(a: dict, total: int | None) -> int | None:
    """TrainingArguments.get_warmup_steps(num_training_steps), or None when it needs the dataset's length."""
    w = a.get("warmup_ratio") if a.get("warmup_ratio") is not None else a.get("warmup_steps", 0)
    if not isinstance(w, (int, float)) or isinstance(w, bool):
        return None
    if w >= 1:
        return int(w)
    return 0 if w == 0 else (math.ceil(total * w) if total is not None else None)


def trainer_mismatches(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    """transformers/integrations/deepspeed.py HfTrainerDeepSpeedConfig.fill_match, as
    trainer_config_process (TrainingArguments.__post_init__) and trainer_config_finalize
    (deepspeed_init) call it for clipping, optimizer, scheduler and precision: a value that is not
    "auto" and differs from the Trainer's is listed, and the Trainer stops at train() with all of
    them. The batch keys are batch_arithmetic's."""
    if not rc.yaml_path or rc.ds is None:
        return []
    a = _trainer_args(rc)
    total = _num_training_steps(a)
    pairs = [("gradient_clipping", a["max_grad_norm"], "max_grad_norm"),
             ("optimizer.params.lr", a["learning_rate"], "learning_rate"),
             ("optimizer.params.betas", [a["adam_beta1"], a["adam_beta2"]], "adam_beta1+adam_beta2"),
             ("optimizer.params.eps", a["adam_epsilon"], "adam_epsilon"),
             ("optimizer.params.weight_decay", a["weight_decay"], "weight_decay"),
             ("scheduler.params.warmup_max_lr", a["learning_rate"], "learning_rate"),
             ("fp16.enabled", bool(a.get("fp16") or a.get("fp16_full_eval")), "fp16|fp16_full_eval"),
             ("bf16.enabled", bool(a.get("bf16") or a.get("bf16_full_eval")), "bf16|bf16_full_eval"),
             ("scheduler.params.total_num_steps", total, "num_training_steps (calculated)"),
             ("scheduler.params.warmup_num_steps", _warmup_steps(a, total), "warmup_steps")]
    lines, wrong, unknown = [], [], []
    for ds_key, hf_val, hf_key in pairs:
        ds_val = _get(rc.ds, ds_key)
        if ds_val is None or ds_val == "auto":
            continue
        if hf_val is None:
            unknown.append(ds_key)
        elif ds_val != hf_val:
            lines.append(f"- ds {ds_key}={ds_val} vs hf {hf_key}={hf_val}")
            wrong.append(ds_key)
    out = []
    if lines:
        note = (" (pure_bf16 is LLaMA-Factory's own flag: the Trainer's bf16 stays false)"
                if a.get("pure_bf16") is True and any("bf16.enabled" in l for l in lines) else "")
        out.append(Problem(codes.DS_HF_MISMATCH, "the HF Trainer stops at train() (trainer_config_finalize): \""
                           + TRAINER_MISMATCH.format(lines="\n".join(lines)) + f"\"{note}",
                           "Set these keys to \"auto\" in the DeepSpeed JSON (the Trainer fills them from the YAML), "
                           "or make the YAML say the same values.", "fail", _to_auto(wrong), list(wrong), safe=True))
    if unknown:
        out.append(Problem(codes.DS_HF_MISMATCH, f"{', '.join(unknown)} fixed in the DeepSpeed JSON: the Trainer checks "
                           "them against the steps it computes from the dataset's length (num_train_epochs × steps per "
                           "epoch) and stops when they differ, which a number written by hand rarely matches",
                           "Set them to \"auto\", or give max_steps in the YAML and the matching numbers.", "warn",
                           _to_auto(unknown), list(unknown), safe=True))
    return out


def _to_auto(paths: list[str]) -> Callable[[dict], None]:
    """The safe repair of a YAML + JSON disagreement: "auto" there, which the HF Trainer fills from
    the TrainingArguments (trainer_config_process / trainer_config_finalize), so the run keeps the
    YAML's values, the ones LLaMA-Factory's parser and the Trainer already use."""
    return _fill(dict.fromkeys(paths, "auto"))



def accelerate_checks(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    """accelerate/utils/dataclasses.py DeepSpeedPlugin.__post_init__ (built in TrainingArguments'
    __post_init__: the JSON needs zero_optimization) and set_mixed_precision (called when the
    Trainer builds its Accelerator: the YAML's precision may not meet the other one enabled in the
    JSON)."""
    if not rc.yaml_path or rc.ds is None:
        return []
    out = []
    if "zero_optimization" not in rc.ds:
        out.append(Problem(codes.DS_NO_ZERO_SECTION, "the DeepSpeed JSON has no zero_optimization section: accelerate "
                           "stops while the arguments are parsed with \"Please specify the ZeRO optimization config in "
                           "the DeepSpeed config.\" (DeepSpeedPlugin.__post_init__)",
                           "Add \"zero_optimization\": {\"stage\": 0} (or 2/3; LLaMA-Factory's examples/deepspeed/"
                           "ds_z0_config.json), or drop the deepspeed: key for plain DDP."))
    a = _trainer_args(rc)
    mixed = "fp16" if a.get("fp16") is True else "bf16" if a.get("bf16") is True else "no"
    other = {"fp16": "bf16", "bf16": "fp16"}.get(mixed)
    enabled = _get(rc.ds, f"{other}.enabled") if other else None
    if other and str(enabled).lower() == "true":
        out.append(Problem(codes.DS_MIXED_PRECISION, f"the YAML trains in {mixed} and the DeepSpeed JSON enables {other}: "
                           f"the Trainer stops when it builds its Accelerator with \"`--mixed_precision` arg cannot be set "
                           f"to `{mixed}` when `{other}` is set in the DeepSpeed config file.\" (accelerate "
                           "DeepSpeedPlugin.set_mixed_precision)",
                           f"Set \"{other}\": {{\"enabled\": \"auto\"}} and \"{mixed}\": {{\"enabled\": \"auto\"}} in the "
                           "JSON (the Trainer takes the YAML's precision), or change the YAML.", "fail",
                           _to_auto([f"{other}.enabled", f"{mixed}.enabled"]), [f"{other}.enabled", f"{mixed}.enabled"],
                           safe=True))
    return out


RULES = (auto_values, batch_arithmetic, precision, zero_sections, yaml_rules, accelerate_checks, trainer_mismatches)


def check(rc: RunConfig, world: int, gpu_bf16: bool | None) -> list[Problem]:
    out = []
    for rule in RULES:
        if rule is yaml_rules or rc.ds is not None:
            out += rule(rc, world, gpu_bf16)
    for p in out:
        _say_repair(p, rc)
    return out


def _say_repair(p: Problem, rc: RunConfig) -> None:
    """A repair that `fix` cannot write (the DeepSpeed config inline in the YAML) is none; the fix
    text says how `mgft-doctor fix` repairs the others, so check and fix tell the same story."""
    if p.repair is not None and p.target == "deepspeed" and rc.ds_inline:
        p.repair = None
    if p.repair is None or "mgft-doctor fix" in p.fix:
        return
    name = rc.yaml_path or rc.ds_path or "CONFIG"
    how = f"mgft-doctor fix {name}" if p.safe else f"mgft-doctor fix --unsafe {name}"
    p.fix = f"{p.fix} [{p.label} repair: {how}]"


@dataclass
class Repairs:
    """What `fix` does with a run config: the repaired copies, and every problem sorted by what
    happens to it (applied; held back as unsafe; no automatic repair)."""

    deepspeed: dict | None
    yaml: dict
    applied: list[Problem] = field(default_factory=list)
    held_back: list[Problem] = field(default_factory=list)
    manual: list[Problem] = field(default_factory=list)


def plan_repairs(rc: RunConfig, world: int, gpu_bf16: bool | None, unsafe: bool = False) -> Repairs:
    """The repairs of check()'s problems: the safe ones, and the unsafe ones with unsafe=True."""
    plan = Repairs(copy.deepcopy(rc.ds) if rc.ds is not None else None, copy.deepcopy(rc.yaml))
    for p in check(rc, world, gpu_bf16):
        if p.repair is None or (p.target == "deepspeed" and plan.deepspeed is None):
            plan.manual.append(p)
        elif not (p.safe or unsafe):
            plan.held_back.append(p)
        else:
            p.repair(plan.deepspeed if p.target == "deepspeed" else plan.yaml)
            plan.applied.append(p)
    return plan


def repaired(rc: RunConfig, world: int, gpu_bf16: bool | None, unsafe: bool = True) -> tuple[dict, list[Problem]]:
    """A repaired copy of the DeepSpeed dict and the problems whose repair was applied."""
    plan = plan_repairs(rc, world, gpu_bf16, unsafe)
    return plan.deepspeed or {}, [p for p in plan.applied if p.target == "deepspeed"]
