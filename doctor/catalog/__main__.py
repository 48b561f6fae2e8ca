"""python -m mgft_doctor.catalog docs/codes: regenerate the code pages from known_errors/."""

import sys
from pathlib import Path

from .pages import write_docs

write_docs(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/codes"))
