"""`python -m mgft_doctor` and the `mgft-doctor` console script (pyproject.toml points at entry).
Ctrl-C or SIGTERM while Python is still importing the doctor ends at once with the line and the
code it has during a command (nothing has started yet to clean up); main() takes over from there."""

import os
import signal

_STARTUP_ENDS = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated", 143)}


def _end_during_startup(signum, frame):
    word, code = _STARTUP_ENDS.get(signum, ("interrupted", 130))
    try:
        os.write(2, f"mgft-doctor: {word}\n".encode())
    except OSError:
        pass
    os._exit(code)


def entry() -> int:
    for sig in _STARTUP_ENDS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _end_during_startup)
    from mgft_doctor.cli import main

    code = main()
    for sig in _STARTUP_ENDS:  # the verdict is in; a signal while Python shuts down cannot change it
        signal.signal(sig, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    raise SystemExit(entry())
