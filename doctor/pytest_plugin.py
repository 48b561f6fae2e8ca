"""pytest plugin of mgft-doctor (entry point `pytest11: mgft_doctor`).

Loaded into every pytest run of anyone who installs the package, so it is inert unless asked:
without an option it registers its options, ini keys, a marker and a fixture, and nothing
else runs. This module imports only pytest and the standard library; the doctor itself is
imported when a feature is used.

- `--mgft-doctor`: every registered probe becomes a test item `mgft-doctor::<probe id>`
  (pytest_probes.py); failures of ordinary tests get a "mgft-doctor diagnosis" section.
- `--mgft-doctor-explain` (or ini `mgft_doctor_explain = true`): only the diagnosis
  (pytest_explain.py).
- `@pytest.mark.mgft_gpus(N, probes=[...])`: skip a test unless N GPUs are visible and the
  probes pass (run once per session and cached).
- fixture `mgft_ranks`: run a top-level function on N ranks under the doctor's launcher
  (pytest_ranks.py).
"""

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


# --------------------------------------------------------------------------- options


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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mgft-doctor", "mgft-doctor (multi-GPU fine-tuning doctor)")
    group.addoption("--mgft-doctor", action="store_true", default=False, dest="mgft_doctor",
                    help="run the doctor's probes as test items 'mgft-doctor::<probe id>' (select with -k or "
                         "--mgft-doctor-only) and diagnose failing tests from their output")
    group.addoption("--mgft-doctor-only", action="append", default=[], metavar="ID", dest="mgft_doctor_only",
                    help="collect only these probe ids or families (repeatable, comma-separated): "
                         "--mgft-doctor-only nccl,gpu.visible")
    group.addoption("--mgft-doctor-skip", action="append", default=[], metavar="ID", dest="mgft_doctor_skip",
                    help="do not collect these probe ids or families")
    group.addoption("--mgft-doctor-config", metavar="PATH", default=None, dest="mgft_doctor_config",
                    help="LLaMA-Factory train YAML or DeepSpeed JSON: adds the run-specific checks")
    group.addoption("--mgft-doctor-deepspeed", metavar="PATH", default=None, dest="mgft_doctor_deepspeed",
                    help="DeepSpeed JSON (overrides the one the YAML names)")
    group.addoption("--mgft-doctor-model", metavar="PATH", default=None, dest="mgft_doctor_model",
                    help="model folder (or hub id) whose architecture the ZeRO-3 probe builds")
    group.addoption("--mgft-doctor-trust-remote-code", action="store_true", default=False,
                    dest="mgft_doctor_trust_remote_code", help="allow the model's own Python code to run")
    group.addoption("--mgft-doctor-nproc", type=_positive_int, default=None, metavar="N", dest="mgft_doctor_nproc",
                    help="ranks for the multi-rank probes (default: visible GPUs, at least 2)")
    group.addoption("--mgft-doctor-timeout", type=_positive_float, default=None, metavar="SECONDS",
                    dest="mgft_doctor_timeout",
                    help="time limit of each multi-rank run or build, and of mgft_ranks "
                         f"(default: ini mgft_doctor_timeout or {DEFAULT_TIMEOUT_S:.0f})")
    group.addoption("--mgft-doctor-python", metavar="PATH", default=None, dest="mgft_doctor_python",
                    help="the Python of the training environment the probes examine (default: this one)")
    group.addoption("--mgft-doctor-strict", action="store_true", default=False, dest="mgft_doctor_strict",
                    help="a probe that warns fails (as `mgft-doctor check --strict`)")
    group.addoption("--mgft-doctor-explain", action="store_true", default=False, dest="mgft_doctor_explain",
                    help="diagnose failing tests from their output without running the probes "
                         "(implied by --mgft-doctor)")
    parser.addini("mgft_doctor_explain", type="bool", default=False,
                  help="diagnose failing tests with mgft-doctor explain (as --mgft-doctor-explain)")
    parser.addini("mgft_doctor_timeout", type="string", default="",
                  help=f"default of --mgft-doctor-timeout, seconds ({DEFAULT_TIMEOUT_S:.0f})")
    parser.addini("mgft_doctor_strict", type="bool", default=False, help="default of --mgft-doctor-strict")


# --------------------------------------------------------------------------- state


class DoctorState:
    """Per-config state: the doctor's options and contexts, built on first use."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._options = None
        self._contexts: dict = {}
        self._requirements: dict = {}

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
            from .check_cli import options_from_args
            from .errors import DoctorError

            c = self.config
            python = c.getoption("mgft_doctor_python")
            if python and os.sep not in python:  # a bare name: python3.11, found on PATH
                import shutil

                python = shutil.which(python) or python
            ns = argparse.Namespace(
                nproc=c.getoption("mgft_doctor_nproc"), timeout=self.timeout,
                python=self._path(python) if python else sys.executable,
                nnodes=None, node_rank=None, master_addr=None, master_port=None,
                config=self._path(c.getoption("mgft_doctor_config")),
                model=c.getoption("mgft_doctor_model"), deepspeed=self._path(c.getoption("mgft_doctor_deepspeed")),
                trust_remote_code=c.getoption("mgft_doctor_trust_remote_code"))
            if ns.model and os.path.exists(self._path(ns.model)):
                ns.model = self._path(ns.model)
            try:
                self._options = options_from_args(ns)
            except DoctorError as exc:
                raise pytest.UsageError(f"mgft-doctor: {exc}")
        return self._options

    # contexts ----------------------------------------------------------------
    def context(self, nproc: int | None = None):
        """The session's Context; with nproc, one whose multi-rank probes use that many ranks
        (sharing the facts already read, and the base context when it means the same)."""
        from .context import Context

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
        from .runner import run_probe

        out = []
        for probe in probes:
            res = ctx.results.get(probe.id)
            if res is None:
                res = ctx.results[probe.id] = run_probe(probe, ctx)
            out.append(res)
        return out

    # the marker ------------------------------------------------------------
    def requirement(self, gpus: int, selectors: tuple[str, ...] | None) -> str | None:
        """None when `gpus` GPUs are visible and the probes pass; else the skip reason."""
        key = (gpus, selectors)
        if key not in self._requirements:
            self._requirements[key] = self._check_requirement(gpus, selectors)
        return self._requirements[key]

    def _check_requirement(self, gpus: int, selectors: tuple[str, ...] | None) -> str | None:
        from .probe import Status
        from .probes_registry import all_probes

        registry = all_probes()
        if selectors is None:
            selectors = ("nccl.allreduce",) if gpus >= 2 else ("gpu.visible",) if gpus == 1 else ()
        chosen = _with_needs(registry, _select(registry, selectors))
        head = f"{MARKER}({gpus})"
        ctx = self.context(gpus if gpus >= 2 else None)
        if gpus:
            facts = ctx.facts  # torch's view, read once per session (a subprocess of the Python examined)
            why = facts.raw.get("facts_error") or facts.raw.get("torch_error")
            if why:
                return f"{head}: needs {gpus} GPU(s); torch cannot tell in {ctx.options.python}: {_short(why)}"
            if facts.gpu_count < gpus:
                cvd = facts.raw.get("cuda_visible_devices")
                return (f"{head}: needs {gpus} GPU(s), {facts.gpu_count} visible to torch"
                        + (f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""))
        verbs = {Status.FAIL: "failed", Status.ERROR: "crashed", Status.SKIP: "was skipped"}
        for res in self.run_probes(ctx, chosen):
            if res.status in verbs:
                what = res.summary.removeprefix("skipped: ")
                if res.findings:
                    f = next((f for f in res.findings if f.severity is Status.FAIL), res.findings[0])
                    what = f"{f.code} {f.message}"
                return f"{head}: probe {res.id} {verbs[res.status]}: {_short(what)}"
        return None


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _split(values) -> list[str]:
    return [v.strip() for item in values for v in str(item).split(",") if v.strip()]


def _select(registry, selectors) -> list:
    from .errors import DoctorError
    from .runner import select

    try:
        return select(registry, list(selectors) or None, None) if selectors else []
    except DoctorError as exc:
        raise _MarkerError(str(exc))


def _with_needs(registry, chosen) -> list:
    """chosen plus every probe they need, transitively, in registry order."""
    by_id = {p.id: p for p in registry}
    want = set()
    todo = [p.id for p in chosen]
    while todo:
        pid = todo.pop()
        if pid in want or pid not in by_id:
            continue
        want.add(pid)
        todo.extend(by_id[pid].needs)
    return [p for p in registry if p.id in want]


class _MarkerError(Exception):
    pass


def state(config: pytest.Config) -> DoctorState:
    st = config.stash.get(STATE_KEY, None)
    if st is None:
        st = config.stash[STATE_KEY] = DoctorState(config)
    return st


# --------------------------------------------------------------------------- hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(n, probes=None): skip unless n GPUs are visible to torch and the mgft-doctor probes "
        "pass (default: nccl.allreduce for n >= 2); the probes run once per session")
    config.addinivalue_line("markers", f"{ITEM_MARKER}: an mgft-doctor probe collected by --mgft-doctor")
    if config.getoption("mgft_doctor", False):
        from .pytest_probes import ProbesPlugin

        plugin = ProbesPlugin(state(config))
        plugin.validate()
        config.pluginmanager.register(plugin, PROBES_PLUGIN)
    if state(config).explain_enabled:
        from .pytest_explain import ExplainPlugin

        config.pluginmanager.register(ExplainPlugin(), EXPLAIN_PLUGIN)


def pytest_unconfigure(config: pytest.Config) -> None:
    for name in (PROBES_PLUGIN, EXPLAIN_PLUGIN):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin, name)
    if STATE_KEY in config.stash:
        del config.stash[STATE_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    __tracebackhide__ = True
    try:
        gpus, selectors = _marker_args(marker)
        reason = state(item.config).requirement(gpus, selectors)
    except _MarkerError as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)
    if reason:
        try:
            raise pytest.skip.Exception(reason, _use_item_location=True)
        except TypeError:  # a pytest without the keyword: plain skip
            pytest.skip(reason)


def _marker_args(marker) -> tuple[int, tuple[str, ...] | None]:
    args, kwargs = list(marker.args), dict(marker.kwargs)
    if "gpus" in kwargs:
        args.insert(0, kwargs.pop("gpus"))
    probes = kwargs.pop("probes", None)
    if kwargs:
        raise _MarkerError(f"unexpected argument(s) {', '.join(sorted(kwargs))}; use {MARKER}(n, probes=[...])")
    if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], int) or args[0] < 0:
        raise _MarkerError(f"takes one GPU count (an integer >= 0), e.g. @pytest.mark.{MARKER}(2); got {marker.args!r}")
    if probes is None:
        return args[0], None
    if isinstance(probes, str):
        probes = [probes]
    return args[0], tuple(_split(probes))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def mgft_ranks(request: pytest.FixtureRequest):
    """Run a top-level function on N ranks under the doctor's launcher and return each rank's
    result: ``mgft_ranks(fn, nproc=2, backend="auto", timeout=None, args=(), kwargs=None,
    env=None) -> [result of rank 0, result of rank 1, ...]``.

    ``fn(rank, world_size, *args, **kwargs)`` is imported by module and name on every rank
    (torchrun, a fresh temporary folder, this Python); the process group is initialised first
    (NCCL when every local rank has a GPU, gloo otherwise; ``backend="none"`` skips it). Its
    return value must be JSON-serialisable. A rank that raises fails the test with that rank's
    traceback; a hang ends at the time limit (``--mgft-doctor-timeout``, 300 s) with a failure
    naming the silent ranks, and no process of the run is left behind."""
    from .pytest_ranks import RankRunner

    runner = RankRunner(state(request.config))
    yield runner
    runner.cleanup()
