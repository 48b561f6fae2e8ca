"""deepspeed.install: is DeepSpeed installed and importable in the examined Python; what it was
built against (pre-built ops: torch/CUDA) vs. the running torch; which accelerator it picks;
and whether its JIT op builds can work here: nvcc (from CUDA_HOME, then PATH) vs.
torch.version.cuda, CUDA_HOME itself, ninja, a C++ compiler, Python's headers. Read in a
subprocess of options.python with a time limit; building is deepspeed.ops' job."""

from __future__ import annotations

import os

from mgft_doctor.check.context import Context
from mgft_doctor.check.launch_findings import explain_log
from mgft_doctor.check.probe import Finding, Probe, Status, Verdict, verdict
from mgft_doctor.check.shared import Limit
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.script import ScriptRun, run_script
from mgft_doctor.runconfig import RunConfig

from . import _codes

ID, TITLE = "deepspeed.install", "DeepSpeed install and build toolchain"
INSTALL_FIX = ("Install DeepSpeed in this environment: {python} -m pip install deepspeed. Its ops are JIT-built at "
               "first use, so the machine also needs ninja, a C++ compiler and, on GPUs, a CUDA toolkit whose major "
               "version matches torch's.")


def _major_minor(v: str | None) -> tuple[int, int] | None:
    try:
        parts = str(v).split("+")[0].split(".")
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def shares(ctx: Context):
    """The examination is the shared worker's second section, after the facts: torch is imported
    there already (Probe.shares)."""
    return {"ds_install": True}, [Limit("ds_install", ctx.options.timeout)]


def run(ctx: Context):
    o = ctx.options
    res = ctx.shared_section("ds_install")
    if res is None:  # no shared worker, or it never got here: a worker of its own, as always
        res = run_script(o.python, worker_script("ds_install"), {}, timeout=o.timeout)
    if res.payload is None:
        return no_answer(res, o.python)
    return judge(res.payload, o.python, ctx.run_config or RunConfig(), round(res.wall_s, 2))


def no_answer(res: ScriptRun, python: str) -> Verdict:
    """The worker printed no payload: it hung, or the examined Python died on the way."""
    report = explain_log(res.log) if res.log.strip() else None
    code = report.diagnoses[0].code if report is not None and report.diagnoses else _codes.DS_IMPORT_FAILED
    what = (f"no answer within {res.wall_s:.0f} s" if res.timed_out else f"exit code {res.returncode}")
    tail = (res.log.strip().splitlines() or [""])[-1][:300]
    return verdict(f"could not examine DeepSpeed in {python} ({what})",
                   [Finding(code, f"reading DeepSpeed's install in {python} failed ({what}): {tail}",
                            "Run `python -c 'import deepspeed'` in that environment and fix what it prints; "
                            "`mgft-doctor -v` shows the output.")],
                   {"wall_s": round(res.wall_s, 2)}, ["output (tail):", *("  " + ln[:300] for ln in res.log.strip().splitlines()[-20:])])


def judge(d: dict, examined: str, rc: RunConfig, wall_s: float) -> Verdict:
    """The verdict on the worker's payload, section by section (each returns its findings and
    detail lines, in the order they are shown)."""
    python = d.get("executable") or examined
    details = [f"python {d.get('python')} at {d.get('executable')}"]
    metrics = {"wall_s": wall_s}
    findings, more, stopped = importable(d, python)
    details += more
    if stopped:
        return verdict(stopped, findings, metrics, details)
    metrics.update(deepspeed=d.get("deepspeed"), torch=d["torch"], torch_cuda=d.get("torch_cuda"),
                   import_s=d.get("deepspeed_import_s"))
    details.append(f"deepspeed {d.get('deepspeed')} at {os.path.dirname(d.get('deepspeed_file') or '')}")
    gpu = bool(d.get("cuda_available")) and int(d.get("device_count") or 0) > 0
    acc = d.get("accelerator")
    if "accelerator_error" not in d:
        metrics["accelerator"] = acc
    ops = rc.deepspeed_ops(gpu)
    jit = jit_ops(d, ops)
    home_findings, home_details = cuda_home(d)
    bad_home = bool(home_findings)
    for part in (accelerator(d, gpu), prebuilt_ops(d, python, gpu, ops, jit), (home_findings, home_details),
                 nvcc_checks(d, gpu, jit, bad_home), jit_toolchain(d, python, jit), stale_locks(d)):
        findings += part[0]
        details += part[1]
    used = nvcc_checked(d, gpu, bad_home)
    if used is not None and used.get("release"):
        metrics["nvcc"] = used["release"]
    summary = (f"deepspeed {d.get('deepspeed')} on torch {d['torch']}, accelerator {acc or '?'}"
               + (f", nvcc {metrics['nvcc']}" if metrics.get("nvcc") else "")
               + (f"; JIT toolchain ready for {', '.join(jit)}" if jit and not any(f.severity is Status.FAIL for f in findings) else ""))
    return verdict(summary, findings, metrics, details)


def importable(d: dict, python: str) -> tuple[list[Finding], list[str], str | None]:
    """1. Installed and importable? (findings, details, and the summary when the examination
    stops here: no torch, no DeepSpeed, or `import deepspeed` fails)."""
    details: list[str] = []
    if "torch" not in d and not d.get("deepspeed_dist"):
        return ([Finding(_codes.DS_MISSING, f"deepspeed is not installed in {python}"
                         + (f" (torch is missing too: {d.get('torch_error')})" if d.get("torch_error") else ""),
                         INSTALL_FIX.format(python=python) + (" Install PyTorch first." if d.get("torch_error") else ""))],
                details, f"deepspeed is not installed in {python}")
    if "torch" not in d:
        return ([Finding(_codes.TORCH_MISSING, f"deepspeed {d.get('deepspeed_dist')} is installed in {python} but "
                         f"torch cannot be imported: {d.get('torch_error')}",
                         "Install PyTorch in this environment (a CUDA build for GPUs); DeepSpeed needs it.")],
                details, f"deepspeed {d.get('deepspeed_dist')} is installed but torch does not import")
    details.append(f"torch {d['torch']} (CUDA {d.get('torch_cuda') or 'none: CPU build'}), "
                   f"{d.get('device_count', 0)} GPU(s) visible to torch")
    if not d.get("deepspeed_dist") and "deepspeed_error" in d and "No module named 'deepspeed'" in d["deepspeed_error"]["error"]:
        return ([Finding(_codes.DS_MISSING, f"deepspeed is not installed in {python} (torch {d['torch']} is)",
                         INSTALL_FIX.format(python=python))], details, f"deepspeed is not installed in {python}")
    if "deepspeed_error" in d:
        err = d["deepspeed_error"]
        report = explain_log(err.get("traceback", "")) if err.get("traceback") else None
        diag = report.diagnoses[0] if report is not None and report.diagnoses else None
        msg = (f"deepspeed {d.get('deepspeed_dist') or '?'} is installed but `import deepspeed` fails with torch "
               f"{d['torch']}: {err['error_type']}: {err['error'][:300]}")
        fix = (diag.fixes[0] if diag and diag.fixes else
               "An old DeepSpeed often does not import on a newer torch (or the reverse): upgrade it with "
               f"{python} -m pip install -U deepspeed, or install the torch it supports.")
        details += ["import deepspeed (traceback tail):", *("  " + ln for ln in err.get("traceback", "").strip().splitlines()[-12:])]
        return [Finding(diag.code if diag else _codes.DS_IMPORT_FAILED, msg, fix)], details, "deepspeed does not import"
    return [], details, None


def accelerator(d: dict, gpu: bool) -> tuple[list[Finding], list[str]]:
    """2. Which accelerator DeepSpeed picks."""
    findings: list[Finding] = []
    details: list[str] = []
    acc = d.get("accelerator")
    ds_acc_env = (d.get("env") or {}).get("DS_ACCELERATOR")
    if "accelerator_error" in d:
        e = d["accelerator_error"]
        findings.append(Finding(_codes.DS_ON_CPU if gpu else _codes.CPU_ONLY_TORCH,
                                f"DeepSpeed cannot choose an accelerator: {e['error_type']}: {e['error'][:300]}",
                                "Unset DS_ACCELERATOR (DeepSpeed then detects it) or set it to cuda (GPUs) / cpu (no GPU)."))
    else:
        how = f"DS_ACCELERATOR={ds_acc_env}" if ds_acc_env else "auto-detected"
        details.append(f"DeepSpeed accelerator: {acc} ({how}), communication backend {d.get('comm_backend')}")
        if gpu and acc != "cuda":
            findings.append(Finding(_codes.DS_ON_CPU,
                                    f"torch sees {d.get('device_count')} GPU(s) but DeepSpeed picks the '{acc}' accelerator ({how}): "
                                    "training would run on the CPU",
                                    "Unset DS_ACCELERATOR (or set DS_ACCELERATOR=cuda) in the training environment."))
        elif not gpu and acc == "cuda":
            findings.append(Finding(_codes.CPU_ONLY_TORCH,
                                    f"DeepSpeed's accelerator is cuda ({how}) but torch sees no GPU"
                                    + (f" (torch {d['torch']} is a CPU build)" if not d.get("torch_cuda") else ""),
                                    "On a machine without GPUs set DS_ACCELERATOR=cpu; on a GPU machine fix torch's view "
                                    "of the GPUs first (see gpu.visible)."))
        elif not gpu:
            details.append("no GPU: DeepSpeed runs on its CPU accelerator"
                           + ("" if ds_acc_env else " (set DS_ACCELERATOR=cpu to choose it explicitly)"))
    return findings, details


def _prebuilt(d: dict) -> set[str]:
    return {k for k, v in ((d.get("ds_build") or {}).get("installed_ops") or {}).items() if v}


def jit_ops(d: dict, ops: list[tuple[str, str]]) -> list[str]:
    """The ops of this run that are JIT-built here: not pre-built, or pre-built for another accelerator."""
    build = d.get("ds_build") or {}
    return sorted({n for n, _ in ops if n not in _prebuilt(d) or build.get("accelerator_name") != d.get("accelerator")})


def prebuilt_ops(d: dict, python: str, gpu: bool, ops: list[tuple[str, str]], jit: list[str]) -> tuple[list[Finding], list[str]]:
    """3. What DeepSpeed was built against: pre-built ops must match the running torch and CUDA."""
    findings: list[Finding] = []
    details: list[str] = []
    acc = d.get("accelerator")
    build = d.get("ds_build") or {}
    installed = _prebuilt(d)
    tinfo = build.get("torch_info") or {}
    if installed:
        details.append(f"pre-built ops ({build.get('accelerator_name')}): {', '.join(sorted(installed))}; "
                       f"built with torch {tinfo.get('version')}, CUDA {tinfo.get('cuda_version')}")
        running = _major_minor(d["torch"])
        built = _major_minor(tinfo.get("version"))
        if built and running and built != running and build.get("accelerator_name") == acc:
            findings.append(Finding(_codes.DS_TORCH_MISMATCH,
                                    f"DeepSpeed's pre-built ops were compiled with torch {tinfo.get('version')} but torch "
                                    f"{d['torch']} runs: loading them fails ('PyTorch version mismatch!')",
                                    f"Reinstall DeepSpeed against this torch: {python} -m pip install --force-reinstall --no-cache-dir "
                                    "deepspeed (JIT ops), or rebuild with DS_BUILD_OPS=1 in this environment."))
        cu_built, cu_running = _major_minor(tinfo.get("cuda_version")), _major_minor(d.get("torch_cuda"))
        if gpu and cu_built and cu_running and cu_built != (0, 0) and cu_built != cu_running and not d.get("torch_hip"):
            findings.append(Finding(_codes.DS_TORCH_MISMATCH,
                                    f"DeepSpeed's pre-built ops were compiled for CUDA {tinfo.get('cuda_version')} but torch "
                                    f"runs CUDA {d.get('torch_cuda')}: loading them fails ('CUDA version mismatch!')",
                                    f"Reinstall DeepSpeed against this torch: {python} -m pip install --force-reinstall --no-cache-dir deepspeed."))
    else:
        details.append("no pre-built ops: every op is JIT-built at first use against the running torch")
    compat = build.get("compatible_ops")
    if isinstance(compat, dict):
        bad = sorted(k for k, v in compat.items() if not v)
        if bad:
            details.append(f"ops DeepSpeed's install marked incompatible: {', '.join(bad)}")

    details.append("ops this run needs: " + ", ".join(sorted({n for n, _ in ops}))
                   + (f"; JIT-built here: {', '.join(jit)}" if jit else "; all pre-built"))
    return findings, details


def _cuda_home(d: dict) -> tuple[str | None, str | None]:
    """Which of CUDA_HOME / CUDA_PATH is set (torch's cpp_extension reads them in that order), and its value."""
    env = d.get("env") or {}
    var = "CUDA_HOME" if env.get("CUDA_HOME") is not None else ("CUDA_PATH" if env.get("CUDA_PATH") is not None else None)
    return var, (env.get(var) if var else None)


def cuda_home(d: dict) -> tuple[list[Finding], list[str]]:
    """4a. CUDA_HOME itself: a list of paths or a missing folder fails every CUDA op build."""
    findings: list[Finding] = []
    details: list[str] = []
    var, home = _cuda_home(d)
    if var and (":" in home or not home.strip()):
        findings.append(Finding(_codes.CUDA_TOOLKIT_MISSING,
                                f"{var}={home!r} is a list of paths, not one folder: torch and DeepSpeed look for "
                                f"'{home}/bin/nvcc', so every CUDA op build fails",
                                f"Set {var} to one toolkit folder, the one whose bin/nvcc matches torch's CUDA "
                                f"{d.get('torch_cuda') or ''} (e.g. export {var}=/usr/local/cuda-{d.get('torch_cuda') or 'X.Y'})."))
    elif var and not os.path.isdir(home):
        findings.append(Finding(_codes.CUDA_TOOLKIT_MISSING,
                                f"{var}={home} does not exist: torch's cpp_extension and DeepSpeed's CUDA op builders take it "
                                "as the CUDA toolkit, so every CUDA op build fails ('nvcc not found' / 'unable to compile CUDA op(s)')",
                                f"Point {var} at the installed toolkit matching torch's CUDA {d.get('torch_cuda') or ''} "
                                f"(e.g. /usr/local/cuda-{d.get('torch_cuda') or 'X.Y'}), or unset it."))
    elif var and not os.path.isfile(os.path.join(home, "bin", "nvcc")):
        details.append(f"{var}={home} has no bin/nvcc (a runtime-only install?)")
    if var:
        details.append(f"{var}={home}")
    return findings, details


def _build_nvcc(d: dict) -> dict | None:
    """The nvcc JIT builds use: the one under torch's CUDA_HOME, else the first found."""
    nvccs = d.get("nvcc") or []
    torch_home = d.get("torch_cuda_home")
    build_nvcc = None
    if torch_home:
        want = os.path.realpath(os.path.join(torch_home, "bin", "nvcc"))
        build_nvcc = next((n for n in nvccs if os.path.realpath(n["path"]) == want), None)
    return build_nvcc or (nvccs[0] if nvccs else None)


def nvcc_checked(d: dict, gpu: bool, bad_home: bool) -> dict | None:
    """The nvcc the checks judge, when they apply (a GPU, CUDA torch, a usable CUDA_HOME)."""
    if not gpu or d.get("torch_hip") or not d.get("torch_cuda") or bad_home:
        return None
    return _build_nvcc(d)


def nvcc_checks(d: dict, gpu: bool, jit: list[str], bad_home: bool) -> tuple[list[Finding], list[str]]:
    """4b. nvcc against torch.version.cuda: missing, not running, another major version."""
    findings: list[Finding] = []
    details: list[str] = []
    env = d.get("env") or {}
    var, home = _cuda_home(d)
    nvccs = d.get("nvcc") or []
    build_nvcc = _build_nvcc(d)
    for n in nvccs:
        details.append(f"nvcc {n['path']}: " + (f"CUDA {n['release']}" if n.get("release") else f"does not run ({n.get('output', '')[:120]})"))
    torch_cuda = d.get("torch_cuda")
    if env.get("TORCH_CUDA_ARCH_LIST"):
        details.append(f"TORCH_CUDA_ARCH_LIST={env['TORCH_CUDA_ARCH_LIST']} (the archs JIT builds compile for)")
    if not gpu:
        details.append("nvcc checks skipped: no GPU visible to torch (the CPU accelerator's ops need no CUDA toolkit)")
    elif d.get("torch_hip"):
        details.append(f"ROCm torch (HIP {d.get('torch_hip')}): nvcc checks do not apply")
    elif torch_cuda and not bad_home:
        tc = _major_minor(torch_cuda)
        if build_nvcc is None:
            findings.append(Finding(_codes.CUDA_TOOLKIT_MISSING,
                                    f"no nvcc (CUDA_HOME {'unset' if not var else home}, none on PATH): JIT builds of CUDA ops "
                                    f"({', '.join(n for n in jit if n != 'async_io') or 'fused_adam'}) are impossible here",
                                    f"Install the CUDA {torch_cuda} toolkit (conda install -c nvidia cuda-toolkit={torch_cuda}, or the "
                                    f"NVIDIA installer) and export CUDA_HOME to it; or install DeepSpeed with its ops pre-built "
                                    "(DS_BUILD_OPS=1 pip install deepspeed on a machine with the toolkit).", Status.WARN))
        elif not build_nvcc.get("release"):
            findings.append(Finding(_codes.CUDA_TOOLKIT_MISSING, f"nvcc at {build_nvcc['path']} does not run: "
                                    f"{build_nvcc.get('output', '')[:200]}",
                                    f"Repair or reinstall the CUDA {torch_cuda} toolkit and point CUDA_HOME at it.", Status.WARN))
        else:
            nv = _major_minor(build_nvcc["release"])
            if nv and tc and nv[0] != tc[0]:
                findings.append(Finding(_codes.NVCC_MISMATCH,
                                        f"nvcc {build_nvcc['path']} is CUDA {build_nvcc['release']} but torch {d['torch']} was built "
                                        f"with CUDA {torch_cuda}: JIT-built ops compile against the wrong CUDA (build errors, or "
                                        "'undefined symbol' when the op loads)",
                                        f"Install the CUDA {torch_cuda} toolkit and point CUDA_HOME at it (export CUDA_HOME=/usr/local/cuda-{torch_cuda}), "
                                        f"or install a torch built for CUDA {nv[0]}. DS_SKIP_CUDA_CHECK=1 only silences DeepSpeed's "
                                        "check, as a last resort: the mismatch remains."))
            elif nv and tc and nv != tc:
                table = d.get("cuda_minor_mismatch_ok") or {}
                both = str(nv[0]) in table and {build_nvcc["release"], f"{tc[0]}.{tc[1]}"} <= set(table[str(nv[0])])
                details.append(f"nvcc CUDA {build_nvcc['release']} vs torch CUDA {torch_cuda}: a minor mismatch, which JIT "
                               "builds accept (same major version)" + ("" if both else
                               "; DeepSpeed's pre-build at install time (DS_BUILD_OPS=1) refuses it unless DS_SKIP_CUDA_CHECK=1"))
            path_nvcc = d.get("nvcc_on_path")
            if path_nvcc:
                on_path = next((n for n in nvccs if n["path"] == path_nvcc), None)
                if on_path and on_path.get("release") and on_path["release"] != build_nvcc.get("release"):
                    details.append(f"note: nvcc on PATH is CUDA {on_path['release']}, but builds use {build_nvcc['path']} (CUDA_HOME)")
    return findings, details


def jit_toolchain(d: dict, python: str, jit: list[str]) -> tuple[list[Finding], list[str]]:
    """5. The rest of the JIT toolchain: ninja, a C++ compiler, Python.h."""
    findings: list[Finding] = []
    details: list[str] = []
    ninja = d.get("ninja") or {}
    if ninja.get("on_path"):
        details.append(f"ninja {ninja.get('version')} at {ninja['on_path']}")
    if jit:
        if not ninja.get("on_path") and ninja.get("in_env_bin"):
            findings.append(Finding(_codes.NINJA_MISSING,
                                    f"ninja is installed in {d.get('bin_dir')} but that folder is not on PATH: torch runs `ninja` "
                                    "from PATH, so a run started from this shell fails ('Ninja is required to load C++ extensions')",
                                    f"Activate the environment before launching (source {d.get('bin_dir')}/activate, conda activate …), "
                                    f"or export PATH={d.get('bin_dir')}:$PATH.", Status.WARN))
        elif not ninja.get("on_path") and ninja.get("dist"):
            findings.append(Finding(_codes.NINJA_MISSING,
                                    f"the ninja package {ninja['dist']} is installed but no `ninja` executable is on PATH: "
                                    "torch runs `ninja` from PATH, so the JIT build of "
                                    f"{', '.join(jit)} fails ('Ninja is required to load C++ extensions')",
                                    f"Put the folder holding its `ninja` script on PATH (reinstall it into this environment: "
                                    f"{python} -m pip install --force-reinstall ninja, then activate the environment)."))
        elif not ninja.get("on_path"):
            findings.append(Finding(_codes.NINJA_MISSING,
                                    f"ninja is not installed: DeepSpeed cannot JIT-build {', '.join(jit)} "
                                    "('Ninja is required to load C++ extensions')",
                                    f"{python} -m pip install ninja (and launch with that environment's bin folder on PATH)."))
        elif ninja.get("exit_code") not in (0, None) or (ninja.get("exit_code") is None and ninja.get("version", "").startswith("no answer")):
            findings.append(Finding(_codes.NINJA_MISSING, f"ninja at {ninja['on_path']} does not run: {ninja.get('version')}",
                                    f"Reinstall it: {python} -m pip install --force-reinstall ninja."))
        cxx = d.get("cxx") or {}
        if not cxx.get("path"):
            findings.append(Finding(_codes.CXX_MISSING,
                                    f"no C++ compiler ('{cxx.get('name')}' is not on PATH): DeepSpeed cannot JIT-build {', '.join(jit)}",
                                    "Install one (apt install build-essential, or conda install gxx_linux-64) or set CXX to it."))
        else:
            details.append(f"C++ compiler {cxx['path']}: {cxx.get('version')}")
        if not d.get("python_h"):
            findings.append(Finding(_codes.PYTHON_H_MISSING,
                                    f"Python's headers are missing ({d.get('python_include')}/Python.h): every op build fails with "
                                    "'fatal error: Python.h: No such file or directory'",
                                    f"Install them for Python {d.get('python')} (apt install python{'.'.join(str(d.get('python')).split('.')[:2])}-dev), "
                                    "or use a conda/pyenv Python, which ships them."))
    return findings, details


def stale_locks(d: dict) -> tuple[list[Finding], list[str]]:
    """6. A lock left by a killed build makes the next build of that op wait forever (torch < 2.14)."""
    findings: list[Finding] = []
    locks = d.get("extension_locks") or []
    if locks and d.get("lock_is_file_baton"):
        findings.append(Finding(_codes.OP_BUILD_HANG,
                                f"lock file(s) in {d.get('extensions_dir')} for {', '.join(x['op'] for x in locks)}: with torch "
                                f"{d['torch']} a lock left by a killed build makes the next JIT build of that op wait forever",
                                "If no build is running now, delete them: rm " + " ".join(x["path"] for x in locks), Status.WARN))
    return findings, []


PROBE = Probe(ID, TITLE, run, shares=shares)
