"""The installed versions of the training stack in the examined Python, their declared
requirements (Requires-Dist), the values environment markers are evaluated against, and the
source of LLaMA-Factory's runtime version check (llamafactory/extras/misc.py), read as text:
nothing is imported (importing llamafactory or torch takes seconds and may itself fail). A plain
script; prints one JSON object on a line that starts with MARK."""

import os
import platform
import sys
from importlib import metadata, util

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _protocol import emit, script_args  # noqa: E402

LF_SOURCES = ("extras/misc.py",)


def marker_environment():
    """What packaging.markers.default_environment() gives, without needing packaging here."""
    info = sys.implementation.version
    iver = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        iver += info.releaselevel[0] + str(info.serial)
    return {"implementation_name": sys.implementation.name, "implementation_version": iver,
            "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "platform_python_implementation": platform.python_implementation(),
            "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}


def main():
    args = script_args()
    out = {"python": platform.python_version(), "executable": sys.executable, "markers": marker_environment(),
           "versions": {}, "requires": {}, "env": {"DISABLE_VERSION_CHECK": os.environ.get("DISABLE_VERSION_CHECK")}}
    for name in args.get("packages", []):
        try:
            out["versions"][name] = metadata.version(name)
            out["requires"][name] = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - a broken dist-info is reported, not fatal
            out.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
    try:
        spec = util.find_spec("llamafactory")
    except Exception as exc:  # noqa: BLE001
        spec = None
        out["llamafactory_error"] = f"{type(exc).__name__}: {exc}"
    if spec is not None and spec.submodule_search_locations:
        root = next(iter(spec.submodule_search_locations))
        out["llamafactory_dir"] = root
        out["llamafactory_sources"] = {}
        for rel in LF_SOURCES:
            path = os.path.join(root, rel)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    out["llamafactory_sources"][rel] = f.read()
            except OSError:
                continue
    emit(out)


if __name__ == "__main__":
    main()
