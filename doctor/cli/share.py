"""`--share` on `explain` and `check`: one Markdown report that is safe to paste into an issue.

It holds the environment (OS, Python, the versions known), the verdict (the diagnosis, or the
probes and their findings), the root error and the evidence lines, and nothing else of the
user's files. Everything that came from the user's machine (log lines, paths, findings) is
masked for secrets, its home folders shown as `~` and its host names as `<host>`; the catalog's
own text (explanations, fixes, references) is ours and kept as it is.

Where it goes: `--share` writes ./mgft-doctor-report.md, or, when that exists, the first free
./mgft-doctor-report-N.md: a default never overwrites anything. `--share=PATH` writes PATH (its
name must end in .md, so that `check --share train.yaml` can never write over the YAML) and
replaces it if it exists. The path written is printed on stderr."""

from __future__ import annotations

import argparse
import getpass
import os
import platform
import re
import socket
import sys
import tempfile
from pathlib import Path

from .. import __version__
from ..errors import DoctorError
from ..text import mask_data, mask_secrets

DEFAULT_NAME = "mgft-doctor-report.md"
FENCE = "````"  # a log line holding ``` cannot close it
_TLDS = ("com|net|org|edu|gov|mil|int|io|ai|co|cn|de|uk|jp|fr|ru|in|us|eu|ch|nl|kr|tw|sg|au|ca|"
         "local|localdomain|internal|intranet|intra|lan|corp|cluster|priv|private|home|site")
# a name of three labels or more (two-label public hosts such as github.com stay): node7.corp.example.com
_FQDN = re.compile(rf"(?i)(?<![\w.-])[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)+\.(?:{_TLDS})(?![\w-])")
_HOMES = re.compile(r"(?<![\w.~-])(?:/home/[^/\s:\"'`]+|/Users/[^/\s:\"'`]+|/root(?=[/\s:\"'`]|$)|"
                    r"[A-Za-z]:\\Users\\[^\\\s:\"'`]+)")


def add_share_option(parser) -> None:
    parser.add_argument("--share", nargs="?", const="", default=None, metavar="PATH", type=_share_path,
                        help=f"also write a Markdown report to paste into an issue: secrets masked, home folders "
                             f"and host names shortened (default ./{DEFAULT_NAME}, never overwritten; "
                             f"--share=PATH writes PATH, a .md name)")


def _share_path(value: str) -> str:
    if value and not value.endswith(".md"):
        raise argparse.ArgumentTypeError(
            f"{value!r}: the report's name must end in .md (a log or config given right after --share "
            "is taken for the report's name: put --share after it, or write --share=report.md)")
    return value


class Redactor:
    """Shortens what identifies this machine and its user in text from it."""

    def __init__(self) -> None:
        home = os.path.expanduser("~")
        self.home = home if home not in ("", "/", "~") else None
        names = {socket.gethostname(), _fqdn()}
        names |= {n.split(".")[0] for n in names}
        names = {n for n in names if n and n not in ("localhost", "localhost.localdomain") and len(n) >= 2}
        # a name that is also a word ('server', 'main') is replaced only where it stands as a host
        self.hosts = sorted((n for n in names if _distinctive(n)), key=len, reverse=True)
        self.plain_hosts = sorted(names - set(self.hosts), key=len, reverse=True)
        user = _user()
        self.user = user if user and len(user) >= 3 and user not in ("root", "user", "runner") else None

    def __call__(self, text: str) -> str:
        text = mask_secrets(text)
        if self.home:
            text = re.sub(rf"(?<![\w.-]){re.escape(self.home)}(?=[/\\\s:\"'`]|$)", "~", text)
        text = _HOMES.sub("~", text)
        for host in self.hosts:
            text = re.sub(rf"(?<![\w-]){re.escape(host)}(?![\w-])", "<host>", text)
        for host in self.plain_hosts:
            text = re.sub(rf"(?:(?<=@)|(?<=//)){re.escape(host)}(?![\w-])|(?<![\w-]){re.escape(host)}(?=:\d)", "<host>", text)
        text = _FQDN.sub("<host>", text)
        if self.user:
            text = re.sub(rf"(?<=[/\\]){re.escape(self.user)}(?=[/\\]|$|\s)", "<user>", text)
        return text


def _distinctive(name: str) -> bool:
    return len(name) >= 8 or any(c.isdigit() or c in "-_." for c in name)


def _fqdn() -> str:
    try:
        return socket.getfqdn()
    except OSError:
        return ""


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def environment_lines(redact: Redactor, versions: list[tuple[str, str, str]]) -> list[str]:
    """The environment section: OS, Python, and a table of (package, version, where it was seen)."""
    lines = ["## Environment", "",
             f"- OS: {redact(_os_name())}",
             f"- Python: {platform.python_version()} ({platform.python_implementation()})",
             f"- mgft-doctor: {__version__}", ""]
    if versions:
        lines += ["| package | version | seen |", "|---|---|---|"]
        lines += [f"| {name} | {redact(version)} | {where} |" for name, version, where in versions]
        lines.append("")
    return lines


def _os_name() -> str:
    pretty = ""
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("PRETTY_NAME="):
                pretty = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    base = f"{platform.system()} {platform.release()} ({platform.machine()})"
    return f"{base}, {pretty}" if pretty else base


def fenced(lines: list[str]) -> list[str]:
    return [FENCE + "text", *lines, FENCE, ""]


def write_report(markdown: str, where: str) -> Path:
    """Write the report (atomically: a temporary file renamed over the target) and return its path."""
    target = Path(where) if where else _free_default()
    if target.exists() and not target.is_file():
        raise DoctorError(f"--share={where}: exists and is not a regular file")
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".mgft-doctor-report-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(markdown)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        raise DoctorError(f"--share: cannot write {target} ({exc.strerror or exc})")
    return target


def _free_default() -> Path:
    candidate = Path(DEFAULT_NAME)
    n = 2
    while candidate.exists() or candidate.is_symlink():
        candidate = Path(f"mgft-doctor-report-{n}.md")
        n += 1
    return candidate


def announce(path: Path) -> None:
    shown = str(path) if path.is_absolute() or str(path).startswith(".") else f"./{path}"
    sys.stderr.write(f"mgft-doctor: report to share written to {shown} (secrets masked, home folders and "
                     "host names shortened; read it before you paste it)\n")


def share_explain(report, where: str) -> Path:
    """The explain report as Markdown, written and announced."""
    from ..explain.versions import installed_versions

    redact = Redactor()
    report = mask_data(report)
    seen = [(k, v, "in the log" if report.version_origin.get(k, "log") == "log" else "installed here")
            for k, v in sorted(report.versions.items())]
    seen += [(k, v, "installed here") for k, v in sorted(installed_versions().items()) if k not in report.versions]
    lines = ["# mgft-doctor report: explain", "",
             "Written by `mgft-doctor explain --share` to paste into an issue: secrets masked, home folders shown "
             "as `~` and host names as `<host>`. It holds only what is below, nothing else of the log or of your files.",
             ""]
    lines += environment_lines(redact, seen)
    lines += _verdict_lines(report, redact)
    lines += _diagnosis_lines(report, redact)
    path = write_report("\n".join(lines).rstrip() + "\n", where)
    announce(path)
    return path


def _verdict_lines(report, redact: Redactor) -> list[str]:
    from ..explain.render import when_it_failed

    logs = ", ".join(redact(s) for s in report.sources)
    lines = ["## Verdict", ""]
    if not report.failure:
        return lines + [f"No failure found in {logs} ({report.lines_read:,} lines read).", ""]
    lines += [f"Training {redact(when_it_failed(report))}. Log: {logs} ({report.lines_read:,} lines read).", ""]
    if report.root_error is not None:
        r = report.root_error
        lines += [f"Root error, line {r.no}" + (f" (rank {r.rank})" if r.rank is not None else "") + ":", ""]
        lines += fenced([redact(r.text.strip())])
    return lines


def _diagnosis_lines(report, redact: Redactor) -> list[str]:
    if not report.failure:
        return []
    if not report.diagnoses:
        return ["## Diagnosis", "", "No known failure class matched this log.", ""]
    top, others = report.diagnoses[0], report.diagnoses[1:]
    lines = ["## Diagnosis", "", f"**{top.code}** {top.title} (confidence {top.confidence:.2f})", "",
             " ".join(top.explanation.split()), "", "Fixes, in order of preference:", ""]
    lines += [f"{i}. {fix}" for i, fix in enumerate(top.fixes, 1)] + [""]
    if top.evidence:
        lines += ["Evidence:", ""]
        lines += fenced([f"line {e.no}: {redact(e.text.strip())}" for e in top.evidence])
    if others:
        lines += ["Also possible: " + "; ".join(f"{d.code} {d.title} ({d.confidence:.2f})" for d in others), ""]
    lines += [f"More: `mgft-doctor codes {top.code}`", ""]
    return lines


def share_check(results, where: str) -> Path:
    """check's probes and findings as Markdown, written and announced."""
    from ..explain.versions import installed_versions

    redact = Redactor()
    results = mask_data(results)
    seen = [(k, v, "installed here") for k, v in sorted(installed_versions().items())]
    lines = ["# mgft-doctor report: check", "",
             "Written by `mgft-doctor check --share` to paste into an issue: secrets masked, home folders shown "
             "as `~` and host names as `<host>`. It holds the probes' verdicts and findings, nothing of your files.",
             ""]
    lines += environment_lines(redact, seen)
    lines += ["## Probes", "", "| probe | status | summary |", "|---|---|---|"]
    lines += [f"| {r.id} | {r.status.value} | {_cell(redact(r.summary))} |" for r in results]
    lines.append("")
    findings = [(r, f) for r in results for f in r.findings]
    if findings:
        lines += ["## Findings", ""]
        for r, f in findings:
            lines += [f"- **{f.code}** ({r.id}, {f.severity.value}): {redact(f.message)}", f"  Fix: {redact(f.fix)}"]
        lines.append("")
    path = write_report("\n".join(lines).rstrip() + "\n", where)
    announce(path)
    return path


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
