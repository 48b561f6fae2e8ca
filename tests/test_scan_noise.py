"""A long healthy run is mostly progress and step logs: the trigger words of the scanner and
of every catalog entry must leave nearly all of those lines unread (that is what keeps explain
fast on a 1 GB log), and must never make a healthy log a failure."""

import random

import pytest

from mgft_doctor.catalog import load_catalog
from mgft_doctor.explain import _triggers, explain_text
from mgft_doctor.explain.scan import Triggers, scan
from mgft_doctor.explain import LogSource
import io


def training_noise(steps=3000, seed=1):
    rnd = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        r = step % 8
        out += [
            f"[rank{r}]: {{'loss': {rnd.random() * 2:.4f}, 'grad_norm': {rnd.random():.4f}, 'learning_rate': 1.9e-05, 'epoch': {step / 1e4:.4f}}}",
            f" {step % 100:3d}%|#####     | {step}/20000 [01:53<7:01:44,  2.26s/it]",
            f"[2025-01-07 10:14:{step % 60:02d},062] [INFO] [logging.py:128:log_dist] [Rank {r}] step={step}, skipped=0, lr=[1.9e-05], mom=[(0.9, 0.999)]",
            f"[2025-01-07 10:14:{step % 60:02d},063] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step={step // 8}, "
            f"RunningAvgSamplesPerSec=31.4, CurrSamplesPerSec=30.9, MemAllocated=11.2GB, MaxMemAllocated=19.8GB",
            f"[INFO|trainer.py:3801] 2025-01-07 10:14:09,980 >> Saving model checkpoint to saves/qwen/checkpoint-{step}"
            if step % 500 == 0 else f"Map (num_proc=16): {step % 100}%|####      | {step}/20000 [00:01<00:09, 2100.00 examples/s]",
        ]
    return "\n".join(out) + "\n"


def test_noise_lines_stay_unread_and_healthy():
    text = training_noise()
    entries = load_catalog()
    source = LogSource("<noise>", io.BufferedReader(io.BytesIO(text.encode())), "utf-8")
    salient = list(scan(source, _triggers(entries)))
    total = text.count("\n")
    assert len(salient) < 0.02 * total, f"{len(salient)} of {total} noise lines read: " + \
        "; ".join(sorted({ln.text[:60] for ln in salient})[:5])
    report = explain_text(text, entries)
    assert not report.failure and report.diagnoses == []


GLOG_LOG = """step 1 loss 0.3
E1201 14:03:22.123456 12345 socket.cpp:540] [c10d] The server socket on [::]:29500 is busy
[rank1]:E1201 14:03:23.123456 12346 TCPStore.cpp:312] [c10d] Connection to store lost
[E1201 14:03:24.123456789 socket.cpp:700] [c10d] connect to node-2 lost
I1201 14:03:22.123456 12345 socket.cpp:540] [c10d] an info line
E1X01 no glog line, and neither is this one: E1201 14:03:22.123456 in the middle
"""


def _salient(text, triggers):
    source = LogSource("<glog>", io.BufferedReader(io.BytesIO(text.encode())), "utf-8")
    return [(ln.no, ln.rank) for ln in scan(source, triggers)]


@pytest.mark.parametrize("automaton", [True, False])
def test_glog_error_lines_without_trigger_words_are_read(automaton):
    """c10d's E/F glog lines hold no trigger word; their head alone makes them salient (at a line
    start, behind a rank tag, bracketed, and first in a block), the I line and a mid-line one not."""
    triggers = Triggers(_triggers(load_catalog()).words, automaton=automaton)  # or the `re` fallback
    assert _salient(GLOG_LOG, triggers) == [(2, None), (3, 1), (4, None)]
    assert _salient(GLOG_LOG.split("\n", 1)[1], triggers) == [(1, None), (2, 1), (3, None)]


def test_a_glog_head_behind_a_million_rank_tags_costs_no_memory():
    """A block may start with a line of 10^6 rank tags (the bench's longlines shape): the glog
    head test at its start must not keep a backtracking mark per tag."""
    import tracemalloc

    triggers = _triggers(load_catalog())
    block = b"[rank3]:" * 1_000_000 + b"E1201 14:03:22.123456 12345 socket.cpp:540] lost\n"
    tracemalloc.start()
    try:
        triggers.starts(block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak


@pytest.mark.parametrize("name", ["Exception", "RuntimeError", "torch.distributed.DistBackendError"])
def test_the_message_under_any_exception_line_is_read(name):
    """The scanner follows an exception line's message onto lines with no trigger word for every
    name the failure reader calls an exception (one definition, lines.EXCEPTION_NAME): also a
    bare `raise Exception(...)`, whose name is only its keyword."""
    log = ('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    raise X(msg)\n'
           f"{name}: Current loss scale at minimum:\n\tscale 1 reached\n")
    report = explain_text(log)
    assert report.root_error.text == f"{name}: Current loss scale at minimum:"
    assert [ln.text.strip() for ln in report.root_detail] == ["scale 1 reached"]
