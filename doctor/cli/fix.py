"""`mgft-doctor fix CONFIG`: the repairs of the config rules as a unified diff; `--write`
applies them and keeps the original as FILE.bak. Without --write nothing is changed.

fix and check tell one story: the same rules (runconfig/ds_rules.py), the same world size
(config.deepspeed's, over the same Context: visible GPUs, 2 without any, times the nodes) unless
--world-size or WORLD_SIZE says it. Each repair is labelled safe or unsafe as ruff labels its
fixes; --unsafe applies the unsafe ones too. Every repaired config is checked again before it is
shown: a repair that leaves a new failure is refused, never written."""

from __future__ import annotations

import dataclasses
import os
import sys
from functools import cached_property

from ..errors import EXIT_CRASH, EXIT_FAILURE, EXIT_OK, DoctorError
from ..runconfig import RunConfig, load_run_config
from ..runconfig import ds_rules
from ..runconfig.editing import json_text, unified_diff, write_carefully, yaml_text

MAX_WORLD = 1 << 20


def add_arguments(f) -> None:
    f.add_argument("config", help="ds_config.json or train.yaml")
    f.add_argument("--write", action="store_true", help="apply the repair (the original is kept as FILE.bak)")
    f.add_argument("--unsafe", action="store_true",
                   help="apply unsafe repairs too (numbers the doctor picks: a global batch, a time limit)")
    f.add_argument("--no-trainer", action="store_true",
                   help="the JSON goes to deepspeed.initialize (no HF Trainer/accelerate/LLaMA-Factory fills its "
                        "\"auto\" values): write numbers for them")
    f.add_argument("--world-size", type=int, default=None,
                   help="number of GPUs the run uses (default: $WORLD_SIZE, else what check assumes)")


class Machine:
    """The world size and the GPUs' bf16 as config.deepspeed sees them, read (a facts subprocess)
    only when asked."""

    def __init__(self, world_size: int | None):
        self.given = _given_world(world_size)

    @cached_property
    def ctx(self):
        from ..check.context import Context, Options

        return Context(Options.from_env())

    @cached_property
    def world(self) -> int:
        if self.given is not None:
            return self.given
        from ..probes.config_deepspeed import world_size

        n = world_size(self.ctx)
        sys.stderr.write(f"mgft-doctor: world size {n}, as check assumes ({self.ctx.facts.gpu_count} GPU(s) visible "
                         f"here, {self.ctx.nproc} per node × {self.ctx.options.nnodes} node(s)); pass --world-size N "
                         "for the run's\n")
        return n

    @cached_property
    def gpu_bf16(self) -> bool | None:
        from ..probes.config_deepspeed import gpu_bf16

        return gpu_bf16(self.ctx)


def _given_world(world_size: int | None) -> int | None:
    """--world-size, else $WORLD_SIZE (as torchrun sets it), checked: a whole number of GPUs."""
    if world_size is not None:
        if not 1 <= world_size <= MAX_WORLD:
            raise DoctorError(f"--world-size must be a number of GPUs, 1 to {MAX_WORLD}, not {world_size}")
        return world_size
    env_world = os.environ.get("WORLD_SIZE", "").strip()
    if not env_world:
        return None
    if not env_world.isdigit():
        raise DoctorError(f"WORLD_SIZE={env_world!r} is not a number of GPUs (set a number, or pass --world-size)")
    if not 1 <= int(env_world) <= MAX_WORLD:
        raise DoctorError(f"WORLD_SIZE={env_world} is not a number of GPUs, 1 to {MAX_WORLD} (or pass --world-size)")
    return int(env_world)


def run_fix(args) -> int:
    rc = load_run_config(args.config)
    if args.no_trainer and rc.yaml_path:
        raise DoctorError(f"--no-trainer is for a DeepSpeed JSON given alone; {args.config} runs through "
                          "LLaMA-Factory's Trainer, which fills \"auto\"")
    rc.for_initialize = bool(args.no_trainer)
    if rc.ds_error:
        raise DoctorError(rc.ds_error)
    if rc.ds is None and not rc.yaml_path:
        raise DoctorError(f"{args.config}: names no DeepSpeed config; nothing to repair")
    machine = Machine(args.world_size)
    world = machine.world
    bf16 = machine.gpu_bf16 if "ctx" in machine.__dict__ or ds_rules.bf16_enters(rc) else None
    plan = ds_rules.plan_repairs(rc, world, bf16, unsafe=args.unsafe)
    verify(rc, plan, world, bf16, args.unsafe)
    edits = file_edits(rc, plan)
    report(plan)
    if not edits:
        print(f"{args.config}: nothing to repair" if not plan.held_back else
              f"{args.config}: nothing applied: {len(plan.held_back)} unsafe repair(s) need --unsafe")
        return EXIT_FAILURE if plan.held_back else EXIT_OK
    for path, before, after in edits:
        sys.stdout.write(unified_diff(before, after, path, f"{path} (repaired: {_labels(plan, path, rc)})"))
    if not args.write:
        print("\n(not written: run again with --write to apply; the original is kept as .bak)")
        return EXIT_FAILURE
    refuse_elsewhere(rc, edits)
    for path, before, after in edits:
        backup = write_carefully(path, before, after)
        print(f"\nwrote {path} (original kept as {backup})")
    return EXIT_OK


def verify(rc: RunConfig, plan: ds_rules.Repairs, world: int, bf16: bool | None, unsafe: bool) -> None:
    """The repaired config, checked again: no failure that was not there before, nothing left that
    the same repairs would change again. Either would be the doctor's bug: said, nothing written."""
    fixed = dataclasses.replace(rc, ds=plan.deepspeed, yaml=plan.yaml)
    before = {(p.code, p.message) for p in ds_rules.check(rc, world, bf16) if p.severity == "fail"}
    new_fails = [p for p in ds_rules.check(fixed, world, bf16) if p.severity == "fail" and (p.code, p.message) not in before]
    again = ds_rules.plan_repairs(fixed, world, bf16, unsafe).applied
    if new_fails or again:
        what = (new_fails or again)[0]
        raise DoctorError(f"the repair of {rc.yaml_path or rc.ds_path} would leave {what.code} ({what.message}); nothing "
                          "written (a bug of mgft-doctor: please report it with the config)", exit_code=EXIT_CRASH)


def file_edits(rc: RunConfig, plan: ds_rules.Repairs) -> list[tuple[str, str, str]]:
    """(path, text as read, repaired text) for each file a repair changes."""
    edits = []
    if plan.deepspeed is not None and plan.deepspeed != rc.ds and rc.ds_path and rc.ds_text is not None:
        edits.append((rc.ds_path, rc.ds_text, json_text(plan.deepspeed, like=rc.ds_text)))
    if rc.yaml_path and plan.yaml != rc.yaml:
        edits.append((rc.yaml_path, rc.yaml_text, yaml_text(rc.yaml_text, rc.yaml, plan.yaml, rc.yaml_path)))
    return edits


def refuse_elsewhere(rc: RunConfig, edits) -> None:
    """Write only the DeepSpeed JSON the run opens: LLaMA-Factory hands `deepspeed:` to
    transformers as a plain path, relative to the folder llamafactory-cli starts in."""
    if rc.ds_path in {path for path, _, _ in edits} and rc.yaml_path and not rc.ds_from_cwd:
        raise DoctorError(f"{rc.ds_ref!r} (deepspeed: in {rc.yaml_path}) is opened relative to the folder "
                          f"llamafactory-cli starts in; from here ({os.getcwd()}) it is not there, so nothing is "
                          f"written: run `mgft-doctor fix --write` from {rc.ds_base}, where the run starts")


def report(plan: ds_rules.Repairs) -> None:
    for p in plan.applied:
        print(f"# {p.label}: {p.code} {p.message}")
    for p in plan.held_back:
        print(f"# unsafe, not applied (pass --unsafe): {p.code} {p.message}")
    for p in plan.manual:
        print(f"# no automatic repair: {p.code} {p.message}")


def _labels(plan: ds_rules.Repairs, path: str, rc: RunConfig) -> str:
    target = "yaml" if path == rc.yaml_path else "deepspeed"
    mine = [p for p in plan.applied if p.target == target]
    safe = sum(p.safe for p in mine)
    return f"{safe} safe, {len(mine) - safe} unsafe"
