"""explain on awkward input: every bad input is one line on stderr and exit code 2; every odd
but valid encoding is read."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from mgft_doctor.catalog import load_file, parse_entry
from mgft_doctor.errors import CatalogError

FAILING = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/x/site-packages/deepspeed/runtime/engine.py", line 1997, in no_sync\n'
    "[rank0]: AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3\n"
)
HEALTHY = "".join(f"{{'loss': 1.{i:04d}, 'grad_norm': 0.3, 'epoch': 0.{i}}}\n" for i in range(200))


def run(*args, stdin=None):
    proc = subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", *args], input=stdin,
                          capture_output=True, timeout=120)
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def assert_one_line_error(code, out, err, words):
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]


def test_missing_file(tmp_path):
    code, out, err = run(str(tmp_path / "nope.log"))
    assert_one_line_error(code, out, err, ["nope.log", "no such file"])


def test_directory(tmp_path):
    code, out, err = run(str(tmp_path))
    assert_one_line_error(code, out, err, ["is a directory"])


def test_binary_data(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(bytes(range(256)) * 400)
    code, out, err = run(str(p))
    assert_one_line_error(code, out, err, ["binary"])


def test_unreadable_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    p = tmp_path / "secret.log"
    p.write_text(FAILING)
    p.chmod(0)
    code, out, err = run(str(p))
    assert_one_line_error(code, out, err, ["permission denied"])


def test_empty_file_is_no_failure(tmp_path):
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    code, out, _ = run(str(p), "--json")
    assert code == 0
    assert json.loads(out) == {"schema": "mgft-doctor/explain/1", "failure": False, "diagnoses": [],
                               "root_error": None, "failed_rank": None, "exit_codes": [], "versions": {}}


def test_healthy_log(tmp_path):
    p = tmp_path / "ok.log"
    p.write_text(HEALTHY)
    code, out, _ = run(str(p), "--json")
    data = json.loads(out)
    assert code == 0 and data["failure"] is False and data["diagnoses"] == []


def test_invalid_utf8_is_read(tmp_path):
    p = tmp_path / "latin.log"
    p.write_bytes("Schritt fünf\n".encode("latin-1") + b"\xff\xfe\xfa broken\n" + FAILING.encode())
    code, out, _ = run(str(p), "--json")
    data = json.loads(out)
    assert code == 1 and data["diagnoses"][0]["code"] == "MGD601"
    assert data["root_error"]["line"] == 5


def test_utf16_log_from_powershell(tmp_path):
    p = tmp_path / "ps.log"
    p.write_bytes(("\ufeff" + HEALTHY + FAILING).encode("utf-16-le"))
    code, out, _ = run(str(p), "--json")
    data = json.loads(out)
    assert code == 1 and data["diagnoses"][0]["code"] == "MGD601"
    assert data["root_error"]["line"] == 203


def test_gzip_and_stdin(tmp_path):
    p = tmp_path / "train.log.gz"
    p.write_bytes(gzip.compress((HEALTHY + FAILING).encode()))
    code, out, _ = run(str(p), "--json")
    assert code == 1 and json.loads(out)["diagnoses"][0]["code"] == "MGD601"
    code, out, _ = run("-", "--json", stdin=(HEALTHY + FAILING).encode())
    assert code == 1 and json.loads(out)["root_error"]["line"] == 203


def test_damaged_gzip(tmp_path):
    p = tmp_path / "cut.log.gz"
    p.write_bytes(gzip.compress((HEALTHY * 50 + FAILING).encode())[:300])
    code, out, err = run(str(p))
    assert_one_line_error(code, out, err, ["cut.log.gz"])


def test_endless_line_without_newline(tmp_path):
    # tqdm writes '\r' redraws and no '\n': one 'line' of many MB
    p = tmp_path / "tqdm.log"
    p.write_bytes(b"".join(b"\r %d%%|####| %d/100000 [00:01<00:10]" % (i % 100, i) for i in range(200_000)) + b"\r" + FAILING.encode())
    code, out, _ = run(str(p), "--json")
    assert code == 1 and json.loads(out)["diagnoses"][0]["code"] == "MGD601"


def test_bad_usage_exit_code():
    code, _, err = run()
    assert code == 2 and "LOG" in err


def test_malformed_catalog_entry_names_file_and_field(tmp_path):
    bad = tmp_path / "MGD999.yaml"
    bad.write_text("code: MGD999\ntitle: t\narea: nccl\nmatch:\n  signatures: ['(unclosed']\n"
                   "explanation: x\nfixes: [a]\nreferences: ['https://x']\nexamples: {match: [a], no_match: [b]}\n")
    with pytest.raises(CatalogError) as err:
        load_file(bad)
    assert "MGD999.yaml" in str(err.value) and "match.signatures[0]" in str(err.value)
    with pytest.raises(CatalogError) as err:
        parse_entry({"code": "MGD999", "title": "t", "area": "nowhere"}, "<test>")
    assert "area" in str(err.value)
    bad.write_text("code: [unbalanced\n")
    with pytest.raises(CatalogError) as err:
        load_file(bad)
    assert "MGD999.yaml" in str(err.value) and "yaml" in str(err.value).lower()
