"""What `check` prints, with real probes on this machine: whole lines when stdout is not a terminal,
a summary that tells a note on what the machine is (no GPU here) from a problem and names the code
to look up, and the overall status and the doctor's version in --json."""

import json

from mgft_doctor import __version__
from mgft_doctor.check.probe import ProbeResult, Status
from mgft_doctor.check.report import summary_line
from mgft_doctor.probes import _codes


def _no_gpu_here(out_json) -> bool:
    return json.loads(out_json)["probes"][0]["metrics"]["torch_gpus"] == 0


def test_a_note_is_not_an_issue_and_strict_lets_it_pass(run_doctor):
    code, out, _ = run_doctor("check", "--only", "gpu.visible", "--json")
    data = json.loads(out)
    assert data["version"] == __version__ and data["exit_code"] == code
    if not _no_gpu_here(out):  # a GPU machine has no note to give
        assert data["status"] == "pass" and data["notes"] == []
        return
    assert code == 0 and data["status"] == "pass" and data["notes"] == ["gpu.visible"]
    code, out, _ = run_doctor("check", "--only", "gpu.visible")
    last = out.strip().splitlines()[-1]
    assert code == 0 and last.startswith("• No issues found!") and "1 note on what this machine is" in last
    assert "codes CODE" not in out
    assert run_doctor("check", "--only", "gpu.visible", "--strict")[0] == 0


def test_a_problem_names_its_code_and_no_line_is_wrapped_in_a_pipe(run_doctor):
    code, out, _ = run_doctor("check", "--only", "gpu.visible", "--nproc", "2", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert code == 1
    lines = out.splitlines()
    finding = [ln for ln in lines if _codes.NPROC_GT_GPUS in ln and "--nproc 2" in ln]
    assert len(finding) == 1 and len(finding[0]) > 100  # the whole message on its one line
    assert "('invalid device ordinal')" in finding[0]
    fix = lines[lines.index(finding[0]) + 1]
    assert fix.startswith("      fix: ") and fix.rstrip().endswith("(--nproc_per_node / num_processes).")  # whole
    assert lines[-1].startswith("! Doctor found issues: 1 failed") and \
        f"`mgft-doctor codes {_codes.NPROC_GT_GPUS}` explains {_codes.NPROC_GT_GPUS}." in lines[-1]
    data = json.loads(run_doctor("check", "--only", "gpu.visible", "--nproc", "2", "--json",
                                 env={"CUDA_VISIBLE_DEVICES": "0"})[1])
    assert data["status"] == "fail" and data["exit_code"] == 1



def test_the_time_given_is_the_checks_wall_time_not_the_sum_of_its_probes(run_doctor):
    code, out, _ = run_doctor("check", "--only", "gpu.visible,versions.compat", "--json")
    data = json.loads(out)
    durations = [p["duration_s"] for p in data["probes"]]
    assert len(durations) == 2 and data["wall_s"] >= max(durations) - 0.05
    side_by_side = [ProbeResult("a", "A", Status.PASS, "ok", duration_s=9.0),
                    ProbeResult("b", "B", Status.PASS, "ok", duration_s=8.0)]
    assert "(2 probes, 9.5 s)" in summary_line(side_by_side, wall_s=9.5)
    assert "(2 probes, 17.0 s)" in summary_line(side_by_side)  # no wall time known: the sum
