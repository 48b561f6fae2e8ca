"""`mgft-doctor run -- CMD`: start the user's own training command, pass its output through,
and watch it (DESIGN.md §5b). One job per module:

    folder.py     the run folder (log, stacks/, fr/, procs/, ctl/) and the run's environment
    rankside/     sitecustomize.py, loaded by every Python process of the run (stdlib only)
    procs.py      which processes of the run are ranks (their registrations, /proc)
    snapshot.py   one look at the whole run (dumps + traces), and whether two looks differ
    pump.py       the output pass-through: live to our stdout/stderr, into the log, watchdog lines
    dump.py       asking every rank for its stacks (faulthandler, py-spy) and Flight Recorder trace
    stacks.py     reading faulthandler and py-spy dumps: threads, frames, the frame that matters
    traces.py     reading Flight Recorder dumps (torch's JSON and pickle): who waits in which seq
    analysis.py   who is where, the rank(s) not in the collective, the catalog entry of the pattern
    report.py     the stall report (text on stderr, stall.json in the run folder)
    supervise.py  the run itself: start, stall clock, signals, stop the tree, exit code
"""

from __future__ import annotations

from .supervise import RunOptions, supervise

__all__ = ["RunOptions", "supervise"]
