"""No secret that a log or an environment carries reaches any output: each kind is planted in a
log's root-error line and in an evidence line (an env-export line that a catalog entry cites),
and must appear in neither explain's human report, nor -v, nor the JSON, nor check's outputs, nor
the pytest plugin's section. The kinds stay recognisable ('hf_***', 'HF_TOKEN=***')."""

from __future__ import annotations

import io
from pathlib import Path
import json
import subprocess
import sys

import pytest
from rich.console import Console

from mgft_doctor.explain import explain_text
from mgft_doctor.explain.render import render
from mgft_doctor.text import mask_data, mask_secrets

HEX40 = "0123456789abcdef0123456789abcdef01234567"
# (planted text, the secret part that must never be printed, what stays)
SECRETS = [
    ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "hf_***"),
    (f"WANDB_API_KEY={HEX40}", HEX40, "WANDB_API_KEY=***"),
    (f"wandb login {HEX40[::-1]}", HEX40[::-1], "wandb login ***"),
    ("sk-proj-Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0", "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0", "sk-proj-***"),
    ("sk-ant-api03-QwErTyUiOpAsDfGhJkLzXcVbNm1234", "QwErTyUiOpAsDfGhJkLzXcVbNm1234", "sk-ant-api03-***"),
    ("AKIAZ7EXAMPLEKEY1234", "Z7EXAMPLEKEY1234", "AKIA***"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEK", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEK",
     "aws_secret_access_key=***"),
    ("ghp_R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3s0", "R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3s0", "ghp_***"),
    ("gho_0th3rT0k3nV4lu3F0rT3st1ngPurp0s3s99", "0th3rT0k3nV4lu3F0rT3st1ngPurp0s3s99", "gho_***"),
    ("github_pat_11AAAAAAA0aBcDeFgHiJkLmN_oPqRsTuVwXyZ0123456789", "11AAAAAAA0aBcDeFgHiJkLmN_oPqRsTuVwXyZ0123456789",
     "github_pat_***"),
    ("https://alice:Pa55w0rd-very-private@pypi.internal.example.com/simple", "Pa55w0rd-very-private",
     "https://alice:***@"),
    ("HF_TOKEN=opaque-value-7788", "opaque-value-7788", "HF_TOKEN=***"),
    ("MY_SERVICE_SECRET=s3cr3t-shh-9911", "s3cr3t-shh-9911", "MY_SERVICE_SECRET=***"),
    ("DB_PASSWORD='correct horse battery'", "correct horse battery", "DB_PASSWORD=***"),
    ("OPENAI_API_KEY=plain-key-4455", "plain-key-4455", "OPENAI_API_KEY=***"),
]
LOG = """\
export NCCL_DEBUG=INFO MASTER_PORT=29500 {secret}
[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). {secret}
"""


def outputs(text: str) -> dict[str, str]:
    """explain's three outputs for a log held in memory: human, -v and JSON."""
    report = explain_text(text)
    out = {}
    for name, verbose in (("human", False), ("verbose", True)):
        buf = io.StringIO()
        render(report, Console(file=buf, width=300, highlight=False, color_system=None), verbose=verbose)
        out[name] = buf.getvalue()
    out["json"] = json.dumps(report.to_json(), ensure_ascii=False)
    return out


@pytest.mark.parametrize("planted, secret, kept", SECRETS, ids=[s[2].rstrip("*=:@ ") for s in SECRETS])
def test_a_planted_secret_reaches_no_explain_output(planted, secret, kept):
    results = outputs(LOG.format(secret=planted))
    data = json.loads(results["json"])
    assert data["diagnoses"][0]["code"] == "MGD101"
    cited = [e["text"] for e in data["diagnoses"][0]["evidence"]]
    assert any(t.startswith("export NCCL_DEBUG=INFO MASTER_PORT=29500") for t in cited), cited  # the env line is evidence
    assert data["root_error"]["text"].startswith("torch.distributed.DistNetworkError")
    for name, text in results.items():
        assert secret not in text, f"{name} output leaks {secret!r}"
    assert kept in results["verbose"] and kept in results["json"]


def test_every_secret_at_once_through_the_command_line(tmp_path):
    planted = " ".join(p for p, _, _ in SECRETS)
    log = tmp_path / "train.log"
    log.write_text(LOG.format(secret=planted))
    leaked = []
    for args in ([], ["-v"], ["--json"]):
        proc = subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", str(log), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        leaked += [(args, s) for _, s, _ in SECRETS if s in proc.stdout + proc.stderr]
    assert not leaked, leaked
    print(f"planted {len(SECRETS)} secret kinds x 3 outputs; leaked: {len(leaked)}")


def test_check_outputs_mask_what_findings_echo(monkeypatch, capsys):
    from mgft_doctor.check.probe import Finding, ProbeResult, Status
    from mgft_doctor.cli import check as check_cli
    from mgft_doctor.cli import main

    def fake_run_all(selected, ctx, **_):
        env = " ".join(p for p, _, _ in SECRETS)
        return [ProbeResult("versions.compat", "Versions", Status.WARN, f"saw {env}",
                            [Finding("MGD903", f"environment: {env}", f"unset {env}", Status.WARN)],
                            details=[f"env: {env}"])]

    monkeypatch.setattr(check_cli, "run_all", fake_run_all)
    for args in (["check", "--json", "--only", "versions"], ["check", "-v", "--only", "versions"]):
        main(args)
        captured = capsys.readouterr()
        for _, secret, _ in SECRETS:
            assert secret not in captured.out + captured.err, (args, secret)
        assert "HF_TOKEN=***" in captured.out


def test_the_pytest_section_is_masked():
    from mgft_doctor.pytest_plugin.explain import diagnose, section_text
    report = diagnose(LOG.format(secret=" ".join(p for p, _, _ in SECRETS)))
    text = section_text(report)
    assert report.diagnoses[0].code == "MGD101"
    for _, secret, _ in SECRETS:
        assert secret not in text


def test_masking_keeps_what_is_no_secret():
    for text in ("pad_token: <pad>, eos_token = </s>, max_new_tokens=512, tokenizer.pad_token_id=0",
                 "hub_token=None HF_TOKEN= MASTER_PORT=29500 CUDA_VISIBLE_DEVICES=0,1 NCCL_SOCKET_IFNAME=eth0",
                 '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/run.py", line 806, in main',
                 "commit 0123456789abcdef0123456789abcdef01234567 of transformers",
                 "task-abcdefghijklmnopqrstuvwxyz0123 and disk-abcdefghijklmnopqrstuvwxyz"):
        assert mask_secrets(text) == text


def test_mask_data_keeps_types():
    from mgft_doctor.check.probe import Finding, Status
    f = mask_data(Finding("MGD101", "HF_TOKEN=abcd1234", "x", Status.WARN))
    assert f.message == "HF_TOKEN=***" and f.severity is Status.WARN


# --- --share: one Markdown report safe to paste into an issue --------------------------------

def _share_log(tmp_path, host: str) -> Path:
    log = tmp_path / "train.log"
    log.write_text(LOG.format(secret=" ".join(p for p, _, _ in SECRETS))
                   .replace("/opt/conda/bin/torchrun", "/home/alice/miniconda3/bin/torchrun")
                   .replace("local network address.", f"local network address {host}:29500 (node7.corp.example.com)."))
    return log


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A machine named gpu-box-07 whose user alice works in tmp_path."""
    import socket
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-box-07")
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "gpu-box-07.cluster.example.org")
    monkeypatch.chdir(tmp_path)
    return "gpu-box-07"


def test_explain_share_writes_a_redacted_report(tmp_path, machine, capsys):
    from mgft_doctor.cli import main
    log = _share_log(tmp_path, machine)
    assert main(["explain", str(log), "--share"]) == 1
    err = capsys.readouterr().err
    report = (tmp_path / "mgft-doctor-report.md").read_text()
    assert "written to ./mgft-doctor-report.md" in err
    for _, secret, _ in SECRETS:
        assert secret not in report
    for private in ("/home/alice", machine, "node7.corp.example.com", "cluster.example.org"):
        assert private not in report
    assert "~/miniconda3/bin/torchrun" in report and "<host>:29500" in report
    assert "**MGD101**" in report and "DistNetworkError" in report and "HF_TOKEN=***" in report
    assert "## Environment" in report and "Python:" in report
    # a second --share never overwrites the first; --share=PATH writes PATH
    assert main(["explain", str(log), "--share"]) == 1
    assert (tmp_path / "mgft-doctor-report-2.md").exists()
    assert main(["explain", str(log), "--share=mine.md"]) == 1 and (tmp_path / "mine.md").exists()


def test_share_never_takes_a_log_or_config_for_its_path(tmp_path, machine, capsys):
    from mgft_doctor.cli import main
    log = _share_log(tmp_path, machine)
    before = log.read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(["explain", "--share", str(log)])
    assert stop.value.code == 2 and "must end in .md" in capsys.readouterr().err
    assert log.read_bytes() == before


def test_check_share_writes_the_probes_and_findings_redacted(tmp_path, machine, monkeypatch, capsys):
    from mgft_doctor.check.probe import Finding, ProbeResult, Status
    from mgft_doctor.cli import check as check_cli
    from mgft_doctor.cli import main
    env = " ".join(p for p, _, _ in SECRETS)
    monkeypatch.setattr(check_cli, "run_all", lambda selected, ctx, **_: [
        ProbeResult("versions.compat", "Versions", Status.WARN, f"on {machine}: /home/alice/env",
                    [Finding("MGD903", f"environment: {env}", "see /home/alice/x", Status.WARN)])])
    main(["check", "--only", "versions", "--share"])
    report = (tmp_path / "mgft-doctor-report.md").read_text()
    for _, secret, _ in SECRETS:
        assert secret not in report
    assert machine not in report and "/home/alice" not in report
    assert "| versions.compat | warn |" in report and "**MGD903**" in report and "~/env" in report
