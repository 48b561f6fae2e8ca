"""The pytest plugin, tested the way pytest tests its own plugins: pytester runs sample
projects and we read their outcomes, terminal output, reports and JUnit XML.

Fast tests run in-process with fake probes (the registry is monkeypatched for that run only);
the tests marked slow start real ranks, so they run pytest in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
import xml.etree.ElementTree as ET

import mgft_doctor.cli.check
import mgft_doctor.explain
import mgft_doctor.check.registry
import mgft_doctor.pytest_plugin.explain
import mgft_doctor.pytest_plugin.probes
import mgft_doctor.pytest_plugin.ranks
import pytest

from mgft_doctor.probes._codes import RANK_DIED
from mgft_doctor.check.probe import Finding, Probe, Status, result, skipped

# In-process pytester runs drop the modules first imported during the run; the doctor's (and
# yaml's, whose C loader keeps per-class state) must outlive them, so they are imported here.
mgft_doctor.check.registry.all_probes()
mgft_doctor.explain.load_catalog()

NO_SYNC = ("[rank0]: AssertionError: no_sync context manager is incompatible with gradient partitioning "
           "logic of ZeRO stage 3")
QUICK_PROBES = "gpu.visible,nccl.shm,nccl.allreduce"


# --------------------------------------------------------------------------- fake probes

CALLS: list[str] = []


def _pass(ctx):
    CALLS.append("fake.pass")
    return result("fake.pass", "Always passes", "all good", metrics={"busbw_GBps": 12.5, "sizes": [1, 2]},
                  details=["ran nothing"])


def _warn(ctx):
    CALLS.append("fake.warn")
    return result("fake.warn", "Warns", "tight", [Finding("MGD201", "/dev/shm is 512 MiB", "docker run --shm-size=16g",
                                                         Status.WARN)])


def _skip(ctx):
    CALLS.append("fake.skip")
    return skipped("fake.skip", "Skips", "skipped: needs 2 GPUs, 0 visible")


def _fail(ctx):
    CALLS.append("fake.fail")
    return result("fake.fail", "Fails", "the gloo all-reduce on 2 ranks hung",
                  [Finding("MGD301", "no answer within 20 s from rank 1 (at 'init_process_group')",
                           "export NCCL_P2P_DISABLE=1")])


def _error(ctx):
    CALLS.append("fake.error")
    raise RuntimeError("the probe has a bug")


FAKES = [Probe("fake.pass", "Always passes", _pass), Probe("fake.warn", "Warns", _warn),
         Probe("fake.skip", "Skips", _skip), Probe("fake.fail", "Fails", _fail),
         Probe("fake.error", "Crashes", _error), Probe("fake.needy", "Needs fake.fail", _pass, needs=("fake.fail",))]


@pytest.fixture
def fakes(monkeypatch):
    """The registry holds the fake probes during this test's in-process pytest runs."""
    import mgft_doctor.check.registry as registry  # the module in sys.modules now, as the plugin will see it

    CALLS.clear()
    monkeypatch.setattr(registry, "all_probes", lambda: list(FAKES))
    monkeypatch.delenv("MGFT_DOCTOR_INJECT_FAULT", raising=False)
    return CALLS


def junit(path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    return {f"{tc.get('classname')}::{tc.get('name')}": tc for tc in root.iter("testcase")}


def props(tc: ET.Element) -> list[tuple[str, str]]:
    return [(p.get("name"), p.get("value")) for p in tc.iter("property")]


def report_of(res, nodeid_end: str, when: str = "call"):
    reports = [r for r in res.reprec.getreports("pytest_runtest_logreport")
               if r.nodeid.endswith(nodeid_end) and r.when == when]
    assert len(reports) == 1, [r.nodeid for r in res.reprec.getreports("pytest_runtest_logreport")]
    return reports[0]


# --------------------------------------------------------------------------- inactive unless asked


def test_plugin_is_registered_and_light():
    """The entry point loads a module that imports only pytest: nothing of the doctor's machinery."""
    code = ("import sys, importlib.metadata as m; "
            "ep = [e for e in m.entry_points(group='pytest11') if e.name == 'mgft_doctor'][0]; "
            "ep.load(); print(sorted(n for n in sys.modules if n.startswith('mgft_doctor') or n == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out.strip().replace("'", '"')) == ["mgft_doctor", "mgft_doctor.pytest_plugin", "mgft_doctor.pytest_plugin.state"]


def test_inactive_without_the_option(pytester):
    pytester.makepyfile(test_a=f"""
        def test_ok():
            pass

        def test_known_error():
            print({NO_SYNC!r})
            assert False
    """)
    pytester.makeconftest("""
        import sys
        def pytest_sessionfinish(session):
            loaded = sorted(n for n in sys.modules if n.startswith("mgft_doctor."))
            session.config._loaded = loaded
        def pytest_terminal_summary(terminalreporter, config):
            terminalreporter.write_line("LOADED " + " ".join(config._loaded))
    """)
    res = pytester.runpytest_subprocess("-rA", "--junitxml=out.xml")
    res.assert_outcomes(passed=1, failed=1)
    out = res.stdout.str()
    assert "mgft-doctor::" not in out and "mgft-doctor diagnos" not in out and "mgft-doctor 0" not in out
    # nothing of the doctor was imported beyond the plugin module itself
    assert [ln for ln in res.stdout.lines if ln.startswith("LOADED")] == ["LOADED mgft_doctor.pytest_plugin mgft_doctor.pytest_plugin.state"]
    assert "mgft_doctor" not in (pytester.path / "out.xml").read_text()
    collected = pytester.runpytest_subprocess("--co", "-q").stdout.str()
    assert "mgft-doctor::" not in collected and "2 tests collected" in collected


def test_options_and_marker_documented(pytester):
    res = pytester.runpytest("--help")
    for opt in ("--mgft-doctor ", "--mgft-doctor-nproc=N", "--mgft-doctor-config=PATH", "--mgft-doctor-timeout=SECONDS",
                "--mgft-doctor-only=ID", "--mgft-doctor-explain", "mgft_doctor_explain"):
        assert opt in res.stdout.str(), opt
    assert "@pytest.mark.mgft_gpus(n, probes=None)" in pytester.runpytest("--markers").stdout.str()


def test_bad_options_are_usage_errors(pytester, fakes):
    res = pytester.runpytest("--mgft-doctor", "--mgft-doctor-only", "nope")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*mgft-doctor: unknown probe id or family 'nope'*"])
    res = pytester.runpytest("--mgft-doctor-nproc", "0")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--mgft-doctor-nproc: must be at least 1*"])
    res = pytester.runpytest("--mgft-doctor", "--mgft-doctor-python=/no/such/python")
    assert res.ret == pytest.ExitCode.USAGE_ERROR and "/no/such/python: no such interpreter" in res.stderr.str()
    bad = pytester.makefile(".yaml", train="model_name_or_path: [unclosed\n")
    res = pytester.runpytest("--mgft-doctor", f"--mgft-doctor-config={bad}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR and "train.yaml" in res.stderr.str()


# --------------------------------------------------------------------------- probes as items


def test_probes_become_items(pytester, fakes):
    pytester.makepyfile(test_user="def test_user():\n    pass\n")
    res = pytester.runpytest("--mgft-doctor", "--co", "-q")
    lines = [ln for ln in res.stdout.lines if "::" in ln]
    # the probes come first, in registry order, then the user's tests
    assert lines == [f"mgft-doctor::{p.id}" for p in FAKES] + ["test_user.py::test_user"]
    assert fakes == []  # collecting runs nothing


def test_broken_probe_module_is_a_collection_error(pytester, monkeypatch):
    import mgft_doctor.check.registry as registry

    def broken():
        raise ImportError("cannot import name 'Thing' from 'mgft_doctor.probes.zero3_model'")

    monkeypatch.setattr(registry, "all_probes", broken)
    pytester.makepyfile(test_user="def test_user():\n    pass\n")
    res = pytester.runpytest("--mgft-doctor")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    res.stdout.fnmatch_lines(["*ERROR collecting mgft-doctor*", "*ImportError: cannot import name 'Thing'*",
                              "*Interrupted: 1 error during collection*"])


def test_probe_outcomes(pytester, fakes):
    res = pytester.runpytest("--mgft-doctor", "-rA", "-p", "no:cacheprovider", "--junitxml=out.xml")
    res.assert_outcomes(passed=2, skipped=2, failed=2, warnings=1)
    out = res.stdout.str()
    # skip: the doctor's reason, at the probe's node id (not the plugin's source line)
    res.stdout.fnmatch_lines(["SKIPPED [[]1[]] mgft-doctor::fake.skip: needs 2 GPUs, 0 visible",
                              "SKIPPED [[]1[]] mgft-doctor::fake.needy: needs fake.fail, which did not pass"])
    # fail: code, message and fix, headed by the probe, with no traceback of the plugin
    res.stdout.fnmatch_lines(["*_ fake.fail: Fails _*",
                              "[[]✗[]] Fails (fake.fail) failed",
                              "    ✗ MGD301 no answer within 20 s from rank 1 (at 'init_process_group')",
                              "      fix: export NCCL_P2P_DISABLE=1",
                              "FAILED mgft-doctor::fake.fail - MGD301 no answer within 20 s*"])
    assert "pytest_probes.py" not in out and "ProbeFailed" not in out
    # error: shown as crashed with the probe's own traceback tail, never as a pass
    res.stdout.fnmatch_lines(["[[]E[]] Crashes (fake.error) crashed*", "*RuntimeError: the probe has a bug*"])
    # warn: passed, with the finding in the warnings summary
    res.stdout.fnmatch_lines(["*MgftDoctorWarning: fake.warn: MGD201 /dev/shm is 512 MiB (fix: docker run --shm-size=16g)"])
    # the probe's details are a report section (-rA shows them for passes)
    res.stdout.fnmatch_lines(["*- mgft-doctor probe -*", "✓ fake.pass: all good (*s)", "  ran nothing"])

    cases = junit(pytester.path / "out.xml")
    assert set(cases) == {f"mgft-doctor::{p.id}" for p in FAKES}
    failed = cases["mgft-doctor::fake.fail"]
    failure = failed.find("failure")
    assert failure.get("message").startswith("MGD301 no answer within 20 s")
    assert "fix: export NCCL_P2P_DISABLE=1" in failure.text
    assert ("mgft_doctor_code", "MGD301") in props(failed) and ("mgft_doctor_status", "fail") in props(failed)
    passed = props(cases["mgft-doctor::fake.pass"])
    assert ("mgft_doctor_status", "pass") in passed and ("mgft_doctor_metric_busbw_GBps", "12.5") in passed
    assert not any(name == "mgft_doctor_metric_sizes" for name, _ in passed)  # only scalar metrics
    assert ("mgft_doctor_status", "warn") in props(cases["mgft-doctor::fake.warn"])
    assert cases["mgft-doctor::fake.skip"].find("skipped").get("message") == "needs 2 GPUs, 0 visible"
    assert ("mgft_doctor_status", "error") in props(cases["mgft-doctor::fake.error"])


def test_selection_with_k_and_only(pytester, fakes):
    res = pytester.runpytest("--mgft-doctor", "-k", "fake.pass or fake.warn")
    res.assert_outcomes(passed=2, deselected=4, warnings=1)
    assert fakes == ["fake.pass", "fake.warn"]
    fakes.clear()
    res = pytester.runpytest("--mgft-doctor", "--mgft-doctor-only", "fake.fail,fake.pass", "--mgft-doctor-skip=fake.pass")
    res.assert_outcomes(failed=1)
    assert fakes == ["fake.fail"]
    fakes.clear()
    res = pytester.runpytest("--mgft-doctor", "-m", "not mgft_doctor")
    assert fakes == [] and res.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_strict_makes_warnings_fail(pytester, fakes):
    res = pytester.runpytest("--mgft-doctor", "--mgft-doctor-only=fake.warn", "--mgft-doctor-strict")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["[[]![]] Warns (fake.warn) warned*", "*MGD201 /dev/shm is 512 MiB"])
    # pytest's own way gives the same report
    res = pytester.runpytest("--mgft-doctor", "--mgft-doctor-only=fake.warn",
                             "-W", "error::mgft_doctor.pytest_plugin.MgftDoctorWarning")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*MGD201 /dev/shm is 512 MiB*"])


def test_real_probes_collect_by_family(pytester):
    res = pytester.runpytest("--mgft-doctor", "--co", "-q", "-k", "nccl")
    ids = [ln for ln in res.stdout.lines if ln.startswith("mgft-doctor::")]
    assert "mgft-doctor::nccl.allreduce" in ids and all(i.startswith("mgft-doctor::nccl.") for i in ids)


@pytest.mark.slow
def test_real_quick_probes_junit(pytester):
    """The real probes, on whatever this machine has (gloo on a CPU-only one)."""
    res = pytester.runpytest_subprocess("--mgft-doctor", f"--mgft-doctor-only={QUICK_PROBES}", "-v", "-rA",
                                        "--mgft-doctor-timeout=120", "--junitxml=probes.xml")
    res.stdout.fnmatch_lines(["mgft-doctor *: 3 probe(s) as items*",
                              "mgft-doctor::gpu.visible PASSED*", "mgft-doctor::nccl.shm *",
                              "mgft-doctor::nccl.allreduce PASSED*"])
    cases = junit(pytester.path / "probes.xml")
    assert list(cases) == ["mgft-doctor::gpu.visible", "mgft-doctor::nccl.shm", "mgft-doctor::nccl.allreduce"]
    allreduce = dict(props(cases["mgft-doctor::nccl.allreduce"]))
    assert allreduce["mgft_doctor_status"] == "pass"
    assert allreduce["mgft_doctor_metric_backend"] in ("gloo", "nccl")
    assert float(allreduce["mgft_doctor_metric_busbw_GBps"]) > 0


@pytest.mark.slow
def test_failing_real_probe_carries_code_and_fix(pytester, monkeypatch):
    monkeypatch.setenv("MGFT_DOCTOR_INJECT_FAULT", json.dumps({"probe": "nccl.allreduce", "rank": 1, "kind": "die"}))
    res = pytester.runpytest_subprocess("--mgft-doctor", "--mgft-doctor-only=nccl.allreduce", "--junitxml=f.xml")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines([f"*✗ {RANK_DIED} the * all-reduce on 2 ranks failed: rank 1 died with exit code 17*",
                              "      fix: *"])
    tc = junit(pytester.path / "f.xml")["mgft-doctor::nccl.allreduce"]
    assert tc.find("failure").get("message").startswith(f"{RANK_DIED} ")
    assert ("mgft_doctor_code", RANK_DIED) in props(tc)


@pytest.mark.slow
def test_config_adds_the_run_specific_checks(pytester):
    """--mgft-doctor-config gives the config probes the user's run; each item ends as the CLI's row."""
    pytester.path.joinpath("ds.json").write_text(json.dumps(
        {"train_batch_size": 7, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
         "zero_optimization": {"stage": 3}}))
    yml = pytester.makefile(".yaml", train="model_name_or_path: ./no-such-model\nstage: sft\nfinetuning_type: lora\n"
                                           "deepspeed: ds.json\nper_device_train_batch_size: 4\n"
                                           "gradient_accumulation_steps: 2\n")
    without = pytester.runpytest_subprocess("--mgft-doctor", "--mgft-doctor-only=config", "--junitxml=a.xml")
    with_config = pytester.runpytest_subprocess("--mgft-doctor", "--mgft-doctor-only=config",
                                                "--mgft-doctor-config", "train.yaml", "--junitxml=b.xml")
    proc = subprocess.run([sys.executable, "-m", "mgft_doctor", "check", str(yml), "--only", "config", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=pytester.path, check=False)
    cli = {p["id"]: p for p in json.loads(proc.stdout)["probes"]}
    before, after = junit(pytester.path / "a.xml"), junit(pytester.path / "b.xml")
    assert set(after) == {f"mgft-doctor::{i}" for i in cli}
    for pid, row in cli.items():
        assert dict(props(after[f"mgft-doctor::{pid}"]))["mgft_doctor_status"] == row["status"], pid
    # without the run, its checks have nothing to read: skipped, and the run is green
    assert dict(props(before["mgft-doctor::config.deepspeed"]))["mgft_doctor_status"] == "skip"
    assert without.ret == pytest.ExitCode.OK
    assert cli["config.deepspeed"]["status"] == "fail"
    with_config.stdout.fnmatch_lines(["*✗ MGD503 train_batch_size 7 != *", "      fix: *"])


# --------------------------------------------------------------------------- the marker


def test_marker_skips_when_gpus_missing(pytester):
    pytester.makepyfile(test_gpu="""
        import pytest

        @pytest.mark.mgft_gpus(64)
        def test_big():
            pass

        @pytest.mark.mgft_gpus(64)
        def test_big_too():
            pass
    """)
    res = pytester.runpytest("-rs")
    res.assert_outcomes(skipped=2)
    # the reason names the count asked for and the count seen; it points at the test, not the plugin
    res.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_gpu.py:3: mgft_gpus(64): needs 64 GPU(s), * visible to torch*",
                              "SKIPPED [[]1[]] test_gpu.py:7: mgft_gpus(64): needs 64 GPU(s), *"])


def test_marker_runs_probes_once_and_names_the_failure(pytester, fakes):
    pytester.makepyfile(test_m="""
        import pytest

        @pytest.mark.mgft_gpus(0, probes=["fake.pass", "fake.fail"])
        def test_one():
            pass

        @pytest.mark.mgft_gpus(0, probes=["fake.fail"])
        def test_two():
            pass

        @pytest.mark.mgft_gpus(0, probes="fake.pass")
        def test_runs():
            pass

        def test_unmarked():
            pass
    """)
    res = pytester.runpytest("-rs")
    res.assert_outcomes(passed=2, skipped=2)
    res.stdout.fnmatch_lines([("SKIPPED [[]1[]] test_m.py:3: mgft_gpus(0): probe fake.fail failed: MGD301 no answer "
                              "within 20 s from rank 1 (at 'init_process_group')")])
    assert sorted(fakes) == ["fake.fail", "fake.pass"]  # each probe ran once for the whole session


def test_marker_misuse_is_an_error(pytester, fakes):
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.mgft_gpus("two")
        def test_a():
            pass

        @pytest.mark.mgft_gpus(1, probes=["nope"])
        def test_b():
            pass
    """)
    res = pytester.runpytest()
    res.assert_outcomes(errors=2)
    res.stdout.fnmatch_lines(["*@pytest.mark.mgft_gpus: takes one GPU count*",
                              "*@pytest.mark.mgft_gpus: unknown probe id or family 'nope'*"])
    assert "Traceback" not in res.stdout.str()


@pytest.mark.slow
def test_marker_with_a_failing_real_probe(pytester, monkeypatch):
    monkeypatch.setenv("MGFT_DOCTOR_INJECT_FAULT", json.dumps({"probe": "nccl.allreduce", "rank": 1, "kind": "die"}))
    pytester.makepyfile(test_m="""
        import pytest

        @pytest.mark.mgft_gpus(0, probes=["nccl.allreduce"])
        def test_collective():
            pass
    """)
    res = pytester.runpytest_subprocess("-rs")
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines([(f"SKIPPED * mgft_gpus(0): probe nccl.allreduce failed: {RANK_DIED} the * all-reduce on 2 "
                              "ranks failed: rank 1 died*")])


# --------------------------------------------------------------------------- the fixture


def test_fixture_refuses_what_cannot_be_imported(pytester):
    pytester.makepyfile(test_f="""
        def test_lambda(mgft_ranks):
            mgft_ranks(lambda rank, world: rank)

        def test_nested(mgft_ranks):
            def inner(rank, world):
                return rank
            mgft_ranks(inner)

        def test_args(mgft_ranks):
            mgft_ranks(print, args=(object(),))
    """)
    res = pytester.runpytest()
    res.assert_outcomes(failed=3)
    res.stdout.fnmatch_lines([("*RanksFailed: mgft_ranks imports the function by name on every rank: "
                              "test_f.test_lambda.<locals>.<lambda> is not a top-level function*"),
                              "*test_f.test_nested.<locals>.inner is not a top-level function*",
                              "*RanksFailed: mgft_ranks: args and kwargs go to the ranks as JSON*"])


@pytest.mark.slow
def test_fixture_on_two_gloo_ranks(pytester):
    mark = uuid.uuid4().hex
    pytester.makepyfile(helpers_mod="""
        def scale(x, factor):
            return x * factor
    """)
    pytester.makepyfile(test_ranks=f"""
        import sys
        import time

        from helpers_mod import scale


        def gather(rank, world_size, factor, tag=""):
            import torch
            import torch.distributed as dist

            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
            sys.stdout.write(f"rank {{rank}} of {{world_size}} reporting\\n")  # one write: lines of ranks do not mix
            return {{"rank": rank, "world": world_size, "sum": t.item(), "scaled": scale(rank, factor),
                     "backend": dist.get_backend(), "tag": tag}}


        def boom(rank, world_size):
            if rank == 1:
                raise ValueError("rank one is broken")
            return rank


        def hang(rank, world_size):
            if rank == 1:
                time.sleep(1000)
            return rank


        def test_gather(mgft_ranks):
            results = mgft_ranks(gather, 2, backend="gloo", args=(10,), kwargs={{"tag": "x"}})
            assert results == [
                {{"rank": 0, "world": 2, "sum": 3.0, "scaled": 0, "backend": "gloo", "tag": "x"}},
                {{"rank": 1, "world": 2, "sum": 3.0, "scaled": 10, "backend": "gloo", "tag": "x"}},
            ]
            assert mgft_ranks.last.backend == "gloo"


        def test_boom(mgft_ranks):
            mgft_ranks(boom, backend="gloo")


        def test_hang(mgft_ranks):
            mgft_ranks(hang, backend="gloo", timeout=6, env={{"MGFT_TEST_MARK": "{mark}"}})
    """)
    res = pytester.runpytest_subprocess("-rA", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=2)
    # both ranks' results came back; their output is the test's captured stdout
    res.stdout.fnmatch_lines(["*mgft_ranks: test_ranks.gather on 2 rank(s), backend gloo, *",
                              "rank ? of 2 reporting", "rank ? of 2 reporting"])
    # a rank that raises: its error and its own traceback, without the worker's frames
    res.stdout.fnmatch_lines(["E *RanksFailed: test_ranks.boom on 2 rank(s) (gloo) failed (torchrun exit code 1):",
                              "E       rank 1 raised ValueError: rank one is broken",
                              "E         Traceback (most recent call last):",
                              '*File "*test_ranks.py", line *, in boom'])
    assert "run_function.py" not in "\n".join(ln for ln in res.stdout.lines if ln.startswith("E "))
    # a hang: the time limit ends it and names the silent rank
    res.stdout.fnmatch_lines([("E *RanksFailed: test_ranks.hang on 2 rank(s) (gloo) did not finish within the time "
                              "limit of 6 s: no answer from rank 1 (at 'call'); rank(s) [[]0[]] returned. Every "
                              "process of the run was stopped.")])
    assert _processes_with(f"MGFT_TEST_MARK={mark}") == []


def _processes_with(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


# --------------------------------------------------------------------------- the diagnosis


FAILING_PROJECT = {
    "test_train": f"""
        import subprocess
        import sys

        def test_known_error_in_exception():
            print("step 1/100 loss 1.23")
            raise AssertionError("no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3")

        def test_known_error_in_output():
            # a training run in a subprocess: its stderr is captured, the assertion itself says little
            code = "import sys; sys.stderr.write({NO_SYNC!r} + '\\\\n'); sys.exit(1)"
            proc = subprocess.run([sys.executable, "-c", code])
            assert proc.returncode == 0

        def test_plain_failure():
            assert 1 + 1 == 3

        def test_passes():
            print({NO_SYNC!r})
    """
}


def test_diagnosis_section_and_junit_property(pytester):
    pytester.makepyfile(**FAILING_PROJECT)
    res = pytester.runpytest("--mgft-doctor-explain", "--junitxml=d.xml")
    res.assert_outcomes(passed=1, failed=3)
    for name in ("test_known_error_in_exception", "test_known_error_in_output"):
        rep = report_of(res, name)
        sections = dict(rep.sections)
        assert "mgft-doctor diagnosis" in sections, rep.sections
        text = sections["mgft-doctor diagnosis"]
        assert text.startswith("MGD601  no_sync() asserts under ZeRO-2/3")
        assert "fixes, in order of preference:" in text and "more: mgft-doctor codes MGD601" in text
        assert ("mgft_doctor_code", "MGD601") in rep.user_properties
    # an ordinary failure, and a passing test that printed the error, get nothing
    assert all(name != "mgft-doctor diagnosis" for name, _ in report_of(res, "test_plain_failure").sections)
    assert not report_of(res, "test_passes").user_properties
    res.stdout.fnmatch_lines(["*- mgft-doctor diagnosis -*", "MGD601  no_sync() asserts under ZeRO-2/3*",
                              "*= mgft-doctor diagnoses =*",
                              "MGD601 test_train.py::test_known_error_in_exception - no_sync() asserts*",
                              "MGD601 test_train.py::test_known_error_in_output - no_sync() asserts*"])
    cases = junit(pytester.path / "d.xml")
    assert ("mgft_doctor_code", "MGD601") in props(cases["test_train::test_known_error_in_output"])
    assert props(cases["test_train::test_plain_failure"]) == []


def test_diagnosis_off_by_default_and_on_by_ini_or_mgft_doctor(pytester, fakes):
    pytester.makepyfile(**FAILING_PROJECT)
    res = pytester.runpytest()
    res.assert_outcomes(passed=1, failed=3)
    assert "mgft-doctor diagnos" not in res.stdout.str()
    assert not report_of(res, "test_known_error_in_exception").user_properties
    res = pytester.runpytest("--mgft-doctor", "--mgft-doctor-only=fake.pass")
    res.assert_outcomes(passed=2, failed=3)
    assert ("mgft_doctor_code", "MGD601") in report_of(res, "test_known_error_in_exception").user_properties
    pytester.makeini("[pytest]\nmgft_doctor_explain = true\n")
    res = pytester.runpytest("-k", "known_error_in_exception")
    assert ("mgft_doctor_code", "MGD601") in report_of(res, "test_known_error_in_exception").user_properties


def test_diagnosis_of_a_failing_fixture(pytester):
    pytester.makepyfile(test_fx=textwrap.dedent(f"""
        import pytest

        @pytest.fixture
        def engine():
            raise RuntimeError({NO_SYNC!r})

        def test_uses_engine(engine):
            pass
    """))
    res = pytester.runpytest("--mgft-doctor-explain")
    res.assert_outcomes(errors=1)
    assert ("mgft_doctor_code", "MGD601") in report_of(res, "test_uses_engine", when="setup").user_properties
