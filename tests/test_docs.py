"""docs/codes/ is generated from the catalog; it must not drift from it."""

from pathlib import Path

from mgft_doctor.catalog import load_catalog
from mgft_doctor.catalog.pages import render_docs

DOCS = Path(__file__).resolve().parent.parent / "docs" / "codes"


def test_code_pages_in_sync_with_catalog():
    pages = render_docs(load_catalog())
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")}
    stale = sorted(set(on_disk) - set(pages))
    missing = sorted(set(pages) - set(on_disk))
    changed = sorted(n for n in pages if n in on_disk and on_disk[n] != pages[n])
    assert not (stale or missing or changed), (
        f"docs/codes out of date (run `python -m mgft_doctor.catalog docs/codes`): "
        f"stale {stale}, missing {missing}, changed {changed}")


def test_codes_command_lists_and_explains(run_doctor):
    code, out, _ = run_doctor("codes", "--json")
    import json

    listed = json.loads(out)
    assert code == 0 and len(listed) == len(load_catalog()) >= 45
    code, out, _ = run_doctor("codes", "mgd601")
    assert code == 0 and "no_sync" in out and "Fixes" in out
    code, out, err = run_doctor("codes", "MGD000")
    assert code == 2 and "unknown code" in err


ROOT = Path(__file__).resolve().parent.parent


def test_readme_probe_table_lists_every_probe_in_order():
    import re

    from mgft_doctor.check.registry import all_probes

    rows = re.findall(r"^\| `([a-z0-9_]+\.[a-z0-9_]+)` \|", (ROOT / "README.md").read_text(encoding="utf-8"), re.M)
    assert rows == [p.id for p in all_probes()]


def test_plugin_page_states_the_code_defaults():
    import re

    from mgft_doctor.check.registry import all_probes
    from mgft_doctor.pytest_plugin import DEFAULT_TIMEOUT_S

    page = (ROOT / "docs" / "pytest-plugin.md").read_text(encoding="utf-8")
    limits = set(re.findall(r"(?:limit of `mgft_ranks` \(|else |timeout )(\d+) s", page))
    assert limits == {str(int(DEFAULT_TIMEOUT_S))}, limits
    counts = set(re.findall(r"(\d+) probe\(s\) as items", page))
    assert counts == {str(len(all_probes()))}, counts
