"""Where the CLI and the pytest plugin get the probe list (mgft_doctor.probes.MODULES)."""

from __future__ import annotations

from .probe import Probe


def all_probes() -> list[Probe]:
    from mgft_doctor.probes import all_probes as _all

    return _all()
