"""The job spec (YAML, version 1): model, cluster, training settings and an optional fixed layout.

Data flows one way: a job file is loaded and validated here, then handed to the cost model.
Every field is validated by pydantic; errors come out as ``error: <field.path>: <message>``.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from planner.errors import SpecError, did_you_mean

# Absurd sizes are rejected up front: nothing real is this big, and the cost model must stay finite.
MAX_GPUS = 1_000_000
MAX_LAYERS = 10_000


@functools.lru_cache(maxsize=None)
def _scalar_kind(annotation: Any) -> type | None:
    """int, float or bool when a field holds exactly that scalar (or None), else None."""
    kinds = [a for a in (get_args(annotation) or (annotation,)) if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float, bool) else None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_lax_scalars(cls, value: Any, info) -> Any:
        """Refuse pydantic's lax conversions of YAML scalars: ``tp: yes`` -> 1, ``seq_length: '4k'``-like strings,
        ``sequence_parallel: 'on'`` -> True. Numbers must be numbers and switches true/false."""
        kind = _scalar_kind(cls.model_fields[info.field_name].annotation)
        if kind is None or value is None:
            return value
        if kind is bool:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                raise ValueError("expected true or false")
        elif isinstance(value, (bool, str)):
            raise ValueError("expected an integer" if kind is int else "expected a number")
        return value


class MoESpec(_Strict):
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


class ModelSpec(_Strict):
    name: str = "custom"
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=1_000_000)
    ffn_hidden_size: int = Field(ge=1, le=10_000_000)
    num_attention_heads: int = Field(ge=1, le=100_000)
    num_kv_heads: Optional[int] = Field(None, ge=1, le=100_000, description="defaults to num_attention_heads (MHA)")
    head_dim: Optional[int] = Field(None, ge=1, le=100_000, description="defaults to hidden_size / heads")
    vocab_size: int = Field(ge=1, le=100_000_000)
    mlp: Literal["gelu", "swiglu", "relu"] = "swiglu"
    tie_embeddings: bool = False
    dropout: bool = Field(False, description="hidden/attention dropout on (GPT-3-era Megatron); adds 1-byte masks")
    moe: Optional[MoESpec] = None
    source: str = "user supplied"

    @model_validator(mode="after")
    def _heads(self):
        kv = self.num_kv_heads or self.num_attention_heads
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
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) is an MoE layer (DeepSeek/Megatron conventions)."""
        m = self.moe
        return m is not None and index >= m.first_dense_layers and (index - m.first_dense_layers) % m.moe_layer_freq == 0

    def moe_layers_before(self, x: int) -> int:
        """Number of MoE layers among the first ``x`` layers (closed form of is_moe_layer)."""
        m = self.moe
        if m is None:
            return 0
        return max(0, (x - m.first_dense_layers + m.moe_layer_freq - 1) // m.moe_layer_freq)

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_before(self.num_layers)


class GpuSpec(_Strict):
    """One GPU type. Bandwidth units follow vendor usage: NVLink in GB/s, NICs in Gb/s."""

    name: str = "custom-gpu"
    memory_gib: float = Field(gt=0, le=100_000)
    peak_tflops_bf16: float = Field(gt=0, le=1_000_000)
    peak_tflops_fp16: Optional[float] = Field(None, gt=0, le=1_000_000)
    peak_tflops_fp8: Optional[float] = Field(None, gt=0, le=1_000_000)
    matmul_tflops_bf16: Optional[float] = Field(
        None, gt=0, le=1_000_000, description="measured achievable dense GEMM rate (MAMF); defaults to 80% of peak"
    )
    attention_tflops_bf16: Optional[float] = Field(
        None, gt=0, le=1_000_000, description="measured fused-attention (flash) rate, forward+backward; defaults to the GEMM rate"
    )
    hbm_tbps: float = Field(gt=0, le=10_000, description="HBM bandwidth, TB/s")
    intra_node_gbps: float = Field(gt=0, le=1_000_000, description="scale-up (NVLink) bandwidth per GPU per direction, GB/s")
    inter_node_gbps: float = Field(gt=0, le=1_000_000, description="scale-out NIC line rate per GPU, Gb/s")
    gpus_per_node: int = Field(8, ge=1, le=1024)
    source: str = "user supplied"


class NodeGroup(_Strict):
    gpu: GpuSpec
    nodes: int = Field(ge=1, le=MAX_GPUS)
    gpus_per_node: int = Field(ge=1, le=1024)
    inter_node_gbps: Optional[float] = Field(None, gt=0, le=1_000_000, description="override of the GPU's NIC rate, Gb/s")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nic_gbps(self) -> float:
        return self.inter_node_gbps or self.gpu.inter_node_gbps


class Training(_Strict):
    seq_length: int = Field(ge=1, le=100_000_000)
    global_batch_size: int = Field(ge=1, le=1_000_000_000, description="sequences per iteration")
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    attention: Literal["flash", "eager"] = Field(
        "flash", description="fused (flash/cuDNN/SDPA) attention, or the materialized s^2 softmax"
    )
    grad_dtype: Literal["fp32", "bf16", "bf16+fp32"] = Field(
        "fp32",
        description="gradient buffers: fp32 (Megatron main_grad), bf16, or bf16+fp32 (16-bit .grad plus an "
        "unsharded fp32 accumulation buffer, DeepSpeed BF16_Optimizer)",
    )


class StageSpec(_Strict):
    layers: int = Field(ge=1, le=MAX_LAYERS)
    recompute_layers: Optional[int] = Field(
        None, ge=0, le=MAX_LAYERS, description="layers of this stage fully recomputed (the rest use layout.recompute)"
    )

    group: Optional[int] = Field(None, ge=0, le=10_000, description="heterogeneous layout: index of the node group in `cluster`")
    tp: Optional[int] = Field(None, ge=1, le=MAX_GPUS, description="heterogeneous layout: this stage's TP degree")
    gpus: Optional[int] = Field(None, ge=1, le=MAX_GPUS,
                                description="heterogeneous layout: GPUs of the stage, tp*cp*dp (tp*cp*count in a replica)")

    @model_validator(mode="after")
    def _recompute_within_stage(self):
        if self.recompute_layers is not None and self.recompute_layers > self.layers:
            raise ValueError(f"recompute_layers ({self.recompute_layers}) exceeds the stage's layers ({self.layers})")
        given = [k for k in ("group", "tp", "gpus") if getattr(self, k) is not None]
        if given and len(given) != 3:
            raise ValueError("a heterogeneous stage lists group, tp and gpus together (got only "
                             + ", ".join(given) + ")")
        return self

    @property
    def placed(self) -> bool:
        """Part of a heterogeneous layout (names its node group and TP degree)."""
        return self.group is not None


class ReplicaSpec(_Strict):
    """``count`` identical data-parallel replicas of one pipeline; replicas of different entries may place their
    stages on other node groups and run a different number of micro-batches per iteration."""

    stages: tuple[StageSpec, ...] = Field(min_length=1)
    micro_batches: int = Field(ge=1, le=1_000_000_000, description="micro-batches per iteration of each of these replicas")
    count: int = Field(1, ge=1, le=MAX_GPUS, description="identical replicas of this pipeline")


class Layout(_Strict):
    tp: int = Field(1, ge=1, le=MAX_GPUS)
    pp: int = Field(1, ge=1, le=MAX_GPUS)
    dp: Optional[int] = Field(None, ge=1, le=MAX_GPUS, description="defaults to GPUs / (tp*pp*cp)")
    cp: int = Field(1, ge=1, le=MAX_GPUS)
    ep: int = Field(1, ge=1, le=MAX_GPUS)
    vpp: int = Field(1, ge=1, le=MAX_LAYERS)
    micro_batch_size: int = Field(1, ge=1, le=1_000_000)
    sequence_parallel: Optional[bool] = Field(None, description="defaults to true when tp > 1")
    zero_stage: int = Field(1, ge=0, le=3, description="0 none, 1 optimizer (Megatron distributed optimizer), 2 +grads, 3 +weights (FSDP)")
    recompute: Literal["none", "selective", "full"] = "selective"
    tp_comm_overlap: bool = Field(
        False, description="overlap TP collectives with the GEMMs they feed (Megatron --tp-comm-overlap)"
    )
    stages: Optional[tuple[StageSpec, ...]] = Field(
        None, description="per-pipeline-stage layer counts (uneven split); defaults to an even split"
    )
    replicas: Optional[tuple[ReplicaSpec, ...]] = Field(
        None, min_length=1,
        description="heterogeneous data parallelism: pipelines whose replicas differ in placement and micro-batch "
        "count (instead of stages)",
    )
    # Rules between degrees (stages vs pp, products, divisibility) live in planner.parallel.ParallelDims.check.


class LinkSpec(_Strict):
    """The network between the nodes of two node groups, per GPU (overrides the slower of their NICs)."""

    groups: tuple[int, int] = Field(description="the two node-group indices")
    gbps: float = Field(gt=0, le=1_000_000, description="line rate per GPU between the two groups, Gb/s")


class Job(_Strict):
    model: ModelSpec
    cluster: tuple[NodeGroup, ...] = Field(min_length=1)
    training: Training
    links: tuple[LinkSpec, ...] = Field((), description="network between node groups; default: the slower NIC")
    layout: Optional[Layout] = None

    def ring_gbps(self, groups) -> float:
        """Per-GPU rate of a ring over the nodes of several groups: its slowest NIC or link between them (Gb/s)."""
        groups = sorted(groups)
        return min([self.cluster[g].nic_gbps for g in groups]
                   + [self.link_gbps(a, b) for i, a in enumerate(groups) for b in groups[i + 1:]])

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


# ----------------------------------------------------------------------------- loading


# Names other tools use for our fields (Megatron-LM / DeepSpeed flags, Hugging Face config keys).
_SYNONYMS = {
    "tensor_parallel": "tp", "tensor_parallel_size": "tp", "tensor_model_parallel_size": "tp", "tp_size": "tp",
    "pipeline_parallel": "pp", "pipeline_parallel_size": "pp", "pipeline_model_parallel_size": "pp", "pp_size": "pp",
    "data_parallel": "dp", "data_parallel_size": "dp", "dp_size": "dp",
    "context_parallel": "cp", "context_parallel_size": "cp", "cp_size": "cp",
    "expert_parallel": "ep", "expert_parallel_size": "ep", "expert_model_parallel_size": "ep", "ep_size": "ep",
    "virtual_pipeline": "vpp", "virtual_pipeline_model_parallel_size": "vpp", "interleave": "vpp",
    "micro_batch": "micro_batch_size", "mbs": "micro_batch_size", "zero": "zero_stage",
    "num_hidden_layers": "num_layers", "intermediate_size": "ffn_hidden_size",
    "num_key_value_heads": "num_kv_heads", "seq_len": "seq_length", "global_batch": "global_batch_size",
}


def suggest_field(name: str, allowed) -> str:
    """`` (did you mean 'x'?)`` for an unknown field: a known synonym first, else the closest spelling."""
    alt = _SYNONYMS.get(name.strip().lower().replace("-", "_"))
    if alt in allowed:
        return f" (did you mean '{alt}'?)"
    return did_you_mean(name, allowed)


def format_validation_error(exc: ValidationError, prefix: str = "") -> SpecError:
    """The first pydantic error as a SpecError naming the field path (``cluster[0].nodes``).

    An unknown field is reported before anything else: ``seq_lenght`` also makes ``seq_length`` missing, and the
    typo is the thing to fix."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    parts: list[str] = []
    for item in err["loc"]:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    field = prefix + "".join(parts) if parts else (prefix.rstrip(".") or "job")
    if field.startswith("."):
        field = field[1:]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "extra_forbidden":
        model_fields = _fields_at(exc, err["loc"])
        msg = "unknown field" + suggest_field(str(err["loc"][-1]), model_fields)
        if model_fields:
            msg += f"; allowed: {', '.join(sorted(model_fields))}"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] in ("model_type", "dict_type"):
        msg = f"expected a mapping, got {type(err.get('input')).__name__}"
    elif "input" in err and isinstance(err["input"], (str, int, float, bool, type(None))):  # not a whole mapping
        shown = repr(err["input"])
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg = f"{msg} (got {shown})"
    return SpecError(field or "job", msg)


def _fields_at(exc: ValidationError, loc) -> list[str]:
    model = {"Job": Job}.get(exc.title)
    names = {
        "model": ModelSpec, "moe": MoESpec, "training": Training, "layout": Layout,
        "cluster": NodeGroup, "gpu": GpuSpec, "links": LinkSpec, "replicas": ReplicaSpec, "stages": StageSpec,
    }
    target = model
    for item in loc[:-1]:
        if isinstance(item, str) and item in names:
            target = names[item]
    if target is None:
        target = {"ModelSpec": ModelSpec, "GpuSpec": GpuSpec, "Layout": Layout}.get(exc.title)
    return list(target.model_fields) if target is not None else []


def parse_job(raw: Any, base_dir: Path | None = None) -> Job:
    """Validate a raw mapping (already YAML-decoded) into a Job, resolving catalog names."""
    from planner.catalog import resolve_gpu, resolve_model

    if not isinstance(raw, dict):
        raise SpecError("job", f"expected a mapping with model, cluster, training; got {type(raw).__name__}")
    allowed = {"version", "model", "cluster", "training", "links", "layout"}
    for key in raw:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed)
            alt = _SYNONYMS.get(str(key).strip().lower().replace("-", "_"), str(key))
            for section, model in (("layout", Layout), ("training", Training)):
                if not hint and alt in model.model_fields:  # e.g. `tp: 8` or `tensor_parallel: 8` at the top
                    hint = f" (did you mean '{section}.{alt}'?)"
            raise SpecError(str(key), "unknown field" + hint + f"; allowed: {', '.join(sorted(allowed))}")
    version = raw.get("version", 1)
    if isinstance(version, bool) or version != 1:
        raise SpecError("version", f"unsupported spec version {version!r}; this planner reads version 1")
    for key in ("model", "cluster", "training"):
        if key not in raw or raw[key] is None:
            raise SpecError(key, "required field is missing")
    data = dict(raw)
    data.pop("version", None)
    data["model"] = resolve_model(raw["model"], base_dir=base_dir)
    cluster = raw["cluster"]
    if isinstance(cluster, dict):
        cluster = [cluster]
    if not isinstance(cluster, list) or not cluster:
        raise SpecError("cluster", "expected a non-empty list of node groups like {gpu: h100-sxm, nodes: 4, gpus_per_node: 8}")
    groups = []
    for i, group in enumerate(cluster):
        if not isinstance(group, dict):
            raise SpecError(f"cluster[{i}]", "expected a mapping like {gpu: h100-sxm, nodes: 4, gpus_per_node: 8}")
        if "gpu" not in group:
            raise SpecError(f"cluster[{i}].gpu", "required field is missing")
        g = dict(group)
        g["gpu"] = resolve_gpu(group["gpu"], field=f"cluster[{i}].gpu")
        if "gpus_per_node" not in g:
            g["gpus_per_node"] = g["gpu"].gpus_per_node
        groups.append(g)
    data["cluster"] = groups
    try:
        job = Job.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc)
    _check_links(job)
    if job.layout is not None:
        from planner.parallel import dims_from_layout

        dims_from_layout(job.layout, job).check()
    return job


def _check_links(job: Job) -> None:
    """Each link joins two existing, different node groups, and each pair is given once."""
    seen = set()
    for i, link in enumerate(job.links):
        a, b = link.groups
        for g in (a, b):
            if g >= len(job.cluster) or g < 0:
                raise SpecError(f"links[{i}].groups", f"no node group {g}; the cluster has {len(job.cluster)}")
        if a == b:
            raise SpecError(f"links[{i}].groups", f"a link joins two different groups (got {a} twice)")
        if frozenset((a, b)) in seen:
            raise SpecError(f"links[{i}].groups", f"the link between groups {a} and {b} is given twice")
        seen.add(frozenset((a, b)))


def load_job(path: str | Path) -> Job:
    """A job file, or standard input for ``-`` (relative model paths then resolve from the working folder)."""
    from planner.io import STDIN, load_yaml

    raw = load_yaml(path, field="job")
    return parse_job(raw, base_dir=Path.cwd() if str(path) == STDIN else Path(path).resolve().parent)
