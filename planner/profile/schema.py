"""The measured-profile file (YAML, ``schema_version: 1``): what was measured on one GPU type, with provenance.

A profile holds per-layer forward/backward times at measured points (micro-batch, sequence length, TP shard,
precision) for one model shape, collective times per operation, message size and group placement (nccl-tests
rows), fixed overheads, and where it all came from. Written by `planner profile ingest` / `planner profile run`,
named by a job's node group (`profile:`) or `--profile`, read by planner/profile/measured.py. Format reference:
docs/profiles.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.strict import StrictModel

SCHEMA_VERSION = 1
LAYER_KINDS = ("layer", "attention", "mlp", "moe", "embedding", "logits")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


class Provenance(StrictModel):
    """Where the numbers come from: enough to judge whether they still hold."""

    tool: str = Field(description="what measured: `planner profile run`, `nccl-tests 2.19.6`, `torch.profiler`, ...")
    gpu: str | None = Field(None, description="the device as the tool reported it (e.g. NVIDIA H100 80GB HBM3)")
    date: str | None = Field(None, description="when it was measured (ISO 8601)")
    command: str | None = Field(None, description="the command line that produced the measurement")
    host: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    nccl: str | None = None
    files: tuple[str, ...] = Field((), description="the files ingested into this profile")


class LayerShape(StrictModel):
    """The model shape the layer points were measured on: a layer point is used only for a job of this shape."""

    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    ffn_hidden_size: int = Field(ge=1)
    mlp: Literal["gelu", "swiglu"] = "swiglu"
    num_experts: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=1)
    expert_ffn_hidden_size: int | None = Field(None, ge=1)
    vocab_size: int | None = Field(None, ge=1)


class LayerPoint(StrictModel):
    """One measured point of one layer kind: seconds of one forward and one backward pass of one micro-batch."""

    kind: Literal["layer", "attention", "mlp", "moe", "embedding", "logits"] = Field(
        description="layer: a whole transformer layer (attention + MLP or MoE); the parts otherwise"
    )
    micro_batch_size: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    tp: int = Field(1, ge=1, description="TP shard the layer ran with (1/tp of the heads and FFN)")
    precision: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    forward_s: float = Field(gt=0, le=3600)
    backward_s: float = Field(ge=0, le=3600)
    activation_bytes: float | None = Field(None, ge=0, description="peak activation memory of the pass, bytes")


class CollectivePoint(StrictModel):
    """One nccl-tests row: an operation over ``ranks`` GPUs on ``nodes`` nodes, ``bytes`` as nccl-tests counts them
    (the total buffer for all_gather, reduce_scatter and all_to_all; per rank for send_recv)."""

    op: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
    bytes: float = Field(gt=0)
    ranks: int = Field(ge=2)
    nodes: int = Field(1, ge=1)
    time_s: float = Field(gt=0, le=3600)
    busbw_gbps: float | None = Field(None, ge=0, description="nccl-tests bus bandwidth, GB/s (for reading only)")

    @model_validator(mode="after")
    def _ranks_cover_nodes(self):
        if self.nodes > self.ranks:
            raise ValueError(f"{self.nodes} nodes for {self.ranks} ranks")
        return self


class Overheads(StrictModel):
    """Fixed seconds measured outside the layers (recorded; the estimate adds them per iteration)."""

    per_step_s: float = Field(0.0, ge=0, le=3600)
    per_microbatch_s: float = Field(0.0, ge=0, le=3600)


class Profile(StrictModel):
    schema_version: Literal[1] = Field(description="1")
    gpu: str = Field(description="the GPU type (catalog name, `planner list gpus`) this profile applies to")
    provenance: Provenance
    model: LayerShape | None = Field(None, description="the model shape of the layer points")
    layers: tuple[LayerPoint, ...] = ()
    collectives: tuple[CollectivePoint, ...] = ()
    overheads: Overheads = Overheads()
    extrapolation: float = Field(
        2.0, ge=1.0, le=100.0, description="how far past the measured range (a factor) a curve is extended"
    )

    @model_validator(mode="after")
    def _layers_need_a_shape(self):
        if self.layers and self.model is None:
            raise ValueError("layer points need `model`: the shape they were measured on")
        return self
