"""What LLaMA-Factory's own pre-flight checks look up in the examined Python, gathered without
importing llamafactory, transformers or torch (each takes seconds): installed distributions and
their versions, the argument fields of LLaMA-Factory's train parser and their annotations (read
from llamafactory/hparams/*.py and transformers/training_args*.py with ast), the registered chat
templates (llamafactory/data/template.py), transformers' minimum bitsandbytes version and its
report_to integrations. Only the modules named in args["imports"] are really imported (a
quantization backend: does it import, which devices does it support). A plain script; prints
one JSON object on a line that starts with MARK."""

import ast
import os
import re
import sys
from importlib import metadata, util

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _protocol import emit, error_fields, script_args  # noqa: E402

# the parser's dataclasses: hparams/*.py but the evaluation arguments (not part of the train parser)
LF_SKIP = ("evaluation_args.py", "__init__.py", "parser.py")
HF_FILES = {"training_args.py": {"TrainingArguments"}, "training_args_seq2seq.py": {"Seq2SeqTrainingArguments"}}


def package_dir(name):
    """The folder of an installed package, found without running it."""
    try:
        spec = util.find_spec(name)
    except Exception:  # noqa: BLE001 - a broken install is "not found" here; versions.compat reports it
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(names):
    """{name: version} of the named distributions that are installed, in one pass over sys.path's
    metadata (a lookup per name would scan it once per name)."""
    wanted = {_norm(n): n for n in names}
    found = {}
    for dist in metadata.distributions():
        try:
            key = _norm(dist.metadata["Name"] or "")
        except Exception:  # noqa: BLE001 - an unreadable dist-info is skipped
            continue
        if key in wanted and wanted[key] not in found:
            found[wanted[key]] = dist.version
    return found


def _init_false(value):
    return isinstance(value, ast.Call) and any(
        k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords)


def dataclass_fields(path, classes=None):
    """{field: annotation as written} of the annotated class attributes in one file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        tree = ast.parse(f.read())
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or (classes is not None and node.name not in classes):
            continue
        for st in node.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not _init_false(st.value):
                if not st.target.id.startswith("_"):
                    out[st.target.id] = ast.unparse(st.annotation)
    return out


def parser_fields(lf, hf):
    fields = {}
    hparams = os.path.join(lf, "hparams")
    for name in sorted(os.listdir(hparams)):
        if name.endswith(".py") and name not in LF_SKIP:
            fields.update(dataclass_fields(os.path.join(hparams, name)))
    for name, classes in HF_FILES.items():
        path = os.path.join(hf, name)
        if os.path.isfile(path):
            for k, v in dataclass_fields(path, classes).items():
                fields.setdefault(k, v)
    return fields


def template_names(lf):
    """The names given to register_template(name=...) in llamafactory/data/template.py."""
    with open(os.path.join(lf, "data", "template.py"), encoding="utf-8", errors="replace") as f:
        tree = ast.parse(f.read())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_template":
            for k in node.keywords:
                if k.arg == "name" and isinstance(k.value, ast.Constant):
                    names.append(k.value.value)
    return sorted(set(names))


def transformers_facts(hf):
    out = {}
    try:
        with open(os.path.join(hf, "utils", "import_utils.py"), encoding="utf-8", errors="replace") as f:
            m = re.search(r'^BITSANDBYTES_MIN_VERSION\s*=\s*"([^"]+)"', f.read(), re.M)
        out["bnb_min"] = m.group(1) if m else None
        with open(os.path.join(hf, "integrations", "integration_utils.py"), encoding="utf-8", errors="replace") as f:
            m = re.search(r"^INTEGRATION_TO_CALLBACK\s*=\s*\{(.*?)^\}", f.read(), re.M | re.S)
        out["integrations"] = re.findall(r'"(\w+)"\s*:', m.group(1)) if m else None
    except OSError as exc:
        out["error"] = str(exc)
    return out


def try_import(name):
    """Import one module for real; for bitsandbytes also the devices it supports and those torch has
    (transformers' validate_bnb_backend_availability compares the two)."""
    try:
        mod = __import__(name)
    except BaseException as exc:  # noqa: BLE001 - a crash on import is the finding
        return error_fields(exc, 800, 2000)
    out = {"ok": True, "version": getattr(mod, "__version__", None)}
    if name == "bitsandbytes":
        out["supported_devices"] = sorted(getattr(mod, "supported_torch_devices", set()) or [])
    return out


def torch_devices():
    """The devices transformers' get_available_devices() would list (cpu always)."""
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    devices += ["xpu"] if hasattr(torch, "xpu") and torch.xpu.is_available() else []
    return {"devices": devices}


def main():
    args = script_args()
    out = {"executable": sys.executable, "versions": installed(args.get("packages", [])), "imports": {}}
    lf, hf = package_dir("llamafactory"), package_dir("transformers")
    out["llamafactory_dir"], out["transformers_dir"] = lf, hf
    try:
        if lf and hf:
            out["fields"] = parser_fields(lf, hf)
        if lf:
            out["templates"] = template_names(lf)
        if hf:
            out.update(transformers_facts(hf))
    except (OSError, SyntaxError) as exc:
        out["source_error"] = f"{type(exc).__name__}: {exc}"
    for name in args.get("imports", []):
        out["imports"][name] = try_import(name)
    if any(v.get("ok") for v in out["imports"].values()):
        out["torch"] = torch_devices()
    emit(out)


if __name__ == "__main__":
    main()
