"""Memory per GPU and per host for a fine-tune, from the model's config.json alone: parameter
count by architecture, model states per ZeRO stage and offload (DeepSpeed's accounting:
16 bytes per trained parameter with Adam in mixed precision), LoRA-aware, plus activations
and logits (which DeepSpeed's estimators leave out) and a CUDA overhead. Pure arithmetic: no
torch, no weights."""

from __future__ import annotations

from dataclasses import dataclass

from ..text import GiB
CUDA_OVERHEAD = 1.5 * GiB  # context, NCCL buffers, allocator slack
HOST_BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for host-side offload buffers


@dataclass
class ModelShape:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    experts: int = 0  # routed experts per MoE layer (0: dense)
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # shared experts' total intermediate size
    moe_layers: int = 0

    @property
    def attention_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return q + kv + self.heads * self.head_dim * self.hidden

    def mlp_params(self, moe: bool) -> int:
        if not moe:
            return 3 * self.hidden * self.intermediate
        routed = self.experts * 3 * self.hidden * self.expert_intermediate
        return routed + 3 * self.hidden * self.shared_intermediate + self.hidden * self.experts

    @property
    def total_params(self) -> int:
        dense_layers = self.layers - self.moe_layers
        per_dense = self.attention_params + self.mlp_params(False) + 2 * self.hidden
        per_moe = self.attention_params + self.mlp_params(True) + 2 * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return dense_layers * per_dense + self.moe_layers * per_moe + embed + self.hidden

    @property
    def largest_layer_params(self) -> int:
        per = self.attention_params + self.mlp_params(self.moe_layers > 0) + 2 * self.hidden
        return max(per, self.vocab * self.hidden)

    def linear_shapes(self, moe: bool) -> list[tuple[int, int]]:
        """(in, out) of the linear layers of one decoder layer, for LoRA's parameter count."""
        h, hd = self.hidden, self.head_dim
        attn = [(h, self.heads * hd), (h, self.kv_heads * hd), (h, self.kv_heads * hd), (self.heads * hd, h)]
        if not moe:
            return attn + [(h, self.intermediate)] * 2 + [(self.intermediate, h)]
        experts = ([(h, self.expert_intermediate)] * 2 + [(self.expert_intermediate, h)]) * self.experts
        return attn + experts


def shape_from_config(cfg: dict) -> ModelShape:
    """Read the shape off a transformers config.json (nested text_config for multimodal models)."""
    c = cfg.get("text_config") or cfg.get("llm_config") or cfg
    hidden = int(c.get("hidden_size") or c.get("n_embd") or c.get("d_model"))
    layers = int(c.get("num_hidden_layers") or c.get("n_layer") or c.get("num_layers"))
    heads = int(c.get("num_attention_heads") or c.get("n_head"))
    kv = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    inter = int(c.get("intermediate_size") or c.get("ffn_dim") or 4 * hidden)
    vocab = int(c.get("vocab_size") or cfg.get("vocab_size") or 32000)
    tied = bool(c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)))
    experts = int(c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0)
    shape = ModelShape(hidden, layers, inter, heads, kv, head_dim, vocab, tied)
    if experts > 1:
        shape.experts = experts
        shape.expert_intermediate = int(c.get("moe_intermediate_size") or inter)
        shared = int(c.get("shared_expert_intermediate_size") or 0)
        if not shared and c.get("n_shared_experts"):
            shared = int(c["n_shared_experts"]) * shape.expert_intermediate
        shape.shared_intermediate = shared
        first_dense = int(c.get("first_k_dense_replace") or 0)
        step = int(c.get("decoder_sparse_step") or 1)
        shape.moe_layers = len([i for i in range(first_dense, layers) if (i + 1) % step == 0])
    return shape


@dataclass
class Plan:
    stage: int
    offload: str  # 'none', 'optimizer', 'optimizer+params'
    gpu_bytes: float
    host_bytes: float


def model_states(shape: ModelShape, stage: int, offload: str, gpus: int, gpus_per_node: int,
                 lora_rank: int | None = None) -> tuple[float, float]:
    """(GPU bytes, host bytes) of parameters, gradients and Adam states per GPU / per node."""
    total = shape.total_params
    if lora_rank:
        per_layer = sum(i + o for i, o in shape.linear_shapes(shape.moe_layers > 0)) * lora_rank
        trainable = per_layer * shape.layers
        frozen = total
        shard = gpus if stage == 3 else 1
        gpu = 2 * frozen / shard + 16 * trainable / (gpus if stage >= 1 else 1)
        host = 0.0
        if offload != "none":
            gpu = 2 * frozen / shard + 4 * trainable
            host = 12 * trainable * gpus_per_node
            if offload == "optimizer+params" and stage == 3:
                gpu = 4 * shape.largest_layer_params
                host += 2 * frozen * HOST_BUFFER_FACTOR
        return gpu, host
    largest = 4 * shape.largest_layer_params
    if stage == 0:
        return 16 * total, 0.0
    if stage == 1:
        return 4 * total + 12 * total / gpus, 0.0
    if stage == 2:
        if offload != "none":
            return 2 * total, total * max(4 * gpus, 16) * HOST_BUFFER_FACTOR
        return 2 * total + 14 * total / gpus, 0.0
    if offload == "optimizer+params":
        return largest, total * max(4 * gpus, 18) * HOST_BUFFER_FACTOR
    if offload == "optimizer":
        return largest + 2 * total / gpus, total * max(4 * gpus_per_node, 16) * HOST_BUFFER_FACTOR
    return largest + 18 * total / gpus, 0.0


def activations(shape: ModelShape, micro_batch: int, seq: int, checkpointing: bool, flash: bool) -> float:
    """Bytes of activations and logits per GPU for one micro-batch (bf16; Korthikanti et al.'s
    per-layer count s·b·h·(34 + 5·a·s/h), the attention-matrix term gone with flash/SDPA)."""
    b, s, h, a = micro_batch, seq, shape.hidden, shape.heads
    per_layer = s * b * h * (34 + (0 if flash else 5 * a * s / h))
    if checkpointing:
        acts = shape.layers * 2 * s * b * h + per_layer
    else:
        acts = shape.layers * per_layer
    logits = 10 * b * s * shape.vocab  # bf16 logits, fp32 upcast for the loss, and its gradient
    return acts + logits


def plans(shape: ModelShape, gpus: int, gpus_per_node: int, micro_batch: int, seq: int,
          lora_rank: int | None, checkpointing: bool = True, flash: bool = True) -> list[Plan]:
    act = activations(shape, micro_batch, seq, checkpointing, flash) + CUDA_OVERHEAD
    out = []
    for stage, offload in ((0, "none"), (2, "none"), (2, "optimizer"), (3, "none"), (3, "optimizer"),
                           (3, "optimizer+params")):
        gpu, host = model_states(shape, stage, offload, gpus, gpus_per_node, lora_rank)
        out.append(Plan(stage, offload, gpu + act, host))
    return out
