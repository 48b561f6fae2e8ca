"""Mixture-of-experts helpers: whether a config routes tokens to experts, which MoE blocks
LLaMA-Factory and DeepSpeed make ZeRO-3 leaf modules, and, on a built model, its MoE blocks and
a forward hook that forces the ranks' routing apart. The config helpers are plain Python on
dicts (the doctor side imports is_moe, the one exception of the import rule); the model helpers
import torch only when called."""

from __future__ import annotations

import importlib

# _shrink is a sibling: a top-level module when a worker script runs (the script put its folder on
# sys.path), mgft_doctor.probes.workers._shrink when the doctor side or the tests import this one
_shrink = importlib.import_module(f"{__package__}._shrink" if __package__ else "_shrink")
EXPERT_KEYS, SUB_CONFIGS, int_value = _shrink.EXPERT_KEYS, _shrink.SUB_CONFIGS, _shrink.int_value

# model_type -> (module of the class, class name), as LLaMA-Factory 0.9.5 sets them
# (llamafactory/model/model_utils/moe.py: add_z3_leaf_module). A class given by name only lives in
# the model's remote code.
LLAMAFACTORY_LEAF = {
    "dbrx": ("transformers.models.dbrx.modeling_dbrx", "DbrxFFN"),
    "deepseek_v2": (None, "DeepseekV2MoE"),
    "deepseek_v3": (None, "DeepseekV3MoE"),
    "kimi_vl": (None, "DeepseekV3MoE"),
    "hy_v3": (None, "HYV3MoE"),
    "ernie4_5_moe": ("transformers.models.ernie4_5_moe.modeling_ernie4_5_moe", "Ernie4_5_MoeSparseMoeBlock"),
    "granitemoe": ("transformers.models.granitemoe.modeling_granitemoe", "GraniteMoeMoE"),
    "glm4_moe": ("transformers.models.glm4_moe.modeling_glm4_moe", "Glm4MoeMoE"),
    "glm4_moe_lite": ("transformers.models.glm4_moe_lite.modeling_glm4_moe_lite", "Glm4MoeLiteMoE"),
    "glm4v_moe": ("transformers.models.glm4v_moe.modeling_glm4v_moe", "Glm4vMoeTextMoE"),
    "gpt_oss": ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssMLP"),
    "jamba": ("transformers.models.jamba.modeling_jamba", "JambaSparseMoeBlock"),
    "jetmoe": ("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoA,JetMoeMoE"),
    "llama4": ("transformers.models.llama4.modeling_llama4", "Llama4TextMoe"),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock"),
    "olmoe": ("transformers.models.olmoe.modeling_olmoe", "OlmoeSparseMoeBlock"),
    "phimoe": ("transformers.models.phimoe.modeling_phimoe", "PhimoeSparseMoeBlock"),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock"),
    "qwen3_vl_moe": ("transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe", "Qwen3VLMoeTextSparseMoeBlock"),
    "qwen3_omni_moe": (None, "Qwen3OmniMoeThinkerTextSparseMoeBlock"),
    "qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextSparseMoeBlock"),
    "qwen3_5_moe": ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock"),
}
# DeepSpeed >= 0.18 flags these by default (zero_optimization.leaf_module.classes)
DEEPSPEED_DEFAULT_LEAF = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock")
FORCED_LOGIT = 30.0  # added to the chosen experts' router logits: they win whatever the model says


# --- on the config ------------------------------------------------------------------------------

def num_experts(cfg: dict) -> int:
    """Experts per MoE layer in a config (or its sub-configs), 0 for a dense model."""
    for sub in [cfg, *(cfg.get(k) for k in SUB_CONFIGS)]:
        if isinstance(sub, dict):
            for k in EXPERT_KEYS:
                if (int_value(sub.get(k)) or 0) > 1:
                    return sub[k]
    return 0


def is_moe(cfg: dict) -> bool:
    """Whether a config (or its text sub-config) routes tokens to experts."""
    return num_experts(cfg) > 0


def llamafactory_leaf_classes(model_type: str | None, text_model_type: str | None = None) -> list[str]:
    """Class names LLaMA-Factory 0.9.5 marks as ZeRO-3 leaves for this model type."""
    names: list[str] = []
    for mt in (model_type, text_model_type):
        if mt in LLAMAFACTORY_LEAF:
            names += LLAMAFACTORY_LEAF[mt][1].split(",")
    if text_model_type == "qwen3_moe" and "Qwen3MoeSparseMoeBlock" not in names:
        names.append("Qwen3MoeSparseMoeBlock")
    return list(dict.fromkeys(names))


# --- on a built model ---------------------------------------------------------------------------

def moe_blocks(model):
    """(name, module) of the MoE blocks: modules with an `experts` child."""
    import torch

    found = []
    for name, mod in model.named_modules():
        experts = getattr(mod, "experts", None)
        if isinstance(experts, torch.nn.Module) and mod is not experts:
            found.append((name, mod))
    return found


def fused_experts(block) -> bool:
    """Experts stored as stacked tensors of one module (transformers >= 5) rather than a list of
    modules: every expert's weights are gathered together whichever experts the tokens pick."""
    import torch

    experts = block.experts
    return not isinstance(experts, torch.nn.ModuleList) and any(True for _ in experts.parameters(recurse=False))


def force_routing(blocks, n_experts, rank, torch, used):
    """Make the ranks' routers disagree: rank 0 sends every token to experts 0..k-1, the other
    ranks spread their tokens over all experts. Works on a router that returns logits (a Linear
    gate) and on one that returns (logits, weights, indices) or (indices, weights, aux).
    The experts chosen are added to `used`; returns the hooks' handles."""
    hook = ForcedRouting(n_experts, rank, torch, used)
    handles = []
    for _, block in blocks:
        gate = getattr(block, "gate", None) or getattr(block, "router", None)
        if isinstance(gate, torch.nn.Module) and n_experts:
            handles.append(gate.register_forward_hook(hook))
    return handles


class ForcedRouting:
    """The forward hook of a router (force_routing)."""

    def __init__(self, n_experts: int, rank: int, torch, used: set):
        self.n_experts, self.rank, self.torch, self.used = n_experts, rank, torch, used

    def choose(self, tokens: int, k: int, device):
        """The experts of each token: 0..k-1 on rank 0, all experts in turn elsewhere."""
        torch = self.torch
        if self.rank == 0:
            idx = torch.arange(k, device=device).expand(tokens, k)
        else:
            t = torch.arange(tokens, device=device).unsqueeze(1)
            idx = (t * k + torch.arange(k, device=device)) % self.n_experts
        self.used.update(int(e) for e in idx.unique())
        return idx

    def __call__(self, mod, inputs, output):
        torch = self.torch
        if torch.is_tensor(output) and output.is_floating_point() and output.shape[-1] == self.n_experts:
            return self._biased_logits(output)
        if isinstance(output, tuple):
            return self._replaced_choice(list(output))
        return None

    def _biased_logits(self, output):
        """A router that returns logits: the chosen experts' logits raised far above the others."""
        logits = output.reshape(-1, self.n_experts)
        k = min(2, self.n_experts)
        idx = self.choose(logits.shape[0], k, logits.device)
        bias = self.torch.zeros_like(logits).scatter_(1, idx, FORCED_LOGIT)
        return (logits + bias).reshape(output.shape)

    def _replaced_choice(self, items: list):
        """A router that returns its choice: the indices replaced, the weights renormalised over
        them (or uniform when it returns no logits)."""
        torch = self.torch
        ints = [i for i, x in enumerate(items) if torch.is_tensor(x) and not x.is_floating_point() and x.dim() == 2]
        if not ints:
            return None
        ii = ints[0]
        tokens, k = items[ii].shape
        idx = self.choose(tokens, k, items[ii].device).to(items[ii].dtype)
        logits = next((x for x in items if torch.is_tensor(x) and x.is_floating_point()
                       and x.dim() == 2 and x.shape[-1] == self.n_experts), None)
        for j, x in enumerate(items):
            if j != ii and torch.is_tensor(x) and x.is_floating_point() and x.shape == items[ii].shape:
                if logits is not None:
                    probs = torch.softmax(logits.float(), dim=-1).gather(1, idx.long())
                    items[j] = (probs / probs.sum(-1, keepdim=True)).to(x.dtype)
                else:
                    items[j] = torch.full_like(x, 1.0 / k)
        items[ii] = idx
        return tuple(items)
