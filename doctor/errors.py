"""Errors the user sees as one line and an exit code, never as a traceback."""

# Exit codes shared by every command (DESIGN.md section 5).
EXIT_OK = 0
EXIT_FAILURE = 1  # explain: the log shows a failure; check: a probe failed
EXIT_USAGE = 2  # bad usage or unreadable input
EXIT_CRASH = 3  # the doctor itself crashed


class DoctorError(Exception):
    """A problem with the user's input or environment, reported as one line."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(DoctorError):
    """A file or stream the doctor was asked to read cannot be used."""


class CatalogError(DoctorError):
    """A known-errors entry is malformed; names the file and the field."""

    exit_code = EXIT_CRASH

    def __init__(self, path: str, field: str, problem: str):
        super().__init__(f"{path}: field '{field}': {problem}")
        self.path = path
        self.field = field
