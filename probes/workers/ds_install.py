"""What the examined Python has for DeepSpeed: is it installed and importable, what it was built
against, which accelerator it picks, and the tools its JIT op builds need (nvcc, CUDA_HOME,
ninja, a C++ compiler, Python.h). A plain script (it imports nothing of mgft-doctor); it prints
one JSON object on a line that starts with MARK. Nothing here builds or installs anything."""

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _protocol import emit, error_fields  # noqa: E402

TOOL_TIMEOUT_S = 30
ERROR_LIMITS = {"error_chars": 2000, "traceback_chars": 6000}
ENV_VARS = ("CUDA_HOME", "CUDA_PATH", "DS_ACCELERATOR", "DS_SKIP_CUDA_CHECK", "DS_BUILD_OPS", "CXX",
            "TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "CUDA_VISIBLE_DEVICES")


def run(cmd):
    """(exit code or None, output) of a tool; never raises."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL,
                           check=False)
        return p.returncode, (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired:
        return None, f"no answer within {TOOL_TIMEOUT_S} s"
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def nvcc_info(path):
    code, text = run([path, "--version"])
    m = re.search(r"release (\d+)\.(\d+)", text or "")
    return {"path": path, "exit_code": code, "release": f"{m.group(1)}.{m.group(2)}" if m else None,
            "output": (text or "")[-400:]}


def base() -> dict:
    return {"python": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix,
            "bin_dir": os.path.dirname(os.path.abspath(sys.executable)),
            "env": {k: os.environ.get(k) for k in ENV_VARS}, "path": os.environ.get("PATH", "")}


def start_tools() -> tuple[threading.Thread, dict]:
    """base() and build_tools() in a thread (its time is spent waiting on `c++ --version` and
    `ninja --version`), read before anything in this process changes the environment: the shared
    worker starts it beside `import torch` and hands the dict to collect()."""
    out = base()
    thread = threading.Thread(target=build_tools, args=(out,), daemon=True)
    thread.start()
    return thread, out


def collect(tools: tuple[threading.Thread, dict] | None = None) -> dict:
    """The whole install payload (the shared worker, stack.py, calls this with its start_tools())."""
    if tools is None:
        out = base()
        build_tools(out)
    else:
        tools[0].join()
        out = tools[1]
    t0 = time.perf_counter()
    torch_facts(out)
    out["torch_import_s"] = round(time.perf_counter() - t0, 2)
    out["nvcc"], out["nvcc_on_path"] = nvcc_facts(out.get("torch_cuda_home"))
    if "torch" in out:
        t0 = time.perf_counter()
        deepspeed_facts(out)
        out["deepspeed_import_s"] = round(time.perf_counter() - t0, 2)
    return out


def main():
    emit(collect())


# --- What a JIT build needs besides CUDA: Python's headers, a C++ compiler, ninja ---------------

def build_tools(out: dict) -> None:
    include = sysconfig.get_paths().get("include") or ""
    out["python_include"] = include
    out["python_h"] = os.path.isfile(os.path.join(include, "Python.h"))
    out["cxx"] = cxx_facts()
    out["ninja"] = ninja_facts(out["bin_dir"])
    try:
        from importlib import metadata

        out["deepspeed_dist"] = dist_version(metadata, "deepspeed")
        out["ninja"]["dist"] = dist_version(metadata, "ninja")
    except Exception as exc:  # noqa: BLE001
        out["metadata_error"] = str(exc)


def cxx_facts() -> dict:
    """The C++ compiler a build would call ($CXX, else c++) and its version line."""
    cxx = (os.environ.get("CXX") or "c++").split()[0]
    cxx_path = shutil.which(cxx)
    info = {"name": cxx, "path": cxx_path}
    if cxx_path:
        code, text = run([cxx_path, "--version"])
        info.update(exit_code=code, version=(text.splitlines() or [""])[0][:200])
    return info


def ninja_facts(bin_dir: str) -> dict:
    """ninja on PATH and in the environment's bin folder (where the ninja wheel puts it)."""
    ninja_path = shutil.which("ninja")
    in_env = os.path.join(bin_dir, "ninja")
    info = {"on_path": ninja_path, "in_env_bin": in_env if os.path.isfile(in_env) else None}
    if ninja_path or info["in_env_bin"]:
        code, text = run([ninja_path or in_env, "--version"])
        info.update(exit_code=code, version=(text.splitlines() or [""])[0][:100])
    return info


def dist_version(metadata, name: str):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# --- torch: the CUDA it was built for, whether it sees a GPU, where it looks for the toolkit ----

def torch_facts(out: dict) -> None:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
        return
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_hip"] = getattr(torch.version, "hip", None)
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    except Exception as exc:  # noqa: BLE001
        out["cuda_available"], out["device_count"] = False, 0
        out["cuda_error"] = f"{type(exc).__name__}: {exc}"
    try:
        extension_facts(torch, out)
    except Exception as exc:  # noqa: BLE001
        out["cpp_extension_error"] = f"{type(exc).__name__}: {exc}"


def extension_facts(torch, out: dict) -> None:
    """torch's CUDA_HOME, its build folder for JIT extensions, and the build locks left in it."""
    import torch.utils.cpp_extension as cpp

    out["torch_cuda_home"] = cpp.CUDA_HOME
    # torch before 2.14 marks a build in progress by the mere existence of a `lock` file:
    # one left by a killed build makes every later build of that op wait forever.
    with open(cpp.__file__, encoding="utf-8", errors="replace") as f:
        out["lock_is_file_baton"] = "FileBaton(" in f.read()
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        accel = (f"rocm{torch.version.hip.replace('.', '')}" if getattr(torch.version, "hip", None)
                 else f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
        root = os.path.join(cpp.get_default_build_root(),
                            f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{accel}")
    out["extensions_dir"] = root
    out["extension_locks"] = extension_locks(root)


def extension_locks(root: str) -> list[dict]:
    locks = []
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            lock = os.path.join(root, name, "lock")
            if os.path.exists(lock):
                locks.append({"op": name, "path": lock, "age_s": round(time.time() - os.path.getmtime(lock))})
    return locks


# --- nvcc: the one a build uses (CUDA_HOME, as torch resolves it), then the one on PATH ----------

def nvcc_facts(torch_cuda_home) -> tuple[list[dict], str | None]:
    """(each distinct nvcc found, with its release; the nvcc on PATH)."""
    candidates = []
    for home in (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"), torch_cuda_home):
        if home and ":" not in home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(on_path)
    seen, nvccs = set(), []
    for c in candidates:
        real = os.path.realpath(c)
        if real in seen or not os.path.isfile(c):
            continue
        seen.add(real)
        nvccs.append(nvcc_info(c))
    return nvccs, on_path


# --- DeepSpeed itself: importable, how it was built, the accelerator it picks -------------------

def deepspeed_facts(out: dict) -> None:
    try:
        import deepspeed
    except Exception as exc:  # noqa: BLE001
        out["deepspeed_error"] = error_fields(exc, **ERROR_LIMITS)
        return
    out["deepspeed"] = getattr(deepspeed, "__version__", None)
    out["deepspeed_file"] = deepspeed.__file__
    try:
        import deepspeed.git_version_info as info

        out["ds_build"] = {k: getattr(info, k, None) for k in
                           ("version", "git_hash", "git_branch", "installed_ops", "compatible_ops",
                            "torch_info", "accelerator_name")}
    except Exception as exc:  # noqa: BLE001
        out["ds_build_error"] = f"{type(exc).__name__}: {exc}"
    accelerator_facts(out)
    try:
        from deepspeed.ops.op_builder.builder import cuda_minor_mismatch_ok

        out["cuda_minor_mismatch_ok"] = {str(k): list(v) for k, v in cuda_minor_mismatch_ok.items()}
    except Exception:  # noqa: BLE001
        out["cuda_minor_mismatch_ok"] = None


def accelerator_facts(out: dict) -> None:
    try:
        from deepspeed.accelerator import get_accelerator

        acc = get_accelerator()
        out["accelerator"] = getattr(acc, "_name", None) or acc.device_name()
        out["accelerator_set_by"] = "DS_ACCELERATOR" if os.environ.get("DS_ACCELERATOR") else "auto-detect"
        try:
            out["comm_backend"] = acc.communication_backend_name()
        except Exception:  # noqa: BLE001
            out["comm_backend"] = None
    except Exception as exc:  # noqa: BLE001
        out["accelerator_error"] = error_fields(exc, **ERROR_LIMITS)


if __name__ == "__main__":
    main()
