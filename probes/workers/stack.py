"""The shared worker: one interpreter of the examined Python for what facts.py, ds_install.py and
ds_ops.py find each in a process of its own, so torch (seconds of CPU) and DeepSpeed are imported
once instead of once per probe. It answers in sections, in this order, each printed as soon as it
is known (one MARK line per section: {"section": NAME, "payload": what that worker alone would
have printed}):

  facts          torch's view of this machine (facts.collect)
  ds_install     DeepSpeed's install and build toolchain (ds_install.collect), when asked
  op:<name>      each op's build, load and test step (ds_ops.collect), when asked: the ops of
                 `ops_gpu` when torch sees a GPU, else those of `ops_cpu` (the choice the doctor
                 makes from the facts), less `elsewhere` (ops the doctor builds in their own process)

PHASE lines go on as the single workers print them; the doctor gives each section the output and
phases printed since the section before it (doctor/check/shared.py). What the doctor does not ask
for is not imported. A plain script: it imports nothing of mgft-doctor."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_install  # noqa: E402
import ds_ops  # noqa: E402
import facts  # noqa: E402
from _protocol import emit, phase, script_args  # noqa: E402


def begin(name: str) -> None:
    """The doctor times each section from here (its limit, the probe's duration)."""
    phase(f"section:{name}")


def answer(name: str, payload: dict) -> None:
    emit({"section": name, "payload": payload})


def main():
    begin("facts")
    args = script_args()
    ops_gpu, ops_cpu = list(args.get("ops_gpu") or []), list(args.get("ops_cpu") or [])
    elsewhere = set(args.get("elsewhere") or [])
    started = set()
    likely = ops_gpu if args.get("gpus_likely") else ops_cpu
    if "cpu_adam" in likely and "cpu_adam" not in elsewhere:
        ds_ops.head_start("cpu_adam")  # py-cpuinfo's slow query, beside `import torch`
        started.add("cpu_adam")
    tools = ds_install.start_tools() if args.get("ds_install") else None  # before anything sets TORCH_EXTENSIONS_DIR
    found = facts.collect()
    answer("facts", found)
    ops = [op for op in (ops_gpu if found.get("device_count") else ops_cpu) if op not in elsewhere]
    if "fused_adam" in ops:
        ds_ops.head_start("fused_adam")  # its CUDA context, beside `import deepspeed`
        started.add("fused_adam")
    if tools is not None:
        begin("ds_install")
        answer("ds_install", ds_install.collect(tools))
    for op in ops:
        begin(f"op:{op}")
        op_args = {"op": op, "cache_root": args.get("cache_root"), "workdir": args.get("workdir")}
        answer(f"op:{op}", ds_ops.collect(op_args, started=op in started))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
