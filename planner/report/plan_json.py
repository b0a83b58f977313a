"""The versioned JSON of `planner plan` (schema_version 1), its JSON Schema, and the placement of stages on nodes.

The pydantic models below are the contract read by launch scripts; `planner schema plan` prints their JSON Schema.
Every property carries a description with its unit. The document is self-contained: it echoes the resolved job
(``parse_job(doc["job"])`` rebuilds it), the planner version, the cost model's calibration, the memory margin and the
job's warnings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.cost.estimate import SCHEMA_VERSION, Estimate
from planner.parallel import RANK_ORDER, HeteroDims, ReplicaDims
from planner.report.provenance import provenance, warnings_json
from planner.search.result import SearchResult
from planner.spec import Job, Recompute


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _d(text: str, default=...):
    """A described field (every property of the published schema has a description)."""
    return Field(default, description=text)


class StageOut(_Out):
    """One pipeline stage of a layout, in pipeline order."""

    layers: int = _d("transformer layers held by this stage (the stages' layers sum to model.num_layers)")
    recompute_layers: int | None = _d(
        "layers of this stage whose activations are fully recomputed in the backward pass; the others follow "
        "layout.recompute. Absent: none beyond layout.recompute",
        None,
    )
    group: int | None = _d(
        "mixed-GPU plans: the node group the stage runs on (index into job.cluster); absent in one-group plans", None
    )
    tp: int | None = _d(
        "mixed-GPU plans: this stage's tensor-parallel degree (authoritative; the top-level layout.tp is null when "
        "stages differ); absent in one-group plans, where layout.tp holds",
        None,
    )
    gpus: int | None = _d(
        "mixed-GPU plans: GPUs of this stage, tp*cp*dp (tp*cp*count inside a replica entry); absent in one-group plans",
        None,
    )


class ReplicaOut(_Out):
    """Identical data-parallel replicas of one pipeline (layouts with replicas that differ in placement)."""

    count: int = _d("identical data-parallel replicas of this pipeline (their sum is layout.dp)")
    micro_batches: int = _d("micro-batches each of these replicas runs per iteration")
    stages: list[StageOut] = _d("this pipeline's stages in pipeline order, each placed on a node group with its own tp")


class LayoutOut(_Out):
    """Parallel degrees and memory/communication settings of one layout (Megatron-LM terms)."""

    tp: int | None = _d(
        "tensor-parallel degree. Mixed-GPU plans: the stages' common tp, null when stages differ; see stages[].tp "
        "(or replicas[].stages[].tp)"
    )
    pp: int = _d("pipeline-parallel degree: number of pipeline stages")
    dp: int = _d("data-parallel degree: replicas of the model (with replicas: the sum of replicas[].count)")
    cp: int = _d("context-parallel degree: GPUs that split each sequence")
    ep: int = _d("expert-parallel degree (MoE models; 1 otherwise)")
    vpp: int = _d("virtual pipeline stages per GPU (interleaved 1F1B schedule); 1: not interleaved")
    micro_batch_size: int = _d("sequences per micro-batch on each data-parallel replica")
    sequence_parallel: bool | None = _d(
        "Megatron sequence parallelism (shards norm/dropout activations over the TP group; on exactly where tp > 1). "
        "Mixed-GPU plans: null when only some stages have tp > 1 (it is on in those)"
    )
    zero_stage: int = _d(
        "ZeRO stage: 0 none, 1 optimizer states sharded over DP (Megatron distributed optimizer), "
        "2 also gradients, 3 also weights (FSDP)"
    )
    recompute: Recompute = _d(
        "activation recomputation baseline: none, selective (attention core only), op (per-op selective "
        "checkpointing: every second matmul output and the attention output kept) or full (whole layers); stages' "
        "recompute_layers add fully recomputed layers"
    )
    tp_comm_overlap: bool = _d("TP collectives overlapped with the GEMMs they feed (Megatron --tp-comm-overlap)")
    stages: list[StageOut] | None = _d(
        "the pipeline stages in order; absent when the layout has replicas (then see replicas)", None
    )
    replicas: list[ReplicaOut] | None = _d(
        "data-parallel replicas that differ in placement and micro-batch count; absent otherwise (then see stages)",
        None,
    )
    num_microbatches: int | None = _d(
        "micro-batches per iteration on each replica (global_batch_size = micro_batch_size * dp * num_microbatches). "
        "With replicas: null when they run different counts; see replicas[].micro_batches"
    )


class StageEstimateOut(_Out):
    """The cost model's numbers for one pipeline stage (of one replica entry, in plans with replicas)."""

    index: int = _d(
        "the stage's position in its pipeline, 0-based (index into layout.stages or layout.replicas[replica].stages)"
    )
    layers: int = _d("transformer layers of this stage")
    microbatch_time_s: float = _d(
        "seconds for the forward and backward pass of one micro-batch on this stage, "
        "with its exposed TP/CP/EP/pipeline communication"
    )
    peak_memory_gib: float = _d("predicted peak memory per GPU of this stage, GiB (2^30 bytes)")
    group: int | None = _d("mixed-GPU plans: the stage's node group (index into job.cluster); absent otherwise", None)
    memory_capacity_gib: float | None = _d(
        "mixed-GPU plans: usable memory of this stage's GPU, GiB: memory_gib * (1 - memory_margin); absent otherwise "
        "(then the estimate's memory_capacity_gib holds for every stage)",
        None,
    )
    replica: int | None = _d(
        "plans with replicas: which replica entry (index into layout.replicas); absent otherwise", None
    )
    layer_times_s: dict[str, dict[str, float]] = _d(
        "seconds of one layer for one micro-batch on this stage's GPUs, by layer kind (dense, moe: present when the "
        "model has MoE layers), each with forward and backward (without recompute): measured where the node group's "
        "profile covers the point (see cost_sources), analytic otherwise"
    )


_TIME_KEYS = (
    "compute, tp_comm, cp_comm, ep_comm, pp_comm, zero_comm: the slowest stage's per-micro-batch times "
    "(computation; exposed tensor-, context-, expert-parallel, pipeline send/receive and ZeRO-3 "
    "gather/scatter communication) times the micro-batch count; pipeline_bubble: pipeline warm-up and "
    "cool-down; dp_comm: the data-parallel gradient reduction left exposed after the last micro-batch; "
    "optimizer: the optimizer step"
)


class EstimateOut(_Out):
    """Predicted time, throughput and memory of one layout (the analytic cost model, see cost_model)."""

    schema_version: int = _d("version of this JSON format (the same as the document's)")
    fits: bool = _d("every stage's peak memory is within its GPU's memory less the memory margin")
    iteration_time_s: float = _d("predicted seconds per training iteration (one global batch)")
    tokens_per_s: float = _d(
        "training throughput of the whole job, tokens/s (global_batch_size * seq_length / iteration_time_s)"
    )
    tokens_per_s_per_gpu: float = _d(
        "tokens_per_s divided by the GPUs the layout uses (placement.world_size), tokens/s per GPU"
    )
    model_tflops_per_gpu: float = _d(
        "model FLOPs (forward + backward, recomputation not counted, Megatron-LM's count) per second per GPU used, "
        "TFLOP/s (10^12 FLOP/s)"
    )
    mfu: float = _d("model FLOPs utilization as a fraction (0..1, not percent): model_tflops_per_gpu / mfu_peak_tflops")
    mfu_peak_tflops: float = _d(
        "the MFU denominator: dense peak TFLOP/s per GPU at the training precision (mixed-GPU plans: the mean over "
        "the GPUs used, weighted by their count)"
    )
    peak_memory_gib: float = _d("the highest predicted per-GPU memory over all stages, GiB (2^30 bytes)")
    memory_capacity_gib: float = _d(
        "usable memory of the GPU holding that peak, GiB: its memory_gib * (1 - memory_margin) (one value for "
        "every stage in one-group plans; mixed-GPU plans: see stages[].memory_capacity_gib)"
    )
    peak_memory_stage: int = _d(
        "index of the stage with the peak memory (within its replica entry when peak_memory_replica is given)"
    )
    peak_memory_replica: int | None = _d(
        "plans with replicas: the replica entry of the peak-memory stage; absent otherwise", None
    )
    layout: LayoutOut = _d("the layout estimated")
    time_breakdown_s: dict[str, float] = _d(
        "seconds per iteration by component; the values add up to iteration_time_s (plans with replicas: the "
        "slowest replica's). Keys: " + _TIME_KEYS
    )
    memory_breakdown_gib: dict[str, float] = _d(
        "per-GPU memory of the peak stage by component, GiB; the values add up to peak_memory_gib. Keys: weights "
        "(parameters), gradients (gradient buffers), optimizer (optimizer states, e.g. Adam moments and fp32 master "
        "weights), activations (stored for the backward pass, all in-flight micro-batches), overhead (CUDA context, "
        "NCCL buffers and allocator fragmentation, see cost_model.calibration)"
    )
    stages: list[StageEstimateOut] = _d(
        "every stage in pipeline order (with replicas: replica entry after replica entry)"
    )
    cost_sources: dict[str, dict[str, str]] = _d(
        "node groups priced from a measured profile (key: index into job.cluster, as a string): per cost component "
        "(layer, embedding, logits, collective <op>, collectives, pipeline sends) where its values came from: "
        "measured, scaled (the analytic value times the profile's median measured/analytic ratio, where no point "
        "covers it), analytic, or several joined by + (some points one way, others another). Empty without profiles"
    )


class Optimality(_Out):
    """What the search proved about this plan."""

    status: Literal["optimal", "feasible"] = _d(
        "optimal: proven the best (for rank k: the k-th best) in the modeled search space; feasible: the best found "
        "before the time limit"
    )
    gap: float = _d(
        "relative gap between the best plan's iteration time and the best lower bound of the layouts "
        "left unexplored, as a fraction (0.02 = 2%); 0 for optimal plans"
    )


class StagePlacement(_Out):
    """The ranks and nodes that host one pipeline stage."""

    stage: int = _d("pipeline stage index (within its replica entry when replica is given)")
    replica: int | None = _d(
        "plans with replicas: the replica entry (index into layout.replicas); absent otherwise", None
    )
    group: int = _d("node group the stage runs on (index into job.cluster)")
    gpu: str = _d("GPU name of that node group (job.cluster[group].gpu.name)")
    first_rank: int = _d("first global rank of the stage (ranks are contiguous, pipeline stage after stage)")
    last_rank: int = _d("last global rank of the stage, inclusive")
    first_node: int = _d("first node of the stage, counted from the first node of its node group, 0-based")
    last_node: int = _d("last node of the stage, inclusive, counted from the first node of its node group")


class GroupIdle(_Out):
    """GPUs of one node group that the plan uses and leaves idle."""

    group: int = _d("node group (index into job.cluster)")
    gpu: str = _d("GPU name of the node group")
    used_gpus: int = _d("GPUs of the group the plan uses")
    idle_gpus: int = _d("GPUs of the group the plan leaves idle")
    idle_reason: str | None = _d("why the idle GPUs are not used; absent when none is idle", None)
    gpus_per_node: int = _d("GPUs per node of the group (job.cluster[group].gpus_per_node)")


class Placement(_Out):
    """Where the plan's ranks run: Megatron-LM's rank order, stage by stage."""

    rank_order: str = _d(
        "order in which parallel dimensions are laid out over global ranks, innermost first "
        "(tp-cp-ep-dp-pp: TP ranks adjacent, pipeline stages outermost)"
    )
    world_size: int = _d("GPUs the plan uses (global ranks 0..world_size-1)")
    idle_gpus: int = _d("GPUs of the cluster the plan leaves idle (cluster GPUs - world_size)")
    gpus_per_node: int | None = _d(
        "GPUs per node; mixed-GPU plans: null when the node groups differ (see groups[].gpus_per_node)"
    )
    stages: list[StagePlacement] = _d("every stage in pipeline order (with replicas: replica entry after entry)")
    groups: list[GroupIdle] | None = _d(
        "mixed-GPU plans: GPUs used and idle per node group; absent in one-group plans", None
    )


class PlanOut(_Out):
    """One plan: a layout, its estimate, what the search proved about it and where its ranks run."""

    rank: int = _d("1 for the fastest plan, then by increasing iteration time")
    layout: LayoutOut = _d("the plan's layout (the same as estimate.layout)")
    estimate: EstimateOut = _d("the cost model's prediction for the layout")
    optimality: Optimality = _d("whether the search proved the plan optimal")
    placement: Placement = _d("the ranks and nodes of each stage")
    equivalent: list[LayoutOut] = _d(
        "layouts the cost model cannot tell apart from this plan (iteration time and peak memory within 0.01%), "
        "in plan order; they are one entry of the top list, so the plans are distinct choices. Only those the "
        "search met are listed (not every tie in the space); empty: none",
        [],
    )


class SearchOut(_Out):
    """How the search went."""

    candidates: int = _d("candidate layouts (parallel degrees and settings) enumerated")
    pruned: int = _d("candidates skipped because a lower bound showed they cannot beat the plans kept")
    solved: int = _d("CP-SAT solves run (layer split and recomputation of a candidate)")
    complete: bool = _d(
        "every candidate was solved or pruned (mixed-GPU search: every mixed-pipeline candidate); "
        "false: see stop_reason"
    )
    stop_reason: Literal["proven", "time_limit", "solve_cap", "heuristic"] = _d(
        "why the plans are or are not proven, most decisive first: proven (the top plans are optimal within the "
        "modeled space); time_limit (--time-limit, or a search phase's share of it, ran out with candidates left "
        "whose bound could beat them); solve_cap (a CP-SAT solve stopped at its per-solve cap, 10% of the search's "
        "time limit and at least 1 s, with its bound below the top plans; a larger --time-limit raises the cap); "
        "heuristic (mixed-GPU search: replica shapes, which are evaluated heuristically, have a bound below the "
        "top plans; more time does not close it)"
    )
    gap: float = _d(
        "relative gap between plan 1's iteration time and the least lower bound not ruled out, as a "
        "fraction (0.02 = 2%); 0 when proven"
    )
    gap_source: Literal["mixed_pipelines", "replica_shapes"] | None = _d(
        "mixed-GPU search: the part of the space whose lower bound sets gap (mixed pipelines, or replicas on "
        "different GPU types); absent when proven and in one-group searches",
        None,
    )
    seconds: float | None = _d("wall-clock seconds the search took; null with --no-timing (byte-identical output)")
    framework: str | None = _d("--framework: the framework whose limits the plans respect; absent otherwise", None)
    unrestricted_best_s: float | None = _d(
        "--framework: seconds per iteration of the best plan without the framework's limits; absent otherwise", None
    )
    single_type_best_s: float | None = _d(
        "mixed-GPU search: seconds per iteration of the best plan on one node group alone; absent otherwise", None
    )
    single_type_group: int | None = _d(
        "mixed-GPU search: the node group (index into job.cluster) of single_type_best_s; absent otherwise", None
    )
    hetero_vs_single_ratio: float | None = _d(
        "mixed-GPU search: best mixed plan's iteration time / single_type_best_s (below 1: mixing is faster); "
        "absent otherwise",
        None,
    )
    single_type_bound_s: float | None = _d(
        "mixed-GPU search: no plan on one node group alone is faster than this many seconds (the single-type "
        "searches stop at the best mixed plan's time; present when none beats it, single_type_best_s is then "
        "absent); absent otherwise",
        None,
    )


# ----------------------------------------------------------------------------- the echoed job (planner.spec.Job)
# One output model per spec model, field for field (tests/test_plan_json.py keeps them in step with planner.spec):
# `parse_job(doc["job"])` rebuilds the Job that was planned.


class MoEOut(_Out):
    """Mixture-of-experts settings of the model."""

    num_experts: int = _d("routed experts per MoE layer")
    top_k: int = _d("routed experts each token is sent to")
    expert_ffn_hidden_size: int = _d("FFN hidden size of one expert")
    shared_experts: int = _d("always-active (shared) experts per MoE layer")
    moe_layer_freq: int = _d("every k-th layer (after first_dense_layers) is an MoE layer")
    first_dense_layers: int = _d("leading layers kept dense (no experts)")


class MLAOut(_Out):
    """Multi-head latent attention of the model (DeepSeek-V2/V3, Kimi K2)."""

    q_lora_rank: int | None = _d("rank of the query latent; null: queries projected from the hidden state directly")
    kv_lora_rank: int = _d("rank of the joint key/value latent")
    qk_nope_head_dim: int = _d("per-head query/key dimension without rotary embedding")
    qk_rope_head_dim: int = _d("per-head query/key dimension carrying RoPE (one rotary key shared by all heads)")
    v_head_dim: int = _d("per-head value dimension")


class ModelOut(_Out):
    """The model's dimensions, resolved (a preset or config.json is written out in full)."""

    name: str = _d("model name (preset name, or 'custom')")
    num_layers: int = _d("transformer layers")
    hidden_size: int = _d("hidden (model) dimension")
    ffn_hidden_size: int = _d("FFN intermediate dimension of the dense layers")
    num_attention_heads: int = _d("query attention heads")
    num_kv_heads: int | None = _d(
        "key/value heads (GQA/MQA); null: num_attention_heads (MHA); with mla: num_attention_heads"
    )
    head_dim: int | None = _d(
        "dimension of one attention head; null: hidden_size / num_attention_heads; with mla: the query/key head "
        "dimension qk_nope_head_dim + qk_rope_head_dim"
    )
    vocab_size: int = _d("vocabulary size (rows of the embedding table)")
    mlp: Literal["gelu", "swiglu", "relu"] = _d("MLP activation: swiglu (gated, three matrices), gelu or relu (two)")
    tie_embeddings: bool = _d("input embedding and output projection share one matrix")
    dropout: bool = _d("hidden/attention dropout on (adds 1-byte masks to the activations)")
    moe: MoEOut | None = _d("mixture-of-experts settings; null for a dense model")
    mla: MLAOut | None = _d("multi-head latent attention; null for MHA/GQA/MQA attention")
    source: str = _d("where the dimensions come from (preset citation, config.json path, or 'user supplied')")


class GpuOut(_Out):
    """One GPU type with its numbers (vendor units: NVLink in GB/s = bytes, NICs in Gb/s = bits)."""

    name: str = _d("GPU name (catalog name or 'custom-gpu')")
    memory_gib: float = _d("memory per GPU, GiB (2^30 bytes)")
    peak_tflops_bf16: float = _d("dense BF16 tensor-core peak, TFLOP/s (10^12 FLOP/s)")
    peak_tflops_fp16: float | None = _d("dense FP16 peak, TFLOP/s; null: peak_tflops_bf16")
    peak_tflops_fp8: float | None = _d("dense FP8 peak, TFLOP/s; null: no FP8 (BF16 rates are used)")
    matmul_tflops_bf16: float | None = _d(
        "measured achievable dense BF16 GEMM rate (MAMF), TFLOP/s; null: 80% of peak_tflops_bf16"
    )
    attention_tflops_bf16: float | None = _d(
        "measured fused (flash) attention rate, forward + backward, TFLOP/s; null: the GEMM rate"
    )
    attention3_tflops_bf16: float | None = _d(
        "rate of FlashAttention-3 / cuDNN fused attention (training.attention: flash3), forward + backward, "
        "TFLOP/s; null: attention_tflops_bf16"
    )
    hbm_tbps: float = _d("HBM bandwidth, TB/s (10^12 bytes/s)")
    intra_node_gbps: float = _d("scale-up (NVLink) bandwidth per GPU per direction, GB/s (10^9 bytes/s)")
    inter_node_gbps: float = _d("scale-out NIC line rate per GPU, Gb/s (10^9 bits/s)")
    gpus_per_node: int = _d("GPUs per node of this GPU type's usual server (the node group's own value holds)")
    source: str = _d("where the numbers come from (datasheet citation or 'user supplied')")


class NodeGroupOut(_Out):
    """Nodes of one GPU type."""

    gpu: GpuOut = _d("the GPU of these nodes")
    nodes: int = _d("nodes in the group")
    gpus_per_node: int = _d("GPUs per node in this group")
    inter_node_gbps: float | None = _d(
        "this group's NIC line rate per GPU, Gb/s, overriding gpu.inter_node_gbps; null: gpu.inter_node_gbps"
    )
    profile: dict | None = _d(
        "the measured profile this group's costs were read from (the profile file's content, docs/profiles.md); "
        "null: priced by the analytic model"
    )


class LinkOut(_Out):
    """The network between the nodes of two node groups."""

    groups: tuple[int, int] = _d("the two node groups joined (indices into cluster)")
    gbps: float = _d("line rate per GPU between the two groups, Gb/s (10^9 bits/s)")


class TrainingOut(_Out):
    """Training settings."""

    seq_length: int = _d("tokens per sequence")
    global_batch_size: int = _d("sequences per iteration (over all data-parallel replicas)")
    precision: Literal["bf16", "fp16", "fp8"] = _d("compute precision of the GEMMs")
    optimizer: Literal["adam", "adamw", "sgd"] = _d("optimizer (its states set the optimizer memory)")
    attention: Literal["flash", "flash3", "eager"] = _d(
        "fused attention, flash (FlashAttention-2 class) or flash3 (FlashAttention-3 / cuDNN fused attention), or "
        "eager (materialized s^2 softmax)"
    )
    cross_entropy: Literal["fused", "unfused"] = _d(
        "loss kernel: fused (vocab-parallel / fused cross-entropy, fp32 logits) or unfused (torch cross_entropy "
        "over upcast logits: bf16 logits, an fp32 copy and the fp32 log-softmax)"
    )
    tp_backward_overlap: bool = _d(
        "the backward's TP collectives run under the weight-gradient GEMMs (Megatron linear layers); false: every "
        "one on the critical path (PyTorch DTensor TP, torchtitan)"
    )
    fp8_saved_inputs: bool = _d(
        "fp8 training: linear layers keep FP8-cast inputs for the backward (Transformer Engine); false: 16-bit "
        "inputs (torchao Float8Linear, torchtitan)"
    )
    fp8_recipe: Literal["delayed", "tensorwise", "rowwise"] = _d(
        "fp8 training: FP8 scaling recipe, delayed (Transformer Engine), tensorwise (dynamic per-tensor: torchao, "
        "Megatron --fp8-recipe tensorwise) or rowwise (torchao per-row); sets the cast traffic priced"
    )
    fp32_params: bool = _d(
        "fp32 parameters that are the optimizer's master copy, 16-bit only while gathered (PyTorch FSDP: torchtitan); "
        "false: 16-bit parameters and an fp32 master copy in the optimizer (Megatron, DeepSpeed)"
    )
    grad_dtype: Literal["fp32", "bf16", "bf16+fp32"] = _d(
        "gradient buffers: fp32 (Megatron main_grad), bf16, or bf16+fp32 (16-bit grads plus an unsharded fp32 "
        "accumulation buffer, DeepSpeed BF16_Optimizer)"
    )


class JobStageOut(_Out):
    """One stage of the job's own layout, as written."""

    layers: int = _d("transformer layers of the stage")
    recompute_layers: int | None = _d(
        "layers of the stage fully recomputed; absent: none beyond layout.recompute", None
    )
    group: int | None = _d("mixed-GPU layout: node group of the stage (index into cluster); absent otherwise", None)
    tp: int | None = _d("mixed-GPU layout: this stage's TP degree; absent otherwise", None)
    gpus: int | None = _d(
        "mixed-GPU layout: GPUs of the stage, tp*cp*dp (tp*cp*count in a replica); absent otherwise", None
    )


class JobReplicaOut(_Out):
    """One replica entry of the job's own layout, as written."""

    stages: list[JobStageOut] = _d("the pipeline's stages in order")
    micro_batches: int = _d("micro-batches per iteration of each of these replicas")
    count: int | None = _d("identical replicas of this pipeline; absent: 1", None)


class JobLayoutOut(_Out):
    """The job's own layout exactly as written in the job file: a field absent here took its default (shown in its
    description). Its resolved degrees are in `current.layout`."""

    tp: int | None = _d("tensor-parallel degree; absent: 1", None)
    pp: int | None = _d("pipeline-parallel degree; absent: 1 (with replicas: their stage count)", None)
    dp: int | None = _d("data-parallel degree; absent or null: GPUs / (tp*pp*cp)", None)
    cp: int | None = _d("context-parallel degree; absent: 1", None)
    ep: int | None = _d("expert-parallel degree; absent: 1", None)
    vpp: int | None = _d("virtual pipeline stages per GPU; absent: 1", None)
    micro_batch_size: int | None = _d("sequences per micro-batch; absent: 1", None)
    sequence_parallel: bool | None = _d("sequence parallelism; absent or null: on when tp > 1", None)
    zero_stage: int | None = _d("ZeRO stage 0-3; absent: 1", None)
    recompute: Recompute | None = _d("activation recomputation; absent: selective", None)
    tp_comm_overlap: bool | None = _d("TP communication overlapped with GEMMs; absent: false", None)
    stages: list[JobStageOut] | None = _d("per-stage layer counts (and placement); absent: an even split", None)
    replicas: list[JobReplicaOut] | None = _d("replica entries that differ in placement; absent: none", None)


class JobOut(_Out):
    """The job planned, resolved: `planner.load.parse_job(doc["job"])` rebuilds it (catalog names written out)."""

    model: ModelOut = _d("the model's dimensions")
    cluster: list[NodeGroupOut] = _d("node groups, each of one GPU type (group indices elsewhere index this list)")
    training: TrainingOut = _d("training settings")
    links: list[LinkOut] = _d("network between node groups; empty: the slower NIC of the two groups")
    layout: JobLayoutOut | None = _d("the job's own layout as written (compared as `current`); null if none")
    calibration: dict | None = _d(
        "the job's own cost-model efficiencies (a `planner calibrate` file; fields left null keep the built-in "
        "value; `source`: the file); null: the built-in calibration (see cost_model)"
    )


class CalibrationOut(_Out):
    """The cost model's fitted efficiencies (planner/data/calibration.yaml), global to all runs."""

    gemm_efficiency: float = _d("fraction (0..1) of the GPU's achievable GEMM rate (MAMF) reached by layer GEMMs")
    attention_efficiency: float = _d("fraction (0..1) of the GPU's fused-attention rate reached")
    hbm_efficiency: float = _d("fraction (0..1) of HBM bandwidth achieved by element-wise kernels")
    nvlink_efficiency: float = _d("ring bus bandwidth / unidirectional NVLink bandwidth, fraction (0..1)")
    network_efficiency: float = _d("NCCL bus bandwidth / NIC line rate, fraction (0..1)")
    dp_overlap: float = _d("share (0..1) of the last micro-batch's backward that hides the DP gradient reduction")
    fsdp_overlap: float = _d("share (0..1) of a micro-batch's compute that hides ZeRO-3 gathers/scatters")
    layer_overhead_s: float = _d("fixed cost per layer pass (kernel launches, framework dispatch), seconds")
    memory_fixed_gib: float = _d("fixed memory per GPU (CUDA context, NCCL buffers), GiB")
    memory_fragmentation: float = _d("allocator cache and fragmentation, fraction of the allocated bytes")


class CostModelOut(_Out):
    """The calibration the estimates were priced with."""

    calibration_file: str | None = _d(
        "where the calibration was read: 'builtin' (the planner's own calibration.yaml) or the override file under "
        "$PLANNER_CATALOG; null: a calibration given in code"
    )
    calibration: CalibrationOut = _d("the calibrated efficiencies")


class WarningOut(_Out):
    """A likely mistake in the job (also printed as `warning:` on stderr)."""

    field: str = _d("the job field concerned, as a path (e.g. cluster[0].gpu.memory_gib)")
    message: str = _d("what looks wrong and what to check")


class _Provenance(_Out):
    job: JobOut = _d('the job, resolved: `planner.load.parse_job(doc["job"])` rebuilds it')
    planner_version: str = _d("version of the planner that wrote this document (planner --version)")
    cost_model: CostModelOut = _d("the cost model's calibration used for every estimate")


class PlanDocument(_Provenance):
    """The JSON of `planner plan --json`, schema_version 1. Self-contained: with the job, cost model, memory margin
    and warnings echoed, a launch script needs no other file. Changes within schema_version 1 are additive (new
    keys) and, for mixed-GPU plans, top-level layout values that stages or replicas contradicted became null
    (layout.tp, layout.sequence_parallel, layout.num_microbatches, placement.gpus_per_node)."""

    schema_version: int = _d("version of this JSON format; a change that is not additive increases it")
    plans: list[PlanOut] = _d("the best plans, fastest first (at most --top)")
    current: EstimateOut | None = _d("the estimate of the job's own layout (job.layout); absent when it has none", None)
    search: SearchOut = _d("statistics of the search")
    memory_margin: float | None = _d(
        "share of each GPU's memory kept free, as a fraction (0.05 = 5%): capacities are memory_gib * "
        "(1 - memory_margin); null: not recorded"
    )
    warnings: list[WarningOut] = _d("likely mistakes in the job (empty: none)")


class EstimateDocument(EstimateOut, _Provenance):
    """The JSON of `planner estimate --json`: the estimate of the job's layout, with the same echo as the plan
    document."""

    memory_margin: float | None = _d(
        "share of each GPU's memory kept free, as a fraction (0.05 = 5%); null: not recorded", None
    )
    warnings: list[WarningOut] = _d("likely mistakes in the job (empty: none)", [])


def placement(job: Job, est: Estimate) -> dict:
    """Which ranks and nodes host each pipeline stage under Megatron's tp-cp-ep-dp-pp order (PP outermost)."""
    d = est.dims
    if isinstance(d, ReplicaDims):
        return replica_placement(job, d)
    if isinstance(d, HeteroDims):
        return hetero_placement(job, d)
    group = job.cluster[0]
    per_stage = d.tp * d.cp * d.dp
    gpn = group.gpus_per_node
    stages = []
    for s in range(d.pp):
        first, last = s * per_stage, (s + 1) * per_stage - 1
        stages.append(
            {
                "stage": s,
                "group": 0,
                "gpu": group.gpu.name,
                "first_rank": first,
                "last_rank": last,
                "first_node": first // gpn,
                "last_node": last // gpn,
            }
        )
    return {
        "rank_order": RANK_ORDER,
        "world_size": d.world,
        "idle_gpus": job.num_gpus - d.world,
        "gpus_per_node": gpn,
        "stages": stages,
    }


def hetero_placement(job: Job, d: HeteroDims) -> dict:
    """Stage s takes the next tp_s*cp*dp GPUs of its node group (groups numbered from their own first node);
    global ranks run over the stages in pipeline order (PP outermost). GPUs a group does not use stay idle."""
    return _placed(job, d, [(None, d)])


def replica_placement(job: Job, d: ReplicaDims) -> dict:
    """As hetero_placement, replica entry after replica entry (each entry's stages in pipeline order)."""
    return _placed(job, d, list(enumerate(d.replicas)))


def _placed(job: Job, d, pipelines) -> dict:
    stages, rank, nxt = [], 0, {}
    for r, pipe in pipelines:
        for s, (g, tp) in enumerate(zip(pipe.stage_groups, pipe.stage_tp)):
            grp = job.cluster[g]
            n = tp * pipe.cp * pipe.dp
            local = nxt.get(g, 0)
            nxt[g] = local + n
            stages.append(
                {
                    "stage": s,
                    **({"replica": r} if r is not None else {}),
                    "group": g,
                    "gpu": grp.gpu.name,
                    "first_rank": rank,
                    "last_rank": rank + n - 1,
                    "first_node": local // grp.gpus_per_node,
                    "last_node": (local + n - 1) // grp.gpus_per_node,
                }
            )
            rank += n
    used = d.gpus_by_group()
    groups = []
    for g, grp in enumerate(job.cluster):
        idle = grp.num_gpus - used[g]
        groups.append(
            {
                "group": g,
                "gpu": grp.gpu.name,
                "gpus_per_node": grp.gpus_per_node,
                "used_gpus": used[g],
                "idle_gpus": idle,
                **({"idle_reason": idle_reason(d, pipelines, g, idle)} if idle else {}),
            }
        )
    return {
        "rank_order": RANK_ORDER,
        "world_size": d.world,
        "idle_gpus": job.num_gpus - d.world,
        "gpus_per_node": _common({grp.gpus_per_node for grp in job.cluster}),
        "stages": stages,
        "groups": groups,
    }


def _common(values: set):
    """The one value all entries share, else None (a top-level field never contradicts a per-entry one)."""
    return next(iter(values)) if len(values) == 1 else None


def idle_reason(d, pipelines, g: int, idle: int) -> str:
    """Why a node group's GPUs stay idle: too few for one more stage (or replica) of the plan's shape, or using
    them would not be faster (the search compared the plans that do)."""
    if not any(g in pipe.stage_groups for _, pipe in pipelines):
        return "the group is left out: no plan that uses it is faster"
    sizes = sorted(
        {tp * pipe.cp * pipe.dp for _, pipe in pipelines for gg, tp in zip(pipe.stage_groups, pipe.stage_tp) if gg == g}
    )
    if isinstance(d, ReplicaDims):
        pipe = next(p for _, p in pipelines if g in p.stage_groups)
        need = sum(tp * pipe.cp for tp in pipe.stage_tp)
        if idle < need:
            return f"one more replica needs {need} GPUs, {idle} are left"
    elif idle < min(sizes):
        return f"one more stage needs {min(sizes)} GPUs (tp*cp*dp), {idle} are left"
    return "a plan that also uses them is not faster (more stages add pipeline sends and fill time)"


def _search_extras(result: SearchResult, framework: str | None) -> dict:
    out = {}
    if framework:
        out["framework"] = framework
    if result.unrestricted_best_s is not None:
        out["unrestricted_best_s"] = round(result.unrestricted_best_s, 6)
    if result.single_type_best_s is not None:
        out["single_type_best_s"] = round(result.single_type_best_s, 6)
        out["single_type_group"] = result.single_type_group
        if result.plans:
            out["hetero_vs_single_ratio"] = round(result.plans[0].time / result.single_type_best_s, 4)
    if result.single_type_bound_s is not None:
        out["single_type_bound_s"] = round(result.single_type_bound_s, 6)
    return out


def estimate_document(job: Job, est: Estimate, *, memory_margin: float, warnings: Iterable = ()) -> dict:
    """The `planner estimate --json` document (EstimateDocument): the estimate of the job's layout with the same
    echo as the plan document (job, planner version, cost model, memory margin, warnings)."""
    doc = {
        **est.to_json(),
        **provenance(job, est.calibration),
        "memory_margin": float(memory_margin),
        "warnings": warnings_json(warnings),
    }
    EstimateDocument.model_validate(doc)  # the output always matches its published schema
    return doc


def plan_document(
    job: Job,
    result: SearchResult,
    current: Estimate | None,
    timing: bool = True,
    framework: str | None = None,
    *,
    memory_margin: float | None = None,
    warnings: Iterable = (),
) -> dict:
    """The `planner plan --json` document (PlanDocument). ``memory_margin``: the share of GPU memory the search
    kept free (null when not given); ``warnings``: objects with ``.field`` and ``.message`` (planner.sanity)."""
    plans = []
    for rank, plan in enumerate(result.plans, start=1):
        est = plan.estimate.to_json()
        gap = 0.0 if plan.status == "optimal" else round(result.gap, 6)
        plans.append(
            {
                "rank": rank,
                "layout": est["layout"],
                "estimate": est,
                "optimality": {"status": plan.status, "gap": gap},
                "placement": placement(job, plan.estimate),
                "equivalent": [e.estimate.to_json()["layout"] for e in plan.equivalent],
            }
        )
    doc = {
        "schema_version": SCHEMA_VERSION,
        "plans": plans,
        "search": {
            "candidates": result.candidates,
            "pruned": result.pruned,
            "solved": result.solved,
            "complete": result.complete,
            "seconds": round(result.seconds, 3) if timing else None,
            "stop_reason": result.stop_reason,
            "gap": round(result.gap, 6),
            **({"gap_source": result.gap_source} if result.gap_source else {}),
            **_search_extras(result, framework),
        },
        **provenance(
            job,
            next(
                (
                    e.calibration
                    for e in [*(p.estimate for p in result.plans), current]
                    if e is not None and e.calibration is not None
                ),
                None,
            ),
        ),
        "memory_margin": None if memory_margin is None else float(memory_margin),
        "warnings": warnings_json(warnings),
    }
    if current is not None:
        doc["current"] = current.to_json()
    PlanDocument.model_validate(doc)  # the output always matches its published schema
    return doc


def plan_schema() -> dict:
    schema = PlanDocument.model_json_schema()
    schema["$id"] = f"https://planner.dev/schemas/plan-v{SCHEMA_VERSION}.json"
    schema["title"] = f"planner plan output, schema_version {SCHEMA_VERSION}"
    return schema


def estimate_schema() -> dict:
    """JSON Schema of `planner estimate --json` (EstimateDocument)."""
    schema = EstimateDocument.model_json_schema()
    schema["$id"] = f"https://planner.dev/schemas/estimate-v{SCHEMA_VERSION}.json"
    schema["title"] = f"planner estimate output, schema_version {SCHEMA_VERSION}"
    return schema
