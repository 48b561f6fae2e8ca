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

import pytest

from .state import (DEFAULT_TIMEOUT_S, EXPLAIN_PLUGIN, ITEM_MARKER, MARKER, PROBES_PLUGIN, STATE_KEY, DoctorState,
                    MgftDoctorWarning, _positive_float, _positive_int, state)

__all__ = ["DEFAULT_TIMEOUT_S", "DoctorState", "MgftDoctorWarning", "STATE_KEY", "mgft_ranks", "state"]


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
                    help="ranks for the multi-rank probes (default: one per visible GPU; 2 gloo ranks without a GPU)")
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


# --------------------------------------------------------------------------- hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(n, probes=None): skip unless n GPUs are visible to torch and the mgft-doctor probes "
        "pass (default: nccl.allreduce for n >= 2); the probes run once per session")
    config.addinivalue_line("markers", f"{ITEM_MARKER}: an mgft-doctor probe collected by --mgft-doctor")
    if config.getoption("mgft_doctor", False):
        from .probes import ProbesPlugin

        plugin = ProbesPlugin(state(config))
        plugin.validate()
        config.pluginmanager.register(plugin, PROBES_PLUGIN)
    if state(config).explain_enabled:
        from .explain import ExplainPlugin

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
    from .marker import MarkerError, marker_args, requirement

    try:
        gpus, selectors = marker_args(marker)
        reason = requirement(state(item.config), gpus, selectors)
    except MarkerError as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)
    if reason:
        try:
            raise pytest.skip.Exception(reason, _use_item_location=True)
        except TypeError:  # a pytest without the keyword: plain skip
            pytest.skip(reason)


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
    from .ranks import RankRunner

    runner = RankRunner(state(request.config))
    yield runner
    runner.cleanup()
