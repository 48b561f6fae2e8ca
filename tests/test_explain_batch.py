"""The block-at-a-time reading of explain gives the same answers as reading line by line: the
scanner's two ways of finding a block's salient lines (_sparse_lines, _dense_lines) find the
same lines, and feeding the matcher a block's lines sampled (explain._match_block) leaves it
the same hits as feeding it every line."""

from __future__ import annotations

import io
import random

from mgft_doctor.catalog import load_catalog
from mgft_doctor.explain import LogSource, _match_block, _triggers
from mgft_doctor.explain.lines import LogLine
from mgft_doctor.explain.match import Matcher
from mgft_doctor.explain.scan import _Scanner
from mgft_doctor.explain.source import iter_blocks

WARNING = ("/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the "
           "inputs have requires_grad=True. Gradients will be None")


def _mixed_log(steps: int = 1500, seed: int = 3) -> bytes:
    """Every habit the scanner treats apart, repeated so that blocks become dense: rank tags,
    tracebacks with frames, source lines and exception messages (lines read as continuations),
    CRLF endings, '\\r' redraws with a trigger word, glog error lines with no trigger word, a rich
    box, a line first read as a continuation that later stands alone, and no final newline."""
    rnd = random.Random(seed)
    out = []
    for step in range(steps):
        r = step % 4
        out.append(f"[rank{r}]:{WARNING}")
        out.append(f"[rank{r}]:  warnings.warn(")
        out.append(f"[rank{r}]: {{'loss': {rnd.random():.4f}, 'epoch': {step / 100:.2f}}}")
        if step % 7 == 0:
            out += [f"[rank{r}]: Traceback (most recent call last):",
                    f'[rank{r}]:   File "/opt/app/data.py", line {step % 5 + 10}, in load_sample',
                    f"[rank{r}]:     sample = json.loads(raw)",
                    f"[rank{r}]: json.decoder.JSONDecodeError: Expecting value: line 1 column {step % 3} (char 0)",
                    f"[rank{r}]: the message goes on here",
                    f"[rank{(r + 1) % 4}]: another rank's line"]
        if step % 11 == 0:
            out.append("[rank2]:     sample = json.loads(raw)")  # no trigger word here, no frame above it
        if step % 13 == 0:
            out.append(f"NCCL INFO Channel {step % 4} via P2P\r")  # CRLF
        if step % 17 == 0:
            out.append("".join(f"\rMap (num_proc=4): {i}%| warn {i}/100" for i in range(0, 100, 9)))
        if step % 19 == 0:
            out.append(f"E1201 14:03:{step % 60:02d}.123456 12345 socket.cpp:540] [c10d] store lost")
        if step % 23 == 0:
            out += ["╭──────── Traceback (most recent call last) ────────╮",
                    "│ /opt/app/train.py:12 in main                        │",
                    "│   11 │ x = 1                                        │",
                    "╰────────────────────────────────────────────────────╯",
                    "ValueError: boxed"]
    return ("\n".join(out) + "\n[rank0]: RuntimeError: the last line has no newline").encode()


def _scan(data: bytes, dense: bool, block_size: int) -> tuple[list[tuple], int]:
    triggers = _triggers(load_catalog())
    scanner = _Scanner(triggers, 0)
    source = LogSource("<mixed>", io.BufferedReader(io.BytesIO(data)), "utf-8")
    lines, line_at = [], 1
    for i, block in enumerate(iter_blocks(source, block_size)):
        read = scanner._dense_lines if dense and i else scanner._sparse_lines  # the first block fills the memo
        found = read(block, line_at)
        assert scanner.newlines == block.count(b"\n")  # each way counts them as it goes
        lines += [(ln.no, ln.rank, ln.text) for ln in found]
        line_at += scanner.newlines
    return lines, line_at


def test_dense_and_sparse_reading_find_the_same_lines():
    data = _mixed_log()
    for block_size in (1 << 12, 1 << 14, 1 << 20):
        sparse = _scan(data, False, block_size)
        dense = _scan(data, True, block_size)
        assert dense == sparse
        assert sparse[1] == data.count(b"\n") + 1
    texts = {t for _, _, t in sparse[0]}  # one block: nothing is cut off at a block's end
    assert "another rank's line" not in texts  # another rank's line ends the message
    assert "the message goes on here" in texts
    under_frames = [no for no, _, t in sparse[0] if t == "    sample = json.loads(raw)"]
    assert len(under_frames) == len(range(0, 1500, 7))  # not the same line standing alone


def test_sampled_matcher_keeps_the_same_hits():
    entries = load_catalog()
    texts = [WARNING, "  warnings.warn(", "Traceback (most recent call last):",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
             "NCCL WARN NET/Plugin: could not find", "nothing at all here", "x" * 700 + " CUDA error: "]
    rnd = random.Random(5)
    for trial in range(20):
        weights = [rnd.random() for _ in texts]
        if trial % 2:
            weights[-1] = 0  # most blocks have no line too long for the matcher's memo
        lines = [LogLine(i + 1, rnd.choices(texts, weights)[0], rnd.choice([None, 0, 1])) for i in range(600)]
        whole, sampled = Matcher(entries), Matcher(entries)
        for line in lines:
            whole.feed(line)
        matched: dict = {}
        i = 0
        while i < len(lines):
            n = rnd.randint(1, 80)
            _match_block(sampled, lines[i:i + n], matched)
            i += n
        hits = lambda m: {k: [(ln.no, ln.text) for ln in h.lines()] for k, h in m.hits.items()}  # noqa: E731
        assert hits(sampled) == hits(whole)
        assert [(c.entry.code, c.score, [ln.no for ln in c.evidence]) for c in sampled.rank(set())] == \
               [(c.entry.code, c.score, [ln.no for ln in c.evidence]) for c in whole.rank(set())]


def _redraw_log(seed: int = 11) -> bytes:
    """Physical lines of thousands of '\\r' redraws: trigger words in pieces that repeat a shape,
    pieces that differ only in digits, whitespace-only pieces, CRLF endings, an exception first in
    its line and a rank's message continued on a line of redraws."""
    rnd = random.Random(seed)
    out = []
    for step in range(60):
        kind = step % 5
        n = rnd.randint(70, 3000)
        if kind == 0:
            out.append("".join(f"\rFilter out samples with errors (num_proc=16): {i % 100:3d}%| {i}/9000 [{i % 997:.2f} ex/s]"
                               for i in range(n)))
        elif kind == 1:
            out.append("".join("\r " if i % 7 else f"\rMap: {i}% warn" for i in range(n)) + "\r")
        elif kind == 2:
            out.append("[rank1]: RuntimeError: it broke here")
            out.append("[rank1]:" + "".join(f"\r{i % 10} of the message" for i in range(n)))
        elif kind == 3:
            out.append(f"plain text {step}" + "".join(f"\rstep {i}/{n}" for i in range(n)) + "\rfinal error at the end")
        else:
            out.append(f"{{'loss': {rnd.random():.4f}}} no trigger" + "".join(f"\rx{i}" for i in range(n)))
        out.append(f"[rank0]: {{'loss': {rnd.random():.4f}}}")
    return "\n".join(out).encode()


def test_squeezed_redraw_lines_read_as_the_whole_ones(monkeypatch):
    from mgft_doctor.explain import scan as scan_module

    data = _redraw_log()
    triggers = _triggers(load_catalog())

    squeezed = [(ln.no, ln.rank, ln.text) for ln in scan_module.scan(
        LogSource("<redraws>", io.BufferedReader(io.BytesIO(data)), "utf-8"), triggers)]
    assert any("it broke here" in t for _, _, t in squeezed)
    assert len(scan_module._squeeze_redraws(data)) < len(data) // 10
    monkeypatch.setattr(scan_module, "SQUEEZE_PIECES", 10 ** 9)
    whole = [(ln.no, ln.rank, ln.text) for ln in scan_module.scan(
        LogSource("<redraws>", io.BufferedReader(io.BytesIO(data)), "utf-8"), triggers)]
    assert squeezed == whole
