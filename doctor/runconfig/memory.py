"""Memory per GPU and per host for a fine-tune, from the model's config.json alone: parameter
count by architecture, model states per ZeRO stage and offload (DeepSpeed's accounting:
16 bytes per trained parameter with Adam in mixed precision), LoRA-aware, with the frozen base
weights in 16 bits or quantized (QLoRA: bitsandbytes 4/8-bit, HQQ, EETQ, a GPTQ/AWQ checkpoint),
plus activations and logits (which DeepSpeed's estimators leave out) and a CUDA overhead. Pure
arithmetic: no torch, no weights."""

from __future__ import annotations

from dataclasses import dataclass

from ..text import GiB
CUDA_OVERHEAD = 1.5 * GiB  # context, NCCL buffers, allocator slack
# bytes a parameter of the largest layer that stay on the GPU under ZeRO-3 with offload: DeepSpeed's
# estimator says 4; one H200 measured 8 in all three offloaded ZeRO-3 rows of docs/memory.md
# (full with optimizer offload, full and LoRA with parameter offload)
OFFLOAD_LARGEST = 8
# QLoRA (bitsandbytes nf4) measured 2.4 GiB more transient memory than LoRA on one H200 in each of its
# five rows, 8 bytes a logit of that run (docs/memory.md); the cause is not isolated, the amount is
QLORA_LOGIT_EXTRA = 8
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
    def quantizable_params(self) -> int:
        """Weights of the nn.Linear layers a quantizer replaces (transformers' replace_with_bnb_linear
        and its kind): attention, dense MLPs and shared experts. Embeddings, the output head and norms
        stay 16-bit, and so do routed experts and routers, which transformers 5 keeps as fused
        parameters and router modules (no nn.Linear to replace)."""
        dense_layers = self.layers - self.moe_layers
        moe_linear = 3 * self.hidden * self.shared_intermediate
        return (self.layers * self.attention_params + dense_layers * self.mlp_params(False)
                + self.moe_layers * moe_linear)

    @property
    def largest_linear_params(self) -> int:
        return max(i * o for i, o in self.linear_shapes(False))

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


# bytes per quantized weight, the quantizer's constants included
BNB4_BLOCK = 64  # bitsandbytes 4-bit: one absmax per 64 weights
BNB4_DOUBLE_BLOCK = 256  # double quantization: the absmax in 8 bits, one fp32 constant per 256 of them
HQQ_GROUP = 64  # HQQ (LLaMA-Factory's HqqConfig): fp16 scale and zero per group of 64
GPTQ_GROUP = 128  # GPTQ/AWQ checkpoints: fp16 scale + packed zero per group of 128 (the common group_size)


@dataclass(frozen=True)
class Quantization:
    """How the frozen base weights are stored: method ('bnb', 'hqq', 'eetq', 'gptq', 'awq'), bits."""

    method: str
    bits: int
    double_quant: bool = True  # bnb 4-bit: LLaMA-Factory's double_quantization default

    @property
    def bytes_per_weight(self) -> float:
        if self.method == "bnb" and self.bits == 4:
            consts = (1 / BNB4_BLOCK + 4 / (BNB4_BLOCK * BNB4_DOUBLE_BLOCK)) if self.double_quant else 4 / BNB4_BLOCK
            return 0.5 + consts
        if self.method in ("bnb", "eetq") and self.bits == 8:
            return 1.0  # int8 weights; one fp32/fp16 scale per output row is noise at these sizes
        if self.method == "hqq":
            return self.bits / 8 + 4 / HQQ_GROUP
        return self.bits / 8 + 4 / GPTQ_GROUP

    def describe(self) -> str:
        extra = " (double quant)" if self.method == "bnb" and self.bits == 4 and self.double_quant else ""
        return f"{self.method} {self.bits}-bit{extra}, {self.bytes_per_weight:.3f} byte/weight"


def frozen_weight_bytes(shape: ModelShape, quant: Quantization | None = None) -> float:
    """Bytes of the base weights that LoRA leaves frozen: 2 per parameter in bf16/fp16; quantized,
    the replaced linear weights at the quantizer's size and the rest in 16 bits."""
    if quant is None:
        return 2.0 * shape.total_params
    linear = shape.quantizable_params
    return linear * quant.bytes_per_weight + 2.0 * (shape.total_params - linear)


def dequant_buffer(shape: ModelShape, quant: Quantization | None) -> float:
    """The 16-bit copy of one linear weight a quantized layer makes while it computes (per GPU)."""
    return 2.0 * shape.largest_linear_params if quant is not None else 0.0


def quantization_of(args: dict, cfg: dict | None) -> Quantization | None:
    """How LLaMA-Factory will hold the base weights (model_utils/quantization.py
    configure_quantization): a pre-quantized checkpoint as it is (fp8 and mxfp4 are de-quantized to
    16 bits on load), else quantization_bit with bnb/hqq/eetq; None: 16-bit."""
    q = (cfg or {}).get("quantization_config") or ((cfg or {}).get("text_config") or {}).get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method") or "").lower()
        if method in ("fp8", "mxfp4"):
            return None
        if method == "bitsandbytes":
            return Quantization("bnb", 4 if q.get("load_in_4bit") else 8, bool(q.get("bnb_4bit_use_double_quant")))
        bits = q.get("bits") or (2 if method == "aqlm" else None)
        return Quantization(method or "gptq", int(bits)) if isinstance(bits, int) else None
    bit, method = args.get("quantization_bit"), str(args.get("quantization_method", "bnb"))
    if not isinstance(bit, int) or isinstance(bit, bool) or method not in ("bnb", "hqq", "eetq"):
        return None
    if (method == "bnb" and bit not in (4, 8)) or (method == "eetq" and bit != 8):
        return None  # LLaMA-Factory refuses these (config.llamafactory says so)
    return Quantization(method, bit, args.get("double_quantization", True) is not False)


@dataclass
class Plan:
    stage: int
    offload: str  # 'none', 'optimizer', 'optimizer+params'
    gpu_bytes: float
    host_bytes: float


def model_states(shape: ModelShape, stage: int, offload: str, gpus: int, gpus_per_node: int,
                 lora_rank: int | None = None, quant: Quantization | None = None) -> tuple[float, float]:
    """(GPU bytes, host bytes) of parameters, gradients and Adam states per GPU / per node; with
    LoRA the frozen base weights are 16-bit or, with quant, quantized."""
    total = shape.total_params
    if lora_rank:
        per_layer = sum(i + o for i, o in shape.linear_shapes(shape.moe_layers > 0)) * lora_rank
        trainable = per_layer * shape.layers
        frozen = frozen_weight_bytes(shape, quant)
        # ZeRO-3 keeps, beside each rank's partition, gathered copies as large again (DeepSpeed's own
        # estimator budgets 18 rather than 16 bytes a parameter for it; measured on one H200: LoRA's
        # frozen bf16 weights take 2.0 GiB under ZeRO-3 for 0.99 GiB of weights, docs/memory.md)
        base = 2 * frozen / gpus if stage == 3 else frozen
        gpu = base + dequant_buffer(shape, quant) + 16 * trainable / (gpus if stage >= 1 else 1)
        host = 0.0
        if offload != "none":
            gpu = base + dequant_buffer(shape, quant) + 4 * trainable
            host = 12 * trainable * gpus_per_node
            if offload == "optimizer+params" and stage == 3:
                gpu = OFFLOAD_LARGEST * shape.largest_layer_params
                host += frozen * HOST_BUFFER_FACTOR
        return gpu, host
    largest = (OFFLOAD_LARGEST if offload != "none" else 4) * shape.largest_layer_params
    if stage == 0:
        return 16 * total, 0.0
    if stage == 1:
        return 4 * total + 12 * total / gpus, 0.0
    if stage == 2:
        if offload != "none":
            # the largest layer's 16-bit gradient waits on the GPU for its copy to the host
            return 2 * total + 2 * shape.largest_layer_params, total * max(4 * gpus, 16) * HOST_BUFFER_FACTOR
        return 2 * total + 14 * total / gpus, 0.0
    if offload == "optimizer+params":
        return largest, total * max(4 * gpus, 18) * HOST_BUFFER_FACTOR
    if offload == "optimizer":
        return largest + 2 * total / gpus, total * max(4 * gpus_per_node, 16) * HOST_BUFFER_FACTOR
    return largest + 18 * total / gpus, 0.0


def is_bnb_4bit(quant: Quantization | None) -> bool:
    return quant is not None and quant.method == "bnb" and quant.bits == 4


def activations(shape: ModelShape, micro_batch: int, seq: int, checkpointing: bool, flash: bool,
                quantized: bool = False) -> float:
    """Bytes of activations and logits per GPU for one micro-batch (bf16; Korthikanti et al.'s
    per-layer count s·b·h·(34 + 5·a·s/h), the attention-matrix term gone with flash/SDPA). A
    bitsandbytes 4-bit base adds QLORA_LOGIT_EXTRA bytes a logit."""
    b, s, h, a = micro_batch, seq, shape.hidden, shape.heads
    per_layer = s * b * h * (34 + (0 if flash else 5 * a * s / h))
    if checkpointing:
        acts = shape.layers * 2 * s * b * h + per_layer
    else:
        acts = shape.layers * per_layer
    logits = (12 + (QLORA_LOGIT_EXTRA if quantized else 0)) * b * s * shape.vocab  # bf16 logits, their fp32 upcast, both gradients
    return acts + logits


def plans(shape: ModelShape, gpus: int, gpus_per_node: int, micro_batch: int, seq: int,
          lora_rank: int | None, checkpointing: bool = True, flash: bool = True,
          quant: Quantization | None = None) -> list[Plan]:
    act = activations(shape, micro_batch, seq, checkpointing, flash, is_bnb_4bit(quant)) + CUDA_OVERHEAD
    out = []
    for stage, offload in ((0, "none"), (2, "none"), (2, "optimizer"), (3, "none"), (3, "optimizer"),
                           (3, "optimizer+params")):
        gpu, host = model_states(shape, stage, offload, gpus, gpus_per_node, lora_rank, quant)
        out.append(Plan(stage, offload, gpu + act, host))
    return out
