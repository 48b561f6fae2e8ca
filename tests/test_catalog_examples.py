"""Every catalog entry's examples run through the real matcher, so no entry can rot
(the way rustc's error index tests its examples)."""

import pytest

from mgft_doctor.catalog import load_catalog
from mgft_doctor.explain import explain_text

ENTRIES = load_catalog()
MATCH = [(e.code, i, ex) for e in ENTRIES for i, ex in enumerate(e.examples_match)]
NO_MATCH = [(e.code, i, ex) for e in ENTRIES for i, ex in enumerate(e.examples_no_match)]


@pytest.mark.parametrize("code,index,excerpt", MATCH, ids=[f"{c}-match{i}" for c, i, _ in MATCH])
def test_example_is_diagnosed_as_its_code(code, index, excerpt):
    report = explain_text(excerpt, ENTRIES)
    assert report.failure, f"{code} example {index}: no failure seen in the excerpt"
    got = [d.code for d in report.diagnoses]
    assert got and got[0] == code, f"{code} example {index}: diagnosed as {got}"


@pytest.mark.parametrize("code,index,excerpt", NO_MATCH, ids=[f"{c}-nomatch{i}" for c, i, _ in NO_MATCH])
def test_near_miss_is_not_diagnosed_as_its_code(code, index, excerpt):
    report = explain_text(excerpt, ENTRIES)
    got = [d.code for d in report.diagnoses]
    assert code not in got, f"{code} near-miss {index} was diagnosed as {got}"


def test_catalog_has_no_duplicate_titles():
    titles = [e.title.lower() for e in ENTRIES]
    assert len(titles) == len(set(titles))


def test_every_probe_code_is_in_the_catalog():
    from mgft_doctor.probes import _codes

    known = {e.code for e in ENTRIES}
    used = {k: v for k, v in vars(_codes).items() if k.isupper()}
    assert used and all(v in known for v in used.values()), {k: v for k, v in used.items() if v not in known}
