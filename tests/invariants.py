"""An independent checker of `planner plan` output.

It re-derives every rule a plan must obey from the job alone and does NOT import planner.parallel,
planner.search or planner.cost: a bug in the rules there cannot hide a bug in the plans here. Its inputs are a
parsed Job (planner.spec; only its plain fields are read) and the plan JSON document produced by
``planner plan --json`` / ``planner.report.plan_json.plan_document``.

GPUs used: all of the job's, or (when the placement reports ``idle_gpus``) all but whole idle nodes.

``check_plan(job, doc, memory_margin)`` returns a list of human-readable violations (empty = all good).
``check_result(job, result, memory_margin)`` checks the in-memory SearchResult (unrounded numbers) by attribute
access only.
"""

from __future__ import annotations

import math
from typing import Any

GIB = 1024**3
RANK_ORDER = "tp-cp-ep-dp-pp"
# The JSON rounds memory to 3 decimals (GiB) and times to 6: comparisons against the document allow half a unit
# of the last printed digit on top of the 1e-6 slack. The unrounded numbers are checked at 1e-6 by check_result.
MEM_ROUND = 0.5e-3
TIME_ROUND = 0.5e-6
MFU_ROUND, TFLOPS_ROUND = 0.5e-4, 0.5e-2  # half a unit of the JSON's 4 decimals of MFU, 2 of TFLOP/s
EPS = 1e-6


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def capacity_gib(job, memory_margin: float) -> float:
    return job.cluster[0].gpu.memory_gib * (1 - memory_margin)


def job_gpus(job) -> int:
    return sum(g.nodes * g.gpus_per_node for g in job.cluster)


def gpus_used(job, place: dict | None) -> tuple[int, list[str]]:
    """GPUs a plan uses, and violations of the idle-node accounting.

    A plan uses every GPU of the job unless its placement reports ``idle_gpus`` (whole nodes left idle when an
    awkward node count has no usable degrees); then ``world_size + idle_gpus`` must be the job's GPUs."""
    total = job_gpus(job)
    if not place or "idle_gpus" not in place:
        return total, []
    idle, gpn = place["idle_gpus"], job.cluster[0].gpus_per_node
    if not isinstance(idle, int) or isinstance(idle, bool) or not 0 <= idle < total:
        return total, [f"placement.idle_gpus = {idle!r} not in 0..{total - 1}"]
    v = [] if idle % gpn == 0 else [f"idle_gpus {idle} is not a whole number of {gpn}-GPU nodes"]
    return total - idle, v


def check_layout(job, lay: dict, allow_cross_node_tp: bool | None = None, world: int | None = None) -> list[str]:
    """Every degree rule, re-derived from the job. ``lay`` is a plan's ``layout`` mapping; ``world`` the GPUs the
    plan uses (default: all of the job's)."""
    v: list[str] = []
    m, t = job.model, job.training
    group = job.cluster[0]
    world = job_gpus(job) if world is None else world
    L = m.num_layers
    kv = m.num_kv_heads or m.num_attention_heads

    for key in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "num_microbatches"):
        if not _pos_int(lay.get(key)):
            v.append(f"layout.{key} = {lay.get(key)!r} is not a positive integer")
    if v:
        return v
    tp, pp, dp, cp, ep, vpp = (lay[k] for k in ("tp", "pp", "dp", "cp", "ep", "vpp"))
    mbs, nmb = lay["micro_batch_size"], lay["num_microbatches"]

    if tp * pp * dp * cp != world:
        v.append(f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {tp * pp * dp * cp} != {world} GPUs")

    stages = lay.get("stages")
    if not isinstance(stages, list) or len(stages) != pp:
        v.append(f"layout.stages has {len(stages) if isinstance(stages, list) else stages!r} entries, pp = {pp}")
        stages = stages if isinstance(stages, list) else []
    layers = [s.get("layers") for s in stages]
    if any(not _pos_int(n) for n in layers):
        v.append(f"stage layer counts {layers} include one < 1 or not an integer")
    elif sum(layers) != L:
        v.append(f"stage layers {layers} sum to {sum(layers)}, the model has {L}")
    for i, s in enumerate(stages):
        r = s.get("recompute_layers")
        if r is not None and (not isinstance(r, int) or r < 0 or (_pos_int(s.get("layers")) and r > s["layers"])):
            v.append(f"stage {i}: recompute_layers {r!r} not within 0..{s.get('layers')}")
        extra = set(s) - {"layers", "recompute_layers"}
        if extra:
            v.append(f"stage {i}: unexpected keys {sorted(extra)}")
    if lay.get("recompute") == "full" and any(s.get("recompute_layers") is not None for s in stages):
        v.append("recompute = full together with per-stage recompute_layers")

    if t.global_batch_size != mbs * nmb * dp:
        v.append(f"global_batch_size {t.global_batch_size} != micro_batch_size*num_microbatches*dp = {mbs}*{nmb}*{dp}")

    if m.num_attention_heads % tp:
        v.append(f"num_attention_heads {m.num_attention_heads} not divisible by tp {tp}")
    if kv % tp and tp % kv:
        v.append(f"num_kv_heads {kv} and tp {tp} do not divide one another")

    if m.moe is not None:
        if m.moe.num_experts % ep:
            v.append(f"num_experts {m.moe.num_experts} not divisible by ep {ep}")
        if (dp * cp) % ep:
            v.append(f"ep {ep} does not divide dp*cp = {dp * cp}")
    elif ep != 1:
        v.append(f"ep = {ep} on a dense model")

    if vpp > 1:
        if pp == 1:
            v.append(f"vpp = {vpp} with pp = 1")
        bad = [n for n in layers if _pos_int(n) and n % vpp]
        if bad:
            v.append(f"stage layer counts {bad} not divisible by vpp {vpp}")
        if nmb % pp:
            v.append(f"interleaved schedule: num_microbatches {nmb} not divisible by pp {pp}")

    if t.seq_length % cp:
        v.append(f"seq_length {t.seq_length} not divisible by cp {cp}")
    elif cp > 1 and t.seq_length % (2 * cp):
        v.append(f"seq_length {t.seq_length} not divisible by 2*cp = {2 * cp} (load-balanced CP)")

    sp = lay.get("sequence_parallel")
    if not isinstance(sp, bool):
        v.append(f"sequence_parallel = {sp!r} is not a boolean")
    elif sp:
        if tp == 1:
            v.append("sequence_parallel with tp = 1")
        elif (t.seq_length // cp) % tp:
            v.append(f"sequence shard {t.seq_length // cp} not divisible by tp {tp} (sequence parallel)")
    if lay.get("tp_comm_overlap") and tp == 1:
        v.append("tp_comm_overlap with tp = 1")
    if lay.get("zero_stage") not in (0, 1, 2, 3):
        v.append(f"zero_stage = {lay.get('zero_stage')!r} not in 0..3")
    elif t.grad_dtype == "bf16+fp32" and lay["zero_stage"] > 1:  # BF16_Optimizer: its fp32 buffer is never sharded
        v.append(f"bf16+fp32 gradients at ZeRO stage {lay['zero_stage']} (BF16_Optimizer runs at 0-1)")
    if lay.get("recompute") not in ("none", "selective", "op", "full"):  # (op: torchtitan's per-op SAC)
        v.append(f"recompute = {lay.get('recompute')!r}")
    if allow_cross_node_tp is False and tp > group.gpus_per_node:
        v.append(f"tp {tp} spans nodes of {group.gpus_per_node} GPUs without --allow-cross-node-tp")
    return v


def check_estimate(job, est: dict, lay: dict, memory_margin: float) -> list[str]:
    v: list[str] = []
    cap = capacity_gib(job, memory_margin)
    t = job.training
    if est.get("layout") != lay:
        v.append("estimate.layout differs from the plan's layout")
    if est.get("fits") is not True:
        v.append(f"estimate.fits = {est.get('fits')!r}")
    it = est.get("iteration_time_s")
    if not _finite(it) or it <= 0:
        v.append(f"iteration_time_s = {it!r} is not positive and finite")
    stages = est.get("stages") or []
    pp = lay.get("pp")
    if len(stages) != pp:
        v.append(f"estimate has {len(stages)} stages, pp = {pp}")
    lay_stages = lay.get("stages") or []
    peaks = []
    for i, s in enumerate(stages):
        if s.get("index") != i:
            v.append(f"estimate.stages[{i}].index = {s.get('index')!r}")
        if i < len(lay_stages) and s.get("layers") != lay_stages[i].get("layers"):
            v.append(
                f"estimate.stages[{i}].layers = {s.get('layers')} but the layout says {lay_stages[i].get('layers')}"
            )
        peak = s.get("peak_memory_gib")
        if not _finite(peak) or peak <= 0:
            v.append(f"stage {i}: peak_memory_gib = {peak!r}")
            continue
        peaks.append(peak)
        if peak > cap + MEM_ROUND + EPS:
            v.append(
                f"stage {i}: predicted peak {peak} GiB > capacity {cap:.6f} GiB "
                f"({job.cluster[0].gpu.memory_gib} GiB * (1 - {memory_margin}))"
            )
        mt = s.get("microbatch_time_s")
        if not _finite(mt) or mt < 0:
            v.append(f"stage {i}: microbatch_time_s = {mt!r}")
    if peaks:
        top = est.get("peak_memory_gib")
        if not _finite(top) or abs(top - max(peaks)) > EPS:
            v.append(f"peak_memory_gib {top!r} != max stage peak {max(peaks)}")
        elif not (
            isinstance(est.get("peak_memory_stage"), int)
            and 0 <= est["peak_memory_stage"] < len(stages)
            and stages[est["peak_memory_stage"]].get("peak_memory_gib") == top
        ):
            v.append(f"peak_memory_stage {est.get('peak_memory_stage')!r} is not a stage with the peak {top}")
    capj = est.get("memory_capacity_gib")
    if not _finite(capj) or abs(capj - cap) > MEM_ROUND + EPS:
        v.append(f"memory_capacity_gib {capj!r} != {cap:.6f}")
    if _finite(it) and it > TIME_ROUND:
        tps = est.get("tokens_per_s")
        want = t.global_batch_size * t.seq_length
        lo, hi = want / (it + TIME_ROUND) - 0.05, want / (it - TIME_ROUND) + 0.05
        if not _finite(tps) or not (lo * (1 - 1e-9) <= tps <= hi * (1 + 1e-9)):
            v.append(f"tokens_per_s {tps!r} != global_batch*seq/iteration_time = {want / it:.1f}")
    mfu, achieved, peak = est.get("mfu"), est.get("model_tflops_per_gpu"), est.get("mfu_peak_tflops")
    # the JSON keeps 4 decimals of it (planner.cost.estimate.Estimate.to_json): 0.0 only where the achieved TFLOP/s
    # (2 decimals) are below half a unit of that over the peak (a tiny model on many GPUs)
    tiny = _finite(achieved) and _finite(peak) and achieved <= MFU_ROUND * peak + TFLOPS_ROUND
    if not _finite(mfu) or mfu < 0 or mfu > 1.0 or (mfu == 0 and not tiny):
        v.append(f"mfu = {mfu!r} outside (0, 1]")
    for name, table in (
        ("time_breakdown_s", est.get("time_breakdown_s")),
        ("memory_breakdown_gib", est.get("memory_breakdown_gib")),
    ):
        if not isinstance(table, dict):
            v.append(f"{name} missing")
            continue
        bad = {k: x for k, x in table.items() if not _finite(x) or x < 0}
        if bad:
            v.append(f"{name} has negative or non-finite entries {bad}")
    return v


def check_placement(job, place: dict, lay: dict) -> list[str]:
    group = job.cluster[0]
    world, v = gpus_used(job, place)
    gpn = group.gpus_per_node
    if place.get("world_size") != world:
        v.append(
            f"placement.world_size = {place.get('world_size')!r}, the plan uses {world} of the job's "
            f"{job_gpus(job)} GPUs"
        )
    if place.get("rank_order") != RANK_ORDER:
        v.append(f"placement.rank_order = {place.get('rank_order')!r}")
    if place.get("gpus_per_node") != gpn:
        v.append(f"placement.gpus_per_node = {place.get('gpus_per_node')!r}, the job has {gpn}")
    stages = place.get("stages") or []
    if len(stages) != lay.get("pp"):
        v.append(f"placement has {len(stages)} stages, pp = {lay.get('pp')}")
    per_stage = (lay.get("tp") or 0) * (lay.get("cp") or 0) * (lay.get("dp") or 0)
    nxt = 0
    for i, s in enumerate(stages):
        a, b = s.get("first_rank"), s.get("last_rank")
        if s.get("stage") != i:
            v.append(f"placement.stages[{i}].stage = {s.get('stage')!r}")
        if a != nxt:
            v.append(f"placement stage {i} starts at rank {a!r}, expected {nxt} (contiguous, in order)")
        if not isinstance(a, int) or not isinstance(b, int) or b < a:
            v.append(f"placement stage {i}: ranks {a!r}..{b!r}")
            break
        if b - a + 1 != per_stage:
            v.append(f"placement stage {i} holds {b - a + 1} ranks, tp*cp*dp = {per_stage}")
        if s.get("first_node") != a // gpn or s.get("last_node") != b // gpn:
            v.append(
                f"placement stage {i}: nodes {s.get('first_node')}..{s.get('last_node')} for ranks {a}..{b}"
                f" with {gpn} GPUs per node"
            )
        if s.get("gpu") != group.gpu.name or s.get("group") != 0:
            v.append(f"placement stage {i}: gpu/group {s.get('gpu')!r}/{s.get('group')!r}")
        nxt = b + 1
    if stages and nxt != world:
        v.append(f"placement covers ranks 0..{nxt - 1}, the plan uses {world} GPUs")
    return v


def check_plan(
    job, plan_dict: dict, memory_margin: float, *, allow_cross_node_tp: bool | None = None, top: int | None = None
) -> list[str]:
    """Violations of a plan document (``{"plans": [...], ...}``) or of one plan entry."""
    if "plans" not in plan_dict:
        return _check_one(job, plan_dict, memory_margin, allow_cross_node_tp)
    v: list[str] = []
    plans = plan_dict["plans"]
    if top is not None and len(plans) > top:
        v.append(f"{len(plans)} plans, more than top = {top}")
    ranks = [p.get("rank") for p in plans]
    if ranks != list(range(1, len(plans) + 1)):
        v.append(f"ranks {ranks} are not 1..{len(plans)}")
    times = [p.get("estimate", {}).get("iteration_time_s") for p in plans]
    if all(_finite(x) for x in times) and times != sorted(times):
        v.append(f"plans not sorted by iteration time: {times}")
    seen: dict[str, int] = {}
    for p in plans:
        key = repr(sorted(p.get("layout", {}).items()))
        if key in seen:
            v.append(f"plan {p.get('rank')}: same layout as plan {seen[key]}")
        seen.setdefault(key, p.get("rank"))
        v += [f"plan {p.get('rank')}: {msg}" for msg in _check_one(job, p, memory_margin, allow_cross_node_tp)]
    return v


def _check_one(job, p: dict, memory_margin: float, allow_cross_node_tp: bool | None) -> list[str]:
    lay = p.get("layout")
    if not isinstance(lay, dict):
        return ["no layout"]
    world, _ = gpus_used(job, p.get("placement"))
    v = check_layout(job, lay, allow_cross_node_tp, world)
    v += check_estimate(job, p.get("estimate") or {}, lay, memory_margin)
    v += check_placement(job, p.get("placement") or {}, lay)
    opt = p.get("optimality") or {}
    status, gap = opt.get("status"), opt.get("gap")
    if status not in ("optimal", "feasible"):
        v.append(f"optimality.status = {status!r}")
    if not _finite(gap) or gap < 0 or gap > 1:
        v.append(f"optimality.gap = {gap!r} not in [0, 1]")
    elif status == "optimal" and gap != 0:
        v.append(f"optimal plan with gap {gap}")
    return v


def check_proof(result) -> list[str]:
    """Each plan's status says what the search proved of its top list: optimal (with its equivalents) where it
    stopped with the top K proven, feasible otherwise."""
    want = "optimal" if result.stop_reason == "proven" else "feasible"
    return [
        f"plan {k}: status {q.status}, the search stopped {result.stop_reason}"
        for k, p in enumerate(result.plans, start=1)
        for q in (p, *p.equivalent)
        if q.status != want
    ]


def check_result(job, result, memory_margin: float, *, top: int | None = None) -> list[str]:
    """The in-memory SearchResult, unrounded: every stage's peak within capacity + 1e-6 GiB, fits, finite and
    sorted times. Reads attributes only (no planner.cost import)."""
    v: list[str] = []
    cap = capacity_gib(job, memory_margin)
    plans = list(result.plans)
    if top is not None and len(plans) > top:
        v.append(f"{len(plans)} plans, more than top = {top}")
    times = [p.estimate.iteration_time_s for p in plans]
    if times != sorted(times):
        v.append(f"result plans not sorted by iteration time: {times}")
    if not _finite(result.gap) or result.gap < 0:
        v.append(f"result.gap = {result.gap!r}")
    v += check_proof(result)
    for k, p in enumerate(plans, start=1):
        est = p.estimate
        if not _finite(est.iteration_time_s) or est.iteration_time_s <= 0:
            v.append(f"plan {k}: iteration_time_s = {est.iteration_time_s!r}")
        if not est.fits:
            v.append(f"plan {k}: estimate.fits is False")
        if abs(est.capacity_gib - cap) > EPS:
            v.append(f"plan {k}: capacity_gib {est.capacity_gib} != {cap}")
        if est.dims.world > job_gpus(job) or (job_gpus(job) - est.dims.world) % job.cluster[0].gpus_per_node:
            v.append(f"plan {k}: uses {est.dims.world} of {job_gpus(job)} GPUs (not whole nodes)")
        if len(est.stages) != est.dims.pp:
            v.append(f"plan {k}: {len(est.stages)} stage estimates, pp = {est.dims.pp}")
        for s in est.stages:
            gib = s.peak_bytes / GIB
            if not math.isfinite(gib) or gib > cap + EPS:
                v.append(f"plan {k}: stage {s.index} peak {gib:.9f} GiB > capacity {cap:.9f} GiB")
    return v
