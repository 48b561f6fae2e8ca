"""The rehearsal's dataset: for each dataset the YAML names, the first few samples of the user's
own file when dataset_info.json points at a local one, else a few synthetic samples in the
format the entry declares (alpaca or sharegpt/openai, its column names and tags, ranking and
KTO columns) — or, without an entry, the format the stage needs. Written into the rehearsal's
own folder with a dataset_info.json of its own: the user's dataset folder is only read.

Plain Python (json, csv; pyarrow only for parquet/arrow files): the rehearse worker uses it, the
tests call it directly."""

from __future__ import annotations

import copy
import csv
import json
import os
import random

SAMPLES = 16
READ_CHUNK = 1 << 16
EXTENSIONS = ("json", "jsonl", "csv", "parquet", "arrow", "txt")  # LLaMA-Factory's FILEEXT2TYPE
MEDIA_COLUMNS = ("images", "videos", "audios")
WORDS = ("the a of to in is model data train step loss rank node batch token text answer question why how "
         "small tiny check run copy shard save load").split()
# what each stage reads when the dataset has no entry here (LLaMA-Factory's demo datasets' formats)
STAGE_DEFAULTS = {
    "pt": {"columns": {"prompt": "text"}},
    "sft": {},
    "rm": {"ranking": True, "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                        "rejected": "rejected"}},
    "dpo": {"ranking": True, "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                         "rejected": "rejected"}},
    "kto": {"formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "system_tag": "system"}


def dataset_names(value) -> list[str]:
    """The YAML's `dataset:` as LLaMA-Factory splits it (a comma-separated string or a list)."""
    if value is None:
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def read_dataset_info(dataset_dir: str | None) -> tuple[dict | None, str]:
    """(dataset_info.json of the user's dataset_dir, or None, and why not)."""
    if not dataset_dir:
        return None, "no local dataset_dir"
    path = os.path.join(dataset_dir, "dataset_info.json")
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as exc:
        return None, f"cannot read {path} ({type(exc).__name__})"
    return (info, path) if isinstance(info, dict) else (None, f"{path} is not a JSON object")


def local_source(entry: dict, dataset_dir: str | None) -> str | None:
    """The user's local file or folder this entry loads, or None (hub, script, cloud, or missing)."""
    if not dataset_dir or not isinstance(entry.get("file_name"), str):
        return None
    if any(k in entry for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")):
        return None
    path = os.path.join(dataset_dir, entry["file_name"])
    return path if os.path.exists(path) else None


def _first_file(path: str) -> str | None:
    if os.path.isfile(path):
        return path
    files = sorted(f for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
    return os.path.join(path, files[0]) if files else None


def head_rows(path: str, n: int = SAMPLES) -> list:
    """The first n samples of a data file, read without loading the rest of it."""
    ext = os.path.splitext(path)[1][1:].lower()
    if ext == "jsonl":
        return _head_jsonl(path, n)
    if ext == "json":
        return _head_json(path, n)
    if ext == "csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            return [row for _, row in zip(range(n), reader)]
    if ext == "txt":
        with open(path, encoding="utf-8") as f:
            return [{"text": line.rstrip("\n")} for _, line in zip(range(n), f)]
    if ext in ("parquet", "arrow"):
        return _head_arrow(path, ext, n)
    raise ValueError(f"{path}: not a file type LLaMA-Factory reads ({', '.join(EXTENSIONS)})")


def _head_jsonl(path: str, n: int) -> list:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
                if len(rows) >= n:
                    break
    return rows


def _head_json(path: str, n: int) -> list:
    """The first n objects of a JSON list (or JSON lines in a .json file), decoded as they stream in."""
    decoder = json.JSONDecoder()
    rows, buf, started = [], "", False
    with open(path, encoding="utf-8") as f:
        while len(rows) < n:
            chunk = f.read(READ_CHUNK)
            buf += chunk
            buf, started = _take_objects(decoder, buf, started, rows, n)
            if not chunk:
                break
    return rows


def _take_objects(decoder, buf: str, started: bool, rows: list, n: int) -> tuple[str, bool]:
    """Move the complete objects at the front of buf into rows; the rest of buf stays."""
    while len(rows) < n:
        s = buf.lstrip()
        if not started and s.startswith("["):
            s, started = s[1:], True
        s = s.lstrip().lstrip(",").lstrip()
        if not s or s.startswith("]"):
            return s, started
        try:
            obj, end = decoder.raw_decode(s)
        except json.JSONDecodeError:
            return s, started  # incomplete: wait for more text
        rows.append(obj)
        buf = s[end:]
    return buf, started


def _head_arrow(path: str, ext: str, n: int) -> list:
    import pyarrow as pa

    if ext == "parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return batch.to_pylist() if batch is not None else []
    with pa.memory_map(path) as source:
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(source).read_all()
    return table.slice(0, n).to_pylist()


def write_rows(rows: list, path: str) -> None:
    """rows into path in the format its extension names (json for anything else)."""
    ext = os.path.splitext(path)[1][1:].lower()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if ext in ("parquet", "arrow"):
        import pyarrow as pa

        table = pa.Table.from_pylist(rows)
        if ext == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path)
        else:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
        return
    with open(path, "w", encoding="utf-8", newline="") as f:
        if ext == "jsonl":
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        elif ext == "csv":
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
            writer.writeheader()
            writer.writerows(rows)
        elif ext == "txt":
            f.writelines(str(r.get("text", "")) + "\n" for r in rows)
        else:
            json.dump(rows, f, ensure_ascii=False)


# ---- synthetic samples in a declared format ------------------------------------------------------

def _say(rng: random.Random, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _tags(entry: dict) -> dict:
    """The sharegpt tags as LLaMA-Factory reads them: all from `tags` when the entry has it
    (a tag it leaves out is None), else the defaults (parser.py DatasetAttr.join)."""
    if "tags" in entry:
        return {k: (entry.get("tags") or {}).get(k) for k in SHAREGPT_TAGS}
    return dict(SHAREGPT_TAGS)


def _columns(entry: dict) -> dict:
    """The column names as LLaMA-Factory reads them: only those of `columns` when the entry has
    it (the others are None), else the defaults of the entry's formatting."""
    if "columns" in entry:
        return {k: v for k, v in (entry.get("columns") or {}).items() if v}
    if entry.get("formatting") in ("sharegpt", "openai"):
        return {"messages": "conversations"}
    return {"prompt": "instruction", "query": "input", "response": "output"}


def synthetic_rows(entry: dict, n: int = SAMPLES, seed: int = 0) -> list[dict]:
    """n samples that LLaMA-Factory's converter for this entry reads as the user's data would be read."""
    rng = random.Random(seed)
    if entry.get("formatting") in ("sharegpt", "openai"):
        return [_sharegpt_row(entry, rng, i) for i in range(n)]
    return [_alpaca_row(entry, rng, i) for i in range(n)]


def _alpaca_row(entry: dict, rng: random.Random, i: int) -> dict:
    c = _columns(entry)
    row = {}
    for key in ("prompt", "query"):
        if c.get(key):
            row[c[key]] = _say(rng) if key == "prompt" else ""
    if entry.get("ranking"):
        row[c.get("chosen") or "chosen"] = _say(rng)
        row[c.get("rejected") or "rejected"] = _say(rng)
    elif c.get("response"):
        row[c["response"]] = _say(rng)
    if c.get("kto_tag"):
        row[c["kto_tag"]] = i % 2 == 0
    if c.get("history"):
        row[c["history"]] = [[_say(rng), _say(rng)]] if i % 2 else []
    if c.get("system"):
        row[c["system"]] = "You are a helpful assistant."
    if c.get("tools"):
        row[c["tools"]] = ""
    return row


def _sharegpt_row(entry: dict, rng: random.Random, i: int) -> dict:
    c, t = _columns(entry), _tags(entry)

    def turn(role_key: str) -> dict:
        return {t["role_tag"]: t[role_key], t["content_tag"]: _say(rng)}

    row = {}
    messages = c.get("messages") or "conversations"
    if entry.get("ranking"):
        row[messages] = [turn("user_tag")]
        row[c.get("chosen") or "chosen"] = turn("assistant_tag")
        row[c.get("rejected") or "rejected"] = turn("assistant_tag")
    else:
        row[messages] = [turn("user_tag"), turn("assistant_tag")]
    if c.get("kto_tag"):
        row[c["kto_tag"]] = i % 2 == 0
    if c.get("system"):
        row[c["system"]] = "You are a helpful assistant."
    if c.get("tools"):
        row[c["tools"]] = ""
    return row


# ---- the rehearsal's datasets ---------------------------------------------------------------------

def text_only(entry: dict) -> tuple[dict, list[str]]:
    """The entry without image/video/audio columns (synthetic samples carry no media)."""
    entry = copy.deepcopy(entry)
    cols = entry.get("columns") or {}
    dropped = [k for k in MEDIA_COLUMNS if k in cols]
    for k in dropped:
        cols.pop(k)
    return entry, dropped


def plan_dataset(name: str, info: dict | None, dataset_dir: str | None, stage: str) -> dict:
    """How the rehearsal gets dataset `name`: {'name', 'entry', 'source' (a local file or None), 'why'}."""
    if info is not None and name in info and isinstance(info[name], dict):
        entry = copy.deepcopy(info[name])
        src = local_source(entry, dataset_dir)
        if src is not None:
            return {"name": name, "entry": entry, "source": src, "why": "the first samples of your file"}
        where = ("on the hub" if any(k in entry for k in ("hf_hub_url", "ms_hub_url", "om_hub_url"))
                 else "not found" if entry.get("file_name") else "not a local file")
        entry, dropped = text_only(entry)
        why = f"synthetic samples in its declared format ({where}: {entry.get('file_name') or entry.get('hf_hub_url') or name})"
        if dropped:
            why += f"; media columns left out: {', '.join(dropped)}"
        return {"name": name, "entry": entry, "source": None, "why": why}
    entry = copy.deepcopy(STAGE_DEFAULTS.get(stage, {}))
    return {"name": name, "entry": entry, "source": None,
            "why": f"synthetic samples in the {_format_name(entry)} format stage {stage} reads "
                   "(no dataset_info.json entry here)"}


def _format_name(entry: dict) -> str:
    fmt = entry.get("formatting", "alpaca")
    extra = " ranking" if entry.get("ranking") else " with kto_tag" if (entry.get("columns") or {}).get("kto_tag") else ""
    return fmt + extra


def build_datasets(names: list[str], user_dir: str | None, stage: str, out_dir: str,
                   n: int = SAMPLES) -> tuple[dict, list[str]]:
    """Write the rehearsal's samples and dataset_info.json into out_dir; (its dataset_info, notes)."""
    info, _ = read_dataset_info(user_dir)
    mini_info, notes = {}, []
    for name in names:
        plan = plan_dataset(name, info, user_dir, stage)
        entry = plan["entry"]
        if plan["source"]:
            rows, file_name = _copy_head(plan["source"], name, n, out_dir)
            entry["file_name"] = file_name
            notes.append(f"dataset {name}: the first {len(rows)} samples of {plan['source']}")
        else:
            ext = _synthetic_ext(entry)
            file_name = f"{_safe(name)}.{ext}"
            write_rows(synthetic_rows(entry, n), os.path.join(out_dir, file_name))
            for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name", "subset", "folder"):
                entry.pop(k, None)
            entry["file_name"] = file_name
            notes.append(f"dataset {name}: {plan['why']}")
        entry.pop("num_samples", None)
        mini_info[name] = entry
    with open(os.path.join(out_dir, "dataset_info.json"), "w", encoding="utf-8") as f:
        json.dump(mini_info, f, indent=1)
    return mini_info, notes


def _copy_head(source: str, name: str, n: int, out_dir: str) -> tuple[list, str]:
    """The first n rows of the user's file (the first file of a folder) into a file of the same
    kind in out_dir; (the rows, the file_name for dataset_info.json)."""
    first = _first_file(source)
    if first is None:
        raise ValueError(f"dataset {name}: the folder {source} holds no file")
    rows = head_rows(first, n)
    ext = os.path.splitext(first)[1][1:].lower() or "json"
    base = f"{_safe(name)}.{ext}"
    file_name = os.path.join(_safe(name), base) if os.path.isdir(source) else base
    write_rows(rows, os.path.join(out_dir, file_name))
    return rows, file_name


def _synthetic_ext(entry: dict) -> str:
    name = entry.get("file_name") or ""
    ext = os.path.splitext(name)[1][1:].lower()
    return ext if ext in ("json", "jsonl") else "json"


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "dataset"
