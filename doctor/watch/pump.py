"""The pass-through: the command's stdout and stderr go, as they come (progress bars' \\r
included), to the doctor's own stdout and stderr and into the log file. It notes when the last
byte came (the stall clock) and the first watchdog line (a stall torch itself has seen)."""

from __future__ import annotations

import os
import selectors
import time

# ProcessGroupNCCL's messages when a collective timed out or the watchdog itself got stuck
WATCHDOG_MARKS = (
    b"Watchdog caught collective operation timeout",
    b"watchdog got stuck for",
    b"failure detected by watchdog at work sequence id",
    b"Received a dump signal due to a collective timeout",
    b"Heartbeat monitor timed out",
    b"monitoring thread detects no heartbeat",
)
READ_SIZE = 65536
LOG_FLUSH_S = 1.0


class Pump:
    def __init__(self, streams: dict, log, outputs: dict):
        """streams: name -> readable pipe or pty master fd; outputs: name -> binary file to copy to."""
        self.selector = selectors.DefaultSelector()
        for name, pipe in streams.items():
            os.set_blocking(pipe if isinstance(pipe, int) else pipe.fileno(), False)
            self.selector.register(pipe, selectors.EVENT_READ, name)
        self.log = log
        self.outputs = outputs
        self.last_output = time.monotonic()
        self.watchdog_line: str | None = None
        self.open_streams = len(streams)
        self._tails = {name: b"" for name in streams}
        self._last_flush = time.monotonic()

    def pump(self, timeout: float) -> None:
        """Move whatever arrives within timeout seconds; returns early once something came."""
        if not self.open_streams:
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
            fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:  # EIO: a pty whose other side every process has closed
                data = b""
            if not data:
                self.selector.unregister(key.fileobj)
                self.open_streams -= 1
                continue
            self._forward(key.data, data)
        if time.monotonic() - self._last_flush > LOG_FLUSH_S:
            self.log.flush()
            self._last_flush = time.monotonic()

    def _forward(self, name: str, data: bytes) -> None:
        self.last_output = time.monotonic()
        out = self.outputs.get(name)
        if out is not None:
            try:
                out.write(data)
                out.flush()
            except (BrokenPipeError, ValueError):
                self.outputs[name] = None  # our reader went away; keep logging
        self.log.write(data)
        if self.watchdog_line is None:
            self._look_for_watchdog(name, data)

    def _look_for_watchdog(self, name: str, data: bytes) -> None:
        text = self._tails[name] + data
        lines = text.split(b"\n")
        self._tails[name] = lines.pop()[-4096:]
        for line in lines:
            if any(mark in line for mark in WATCHDOG_MARKS):
                self.watchdog_line = line.decode("utf-8", "replace").strip()
                return

    def drain(self, deadline: float) -> None:
        """Read until every stream closed or the deadline passed."""
        while self.open_streams and time.monotonic() < deadline:
            self.pump(min(0.2, max(0.0, deadline - time.monotonic())))

    def silent_for(self) -> float:
        return time.monotonic() - self.last_output

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            try:
                os.close(key.fileobj) if isinstance(key.fileobj, int) else key.fileobj.close()
            except OSError:
                pass
        self.selector.close()
        self.log.flush()
