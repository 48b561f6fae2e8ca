"""The doctor's own TORCH_EXTENSIONS_DIR folder name, shared by the workers that JIT-build
DeepSpeed ops (ds_ops, zero3_model): one folder per Python, torch, DeepSpeed, accelerator and
install location. A folder shared by builds with other flags or include paths is rebuilt at every
switch (torch's JIT compares build.ninja): a CI venv beside the user's, of the same versions,
compiles with other include paths."""

import hashlib
import os
import sys


def install_tag(torch, deepspeed) -> str:
    """Where torch and DeepSpeed are installed, in 8 hex digits."""
    where = os.path.dirname(os.path.abspath(torch.__file__)) + "|" + os.path.dirname(os.path.abspath(deepspeed.__file__))
    return hashlib.sha1(where.encode()).hexdigest()[:8]


def extensions_tag(torch, deepspeed, accelerator: str) -> str:
    """The folder name under the doctor's cache for this Python, torch, DeepSpeed and accelerator."""
    return (f"py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__.replace('+', '_')}"
            f"_ds{deepspeed.__version__.replace('+', '_')}_{accelerator}_{install_tag(torch, deepspeed)}")
