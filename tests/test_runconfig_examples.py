"""Every YAML of LLaMA-Factory 0.9.5's examples (../shared/llamafactory-examples) through the run
checks, as a user would run them from a LLaMA-Factory checkout: the YAML copied under examples/,
the DeepSpeed JSONs beside it, data/ with the demo datasets it names (their dataset_info.json
entries and a few rows in their formats), and the hub model swapped for a local folder holding a
config.json of the same architecture (real dimensions; a GPTQ/AWQ/AQLM checkpoint keeps its
quantization_config). Everything else of the YAML is kept. `check --only config` never crashes
on them; the verdicts below were checked by hand against LLaMA-Factory's source and, for a few,
against LLaMA-Factory itself (tests/runconfig_oracle.py)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from mgft_doctor.launch import worker_script
from mgft_doctor.launch.script import run_script
from mgft_doctor.runconfig import codes, ds_rules, lf_rules, load_run_config

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "shared" / "llamafactory-examples"
YAMLS = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")) if EXAMPLES.is_dir() else []

QWEN3_4B = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=2560, intermediate_size=9728,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                tie_word_embeddings=True)
LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 tie_word_embeddings=False)
MODELS = {
    "Qwen/Qwen3-4B-Instruct-2507": QWEN3_4B,
    "meta-llama/Meta-Llama-3-8B-Instruct": LLAMA3_8B,
    "Qwen/Qwen3-VL-4B-Instruct": dict(model_type="qwen3_vl", architectures=["Qwen3VLForConditionalGeneration"],
                                      text_config=dict(QWEN3_4B, model_type="qwen3_vl_text"),
                                      vision_config={"depth": 24, "hidden_size": 1024, "model_type": "qwen3_vl"}),
    "ISTA-DASLab/Meta-Llama-3-8B-Instruct-AQLM-2Bit-1x16": dict(
        LLAMA3_8B, quantization_config={"quant_method": "aqlm", "nbits_per_codebook": 16, "num_codebooks": 1}),
    "TechxGenus/Meta-Llama-3-8B-Instruct-AWQ": dict(LLAMA3_8B, quantization_config={"quant_method": "awq", "bits": 4,
                                                                                    "group_size": 128}),
    "TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ": dict(LLAMA3_8B, quantization_config={"quant_method": "gptq", "bits": 4,
                                                                                     "group_size": 128}),
}
ROLES = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
ALPACA = [{"instruction": "hi", "input": "", "output": "hello"}, {"instruction": "who are you", "input": "", "output": "me"}]
DATA = {  # LLaMA-Factory's data/dataset_info.json entries for the demo datasets the examples name
    "identity": ({"file_name": "identity.json"}, ALPACA),
    "alpaca_en_demo": ({"file_name": "alpaca_en_demo.json"}, ALPACA),
    "dpo_en_demo": ({"file_name": "dpo_en_demo.json", "formatting": "sharegpt", "ranking": True,
                     "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
                    [{"conversations": [{"from": "human", "value": "hi"}], "chosen": {"from": "gpt", "value": "hello"},
                      "rejected": {"from": "gpt", "value": "go"}}]),
    "kto_en_demo": ({"file_name": "kto_en_demo.json", "formatting": "sharegpt",
                     "columns": {"messages": "messages", "kto_tag": "label"}, "tags": ROLES},
                    [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                      "label": True}]),
    "c4_demo": ({"file_name": "c4_demo.jsonl", "columns": {"prompt": "text"}}, None),
    "mllm_demo": ({"file_name": "mllm_demo.json", "formatting": "sharegpt",
                   "columns": {"messages": "messages", "images": "images"}, "tags": ROLES},
                  [{"messages": [{"role": "user", "content": "<image>what is it"}, {"role": "assistant", "content": "a cat"}],
                    "images": ["mllm_demo_data/1.jpg"]}]),
    "rlhf_v": ({"hf_hub_url": "llamafactory/RLHF-V", "formatting": "sharegpt", "ranking": True,
                "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "images": "images"}},
               None),
}
FAIL = "fail"
# verdicts checked by hand (the source each mirrors is in the finding): example -> failing codes
VERDICTS = {
    "extras/galore/llama3_full_sft.yaml": [codes.LF_EXTRA_MISSING],  # galore_torch is not installed here
    "extras/badam/llama3_full_sft.yaml": [codes.LF_EXTRA_MISSING],  # badam>=1.2.1 is not installed here
    "train_qlora/qwen3_lora_sft_otfq.yaml": [codes.LF_QUANT_BACKEND],  # no bitsandbytes here
    "extras/fsdp_qlora/llama3_lora_sft.yaml": [codes.LF_QUANT_BACKEND],
    "train_qlora/llama3_lora_sft_gptq.yaml": [codes.LF_QUANT_BACKEND],  # gptqmodel>=2.0.0 is not installed here
    "train_qlora/llama3_lora_sft_awq.yaml": [codes.LF_QUANT_BACKEND],  # autoawq
    "train_lora/qwen3_lora_sft_ds3.yaml": [],  # LLaMA-Factory's own ZeRO-3 JSON with its YAML: consistent
    "train_full/qwen3_full_sft.yaml": [],
    "train_lora/qwen3_lora_dpo.yaml": [],  # a ranking dataset for stage dpo
    "train_lora/qwen3_lora_kto.yaml": [],
    "train_lora/qwen3_lora_pretrain.yaml": [],  # no template: LLaMA-Factory takes the tokenizer's
    "train_lora/qwen3_lora_sft_ray.yaml": [],  # dataset_dir REMOTE: read where the run starts
    "train_lora/qwen3vl_lora_sft.yaml": [],
}


def build_checkout(root: Path) -> Path:
    """A LLaMA-Factory checkout as the examples expect it, with local models in models/."""
    shutil.copytree(EXAMPLES / "deepspeed", root / "examples" / "deepspeed")
    (root / "data").mkdir()
    for name, (entry, rows) in DATA.items():
        if "file_name" in entry:
            path = root / "data" / entry["file_name"]
            path.write_text("\n".join(json.dumps({"text": "the a of"}) for _ in range(3)) if rows is None
                            else json.dumps(rows))
    (root / "data" / "dataset_info.json").write_text(json.dumps({n: e for n, (e, _) in DATA.items()}, indent=1))
    for rel in YAMLS:
        text = (EXAMPLES / rel).read_text()
        hub = re.search(r"^model_name_or_path:\s*(\S+)", text, re.M).group(1)
        folder = root / "models" / hub.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(MODELS[hub]))
        dst = root / "examples" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(re.sub(r"^(model_name_or_path:\s*)\S+", lambda m: m.group(1) + str(folder), text, count=1,
                              flags=re.M))
    return root


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    if not YAMLS:
        pytest.skip(f"no examples at {EXAMPLES}")
    return build_checkout(tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="module")
def env(checkout):
    from mgft_doctor.probes.config_llamafactory import PACKAGES

    d = run_script(sys.executable, worker_script("lf_env"), {"packages": PACKAGES, "imports": []}, 60).payload
    return lf_rules.Env(versions=d["versions"], fields=d["fields"], templates=frozenset(d["templates"]),
                        bnb_min=d["bnb_min"], integrations=d["integrations"], cwd=str(checkout))


def test_every_example_is_here():
    assert len(YAMLS) >= 20, YAMLS
    assert set(VERDICTS) <= set(YAMLS)


@pytest.mark.parametrize("rel", YAMLS)
def test_the_rules_on_each_example(checkout, env, rel, monkeypatch):
    monkeypatch.chdir(checkout)  # where llamafactory-cli starts in a checkout
    rc = load_run_config(str(checkout / "examples" / rel))
    named = re.search(r"^deepspeed:", (EXAMPLES / rel).read_text(), re.M) is not None
    assert rc.ds_error is None and (rc.ds is not None) == named
    problems = lf_rules.check(rc, env, model_cfg=rc.model_config[0]) + ds_rules.check(rc, 2, None)
    failing = [p.code for p in problems if p.severity == FAIL]
    warned = {p.code for p in problems if p.severity != FAIL}
    assert warned <= {codes.NCCL_WATCHDOG_TIMEOUT}, [(p.code, p.message) for p in problems]  # ddp_timeout: 180000000
    if rel in VERDICTS:
        assert failing == VERDICTS[rel], [(p.code, p.message) for p in problems]


@pytest.mark.slow
@pytest.mark.parametrize("rel", YAMLS)
def test_check_only_config_on_each_example(checkout, rel, run_check, monkeypatch):
    monkeypatch.chdir(checkout)
    code, probes, err = run_check("check", f"examples/{rel}", "--only", "config")
    assert code in (0, 1), err[-2000:]
    assert not [p for p in probes.values() if p["status"] == "error"], probes
    lf = probes["config.llamafactory"]
    if rel in VERDICTS:
        assert [f["code"] for f in lf["findings"] if f["severity"] == FAIL] == VERDICTS[rel], lf
        assert (code == 1) == bool(VERDICTS[rel])


@pytest.mark.slow
def test_llamafactory_itself_refuses_the_examples_we_fail(checkout):
    """Three failing verdicts through LLaMA-Factory (the YAML as it is but the model, a tiny LLaMA
    of the oracle's, and use_cpu on this CPU machine for bf16: true)."""
    from runconfig_oracle import ask

    tiny = checkout / "tiny"
    gptq = checkout / "tiny-gptq"
    cases = {"build": {"mode": "build", "out": str(tiny)}}
    expect = {"extras/galore/llama3_full_sft.yaml": ("args", tiny, "The 'galore_torch' distribution was not found"),
              "extras/badam/llama3_full_sft.yaml": ("args", tiny, "The 'badam>=1.2.1' distribution was not found"),
              "train_qlora/qwen3_lora_sft_otfq.yaml": ("run", tiny, "The 'bitsandbytes>=0.39.0' distribution was not found"),
              "train_qlora/llama3_lora_sft_gptq.yaml": ("run", gptq, "The 'gptqmodel>=2.0.0' distribution was not found")}
    for rel, (mode, model, _) in expect.items():
        text = re.sub(r"^(model_name_or_path:\s*)\S+", lambda m: m.group(1) + str(model),
                      (checkout / "examples" / rel).read_text(), count=1, flags=re.M)
        path = checkout / (rel.replace("/", "__") + ".tiny.yaml")
        path.write_text(text + "use_cpu: true\n")
        cases[rel] = {"mode": mode, "yaml": str(path), "cwd": str(checkout), "after": "build"}
    cases["copy"] = {"mode": "copy_model", "src": str(tiny), "out": str(gptq),
                     "config": {"quantization_config": MODELS["TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ"]["quantization_config"]}}
    order = ["build", "copy"] + list(expect)
    got = ask({k: cases[k] for k in order}, checkout)
    for rel, (_, _, said) in expect.items():
        assert not got[rel]["ok"] and said in got[rel]["msg"], (rel, got[rel])
