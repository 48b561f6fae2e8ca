"""Build (JIT) and load one DeepSpeed op with its own op builder, then run it once on a tiny
tensor to prove it works. A plain script in the examined Python (it imports nothing of
mgft-doctor). The build goes to the doctor's own cache: TORCH_EXTENSIONS_DIR =
<cache_root>/<python+torch+deepspeed+accelerator tag>, never the user's. Prints where it is
(PHASE lines, so a time-out can say what hung) and one JSON object after MARK."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _extensions import extensions_tag  # noqa: E402
from _protocol import emit, error_fields, phase, script_args  # noqa: E402

BUILDERS = {"cpu_adam": "CPUAdamBuilder", "fused_adam": "FusedAdamBuilder", "async_io": "AsyncIOBuilder"}


def error_text(exc):
    """A build error keeps a long message: the compiler's output is in it."""
    return error_fields(exc, error_chars=20000, traceback_chars=8000)


def adam_ran(param, lr):
    """After one Adam step from 1.0 with a constant gradient, every element is 1 - lr."""
    got = [float(x) for x in param.detach().float().cpu().tolist()]
    return all(abs(x - (1.0 - lr)) < 1e-3 for x in got), got[:4]


def run_cpu_adam(torch, workdir):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.ones(16))
    p.grad = torch.full((16,), 0.5)
    DeepSpeedCPUAdam([p], lr=0.1, weight_decay=0.0).step()
    ok, sample = adam_ran(p, 0.1)
    return {"ok": ok, "what": "DeepSpeedCPUAdam.step() on a 16-element CPU parameter", "values": sample}


def run_fused_adam(torch, workdir):
    from deepspeed.accelerator import get_accelerator

    if get_accelerator()._name != "cuda":
        return {"ok": True, "what": "not run: FusedAdam's test step needs a GPU", "skipped": True}
    from deepspeed.ops.adam import FusedAdam

    p = torch.nn.Parameter(torch.ones(16, device="cuda"))
    p.grad = torch.full_like(p, 0.5)
    FusedAdam([p], lr=0.1, weight_decay=0.0).step()
    torch.cuda.synchronize()
    ok, sample = adam_ran(p, 0.1)
    return {"ok": ok, "what": "FusedAdam.step() on a 16-element cuda:0 parameter", "values": sample}


def run_async_io(torch, workdir, module):
    # O_DIRECT write and read back of 1 MiB through DeepSpeed's aio handle, in the doctor's cache.
    handle = module.aio_handle(1 << 20, 8, False, False, 1)
    n = 1 << 20
    buf = handle.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    try:
        buf.copy_(torch.arange(n, dtype=torch.int64).remainder(251).to(torch.uint8))
        path = os.path.join(workdir, f"aio-probe-{os.getpid()}.bin")
        try:
            wrote = handle.sync_pwrite(buf, path)
            expect = buf.clone()
            buf.zero_()
            read = handle.sync_pread(buf, path)
            ok = bool(torch.equal(buf, expect))
        finally:
            if os.path.exists(path):
                os.remove(path)
    finally:
        handle.free_cpu_locked_tensor(buf)
    return {"ok": ok, "what": f"aio_handle sync_pwrite + sync_pread of 1 MiB in {workdir}",
            "write_ops": wrote, "read_ops": read}


def head_start(op):
    """Start at once, beside `import deepspeed` (seconds), the two slow things the op will wait for
    later: py-cpuinfo's query, which DeepSpeed's CPU builders (cpu_arch, simd_width) and
    DeepSpeedCPUAdam each call and which spends ~1.2 s per call (a second of it asleep, timing the
    clock) -- made once here and handed to every caller; and for fused_adam the CUDA context its
    test step needs. Any error is left for the real call to meet."""
    early = {"cpu_adam": share_cpu_info, "fused_adam": open_cuda}.get(op)
    if early is not None:
        threading.Thread(target=early, daemon=True).start()


def share_cpu_info():
    try:
        import cpuinfo
    except Exception:  # noqa: BLE001 - DeepSpeed falls back to lscpu by itself
        return
    query, answer, ready = cpuinfo.get_cpu_info, {}, threading.Event()

    def get_cpu_info():
        ready.wait()
        return dict(answer["info"]) if "info" in answer else query()

    cpuinfo.get_cpu_info = get_cpu_info
    try:
        answer["info"] = query()
    except Exception:  # noqa: BLE001
        pass
    finally:
        ready.set()


def open_cuda():
    try:
        import torch

        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
    except Exception:  # noqa: BLE001
        pass


class Stopped(Exception):
    """The op got no further than `stage`; `fields` say why (error_type, error, traceback, ...)."""

    def __init__(self, stage: str, **fields):
        super().__init__(stage)
        self.stage, self.fields = stage, fields


def collect(args: dict, started: bool = False) -> dict:
    """One op's whole payload (the shared worker, stack.py, calls this per op; started: it has
    made the op's head start already)."""
    out = {"op": args["op"]}
    if not started:
        head_start(args["op"])
    try:
        import_build_and_run(args, out)
    except Stopped as stop:
        out.update(stage=stop.stage, **stop.fields)
    return out


def main():
    emit(collect(script_args()))


def import_build_and_run(args: dict, out: dict) -> None:
    """The stages in order: import, builder, is_compatible, build, run; the first that fails raises Stopped."""
    torch, deepspeed, accelerator = import_stack(out)
    ext_dir = extensions_dir(args["cache_root"], torch, deepspeed, accelerator, out)
    builder = make_builder(args["op"], out)
    check_compatible(builder, out)
    module = build(builder, accelerator, ext_dir, out)
    run_op(args, torch, ext_dir, module, out)


def import_stack(out: dict):
    phase("import")
    t0 = time.perf_counter()
    try:
        import deepspeed
        import torch
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()._name
    except Exception as exc:  # noqa: BLE001
        raise Stopped("import", **error_text(exc)) from exc
    out["import_s"] = round(time.perf_counter() - t0, 2)
    return torch, deepspeed, accelerator


def extensions_dir(cache_root: str, torch, deepspeed, accelerator: str, out: dict) -> str:
    """The doctor's own TORCH_EXTENSIONS_DIR for this Python, torch, DeepSpeed and accelerator."""
    ext_dir = os.path.join(cache_root, extensions_tag(torch, deepspeed, accelerator))
    os.makedirs(ext_dir, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = ext_dir
    out.update(accelerator=accelerator, torch=torch.__version__, torch_cuda=torch.version.cuda,
               deepspeed=deepspeed.__version__, ext_dir=ext_dir,
               torch_cuda_arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST"))
    return ext_dir


def make_builder(op: str, out: dict):
    try:
        from deepspeed.ops import op_builder

        builder = getattr(op_builder, BUILDERS[op])()
    except Exception as exc:  # noqa: BLE001
        raise Stopped("builder", **error_text(exc)) from exc
    out["builder"] = f"{type(builder).__module__}.{type(builder).__name__}"
    return builder


def check_compatible(builder, out: dict) -> None:
    """DeepSpeed's own cheap check; its error_log says why it is False."""
    phase("is_compatible")
    try:
        compatible = bool(builder.is_compatible(verbose=True))
    except Exception as exc:  # noqa: BLE001
        raise Stopped("is_compatible", **error_text(exc)) from exc
    out["compatible"] = compatible
    if not compatible:
        raise Stopped("is_compatible", error_type="NotCompatible",
                      error=f"DeepSpeed's {type(builder).__name__}.is_compatible() is False on this machine",
                      error_log=str(getattr(builder, "error_log", "") or ""))


def build(builder, accelerator: str, ext_dir: str, out: dict):
    """builder.load(): the prebuilt op, the cached build, or a real JIT build (out says which)."""
    try:
        from deepspeed.git_version_info import accelerator_name, installed_ops

        prebuilt = bool(installed_ops.get(builder.name)) and accelerator_name == accelerator
    except Exception:  # noqa: BLE001
        prebuilt = False
    out["prebuilt"] = prebuilt
    so = os.path.join(ext_dir, builder.name, builder.name + ".so")
    before = os.path.getmtime(so) if os.path.exists(so) else None
    phase("build")
    t0 = time.perf_counter()
    try:
        module = builder.load(verbose=True)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a failing build is a failure too
        raise Stopped("build", build_s=round(time.perf_counter() - t0, 2), **error_text(exc)) from exc
    out["build_s"] = round(time.perf_counter() - t0, 2)
    after = os.path.getmtime(so) if os.path.exists(so) else None
    out["cached"] = (not prebuilt) and before is not None and after == before
    out["module_file"] = getattr(module, "__file__", None)
    return module


def run_op(args: dict, torch, ext_dir: str, module, out: dict) -> None:
    op = args["op"]
    phase("run")
    t0 = time.perf_counter()
    try:
        if op == "cpu_adam":
            ran = run_cpu_adam(torch, ext_dir)
        elif op == "fused_adam":
            ran = run_fused_adam(torch, ext_dir)
        else:
            ran = run_async_io(torch, args.get("workdir") or ext_dir, module)
    except BaseException as exc:  # noqa: BLE001
        raise Stopped("run", run_s=round(time.perf_counter() - t0, 2), **error_text(exc)) from exc
    out["run_s"] = round(time.perf_counter() - t0, 3)
    out["ran"] = ran
    if not ran.get("ok"):
        raise Stopped("run", error_type="WrongResult", error=f"{ran.get('what')}: unexpected values {ran.get('values')}")


if __name__ == "__main__":
    main()
