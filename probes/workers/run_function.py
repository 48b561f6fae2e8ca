"""Rank-side worker of the pytest fixture `mgft_ranks`: import the user's top-level function
by module and qualified name, start the process group (NCCL when every local rank has a GPU,
gloo otherwise), call fn(rank, world_size, *args, **kwargs) and report its JSON-serialisable
return value. Any exception is this rank's failure, with its traceback."""

import importlib
import importlib.util
import json
import os
import sys
from datetime import timedelta

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from _protocol import Worker

# the workers' folder must not shadow the user's modules (facts.py, p2p.py, ...)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def load_function(module: str, qualname: str, file: str | None):
    try:
        mod = importlib.import_module(module)
        if file and os.path.abspath(getattr(mod, "__file__", "") or "") != os.path.abspath(file):
            raise ImportError(f"{module} resolves to {getattr(mod, '__file__', None)}, not {file}")
    except ImportError:
        if not file:
            raise
        # pytest's importmode=importlib names modules that are not importable by name
        spec = importlib.util.spec_from_file_location(module, file)
        if spec is None or spec.loader is None:
            raise
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        spec.loader.exec_module(mod)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def body(w: Worker) -> dict:
    a = w.args
    for p in reversed(a.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    w.phase("import_function")
    fn = load_function(a["module"], a["qualname"], a.get("file"))
    backend = a.get("backend") or "auto"
    if backend != "none":
        w.phase("import_torch")
        import torch
        import torch.distributed as dist

        if backend == "auto":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", w.world_size))
            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local else "gloo"
        extra = {}
        if backend == "nccl":
            torch.cuda.set_device(w.local_rank)
            extra["device_id"] = torch.device("cuda", w.local_rank)  # binds the rank to its GPU (barrier too)
        w.phase("init_process_group")
        timeout = timedelta(seconds=float(a.get("pg_timeout", 180)))
        try:
            dist.init_process_group(backend, timeout=timeout, **extra)
        except TypeError:
            if not extra:
                raise
            dist.init_process_group(backend, timeout=timeout)  # a torch without device_id (< 2.3)
    w.phase("call")
    value = fn(w.rank, w.world_size, *a.get("args", []), **a.get("kwargs", {}))
    w.phase("returned")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{a['qualname']} returned a {type(value).__name__}, which is not JSON-serialisable "
                        f"({exc}); return numbers, strings, lists or dicts (tensor.tolist(), float(x))") from None
    return {"value": value, "backend": backend}


if __name__ == "__main__":
    Worker().run(body)
