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
    return [text for _, text in kept_fixes(fixes, versions)]


def kept_fixes(fixes: list[Fix], versions: dict[str, str]) -> list[tuple[Fix, str]]:
    """choose_fixes, each text with the fix it came from."""
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
            out.append((fix, fix.text + (f" (applies with {', '.join(unknown)})" if unknown else "")))
    return out or [(f, f.text) for f in fixes]


def fixes_in_focus(kept: list[tuple[Fix, str]], texts: list[str]) -> list[int] | None:
    """Which of the kept fixes a terminal report shows: every fix without `if_log`, and those whose
    `if_log` matches one of texts (the root error, the evidence). None when that is all of them."""
    shown = [i for i, (fix, _) in enumerate(kept)
             if fix.if_log is None or any(fix.if_log.search(t) for t in texts)]
    if not shown:  # no form named matched: all of them stay, as without the field
        return None
    return None if len(shown) == len(kept) else shown
