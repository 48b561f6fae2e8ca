"""Builders for the fault lab: a tiny tokenizer, model and datasets made locally (no hub).

Run inside the examined Python (the lab calls it as a script, so it imports the stack, not the
doctor):

    python bench/lab_build.py tokenizer DIR
    python bench/lab_build.py model DIR [--arch qwen2|llama] [--layers N] [--hidden N] [--dtype float32]
    python bench/lab_build.py dataset DIR --kind alpaca|sharegpt|pairwise|kto|pt|... [--name NAME] [--n N]

Everything is deterministic (fixed seeds, fixed synthetic text) so a fault reproduces the same log.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

WORDS = ("the a an of to in is was for on with as by at from that this it be are or not have has can will "
         "model data train step loss rank node gpu cpu memory batch token text answer question write list "
         "explain why how what when which where who number value small large first last next one two three "
         "four five six seven eight nine ten red blue green cat dog bird tree river city road house book "
         "code test run fast slow good bad new old hot cold day night time year world people water light").split()

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
            "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")


def _sentence(rng: random.Random, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def build_tokenizer(out: str, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [_sentence(rng) + " " + " ".join(str(rng.randint(0, 999)) for _ in range(3)) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(out)


def build_model(out: str, arch: str = "qwen2", layers: int = 2, hidden: int = 64, dtype: str = "float32",
                vocab: int | None = None, experts: int = 0) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        build_tokenizer(out)
    from transformers import AutoTokenizer
    n_vocab = vocab or len(AutoTokenizer.from_pretrained(out))
    common = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=n_vocab, max_position_embeddings=1024, rms_norm_eps=1e-6,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(tie_word_embeddings=True, **common)
    elif arch == "llama":
        cfg = transformers.LlamaConfig(tie_word_embeddings=False, **common)
    elif arch == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(tie_word_embeddings=True, num_experts=experts or 4, num_experts_per_tok=2,
                                          moe_intermediate_size=hidden, shared_expert_intermediate_size=hidden,
                                          **common)
    else:
        raise SystemExit(f"unknown arch {arch}")
    cfg.torch_dtype = dtype
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.save_pretrained(out)


def _alpaca(rng: random.Random, n: int) -> list[dict]:
    return [{"instruction": _sentence(rng), "input": "" if i % 3 else _sentence(rng, 2, 5), "output": _sentence(rng)}
            for i in range(n)]


def build_dataset(out: str, kind: str, name: str = "lab_data", n: int = 32, long: int = 0,
                  info_extra: str | None = None) -> None:
    """Write DIR/<name>.json and DIR/dataset_info.json (merging an existing one)."""
    rng = random.Random(1)
    os.makedirs(out, exist_ok=True)
    entry: dict = {"file_name": f"{name}.json"}
    if kind == "alpaca":
        rows = _alpaca(rng, n)
        if long:
            for r in rows:
                r["output"] = " ".join(_sentence(rng) for _ in range(long))
    elif kind == "sharegpt":
        rows = [{"conversations": [{"from": "human", "value": _sentence(rng)}, {"from": "gpt", "value": _sentence(rng)}]}
                for _ in range(n)]
        entry.update(formatting="sharegpt", columns={"messages": "conversations"})
    elif kind == "openai":
        rows = [{"messages": [{"role": "user", "content": _sentence(rng)}, {"role": "assistant", "content": _sentence(rng)}]}
                for _ in range(n)]
        entry.update(formatting="sharegpt", columns={"messages": "messages"},
                     tags={"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"})
    elif kind == "pairwise":
        rows = [{"instruction": _sentence(rng), "input": "",
                 "chosen": " ".join(_sentence(rng) for _ in range(max(long, 1))),
                 "rejected": " ".join(_sentence(rng) for _ in range(max(long, 1)))} for _ in range(n)]
        entry.update(ranking=True, columns={"prompt": "instruction", "query": "input", "chosen": "chosen",
                                            "rejected": "rejected"})
    elif kind == "kto":
        rows = [{"messages": [{"role": "user", "content": _sentence(rng)}, {"role": "assistant", "content": _sentence(rng)}],
                 "label": bool(i % 2)} for i in range(n)]
        entry.update(formatting="sharegpt", columns={"messages": "messages", "kto_tag": "label"},
                     tags={"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"})
    elif kind == "pt":
        rows = [{"text": " ".join(_sentence(rng) for _ in range(4))} for _ in range(n)]
        entry.update(columns={"prompt": "text"})
    else:
        raise SystemExit(f"unknown dataset kind {kind}")
    if info_extra:
        for k, v in json.loads(info_extra).items():
            if v is None:
                entry.pop(k, None)
            else:
                entry[k] = v
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    info_path = os.path.join(out, "dataset_info.json")
    info = json.load(open(info_path)) if os.path.exists(info_path) else {}
    info[name] = entry
    with open(info_path, "w") as f:
        json.dump(info, f, indent=2)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="lab_build")
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tokenizer")
    t.add_argument("dir")
    m = sub.add_parser("model")
    m.add_argument("dir")
    m.add_argument("--arch", default="qwen2")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--hidden", type=int, default=64)
    m.add_argument("--dtype", default="float32")
    m.add_argument("--vocab", type=int)
    m.add_argument("--experts", type=int, default=0)
    d = sub.add_parser("dataset")
    d.add_argument("dir")
    d.add_argument("--kind", default="alpaca")
    d.add_argument("--name", default="lab_data")
    d.add_argument("--n", type=int, default=32)
    d.add_argument("--long", type=int, default=0)
    d.add_argument("--info", help="JSON merged into the dataset_info.json entry")
    a = p.parse_args(argv)
    if a.what == "tokenizer":
        build_tokenizer(a.dir)
    elif a.what == "model":
        build_model(a.dir, a.arch, a.layers, a.hidden, a.dtype, a.vocab, a.experts)
    else:
        build_dataset(a.dir, a.kind, a.name, a.n, a.long, a.info)


if __name__ == "__main__":
    main(sys.argv[1:])
