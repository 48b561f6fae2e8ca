"""pytest plugin of mgft-doctor; inactive unless `--mgft-doctor` is given."""

from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("mgft-doctor", "multi-GPU fine-tuning doctor")
    group.addoption("--mgft-doctor", action="store_true", default=False,
                    help="run the doctor's probes as test items")
