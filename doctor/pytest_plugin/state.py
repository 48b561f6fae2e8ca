"""The plugin's shared state and names: a leaf that the plugin's parts import (as pytest's
features share a StashKey), so that the entry module imports only pytest and this."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

DEFAULT_TIMEOUT_S = 300.0
STATE_KEY = pytest.StashKey["DoctorState"]()
PROBES_PLUGIN = "mgft-doctor-probes"
EXPLAIN_PLUGIN = "mgft-doctor-explain"
MARKER = "mgft_gpus"
ITEM_MARKER = "mgft_doctor"


class MgftDoctorWarning(UserWarning):
    """A probe passed with a warning (the doctor's `[!]`). `-W error::mgft_doctor.pytest_plugin.MgftDoctorWarning`
    or `--mgft-doctor-strict` turns it into a failure."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


class DoctorState:
    """Per-config state: the doctor's options and contexts, built on first use."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._options = None
        self._contexts: dict = {}
        self.requirements: dict = {}  # the marker's verdicts, once per (gpus, probes)

    # options ---------------------------------------------------------------
    @property
    def timeout(self) -> float:
        value = self.config.getoption("mgft_doctor_timeout")
        if value is not None:
            return value
        ini = (self.config.getini("mgft_doctor_timeout") or "").strip()
        if ini:
            try:
                return _positive_float(ini)
            except argparse.ArgumentTypeError as exc:
                raise pytest.UsageError(f"ini mgft_doctor_timeout = {ini}: {exc}")
        return DEFAULT_TIMEOUT_S

    @property
    def strict(self) -> bool:
        return bool(self.config.getoption("mgft_doctor_strict") or self.config.getini("mgft_doctor_strict"))

    @property
    def explain_enabled(self) -> bool:
        c = self.config
        return bool(c.getoption("mgft_doctor") or c.getoption("mgft_doctor_explain") or c.getini("mgft_doctor_explain"))

    def _path(self, value: str | None) -> str | None:
        if not value:
            return None
        return os.path.abspath(os.path.join(str(self.config.invocation_params.dir), os.path.expanduser(value)))

    def options(self):
        """The doctor's Options, with the same semantics as `mgft-doctor check` (NNODES,
        NODE_RANK, MASTER_ADDR/PORT from the environment)."""
        if self._options is None:
            from ..check.context import Options
            from ..errors import DoctorError

            c = self.config
            python = c.getoption("mgft_doctor_python")
            if python and os.sep not in python:  # a bare name: python3.11, found on PATH
                import shutil

                python = shutil.which(python) or python
            model = c.getoption("mgft_doctor_model")
            if model and os.path.exists(self._path(model)):
                model = self._path(model)
            try:
                self._options = Options.from_env(
                    nproc=c.getoption("mgft_doctor_nproc"), timeout=self.timeout,
                    python=self._path(python) if python else sys.executable,
                    config=self._path(c.getoption("mgft_doctor_config")), model=model,
                    deepspeed=self._path(c.getoption("mgft_doctor_deepspeed")),
                    trust_remote_code=c.getoption("mgft_doctor_trust_remote_code"))
            except DoctorError as exc:
                raise pytest.UsageError(f"mgft-doctor: {exc}")
        return self._options

    # contexts ----------------------------------------------------------------
    def context(self, nproc: int | None = None):
        """The session's Context; with nproc, one whose multi-rank probes use that many ranks
        (sharing the facts already read, and the base context when it means the same)."""
        from ..check.context import Context

        base = self._contexts.get(None)
        if base is None:
            base = self._contexts[None] = Context(self.options())
        if nproc is None or nproc == base.nproc:
            return base
        ctx = self._contexts.get(nproc)
        if ctx is None:
            import dataclasses

            _ = base.facts  # read once, shared below
            ctx = self._contexts[nproc] = Context(dataclasses.replace(self.options(), nproc=nproc))
            for name in ("facts", "topology"):  # cached_property values read once per session
                if name in base.__dict__:
                    ctx.__dict__[name] = base.__dict__[name]
        return ctx

    def run_probes(self, ctx, probes) -> list:
        """Run (or reuse) the given probes in ctx, in registry order; results in that order."""
        from ..check.runner import run_probe

        out = []
        for probe in probes:
            res = ctx.results.get(probe.id)
            if res is None:
                res = ctx.results[probe.id] = run_probe(probe, ctx)
            out.append(res)
        return out


def state(config: pytest.Config) -> DoctorState:
    st = config.stash.get(STATE_KEY, None)
    if st is None:
        st = config.stash[STATE_KEY] = DoctorState(config)
    return st
