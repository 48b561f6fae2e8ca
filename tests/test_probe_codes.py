"""probes/_codes.py, the table of the codes probe findings carry (ruff's codes.rs in spirit): one
name per catalog code, each in the catalog and in the area its name promises. That every code
exists in known_errors/ is test_catalog_examples.py's test."""

from collections import Counter

from mgft_doctor.catalog import load_catalog
from mgft_doctor.probes import _codes


def table() -> dict[str, str]:
    return {k: v for k, v in vars(_codes).items() if k.isupper()}


def test_each_code_has_exactly_one_name():
    twice = {code: [k for k, v in table().items() if v == code] for code, n in Counter(table().values()).items() if n > 1}
    assert twice == {}


def test_build_names_point_at_build_pages():
    area = {e.code: e.area for e in load_catalog()}
    for name in ("DS_MISSING", "CUDA_TOOLKIT_MISSING", "NVCC_MISMATCH", "NINJA_MISSING", "OP_BUILD_FAILED"):
        assert area[getattr(_codes, name)] in ("ds-build", "versions"), name
