"""Usage mistakes get exit 2 and a pointer, not a green result or a confusing error: a --model
that is not there, a log given where a run config goes, a misspelt command."""

import pytest


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgft-doctor: "), err
    return lines[0]


def test_a_model_folder_that_does_not_exist(run_doctor):
    code, out, err = run_doctor("check", "--model", "./no-such-model", "--only", "config")
    assert code == 2 and "no such model folder" in one_line(err) and "No issues found" not in out


def test_a_hub_id_is_still_taken_and_said(run_doctor):
    code, out, err = run_doctor("check", "--model", "no-such-org/no-such-model", "--only", "gpu.visible", "--list")
    assert code == 0 and "taken as a hub id (only its config.json is read" in err


@pytest.mark.parametrize("name", ["train.log", "run.out", "job.err", "notes.txt", "train.log.gz"])
def test_a_log_given_to_check_points_at_explain(tmp_path, run_doctor, name):
    log = tmp_path / name
    log.write_bytes(b"step 1\n")
    code, out, err = run_doctor(str(log))
    assert code == 2 and one_line(err).endswith(f"did you mean `mgft-doctor explain {log}`?")


def test_a_log_with_a_yaml_name_is_told_by_its_content(tmp_path, run_doctor):
    log = tmp_path / "run.yaml"
    log.write_text("[rank0]: Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                   "[rank0]: RuntimeError: CUDA error: out of memory\n")
    code, out, err = run_doctor(str(log), "--only", "config")
    assert code == 2 and "reads like a training log" in one_line(err) and "explain" in err


def test_a_real_yaml_error_stays_a_yaml_error(tmp_path, run_doctor):
    bad = tmp_path / "train.yaml"
    bad.write_text("model_name_or_path: [unclosed\n")
    code, out, err = run_doctor(str(bad), "--only", "config")
    assert code == 2 and "not valid YAML" in one_line(err)


@pytest.mark.parametrize("word, near", [("explian", "explain"), ("chek", "check"), ("codez", "codes"), ("fxi", "fix")])
def test_a_misspelt_command_names_the_nearest(run_doctor, word, near):
    code, out, err = run_doctor(word, "x.log")
    assert code == 2 and one_line(err) == f"mgft-doctor: unknown command '{word}'; did you mean '{near}'?"


def test_a_path_is_never_taken_for_a_command(tmp_path, run_doctor, monkeypatch):
    """main() puts "check" before a first word that is no command: a config named like one still works."""
    (tmp_path / "fixx").write_text("{}")  # an existing file close to 'fix' is a config, not a typo
    monkeypatch.chdir(tmp_path)
    code, out, err = run_doctor("fixx", "--list")
    assert "unknown command" not in err
    code, out, err = run_doctor("train.yaml", "--list")
    assert "unknown command" not in err
