"""versions.compat: the installed llamafactory / transformers / accelerate / peft / trl /
datasets / deepspeed / torch / tokenizers of the examined Python against (a) LLaMA-Factory's own
ranges, read at run time from the installed LLaMA-Factory (the require_version/check_version
calls of extras/misc.py:check_dependencies, which refuse to start, and its Requires-Dist), so
the check follows any LLaMA-Factory release; (b) what the packages declare about each other
(what `pip check` sees); (c) known-bad combinations from the catalog (an entry's `affects`)."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from mgft_doctor.catalog import Entry, catalog_dir, load_file
from mgft_doctor.check.context import Context
from mgft_doctor.catalog.fixes import choose_fixes
from mgft_doctor.explain.versions import INSTALLED
from mgft_doctor.launch import worker_script
from mgft_doctor.check.probe import Finding, Probe, Status, Verdict, verdict
from packaging.markers import InvalidMarker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from . import _codes
from mgft_doctor.launch.script import run_script
from mgft_doctor.text import truthy

ID, TITLE = "versions.compat", "Versions: LLaMA-Factory's ranges and known-bad combinations"
# the stack whose ranges are checked: the distributions whose versions a diagnosis reads
# (explain/versions.py), less the optional ones, which LLaMA-Factory installs only as extras
OPTIONAL = ("bitsandbytes", "flash-attn", "vllm", "torchvision")
WATCHED = tuple(p for p in INSTALLED if p not in OPTIONAL)
TIMEOUT_S = 60
_OPS: dict[str, Callable] = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
                             ">=": operator.ge, ">": operator.gt}
_PIN_CALL = re.compile(r"""(?:require_version|check_version)\(\s*["']([^"']+)["']""")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Violation:
    package: str
    requirement: str  # as written by the package that states it
    installed: str | None  # None: not installed
    source: str  # who requires it: "llamafactory (runtime check)", "trl 0.24.0 (Requires-Dist)"

    def describe(self) -> str:
        got = f"{self.package} {self.installed}" if self.installed else f"{self.package} is not installed"
        return f"{self.source} requires {self.requirement}; found {got}"


# (a) LLaMA-Factory's own ranges ------------------------------------------------------------

def lf_runtime_pins(source: str) -> list[str]:
    """The requirement strings that LLaMA-Factory's check_dependencies() enforces at start-up (each
    a require_version/check_version call with a literal), from the source of extras/misc.py."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        body = source.split("def check_dependencies", 1)[1] if "def check_dependencies" in source else ""
        body = re.split(r"\n(?:def|class) ", body, maxsplit=1)[0]
        return _PIN_CALL.findall(body)
    pins = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "check_dependencies":
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant)
                        and isinstance(call.args[0].value, str)
                        and getattr(call.func, "id", getattr(call.func, "attr", None)) in ("require_version", "check_version")):
                    mandatory = any(k.arg == "mandatory" and getattr(k.value, "value", False) for k in call.keywords)
                    pins.append(call.args[0].value + (" ; mandatory" if mandatory else ""))
    return pins


def parse_pin(requirement: str) -> tuple[str, list[tuple[str, str]]]:
    """'transformers>=4.41.2,<=4.46.1' -> ('transformers', [('>=', '4.41.2'), ('<=', '4.46.1')]), the
    syntax of transformers' require_version (which LLaMA-Factory calls)."""
    m = re.match(r"^([^!=<>\s]+)\s*([!=<>]{1,2}.+)?$", requirement.strip())
    if not m:
        raise ValueError(f"not a pip-style requirement: {requirement!r}")
    clauses = []
    for part in (m.group(2) or "").split(","):
        c = re.match(r"^\s*([!=<>]{1,2})\s*(\S+)\s*$", part)
        if c:
            clauses.append((c.group(1), c.group(2)))
    return norm(m.group(1)), clauses


def _clause_holds(installed: str, op: str, want: str) -> bool | None:
    try:
        if "*" in want:
            return SpecifierSet(op + want).contains(installed, prereleases=True)
        return _OPS[op](Version(installed), Version(want))
    except (InvalidVersion, InvalidSpecifier, KeyError):
        return None  # cannot judge: not a violation


def check_pins(pins: list[str], versions: dict[str, str], source: str) -> list[Violation]:
    out = []
    for pin in pins:
        text = pin.split(" ; ")[0]
        try:
            pkg, clauses = parse_pin(text)
        except ValueError:
            continue
        if pkg == "python":
            got = versions.get("python")
        else:
            got = versions.get(pkg)
        if got is None:
            out.append(Violation(pkg, text, None, source))
            continue
        if any(_clause_holds(got, op, want) is False for op, want in clauses):
            out.append(Violation(pkg, text, got, source))
    return out


# (b) Requires-Dist between the watched packages ----------------------------------------------

def check_requires(dist: str, dist_version: str, requires: list[str], versions: dict[str, str],
                   markers: dict[str, str], only: set[str]) -> list[Violation]:
    """Violations of `dist`'s Requires-Dist among the packages in `only` (markers evaluated in the
    examined Python's environment; optional extras are not required)."""
    out = []
    env = dict(markers, extra="")
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        name = norm(req.name)
        if name not in only:
            continue
        if req.marker is not None:
            try:
                if not req.marker.evaluate(env):
                    continue
            except (InvalidMarker, UndefinedEnvironmentName):
                continue
        got = versions.get(name)
        if got is None:
            out.append(Violation(name, str(req).split(";")[0].strip(), None, f"{dist} {dist_version} (Requires-Dist)"))
        elif req.specifier and not req.specifier.contains(got, prereleases=True):
            out.append(Violation(name, str(req).split(";")[0].strip(), got, f"{dist} {dist_version} (Requires-Dist)"))
    return out


# (c) Known-bad combinations from the catalog ------------------------------------------------

_AFFECTS_KEY = re.compile(r"""^["']?affects["']?[ \t]*:""", re.M)


def entries_with_affects() -> list[Entry]:
    """The catalog entries that have `affects`, the only ones read here, loaded alone: loading the
    whole catalog compiles every entry's patterns, about a second of the doctor's CPU on a small
    machine, for nothing a version check uses (a test keeps this list equal to the full load's)."""
    out = []
    for path in sorted(catalog_dir().glob("*.yaml")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = "affects:"  # let load_file say what is wrong with it
        if _AFFECTS_KEY.search(text):
            entry = load_file(path)
            if entry.affects:
                out.append(entry)
    return sorted(out, key=lambda e: e.code)


def known_bad(entries: list[Entry], versions: dict[str, str]) -> list[Entry]:
    """Catalog entries whose `affects` conditions all hold for these installed versions."""
    hits = []
    for e in entries:
        if not e.affects:
            continue
        ok = True
        for cond in e.affects:
            got = versions.get(cond.package)
            try:
                ok = got is not None and cond.holds(got)
            except InvalidVersion:
                ok = False
            if not ok:
                break
        if ok:
            hits.append(e)
    return hits


def _ga(rc) -> int | None:
    ga = rc.gradient_accumulation
    if ga is None and rc.yaml_path:
        return 1  # LLaMA-Factory / the HF Trainer default
    return ga


def _zero3_auto_prefetch(rc) -> bool | None:
    if rc.ds is None or rc.zero_stage is None:
        return None
    return rc.zero_stage == 3 and rc.zero.get("stage3_prefetch_bucket_size") == "auto"


@dataclass(frozen=True)
class RunRule:
    """Whether a known-bad combination bites this run: applies(rc) is True (certain), False (not
    for this run) or None (cannot tell); `when` says what makes it bite, `then` what happens."""

    applies: Callable
    when: str
    then: str
    describe: Callable


# Keyed by catalog code: the entries whose failure depends on the run's config.
RUN_RULES: dict[str, RunRule] = {
    "MGD601": RunRule(lambda rc: None if rc.ds is None or rc.zero_stage is None or _ga(rc) is None
                      else (rc.zero_stage in (2, 3) and _ga(rc) > 1),
                      "ZeRO-2/3 with gradient_accumulation_steps > 1", "it fails on its first accumulation step",
                      lambda rc: f"ZeRO-{rc.zero_stage}, gradient_accumulation_steps {_ga(rc)}"),
    "MGD902": RunRule(_zero3_auto_prefetch, 'ZeRO-3 with stage3_prefetch_bucket_size "auto"',
                      "DeepSpeed rejects the filled-in config at start-up",
                      lambda rc: f"ZeRO-{rc.zero_stage}, stage3_prefetch_bucket_size "
                                 f"{rc.zero.get('stage3_prefetch_bucket_size', 'unset')!r}"),
}


def run(ctx: Context):
    o = ctx.options
    res = run_script(o.python, worker_script("versions"), {"packages": list(WATCHED)}, timeout=min(o.timeout, TIMEOUT_S))
    if res.payload is None:
        what = f"no answer within {res.wall_s:.0f} s" if res.timed_out else f"exit code {res.returncode}"
        tail = (res.log.strip().splitlines() or [""])[-1][:300]
        return verdict(f"could not read the installed versions in {o.python} ({what})",
                       [Finding(_codes.TORCH_MISSING, f"reading package metadata in {o.python} failed ({what}): {tail}",
                                "Check that the interpreter runs (`python -c 'import importlib.metadata'`).")],
                       {"wall_s": round(res.wall_s, 2)})
    # torch's CUDA joins the versions when another probe has read the facts already (free then)
    cuda = ctx.facts.raw.get("torch_cuda") if "facts" in ctx.__dict__ else None
    return judge(res.payload, o.python, ctx.run_config, round(res.wall_s, 2), cuda)


def judge(d: dict, examined: str, rc, wall_s: float, cuda: str | None = None) -> Verdict:
    """The verdict on the worker's payload: (a) LLaMA-Factory's ranges, (b) what the packages
    declare about each other, (c) the catalog's known-bad combinations."""
    versions = {norm(k): v for k, v in d["versions"].items()}
    versions["python"] = d.get("python")
    if cuda:
        versions["cuda"] = cuda
    requires = {norm(k): v for k, v in d.get("requires", {}).items()}
    markers = d.get("markers") or {}
    details = [f"python {d.get('python')} at {d.get('executable')}",
               "installed: " + ", ".join(f"{p} {versions[p]}" for p in WATCHED if p in versions),
               "not installed: " + (", ".join(p for p in WATCHED if p not in versions) or "none")]
    metrics = {"versions": {p: versions[p] for p in WATCHED if p in versions}, "wall_s": wall_s}
    findings, more = lf_ranges(d, versions, requires, markers, rc)
    details += more
    summary_parts = [f"within llamafactory {versions['llamafactory']}'s ranges"] if versions.get("llamafactory") and not findings else []
    findings += requirement_conflicts(versions, requires, markers)
    try:
        entries = entries_with_affects()
    except Exception as exc:  # noqa: BLE001 - a broken catalog must not hide the version checks
        entries = []
        details.append(f"catalog not read: {exc}")
    bad = known_bad(entries, versions)
    more_findings, more = known_bad_for_this_run(bad, versions, rc)
    findings += more_findings
    details += more
    details.append(f"known-bad combinations checked: {sum(1 for e in entries if e.affects)} catalog entries with `affects`"
                   + (f"; matching: {', '.join(e.code for e in bad)}" if bad else "; none matches"))
    if not bad:
        summary_parts.append("no known-bad combination")
    head = ", ".join(f"{p} {versions[p]}" for p in ("llamafactory", "transformers", "deepspeed", "torch") if p in versions)
    if not head:
        head = f"none of llamafactory, transformers, deepspeed, torch installed in {examined}"
    summary = head + ("; " + ", ".join(summary_parts) if summary_parts and not findings else "")
    if findings:
        summary = head + f"; {len(findings)} version problem(s)"
    return verdict(summary, findings, metrics, details)


def lf_ranges(d: dict, versions: dict, requires: dict, markers: dict, rc) -> tuple[list[Finding], list[str]]:
    """(a) LLaMA-Factory's own ranges: its start-up check (a refusal, unless DISABLE_VERSION_CHECK)
    and its Requires-Dist (a warning); a LLaMA-Factory YAML without llamafactory installed."""
    findings: list[Finding] = []
    details: list[str] = []
    lf = versions.get("llamafactory")
    if not lf:
        if rc is not None and rc.yaml_path:
            findings.append(Finding(_codes.LF_MISSING, f"llamafactory is not installed in {d.get('executable')}, "
                                    f"but {rc.yaml_path} is a LLaMA-Factory config",
                                    f"{d.get('executable')} -m pip install llamafactory (or point --python at the training environment)."))
        else:
            details.append("llamafactory is not installed: its ranges are not checked")
        return findings, details
    source = (d.get("llamafactory_sources") or {}).get("extras/misc.py")
    pins = lf_runtime_pins(source) if source else []
    optional = [p for p in pins if not p.endswith(" ; mandatory")]
    details.append(f"llamafactory {lf}: check_dependencies() requires "
                   + (", ".join(optional) if optional else "nothing found (no extras/misc.py check_dependencies)"))
    runtime_bad = check_pins(optional, versions, f"llamafactory {lf} (check_dependencies at start-up)")
    disabled = truthy((d.get("env") or {}).get("DISABLE_VERSION_CHECK"))
    for v in runtime_bad:
        if disabled:
            findings.append(Finding(_codes.VERSION_OUTSIDE_PIN, v.describe() + ": DISABLE_VERSION_CHECK is set, so "
                                    "LLaMA-Factory starts, on a combination it does not support",
                                    f"pip install '{v.requirement}'", Status.WARN))
        else:
            findings.append(Finding(_codes.VERSION_OUTSIDE_PIN, v.describe() + ": LLaMA-Factory refuses to start "
                                    f"(ImportError: {v.requirement} is required for a normal functioning of this module)",
                                    f"pip install '{v.requirement}' (in {d.get('executable')}); DISABLE_VERSION_CHECK=1 only "
                                    "skips the check, the combination stays untested."))
    seen = {v.package for v in runtime_bad}
    meta_bad = [v for v in check_requires("llamafactory", lf, requires.get("llamafactory", []), versions, markers,
                                          set(WATCHED) - {"llamafactory"}) if v.package not in seen]
    for v in meta_bad:
        findings.append(Finding(_codes.VERSION_OUTSIDE_PIN, v.describe() + ": outside the range LLaMA-Factory "
                                "declares to pip (its start-up check lets it pass)",
                                f"pip install '{v.requirement}' to get the combination LLaMA-Factory {lf} was released with.",
                                Status.WARN))
    return findings, details


def requirement_conflicts(versions: dict, requires: dict, markers: dict) -> list[Finding]:
    """(b) What the other watched packages declare about each other (pip check, restricted to the
    stack); a package that is not installed is LLaMA-Factory's business, not a conflict."""
    others = []
    for dist in WATCHED:
        if dist == "llamafactory" or dist not in versions:
            continue
        others += check_requires(dist, versions[dist], requires.get(dist, []), versions, markers,
                                 {p for p in WATCHED if p in versions and p != dist})
    return [Finding(_codes.VERSION_OUTSIDE_PIN, v.describe() + " (pip check reports it; imports may fail)",
                    f"pip install '{v.requirement}', or a {v.source.split(' ')[0]} release that supports {v.package} {v.installed}.",
                    Status.WARN) for v in others if v.installed is not None]


def known_bad_for_this_run(bad: list[Entry], versions: dict, rc) -> tuple[list[Finding], list[str]]:
    """(c) The catalog's known-bad combinations that are installed: certain for this run (a
    failure), not for this run (a detail line), or undecided (a warning)."""
    findings: list[Finding] = []
    details: list[str] = []
    for e in bad:
        held = ", ".join(f"{c.package} {versions.get(c.package)}" for c in e.affects)
        fix = choose_fixes(e.fixes, versions)[0]
        certain = None
        rule = RUN_RULES.get(e.code)
        if rule is not None and rc is not None:
            try:
                certain = rule.applies(rc)
            except Exception:  # noqa: BLE001 - an odd config leaves it undecided
                certain = None
        if certain is False:
            details.append(f"{e.code} ({e.title}) matches the installed {held} but not this run ({rule.describe(rc)})")
            continue
        if certain:
            findings.append(Finding(e.code, f"{e.title}: installed {held}, and this run uses {rule.when} "
                                    f"({rule.describe(rc)}), so {rule.then}", fix))
        else:
            when = f" (it bites with {rule.when})" if rule else ""
            findings.append(Finding(e.code, f"known-bad combination installed ({held}): {e.title}{when}", fix, Status.WARN))
    return findings, details


PROBE = Probe(ID, TITLE, run)
