"""The job spec (YAML, version 1): model, cluster, training settings and an optional fixed layout.

A pure schema: every field with its unit and range, validated by pydantic. Reading a job file into a ``Job``
(catalog names, field-precise errors) is planner/load.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from planner.profile.schema import Profile
from planner.strict import StrictModel

# Absurd sizes are rejected up front: nothing real is this big, and the cost model must stay finite.
MAX_GPUS = 1_000_000
MAX_LAYERS = 10_000
# activation recomputation of a layer (Layout.recompute; priced by planner.cost.compute.layer_time)
Recompute = Literal["none", "selective", "op", "full"]


class MoESpec(StrictModel):
    num_experts: int = Field(ge=1, le=100_000)
    top_k: int = Field(ge=1, le=1024)
    expert_ffn_hidden_size: int = Field(ge=1, le=10_000_000)
    shared_experts: int = Field(0, ge=0, le=1024, description="always-active experts per MoE layer")
    moe_layer_freq: int = Field(1, ge=1, le=MAX_LAYERS, description="every k-th layer is MoE")
    first_dense_layers: int = Field(0, ge=0, le=MAX_LAYERS, description="leading layers kept dense")

    @model_validator(mode="after")
    def _top_k_fits(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        return self


class MLASpec(StrictModel):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 sec. 2.1; DeepSeek-V3, Kimi K2): queries, keys and
    values are up-projected per head from low-rank latents, and one rotary key of qk_rope_head_dim is shared by all
    heads. Field names are those of the Hugging Face DeepseekV2/V3 config.json; Megatron-Core's MLATransformerConfig
    calls qk_nope_head_dim ``qk_head_dim`` and qk_rope_head_dim ``qk_pos_emb_head_dim``."""

    q_lora_rank: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="rank of the query latent (q_a_proj: hidden -> q_lora_rank, then q_b_proj up to the heads); "
        "null: queries projected from the hidden state directly, no query compression (DeepSeek-V2-Lite)",
    )
    kv_lora_rank: int = Field(
        ge=1,
        le=1_000_000,
        description="rank of the joint key/value latent (kv_a_proj_with_mqa: hidden -> kv_lora_rank + "
        "qk_rope_head_dim; kv_b_proj: kv_lora_rank -> heads * (qk_nope_head_dim + v_head_dim))",
    )
    qk_nope_head_dim: int = Field(
        ge=1, le=100_000, description="per-head query/key dimension without rotary embedding (Megatron qk_head_dim)"
    )
    qk_rope_head_dim: int = Field(
        ge=1,
        le=100_000,
        description="per-head query/key dimension that carries RoPE (Megatron qk_pos_emb_head_dim); the key part is "
        "one rotary head shared by all heads (decoupled RoPE)",
    )
    v_head_dim: int = Field(ge=1, le=100_000, description="per-head value dimension (the output projection's input)")

    @property
    def qk_head_dim(self) -> int:
        """Query/key width of one head, qk_nope_head_dim + qk_rope_head_dim (what Q.K^T contracts over)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def _field_error(title: str, loc: tuple, message: str, value) -> ValidationError:
    """A validation error located at ``loc`` inside the model being validated: raised from a model validator,
    pydantic reports it at that field (``model.num_kv_heads``), not at the model as a whole."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)
    return ValidationError.from_exception_data(title, [detail])


class ModelSpec(StrictModel):
    name: str = "custom"
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=1_000_000)
    ffn_hidden_size: int = Field(ge=1, le=10_000_000)
    num_attention_heads: int = Field(ge=1, le=100_000)
    num_kv_heads: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="defaults to num_attention_heads (MHA); with mla it is num_attention_heads (filled in: each "
        "head gets its own key and value, up-projected from the shared latent)",
    )
    head_dim: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="defaults to hidden_size / heads; with mla the query/key head dimension qk_nope_head_dim + "
        "qk_rope_head_dim (filled in; the value head is mla.v_head_dim)",
    )
    vocab_size: int = Field(ge=1, le=100_000_000)
    mlp: Literal["gelu", "swiglu", "relu"] = "swiglu"
    tie_embeddings: bool = False
    dropout: bool = Field(False, description="hidden/attention dropout on (GPT-3-era Megatron); adds 1-byte masks")
    moe: MoESpec | None = None
    mla: MLASpec | None = Field(
        None, description="multi-head latent attention (DeepSeek-V2/V3, Kimi K2); null: MHA/GQA/MQA projections"
    )
    source: str = "user supplied"

    @model_validator(mode="before")
    @classmethod
    def _mla_heads(cls, data):
        """With mla, num_kv_heads is num_attention_heads and head_dim the query/key head dimension: filled in when
        left out, so every way of writing an MLA model (preset, config.json, Megatron flags) gives the same spec."""
        if not isinstance(data, dict) or data.get("mla") is None:
            return data
        mla = data["mla"]
        if isinstance(mla, MLASpec):
            mla = mla.model_dump()
        if not isinstance(mla, dict):
            return data  # the mla field reports it
        data = dict(data)
        if data.get("num_kv_heads") is None and data.get("num_attention_heads") is not None:
            data["num_kv_heads"] = data["num_attention_heads"]  # checked (type, range) as if written
        nope, rope = mla.get("qk_nope_head_dim"), mla.get("qk_rope_head_dim")
        if data.get("head_dim") is None and all(type(v) is int and v >= 1 for v in (nope, rope)):
            data["head_dim"] = nope + rope
        return data

    @model_validator(mode="after")
    def _heads(self):
        kv = self.num_kv_heads or self.num_attention_heads
        if self.mla is not None:
            heads, qk = self.num_attention_heads, self.mla.qk_head_dim
            if kv != heads:
                raise _field_error(
                    "ModelSpec",
                    ("num_kv_heads",),
                    f"must equal num_attention_heads ({heads}) with mla (multi-head latent attention gives every "
                    "head its own key and value), or be left out",
                    self.num_kv_heads,
                )
            if self.head_dim is not None and self.head_dim != qk:
                raise _field_error(
                    "ModelSpec",
                    ("head_dim",),
                    f"must equal mla.qk_nope_head_dim + mla.qk_rope_head_dim ({qk}) with mla (the query/key head "
                    "dimension), or be left out",
                    self.head_dim,
                )
            return self
        if self.num_attention_heads % kv:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_kv_heads ({kv})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) unless head_dim is given"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def dim_head(self) -> int:
        """Query/key dimension of one head (with mla: qk_nope_head_dim + qk_rope_head_dim)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) is an MoE layer (DeepSeek/Megatron conventions)."""
        m = self.moe
        return (
            m is not None and index >= m.first_dense_layers and (index - m.first_dense_layers) % m.moe_layer_freq == 0
        )

    def moe_layers_before(self, x: int) -> int:
        """Number of MoE layers among the first ``x`` layers (closed form of is_moe_layer)."""
        m = self.moe
        if m is None:
            return 0
        return max(0, (x - m.first_dense_layers + m.moe_layer_freq - 1) // m.moe_layer_freq)

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_before(self.num_layers)

    @property
    def all_moe_from(self) -> int:
        """The first layer index from which every layer is an MoE layer (is_moe_layer), num_layers when there is
        none: the leading dense layers of a model whose every later layer is MoE (moe_layer_freq 1)."""
        m = self.moe
        if m is None or m.moe_layer_freq != 1 or m.first_dense_layers >= self.num_layers:
            return self.num_layers
        return m.first_dense_layers


class GpuSpec(StrictModel):
    """One GPU type. Bandwidth units follow vendor usage: NVLink in GB/s, NICs in Gb/s."""

    name: str = "custom-gpu"
    memory_gib: float = Field(gt=0, le=100_000)
    peak_tflops_bf16: float = Field(gt=0, le=1_000_000)
    peak_tflops_fp16: float | None = Field(None, gt=0, le=1_000_000)
    peak_tflops_fp8: float | None = Field(None, gt=0, le=1_000_000)
    matmul_tflops_bf16: float | None = Field(
        None, gt=0, le=1_000_000, description="measured achievable dense GEMM rate (MAMF); defaults to 80% of peak"
    )
    attention_tflops_bf16: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="measured fused-attention (flash) rate, forward+backward; defaults to the GEMM rate",
    )
    attention3_tflops_bf16: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="rate of the newer-generation fused attention (FlashAttention-3, cuDNN fused attention) where "
        "the GPU has one, forward+backward; defaults to attention_tflops_bf16",
    )
    hbm_tbps: float = Field(gt=0, le=10_000, description="HBM bandwidth, TB/s")
    intra_node_gbps: float = Field(
        gt=0, le=1_000_000, description="scale-up (NVLink) bandwidth per GPU per direction, GB/s"
    )
    inter_node_gbps: float = Field(gt=0, le=1_000_000, description="scale-out NIC line rate per GPU, Gb/s")
    gpus_per_node: int = Field(8, ge=1, le=1024)
    source: str = "user supplied"


class NodeGroup(StrictModel):
    gpu: GpuSpec
    nodes: int = Field(ge=1, le=MAX_GPUS)
    gpus_per_node: int = Field(ge=1, le=1024)
    inter_node_gbps: float | None = Field(None, gt=0, le=1_000_000, description="override of the GPU's NIC rate, Gb/s")
    profile: Profile | None = Field(
        None, description="costs measured on this group's GPUs (a profile file path in the job YAML; docs/profiles.md)"
    )

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nic_gbps(self) -> float:
        return self.inter_node_gbps or self.gpu.inter_node_gbps


class Training(StrictModel):
    seq_length: int = Field(ge=1, le=100_000_000)
    global_batch_size: int = Field(ge=1, le=1_000_000_000, description="sequences per iteration")
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    attention: Literal["flash", "flash3", "eager"] = Field(
        "flash",
        description="fused attention: flash (FlashAttention-2 class: flash-attn 2, PyTorch SDPA) or flash3 "
        "(FlashAttention-3 / cuDNN fused attention, Hopper and newer: Transformer Engine in Megatron-Core and NeMo); "
        "or eager, the materialized s^2 softmax",
    )
    cross_entropy: Literal["fused", "unfused"] = Field(
        "fused",
        description="the loss kernel: fused (Megatron's vocab-parallel cross-entropy and other fused kernels: fp32 "
        "logits, gradient written in place) or unfused (torch cross_entropy over upcast logits, torchtitan: bf16 "
        "logits, an fp32 copy and the fp32 log-softmax)",
    )
    tp_backward_overlap: bool = Field(
        True,
        description="the backward's tensor-parallel collectives run under the weight-gradient GEMMs (Megatron-LM / "
        "Megatron-Core linear layers, also under DeepSpeed and NeMo); false for PyTorch DTensor TP (torchtitan), "
        "where every TP collective of the backward is on the critical path",
    )
    fp8_saved_inputs: bool = Field(
        True,
        description="fp8 training: the linear layers keep their FP8-cast inputs for the backward (Transformer "
        "Engine: Megatron, NeMo); false: they keep the 16-bit inputs (torchao Float8Linear: torchtitan)",
    )
    fp8_recipe: Literal["delayed", "tensorwise", "rowwise"] = Field(
        "delayed",
        description="fp8 training: how the FP8 scales are taken, which sets the cast kernels' HBM traffic: delayed "
        "(Transformer Engine delayed scaling: Megatron, NeMo; the casts fuse into the kernels that produce the "
        "tensors), tensorwise (dynamic per-tensor scaling: torchao's Float8 default in torchtitan 0.2, Megatron "
        "--fp8-recipe tensorwise) or rowwise (torchao per-row scaling, more cast traffic: torchtitan 0.3's Float8 "
        "converter)",
    )
    fp32_params: bool = Field(
        False,
        description="the parameters are fp32 and are the optimizer's master copy, cast to 16 bits when gathered "
        "(PyTorch FSDP / FSDP2 mixed precision: torchtitan, Composer); under ZeRO-3 no 16-bit shard is kept. "
        "false: 16-bit parameters plus an fp32 master copy in the optimizer (Megatron, DeepSpeed)",
    )
    grad_dtype: Literal["fp32", "bf16", "bf16+fp32"] = Field(
        "fp32",
        description="gradient buffers: fp32 (Megatron main_grad), bf16, or bf16+fp32 (16-bit .grad plus an "
        "unsharded fp32 accumulation buffer each micro-batch is added to, DeepSpeed BF16_Optimizer, ZeRO 0-1)",
    )

    @property
    def fused_attention(self) -> bool:
        """A fused (flash-style) kernel: no s^2 scores kept or recomputed."""
        return self.attention != "eager"


class StageSpec(StrictModel):
    layers: int = Field(ge=1, le=MAX_LAYERS)
    recompute_layers: int | None = Field(
        None, ge=0, le=MAX_LAYERS, description="layers of this stage fully recomputed (the rest use layout.recompute)"
    )

    group: int | None = Field(
        None, ge=0, le=10_000, description="heterogeneous layout: index of the node group in `cluster`"
    )
    tp: int | None = Field(None, ge=1, le=MAX_GPUS, description="heterogeneous layout: this stage's TP degree")
    gpus: int | None = Field(
        None,
        ge=1,
        le=MAX_GPUS,
        description="heterogeneous layout: GPUs of the stage, tp*cp*dp (tp*cp*count in a replica)",
    )

    @model_validator(mode="after")
    def _recompute_within_stage(self):
        if self.recompute_layers is not None and self.recompute_layers > self.layers:
            raise ValueError(f"recompute_layers ({self.recompute_layers}) exceeds the stage's layers ({self.layers})")
        given = [k for k in ("group", "tp", "gpus") if getattr(self, k) is not None]
        if given and len(given) != 3:
            raise ValueError(
                "a heterogeneous stage lists group, tp and gpus together (got only " + ", ".join(given) + ")"
            )
        return self

    @property
    def placed(self) -> bool:
        """Part of a heterogeneous layout (names its node group and TP degree)."""
        return self.group is not None


class ReplicaSpec(StrictModel):
    """``count`` identical data-parallel replicas of one pipeline; replicas of different entries may place their
    stages on other node groups and run a different number of micro-batches per iteration."""

    stages: tuple[StageSpec, ...] = Field(min_length=1)
    micro_batches: int = Field(
        ge=1, le=1_000_000_000, description="micro-batches per iteration of each of these replicas"
    )
    count: int = Field(1, ge=1, le=MAX_GPUS, description="identical replicas of this pipeline")


class Layout(StrictModel):
    tp: int = Field(1, ge=1, le=MAX_GPUS)
    pp: int = Field(1, ge=1, le=MAX_GPUS)
    dp: int | None = Field(None, ge=1, le=MAX_GPUS, description="defaults to GPUs / (tp*pp*cp)")
    cp: int = Field(1, ge=1, le=MAX_GPUS)
    ep: int = Field(1, ge=1, le=MAX_GPUS)
    vpp: int = Field(1, ge=1, le=MAX_LAYERS)
    micro_batch_size: int = Field(1, ge=1, le=1_000_000)
    sequence_parallel: bool | None = Field(None, description="defaults to true when tp > 1")
    zero_stage: int = Field(
        1, ge=0, le=3, description="0 none, 1 optimizer (Megatron distributed optimizer), 2 +grads, 3 +weights (FSDP)"
    )
    recompute: Recompute = Field(
        "selective",
        description="activation recomputation of the layers not counted in stages' recompute_layers: none, "
        "selective (the attention core, Korthikanti et al.), op (per-op selective checkpointing, torchtitan's "
        "SAC 'op' policy: every second matmul output and the attention output kept) or full",
    )
    tp_comm_overlap: bool = Field(
        False, description="overlap TP collectives with the GEMMs they feed (Megatron --tp-comm-overlap)"
    )
    stages: tuple[StageSpec, ...] | None = Field(
        None, description="per-pipeline-stage layer counts (uneven split); defaults to an even split"
    )
    replicas: tuple[ReplicaSpec, ...] | None = Field(
        None,
        min_length=1,
        description="heterogeneous data parallelism: pipelines whose replicas differ in placement and micro-batch "
        "count (instead of stages)",
    )
    # Rules between degrees (stages vs pp, products, divisibility) live in planner.parallel.ParallelDims.check.


class LinkSpec(StrictModel):
    """The network between the nodes of two node groups, per GPU (overrides the slower of their NICs)."""

    groups: tuple[int, int] = Field(description="the two node-group indices")
    gbps: float = Field(gt=0, le=1_000_000, description="line rate per GPU between the two groups, Gb/s")


class CalibrationSpec(StrictModel):
    """A job's own efficiencies of the analytic cost model (planner/cost/calibration.py), e.g. written by
    `planner calibrate`; each one left out keeps the built-in value."""

    gemm_efficiency: float | None = Field(None, gt=0, le=1)
    attention_efficiency: float | None = Field(None, gt=0, le=1)
    hbm_efficiency: float | None = Field(None, gt=0, le=1)
    nvlink_efficiency: float | None = Field(None, gt=0, le=1)
    network_efficiency: float | None = Field(None, gt=0, le=1)
    dp_overlap: float | None = Field(None, ge=0, le=1)
    fsdp_overlap: float | None = Field(None, ge=0, le=1)
    layer_overhead_s: float | None = Field(None, ge=0, le=1)
    memory_fixed_gib: float | None = Field(None, ge=0, le=1000)
    memory_fragmentation: float | None = Field(None, ge=0, le=1)
    source: str | None = Field(None, description="the calibration file it was read from")


class Job(StrictModel):
    model: ModelSpec
    cluster: tuple[NodeGroup, ...] = Field(min_length=1)
    training: Training
    links: tuple[LinkSpec, ...] = Field((), description="network between node groups; default: the slower NIC")
    layout: Layout | None = None
    calibration: CalibrationSpec | None = Field(
        None, description="the cost model's efficiencies for this job (a calibration file path in the job YAML)"
    )

    def ring_gbps(self, groups) -> float:
        """Per-GPU rate of a ring over the nodes of several groups: its slowest NIC or link between them (Gb/s)."""
        groups = sorted(groups)
        return min(
            [self.cluster[g].nic_gbps for g in groups]
            + [self.link_gbps(a, b) for i, a in enumerate(groups) for b in groups[i + 1 :]]
        )

    def link_gbps(self, a: int, b: int) -> float:
        """Per-GPU line rate between nodes of groups a and b (Gb/s): the ``links`` entry, else the slower NIC."""
        for link in self.links:
            if set(link.groups) == {a, b}:
                return link.gbps
        return min(self.cluster[a].nic_gbps, self.cluster[b].nic_gbps)

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.cluster)

    @field_validator("cluster")
    @classmethod
    def _cluster_size(cls, groups: tuple[NodeGroup, ...]) -> tuple[NodeGroup, ...]:
        total = sum(g.num_gpus for g in groups)
        if total > MAX_GPUS:
            raise ValueError(f"the cluster has {total} GPUs; at most {MAX_GPUS} are supported")
        return groups
