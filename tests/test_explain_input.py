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


# --- every way in has a defined result (issue 13) ---------------------------------------------

def _noise_then_failure() -> bytes:
    import random
    rnd = random.Random(1)
    noise = "".join(f"{{'loss': {rnd.random():.6f}, 'grad_norm': {rnd.random():.6f}}} step {i}\n" for i in range(20_000))
    return (noise + FAILING).encode()


@pytest.mark.parametrize("fmt", ["gzip", "bzip2", "xz"])
def test_damaged_compressed_stream_is_named(tmp_path, fmt):
    import bz2
    import lzma
    compress = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lambda b: lzma.compress(b, preset=0)}[fmt]
    data = bytearray(compress(_noise_then_failure()))
    for i in range(len(data) // 2, len(data) // 2 + 64):  # corrupt the middle: the header still reads
        data[i] ^= 0x5A
    p = tmp_path / "train.log.z"
    p.write_bytes(bytes(data))
    code, out, err = run(str(p))
    assert_one_line_error(code, out, err, ["train.log.z", f"damaged {fmt} stream"])


def test_proc_mem_is_refused_in_one_line():
    code, out, err = run("/proc/self/mem")
    assert_one_line_error(code, out, err, ["/proc/self/mem", "cannot read"])


@pytest.mark.parametrize("path, words", [("/dev/zero", ["is a device"]), ("/dev/null", ["is a device"])])
def test_devices_are_refused(path, words):
    code, out, err = run(path)
    assert_one_line_error(code, out, err, [path, *words])


def test_socket_is_refused(tmp_path):
    import socket
    where = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(where))
        code, out, err = run(str(where))
    assert_one_line_error(code, out, err, ["is a socket"])


def test_fifo_without_writer_gives_up_in_one_line(tmp_path, monkeypatch, capsys):
    import time

    from mgft_doctor.cli import main
    from mgft_doctor.explain import source
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.setattr(source, "FIFO_WAIT_S", 0.5)
    t0 = time.monotonic()
    code = main(["explain", str(fifo)])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - t0 < 10
    assert "no program writes to" in err and len(err.strip().splitlines()) == 1


def test_fifo_with_a_writer_is_read(tmp_path):
    import threading
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as f:
            f.write((HEALTHY + FAILING).encode())

    writer = threading.Thread(target=write)
    writer.start()
    code, out, _ = run(str(fifo), "--json")
    writer.join(timeout=30)
    assert code == 1 and json.loads(out)["root_error"]["line"] == 203


@pytest.mark.parametrize("encoding, bom", [("utf-32-le", True), ("utf-32-be", True), ("utf-32-le", False),
                                           ("utf-32-be", False), ("utf-16-be", False), ("utf-8", True)])
def test_wide_encodings_and_boms_are_read(tmp_path, encoding, bom):
    p = tmp_path / "wide.log"
    p.write_bytes((("\ufeff" if bom else "") + HEALTHY + FAILING).encode(encoding))
    code, out, _ = run(str(p), "--json")
    data = json.loads(out)
    assert code == 1 and data["diagnoses"][0]["code"] == "MGD601"
    assert data["root_error"]["line"] == 203


def test_an_encoding_that_cannot_be_told_is_refused_not_misread(tmp_path):
    p = tmp_path / "ebcdic.log"
    p.write_bytes((HEALTHY + FAILING).encode("cp500"))  # EBCDIC: no ASCII letters at all
    code, out, err = run(str(p))
    assert_one_line_error(code, out, err, ["ebcdic.log", "neither UTF-8, UTF-16 nor UTF-32"])


def test_ascii_compatible_legacy_bytes_keep_their_ascii(tmp_path):
    p = tmp_path / "gbk.log"
    p.write_bytes("第五步 训练失败\n".encode("gbk") * 3 + FAILING.encode())
    code, out, _ = run(str(p), "--json")
    data = json.loads(out)
    assert code == 1 and data["diagnoses"][0]["code"] == "MGD601" and data["root_error"]["line"] == 6


def test_any_bytes_through_the_pipeline_never_crash():
    """Generated logs (rank prefixes, redraws, ANSI codes, tracebacks, odd bytes) through the
    whole in-memory pipeline: a report every time, never an exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from mgft_doctor.explain import explain_text
    from mgft_doctor.explain.lines import normalise

    pieces = st.sampled_from(["[rank0]:", "[rank12]: ", "[default3]:", "gpu-b1: ", "10.0.0.2: ", "3: ", "\r", "\n",
                              "\x1b[31m", "\x1b[0m", "Traceback (most recent call last):\n", '  File "x.py", line 3, in f\n',
                              "ValueError: bad\n", "RuntimeError: CUDA error: out of memory", "NCCL WARN x", "][E ",
                              " 45%|####  | 45/100 [00:01<00:02]", "^C", "│ ", "Error", "é", "\ufffd", "\x00", " "])
    text = st.lists(st.one_of(pieces, st.text(max_size=20)), max_size=60).map("".join)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text)
    def check(log):
        for line in log.split("\n"):
            normalise(1, line)
        report = explain_text(log)
        assert report.to_json()["schema"] == "mgft-doctor/explain/1"

    check()
