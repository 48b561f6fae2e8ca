"""config.memory's estimate held against measured peaks.

For a model built from a config (Qwen2.5-0.5B's: 494 M parameters, a 151,936-token vocabulary):
full fine-tuning and LoRA (rank 8 on every linear layer, as lora_target: all; QLoRA too where
bitsandbytes imports), each under ZeRO-0, ZeRO-2, ZeRO-2 + optimizer offload, ZeRO-3, ZeRO-3 +
optimizer offload and ZeRO-3 + optimizer and parameter offload. Each row is a real few-step
DeepSpeed run in a fresh process on every rank (torchrun through mgft_doctor.launch), set up as
LLaMA-Factory sets up the HF Trainer: bf16 weights with DeepSpeed's bf16, gradient checkpointing
(reentrant, inputs requiring grad), SDPA attention, LoRA's trainable weights in fp32, torch's
AdamW as the client optimizer (DeepSpeedCPUAdam under optimizer offload, as accelerate maps it).
Measured per rank: torch.cuda.memory_allocated between steps (the model states that persist),
max_memory_allocated (the peak), max_memory_reserved. Estimated: doctor/runconfig/memory.py's
model_states (params, grads, Adam) and activations (activations and logits), the CUDA overhead
left out (max_memory_allocated does not see the context or the allocator's slack).

On a GPU machine (one H200: one rank; every visible GPU with --nproc N):
    PYTHONPATH=/tmp/site python3 bench/memory_vs_measured.py --out memory.json
On a CPU machine the same rows run in a reduced form (a tiny model, two gloo ranks, RSS instead of
CUDA memory: not comparable with the estimate, only proof that the script works):
    python bench/memory_vs_measured.py --out /tmp/memory_cpu.json
Prints a table; writes JSON (rows with every term, estimate and measurement)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

GiB = 1 << 30
QWEN25_05B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
              "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
              "tie_word_embeddings": True, "vocab_size": 151936, "hidden_act": "silu", "attention_dropout": 0.0,
              "bos_token_id": 151643, "eos_token_id": 151643, "use_cache": False}
TINY = {**QWEN25_05B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512}
SETUPS = ((0, "none"), (2, "none"), (2, "optimizer"), (3, "none"), (3, "optimizer"), (3, "optimizer+params"))
LORA_RANK = 8
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STEPS = 3
TARGET = 0.15  # issue 10: within 15% on each row


# ---- the rank side: one row's real run ------------------------------------------------------------

def ds_config(stage: int, offload: str, micro: int, on_gpu: bool) -> dict:
    """A DeepSpeed config as LLaMA-Factory's examples hold it once the HF Trainer filled the "auto"s."""
    zero = {"stage": stage, "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        zero.update({"stage3_gather_16bit_weights_on_model_save": True, "stage3_max_live_parameters": 1e9,
                     "stage3_max_reuse_distance": 1e9, "sub_group_size": 1e9})
    if offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_allow_untested_optimizer": True, "bf16": {"enabled": on_gpu}, "zero_optimization": zero,
            "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}


def _quantized(config, dtype, stage: int, ds: dict, on_gpu: bool, outdir: str):
    """(model, the HfDeepSpeedConfig that ZeRO-3 loads it under, else None): a 4-bit model as
    LLaMA-Factory loads one for QLoRA: nf4, double quantization, the compute dtype as quant storage
    (what lets ZeRO-3 partition it), the whole model on this rank's GPU unless ZeRO-3."""
    import torch
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    ckpt = os.path.join(outdir, f"bf16-checkpoint-{os.environ.get('RANK', '0')}")  # one per rank: no race
    transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(ckpt)
    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_type="nf4", bnb_4bit_quant_storage=dtype)
    kwargs = {"quantization_config": quant, "dtype": dtype, "attn_implementation": "sdpa"}
    keep = HfDeepSpeedConfig(ds) if stage == 3 else None
    if stage != 3:
        kwargs["device_map"] = {"": torch.cuda.current_device() if on_gpu else "cpu"}
    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, **kwargs), keep


def build_model(row: dict, cfg: dict, ds: dict, on_gpu: bool, outdir: str = ""):
    """The model as LLaMA-Factory loads it for training (bf16, SDPA, checkpointing, LoRA in fp32)."""
    import torch
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    config = transformers.Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    torch.manual_seed(0)
    if row["method"] == "qlora":  # bitsandbytes quantizes while loading weights: save a checkpoint, load it
        model, keep = _quantized(config, dtype, row["stage"], ds, on_gpu, outdir)
    else:
        keep = HfDeepSpeedConfig(ds) if row["stage"] == 3 else None  # zero.Init for from_config, as from_pretrained
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    if row["method"] in ("lora", "qlora"):
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK,
                                                           target_modules=LORA_TARGETS, lora_dropout=0.0))
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.float32)  # LLaMA-Factory upcasts the trainable weights
    return model, keep


def run_row(w) -> dict:
    import deepspeed
    import torch

    row, on_gpu = w.args["row"], w.args["on_gpu"]
    if on_gpu:
        torch.cuda.set_device(w.local_rank)
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    ds = ds_config(row["stage"], row["offload"], row["micro"], on_gpu)
    model, keep = build_model(row, w.args["config"], ds, on_gpu, w.outdir)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if row["offload"] != "none":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam(trainable, lr=1e-5)
    else:
        opt = torch.optim.AdamW(trainable, lr=1e-5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    device = engine.device
    g = torch.Generator().manual_seed(w.rank)
    vocab = w.args["config"]["vocab_size"]
    states, times = [], []
    for _ in range(STEPS):
        ids = torch.randint(0, vocab, (row["micro"], row["seq"]), generator=g).to(device)
        t0 = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        states.append(torch.cuda.memory_allocated() if on_gpu else 0)
    return _measured(model, trainable, states, times, on_gpu, keep)


def _measured(model, trainable, states, times, on_gpu, keep) -> dict:
    import resource

    import torch

    count = lambda ps: sum(getattr(p, "ds_numel", p.numel()) for p in ps)  # noqa: E731 - ZeRO-3 partitions
    out = {"params": count(model.parameters()), "trainable": count(trainable), "step_s": [round(t, 3) for t in times],
           "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if on_gpu:
        out.update({"states_bytes": states[-1], "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                    "peak_reserved_bytes": torch.cuda.max_memory_reserved()})
    del keep
    return out


def rank_main() -> None:
    sys.path.insert(0, _workers_dir())
    from _protocol import Worker  # the doctor's rank-side protocol: result-<rank>.json, phases

    w = Worker()
    w.run(run_row)


def _workers_dir() -> str:
    """The checkout's probes/workers, else the installed package's."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probes", "workers")
    if os.path.isfile(os.path.join(here, "_protocol.py")):
        return here
    from mgft_doctor.launch import workers_dir

    return str(workers_dir())


# ---- the doctor side: rows, estimates, the table -----------------------------------------------------

def estimate(row: dict, cfg: dict, world: int) -> dict:
    from mgft_doctor.runconfig import memory as me

    shape = me.shape_from_config(cfg)
    lora = LORA_RANK if row["method"] in ("lora", "qlora") else None
    quant = me.quantization_of({"quantization_bit": 4, "quantization_method": "bnb"}, cfg) \
        if row["method"] == "qlora" else None
    gpu, host = me.model_states(shape, row["stage"], row["offload"], world, world, lora, quant)
    act = me.activations(shape, row["micro"], row["seq"], True, True, me.is_bnb_4bit(quant))
    return {"states_bytes": gpu, "activations_bytes": act, "host_bytes": host, "total_bytes": gpu + act,
            "with_overhead_bytes": gpu + act + me.CUDA_OVERHEAD, "params": shape.total_params}


def rows_for(methods: list[str], micro: int, seq: int) -> list[dict]:
    return [{"method": m, "stage": s, "offload": o, "micro": micro, "seq": seq} for m in methods for s, o in SETUPS]


def measure(row: dict, cfg: dict, nproc: int, on_gpu: bool, timeout: float, cache: str) -> dict:
    from mgft_doctor.launch.torchrun import launch

    env = {"TORCH_EXTENSIONS_DIR": os.path.join(cache, "torch_extensions"), "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if not on_gpu:
        env.update({"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"})
    res = launch(os.path.abspath(__file__), nproc=nproc, timeout=timeout, python=sys.executable,
                 args={"row": row, "config": cfg, "on_gpu": on_gpu}, env=env)
    ranks = {r: o.result for r, o in res.ranks.items() if o.result}
    ok = ranks and all(r.get("ok") for r in ranks.values()) and len(ranks) == nproc
    if not ok:
        err = next((f"{r.get('error_type')}: {r.get('error', '')[:300]}" for r in ranks.values() if not r.get("ok")),
                   "timed out" if res.timed_out else f"exit code {res.returncode}")
        return {"error": err, "log_tail": res.log[-3000:], "wall_s": round(res.wall_s, 1)}
    return {"ranks": {str(r): v for r, v in sorted(ranks.items())}, "wall_s": round(res.wall_s, 1)}


def compare(row: dict, est: dict, meas: dict, on_gpu: bool) -> dict:
    """The row's figures; on a GPU the worst rank against the estimate, and which term is off."""
    out = {**row, "estimate": est, "measured": meas}
    if "error" in meas or not on_gpu:
        return out
    worst = max(meas["ranks"].values(), key=lambda r: r["peak_allocated_bytes"])
    peak, states = worst["peak_allocated_bytes"], worst["states_bytes"]
    transient = peak - states
    out.update({"rel_error": (est["total_bytes"] - peak) / peak,
                "states_error": (est["states_bytes"] - states) / states if states else None,
                "activations_error": (est["activations_bytes"] - transient) / transient if transient > 0 else None})
    out["off"] = _which_term(out)
    return out


def _which_term(r: dict) -> str:
    if abs(r["rel_error"]) <= TARGET:
        return ""
    terms = {"model states": r.get("states_error"), "activations+logits": r.get("activations_error")}
    bad = {k: v for k, v in terms.items() if v is not None}
    if not bad:
        return "?"
    name = max(bad, key=lambda k: abs(bad[k]))
    return f"{name} {bad[name]:+.0%}"


def print_table(results: list[dict], on_gpu: bool, header: bool = True) -> None:
    unit = "GiB peak allocated" if on_gpu else "GiB peak RSS (CPU: not comparable)"
    if header:
        print(f"\n{'method':6} {'ZeRO':>4} {'offload':17} {'est states':>10} {'meas states':>11} {'est act':>8} "
              f"{'meas act':>8} {'estimate':>8} {'measured':>8} {'error':>7}  {unit}; term off")
    for r in results:
        e, m = r["estimate"], r["measured"]
        head = f"{r['method']:6} {r['stage']:>4} {r['offload']:17}"
        if "error" in m:
            print(f"{head} failed: {m['error'][:120]}")
            continue
        worst = max(m["ranks"].values(), key=lambda x: x.get("peak_allocated_bytes", x["max_rss_bytes"]))
        if on_gpu:
            print(f"{head} {e['states_bytes'] / GiB:10.2f} {worst['states_bytes'] / GiB:11.2f} "
                  f"{e['activations_bytes'] / GiB:8.2f} {(worst['peak_allocated_bytes'] - worst['states_bytes']) / GiB:8.2f} "
                  f"{e['total_bytes'] / GiB:8.2f} {worst['peak_allocated_bytes'] / GiB:8.2f} {r['rel_error']:+7.1%}  {r['off']}")
        else:
            mib = 1 << 20  # the CPU model is tiny: MiB
            print(f"{head} {e['states_bytes'] / mib:9.1f}M {'-':>11} {e['activations_bytes'] / mib:7.1f}M {'-':>8} "
                  f"{e['total_bytes'] / mib:7.1f}M {worst['max_rss_bytes'] / GiB:7.2f}G {'-':>7}")


def methods_here(on_gpu: bool) -> tuple[list[str], str]:
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return ["full", "lora"], "QLoRA not run: bitsandbytes is not installed"
    return ["full", "lora", "qlora"], ""  # bitsandbytes >= 0.46 quantizes on the CPU too


def gpu_count() -> int:
    """GPUs torch sees, asked in a subprocess (this process never initialises CUDA)."""
    import subprocess

    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
        return int(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--nproc", type=int, default=None, help="ranks per row (default: 1 on a GPU machine, 2 on CPU)")
    ap.add_argument("--micro", type=int, default=2, help="micro-batch per rank (default 2)")
    ap.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    ap.add_argument("--methods", default="", help="only these methods, e.g. 'full' or 'lora,qlora'")
    ap.add_argument("--only", default="", help="rows to run, e.g. 'full:3:none,lora:0:none'")
    ap.add_argument("--timeout", type=float, default=300.0, help="time limit per row, seconds (default 300)")
    a = ap.parse_args(argv)
    gpus = gpu_count()
    on_gpu = gpus > 0
    nproc = a.nproc or (1 if on_gpu else 2)
    cfg = QWEN25_05B if on_gpu else TINY
    micro, seq = (a.micro, a.seq) if on_gpu else (1, 64)
    methods, note = methods_here(on_gpu)
    if a.methods:
        methods = [m for m in methods if m in a.methods.split(",")]
    rows = rows_for(methods, micro, seq)
    if a.only:
        want = {tuple(x.split(":")) for x in a.only.split(",")}
        rows = [r for r in rows if (r["method"], str(r["stage"]), r["offload"]) in want]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "mgft-doctor")
    print(f"{'GPU' if on_gpu else 'CPU'}: {nproc} rank(s) per row, model {cfg['hidden_size']}x{cfg['num_hidden_layers']} "
          f"vocab {cfg['vocab_size']}, micro-batch {micro}, sequence {seq}" + (f"; {note}" if note else ""), flush=True)
    results = []
    for row in rows:  # each row's figures printed and written as soon as it ends: a run cut short keeps them
        t0 = time.perf_counter()
        meas = measure(row, cfg, nproc, on_gpu, a.timeout, cache)
        results.append(compare(row, estimate(row, cfg, nproc), meas, on_gpu))
        print(f"  {row['method']} ZeRO-{row['stage']} offload {row['offload']}: {time.perf_counter() - t0:.0f} s"
              + (f" FAILED {meas['error'][:200]}" if "error" in meas else ""), flush=True)
        print_table(results[-1:], on_gpu, header=False)
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                json.dump({"on_gpu": on_gpu, "nproc": nproc, "config": cfg, "note": note, "rows": results}, f, indent=1)
    print_table(results, on_gpu)
    return 0 if all("error" not in r["measured"] for r in results) else 1


if __name__ == "__main__":
    if "--outdir" in sys.argv:  # started by torchrun for one row (mgft_doctor.launch.torchrun)
        rank_main()
    else:
        sys.exit(main())
