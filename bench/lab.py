#!/usr/bin/env python3
"""The fault lab (DESIGN.md §5c): planted faults reproduced with the real stack, their logs, and explain's score.

    python bench/lab.py list [--area AREA]
    python bench/lab.py show ID                 # the resolved setup of one fault
    python bench/lab.py run [IDS...] [--gpu] [--fix] [--only-fix] [--out DIR] [--keep] [--area AREA]
    python bench/lab.py score [--json] [--gpu-only|--cpu-only] [--ids ...]

Each fault lives in tests/lab/<id>/fault.yaml: what runs (`run:`, a bash command run in a fresh folder),
what it needs (`setup:` a tiny model, datasets and files, built locally with bench/lab_build.py), the fault,
`expect:` the catalog code (null: no catalog code applies, the log must still show a failure) and `fix:` (the
change that makes the run pass). `run` records the real run's output into tests/lab/<id>/cpu.log (gpu.log
with --gpu); `--fix` reruns with the fix applied and records whether it passed (fix_verified), and keeps the
passing run's log as tests/lab/<id>/cpu.fix.log (gpu.fix.log): a healthy real run that explain must not diagnose.
A run has a hard time limit; on time-out its whole process tree is killed.

This script imports only the standard library and PyYAML; the doctor is reached through its CLI.
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "tests" / "lab"
BUILD = Path(__file__).resolve().parent / "lab_build.py"
PRESETS = LAB / "_presets.yaml"
WORK = Path(os.environ.get("MGFT_LAB_WORK", "/tmp/mgft-lab"))
CACHE = Path(os.environ.get("MGFT_LAB_CACHE", "/tmp/mgft-lab-cache"))
MAX_LOG = 300_000          # bytes kept of a log: head and tail
MANAGED = "# --- recorded by bench/lab.py run (do not edit below this line) ---"
_BUILD_LOCK = threading.Lock()   # --jobs: one build of a cached model at a time
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# ----------------------------------------------------------------------------------------------- faults

def fault_ids() -> list[str]:
    return sorted(p.name for p in LAB.iterdir() if (p / "fault.yaml").is_file()) if LAB.is_dir() else []


def load_fault(fid: str) -> dict:
    path = LAB / fid / "fault.yaml"
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a mapping")
    for key in ("id", "area", "title", "expect", "fix"):
        if key not in data:
            raise SystemExit(f"{path}: missing {key!r}")
    if data["id"] != fid:
        raise SystemExit(f"{path}: id {data['id']!r} is not the folder name {fid!r}")
    return data


def _merge(base, over):
    """Deep-merge mappings; None in `over` deletes the key."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve(fault: dict, gpu: bool, fix: bool) -> dict:
    """The fault's effective spec: preset < fault < gpu overrides < fix overrides."""
    spec: dict = {}
    preset = fault.get("preset")
    if preset:
        presets = yaml.safe_load(PRESETS.read_text())
        if preset not in presets:
            raise SystemExit(f"{fault['id']}: unknown preset {preset!r}")
        spec = copy.deepcopy(presets[preset])
    own = {k: fault[k] for k in ("setup", "yaml", "json", "env", "run", "timeout") if k in fault}
    spec = _merge(spec, own)
    dev = fault.get("gpu" if gpu else "cpu") or {}
    spec = _merge(spec, {k: v for k, v in dev.items() if k in ("setup", "yaml", "json", "env", "run", "timeout")})
    if fix:
        f = fault["fix"] or {}
        spec = _merge(spec, {k: v for k, v in f.items() if k in ("setup", "yaml", "json", "env", "run", "timeout")})
        devfix = (dev.get("fix") or {})
        spec = _merge(spec, {k: v for k, v in devfix.items() if k in ("setup", "yaml", "json", "env", "run", "timeout")})
    spec.setdefault("timeout", 240)
    if not spec.get("run"):
        raise SystemExit(f"{fault['id']}: nothing to run (no run: and no preset)")
    return spec


# ----------------------------------------------------------------------------------------------- setup

def _run_quiet(cmd: list[str], cwd: Path, env: dict, log) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600)
    if r.returncode:
        raise RuntimeError(f"setup step failed ({r.returncode}): {' '.join(cmd)} (see {log.name})")


def _model(spec, cwd: Path, env: dict, log) -> None:
    if isinstance(spec, str):
        spec = {"arch": spec}
    spec = {"arch": "qwen2", "layers": 2, "hidden": 64, "dtype": "float32", "dir": "model", **spec}
    key = "{arch}-l{layers}-h{hidden}-{dtype}".format(**spec) + (f"-v{spec['vocab']}" if spec.get("vocab") else "")
    cached = CACHE / "models" / key
    with _BUILD_LOCK:
        _build_model(spec, cached, cwd, env, log)
    shutil.copytree(cached, cwd / spec["dir"])


def _build_model(spec: dict, cached: Path, cwd: Path, env: dict, log) -> None:
    if not (cached / "config.json").exists():
        tmp = cached.with_name(cached.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, str(BUILD), "model", str(tmp), "--arch", spec["arch"], "--layers", str(spec["layers"]),
               "--hidden", str(spec["hidden"]), "--dtype", spec["dtype"]]
        if spec.get("vocab"):
            cmd += ["--vocab", str(spec["vocab"])]
        _run_quiet(cmd, cwd, env, log)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(cached)


def _dataset(spec: dict, cwd: Path, env: dict, log) -> None:
    spec = {"dir": "data", "kind": "alpaca", "name": "lab_data", "n": 32, **spec}
    cmd = [sys.executable, str(BUILD), "dataset", str(cwd / spec["dir"]), "--kind", spec["kind"], "--name",
           spec["name"], "--n", str(spec["n"])]
    if spec.get("long"):
        cmd += ["--long", str(spec["long"])]
    if spec.get("info"):
        cmd += ["--info", json.dumps(spec["info"])]
    _run_quiet(cmd, cwd, env, log)


def _set_dotted(obj: dict, key: str, value) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        obj = obj.setdefault(p, {})
    if value is None:
        obj.pop(parts[-1], None)
    else:
        obj[parts[-1]] = value


def prepare(spec: dict, cwd: Path, env: dict) -> None:
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    setup = spec.get("setup") or {}
    with open(cwd / ".setup.log", "w") as log:
        if setup.get("model"):
            models = setup["model"] if isinstance(setup["model"], list) else [setup["model"]]
            for m in models:
                _model(m, cwd, env, log)
        for d in setup.get("datasets") or []:
            _dataset(d, cwd, env, log)
        for name, text in (setup.get("files") or {}).items():
            p = cwd / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text if isinstance(text, str) else json.dumps(text, indent=2))
        # YAML files given as mappings (a preset's train.yaml), then key overrides
        for name, values in (spec.get("yaml") or {}).items():
            p = cwd / name
            doc = yaml.safe_load(p.read_text()) if p.exists() else {}
            doc = doc or {}
            for k, v in values.items():
                if v is None:
                    doc.pop(k, None)
                else:
                    doc[k] = v
            p.write_text(yaml.safe_dump(doc, sort_keys=False))
        for name, values in (spec.get("json") or {}).items():
            p = cwd / name
            doc = json.loads(p.read_text()) if p.exists() else {}
            for k, v in values.items():
                _set_dotted(doc, k, v)
            p.write_text(json.dumps(doc, indent=2) + "\n")
        for cmd in setup.get("commands") or []:
            _run_quiet(["bash", "-c", cmd], cwd, env, log)


# ----------------------------------------------------------------------------------------------- running

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(gpu: bool, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MGFT_DOCTOR_", "PYTEST_"))}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    port = free_port()
    env.update({
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(cwd / ".hf"),
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
        "TORCH_EXTENSIONS_DIR": str(CACHE / ("torch_extensions_gpu" if gpu else "torch_extensions")),
        "LAB_DEVICE": "gpu" if gpu else "cpu", "LAB_NPROC": "1" if gpu else "2",
        "LAB_PY": sys.executable, "LAB_BUILD": str(BUILD), "LAB_CACHE": str(CACHE),
    })
    env.pop("WANDB_API_KEY", None)
    if gpu:
        env.update(NVLS_OFF)
    else:
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _session_pids(sid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == sid:
                    pids.append(int(d))
            except OSError:
                pass
    return pids


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill the run's whole session (the launcher, every rank, their helpers)."""
    sid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _session_pids(sid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + 5
        while time.time() < deadline and _session_pids(sid):
            time.sleep(0.2)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def execute(cmd: str, cwd: Path, env: dict, timeout: float, log_path: Path) -> tuple[int, float, bool]:
    t0 = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
            rc = proc.returncode if proc.returncode is not None else -9
        # a rank left behind after the launcher exited is killed too
        if _session_pids(proc.pid):
            kill_tree(proc)
    return rc, time.time() - t0, timed_out


def trim(data: bytes) -> bytes:
    if len(data) <= MAX_LOG:
        return data
    head, tail = data[: MAX_LOG // 2], data[-MAX_LOG // 2:]
    head = head[: head.rfind(b"\n") + 1]
    tail = tail[tail.find(b"\n") + 1:]
    cut = len(data) - len(head) - len(tail)
    return head + f"[... {cut} bytes of the log left out by bench/lab.py ...]\n".encode() + tail


def scrub(data: bytes, cwd: Path) -> bytes:
    """Only what the run printed; no secrets (none are set, but be sure) and no home folder beyond it."""
    text = data
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "GITHUB_TOKEN"):
        val = os.environ.get(key)
        if val:
            text = text.replace(val.encode(), b"***")
    return text


def summary_line(log: bytes) -> str:
    m = re.findall(rb"train_loss\s*=\s*([0-9.]+)", log)
    return f"train_loss = {m[-1].decode()}" if m else ""


def run_one(fid: str, gpu: bool, fix: bool, out_dir: Path | None, keep: bool, any_device: bool = False) -> dict:
    fault = load_fault(fid)
    dev = "gpu" if gpu else "cpu"
    if not any_device and dev not in (fault.get("devices") or ["cpu"]):
        return {"id": fid, "skipped": f"not a {dev} fault"}
    spec = resolve(fault, gpu, fix)
    cwd = WORK / (fid + ("-fix" if fix else "")) / dev
    env = base_env(gpu, cwd)
    env.update({k: str(v) for k, v in (spec.get("env") or {}).items() if v is not None})
    env.setdefault("NPROC_PER_NODE", env["LAB_NPROC"])
    for k in [k for k, v in (spec.get("env") or {}).items() if v is None]:
        env.pop(k, None)
    prepare(spec, cwd, env)
    raw = cwd / ".run.log"
    rc, secs, timed_out = execute(spec["run"], cwd, env, float(spec["timeout"]), raw)
    data = scrub(raw.read_bytes(), cwd)
    res = {"id": fid, "device": dev, "fix": fix, "exit": rc, "seconds": round(secs, 1), "timed_out": timed_out}
    if fix:
        passed = rc == 0 and not timed_out
        want = (fault["fix"] or {}).get("passes_if")
        if passed and want:
            passed = re.search(want.encode(), data) is not None
        res["passed"] = passed
        res["outcome"] = (f"exit {rc} in {secs:.0f} s" + ("; timed out" if timed_out else "")
                          + (f"; {summary_line(data)}" if summary_line(data) else ""))
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"{fid}.{dev}.fix.log").write_bytes(trim(data))
        elif passed:
            (LAB / fid / f"{dev}.fix.log").write_bytes(trim(data))
    else:
        dest_dir = out_dir or (LAB / fid)
        dest_dir.mkdir(parents=True, exist_ok=True)
        name = f"{dev}.log" if out_dir is None else f"{fid}.{dev}.log"
        (dest_dir / name).write_bytes(trim(data))
        res["log"] = str(dest_dir / name)
    if not keep:
        shutil.rmtree(cwd, ignore_errors=True)
    return res


def record(fid: str, results: list[dict]) -> None:
    """Write the runs' outcomes into the managed block at the end of fault.yaml."""
    path = LAB / fid / "fault.yaml"
    if not path.is_file():      # the fault was removed while the batch ran
        return
    text = path.read_text()
    body, _, managed = text.partition(MANAGED)
    state = yaml.safe_load(managed) or {} if managed else {}
    today = _dt.date.today().isoformat()
    for r in results:
        if r.get("skipped"):
            continue
        if r["fix"]:
            key = "fix_verified" if r["device"] == "cpu" else "gpu_fix_verified"
            state[key] = bool(r["passed"])
            state[key.replace("verified", "outcome")] = r["outcome"] + f" ({today})"
        else:
            state[f"{r['device']}_run"] = {"exit": r["exit"], "seconds": r["seconds"], "timed_out": r["timed_out"],
                                          "date": today}
    order = ["cpu_run", "fix_verified", "fix_outcome", "gpu_run", "gpu_fix_verified", "gpu_fix_outcome"]
    lines = [MANAGED]
    for k in order + sorted(set(state) - set(order)):
        if k in state:
            lines.append(f"{k}: {json.dumps(state[k])}")
    path.write_text(body.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------- scoring

def explain_json(log: Path) -> dict:
    exe = shutil.which("mgft-doctor") or str(Path(sys.executable).parent / "mgft-doctor")
    p = subprocess.run([exe, "explain", str(log), "--json"], capture_output=True, text=True, timeout=300)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"explain {log}: exit {p.returncode}: {p.stderr[-500:]}")
    return json.loads(p.stdout)


def judge(expect, report: dict) -> tuple[bool, str | None]:
    diags = report.get("diagnoses") or []
    got = diags[0]["code"] if diags else None
    if expect is None:
        return (not diags and bool(report.get("failure"))), got
    return got == expect, got


def logs_of(fid: str) -> list[tuple[str, Path]]:
    return [(p.stem, p) for p in sorted((LAB / fid).glob("*.log")) if p.stem in ("cpu", "gpu")]


def healthy_logs_of(fid: str) -> list[tuple[str, Path]]:
    """The fix's passing runs (cpu.fix.log, gpu.fix.log): explain must report no failure and no diagnosis."""
    return [(p.name.split(".")[0], p) for p in sorted((LAB / fid).glob("*.fix.log"))]


def expected_for(fault: dict, device: str):
    dev = fault.get(device) or {}
    return dev["expect"] if "expect" in dev else fault["expect"]


def score(ids: list[str], as_json: bool, device: str | None) -> int:
    rows = []
    for fid in ids:
        fault = load_fault(fid)
        for dev, log in logs_of(fid):
            if device and dev != device:
                continue
            rep = explain_json(log)
            exp = expected_for(fault, dev)
            ok, got = judge(exp, rep)
            root = (rep.get("root_error") or {}).get("text")
            if ok and fault.get("root"):
                ok = bool(root and re.search(fault["root"], root))
            rows.append({"id": fid, "area": fault["area"], "device": dev, "expect": exp, "got": got, "right": ok,
                         "failure": rep.get("failure"), "root_error": root})
        for dev, log in healthy_logs_of(fid):
            if device and dev != device:
                continue
            rep = explain_json(log)
            diags = rep.get("diagnoses") or []
            rows.append({"id": fid, "area": "healthy", "device": dev, "expect": "healthy",
                         "got": diags[0]["code"] if diags else None,
                         "right": rep.get("failure") is False and not diags, "failure": rep.get("failure"),
                         "root_error": (rep.get("root_error") or {}).get("text")})
    areas: dict = {}
    for r in rows:
        a = areas.setdefault(r["area"], {"right": 0, "total": 0})
        a["total"] += 1
        a["right"] += r["right"]
    split = {d: {"right": sum(r["right"] for r in rows if r["device"] == d),
                 "total": sum(1 for r in rows if r["device"] == d)} for d in ("cpu", "gpu")}
    total = {"right": sum(r["right"] for r in rows), "total": len(rows)}
    if as_json:
        print(json.dumps({"areas": areas, "devices": split, "total": total, "logs": rows}, indent=2))
        return 0
    w = max([len(a) for a in areas] + [4])
    print(f"{'area':<{w}}  right/total")
    for a in sorted(areas):
        print(f"{a:<{w}}  {areas[a]['right']:>3}/{areas[a]['total']}")
    for d, v in split.items():
        print(f"{d + ' logs':<{w}}  {v['right']:>3}/{v['total']}")
    pct = 100.0 * total["right"] / total["total"] if total["total"] else 0.0
    print(f"{'total':<{w}}  {total['right']:>3}/{total['total']}  ({pct:.0f}%)")
    misses = [r for r in rows if not r["right"]]
    if misses:
        print("\nmisses:")
        for r in misses:
            root = (r["root_error"] or "-")[:150]
            print(f"  {r['id']} [{r['device']}] expected {r['expect'] or 'no diagnosis'}, got {r['got'] or 'none'}"
                  f" (failure={r['failure']}); root: {root}")
    return 0


# ----------------------------------------------------------------------------------------------- CLI

def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="lab.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("list")
    pl.add_argument("--area")
    ps = sub.add_parser("show")
    ps.add_argument("id")
    ps.add_argument("--gpu", action="store_true")
    ps.add_argument("--fix", action="store_true")
    pr = sub.add_parser("run")
    pr.add_argument("ids", nargs="*")
    pr.add_argument("--gpu", action="store_true", help="on this machine's GPUs; records gpu.log")
    pr.add_argument("--fix", action="store_true", help="also rerun with the fix and record fix_verified")
    pr.add_argument("--only-fix", action="store_true", help="rerun only with the fix")
    pr.add_argument("--any-device", action="store_true",
                    help="also run faults whose `devices` leave this device out (to see whether they fail there too)")
    pr.add_argument("--out", type=Path, help="write logs here instead of tests/lab (fault.yaml is left alone)")
    pr.add_argument("--keep", action="store_true", help="keep the run folders under " + str(WORK))
    pr.add_argument("--area")
    pr.add_argument("--missing", action="store_true", help="only faults without a log for this device yet")
    pr.add_argument("--jobs", type=int, default=1, help="faults run side by side (a machine with many cores)")
    pr.add_argument("--results", type=Path, help="also write the outcomes as JSON here")
    pi = sub.add_parser("ingest", help="take logs and outcomes recorded on another machine (the GPU box)")
    pi.add_argument("folder", type=Path, help="holds <id>/<dev>.log files and results.json")
    pc = sub.add_parser("score")
    pc.add_argument("ids", nargs="*")
    pc.add_argument("--json", action="store_true")
    g = pc.add_mutually_exclusive_group()
    g.add_argument("--cpu-only", action="store_true")
    g.add_argument("--gpu-only", action="store_true")
    a = p.parse_args(argv)

    if a.cmd == "list":
        for fid in fault_ids():
            f = load_fault(fid)
            if a.area and f["area"] != a.area:
                continue
            logs = ",".join(d for d, _ in logs_of(fid)) or "-"
            print(f"{fid:<40} {f['area']:<12} {str(f['expect']):<8} {logs:<8} {f['title']}")
        return 0
    if a.cmd == "show":
        f = load_fault(a.id)

        class _Dumper(yaml.SafeDumper):
            pass

        def _str(dumper, value):
            style = "|" if "\n" in value else None
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

        _Dumper.add_representer(str, _str)
        print(yaml.dump(resolve(f, a.gpu, a.fix), Dumper=_Dumper, sort_keys=False, width=110))
        return 0
    if a.cmd == "ingest":
        results = json.loads((a.folder / "results.json").read_text())
        by_id: dict = {}
        for r in results:
            by_id.setdefault(r["id"], []).append(r)
        for fid, rs in sorted(by_id.items()):
            if not (LAB / fid / "fault.yaml").is_file():  # dropped after the run (it did not fail as planted)
                print(f"{fid}: not in the lab, skipped")
                continue
            for r in rs:
                if not r.get("fix") and not r.get("skipped"):
                    src = a.folder / fid / f"{r['device']}.log"
                    shutil.copyfile(src, LAB / fid / f"{r['device']}.log")
                elif r.get("fix") and r.get("passed") and (a.folder / fid / f"{r['device']}.fix.log").is_file():
                    shutil.copyfile(a.folder / fid / f"{r['device']}.fix.log", LAB / fid / f"{r['device']}.fix.log")
            record(fid, rs)
            print(f"{fid}: {len(rs)} outcome(s) recorded")
        return 0
    if a.cmd == "score":
        return score(a.ids or fault_ids(), a.json, "cpu" if a.cpu_only else "gpu" if a.gpu_only else None)

    ids = a.ids or fault_ids()
    bad = [i for i in ids if not (LAB / i / "fault.yaml").is_file()]
    if bad:
        raise SystemExit(f"unknown fault(s): {' '.join(bad)}")
    dev = "gpu" if a.gpu else "cpu"
    todo = []
    for fid in ids:
        f = load_fault(fid)
        if a.area and f["area"] != a.area:
            continue
        if a.missing and (LAB / fid / f"{dev}.log").exists():
            continue
        todo.append(fid)
    modes = [True] if a.only_fix else ([False, True] if a.fix else [False])

    record_lock = threading.Lock()
    done: list[dict] = []   # the outcomes so far, rewritten to --results after each fault (a killed batch keeps them)

    def one(fid: str) -> tuple[list[dict], int]:
        results, bad = [], 0
        for fix in modes:
            try:
                r = run_one(fid, a.gpu, fix, a.out, a.keep, a.any_device)
            except Exception as e:  # a broken setup is reported, the other faults still run
                print(f"{fid}: {'fix ' if fix else ''}setup/run error: {e}", flush=True)
                bad += 1
                continue
            results.append(r)
            if r.get("skipped"):
                print(f"{fid}: skipped ({r['skipped']})", flush=True)
                continue
            what = ("fix " + ("PASSED" if r["passed"] else "FAILED")) if fix else "fault"
            print(f"{fid} [{dev}] {what}: exit {r['exit']} in {r['seconds']} s"
                  + (" (timed out)" if r["timed_out"] else ""), flush=True)
            if fix and not r["passed"]:
                bad += 1
        with record_lock:              # as soon as this fault is done: a long batch keeps what it did
            if a.out is None and results:
                record(fid, results)
            if a.results:
                done.extend(results)
                a.results.write_text(json.dumps(done, indent=1))
        return results, bad

    failed = 0
    everything: list[dict] = []
    if a.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(a.jobs) as pool:
            outcomes = list(pool.map(one, todo))
    else:
        outcomes = [one(fid) for fid in todo]
    for fid, (results, bad) in zip(todo, outcomes):
        failed += bad
        everything += results
    if a.results:
        a.results.write_text(json.dumps(everything, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
