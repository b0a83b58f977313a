"""An independent checker of mixed-GPU plans (stages on node groups, or replicas on different groups).

Like tests/invariants.py it re-derives every rule from the job alone and imports nothing from planner.parallel,
planner.search or planner.cost. Its input is one plan entry of the ``planner plan --json`` document.

``check_mixed_plan(job, plan, memory_margin)`` returns a list of violations (empty = all good).
"""

from __future__ import annotations

import math

MEM_ROUND = 0.5e-3
EPS = 1e-6


def _pos_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def pipelines(lay: dict) -> list[dict]:
    """The layout as a list of {count, micro_batches, stages}: one entry for a mixed pipeline replicated dp
    times, one per replica entry otherwise."""
    if lay.get("replicas"):
        return lay["replicas"]
    return [{"count": lay.get("dp"), "micro_batches": lay.get("num_microbatches"), "stages": lay.get("stages") or []}]


def check_mixed_layout(job, lay: dict) -> list[str]:
    v: list[str] = []
    m, t = job.model, job.training
    L = m.num_layers
    kv = m.num_kv_heads or m.num_attention_heads
    cp, mbs = lay.get("cp"), lay.get("micro_batch_size")
    if not (_pos_int(cp) and _pos_int(mbs)):
        return [f"cp {cp!r} / micro_batch_size {mbs!r} not positive integers"]
    ep = lay.get("ep")
    vpp = lay.get("vpp")
    if not _pos_int(vpp):
        v.append(f"vpp {vpp!r} not a positive integer")
        vpp = 1
    if vpp > 1 and lay.get("replicas"):
        v.append(f"replicas with vpp={vpp} (only a mixed pipeline interleaves)")
    if not _pos_int(ep):
        v.append(f"ep {ep!r} not a positive integer")
        ep = 1
    if ep > 1 and m.moe is None:
        v.append(f"ep {ep} on a model without experts")
    elif ep > 1 and m.moe.num_experts % ep:
        v.append(f"ep {ep} does not split the {m.moe.num_experts} experts evenly")
    if cp > 1 and t.seq_length % (2 * cp):
        v.append(f"seq_length {t.seq_length} not divisible by 2*cp = {2 * cp}")
    if bool(lay.get("stages")) == bool(lay.get("replicas")):
        v.append("a mixed layout lists exactly one of stages and replicas")
    pipes = pipelines(lay)
    used = [0] * len(job.cluster)
    sequences = 0
    first = pipes[0].get("stages") or []
    for r, pipe in enumerate(pipes):
        count, micro, stages = pipe.get("count"), pipe.get("micro_batches"), pipe.get("stages") or []
        if not (_pos_int(count) and _pos_int(micro)) or not stages:
            v.append(f"pipeline {r}: count {count!r}, micro_batches {micro!r}, {len(stages)} stages")
            continue
        sequences += mbs * count * micro
        # an expert group is made of ranks that hold the same stage: the count*cp data/context-parallel copies of
        # the pipeline in this entry (expert all-to-alls run every micro-batch, so no group mixes two entries)
        if (count * cp) % ep:
            v.append(f"pipeline {r}: ep {ep} does not divide its count*cp = {count}*{cp} ranks per stage")
        if [s.get("layers") for s in stages] != [s.get("layers") for s in first]:
            v.append(f"pipeline {r}: layers per stage differ from pipeline 0")
        if [s.get("tp") for s in stages] != [s.get("tp") for s in first]:
            v.append(f"pipeline {r}: tp per stage differs from pipeline 0")
        layers = [s.get("layers") for s in stages]
        if any(not _pos_int(n) for n in layers) or sum(layers) != L:
            v.append(f"pipeline {r}: stage layers {layers} do not sum to {L} with every stage >= 1")
        # interleaving: each stage runs vpp model chunks of equal size, and the interleaved schedule takes the
        # micro-batches in rounds of one per stage
        if vpp > 1:
            if len(stages) < 2:
                v.append(f"pipeline {r}: vpp {vpp} without a pipeline (one stage)")
            if any(_pos_int(n) and n % vpp for n in layers):
                v.append(f"pipeline {r}: stage layers {layers} not whole chunks of vpp = {vpp}")
            if micro % len(stages):
                v.append(f"pipeline {r}: {micro} micro-batches not a multiple of its {len(stages)} stages (vpp {vpp})")
        order = []
        for i, s in enumerate(stages):
            g, tp, gpus = s.get("group"), s.get("tp"), s.get("gpus")
            if not (isinstance(g, int) and 0 <= g < len(job.cluster)) or not _pos_int(tp):
                v.append(f"pipeline {r} stage {i}: group {g!r} / tp {tp!r}")
                continue
            order.append(g)
            grp = job.cluster[g]
            if grp.gpus_per_node % tp:
                v.append(f"pipeline {r} stage {i}: tp {tp} does not divide {grp.gpus_per_node} GPUs per node")
            if m.num_attention_heads % tp or (kv % tp and tp % kv):
                v.append(f"pipeline {r} stage {i}: tp {tp} does not shard {m.num_attention_heads}/{kv} heads")
            if tp > 1 and (t.seq_length // cp) % tp:
                v.append(f"pipeline {r} stage {i}: sequence shard {t.seq_length // cp} not divisible by tp {tp}")
            if gpus != tp * cp * count:
                v.append(f"pipeline {r} stage {i}: gpus {gpus!r} != tp*cp*count = {tp * cp * count}")
            rec = s.get("recompute_layers")
            if rec is not None and not (isinstance(rec, int) and 0 <= rec <= (s.get("layers") or 0)):
                v.append(f"pipeline {r} stage {i}: recompute_layers {rec!r}")
            used[g] += tp * cp * count
        runs = [g for i, g in enumerate(order) if i == 0 or order[i - 1] != g]
        if len(runs) != len(set(runs)):
            v.append(f"pipeline {r}: the stages of a node group are not consecutive ({order})")
    if sequences != t.global_batch_size:
        v.append(
            f"micro_batch_size * sum(count * micro_batches) = {sequences} != global_batch_size {t.global_batch_size}"
        )
    for g, n in enumerate(used):
        if n > job.cluster[g].nodes * job.cluster[g].gpus_per_node:
            v.append(f"group {g}: {n} GPUs used, it has {job.cluster[g].nodes * job.cluster[g].gpus_per_node}")
    return v


def check_mixed_plan(job, p: dict, memory_margin: float) -> list[str]:
    lay = p.get("layout") or {}
    v = check_mixed_layout(job, lay)
    if v:
        return v
    est = p.get("estimate") or {}
    if est.get("fits") is not True:
        v.append(f"estimate.fits = {est.get('fits')!r}")
    it = est.get("iteration_time_s")
    if not (isinstance(it, float) and math.isfinite(it) and it > 0):
        v.append(f"iteration_time_s = {it!r}")
    # every stage (of every replica entry) within ITS OWN GPU's capacity, read from the job
    expected = [
        (r if lay.get("replicas") else None, i, s["group"])
        for r, pipe in enumerate(pipelines(lay))
        for i, s in enumerate(pipe["stages"])
    ]
    stages = est.get("stages") or []
    if [(s.get("replica"), s.get("index"), s.get("group")) for s in stages] != expected:
        v.append("estimate stages do not follow the layout's (replica, stage, group) order")
    for s, (_, i, g) in zip(stages, expected):
        cap = job.cluster[g].gpu.memory_gib * (1 - memory_margin)
        if s.get("peak_memory_gib", math.inf) > cap + MEM_ROUND + EPS:
            v.append(f"stage {i} on group {g}: peak {s.get('peak_memory_gib')} GiB > capacity {cap:.3f} GiB")
    place = p.get("placement") or {}
    groups = place.get("groups") or []
    world = sum(s["gpus"] for pipe in pipelines(lay) for s in pipe["stages"])
    if place.get("world_size") != world:
        v.append(f"placement.world_size {place.get('world_size')!r} != {world} GPUs in the stages")
    for gi in groups:
        g = gi.get("group")
        total = job.cluster[g].nodes * job.cluster[g].gpus_per_node
        if gi.get("used_gpus", -1) + gi.get("idle_gpus", -1) != total:
            v.append(f"placement group {g}: used + idle != {total}")
    if place.get("idle_gpus") != sum(gi.get("idle_gpus", 0) for gi in groups):
        v.append("placement.idle_gpus is not the sum over groups")
    nxt = 0
    for s in place.get("stages") or []:
        if s.get("first_rank") != nxt:
            v.append(f"placement ranks not contiguous at stage {s.get('stage')}")
            break
        nxt = s["last_rank"] + 1
    if nxt != world:
        v.append(f"placement covers {nxt} ranks, the plan uses {world}")
    return v
