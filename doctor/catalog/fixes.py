"""Which of an entry's fixes apply, given the versions known (from the log or installed): a
catalog rule that explain and the versions.compat probe share."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from .entry import Fix


def parse_version(text: str) -> Version | None:
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return None


def choose_fixes(fixes: list[Fix], versions: dict[str, str]) -> list[str]:
    """Keep the fixes whose version conditions hold; say which condition an unknown version leaves open."""
    out = []
    for fix in fixes:
        keep, unknown = True, []
        for cond in fix.when:
            known = versions.get(cond.package)
            v = parse_version(known) if known else None
            if v is None:
                unknown.append(cond.text)
            elif not cond.holds(str(v)):
                keep = False
        if keep:
            out.append(fix.text + (f" (applies with {', '.join(unknown)})" if unknown else ""))
    return out or [f.text for f in fixes]
