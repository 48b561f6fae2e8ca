"""rehearsal.run: the user's own LLaMA-Factory run in miniature, through the real
`llamafactory-cli train` with FORCE_TORCHRUN=1 on this machine's ranks (one per GPU; two gloo
ranks without one). The same YAML — stage, finetuning type, template, DeepSpeed JSON,
accumulation, LoRA settings and targets, packing, precision where the hardware has it — with the
model shrunk from its config.json, the user's tokenizer when it is local, the first samples of
the user's own dataset when it is local (else synthetic samples in its declared format), three
steps and a save, all in a temporary folder (probes/workers/rehearse.py builds it). What would
fail in hour three fails here in a minute: a failed rehearsal's log goes through explain; a
passed one reports steps/s and each rank's peak memory (a sitecustomize of the doctor's own on
the ranks' PYTHONPATH records it at exit: probes/workers/_peaks_site.py).

Runs only when asked (`--rehearse`): it takes a minute or more."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from mgft_doctor.check.context import Context
from mgft_doctor.check.facts import cpu_has_bf16
from mgft_doctor.check.launch_findings import explain_log
from mgft_doctor.check.probe import Finding, Probe, Status, skip, verdict
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.processes import TOKEN_VAR, free_port, run_limited
from mgft_doctor.launch.script import run_script
from mgft_doctor.text import GiB, one_line

from . import _codes

ID, TITLE = "rehearsal.run", "Your LLaMA-Factory run in miniature (real llamafactory-cli train, a few steps, a save)"
STAGES = ("pt", "sft", "rm", "dpo", "kto")
LOG_READ = 4_000_000  # the tail of the rehearsal's log that explain reads
CPU_RANKS = 2
BUILD_LINES = ("Building extension module", "Using /", "torch_extensions")


def applies(ctx: Context) -> str | None:
    """Only when asked, for a LLaMA-Factory train YAML whose model config.json can be read."""
    if not getattr(ctx.options, "rehearse", False):
        return "not asked for: add --rehearse (a real miniature run, a minute or more)"
    rc = ctx.run_config
    if rc is None or not rc.yaml_path:
        return "needs a LLaMA-Factory train YAML (mgft-doctor check train.yaml --rehearse)"
    stage = str(rc.get("stage", "sft"))
    if stage not in STAGES:
        return f"stage {stage} is not rehearsed (it needs a reward model of its own); rehearsed: {', '.join(STAGES)}"
    if rc.get("do_train") is False:
        return "the YAML does not train (do_train: false)"
    if rc.ds_error:
        return f"{rc.ds_error} (config.deepspeed reports it)"
    if not rc.model:
        return "no model_name_or_path in the YAML"
    cfg, where = rc.model_config
    if cfg is None:
        return f"cannot read the model's config.json: {where}"
    if "torch" not in ctx.facts.raw:
        return "torch is not importable in the examined Python (gpu.visible reports it)"
    return None


def dataset_dir(rc) -> str | None:
    """The user's dataset_dir as a local folder: LLaMA-Factory reads it from the directory it is
    started in (the doctor tries that, then the YAML's folder and its parents), or None."""
    ref = str(rc.get("dataset_dir", "data"))
    if ref == "ONLINE" or ref.startswith("REMOTE:"):
        return None
    if os.path.isabs(ref):
        return ref if os.path.isdir(ref) else None
    base = Path(rc.yaml_path).resolve().parent
    for folder in (Path.cwd(), base, *base.parents):
        if (folder / ref).is_dir():
            return str((folder / ref).resolve())
    return None


def ranks_here(ctx: Context) -> tuple[int, str]:
    """(ranks, backend): one per GPU on NCCL, two gloo ranks without one; --nproc decides when given."""
    if ctx.use_gpus:
        return ctx.options.nproc or ctx.facts.gpu_count, "nccl"
    return ctx.options.nproc or CPU_RANKS, "gloo"


def run(ctx: Context):
    rc = ctx.run_config
    nproc, backend = ranks_here(ctx)
    on_gpu = backend == "nccl"
    folder = tempfile.mkdtemp(prefix="mgft-doctor-rehearsal-")
    try:
        t0 = time.perf_counter()
        prep = prepare(ctx, folder, on_gpu)
        if prep.get("verdict") is not None:
            return prep["verdict"]
        prep["prepare_s"] = time.perf_counter() - t0
        res = run_llamafactory(ctx, folder, prep, nproc, on_gpu)
        return judge(res, prep, nproc, backend, rc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- building the miniature ---------------------------------------------------------------------

def prepare(ctx: Context, folder: str, on_gpu: bool) -> dict:
    """The miniature, built by the rehearse worker in the examined Python; a 'verdict' when it
    could not be built."""
    rc, o = ctx.run_config, ctx.options
    cfg, where = rc.model_config
    local = not where.startswith("hub:")
    model_dir = os.path.dirname(os.path.abspath(where)) if local else None
    bf16_ok = all(d.get("bf16") for d in ctx.facts.devices) if on_gpu else cpu_has_bf16()
    args = {"folder": folder, "yaml": rc.yaml, "yaml_path": os.path.abspath(rc.yaml_path), "config_dict": cfg,
            "model_dir": model_dir, "use_tokenizer": local, "trust_remote_code": bool(o.trust_remote_code),
            "dataset_dir": dataset_dir(rc), "ds": rc.ds, "on_gpu": on_gpu, "bf16_ok": bf16_ok}
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HOME": os.path.join(folder, "hf"), "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu",
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    sr = run_script(o.python, worker_script("rehearse"), args, timeout=o.timeout, env=env, cwd=folder)
    payload = sr.payload or {}
    details = [f"model: {where}"]
    if payload.get("ok"):
        return payload
    if sr.timed_out or not payload:
        why = f"did not finish within {o.timeout:.0f} s" if sr.timed_out else f"stopped (exit code {sr.returncode})"
        tail = [ln for ln in sr.log.strip().splitlines()[-12:]]
        return {"verdict": verdict(f"not rehearsed: building the miniature {why}", [], {},
                                   details + ["worker log (tail):", *("  " + ln[:300] for ln in tail)],
                                   status=Status.WARN)}
    return {"verdict": _prep_failure(payload, details)}


def _prep_failure(payload: dict, details: list[str]):
    step, err = payload.get("step"), f"{payload.get('error_type')}: {payload.get('error', '')}"
    details = details + [f"failed in '{step}': {one_line(err, 600)}", "traceback (tail):",
                         *("  " + ln for ln in (payload.get("traceback") or "").strip().splitlines()[-10:])]
    if step in ("find_tools", "import_torch"):
        return skip(f"LLaMA-Factory cannot run in the examined Python ({one_line(err, 200)}); versions.compat "
                    "reports the stack", details=details)
    if step == "processor":
        return skip(f"{payload.get('error', '')}; point model_name_or_path at the local folder "
                    "that holds them", details=details)
    if step == "build_model" and ("trust_remote_code" in err or "custom code" in err.lower()):
        return skip("the model needs its own Python code (auto_map): rerun with --trust-remote-code", details=details)
    return verdict(f"not rehearsed: the miniature could not be built in '{step}' ({one_line(err, 200)})", [], {},
                   details, status=Status.WARN)


# ---- running it ---------------------------------------------------------------------------------

def rehearsal_env(ctx: Context, folder: str, prep: dict, nproc: int, on_gpu: bool, token: str) -> dict:
    """The environment of the real run: LLaMA-Factory's own launcher variables, every cache and
    download in the rehearsal's folder (offline), the doctor's sitecustomize first on PYTHONPATH
    and the process token (it reaches torchrun and every rank: LLaMA-Factory passes os.environ on)."""
    tools = prep["tools"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("USE_RAY", "RDZV_ID", "MIN_NNODES", "MAX_NNODES", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    bins = list(dict.fromkeys([os.path.dirname(tools["cli"]), os.path.dirname(tools["torchrun"])]))
    site = os.path.join(folder, "site")
    os.makedirs(site, exist_ok=True)
    shutil.copyfile(worker_script("_peaks_site"), os.path.join(site, "sitecustomize.py"))
    os.makedirs(os.path.join(folder, "peaks"), exist_ok=True)
    env.update({"PATH": os.pathsep.join(bins + [env.get("PATH", "")]), "FORCE_TORCHRUN": "1",
                "NPROC_PER_NODE": str(nproc), "NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "HF_HOME": os.path.join(folder, "hf"), "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1", "MGFT_DOCTOR_PEAKS": os.path.join(folder, "peaks"), TOKEN_VAR: token,
                "PYTHONPATH": os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)})
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ctx.options.cache_dir, "torch_extensions"))
    if not on_gpu:
        env.update({"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"})
    return env


def run_llamafactory(ctx: Context, folder: str, prep: dict, nproc: int, on_gpu: bool) -> dict:
    """`llamafactory-cli train rehearsal.yaml` under the doctor's time limit, the whole process
    tree killed by token when it ends or runs over."""
    token = uuid.uuid4().hex
    env = rehearsal_env(ctx, folder, prep, nproc, on_gpu, token)
    cmd = [prep["tools"]["cli"], "train", prep["yaml_path"]]
    log_path = os.path.join(folder, "rehearsal.log")
    with open(log_path, "wb") as log:
        code, timed_out, wall, leftover = run_limited(cmd, env, folder, ctx.options.timeout, token, log,
                                                      orphan_dirs=(folder,), tmpdir=os.path.join(folder, "tmp"))
    with open(log_path, "rb") as f:
        f.seek(max(0, os.path.getsize(log_path) - LOG_READ))
        text = f.read().decode("utf-8", "replace")
    out = os.path.join(folder, "out")
    return {"command": cmd, "returncode": code, "timed_out": timed_out, "wall_s": wall, "leftover": leftover,
            "log": text, "token": token, "peaks": read_peaks(os.path.join(folder, "peaks")),
            "results": _read_json(os.path.join(out, "all_results.json")), "steps": _trainer_log(out),
            "saved": saved_files(out)}


def read_peaks(folder: str) -> dict[int, dict]:
    """rank -> the peaks its process recorded at exit (the largest, should a rank have several)."""
    peaks: dict[int, dict] = {}
    for p in sorted(Path(folder).glob("peak-rank*.json")):
        rec = _read_json(str(p))
        if rec is None:
            continue
        rank = rec.get("rank")
        if rank not in peaks or rec.get("max_rss_bytes", 0) > peaks[rank].get("max_rss_bytes", 0):
            peaks[rank] = rec
    return peaks


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _trainer_log(out: str) -> list[dict]:
    rows = []
    try:
        with open(os.path.join(out, "trainer_log.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        pass
    return rows


def safetensors_tensors(path: str) -> tuple[int, int]:
    """(tensors, empty tensors) in a .safetensors file, from its header alone."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(min(n, 100_000_000)))
    shapes = [v.get("shape") for k, v in header.items() if k != "__metadata__"]
    return len(shapes), sum(1 for s in shapes if s is not None and 0 in s)


def saved_files(out: str) -> dict:
    """What the run saved: the final weights (tensors, empty ones) and the checkpoint folders."""
    if not os.path.isdir(out):
        return {}
    weights = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    tensors = empty = 0
    for w in weights:
        try:
            t, e = safetensors_tensors(os.path.join(out, w))
        except (OSError, ValueError):
            continue
        tensors, empty = tensors + t, empty + e
    checkpoints = sorted(f for f in os.listdir(out) if f.startswith("checkpoint-"))
    return {"weights": weights, "tensors": tensors, "empty": empty, "checkpoints": checkpoints,
            "bytes": sum(os.path.getsize(os.path.join(out, w)) for w in weights)}


# ---- the verdict ----------------------------------------------------------------------------------

def what_ran(rc, prep: dict, nproc: int, backend: str) -> str:
    y = rc.yaml
    zero = f"ZeRO-{rc.zero_stage}" if rc.ds is not None else "no DeepSpeed"
    return (f"{y.get('stage', 'sft')}/{y.get('finetuning_type', 'lora')} {(prep.get('model') or {}).get('model_type')}"
            f" ({zero}) on {nproc} {backend} rank{'s' if nproc > 1 else ''}")


def judge(res: dict, prep: dict, nproc: int, backend: str, rc):
    details = _describe(res, prep)
    metrics = {"backend": backend, "world_size": nproc, "wall_s": round(res["wall_s"], 1),
               "prepare_s": round(prep.get("prepare_s", 0.0), 1), "shrunk_params": (prep.get("model") or {}).get("params")}
    metrics.update(_peak_metrics(res["peaks"]))
    ran = what_ran(rc, prep, nproc, backend)
    if res["timed_out"]:
        return verdict(f"{ran}: the rehearsal did not finish within {res['wall_s']:.0f} s", [_timeout_finding(res)],
                       metrics, details + _log_tail(res["log"]), status=Status.FAIL)
    if res["returncode"] != 0:
        finding, more = failure_finding(res["log"], res["returncode"])
        return verdict(f"{ran}: the rehearsal failed", [finding], metrics, details + more + _log_tail(res["log"]),
                       status=Status.FAIL)
    return _passed(res, ran, metrics, details)


def _passed(res: dict, ran: str, metrics: dict, details: list[str]):
    results = res["results"] or {}
    steps = [r for r in res["steps"] if "loss" in r]
    saved = res["saved"]
    findings = []
    metrics.update({"steps": len(steps), "steps_per_s": results.get("train_steps_per_second"),
                    "train_runtime_s": results.get("train_runtime"), "saved_bytes": saved.get("bytes")})
    if steps:
        metrics["losses"] = [round(float(r["loss"]), 4) for r in steps]
    if saved.get("empty"):
        findings.append(Finding(_codes.ZERO3_EMPTY_SAVE, f"the rehearsal's final save holds {saved['empty']} empty "
                                f"tensors of {saved['tensors']} (torch.Size([0]) ZeRO-3 partitions): your run would "
                                "save an empty model/adapter", "Set \"stage3_gather_16bit_weights_on_model_save\": true "
                                "under zero_optimization, or rebuild the weights with zero_to_fp32.py."))
    if not results:
        return verdict(f"{ran}: llamafactory-cli exited 0 without training results", findings, metrics, details,
                       status=Status.WARN)
    mem = _peak_text(res["peaks"])
    saved_text = f"saved ({', '.join(saved.get('checkpoints') or []) or 'final weights'})" if saved.get("weights") \
        else "nothing saved"
    sps = results.get("train_steps_per_second")
    summary = (f"{ran}: {len(steps)} steps" + (f" at {float(sps):.2f} steps/s" if sps is not None else "")
               + f", {saved_text}" + (f"; peak {mem} per rank" if mem else "")
               + f"; {res['wall_s']:.0f} s (+{metrics['prepare_s']:.0f} s building it)")
    return verdict(summary, findings, metrics, details)


def failure_finding(log: str, returncode) -> tuple[Finding, list[str]]:
    """The rehearsal's log explained as a training log is: the top diagnosis's code and fix, or
    the root error with explain's next steps when nothing known matched."""
    report = explain_log(log) if log.strip() else None
    phase = f" during {report.phase.name}" if report is not None and report.phase else ""
    root = one_line(report.root_error.text, 300) if report is not None and report.root_error else ""
    if report is not None and report.diagnoses:
        d = report.diagnoses[0]
        more = [f"explain: {d.code} {d.title}", *(f"  fix: {f}" for f in d.fixes[1:3])]
        return Finding(d.code, f"the rehearsal failed{phase}: {d.title}" + (f" ({root})" if root else ""),
                       d.fixes[0] if d.fixes else "See `mgft-doctor codes " + d.code + "`."), more
    steps = list(report.advice.next_steps) if report is not None and report.advice else []
    message = f"the rehearsal failed{phase}: " + (root or f"llamafactory-cli exited with code {returncode}")
    fix = steps[0] if steps else "Read the rehearsal's log tail (mgft-doctor check -v)."
    return Finding(_codes.RANK_DIED, message, fix), [f"next: {s}" for s in steps[1:4]]


def _timeout_finding(res: dict) -> Finding:
    tail = res["log"][-20_000:]
    building = any(b in tail for b in BUILD_LINES) and "Training completed" not in tail and "loss" not in tail
    if building:
        return Finding(_codes.OP_BUILD_HANG, f"the rehearsal was still building or waiting for a DeepSpeed op after "
                       f"{res['wall_s']:.0f} s", "The first CPU rehearsal builds DeepSpeed's shm_comm op (minutes on a "
                       "small machine): rerun with a larger --timeout; a stale lock in torch_extensions hangs forever "
                       "(remove the op's folder there).")
    return Finding(_codes.COLLECTIVE_HANG, f"the rehearsal did not finish within {res['wall_s']:.0f} s "
                   "(the whole process tree was stopped)", "Look where the log stops (-v); rerun with a larger "
                   "--timeout if it was still making progress; `mgft-doctor run -- llamafactory-cli train ...` shows "
                   "each rank's stack when a run hangs.")


def _peak_metrics(peaks: dict[int, dict]) -> dict:
    m = {"peak_rss_bytes": {str(r): p.get("max_rss_bytes") for r, p in sorted(peaks.items())}}
    cuda = {str(r): p["cuda_max_allocated"] for r, p in sorted(peaks.items()) if "cuda_max_allocated" in p}
    if cuda:
        m["peak_gpu_allocated_bytes"] = cuda
        m["peak_gpu_reserved_bytes"] = {str(r): p.get("cuda_max_reserved") for r, p in sorted(peaks.items())}
    return m


def _peak_text(peaks: dict[int, dict]) -> str:
    if not peaks:
        return ""
    if any("cuda_max_allocated" in p for p in peaks.values()):
        return "GPU " + "/".join(f"{p.get('cuda_max_allocated', 0) / GiB:.2f}" for _, p in sorted(peaks.items())) + " GiB"
    return "RSS " + "/".join(f"{p.get('max_rss_bytes', 0) / GiB:.2f}" for _, p in sorted(peaks.items())) + " GiB"


def _describe(res: dict, prep: dict) -> list[str]:
    model, tok = prep.get("model") or {}, prep.get("tokenizer") or {}
    lines = [f"command: {' '.join(res['command'])} (FORCE_TORCHRUN=1, in a temporary folder)",
             f"shrunk model: {model.get('class')} {model.get('params', 0):,} parameters, {model.get('dtype')}, "
             f"vocabulary {model.get('vocab_size')}",
             f"tokenizer: {'yours' if tok.get('kind') == 'yours' else 'a small byte-level BPE built here'} "
             f"({tok.get('class')}, {tok.get('len')} tokens)"]
    lines += [f"changed: {n}" for n in prep.get("notes") or []]
    if prep.get("shrink_notes"):
        lines.append("shrunk: " + "; ".join(prep["shrink_notes"][:16]))
    tokens = {p.get("token") for p in res["peaks"].values()}
    if res["peaks"]:
        lines.append("every rank carried the doctor's process token" if tokens == {res["token"]}
                     else "the doctor's process token did not reach every rank")
    for r, p in sorted(res["peaks"].items()):
        lines.append(f"rank {r}: peak RSS {p.get('max_rss_bytes', 0) / GiB:.2f} GiB"
                     + (f", GPU allocated {p['cuda_max_allocated'] / GiB:.2f} GiB (reserved "
                        f"{p.get('cuda_max_reserved', 0) / GiB:.2f})" if "cuda_max_allocated" in p else ""))
    losses = [r.get("loss") for r in res["steps"] if "loss" in r]
    if losses:
        lines.append("losses: " + ", ".join(f"{float(x):.4f}" for x in losses))
    if res["leftover"]:
        lines.append(f"{res['leftover']} process(es) outlived the run and were stopped")
    return lines


def _log_tail(log: str) -> list[str]:
    tail = [ln for ln in log.strip().splitlines() if ln.strip()][-25:]
    return ["rehearsal log (tail):", *("  " + ln[:300] for ln in tail)]


PROBE = Probe(ID, TITLE, run, slow=True, applies=applies, ranks=True,
              hint="a real llamafactory-cli train in miniature, a minute or more")
