"""Which phase of the run failed (start-up, data loading, model loading, first step,
mid-training, saving, exit) and at which step, read from the log itself.

Phase markers ('Running tokenizer on dataset', '***** Running training *****') are trigger
words, so they reach the tracker as salient lines with exact line numbers. Training progress
(tqdm bars, loss dicts), datasets' map progress and checkpoint saves are on almost every line
of a long run's log, or cost the matcher's fuzzy patterns dear: making them salient would slow
explain down. So the tracker peeks at the tail of each byte block on its way to the scanner (a
few `rfind` calls over 64 KB) and keeps the last block and the first blocks with an error; at
the end it reads the block that holds the root error again up to the root's line, so the phase
and step there are exact. Memory stays flat: one peeked mark per block at most, a few blocks
kept."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

from .lines import LogLine
from .source import BLOCK_SIZE, LogSource, iter_blocks

START_UP, DATA, MODEL, FIRST_STEP, TRAINING, SAVING, EXIT = (
    "start-up", "data loading", "model loading", "first step", "mid-training", "saving", "exit")
PHASES = (START_UP, DATA, MODEL, FIRST_STEP, TRAINING, SAVING, EXIT)

# What the libraries print when a phase begins: LLaMA-Factory's data loader, datasets' map
# progress, transformers' modeling_utils and Trainer. (literal trigger, pattern, phase)
MARKERS: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (literal, re.compile(pattern), phase) for literal, pattern, phase in (
        ("Setting OMP_NUM_THREADS", r"Setting OMP_NUM_THREADS environment variable", START_UP),  # torchrun's banner
        ("Process rank: ", r"Process rank: \d+, (?:world size|device)", START_UP),  # LLaMA-Factory's parser
        ("Loading dataset ", r"Loading dataset \S", DATA),
        ("Converting format of dataset", r"Converting format of dataset", DATA),
        ("Running tokenizer on", r"Running tokenizer on (?:dataset|every text)", DATA),
        ("Grouping texts in chunks", r"Grouping texts in chunks", DATA),
        ("Generating train split", r"Generating train split", DATA),
        ("loading weights file", r"loading weights file", MODEL),
        ("Loading weights", r"Loading weights\b", MODEL),
        ("Loading checkpoint shards", r"Loading checkpoint shards", MODEL),
        ("DeepSpeed info: version=", r"DeepSpeed info: version=", FIRST_STEP),  # deepspeed.initialize, in trainer.train
        ("***** Running training *****", r"\*{5} Running training \*{5}", FIRST_STEP),
        ("Total optimization steps", r"Total optimization steps = [\d,]+", FIRST_STEP),
        ("Training completed", r"Training completed\.", EXIT),
        ("***** train metrics *****", r"\*{5} train metrics \*{5}", EXIT),
    ))
TRIGGERS = tuple(literal for literal, _, _ in MARKERS)
_IMPORT_ERROR = re.compile(r"(?:[\w.]+\.)?(?:ModuleNotFoundError|ImportError)\b")
_ANY_TRIGGER = re.compile("|".join(map(re.escape, TRIGGERS)))  # one C-level pass instead of a Python any()
_ANY_MARKER = re.compile("|".join(f"(?:{p.pattern})" for _, p, _ in MARKERS))


def names_no_phase(text: str) -> bool:
    """True when the line names no phase, nor does any line of its shape (digits aside)."""
    return _ANY_TRIGGER.search(text) is None
_TOTAL_STEPS = re.compile(r"Total optimization steps = ([\d,]+)")

# a tqdm bar without a description (the Trainer's): '[rank0]:  40%|####      | 1200/3000 [', or one
# whose description names the training loop: Lightning's 'Epoch 3:  45%|', a custom loop's
# 'Epoch 1/30: 100%|' or 'Steps:  10%|' (diffusers/accelerate scripts), 'Training: 12%|'. Other
# descriptions are data, shards, evaluation or generation bars.
# An epoch's bar counts that epoch's batches, not the run's steps: it says training, not which step.
_BAR = re.compile(rb"(?:\[\w+\]:)*\s*(?:(?P<epoch>(?i:epoch)\s*\d+(?:\s*/\s*\d+)?\s*:?\s*)|(?i:steps?|training|train|iterations?)\s*:?\s*)?"
                  rb"(\d{1,3})%\|[^|\r\n]*\|\s*(\d+)/(\d+) \[")
_BAR_RATES = (b"s/it", b"it/s")
BAR_TRIES = 32  # bars with a description (datasets, shards) or eval bars skipped before giving up
_LOSS = (b"'loss': ", b'"loss": ')
# a custom training loop's own progress line ('step 3 loss 6.2589', 'rank 0 step=3, loss=2.1',
# 'epoch 0 step 12 | loss: 0.93'): DeepSpeed, accelerate and plain torch loops print no bar of their own
_USER_LOSS = b"loss"
# 'Epoch 0, batch 3000, loss[loss=0.18' (icefall), 'itr 120/3406: ... loss_nce: 1.22', 'total step: 15600,
# (loss_avg_rank: 0.212)' (FunASR), 'Epoch 98: head: Default, loss=0.0014' (MACE): a counter word, its number,
# then a loss-named value
_USER_STEP = re.compile(rb"(?i:\b(?:step|batch|iter(?:ation)?|itr|epoch)\b)[ =:#]*\d+\b[^\n\r]{0,120}?"
                        rb"\bloss\w*[ =:\[(]*(?:[a-z_]+=)?[ =:]*-?\d")
USER_TRIES = 8  # 'loss' words looked at, back from the end, before giving up
# A marker printed often in a long run (every save_steps) and on lines that cost the matcher's
# fuzzy patterns dear: found by peeking at the blocks, like the progress, not as a trigger.
_SAVING = b"Saving model checkpoint to"
# datasets' map progress: the data is being prepared (redrawn thousands of times: peeked too)
_MAP = re.compile(rb"Map(?: \(num_proc=\d+\))?: +\d{1,3}%")
# datasets' map/filter with a description: desc + f" (num_proc={num_proc})" (arrow_dataset.py), e.g.
# axolotl's 'Tokenizing Prompts (num_proc=64):  71%|'
_MAP_DESC = re.compile(rb"(?:\[\w+\]:)*[^\r\n|%]{1,120} \(num_proc=\d+\): +\d{1,3}%")
_DS_STEP = re.compile(rb"\] step=(\d+), skipped=")
TAIL_BYTES = 64 << 10
KEEP_BLOCKS = 1  # the last block, where the root error usually is (more would fragment the heap as the log grows)
BACKWARD_LINES = 20_000  # a root this near the log's end is found walking back from it
PIN_BLOCKS = 2  # and the first blocks with an error in them
TIMELINE_LIMIT = 20_000
PLAIN_CACHE = 20_000  # texts of salient lines known to name no phase

# Frames of the root traceback that name the phase better than the lines before it, in this
# order: the Trainer's loop calls the data collator and the save, so saving is checked first.
FRAME_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (SAVING, re.compile(r"in (?:_save_checkpoint|save_model|_save|save_pretrained|save_checkpoint|"
                        r"_save_zero_checkpoint|save_16bit_model|_save_optimizer_and_scheduler|save_state)$|zero_to_fp32")),
    (FIRST_STEP, re.compile(r'trainer\.py", line \d+, in (?:train|_inner_training_loop|training_step|compute_loss)$|'
                            r"in (?:training_step|_inner_training_loop)$|"
                            # a custom loop's step: the DeepSpeed engine's, accelerate's, autograd's
                            r'deepspeed/runtime/engine\.py", line \d+, in (?:forward|backward|step|no_sync|_backward_epilogue|'
                            r'allreduce_gradients|_take_model_step)$|accelerate/accelerator\.py", line \d+, in (?:backward|accumulate|no_sync|gather|gather_for_metrics|reduce)$|'
                            r'torch/(?:_tensor|autograd/__init__)\.py", line \d+, in backward$|'
                            # a forward under DDP, the HF models' loss, an optimizer step: past loading, in a step
                            r'torch/nn/parallel/distributed\.py", line \d+, in forward$|transformers/loss/loss_utils\.py"|'
                            r'torch/optim/optimizer\.py", line \d+, in wrapper$|'
                            # a custom loop's epoch/step function (FunASR, RETURNN, timm, fairseq-style trainers)
                            r"in (?:train_epoch|train_one_epoch|train_step|training_loop|run_epoch)$")),
    (DATA, re.compile(r"llamafactory/data/|/datasets/(?:arrow_dataset|load|builder|iterable_dataset)\.py|"
                      # a custom loop building its DataLoader / DistributedSampler
                      r'torch/utils/data/(?:dataloader|distributed)\.py", line \d+, in __init__$|'
                      r"in (?:get_dataset|_get_merged_dataset|_load_single_dataset|_get_preprocessed_dataset|"
                      r"load_dataset|align_dataset|preprocess_dataset)$")),
    (MODEL, re.compile(r"in (?:from_pretrained|load_model|load_tokenizer|_load_pretrained_model|"
                       r"init_adapter|_setup_lora_tuning|get_peft_model|load_state_dict)$|modeling_utils\.py")),
    (START_UP, re.compile(r"hparams/parser\.py|in (?:get_train_args|_parse_train_args|parse_args_into_dataclasses|"
                          r"parse_yaml_file|parse_dict|__post_init__)$|"
                          # the default process group (a custom script's own init, or DeepSpeed's)
                          r'distributed_c10d\.py", line \d+, in init_process_group$|deepspeed/comm/comm\.py", line \d+, in init_distributed$')),
    # building the DeepSpeed engine or accelerate's prepare: the model is loaded, training is being set up.
    # Checked last: the same calls also start the process group and wrap DataLoaders, which the entries above name.
    (FIRST_STEP, re.compile(r'deepspeed/__init__\.py", line \d+, in initialize$|'
                            r'accelerate/accelerator\.py", line \d+, in (?:prepare|_prepare_deepspeed|_prepare_one)$')),
)


@dataclass(slots=True)
class Mark:
    """Something the log showed: a phase beginning, or training progress (step of total).
    key orders the marks among the salient lines: a marker's key is its line number; a peeked
    mark's is half a line before the first salient line printed after it."""

    block: int
    key: float
    phase: str
    step: int | None = None
    total: int | None = None
    text: str = ""
    line: int | None = None  # exact line number, where known


@dataclass
class Phase:
    name: str
    step: int | None = None
    total: int | None = None
    line: int | None = None  # the line that shows it
    text: str = ""
    rank: int | None = None

    def progress_json(self) -> dict | None:
        return None if self.step is None else {"step": self.step, "total_steps": self.total}


@dataclass
class _Track:
    """One log: its marks in order, the block being read, the kept blocks' bytes."""

    index: int = 0
    marks: list[Mark] = field(default_factory=list)
    block: int = -1
    first: tuple[int, str] | None = None  # the current block's first salient line
    pending: list[Mark] = field(default_factory=list)  # markers of the current block
    block_lines: list[tuple[list[LogLine], list]] = field(default_factory=list)  # its salient lines, as read (lines and records)
    peeked: tuple[int, Mark] | None = None  # the current block's last progress or save
    kept: dict[int, bytes] = field(default_factory=dict)
    pinned: set[int] = field(default_factory=set)  # blocks kept because an error was printed in them
    first_line: dict[int, tuple[int, str]] = field(default_factory=dict)  # block -> its first salient line
    last_line: int = 0
    total: int | None = None


class PhaseTracker:
    """Sees each log's byte blocks (through tap) and its salient lines (through feed)."""

    block_size = BLOCK_SIZE

    def __init__(self) -> None:
        self.tracks: dict[int, _Track] = {}
        self._track: _Track | None = None  # the log being read
        self._plain: set[str] = set()

    def tap(self, source: LogSource, index: int) -> LogSource:
        """A source that yields the same line-aligned UTF-8 blocks, peeked at first."""
        return LogSource(source.name, _BlockStream(self.blocks(source, index)), "utf-8")

    def blocks(self, source: LogSource, index: int) -> Iterator[bytes]:
        """The source's line-aligned UTF-8 blocks (source.iter_blocks), each peeked at first."""
        track = self._track = self.tracks.setdefault(index, _Track(index=index))
        return self._watch(iter_blocks(source, self.block_size), track)

    def _watch(self, blocks: Iterator[bytes], track: _Track) -> Iterator[bytes]:
        for block in blocks:
            _close_block(track)
            track.block += 1
            track.first = None
            track.kept[track.block] = block
            if track.block - KEEP_BLOCKS not in track.pinned:
                track.kept.pop(track.block - KEEP_BLOCKS, None)
            track.peeked = _progress_before(block, len(block), track.total, max(0, len(block) - TAIL_BYTES))
            yield block
        _close_block(track)

    def feed(self, line: LogLine) -> None:
        """A salient line (see feed_block)."""
        self.feed_block([line])

    def feed_block(self, lines: list[LogLine], read: tuple[list[LogLine], list] | None = None) -> None:
        """Salient lines of one log, in order (a scanned block's): remembered for ordering the
        block's peeked mark; a marker where one names a phase. Most lines repeat one seen
        before that named no phase (warnings repeat every step): one set lookup each.
        read: where lines leave out tracebacks read as records (none of which names a phase,
        and which are neither the block's first salient line nor its last), the block's lines
        as the scanner read them: (lines, [(index in those where a record's lines go,
        scan.Record), ...]), whose lines are made only if the peeked mark is placed among them."""
        if not lines:
            return
        source = lines[0].source
        track = self._track
        if track is None or track.index != source:
            track = self._track = self.tracks.setdefault(source, _Track(index=source))
        if track.first is None:
            track.first = track.first_line[track.block] = (lines[0].no, lines[0].text)
        track.last_line = lines[-1].no
        if track.peeked is not None:
            track.block_lines.append(read or (lines, ()))
        plain = self._plain
        for line in lines:
            text = line.text
            if text in plain:
                continue
            if _ANY_TRIGGER.search(text) is None or _ANY_MARKER.search(text) is None:
                if len(plain) >= PLAIN_CACHE:
                    plain.clear()
                plain.add(text)
                continue
            phase = next(ph for _, p, ph in MARKERS if p.search(text))
            total = _TOTAL_STEPS.search(text)
            if total:
                track.total = int(total.group(1).replace(",", ""))
            track.pending.append(Mark(track.block, line.no, phase, None, track.total if total else None,
                                      text.strip()[:300], line.no))

    def pin(self, line: LogLine) -> None:
        """An error was printed in the current block: keep its bytes (the first few such
        blocks), so that the phase there can be read exactly if it turns out to be the root."""
        track = self.tracks.get(line.source)
        if track is not None and len(track.pinned) < PIN_BLOCKS and track.block in track.kept:
            track.pinned.add(track.block)

    def phase_at(self, root: LogLine, frames: list[LogLine] | None = None,
                 lines_total: int | None = None) -> Phase | None:
        """The phase the run was in when the root line was printed; frames (the root traceback's
        'File ..., in func' lines) override the log's markers where they are decisive.
        lines_total: the number of lines of that log, which places lines near its end quickly."""
        track = self.tracks.get(root.source, _Track())
        _close_block(track)  # a last block the scanner read after the tracker had filed it
        marks = _marks_before(track, root.no, lines_total)
        phase = _with_frames(_from_marks(marks), frames or [])
        if phase is None and _IMPORT_ERROR.match(root.text.strip()):
            phase = Phase(START_UP, line=root.no, text=root.text.strip())  # an import fails before anything runs
        if phase is not None:
            phase.rank = root.rank
        return phase


def _marks_before(track: _Track, line: int, lines_total: int | None) -> list[Mark]:
    """The marks printed before `line`. The block holding it, when still kept, is read again up
    to that line, so the last progress or save before it is exact (a peek sees only a block's
    tail); when nothing is there, the block before it is read again likewise if it was kept."""
    before = [m for m in track.marks if m.key < line]
    root_block = max((b for b, (first, _) in track.first_line.items() if first <= line), default=track.block)
    data = track.kept.get(root_block)
    anchor = _anchor(data, track.first_line.get(root_block))
    if anchor is None:
        return before
    last_block = lines_total if root_block == track.block else None
    end = _line_start(data, line, anchor, last_block)
    total = next((m.total for m in reversed(before) if m.total), None)
    found = _last_progress(data, end, total)
    earlier = root_block
    if found is None and root_block - 1 in track.kept:
        earlier = root_block - 1
        prev = track.kept[earlier]
        found = _last_progress(prev, len(prev), total)
        if found is not None:  # its line, counted back from the root block's first line
            base = anchor[1] - data.count(b"\n", 0, anchor[0])
            found[1].line = base - prev.count(b"\n", found[0])
    elif found is not None:
        found[1].line = line - data.count(b"\n", found[0], end)
    marks = [m for m in before if m.block < earlier or m.line is not None]
    if found is not None:
        mark = found[1]
        mark.block, mark.key = earlier, mark.line
        marks.append(mark)
    return sorted(marks, key=lambda m: m.key)


def _last_progress(data: bytes, end: int, total: int | None) -> tuple[int, Mark] | None:
    """The last progress or save before end, looked for in growing windows back from end (the
    latest window with any holds the latest)."""
    size = TAIL_BYTES
    stop = end
    while stop > 0:
        start = max(0, end - size)
        found = _progress_before(data, stop, total, start)
        if found is not None:
            return found
        stop, size = start, size * 8
    return None


def _anchor(data: bytes | None, first: tuple[int, str] | None) -> tuple[int, int] | None:
    """(offset, line number) of the start of the block's first salient line: that line's text
    first occurs where that line is (an earlier copy would have been salient too)."""
    if data is None or first is None:
        return None
    no, text = first
    pos = data.find(text.strip()[:60].encode("utf-8", "replace"))
    return None if pos < 0 else (data.rfind(b"\n", 0, pos) + 1, no)


def _line_start(data: bytes, line: int, anchor: tuple[int, int], lines_total: int | None) -> int:
    """Offset of the start of `line` in the block: walked back from the block's end when it is
    the log's last block and the line is near its end, else skipped forward from the anchor."""
    if lines_total is not None and 0 <= lines_total - line < BACKWARD_LINES:
        pos = len(data)
        for _ in range(lines_total - line + 2):
            pos = data.rfind(b"\n", 0, pos)
            if pos < 0:
                return 0
        return pos + 1
    return _offset_of_line(data, line - anchor[1], anchor[0])


class _BlockStream:
    """The read() that iter_blocks() expects, over blocks that are already aligned."""

    def __init__(self, blocks: Iterator[bytes]):
        self._blocks = blocks

    def read(self, _size: int = -1) -> bytes:
        return next(self._blocks, b"")

    def close(self) -> None:
        pass


def _close_block(track: _Track) -> None:
    """The current block is read: place its peeked mark among its salient lines (the first
    salient line found after it, searching back from the block's end) and file its marks."""
    marks = track.pending
    if track.peeked is not None:
        pos, mark = track.peeked
        data = track.kept.get(track.block, b"")
        after, cursor = None, len(data)
        for line in _backwards(track.block_lines):
            hit = data.rfind(line.text.strip()[:60].encode("utf-8", "replace"), pos, cursor)
            if hit < 0:
                break
            after, cursor = line.no, hit
        mark.block = track.block
        mark.key = after - 0.5 if after is not None else track.last_line + 0.5
        marks = sorted(marks + [mark], key=lambda m: m.key)
    for m in marks:
        _append(track.marks, m)
    track.pending, track.block_lines, track.peeked = [], [], None


def _backwards(parts: list[tuple[list[LogLine], list]]) -> Iterator[LogLine]:
    """The salient lines of a block, last first, records' lines made where reached."""
    for lines, records in reversed(parts):
        if not records:
            yield from reversed(lines)
            continue
        j = len(records) - 1
        for i in range(len(lines), -1, -1):
            while j >= 0 and records[j][0] == i:
                yield from reversed(records[j][1].lines())
                j -= 1
            if i:
                yield lines[i - 1]


def _append(marks: list[Mark], mark: Mark) -> None:
    """Add a mark; a run of peeked marks keeps only its latest; the list stays bounded."""
    if marks and mark.line is None and marks[-1].line is None and mark.phase == marks[-1].phase:
        marks[-1] = mark
    else:
        marks.append(mark)
    if len(marks) > TIMELINE_LIMIT:
        del marks[: len(marks) // 2]


def _progress_before(block: bytes, end: int, total: int | None, start: int) -> tuple[int, Mark] | None:
    """The last sign of training in block[start:end]: a bar of the Trainer, a loss dict, a
    DeepSpeed 'step=N' line, or a checkpoint save; (position, mark) or None. The mark carries
    the last step seen, also when a loss dict or a save came after the bar."""
    found: list[tuple[int, Mark]] = []
    bar = _last_bar(block, start, end, total)
    if bar is not None:
        pos, step, bar_total = bar
        found.append((pos, Mark(-1, 0.0, TRAINING if step is None or step > 0 else FIRST_STEP, step, bar_total, _text(block, pos))))
    loss = max(block.rfind(lit, start, end) for lit in _LOSS)
    if loss >= 0:
        found.append((loss, Mark(-1, 0.0, TRAINING, None, None, _text(block, loss))))
    user = _user_progress(block, max(start, loss + 1), end)
    if user >= 0:
        found.append((user, Mark(-1, 0.0, TRAINING, None, None, _text(block, user))))
    ds = block.rfind(b"] step=", start, end)
    m = _DS_STEP.match(block, ds) if ds >= 0 else None
    if m:
        found.append((ds, Mark(-1, 0.0, TRAINING, int(m.group(1)), None, _text(block, ds))))
    save = block.rfind(_SAVING, start, end)
    if save >= 0:
        found.append((save, Mark(-1, 0.0, SAVING, None, None, _text(block, save))))
    data = max(block.rfind(b"Map (num_proc=", start, end), block.rfind(b"Map: ", start, end))
    if data >= 0 and _MAP.match(block, data):
        found.append((data, Mark(-1, 0.0, DATA, None, None, _text(block, data))))
    described = block.rfind(b" (num_proc=", start, end)
    if described > data:
        seg = max(block.rfind(b"\n", 0, described), block.rfind(b"\r", 0, described)) + 1
        if _MAP_DESC.match(block, seg, min(len(block), described + 40)):
            found.append((seg, Mark(-1, 0.0, DATA, None, None, _text(block, seg))))
    if not found:
        return None
    found.sort(key=lambda f: f[0])
    pos, mark = found[-1]
    if mark.step is None and mark.phase != DATA:
        stepped = [f[1] for f in found if f[1].step is not None]
        if stepped:
            mark.step, mark.total = stepped[-1].step, stepped[-1].total
    return pos, mark


def _user_progress(block: bytes, start: int, end: int) -> int:
    """Where the last progress line of a custom loop ('step N ... loss X') starts in
    block[start:end], or -1; only the last few 'loss' words are looked at."""
    pos = end
    for _ in range(USER_TRIES):
        hit = block.rfind(_USER_LOSS, start, pos)
        if hit < 0:
            return -1
        seg = max(block.rfind(b"\n", 0, hit), block.rfind(b"\r", 0, hit)) + 1
        if _USER_STEP.search(block, seg, min(hit + 32, len(block))):
            return seg
        pos = hit
    return -1


def _last_bar(block: bytes, start: int, end: int, total: int | None) -> tuple[int, int, int] | None:
    """The last progress bar of the training loop: no description, and the run's total steps
    when the log said it (eval bars have another total)."""
    pos = end
    for _ in range(BAR_TRIES):
        hit = max(block.rfind(rate, start, pos) for rate in _BAR_RATES)
        if hit < 0:
            return None
        seg = max(block.rfind(b"\n", 0, hit), block.rfind(b"\r", 0, hit)) + 1
        m = _BAR.match(block, seg, hit + 4)
        if m and m.group("epoch"):
            return seg, None, None
        if m and (total is None or int(m.group(4)) == total):
            return seg, int(m.group(3)), int(m.group(4))
        if seg <= start:
            return None
        pos = seg
    return None


def _text(block: bytes, pos: int) -> str:
    seg = max(block.rfind(b"\n", 0, pos), block.rfind(b"\r", 0, pos)) + 1
    stops = [x for x in (block.find(b"\n", pos), block.find(b"\r", pos)) if x >= 0]
    stop = min(stops) if stops else len(block)
    return block[seg:min(stop, seg + 300)].decode("utf-8", "replace").strip()


def _offset_of_line(block: bytes, index: int, start: int = 0) -> int:
    """Byte offset where the index-th line after the one starting at `start` starts; the lines
    are skipped by one counted regex repeat, in C."""
    if index <= 0:
        return start
    m = re.compile(rb"(?:[^\n]*\n){%d}" % index).match(block, start)
    return m.end() if m else len(block)


def _from_marks(marks: list[Mark]) -> Phase | None:
    """The phase of the last mark: None when the log shows none (an excerpt says nothing of it)."""
    if not marks:
        return None
    last = marks[-1]
    if last.phase == TRAINING:
        ended = next((m for m in reversed(marks[-4:-1]) if m.phase in (EXIT, SAVING)), None)
        if ended is not None and last.step is not None and last.step == last.total:
            last = ended  # the bar's final redraw after 'Training completed' or the final save
    step = next((m.step for m in reversed(marks) if m.step is not None), None)
    total = next((m.total for m in reversed(marks) if m.total is not None), None)
    if last.phase in (DATA, MODEL, START_UP):
        step = total = None  # a step logged before (an earlier run in the same log) is not this phase's
    elif last.phase == FIRST_STEP:
        step = None
    return Phase(last.phase, step, total, last.line, last.text)


def _with_frames(timeline: Phase | None, frames: list[LogLine]) -> Phase | None:
    """The phase the root traceback's frames name, where they name one; the log's progress
    still says which step (a save or a training step happens at one)."""
    for phase, pattern in FRAME_PHASES:
        frame = next((f for f in reversed(frames) if pattern.search(f.text.strip())), None)
        if frame is None:
            continue
        if timeline is None:
            return Phase(phase, line=frame.no, text=frame.text.strip())
        if phase == timeline.name or (phase == FIRST_STEP and timeline.name in (TRAINING, SAVING, EXIT)):
            return timeline
        in_loop = timeline.name in (FIRST_STEP, TRAINING, SAVING, EXIT)
        step = timeline.step if phase == SAVING and in_loop else None
        total = timeline.total if phase in (SAVING, FIRST_STEP) and in_loop else None
        return Phase(phase, step, total, frame.no, frame.text.strip())
    return timeline


# What the failed program was, from the root traceback's frames: the phases above and the word
# "Training" fit a training run, not llamafactory-cli export or DeepSpeed's offline zero_to_fp32.py
_JOBS = (
    ("export", re.compile(r'llamafactory[/\\]train[/\\]tuner\.py", line \d+, in export_model\b')),
    ("checkpoint conversion", re.compile(r'zero_to_fp32\.py", line \d+, in <module>')),  # run as the program
)


def job_of(frames: list[LogLine]) -> str:
    """'training' unless a frame shows the program was an export or a ZeRO checkpoint conversion."""
    for job, pattern in _JOBS:
        if any(pattern.search(f.text) for f in frames):
            return job
    return "training"

