"""`mgft-doctor fix CONFIG`: the repairs of the config rules as a unified diff; `--write`
applies them and keeps the original as CONFIG.bak. Without --write nothing is changed."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys

from ..errors import EXIT_FAILURE, EXIT_OK, DoctorError
from ..runconfig import load_run_config
from ..runconfig.ds_rules import repaired


def add_arguments(f) -> None:
    f.add_argument("config", help="ds_config.json or train.yaml")
    f.add_argument("--write", action="store_true", help="apply the repair (the original is kept as FILE.bak)")
    f.add_argument("--world-size", type=int, default=None, help="number of GPUs the run uses (for batch arithmetic)")


def run_fix(args) -> int:
    rc = load_run_config(args.config)
    if rc.ds is None:
        if rc.ds_error:
            raise DoctorError(rc.ds_error)
        raise DoctorError(f"{args.config}: names no DeepSpeed config; nothing to repair")
    env_world = os.environ.get("WORLD_SIZE", "").strip()
    if args.world_size is None and env_world and not env_world.isdigit():
        raise DoctorError(f"WORLD_SIZE={env_world!r} is not a number of GPUs (set a number, or pass --world-size)")
    world = args.world_size or int(env_world or 0) or 1
    if args.world_size is None and not rc.yaml_path:
        sys.stderr.write("mgft-doctor: assuming world size 1; pass --world-size N for N GPUs\n")
    fixed, applied = repaired(rc, world, None)
    path = rc.ds_path
    before = open(path, encoding="utf-8").read()
    after = json.dumps(fixed, indent=2) + "\n"
    if not applied or json.loads(before) == fixed:
        print(f"{path}: nothing to repair")
        return EXIT_OK
    for p in applied:
        print(f"# {p.message}")
    sys.stdout.writelines(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                               fromfile=path, tofile=path + " (repaired)"))
    if not args.write:
        print("\n(not written: run again with --write to apply; the original is kept as .bak)")
        return EXIT_FAILURE
    backup = path + ".bak"
    if os.path.exists(backup):
        raise DoctorError(f"{backup} already exists; move it away first (it may be an earlier original)")
    shutil.copy2(path, backup)
    tmp = path + ".mgft-doctor.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(after)
    os.replace(tmp, path)
    print(f"\nwrote {path} (original kept as {backup})")
    return EXIT_OK
