"""Every lower bound of the searches is at most the evaluated time of every plan it covers, checked against brute
force (every layer split and recompute count, evaluated by the estimator) on small jobs:
  - homogeneous: the candidate bound of the enumeration (space.py), StageModel.lower_bound, quick.lower_bound
    (with and without memory, and probed at a cutoff), quick.integer_bottleneck and quick.memory_bottleneck (on
    the slowest stage), quick.forced_recompute (on the recomputed layers);
  - mixed pipelines: the bound of every _TpChoiceNode and _Family box on the way to a candidate, and the candidate's
    refined bound (mixed_pipeline_bounds.refined_bound, also probed at a target)."""

import bisect
import dataclasses
import itertools
import math
import random
from dataclasses import dataclass

import pytest
from strategies import SMALL_MOE

from planner.cost.estimate import evaluate_plans, evaluate_stages, with_group_sends
from planner.cost.forms import StagePlan
from planner.cost.memory import GIB
from planner.cost.provider import cost_source
from planner.cost.stage import StageModel, split_kinds
from planner.load import parse_job
from planner.parallel import group_order
from planner.search import mixed_pipeline_bounds, mixed_pipelines, quick
from planner.search.mixed_context import MixedContext
from planner.search.mixed_pipeline_bounds import refined_bound
from planner.search.space import SearchOptions, dims_for, enumerate_candidates

SLACK = 1 + 1e-9  # float rounding between a bound and the estimator

GPT6 = {
    "name": "gpt-6",
    "num_layers": 6,
    "hidden_size": 1024,
    "ffn_hidden_size": 4096,
    "num_attention_heads": 16,
    "vocab_size": 32000,
    "mlp": "gelu",
}
MOE6 = {**SMALL_MOE, "name": "moe-6"}
# an 8-layer MoE model with three leading dense layers: a stage at position 3 or later holds MoE layers only
MOE8_LEAD3 = {**SMALL_MOE, "name": "moe-8", "num_layers": 8, "moe": {**SMALL_MOE["moe"], "first_dense_layers": 3}}
TIGHT_GPU = {
    "name": "tight",
    "memory_gib": 5.5,
    "peak_tflops_bf16": 312,
    "hbm_tbps": 2.0,
    "intra_node_gbps": 300,
    "inter_node_gbps": 200,
}


def job(model, gpu="a100-40gb", gpus_per_node=4, nodes=2, seq=2048, gbs=8, attention="flash"):
    return parse_job(
        {
            "model": model,
            "cluster": [{"gpu": gpu, "nodes": nodes, "gpus_per_node": gpus_per_node}],
            "training": {"seq_length": seq, "global_batch_size": gbs, "attention": attention},
        }
    )


def compositions(total: int, parts: int, step: int = 1):
    """All (n_0..n_{p-1}) with n_i >= step, multiples of step, summing to total."""
    if parts == 1:
        if total >= step and total % step == 0:
            yield (total,)
        return
    for first in range(step, total - step * (parts - 1) + 1, step):
        for rest in compositions(total - first, parts - 1, step):
            yield (first,) + rest


@dataclass
class Brute:
    """The best of every plan of one candidate: iteration time over all plans and over those that fit, the
    slowest stage's micro-batch time (all plans; fitting ones) and the fewest recomputed layers that fit."""

    any_time: float = float("inf")
    fit_time: float = float("inf")
    any_slowest: float = float("inf")
    fit_slowest: float = float("inf")
    fit_recomputed: float = float("inf")

    def add(self, est, recomputed: int) -> None:
        slowest = max(st.microbatch_time_s for st in est.stages)
        self.any_time = min(self.any_time, est.iteration_time_s)
        self.any_slowest = min(self.any_slowest, slowest)
        if est.fits:
            self.fit_time = min(self.fit_time, est.iteration_time_s)
            self.fit_slowest = min(self.fit_slowest, slowest)
            self.fit_recomputed = min(self.fit_recomputed, recomputed)


def brute_homogeneous(j, c, sm, opts) -> Brute:
    out = Brute()
    full = c.recompute == "full"
    for split in compositions(j.model.num_layers, c.pp, c.vpp):
        counts = [(n,) for n in split] if full else [range(n + 1) for n in split]
        for rec in itertools.product(*counts):
            plans = split_kinds(j, split, rec, full)
            dims = dims_for(j, c, split, None if full else rec, opts.tp_comm_overlap)
            out.add(evaluate_plans(j, dims, sm, plans, opts.memory_margin), sum(rec))
    return out


HOMOGENEOUS = {
    "dense": (job(GPT6), SearchOptions(max_micro_batch=2)),
    "memory-bound": (job(GPT6, gpu=TIGHT_GPU, seq=8192, gbs=4, attention="eager"), SearchOptions(max_micro_batch=2)),
    "moe": (job(MOE6, nodes=1), SearchOptions(max_micro_batch=2)),
    "tp-overlap": (
        job(GPT6, gpu=TIGHT_GPU, seq=8192, gbs=4, attention="eager"),
        SearchOptions(max_micro_batch=2, tp_comm_overlap=True),
    ),
}


@pytest.mark.parametrize("name", HOMOGENEOUS)
def test_homogeneous_bounds_hold_for_every_plan(name):
    j, opts = HOMOGENEOUS[name]
    costs = cost_source(j)(0)
    capacity = j.cluster[0].gpu.memory_gib * (1 - opts.memory_margin)
    cands, _, _ = enumerate_candidates(j, costs, opts)
    assert cands
    fitting = 0
    for c in cands:
        sm = StageModel(j, dims_for(j, c, tp_overlap=opts.tp_comm_overlap), costs)
        best = brute_homogeneous(j, c, sm, opts)
        what = f"{name} {c}"
        assert c.lower_bound_s <= best.any_time * SLACK, what
        assert sm.lower_bound() <= best.any_time * SLACK, what
        assert quick.lower_bound(sm) <= best.any_time * SLACK, what
        assert quick.integer_bottleneck(sm) <= best.any_slowest * SLACK, what
        assert quick.integer_bottleneck(sm) <= quick.ordered_bottleneck(sm) <= best.any_slowest * SLACK, what
        assert quick.lower_bound(sm, capacity) <= best.fit_time * SLACK, what
        if best.fit_time < float("inf"):
            fitting += 1
            assert quick.lower_bound(sm, capacity, best.fit_time) <= best.fit_time * SLACK, what
            heavy = j.model.num_moe_layers if sm.has_moe else j.model.num_layers
            assert quick.memory_bottleneck(sm, capacity, heavy) <= best.fit_slowest * SLACK, what
            forced = quick.forced_recompute(sm, capacity)
            assert forced is not None and forced <= best.fit_recomputed + 1e-9, what
    assert fitting  # the memory-aware bounds were checked somewhere


def test_ordered_bottleneck_is_the_least_slowest_stage_of_any_contiguous_split():
    """quick._ordered_bottleneck (each layer at its own kind's floor, in the model's order) against every split
    into contiguous stages of at least one layer: the least slowest stage (float rounding aside). The
    layers [dense, dense, MoE, MoE] on three stages, the middle one with room for a dense layer and no MoE layer at
    the optimum 6.5, fit there only where the first stage holds one layer: filling each stage as far as it goes
    would find no split at 6.5 and overstate the bottleneck (8.5)."""
    rng = random.Random(7)
    cases = [((0.0, 5.5, 0.0), (1.0, 3.0), (False, False, True, True))]
    for _ in range(300):
        L = rng.randint(1, 9)
        p = rng.randint(1, L)
        lead, freq = rng.randint(0, L), rng.choice((1, 2))
        order = tuple(j >= lead and (j - lead) % freq == 0 for j in range(L))
        consts = tuple(rng.choice((0.0, rng.uniform(0, 3))) for _ in range(p))
        cases.append((consts, (rng.uniform(0.2, 1.5), rng.uniform(0.2, 3.0)), order))
    for consts, floors, order in cases:
        cost = [floors[1] if moe else floors[0] for moe in order]
        best = min(
            max(c + sum(cost[a : a + n]) for c, a, n in zip(consts, itertools.accumulate((0, *split)), split))
            for split in compositions(len(order), len(consts))
        )
        got = quick._ordered_bottleneck(consts, floors, order)
        assert got == pytest.approx(best, rel=1e-12), (consts, floors, order)


@pytest.mark.parametrize("name", HOMOGENEOUS)
def test_memory_bottleneck_is_the_least_breakpoint(name):
    """quick.memory_bottleneck (a merge of the stages' chunk times) is exact: the least of the slowest constant and
    every stage's time at every chunk count at which the stages' most layers (quick._memory_counts, found from the
    relaxed capacity) add up to the heavy layers, found here by trying every such time."""
    j, opts = HOMOGENEOUS[name]
    costs = cost_source(j)(0)
    capacity = j.cluster[0].gpu.memory_gib * (1 - opts.memory_margin)
    cands, _, _ = enumerate_candidates(j, costs, opts)
    checked = 0
    for c in cands:
        sm = StageModel(j, dims_for(j, c, tp_overlap=opts.tp_comm_overlap), costs)
        heavy = j.model.num_moe_layers if sm.has_moe else j.model.num_layers
        counts, lo, chunk_time = quick._memory_counts(sm, capacity)
        L = j.model.num_layers
        chunks = {chunk_time(i, k) for i in range(c.pp) for k in range(1, L + 1)}
        times = sorted({lo} | {T for T in chunks if lo < T < float("inf")})  # no stage is faster than its constant
        least = next((T for T in times if sum(counts(T)) >= heavy), float("inf"))
        assert quick.memory_bottleneck(sm, capacity, heavy) == least, f"{name} {c}"
        checked += least < float("inf") and least > lo
    assert checked  # some candidate's bottleneck is above its constant


# ------------------------------------------------------------------------------------------------ mixed
SMALL_GPU = {
    "memory_gib": 6.0,
    "peak_tflops_bf16": 312,
    "hbm_tbps": 2.0,
    "intra_node_gbps": 300,
    "inter_node_gbps": 200,
    "name": "small-gpu",
}


def mixed_job(model=GPT6, second="a100-40gb", seq: int = 8192, gbs: int = 4):
    """Four SMALL_GPU and four ``second`` GPUs (TIGHT_GPU: two GPUs short of memory)."""
    return parse_job(
        {
            "model": model,
            "cluster": [
                {"gpu": SMALL_GPU, "nodes": 1, "gpus_per_node": 4},
                {"gpu": second, "nodes": 1, "gpus_per_node": 4},
            ],
            "training": {"seq_length": seq, "global_batch_size": gbs, "attention": "eager"},
        }
    )


def families(ctx, node):
    """Every ordered family under a _TpChoiceNode, with the bounds on the way: (bounds so far, ordered family, box).
    A _TpChoiceNode's bounds are both: the one it is put in line at (with its ZeRO traffic and DP tails, no trial
    given: _lined_tail_bound), and the one with its groups' memory."""
    for flb, child, box in node.families(ctx):
        if isinstance(child, mixed_pipelines._TpChoiceNode):
            with_memory = child.bound(ctx)
            for bounds, fam, fbox in families(ctx, child):
                yield (flb, with_memory) + bounds, fam, fbox
            continue
        for bounds, ordered, obox in open_tree(ctx, child, box):
            yield (flb, *bounds), ordered, obox


def open_tree(ctx, fam, box):
    """Every ordered family under an open one as the search reaches it (one open family per ZeRO stage; with more
    than OPEN_ALL groups one per first group, then one per last group; then every order of the rest), with the
    bounds on the way: (bounds, ordered family, box)."""
    L = ctx.job.model.num_layers
    children = fam.opened()
    if not children:
        for ordered, obox in fam.expand(ctx, *box):
            yield (ordered.bound(L, *obox),), ordered, obox
        return
    for child in children:
        here = child.bound(L, *box)
        for bounds, ordered, obox in open_tree(ctx, child, box):
            yield (here, *bounds), ordered, obox


def candidates_with_bounds(ctx) -> list:
    """Every mixed-pipeline candidate of ctx's job as (bounds on the way to it, its ordered family, candidate): its
    root's rough bound first (the one it is first put in line at)."""
    L = ctx.job.model.num_layers
    found = []
    for grp, _ in mixed_pipelines._roots(ctx):
        rough, glb = grp.rough_bound(ctx), grp.bound(ctx, memory=False)
        with_memory = grp.bound(ctx)
        for bounds, fam, (lo, hi) in families(ctx, grp):
            for ks in boxes_points(lo, hi, L):
                found += [
                    ((rough, glb, with_memory, *bounds, fam.bound(L, ks, ks)), fam, c)
                    for c in fam.candidates(ctx, ks, 0.0)
                ]
    return found


def search_context(j, framework: str | None = None) -> MixedContext:
    """The mixed search's context of job ``j``: every ZeRO stage of the mixed search, micro-batches up to 2; under
    ``framework`` (its SearchOptions and its limits) where one is named."""
    from planner.frameworks import FRAMEWORKS

    fw = FRAMEWORKS[framework] if framework else None
    opts = SearchOptions(zero_stages=mixed_pipelines.HETERO_ZERO, max_micro_batch=2, framework=fw)
    return MixedContext(j, opts, fw, cost_source(j), group_order(j.cluster))


def boxes_points(lo, hi, L):
    for ks in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        if sum(ks) <= L:
            yield ks


def brute_mixed(j, c, ctx, margin) -> Brute:
    out = Brute()
    for _, rec, est in candidate_plans(j, c, ctx, margin):
        out.add(est, sum(rec))
    return out


def candidate_plans(j, c, ctx, margin):
    """(chunks per stage, recompute counts, Estimate) of every plan of one mixed candidate: every split of the
    layers in whole chunks of vpp (interleaved) and every recompute count per stage."""
    L = j.model.num_layers
    for chunks in compositions(L // c.vpp, c.pp):
        split = tuple(c.vpp * n for n in chunks)
        for rec in itertools.product(*[range(n + 1) for n in split]):
            full = all(r == n for r, n in zip(rec, split))
            dims = c.dims(j, split, None if full or not any(rec) else rec, "full" if full else c.recompute)
            sms = with_group_sends(
                j,
                c.stage_groups,
                [StageModel(j, dims.stage_dims(s), ctx.costs(g)) for s, g in enumerate(c.stage_groups)],
            )
            plans = split_kinds(j, split, dims.stage_recompute, full)
            yield chunks, rec, evaluate_stages(j, dims, sms, plans, margin)


@pytest.mark.parametrize("model", [GPT6, MOE6], ids=["dense", "moe"])
def test_mixed_pipeline_bounds_hold_for_every_plan(model):
    """MOE6 has a dense first layer: the memory caps, DP tail and ZeRO lines hold for any mix of the two kinds."""
    j = mixed_job(model)
    ctx = search_context(j)
    found = candidates_with_bounds(ctx)
    rng = random.Random(5)
    sample = rng.sample(found, min(60, len(found)))
    assert sample
    assert_bounds_hold(ctx, sample)


def four_group_job(model=MOE6, small=SMALL_GPU):
    """One two-GPU node of each of four GPU types (the search opens their pipeline order one leading group at a
    time): ``small``, a GPU short of memory (TIGHT_GPU at 5 GiB) and two catalog GPUs."""
    gpus = (small, {**TIGHT_GPU, "memory_gib": 5.0}, "h100-sxm", "l4")
    return parse_job(
        {
            "model": model,
            "cluster": [{"gpu": gpu, "nodes": 1, "gpus_per_node": 2} for gpu in gpus],
            "training": {"seq_length": 4096, "global_batch_size": 4, "attention": "eager"},
        }
    )


@pytest.mark.parametrize("model", [GPT6, MOE6], ids=["dense", "moe"])
def test_bounds_of_an_order_opened_at_its_ends_hold_for_every_plan(model):
    """Four groups: an open family's order opens its first group, then its last (_Family.open_ends). The bound of
    each first group (its embedding, memory room with every other group after it, and with MOE6's dense first
    layer every later group at its MoE layers' seconds) and of each last group after it (its logits, after every
    other group) is at most the best plan of every candidate under it, and each bites: above its open parent's
    somewhere."""
    ctx = search_context(four_group_job(model))
    found = candidates_with_bounds(ctx)
    assert {len(c.groups) for _, _, c in found} >= {4}
    rng = random.Random(11)
    four = [x for x in found if len(x[2].groups) == 4]
    sample = rng.sample(four, min(30, len(four))) + rng.sample(found, 10)
    assert_bounds_hold(ctx, sample)
    L = ctx.job.model.num_layers
    raised = [0, 0]  # by a first group, by a last group after it
    for grp, _ in mixed_pipelines._roots(ctx):
        for _, fam, box in walk_open(ctx, grp):
            if len(fam.used) == 4 and len(fam.zeros) == 1:
                parent = fam.bound(L, *box)
                for first in fam.open_ends():
                    here = first.bound(L, *box)
                    raised[0] += here > parent * 1.001
                    raised[1] += any(last.bound(L, *box) > here * 1.001 for last in first.open_ends())
    assert all(raised), raised


def walk_open(ctx, node):
    """Every open family under a _TpChoiceNode (and its ZeRO stages' families): (bound, family, box)."""
    for flb, child, box in node.families(ctx):
        if isinstance(child, mixed_pipelines._TpChoiceNode):
            yield from walk_open(ctx, child)
            continue
        yield flb, child, box
        if len(child.zeros) > 1:
            for z in child.by_zero():
                yield flb, z, box


def test_a_frameworks_tree_reaches_every_candidate_it_runs_and_no_other():
    """Under --framework torchtitan (no ZeRO-1; with CP ZeRO-3 only; at least as many micro-batches as stages) the
    mixed tree puts no root in line at a ZeRO stage the framework never runs at its CP and EP degrees
    (mixed_pipelines._zero_options) and narrows each family's boxes to the depths it runs (_depths), which makes a
    deeper box's bound inf; the candidates it still reaches are exactly those of the unrestricted tree that the
    framework runs (one TP for all, Framework.allows at the candidate's degrees), and the bounds on the way to them
    hold (assert_bounds_hold on a sample)."""
    from planner.frameworks import FRAMEWORKS

    fw = FRAMEWORKS["torchtitan"]
    j = mixed_job(GPT6)
    opts = SearchOptions(zero_stages=mixed_pipelines.HETERO_ZERO, max_micro_batch=2)
    free = MixedContext(j, opts, None, cost_source(j), group_order(j.cluster))
    ctx = MixedContext(j, opts, fw, cost_source(j), group_order(j.cluster))
    for grp, _ in mixed_pipelines._roots(ctx):
        assert 1 not in grp.zeros and (grp.cp == 1 or grp.zeros == (3,))

    def key(c):
        return (c.dp, c.cp, c.ep, c.mbs, c.zero, c.recompute, c.groups, c.vpp)

    def runs(c) -> bool:
        mb = j.training.global_batch_size // (c.dp * c.mbs)
        (tp,) = set(c.stage_tp)  # one TP for all
        degrees = dict(pp=c.pp, zero=c.zero, cp=c.cp, ep=c.ep, dp=c.dp, recompute=c.recompute, vpp=c.vpp)
        return fw.allows(**degrees, tp=tp, microbatches=mb, sequence_parallel=tp > 1)

    every = [c for _, _, c in candidates_with_bounds(free) if len(set(c.stage_tp)) == 1]
    found = candidates_with_bounds(ctx)
    assert {key(c) for _, _, c in found} == {key(c) for c in every if runs(c)}
    # what the framework leaves out at both levels is there in the unrestricted tree
    assert any(c.zero == 1 for c in every) and any(c.cp > 1 and c.zero == 0 for c in every)
    assert any(c.pp > j.training.global_batch_size // (c.dp * c.mbs) for c in every if c.zero in (0, 3))
    L, deeper = j.model.num_layers, 0
    for grp, _ in mixed_pipelines._roots(ctx):
        for _, fam, (lo, hi) in families(ctx, grp):
            for ks in boxes_points(lo, hi, L):
                if sum(ks) > fam.mb:
                    deeper += 1
                    assert fam.bound(L, ks, ks) == float("inf")
    assert deeper
    assert_bounds_hold(ctx, random.Random(3).sample(found, min(40, len(found))))


def test_the_bound_counts_every_layers_recompute_where_a_framework_recomputes_all_or_none(monkeypatch):
    """Under a framework whose stages recompute all their layers or none, every stage alike (torchtitan), a
    candidate whose stages cannot hold the layers without recompute recomputes every layer: its refined bound adds
    each layer's recompute seconds (mixed_pipeline_bounds._recomputes_every_layer), somewhere above the bound
    without that rule; it and the bounds on the way to the candidate stay at most the best plan of the candidate
    that the framework runs (every split in whole layers, every stage recomputing all its layers or every stage
    none)."""
    from planner.search import mixed_pipeline_bounds as bounds

    j = mixed_job(GPT6, TIGHT_GPU)
    ctx = search_context(j, "torchtitan")
    opts = ctx.opts
    cache: dict = {}
    found = []  # (bounds on the way, family, candidate, stage models, refined bound, whether it recomputes all)
    for way, fam, c in candidates_with_bounds(ctx):
        sms = mixed_pipelines._stage_models(ctx, c, cache)
        found.append((way, fam, c, sms, refined_bound(ctx, fam, c, sms), bounds._recomputes_every_layer(ctx, c, sms)))
    with monkeypatch.context() as m:
        m.setattr(bounds, "_recomputes_every_layer", lambda *_: False)
        raised = sum(x[4] > refined_bound(ctx, *x[1:4]) * (1 + 1e-9) for x in found if x[5])
    assert raised
    # the bounds on the way (TP-choice nodes, family boxes: their memory floors all-or-none too,
    # mixed_pipelines._memory_floors) and the refined bound, against the brute force of sampled candidates, half of
    # them recomputing every layer (inf holds for any plan)
    rng = random.Random(11)
    sample = [x for x in found if x[4] < float("inf")]
    sample = rng.sample([x for x in sample if x[5]], 20) + rng.sample([x for x in sample if not x[5]], 20)
    checked = 0
    for way, _, c, _, bound, _ in sample:
        best = float("inf")
        for chunks, rec, est in candidate_plans(j, c, ctx, opts.memory_margin):
            split = [c.vpp * n for n in chunks]
            if est.fits and (not any(rec) or list(rec) == split):
                best = min(best, est.iteration_time_s)
        assert max(*way, bound) <= best * SLACK, (c.groups, c.dp, c.mbs, c.zero, c.recompute)
        checked += best < float("inf")
    assert checked


def test_without_a_replica_look_candidates_are_solved_at_once_until_a_plan_is_known(monkeypatch):
    """Under a framework the mixed search has no replica look to give it a first cut: while no plan is known, every
    candidate whose refined bound is finite is solved at once (_PipelineSearch.solve_first), not put back in line
    behind the boxes whose bounds are below it; without that rule some wait; the same plan either way."""
    from planner.search.mixed_pipelines import search_hetero

    j = mixed_job(GPT6, TIGHT_GPU, seq=4096, gbs=16)
    opts = search_context(j, "torchtitan").opts
    Search = mixed_pipelines._PipelineSearch
    bounded, solved = [], []  # (candidate, bound) bounded while no plan was known; candidates solved
    refined, solve, init = mixed_pipelines.refined_bound, Search.solve, Search.__init__

    def record_bound(ctx, fam, c, sms, target=float("inf")):
        out = refined(ctx, fam, c, sms, target)
        if target == float("inf") and out < float("inf"):
            bounded.append(c)
        return out

    def record_solve(self, c, *args, **kwargs):
        solved.append(c)
        return solve(self, c, *args, **kwargs)

    def waits(solve_first: bool):
        def setup(self, *args, **kwargs):
            init(self, *args, **kwargs)
            assert self.solve_first  # (no replica look under a framework)
            self.solve_first = solve_first

        monkeypatch.setattr(Search, "__init__", setup)
        bounded.clear()
        solved.clear()
        result = search_hetero(j, top=1, time_limit_s=60, options=opts, single_type=False, processes=1)
        assert result.plans and result.complete
        return [c for c in bounded if c not in solved], result.plans[0].time

    monkeypatch.setattr(mixed_pipelines, "refined_bound", record_bound)
    monkeypatch.setattr(Search, "solve", record_solve)
    (none_wait, first), (some_wait, later) = waits(True), waits(False)
    assert not none_wait and some_wait and first == later


def test_layer_kinds_tighten_the_mixed_bounds():
    """MOE6's dense first layer is cheaper than its MoE layers: box bounds that count the two kinds apart
    (KindMix: the MoE layers in dense-layer units) are at least the bounds that price every layer at the cheaper
    kind, and above them somewhere. (That they hold for every plan is test_mixed_pipeline_bounds_hold_for_every_plan.)"""
    from dataclasses import replace

    j = mixed_job(MOE6)
    ctx = search_context(j)
    L = j.model.num_layers
    tighter = 0
    for _, fam, c in candidates_with_bounds(ctx):
        assert fam.kinds is not None
        ks = tuple(k for _, _, k in c.groups)
        with_kinds, without = fam.bound(L, ks, ks), replace(fam, kinds=None).bound(L, ks, ks)
        assert with_kinds >= without
        tighter += with_kinds > without * (1 + 1e-9)
    assert tighter


def test_stages_past_the_dense_layers_hold_moe_layers_only():
    """MOE6's one dense layer is its first: a stage at position 1 or later holds only MoE layers (its layers come
    after one layer of each stage before it), so an ordered family's box and a candidate's blocks price such a
    stage at its MoE layers' seconds (KindMix.moe_from, block_bottleneck's moe_from). Those bounds are above the
    ones without the rule somewhere, and at most the brute-force best plan of every candidate where they are."""
    from dataclasses import replace

    j = mixed_job(MOE6)
    assert j.model.all_moe_from == 1
    ctx = search_context(j)
    L = j.model.num_layers
    raised = []
    for bounds, fam, c in candidates_with_bounds(ctx):
        ks = tuple(k for _, _, k in c.groups)
        with_rule, without = fam.bound(L, ks, ks), replace(fam, moe_from=None).bound(L, ks, ks)
        assert with_rule >= without
        if with_rule > without * (1 + 1e-9):
            raised.append((bounds, fam, c))
    assert raised
    assert_bounds_hold(ctx, random.Random(3).sample(raised, min(30, len(raised))))


def test_split_rows_hold_every_candidate_of_a_box():
    """mixed_pipeline_bounds.split_rows, by enumeration: for every stage-count choice of small boxes in pipeline
    order, each group's stages before position moe_from (they may hold a dense layer) and past it (MoE layers only)
    lie within the counts of its two rows."""
    from planner.search.mixed_pipeline_bounds import split_rows

    checked = 0
    for moe_from in (1, 2, 3):
        for lo in itertools.product((1, 2), repeat=3):
            for hi in itertools.product((1, 2, 4), repeat=3):
                if any(a > b for a, b in zip(lo, hi)):
                    continue
                split = split_rows(lo, hi, moe_from)
                if sum(lo) <= moe_from:
                    assert split is None
                    continue
                rows, rlo, rhi = split
                for ks in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
                    counts = {}
                    start = 0
                    for g, k in enumerate(ks):
                        before = min(k, max(0, moe_from - start))
                        counts[(g, False)], counts[(g, True)] = before, k - before
                        start += k
                    for key, n in counts.items():
                        if key in rows:
                            i = rows.index(key)
                            assert rlo[i] <= n <= rhi[i], (lo, hi, ks, key)
                        else:
                            assert n == 0, (lo, hi, ks, key)
                    checked += 1
    assert checked > 1000


def test_first_positions_and_split_rows_hold_every_order_with_known_ends():
    """first_positions, split_rows and _Family.open_afters where only the first group (``leading``) and the last
    are known, by enumeration: for every order of four groups that starts and ends so and every stage-count choice
    of small boxes, each group's first stage sits within its (least, most) positions, its stages before and past
    position moe_from within its rows' counts, and at least open_afters stages follow its last stage."""
    from planner.search.mixed_pipeline_bounds import first_positions, split_rows

    n, checked = 4, 0
    for first, last in [(0, None), (2, None), (1, 3), (3, 0)]:
        seconds = {"a": (1.0,) * n, "ends": ((0.0, 0.0),) * n, "send": (0.0,) * n}  # (open_afters reads none)
        fam = mixed_pipelines._Family(
            dp=1, cp=1, mbs=1, zeros=(1,), base="none", used=((0, 1),) * n, mb=1, **seconds,
            ordered=False, prefix=(first,), last=last,
        )  # fmt: skip
        orders = [p for p in itertools.permutations(range(n)) if p[0] == first and (last is None or p[-1] == last)]
        for lo in itertools.product((1, 2), repeat=n):
            for hi in [tuple(k + d for k, d in zip(lo, extra)) for extra in itertools.product((0, 2), repeat=n)]:
                positions = first_positions(lo, hi, (first,), last)
                afters = fam.open_afters(lo)
                split = split_rows(lo, hi, 2, False, (first,), last)
                rows, rlo, rhi = split
                for ks in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
                    for order in orders:
                        start, counts = 0, {}
                        for g in order:
                            least, most = positions[g]
                            assert least <= start <= most, (lo, hi, ks, order, g)
                            assert sum(ks) - start - ks[g] >= afters[g], (lo, ks, order, g)
                            before = min(ks[g], max(0, 2 - start))
                            counts[(g, False)], counts[(g, True)] = before, ks[g] - before
                            start += ks[g]
                        for key, count in counts.items():
                            if key in rows:
                                assert rlo[rows.index(key)] <= count <= rhi[rows.index(key)], (lo, hi, ks, order, key)
                            else:
                                assert count == 0, (lo, hi, ks, order, key)
                        checked += 1
    assert checked > 10_000


def test_a_box_prices_its_stages_past_the_dense_layers_at_moe_layers():
    """An ordered family's box takes its groups' stages past MOE6's one dense layer at the MoE layer's seconds and
    their DP tails at an MoE-only stage's (split_rows): some boxes of several candidates are raised by it (seen
    against the bound without the rows apart), and every box bound is at most the brute-force best plan of every
    candidate in the box."""
    from planner.search import mixed_pipeline_bounds

    j = mixed_job(MOE6)
    ctx = search_context(j)
    L = j.model.num_layers
    rng = random.Random(5)
    found = candidates_with_bounds(ctx)
    by_family: dict = {}
    for _, fam, c in found:
        by_family.setdefault(id(fam), (fam, []))[1].append(c)
    boxes = []
    for fam, cands in by_family.values():
        if fam.kinds is None:
            continue
        for c in cands:
            ks = tuple(k for _, _, k in c.groups)
            lo = tuple(rng.randint(1, k) for k in ks)
            hi = tuple(k + rng.randint(0, 2) for k in ks)
            boxes.append((fam, lo, hi, c))
    split = mixed_pipeline_bounds.split_rows
    try:
        mixed_pipeline_bounds.split_rows = lambda *_: None
        mixed_pipelines.split_rows = mixed_pipeline_bounds.split_rows
        without = [dataclasses.replace(fam).bound(L, lo, hi) for fam, lo, hi, _ in boxes]
    finally:
        mixed_pipeline_bounds.split_rows = mixed_pipelines.split_rows = split
    with_rows = [dataclasses.replace(fam).bound(L, lo, hi) for fam, lo, hi, _ in boxes]
    assert_raised_boxes_below_brute_force(ctx, boxes, with_rows, without, rng)


def assert_raised_boxes_below_brute_force(ctx, boxes, bounds, without, rng) -> None:
    """Some of the (family, lo, hi, candidate) ``boxes`` have ``bounds`` above those ``without`` a term, and a
    sample of up to 25 of those is at most the brute-force best plan of its candidate."""
    raised = [i for i, (x, y) in enumerate(zip(bounds, without)) if x > y * (1 + 1e-9)]
    assert raised
    for i in rng.sample(raised, min(25, len(raised))):
        _, lo, hi, c = boxes[i]
        best = brute_mixed(ctx.job, c, ctx, ctx.opts.memory_margin)
        assert bounds[i] <= best.fit_time * SLACK, (c.groups, lo, hi)


def test_a_box_prices_the_layers_of_a_stage_before_the_dense_layers_end_at_moe_layers():
    """A box's stages that may hold MOE6's one dense layer hold MoE layers after it: the least work of the box's
    schedule (box_schedule_time's ``priced``, _priced) takes every layer at its group's MoE-layer seconds, less
    the one dense layer's saving at the largest gap, instead of every layer of such a stage at the cheaper kind.
    Some boxes of several candidates are raised by it (against the bound without it), and every box bound is at
    most the brute-force best plan of every candidate in the box."""
    from planner.search import mixed_pipeline_bounds

    j = mixed_job(MOE6)
    ctx = search_context(j)
    L = j.model.num_layers
    rng = random.Random(9)
    boxes = []
    for _, fam, c in candidates_with_bounds(ctx):
        if fam.kinds is None:
            continue
        ks = tuple(k for _, _, k in c.groups)
        lo = tuple(rng.randint(1, k) for k in ks)
        hi = tuple(k + rng.randint(0, 2) for k in ks)
        boxes.append((fam, lo, hi, c))
    priced = mixed_pipeline_bounds._priced
    try:
        mixed_pipeline_bounds._priced = lambda *_: None
        without = [dataclasses.replace(fam).bound(L, lo, hi) for fam, lo, hi, _ in boxes]
    finally:
        mixed_pipeline_bounds._priced = priced
    with_prices = [dataclasses.replace(fam).bound(L, lo, hi) for fam, lo, hi, _ in boxes]
    assert all(x >= y * (1 - 1e-12) for x, y in zip(with_prices, without))
    assert_raised_boxes_below_brute_force(ctx, boxes, with_prices, without, rng)


def test_an_unordered_box_counts_each_groups_stages_once_past_the_dense_layers(monkeypatch):
    """An open family of MOE6 (its group order open) gives every group a row of stages that may hold the dense
    first layer besides its MoE-only row of all its stages; box_schedule_time counts the former only for what its
    stages hold beyond the latter's, one stage's worth in all (_priced's partners): the families' bounds are at
    least those without that (each group's stages held twice over) and above them somewhere. That they hold for
    every plan is test_the_highest_bounds_on_the_way_hold_for_every_plan and the mixed-bound sample tests."""
    from planner.search import mixed_pipeline_bounds

    ctx = search_context(mixed_job(MOE6))
    L = ctx.job.model.num_layers
    families = []
    for node in tp_choice_nodes(ctx):
        if len(node.fixed) == len(ctx.order) and sum(1 for tp in node.fixed if tp) >= 2:
            for _, fam, box in dataclasses.replace(node, memory=True, rows=None).families(ctx):
                families.append((fam, box))
    assert families
    with_partners = [dataclasses.replace(fam).bound(L, *box) for fam, box in families]
    priced = mixed_pipeline_bounds._priced

    def twice(*args):
        out = priced(*args)
        return None if out is None else (out[0], out[1], None, out[3])

    monkeypatch.setattr(mixed_pipeline_bounds, "_priced", twice)
    without = [dataclasses.replace(fam).bound(L, *box) for fam, box in families]
    assert all(x >= y * (1 - 1e-12) for x, y in zip(with_partners, without))
    assert any(x > y * (1 + 1e-9) for x, y in zip(with_partners, without))


def test_a_free_rows_end_terms_hold_for_each_of_its_tp_choices():
    """A TP-choice node's row for a group whose TP is still open bounds the group at any of its choices: each of
    its end terms (embedding and logits seconds, those over the stage's seconds per layer, and a stage's one-layer
    time plus them) is at most that choice's own (Ends.row at the choice's seconds per layer), the terms over the
    seconds per layer included (the fastest choice's seconds with the least embedding overstated them up to 3.8x
    on this seed-1 suite job of the bench, where a larger TP is not always faster per layer)."""
    from planner.search.mixed_pipeline_bounds import Ends

    j = parse_job(
        {
            "model": "qwen3-235b-a22b",
            "cluster": [
                {"gpu": "h200", "nodes": 231, "gpus_per_node": 8},
                {"gpu": "gb200", "nodes": 30, "gpus_per_node": 72},
                {"gpu": "b200", "nodes": 550, "gpus_per_node": 8},
                {"gpu": "h800", "nodes": 195, "gpus_per_node": 8},
            ],
            "training": {"seq_length": 16384, "global_batch_size": 1024},
        }
    )
    ctx = search_context(j)
    checked = 0
    for root, _ in mixed_pipelines._roots(ctx)[:600]:
        for i in range(len(ctx.order)):
            row = root._row(ctx, i)
            if row is None:
                continue
            for u in root._row_choices(ctx, i):
                own = Ends.row(*root._terms(ctx, u)[:2])
                assert all(x <= y * SLACK for x, y in zip(row[2], own)), (u, row[2], own)
                checked += 1
    assert checked


def test_choice_capped_rate_is_the_most_any_choice_of_stages_takes():
    """mixed_pipeline_bounds.choice_capped_rate, by enumeration on random groups of TP choices (k stages of x
    seconds per layer): at least the most layers per second any pick of one choice and q <= k of its stages per
    group, with at most ``most`` stages in all, takes; and equal to it where each group has one choice (the
    greedy over concave segments is then exact)."""
    from planner.search.mixed_pipeline_bounds import choice_capped_rate

    rng = random.Random(11)
    for _ in range(300):
        rows = [
            [(rng.randint(1, 5), rng.choice((0.5, 1.0, 1.5, 2.0, 3.0))) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(1, 3))
        ]
        most = rng.randint(1, 8)
        best = 0.0
        for pick in itertools.product(*rows):
            for qs in itertools.product(*[range(k + 1) for k, _ in pick]):
                if sum(qs) <= most:
                    best = max(best, sum(q / x for q, (_, x) in zip(qs, pick)))
        rate = choice_capped_rate(rows, most)
        assert rate >= best * (1 - 1e-12), (rows, most)
        if all(len(r) == 1 for r in rows):
            assert rate == pytest.approx(best), (rows, most)


def test_a_tp_choice_node_counts_its_groups_stages_at_their_own_choices():
    """A TP-choice node whose groups together have more stages than its deepest pipeline bounds the bottleneck by
    the heavy layers those stages take at each group's own TP choices (_TpChoiceNode._capped_bound): it raises some
    node bounds of MOE6's mixed job, and every node bound on the way to a sampled candidate is at most its
    brute-force best plan (assert_bounds_hold)."""
    ctx = search_context(mixed_job(MOE6, seq=2048, gbs=16))
    nodes, line = [], [grp for grp, _ in mixed_pipelines._roots(ctx)]
    while line:
        node = line.pop()
        nodes.append(node)
        line += [child for _, child, _ in node.families(ctx) if isinstance(child, mixed_pipelines._TpChoiceNode)]
    with_it = [node.bound(ctx, memory=False) for node in nodes]
    capped = mixed_pipelines._TpChoiceNode._capped_bound
    try:
        mixed_pipelines._TpChoiceNode._capped_bound = lambda *_: 0.0
        bare = [dataclasses.replace(node, memo={}, rows=None).bound(ctx, memory=False) for node in nodes]
    finally:
        mixed_pipelines._TpChoiceNode._capped_bound = capped
    raised = [(node, x) for node, x, y in zip(nodes, with_it, bare) if x > y * (1 + 1e-9)]
    assert raised
    L = ctx.job.model.num_layers
    rng, checked = random.Random(4), 0
    for node, bound in rng.sample(raised, min(8, len(raised))):
        under = [
            c
            for _, fam, (lo, hi) in families(ctx, node)
            for ks in boxes_points(lo, hi, L)
            for c in fam.candidates(ctx, ks, 0.0)
        ]
        for c in rng.sample(under, min(6, len(under))):
            assert bound <= brute_mixed(ctx.job, c, ctx, ctx.opts.memory_margin).fit_time * SLACK, c.groups
            checked += 1
    assert checked


def test_the_refined_bound_prices_stages_past_the_dense_layers_at_moe_layers():
    """A candidate's refined bound takes a stage past MOE6's one dense layer at its MoE layer's seconds (every layer
    it holds is MoE: ModelSpec.all_moe_from). It is above the refined bound without the rule for some candidates,
    and at most the brute-force best plan of every such candidate (assert_bounds_hold)."""
    from planner.spec import ModelSpec

    j = mixed_job(MOE6)
    ctx = search_context(j)
    cache: dict = {}
    found = [(b, fam, c, mixed_pipelines._stage_models(ctx, c, cache)) for b, fam, c in candidates_with_bounds(ctx)]
    with_rule = [refined_bound(ctx, fam, c, sms) for _, fam, c, sms in found]
    rule = ModelSpec.all_moe_from
    try:
        ModelSpec.all_moe_from = property(lambda self: self.num_layers)  # no stage is known to hold MoE layers only
        bare = search_context(j)
        without = [refined_bound(bare, fam, c, sms) for _, fam, c, sms in found]
    finally:
        ModelSpec.all_moe_from = rule
    raised = [(b, fam, c) for (b, fam, c, _), x, y in zip(found, with_rule, without) if x > y * (1 + 1e-9)]
    assert raised
    assert_bounds_hold(ctx, random.Random(5).sample(raised, min(30, len(raised))))


@pytest.mark.parametrize("model", [GPT6, MOE6], ids=["dense", "moe"])
def test_stage_time_floors_hold_for_every_plan_that_fits(model, monkeypatch):
    """The per-stage floors least_schedule_with_tail takes (_stage_time_floors: linear, by layer kind, and the
    recompute memory forces) are at most each stage's micro-batch seconds in every plan of the candidate that fits
    in memory (every split of the layers, every recompute count), and grow with the chunks a stage holds."""
    from planner.search import mixed_pipeline_bounds as B

    j = mixed_job(model)
    ctx = search_context(j)
    seen = []
    floors_of = B._stage_time_floors

    def capture(*args):
        out = floors_of(*args)
        seen.append(out)
        return out

    monkeypatch.setattr(B, "_stage_time_floors", capture)
    cache: dict = {}
    checked = 0
    for _, fam, c in random.Random(9).sample(candidates_with_bounds(ctx), 40):
        sms = mixed_pipelines._stage_models(ctx, c, cache)
        seen.clear()
        refined_bound(ctx, fam, c, sms, 1e9)  # a target far above: the joint bound is worked out
        if not seen:
            continue  # cut before (the layers cannot fit)
        (floors,) = seen
        for chunks, rec, est in candidate_plans(j, c, ctx, ctx.opts.memory_margin):
            if not est.fits:
                continue
            checked += 1
            for st, q, f in zip(est.stages, chunks, floors):
                assert q <= len(f) and f[q - 1] <= st.microbatch_time_s * SLACK, (c.groups, chunks, rec)
        assert all(x <= y for f in floors for x, y in zip(f, f[1:]))
    assert checked


def assert_bounds_hold(ctx, sample) -> None:
    """Every bound of each (bounds on the way, family, candidate) of ``sample`` -- _TpChoiceNode, unordered and
    ordered family boxes, the candidate's own box, its refined bound, also probed at its best time -- is at most
    the brute-force best plan of the candidate, probed just above it the refined bound does not reach the target
    (prune it); and some candidate has a plan that fits."""
    cache: dict = {}
    fitting = 0
    for bounds, fam, c in sample:
        best = brute_mixed(ctx.job, c, ctx, ctx.opts.memory_margin)
        what = f"{c.groups} dp{c.dp} cp{c.cp} ep{c.ep} mbs{c.mbs} z{c.zero} {c.recompute}"
        for b in bounds:
            assert b <= best.fit_time * SLACK, what
        sms = mixed_pipelines._stage_models(ctx, c, cache)
        assert refined_bound(ctx, fam, c, sms) <= best.fit_time * SLACK, what
        if best.fit_time < float("inf"):
            fitting += 1
            assert refined_bound(ctx, fam, c, sms, best.fit_time) <= best.fit_time * SLACK, what
            above = best.fit_time * 1.001  # a target the best plan beats: the candidate must not be pruned
            assert refined_bound(ctx, fam, c, sms, above) < above, what
    assert fitting


@pytest.mark.parametrize("zero", [1, 3])
def test_the_dp_tail_floor_holds_for_every_stage_of_any_layer_mix(zero):
    """MixedContext.tail_floor (and the ZeRO-2/3 line) of an MoE model with a dense first layer: at most the exposed
    DP tail and the optimizer step (what the iteration adds after the stage's last backward) plus the stage's
    recompute seconds over vpp (what the bound also counts in sum_s t_s / vpp), and the
    ZeRO line at most the per-micro-batch ZeRO traffic, of every stage at every layer split and recompute count,
    whatever mix of dense and MoE layers the stage holds, and so is the line with each kind's own slope
    (MixedContext.sharded_kinds, ZeRO-3: its MoE slope above the any-mix one, so the check bites); the floors are
    not zero everywhere, and where recompute pays for what it hides the floor is above the one with every layer
    recomputed."""
    j = parse_job(
        {
            "model": {**MOE6, "num_layers": 5},
            "cluster": [{"gpu": "a100-40gb", "nodes": 4, "gpus_per_node": 1}],
            "training": {"seq_length": 512, "global_batch_size": 4, "attention": "flash"},
        }
    )
    ctx = MixedContext(j, SearchOptions(), None, cost_source(j), group_order(j.cluster))
    dims = mixed_pipelines.pipeline_dims(j, (0, 0), (1, 1), 2, 1, 1, zero, "none")
    sm = StageModel(j, dims.stage_dims(0), ctx.costs(0))
    L = j.model.num_layers
    largest = by_kind = 0.0
    never = 10**6  # an interleaving degree at which recompute never pays: every layer recomputed
    if zero == 1:  # (ZeRO-3: the floor is 0 either way here)
        assert any(ctx.tail_floor(sm, s, L, 1) > ctx.tail_floor(sm, s, L, never) for s in range(2))
    for split in compositions(L, 2):
        for rec in itertools.product(*(range(n + 1) for n in split)):
            for s, plan in enumerate(split_kinds(j, split, rec, False)):
                exposed, step = sm.iteration_tail(s, plan)
                exposed += step
                compute = sm.compute_form(s == 0, s == 1)
                recompute_s = compute.at(plan) - compute.at(StagePlan(plan.dense, plan.moe))
                for v in (1, 2, never):
                    assert ctx.tail_floor(sm, s, L, v) <= (exposed + recompute_s / v) * SLACK + 1e-12, (split, rec, s)
                slope, const = ctx.sharded_line(sm, s)
                zero_time = sm.microbatch_time(s, plan)["zero_comm"]
                largest = max(largest, min(exposed, ctx.tail_floor(sm, s, L)) + slope * plan.layers + const)
                assert slope * plan.layers + const <= zero_time * SLACK + 1e-12, (split, rec, s)
                kinds = ctx.sharded_kinds(sm, s)
                if kinds is not None:
                    by_kind = max(by_kind, kinds[1] - slope)
                    assert kinds[0] * plan.dense + kinds[1] * plan.moe <= zero_time * SLACK + 1e-12, (split, rec, s)
    assert largest > 0
    assert (by_kind > 0) == (zero == 3)


@pytest.mark.parametrize("freq", [2, 1])
def test_the_tail_profile_holds_for_every_run_of_layers(freq):
    """mixed_context.tail_profile of an MoE model with a dense first layer and an MoE layer every ``freq`` layers:
    for every stage position s of a 3-stage pipeline and every run of n consecutive layers a stage there could hold
    (the cost model counts a stage's layer kinds as one run at any vpp: split_kinds; it starts at layer s or later,
    every stage before it holding one), its floor at n is at most the stage's exposed DP tail plus its optimizer
    step; it is above the floor of one line for any mix of the kinds (_any_mix_line) somewhere; and with an MoE layer everywhere past the
    dense one (freq 1) a later stage's profile (MoE layers only: moe_windows from its first layer) is above the one
    of a stage that may start anywhere somewhere (with freq 2 it may be too: near the model's end)."""
    from planner.search.mixed_context import _any_mix_line, moe_window_arrays, tail_lines, tail_profile, window_start

    model = {**MOE6, "num_layers": 6, "moe": {**MOE6["moe"], "moe_layer_freq": freq}}
    j = parse_job(
        {
            "model": model,
            "cluster": [{"gpu": "a100-40gb", "nodes": 6, "gpus_per_node": 1}],
            "training": {"seq_length": 512, "global_batch_size": 4, "attention": "flash"},
        }
    )
    ctx = MixedContext(j, SearchOptions(), None, cost_source(j), group_order(j.cluster))
    dims = mixed_pipelines.pipeline_dims(j, (0, 0, 0), (1, 1, 1), 2, 1, 1, 1, "none")
    sm = StageModel(j, dims.stage_dims(0), ctx.costs(0))
    L = j.model.num_layers
    above_mix = above_anywhere = False
    for s in range(3):
        profile, anywhere = ctx.tail_profile(sm, s), ctx.tail_profile(sm, s, start=0)
        first, last = s == 0, s == 2
        compute, forward = sm.compute_form(first, last), sm.forward_form(first, last)
        tail = sm.tail_forms(first, last)
        mix = [_any_mix_line(x, compute, forward, j.model, False) for x in tail.parts()]
        step = tail.optimizer  # (the step's line: its least per layer of either kind)
        mix.append((step.const, min(step.dense, step.moe)))
        paid = (sm.dims.vpp or 1) <= ctx.recompute_pays(sm, s)
        dp_only = tail_profile(tail_lines(sm, s, paid)[:-1], moe_window_arrays(ctx, window_start(j.model, s)))
        for n in range(1, L - s + 1):
            least_step = step.const + n * min(step.dense, step.moe)
            assert least_step > 0 and profile.at[n] >= (dp_only.at[n] + least_step) * (1 - 1e-9)  # the step counts
            above_mix |= profile.at[n] > sum(max(0.0, c + p * n) for c, p in mix) * SLACK + 1e-12
            above_anywhere |= profile.at[n] > anywhere.at[n] * SLACK + 1e-12
            for start in range(s, L - n + 1):
                moe = j.model.moe_layers_before(start + n) - j.model.moe_layers_before(start)  # (split_kinds)
                assert profile.at[n] <= sum(sm.iteration_tail(s, StagePlan(n - moe, moe))) * SLACK + 1e-12, (s, n)
    assert above_mix
    assert above_anywhere or freq != 1


@pytest.mark.parametrize(("memory_gib", "freq", "dense"), [(4.0, 2, 1), (16.0, 2, 1), (16.0, 1, 1)])
def test_kind_memory_times_hold_for_every_run_and_recompute_count_that_fits(memory_gib, freq, dense):
    """mixed_pipeline_bounds._kind_memory_times of an MoE model with an MoE layer every other layer, on a GPU so
    tight that no layer fits (4 GiB) and on one where longer runs fit only by recomputing (16 GiB), and of one with
    a leading dense layer and MoE layers after it (as DeepSeek-V3): for every stage s, run of n consecutive
    layers from layer s on (every stage before it holds a layer) and recompute count that fits the GPU, the
    stage's seconds on its layers (its time less that of no layers) are at least the bound at n; the bound is
    above the layer floors alone where recompute is needed, and inf where nothing fits. Past the leading dense
    layers it is at least that of n MoE layers (no cheaper dense layer can stand in for one). The same for
    _block_terms at each run's own start (its MoE count that of the run: BlockTerms.time), inf exactly where no
    recompute count of that run fits."""
    from planner.search.mixed_pipeline_bounds import _block_terms, _kind_memory_times

    model = {**MOE6, "num_layers": 6, "moe": {**MOE6["moe"], "moe_layer_freq": freq, "first_dense_layers": dense}}
    j = parse_job(
        {
            "model": model,
            "cluster": [{"gpu": {**TIGHT_GPU, "memory_gib": memory_gib}, "nodes": 4, "gpus_per_node": 1}],
            "training": {"seq_length": 8192, "global_batch_size": 4, "attention": "eager"},
        }
    )
    ctx = MixedContext(j, SearchOptions(), None, cost_source(j), group_order(j.cluster))
    dims = mixed_pipelines.pipeline_dims(j, (0, 0), (1, 1), 1, 1, 1, 1, "none")
    sm = StageModel(j, dims.stage_dims(0), ctx.costs(0))
    L, cap = j.model.num_layers, ctx.capacity(0)
    recomputing = infeasible = moe_only = 0
    for s in range(2):
        times = _kind_memory_times(ctx, sm, 0, s, 0.0)
        terms = _block_terms(ctx, sm, 0, s, 0.0)
        empty = sm.microbatch_time(s, StagePlan(0, 0))["total"]
        floor = min(k.layer_floor() for k in sm.kinds.values())
        for n in range(1, L + 1):
            fitting = []
            for start in range(L - n + 1):
                moe = j.model.moe_layers_before(start + n) - j.model.moe_layers_before(start)  # (split_kinds)
                here = []
                for r in range(n + 1):
                    plan = StagePlan(n - moe, moe).with_recompute(r)
                    if sm.peak_memory(s, plan) / GIB <= cap:
                        here.append(sm.microbatch_time(s, plan)["total"] - empty)
                run = terms.time(n, moe)
                assert run <= min(here) * SLACK + 1e-12 if here else run == float("inf"), (s, n, start)
                if start >= s:  # (the least over every run of n the stage can hold)
                    assert run >= times[n - 1] * (1 - 1e-12), (s, n, start)
                    fitting += here
            if fitting:
                assert times[n - 1] <= min(fitting) * SLACK + 1e-12, (s, n)
                recomputing += times[n - 1] > n * floor * SLACK
            else:
                infeasible += times[n - 1] == float("inf")
            if s >= j.model.all_moe_from and times[n - 1] < float("inf"):
                assert times[n - 1] >= n * sm.kinds["moe"].layer_floor() * (1 - 1e-12), (s, n)
                moe_only += 1
    assert recomputing if memory_gib > 10 else infeasible
    assert moe_only if freq == 1 else not moe_only


@pytest.mark.parametrize("v", [1, 2])
def test_tail_bottleneck_is_below_every_split_of_the_layers(v):
    """mixed_pipeline_bounds.tail_bottleneck against every split of L layers in whole chunks of v over k_g <= hi_g
    stages per group (each stage >= 1 chunk, a stage of group g holding n layers with tail reaches[g][n - 1]): the
    least largest tail of any split is at or above the bound, and equal to it somewhere (it is the split's
    relaxation); with v = 2 it is above the bound that lets stages hold any number of layers somewhere."""
    from planner.search.mixed_pipeline_bounds import tail_bottleneck

    rng = random.Random(3)
    equal = above = 0
    for _ in range(200):
        L, groups = v * rng.randint(2, 7 // v + 1), rng.randint(1, 3)
        reaches = [
            tuple(itertools.accumulate(rng.choice((0.0, 0.0, 0.5, 1.0, 2.0)) for _ in range(L))) for _ in range(groups)
        ]
        his = [rng.randint(1, 3) for _ in range(groups)]
        best = float("inf")
        for ks in itertools.product(*(range(1, h + 1) for h in his)):
            owners = [g for g, k in enumerate(ks) for _ in range(k)]
            if len(owners) > L // v:
                continue
            for split in compositions(L // v, len(owners)):
                best = min(best, max(reaches[g][v * n - 1] for g, n in zip(owners, split)))
        bound = tail_bottleneck(reaches, his, L, v=v)
        assert bound <= best + 1e-12, (reaches, his, L)
        equal += bound == best
        above += bound > tail_bottleneck(reaches, his, L)
    assert equal > 50 and (above > 10) == (v > 1)


@pytest.mark.parametrize("v", [1, 2])
def test_tail_bottleneck_with_a_stage_cap_is_below_every_split_within_it(v):
    """tail_bottleneck with ``most`` (the deepest depth an interleaved family or TP-choice node runs at) against
    every split of the layers in whole chunks over k_g <= hi_g stages per group with at most ``most`` stages in
    all: at or below the least largest tail of each, and above the bound without the cap somewhere."""
    from planner.search.mixed_pipeline_bounds import tail_bottleneck

    rng = random.Random(7)
    above = 0
    for _ in range(300):
        L, groups = v * rng.randint(2, 7 // v + 1), rng.randint(1, 3)
        reaches = [
            tuple(itertools.accumulate(rng.choice((0.0, 0.5, 1.0, 2.0)) for _ in range(L))) for _ in range(groups)
        ]
        his = [rng.randint(1, 3) for _ in range(groups)]
        most = rng.randint(1, L // v)
        best = float("inf")
        for ks in itertools.product(*(range(1, h + 1) for h in his)):
            owners = [g for g, k in enumerate(ks) for _ in range(k)]
            if len(owners) > most:
                continue
            for split in compositions(L // v, len(owners)):
                best = min(best, max(reaches[g][v * n - 1] for g, n in zip(owners, split)))
        bound = tail_bottleneck(reaches, his, L, v=v, most=most)
        assert bound <= best + 1e-12, (reaches, his, L, most)
        above += bound > tail_bottleneck(reaches, his, L, v=v)
    assert above > 10


def test_stages_tail_bottleneck_is_below_every_split_into_whole_chunks():
    """mixed_pipeline_bounds.stages_tail_bottleneck (the refined bound's: one reach per stage, TailProfile.reach
    from n = 0) against every split of L layers in whole chunks of v over the stages: never above the least
    largest tail of a split, and equal to it somewhere."""
    from planner.search.mixed_pipeline_bounds import stages_tail_bottleneck

    rng = random.Random(5)
    equal = {1: 0, 2: 0}
    for _ in range(200):
        v, P = rng.choice([1, 2]), rng.randint(1, 4)
        L = v * rng.randint(P, P + 3)
        reaches = [(0.0, *itertools.accumulate(rng.choice((0.0, 0.5, 1.0, 2.0)) for _ in range(L))) for _ in range(P)]
        best = min(max(reach[v * n] for reach, n in zip(reaches, split)) for split in compositions(L // v, P))
        bound = stages_tail_bottleneck(reaches, L, v)
        assert bound <= best + 1e-12, (reaches, L, v)
        equal[v] += bound == best
    assert min(equal.values()) > 30, equal


def test_kind_memory_floor_is_below_every_split_of_the_layers():
    """mixed_pipeline_bounds.kind_memory_floor against every split of L layers over k_g <= stages_g stages per
    group, a stage of group g holding n layers in at least const_g + times_g[n - 1] seconds (inf: they do not fit;
    const_g: what its stages add besides the layers, 0 where a row leaves it out): the least slowest stage of any
    split is at or above the bound (inf where no split fits), and equal to it somewhere."""
    from planner.search.mixed_pipeline_bounds import kind_memory_floor

    rng = random.Random(4)
    equal = with_const = 0
    for _ in range(200):
        L, groups = rng.randint(2, 7), rng.randint(1, 3)
        rows = []
        for _ in range(groups):
            steps = itertools.accumulate(rng.choice((0.5, 1.0, 1.5, 3.0)) for _ in range(L))
            fits = rng.randint(1, L)
            row = (rng.randint(1, 3), tuple(t if n < fits else float("inf") for n, t in enumerate(steps)))
            rows.append(row + ((rng.choice((0.25, 1.0)),) if rng.random() < 0.5 else ()))
        best = float("inf")
        for ks in itertools.product(*(range(1, row[0] + 1) for row in rows)):
            owners = [g for g, k in enumerate(ks) for _ in range(k)]
            if len(owners) > L:
                continue
            for split in compositions(L, len(owners)):
                best = min(best, max(sum(rows[g][2:]) + rows[g][1][n - 1] for g, n in zip(owners, split)))
        bound = kind_memory_floor(tuple((row,) for row in rows), L)
        assert bound <= best, (rows, L)
        equal += bound == best
        with_const += bound == best < float("inf") and all(len(row) == 3 for row in rows)
    assert equal > 50 and with_const > 10


def test_kind_bottleneck_is_below_every_assignment_of_the_two_kinds():
    """mixed_pipeline_bounds.kind_bottleneck against every way of placing D dense and E MoE layers on the stages
    (at most caps_s layers each): the slowest stage of each is at or above the bound; and the bound is above the
    one that prices every layer at its stage's cheaper kind somewhere (it counts the kinds apart)."""
    from planner.search.mixed_pipeline_bounds import kind_bottleneck

    rng = random.Random(11)
    tighter = 0
    for _ in range(200):
        P = rng.randint(1, 3)
        xs = [rng.uniform(0.5, 2.0) for _ in range(P)]
        ys = [x * rng.uniform(0.7, 3.0) for x in xs]
        c = [rng.uniform(0.0, 1.0) for _ in range(P)]
        D, E = rng.randint(0, 3), rng.randint(1, 4)
        caps = [rng.randint(1, D + E) for _ in range(P)]
        best = float("inf")
        for ds in itertools.product(range(D + 1), repeat=P):
            if sum(ds) != D:
                continue
            for es in itertools.product(range(E + 1), repeat=P):
                if sum(es) != E or any(d + e > k for d, e, k in zip(ds, es, caps)):
                    continue
                best = min(best, max(d * x + e * y + ci for d, e, x, y, ci in zip(ds, es, xs, ys, c)))
        bound = kind_bottleneck(xs, ys, c, caps, D, E)
        assert bound <= best * SLACK
        if best < float("inf"):
            cheap = [min(x, y) for x, y in zip(xs, ys)]
            plain = kind_bottleneck(cheap, cheap, c, caps, D + E, 0)  # every layer at the cheaper kind
            tighter += bound > plain * (1 + 1e-9)
    assert tighter


def least_slowest_stage(rows, ks, send: bool, ends, L: int, v: int) -> float:
    """The least slowest stage of k_g stages of each row (stages, seconds per layer, sends) in pipeline order over
    every split of the L layers into whole chunks of v: a stage takes its chunks' seconds, its sends (``send``),
    the first the embedding and the last the logits."""
    stage_x = [x for (_, x, _), k in zip(rows, ks) for _ in range(k)]
    const = [y if send else 0.0 for (_, _, y), k in zip(rows, ks) for _ in range(k)]
    const[0] += ends.emb
    const[-1] += ends.logits
    return min(
        max(v * c * x + ci for c, x, ci in zip(chunks, stage_x, const)) for chunks in compositions(L // v, sum(ks))
    )


def open_choice_rows(choices, open_):
    """(a, hi, sends, relaxed) of whole_chunk_bottleneck for groups of TP ``choices`` (stages, seconds per layer,
    sends), an open group as _TpChoiceNode._free and _row give it (its fastest layer, hi / a its best throughput,
    its least sends, its choices), a fixed one at its first choice."""
    a, hi, ys, relaxed = [], [], [], []
    for options, is_open in zip(choices, open_):
        if is_open:
            fast = min(x for _, x, _ in options)
            a.append(fast)
            hi.append(fast * max(k / x for k, x, _ in options))
            ys.append(min(y for _, _, y in options))
            relaxed.append(options)
        else:
            k, x, y = options[0]
            a.append(x), hi.append(k), ys.append(y), relaxed.append(False)
    return a, hi, ys, relaxed


def test_whole_chunk_bottleneck_is_below_every_split_of_the_chunks():
    """mixed_pipeline_bounds.whole_chunk_bottleneck against every stage count k_g <= hi_g per group (in pipeline
    order) and every split of the layers into whole chunks of v per stage: the slowest stage (its chunks, its
    sends, the embedding on the first stage and the logits on the last) is at or above the bound; and the bound is
    above the continuous one (start) somewhere."""
    from planner.search.mixed_pipeline_bounds import Ends, whole_chunk_bottleneck

    rng = random.Random(3)
    tighter = 0
    for _ in range(300):
        n = rng.randint(1, 3)
        v = rng.choice([1, 1, 2])
        L = v * rng.randint(2, 7)
        a = [rng.uniform(0.5, 2.0) for _ in range(n)]
        hi = [rng.randint(1, 3) for _ in range(n)]
        # sends only where every candidate has two stages or more (as box_bound passes them)
        sends = None if n < 2 or rng.random() < 0.3 else [rng.uniform(0.0, 0.5) for _ in range(n)]
        ends = Ends.of(a, [(rng.uniform(0, 1), rng.uniform(0, 1)) for _ in range(n)], 0, n - 1)
        rows = list(zip(hi, a, sends or a))
        best = min(
            (
                least_slowest_stage(rows, ks, sends is not None, ends, L, v)
                for ks in itertools.product(*[range(1, h + 1) for h in hi])
                if sum(ks) <= L // v
            ),
            default=float("inf"),
        )
        bound = whole_chunk_bottleneck(a, hi, ends, L, sends, v, 0.0)
        assert bound <= best * SLACK, (a, hi, sends, v, L)
        # the continuous bottleneck: the hi stages hold fractions of chunks
        inv = sum(k / (v * x) for x, k in zip(a, hi))
        const = sum(k * y / (v * x) for x, k, y in zip(a, hi, sends or [0.0] * n))
        continuous = (L // v + const + ends.emb / (v * a[0]) + ends.logits / (v * a[-1])) / inv
        tighter += bound > continuous * (1 + 1e-6)
    assert tighter


def test_whole_chunk_bottleneck_of_groups_with_open_choices_is_below_every_choice():
    """A group whose TP is still open, given to whole_chunk_bottleneck as its choices (stages, seconds per layer,
    sends), holds what its best choice holds in whole chunks: the bound is at most the bound of every assignment of
    one choice (or none) to each such group, the other groups fixed (whole_chunk_bottleneck itself is checked
    against every split above), at least the bound with those groups at the continuous share of their best
    throughput (relaxed True, as a TP-choice node passed them before), and above it somewhere."""
    from planner.search.mixed_pipeline_bounds import Ends, whole_chunk_bottleneck

    rng = random.Random(11)
    tighter = 0
    for _ in range(400):
        n = rng.randint(2, 4)
        v = rng.choice([1, 2, 3])
        L = v * rng.randint(2, 9)
        open_ = [rng.random() < 0.6 for _ in range(n)]
        open_[rng.randrange(n)] = False  # at least one group fixed
        choices = [
            tuple((rng.randint(1, 3), rng.uniform(0.5, 3.0), rng.uniform(0.0, 0.4)) for _ in range(3)) for _ in range(n)
        ]
        sends = rng.random() < 0.7
        a, hi, ys, relaxed = open_choice_rows(choices, open_)
        ends = Ends.least([Ends.row(x, (0.0, 0.0)) for x in a])
        send = ys if sends else None
        bound = whole_chunk_bottleneck(a, hi, ends, L, send, v, 0.0, tuple(relaxed))
        shares = whole_chunk_bottleneck(a, hi, ends, L, send, v, 0.0, tuple(bool(r) for r in relaxed))
        assert bound >= shares * (1 - 1e-12)
        tighter += bound > shares * (1 + 1e-6)
        for pick in itertools.product(*[range(-1, 3) if open_[g] else (0,) for g in range(n)]):
            rows = [choices[g][c] for g, c in enumerate(pick) if c >= 0]
            ka, kx, ky = [k for k, _, _ in rows], [x for _, x, _ in rows], [y for _, _, y in rows]
            one = whole_chunk_bottleneck(kx, ka, ends, L, ky if sends else None, v, 0.0)
            assert bound <= one * SLACK, (pick, choices, v, L)
    assert tighter


def test_whole_chunk_bottleneck_with_a_stage_cap_is_below_every_split_within_it():
    """With ``most`` (box_bound's max_stages: an interleaved family runs at some depths only), whole_chunk_bottleneck
    is at most the slowest stage of every candidate of at most ``most`` stages (k_g <= hi_g per group, in pipeline
    order, every split into whole chunks), for fixed groups and for groups given as their open TP choices (each
    assignment of one choice or none); and above the bound without the cap somewhere, for each."""
    from planner.search.mixed_pipeline_bounds import Ends, whole_chunk_bottleneck

    rng = random.Random(5)
    tighter = {False: 0, True: 0}
    for case in range(500):
        n = rng.randint(1, 3)
        v = rng.choice([1, 2, 3])
        L = v * rng.randint(3, 8)
        choices = [
            tuple((rng.randint(1, 4), rng.uniform(0.5, 2.0), rng.uniform(0.0, 0.3)) for _ in range(2)) for _ in range(n)
        ]
        open_ = [n > 1 and g > 0 and case % 2 == 1 for g in range(n)]  # (odd cases: groups after the first open)
        a, hi, ys, relaxed = open_choice_rows(choices, open_)
        ends = (
            Ends.least([Ends.row(x, (0.0, 0.0)) for x in a]) if any(open_) else Ends.of(a, [(0.2, 0.3)] * n, 0, n - 1)
        )
        send = ys if n > 1 and rng.random() < 0.7 else None
        most = rng.randint(1, L // v)
        bound = whole_chunk_bottleneck(a, hi, ends, L, send, v, 0.0, tuple(relaxed), most)
        free = whole_chunk_bottleneck(a, hi, ends, L, send, v, 0.0, tuple(relaxed))
        assert bound >= free * (1 - 1e-12)
        tighter[any(open_)] += bound > free * (1 + 1e-6)
        best = float("inf")
        for pick in itertools.product(*[range(-1, 2) if open_[g] else (0,) for g in range(n)]):
            rows = [choices[g][c] for g, c in enumerate(pick) if c >= 0]
            for ks in itertools.product(*[range(1, k + 1) for k, _, _ in rows]):
                if sum(ks) <= most:
                    best = min(best, least_slowest_stage(rows, ks, send is not None, ends, L, v))
        assert bound <= best * SLACK, (case, choices, open_, most, v, L)
    assert all(tighter.values()), tighter


def windows_of(moe: list[bool]) -> tuple[list[int], list[int]]:
    """(fewest, most) MoE layers in any n consecutive layers of a kind sequence, n = 0..L (moe_windows' form)."""
    L = len(moe)
    return tuple([f([sum(moe[i : i + n]) for i in range(L - n + 1)]) for n in range(L + 1)] for f in (min, max))


def test_block_bottleneck_is_below_every_split_into_consecutive_layers():
    """mixed_pipeline_bounds.block_bottleneck against every split of a random dense/MoE layer sequence into
    consecutive blocks, one per stage (at most caps_s layers each): the slowest stage is at or above the bound; and
    the bound is above kind_bottleneck (any mix of the kinds per stage) somewhere. For a sequence of D dense layers
    and then only MoE layers, the bound with moe_from = D is too, and above the one without somewhere."""
    from planner.search.mixed_pipeline_bounds import block_bottleneck, kind_bottleneck

    rng = random.Random(7)
    tighter = by_position = 0
    for _ in range(300):
        L, P = rng.randint(2, 8), rng.randint(1, 3)
        if P > L:
            continue
        leading = rng.random() < 0.5  # dense layers first, then only MoE layers (ModelSpec.all_moe_from)
        D = rng.randint(0, L)
        moe = [i >= D for i in range(L)] if leading else [rng.random() < 0.5 for _ in range(L)]
        windows = windows_of(moe)
        xs = [rng.uniform(0.5, 2.0) for _ in range(P)]
        ys = [x * rng.uniform(0.5, 3.0) for x in xs]
        c = [rng.uniform(0.0, 1.0) for _ in range(P)]
        caps = [rng.randint(1, L) for _ in range(P)]
        best = float("inf")
        for split in compositions(L, P):
            if any(n > k for n, k in zip(split, caps)):
                continue
            start, slowest = 0, 0.0
            for n, x, y, ci in zip(split, xs, ys, c):
                e = sum(moe[start : start + n])
                slowest = max(slowest, (n - e) * x + e * y + ci)
                start += n
            best = min(best, slowest)
        bound = block_bottleneck(xs, ys, windows, c, caps, L)
        assert bound <= best * SLACK, (moe, xs, ys, c, caps)
        if leading:  # a stage at position D or later holds only MoE layers
            positioned = block_bottleneck(xs, ys, windows, c, caps, L, None, D)
            assert bound <= positioned * (1 + 2e-5) and positioned <= best * SLACK, (moe, xs, ys, c, caps)
            by_position += positioned > bound * (1 + 1e-3)  # (both bisected to a relative width of BISECTION)
        if best < float("inf"):
            E = sum(moe)
            tighter += bound > kind_bottleneck(xs, ys, c, caps, L - E, E) * (1 + 1e-6)
    assert tighter and by_position


def _random_blocks(rng: random.Random, L: int, P: int):
    """(moe flags, MoE layers before each position, blocks) of a random dense/MoE sequence of L layers (MoE every
    other layer or at random) and P stages, each (cst, cap, BlockTerms) as sequence_holds reads them."""
    from planner.search.mixed_context import BlockTerms

    moe = [i % 2 == 1 for i in range(L)] if rng.random() < 0.5 else [rng.random() < 0.5 for _ in range(L)]
    before = [sum(moe[:i]) for i in range(L + 1)]
    blocks = []
    for _ in range(P):
        x = rng.uniform(0.5, 2.0)
        ad = rng.uniform(1.0, 3.0)
        ae, room = ad * rng.uniform(0.5, 2.0), rng.uniform(2.0, 12.0)
        rho = rng.choice((float("inf"), rng.uniform(0.1, 1.0)))
        terms = BlockTerms(x, x * rng.uniform(0.5, 3.0), ad, ae, ad * 0.3, ae * 0.3, rho, room)
        blocks.append((rng.uniform(0.0, 1.0), rng.randint(1, L), terms))
    return moe, before, blocks


def _random_sequences(rng: random.Random, cases: int, most_layers: int, most_stages: int):
    """``cases`` draws of (L, moe flags, MoE layers before each position, blocks) (_random_blocks) of 2..most_layers
    layers and 1..most_stages stages, a draw of more stages than layers left out."""
    for _ in range(cases):
        L, P = rng.randint(2, most_layers), rng.randint(1, most_stages)
        if P <= L:
            yield L, *_random_blocks(rng, L, P)


def _split_floors(blocks, before: list[int], L: int):
    """Per split of the L layers into consecutive runs, one per stage within its cap: each stage's floor on its run
    (cst + BlockTerms.time of its length and MoE layers)."""
    for split in compositions(L, len(blocks)):
        if any(n > k for n, (_, k, _) in zip(split, blocks)):
            continue
        start, times = 0, []
        for n, (ci, _, terms) in zip(split, blocks):
            times.append(ci + terms.time(n, before[start + n] - before[start]))
            start += n
        yield times


def test_sequence_holds_exactly_where_a_split_into_consecutive_runs_does():
    """mixed_pipeline_bounds.sequence_holds against every split of a random dense/MoE layer sequence into
    consecutive runs, one per stage in order (1 <= n_s <= caps_s, stage s on its run within T: cst_s +
    BlockTerms.time): it holds exactly where some split does; and it rejects a T that block_bottleneck (each
    stage's cheapest run of its length anywhere) accepts somewhere."""
    from planner.search.mixed_pipeline_bounds import block_bottleneck, sequence_holds

    rng = random.Random(11)
    agree = tighter = 0
    for L, moe, before, blocks in _random_sequences(rng, 300, 8, 4):
        slowest = [max(times) for times in _split_floors(blocks, before, L)]
        best = min(slowest, default=float("inf"))
        for T in [rng.uniform(0.5, 20.0) for _ in range(5)] + [best, best * (1 - 1e-6)]:
            held = any(w <= T for w in slowest)
            assert sequence_holds(blocks, before, T) == held, (moe, blocks, T)
            agree += held
        if best < float("inf"):
            xs = [t.x for _, _, t in blocks]
            ys = [t.y for _, _, t in blocks]
            windows = windows_of(moe)
            plain = [(ci, k, t._replace(room=float("inf"))) for ci, k, t in blocks]  # (block_bottleneck: no memory)
            T = block_bottleneck(xs, ys, windows, [ci for ci, _, _ in blocks], [k for _, k, _ in blocks], L)
            tighter += not sequence_holds(plain, before, T * (1 + 1e-4))
    assert agree and tighter


def test_box_sequence_holds_exactly_where_a_candidate_of_the_box_does():
    """mixed_pipeline_bounds.box_sequence_holds against every candidate of a random box (1-3 groups in pipeline
    order, lo_g..hi_g stages each) and every split of a random dense/MoE layer sequence into consecutive runs, one
    per stage (a stage of group g on n layers holding e MoE layers: c_g + (n - e) x_g + e y_g, the first adding the
    embedding, the last the logits): it holds exactly where some split of some candidate has every stage within T;
    and it rejects a T somewhere that the same splits accept with each stage on its cheapest run of its length
    anywhere (the kinds' places left out, as the box bounds' KindMix does)."""
    from planner.search.mixed_context import LayerRuns
    from planner.search.mixed_pipeline_bounds import box_sequence_holds

    def stage_times(groups, split, before, emb, logits, anywhere=False):
        start, times = 0, []
        for s, (n, (x, y, c)) in enumerate(zip(split, groups)):
            runs = range(len(before) - n) if anywhere else (start,)
            t = c + min((n - (before[q + n] - before[q])) * x + (before[q + n] - before[q]) * y for q in runs)
            times.append(t + (emb if s == 0 else 0.0) + (logits if s == len(split) - 1 else 0.0))
            start += n
        return times

    rng = random.Random(23)
    agree = rejected = by_place = 0
    for _ in range(400):
        L, G = rng.randint(2, 9), rng.randint(1, 3)
        moe = [i % 2 == 1 for i in range(L)] if rng.random() < 0.6 else [rng.random() < 0.5 for _ in range(L)]
        before = [sum(moe[:i]) for i in range(L + 1)]
        x = [rng.uniform(0.5, 2.0) for _ in range(G)]
        y = [xi * rng.uniform(0.3, 3.0) for xi in x]
        c = [rng.choice((0.0, rng.uniform(0.0, 1.0))) for _ in range(G)]
        lo = [rng.randint(1, 2) for _ in range(G)]
        hi = [k + rng.randint(0, 2) for k in lo]
        emb, logits = rng.uniform(0.0, 2.0), rng.uniform(0.0, 2.0)
        slowest, anywhere = [], []
        for ks in itertools.product(*(range(a, b + 1) for a, b in zip(lo, hi))):
            groups = [g for g, k in zip(zip(x, y, c), ks) for _ in range(k)]
            for split in compositions(L, len(groups)):
                slowest.append(max(stage_times(groups, split, before, emb, logits)))
                anywhere.append(max(stage_times(groups, split, before, emb, logits, anywhere=True)))
        best = min(slowest, default=float("inf"))
        runs = LayerRuns.of(before)
        for T in [rng.uniform(0.5, 12.0) for _ in range(4)] + [best, best * (1 - 1e-6)]:
            held = any(w <= T for w in slowest)
            assert box_sequence_holds(runs, x, y, c, lo, hi, emb, logits, T) == held, (moe, x, y, c, lo, hi, T)
            agree += held
            rejected += not held
            by_place += not held and any(w <= T for w in anywhere)
    assert agree > 100 and rejected > 100 and by_place > 20


def test_block_schedule_bound_is_the_least_split_schedule_in_place(monkeypatch):
    """mixed_pipeline_bounds.block_schedule_bound against every split of a random dense/MoE layer sequence into
    consecutive runs (stage s on its run at cst_s + BlockTerms.time, as sequence_holds): with the target above the
    best split's (mb - 1) max + max(work, sum) + tail it is that value exactly (every floor in the window worked out:
    BLOCK_LEVELS large); with few levels never above it; at or above the target exactly where the best split is;
    least_block_bottleneck is the least slowest floor and never above what sequence_holds accepts; and some cases
    are cut where the least bottleneck and the least sum taken apart are not."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(13)
    exact = apart_below = 0
    for L, _, before, blocks in _random_sequences(rng, 400, 9, 4):
        mb, work, tail = rng.choice((1, 2, 4, 16, 64)), rng.uniform(0.0, 10.0), rng.uniform(0.0, 2.0)
        splits = [(max(t), sum(t)) for t in _split_floors(blocks, before, L) if max(t) < float("inf")]
        rows = B._block_floors(blocks, before)
        if not splits:
            assert B.least_block_bottleneck(rows, L) == float("inf")
            assert B.block_schedule_bound(blocks, before, mb, work, tail, 1e9) == float("inf")
            continue
        slowest = min(m for m, _ in splits)
        assert B.least_block_bottleneck(rows, L) == pytest.approx(slowest, rel=1e-12)
        assert B.sequence_holds(blocks, before, slowest)
        best = min((mb - 1) * m + max(work, total) + tail for m, total in splits)
        monkeypatch.setattr(B, "BLOCK_LEVELS", 10**6)
        assert B.block_schedule_bound(blocks, before, mb, work, tail, best * 2 + 1) == pytest.approx(best, rel=1e-9)
        exact += 1
        for target in (best * (1 - 1e-6), best * (1 + 1e-6), best * rng.uniform(0.5, 1.5)):
            for levels in (1, 2, 10**6):
                monkeypatch.setattr(B, "BLOCK_LEVELS", levels)
                got = B.block_schedule_bound(blocks, before, mb, work, tail, target)
                assert got <= best * (1 + 1e-9)
                if levels == 10**6:
                    assert (got >= target) == (best >= target), (got, best, target)
        apart = (mb - 1) * slowest + max(work, min(total for _, total in splits)) + tail
        apart_below += apart < best * (1 - 1e-6)
    assert exact > 100 and apart_below


def _splits(L: int, caps):
    """Every split of L into len(caps) parts with 1 <= n_s <= caps_s."""
    if len(caps) == 1:
        if 1 <= L <= caps[0]:
            yield (L,)
        return
    for n in range(1, min(caps[0], L - len(caps) + 1) + 1):
        for rest in _splits(L - n, caps[1:]):
            yield (n, *rest)


def test_least_schedule_time_is_the_least_schedule_over_every_split(monkeypatch):
    """least_schedule_time against every split of the layers over the stages: never above the best split's
    k max t + sum t / v, equal to it when the steps are not cut short, and never below the bottleneck and the
    least work bounded apart (schedule_bound at T)."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(7)
    for _ in range(300):
        P, L = rng.randint(1, 4), rng.randint(4, 12)
        a = [rng.uniform(0.5, 3.0) for _ in range(P)]
        c = [rng.uniform(0.0, 2.0) for _ in range(P)]
        caps = [rng.randint(1, L) for _ in range(P)]
        k, v = rng.choice([0.0, 1.0, 3.0, 15.0]), rng.choice([1, 2])
        values = [
            (max(ci + n * x for ci, n, x in zip(c, split, a)), sum(ci + n * x for ci, n, x in zip(c, split, a)))
            for split in _splits(L, caps)
        ]
        if not values:
            continue
        T = min(top for top, _ in values) * rng.choice([1.0, 0.9, 0.5])  # a valid bound on the bottleneck
        best = min(k * top + total / v for top, total in values)
        got = B.least_schedule_time(a, c, caps, L, T, k, v)
        assert got <= best * (1 + 1e-9)
        assert got >= k * T + (sum(c) + B.min_work(a, L, caps)) / v - 1e-9
        monkeypatch.setattr(B, "SCHEDULE_STEPS", 10**6)
        assert B.least_schedule_time(a, c, caps, L, T, k, v) == pytest.approx(best, rel=1e-9)
        monkeypatch.setattr(B, "SCHEDULE_STEPS", 64)


def test_least_schedule_with_tail_is_the_least_schedule_plus_tail_over_every_split(monkeypatch):
    """least_schedule_with_tail against every split of the chunks over the stages (stage s holding q chunks takes
    times[s][q - 1] and has a DP tail of reaches[s][q v]): never above the best split's k max t + sum t / v + max
    tail; equal to it when each stage's times are convex in q (linear, or linear with a steeper part past a
    memory limit) and the steps are not cut short; never below least_schedule_time plus the least tail of any
    split taken apart (linear times); with a target, at or above it exactly where the best split is (convex)."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(13)
    above = 0
    for trial in range(400):
        P, v = rng.randint(1, 4), rng.choice([1, 2])
        L = rng.randint(max(P, 3), 10)
        a = [rng.uniform(0.5, 3.0) for _ in range(P)]
        c = [rng.uniform(0.0, 2.0) for _ in range(P)]
        caps = [rng.randint(1, L) for _ in range(P)]
        shape = trial % 3  # 0 linear, 1 convex (a memory limit past which each chunk costs more), 2 any growing
        times = []
        for ci, x, cap in zip(c, a, caps):
            limit, extra = rng.randint(0, cap), rng.uniform(0.0, 4.0)
            bumps = list(itertools.accumulate(rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(cap)))
            times.append(
                [
                    ci
                    + q * x
                    + (extra * max(0, q - limit) if shape == 1 else 0.0)
                    + (bumps[q - 1] if shape == 2 else 0.0)
                    for q in range(1, cap + 1)
                ]
            )
        reaches = []
        for _ in range(P):
            steps = [rng.choice([0.0, rng.uniform(0.0, 4.0)]) for _ in range(L * v)]
            tail = list(itertools.accumulate(steps, initial=rng.uniform(0.0, 3.0)))
            reaches.append(tuple([tail[0], *tail]))  # reach[0] = reach[1]; reach[n] for n layers
        k = rng.choice([0.0, 1.0, 3.0, 15.0])
        values = [
            (
                max(t[n - 1] for t, n in zip(times, split)),
                sum(t[n - 1] for t, n in zip(times, split)),
                max(r[n * v] for r, n in zip(reaches, split)),
            )
            for split in _splits(L, caps)
        ]
        if not values:
            continue
        T = min(top for top, _, _ in values) * rng.choice([1.0, 0.9, 0.5])
        best = min(k * top + total / v + tail for top, total, tail in values)
        got = B.least_schedule_with_tail(times, L, T, k, v, 0.0, reaches)
        assert got <= best * (1 + 1e-9)
        if shape == 0:
            apart = B.least_schedule_time(a, c, caps, L, T, k, v) + min(tail for _, _, tail in values)
            assert got >= apart - 1e-9
            above += got > apart * (1 + 1e-9)
        target = best * rng.choice([0.9, 0.99, 1.01, 1.1])  # (not at best: float rounding)
        assert B.least_schedule_with_tail(times, L, T, k, v, 0.0, reaches, target) <= best * (1 + 1e-9)
        if shape == 2:
            continue
        monkeypatch.setattr(B, "SCHEDULE_STEPS", 10**6)
        assert B.least_schedule_with_tail(times, L, T, k, v, 0.0, reaches) == pytest.approx(best, rel=1e-9)
        assert (B.least_schedule_with_tail(times, L, T, k, v, 0.0, reaches, target) >= target) == (best >= target)
        monkeypatch.setattr(B, "SCHEDULE_STEPS", 64)
    assert above > 10  # the joint bound is above the two bounded apart on many of them


def test_hull_increments_lie_under_the_values():
    """_hull_increments: growing, and the envelope they build is at most every value, equal at the first and at
    the last finite one."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(5)
    for _ in range(200):
        values = list(itertools.accumulate(rng.uniform(0, 3) for _ in range(rng.randint(1, 9))))
        if rng.random() < 0.3:
            values += [float("inf")] * rng.randint(1, 3)
        inc = B._hull_increments(values)
        finite = [x for x in values if x < float("inf")]
        assert len(inc) == len(finite) - 1
        assert all(x <= y + 1e-12 for x, y in zip(inc, inc[1:]))
        env = list(itertools.accumulate(inc, initial=finite[0]))
        assert all(e <= x + 1e-9 for e, x in zip(env, finite))
        assert env[-1] == pytest.approx(finite[-1])


def _random_box(rng: random.Random, trial: int) -> dict:
    """A random box of stage counts for the box_schedule_time tests: 1-3 groups at a_g seconds per layer with sends
    y_g, lo_g..hi_g stages each, L layers in chunks of v, end terms on odd trials, schedule factor k."""
    G, v = rng.randint(1, 3), rng.choice([1, 2])
    L = v * rng.randint(3, 8)
    a = [rng.uniform(0.5, 3.0) for _ in range(G)]
    ys = [rng.choice([0.0, rng.uniform(0.0, 1.0)]) for _ in range(G)]
    lo = [rng.randint(1, 2) for _ in range(G)]
    hi = [k + rng.randint(0, 2) for k in lo]
    emb, logits = (0.0, 0.0) if trial % 2 else (rng.uniform(0, 1), rng.uniform(0, 1))
    return {
        "a": a,
        "ys": ys,
        "lo": lo,
        "hi": hi,
        "L": L,
        "v": v,
        "emb": emb,
        "logits": logits,
        "k": rng.choice([0.0, 1.0, 7.0]),
    }


def _box_candidates(box: dict):
    """Every candidate of the box: (each stage's group, its chunks, its seconds), a stage of group g taking
    y_g + chunks * v * a_g, the first also the embedding and the last the logits, in group order."""
    a, ys, v, L = box["a"], box["ys"], box["v"], box["L"]
    for counts in itertools.product(*(range(x, y + 1) for x, y in zip(box["lo"], box["hi"]))):
        groups = [g for g, n in enumerate(counts) for _ in range(n)]
        for split in _splits(L // v, [L // v] * len(groups)):
            t = [ys[g] + n * v * a[g] for g, n in zip(groups, split)]
            t[0] += box["emb"]
            t[-1] += box["logits"]
            yield groups, split, t


def _box_schedule_args(box: dict, T: float) -> tuple:
    """box_schedule_time's arguments for the box from bottleneck T on, with box_bound's fixed terms and least work."""
    a, lo, ys, L, v = box["a"], box["lo"], box["ys"], box["L"], box["v"]
    fixed = box["emb"] + box["logits"] + sum(n * y for n, y in zip(lo, ys))
    floor = fixed + v * sum(n * x for n, x in zip(lo, a)) + (L - v * sum(lo)) * min(a)  # box_bound's least work
    return (a, lo, box["hi"], ys, L, T, box["k"], v, fixed, floor, None)


def test_box_schedule_time_is_below_every_candidate_of_the_box(monkeypatch):
    """box_schedule_time against every stage-count vector of a box and every split of the chunks over its stages
    (a stage of group g takes y_g + chunks * v * a_g, the first also the embedding and the last the logits, in
    group order): never above the best candidate, equal to it without end terms and sends (which the box's extra
    stages would add) when the steps are not cut short, and never below schedule_bound at its bottleneck."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(11)
    for trial in range(200):
        box = _random_box(rng, trial)
        k, v = box["k"], box["v"]
        best, least_top = float("inf"), float("inf")
        for _, _, t in _box_candidates(box):
            least_top = min(least_top, max(t))
            best = min(best, k * max(t) + sum(t) / v)
        if best == float("inf"):
            continue
        T = least_top * rng.choice([1.0, 0.8])
        sched = _box_schedule_args(box, T)
        floor = sched[9]  # (its work_floor)
        got = B.box_schedule_time(*sched)
        assert got <= best * (1 + 1e-9)
        assert got >= k * T + floor / v - 1e-9
        if not box["emb"] and not box["logits"] and not any(box["ys"]):
            monkeypatch.setattr(B, "SCHEDULE_STEPS", 10**6)
            assert B.box_schedule_time(*sched) == pytest.approx(best, rel=1e-9)
            monkeypatch.setattr(B, "SCHEDULE_STEPS", 64)


def test_box_schedule_with_tail_is_below_every_candidate_of_the_box(monkeypatch):
    """box_schedule_with_tail against every stage-count vector of a box and every split of the chunks over its
    stages, each candidate taking its schedule (as in the box_schedule_time test) plus the largest tail of its
    stages (a stage of group g holding n layers: at least reach_g[n - 1], growing with n): never above the best
    candidate, whatever the target; never below the schedule and the least tail apart; with every level walked in
    full (no budget, no gate) and no end terms or sends, equal to the best candidate, and above the two apart in
    some boxes (where the tails keep the stages from the split with the least schedule)."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(23)
    raised = 0
    for trial in range(200):
        box = _random_box(rng, trial)
        k, v, L = box["k"], box["v"], box["L"]
        reaches = tuple(tuple(itertools.accumulate(rng.uniform(0.0, 2.0) for _ in range(L))) for _ in box["a"])
        best, least_top, least_tail = float("inf"), float("inf"), float("inf")
        for groups, split, t in _box_candidates(box):
            tail = max(reaches[g][n * v - 1] for g, n in zip(groups, split))
            least_top, least_tail = min(least_top, max(t)), min(least_tail, tail)
            best = min(best, k * max(t) + sum(t) / v + tail)
        if best == float("inf"):
            continue
        T = least_top * rng.choice([1.0, 0.8])
        sched = _box_schedule_args(box, T)
        tails = B.BoxTails(reaches, B.merged_levels(reaches), least_tail * rng.choice([1.0, 0.7]))
        apart = B.box_schedule_time(*sched) + tails.least
        for target in (float("inf"), best * 0.97, best, best * 1.05):
            got = B.box_schedule_with_tail(sched, lambda tails=tails: tails, target)
            assert got <= best * (1 + 1e-9)
            assert got >= min(apart, target) - 1e-9
        with monkeypatch.context() as m:
            for name, value in (("SCHEDULE_STEPS", 10**6), ("TAIL_FLOORS", 10**6), ("TAIL_FULL", 10**6)):
                m.setattr(B, name, value)
            m.setattr(B, "TAIL_REACH", float("inf"))  # (every target passes the gate: 1 - inf is -inf)
            got = B.box_schedule_with_tail(sched, lambda tails=tails: tails, 10**9)
            if not box["emb"] and not box["logits"] and not any(box["ys"]) and tails.least == least_tail:
                assert got == pytest.approx(best, rel=1e-9)
            raised += got > apart * (1 + 1e-9)
    assert raised >= 10


def test_box_bound_with_layer_kinds_is_below_every_candidate_of_the_box():
    """box_bound with a KindMix (D dense layers first, then E MoE layers, as ModelSpec.all_moe_from has them)
    against every stage-count vector of a box and every split of the layers into consecutive blocks in group order:
    a stage of group g takes d x_g + e y_g (its dense and MoE layers) plus its sends (two or more stages) and the
    embedding / logits at the ends; the schedule is (m - 1) max + sum. Never above the best candidate, and the
    MoE layers counted in whole layers at their own seconds (KindMix.moe, moe_only_top) raise it somewhere."""

    from planner.search.mixed_pipeline_bounds import Ends, KindMix, box_bound

    rng = random.Random(17)
    raised = 0
    for _ in range(300):
        G, m = rng.randint(1, 3), rng.choice([1, 2, 8])
        D, E = rng.randint(0, 2), rng.randint(1, 7)
        L = D + E
        xs = [rng.uniform(0.5, 2.0) for _ in range(G)]
        ys = [x * rng.uniform(0.5, 4.0) for x in xs]
        send = [rng.choice([0.0, rng.uniform(0.0, 0.5)]) for _ in range(G)]
        lo = [rng.randint(1, 2) for _ in range(G)]
        hi = [k + rng.randint(0, 2) for k in lo]
        ends = [(rng.uniform(0, 0.5), rng.uniform(0, 1.0)) for _ in range(G)]
        best = float("inf")
        for counts in itertools.product(*(range(x, y + 1) for x, y in zip(lo, hi))):
            groups = [g for g, n in enumerate(counts) for _ in range(n)]
            if len(groups) > L:
                continue
            for split in _splits(L, [L] * len(groups)):
                start, t = 0, []
                for g, n in zip(groups, split):
                    d = max(0, min(D, start + n) - start)
                    t.append(d * xs[g] + (n - d) * ys[g] + (send[g] if len(groups) >= 2 else 0.0))
                    start += n
                t[0] += ends[groups[0]][0]
                t[-1] += ends[groups[-1]][1]
                best = min(best, (m - 1) * max(t) + sum(t))
        if best == float("inf"):
            continue
        a = [min(x, y) for x, y in zip(xs, ys)]
        mix = KindMix.of(tuple(zip(xs, ys)), (0.0,) * G, tuple(ends), (D, E), True, None, D)
        args = (a, tuple(lo), tuple(hi), Ends.of(a, ends, 0, G - 1), L, m, tuple(send), 1)
        bound = box_bound(*args, mix=mix, whole=True)
        assert bound <= best * (1 + 1e-9), (xs, ys, send, lo, hi, ends, D, E, m)
        raised += bound > box_bound(*args, mix=mix._replace(moe=()), whole=True) * (1 + 1e-9)
    assert raised


def test_a_floor_below_the_reach_of_box_bound_changes_nothing():
    """box_bound_reach: with any floor below the reach box_bound is the bound without one (the callers skip the
    second bound there), while floors above it change it often: random boxes in pipeline order
    and any order, with and without layer kinds, relaxed rows, sends (dropped where one is above the bottleneck)
    and interleaving."""
    from planner.search.mixed_pipeline_bounds import Ends, KindMix, box_bound, box_bound_reach

    rng = random.Random(41)
    changed = 0
    for _ in range(400):
        G, m, v = rng.randint(1, 3), rng.choice([1, 2, 8]), rng.choice([1, 1, 2])
        D, E = rng.randint(0, 3), rng.randint(1, 8)
        L = (D + E) * v
        xs = [rng.uniform(0.5, 2.0) for _ in range(G)]
        ys = [x * rng.uniform(0.5, 4.0) for x in xs]
        a = tuple(min(x, y) for x, y in zip(xs, ys))
        send = tuple(rng.choice([0.0, rng.uniform(0.0, 0.5), rng.uniform(2.0, 9.0)]) for _ in range(G))
        lo = tuple(rng.randint(1, 2) for _ in range(G))
        hi = tuple(k + rng.randint(0, 3) for k in lo)
        ends = [(rng.uniform(0, 0.5), rng.uniform(0, 1.0)) for _ in range(G)]
        ordered = rng.random() < 0.5
        relaxed = tuple(rng.random() < 0.3 for _ in range(G)) if not ordered else ()
        if relaxed and not all(relaxed):  # a relaxed row need not hold a stage (its sends then may top the rest)
            lo = tuple(0 if r else k for k, r in zip(lo, relaxed))
        mix = None
        if rng.random() < 0.6:
            mix = KindMix.of(tuple(zip(xs, ys)), (0.0,) * G, tuple(ends), (D, E), ordered, None, D)
        at = Ends.of(a, ends, 0, G - 1) if ordered else Ends.any_order(a, ends)
        args = (a, lo, hi, at, L, m, send, v)
        whole = rng.random() < 0.8
        plain, reach = box_bound_reach(*args, mix=mix, whole=whole, relaxed=relaxed)
        assert plain == box_bound(*args, mix=mix, whole=whole, relaxed=relaxed)
        if plain == float("inf"):
            continue
        for floor in sorted(rng.uniform(0.0, 2.0 * reach) for _ in range(6)):
            value = box_bound(*args, floor=floor, mix=mix, whole=whole, relaxed=relaxed)
            if floor < reach:  # (a relaxed row's walk interpolates from where it starts: to rounding)
                assert value == pytest.approx(plain, rel=1e-12), (args, mix, whole, relaxed, floor, reach)
            changed += value > plain * (1 + 1e-12)
    assert changed > 200


def test_memory_floor_is_below_every_whole_layer_split_that_fits():
    """mixed_pipeline_bounds.memory_floor against every way stages hold whole heavy layers within their room,
    each recomputing just enough of them (r(n) = ceil((n alpha - room) / beta), at most n): the slowest stage,
    n a + r(n) rc seconds, is at or above the floor; and counting whole layers (quick.layer_slack, the inverse of
    quick.relaxed_layers) lifts the floor above the continuous count somewhere."""
    from planner.search.mixed_pipeline_bounds import least_time, memory_floor
    from planner.search.quick import layer_slack, relaxed_layers

    rng = random.Random(23)
    lifted = 0
    for _ in range(300):
        rows = []
        for _ in range(rng.randint(1, 3)):
            alpha = rng.uniform(1.0, 3.0)
            beta = alpha * rng.uniform(0.2, 1.2)
            rows.append(
                (
                    rng.randint(1, 2),
                    rng.uniform(0.5, 8.0) * alpha,
                    alpha,
                    beta,
                    rng.uniform(0.5, 2.0),
                    rng.uniform(0.1, 1.0),
                )
            )
        need = rng.randint(1, 8)
        stages = [terms for k, *terms in rows for _ in range(k)]

        def time(n, room, alpha, beta, a, rc):
            over = n * alpha - room
            r = 0 if over <= 0 else math.ceil(over / beta - 1e-12)
            return n * a + r * rc if r <= n else float("inf")

        best = float("inf")
        for counts in itertools.product(range(need + 1), repeat=len(stages)):
            if sum(counts) >= need:
                best = min(best, max(time(n, *t) for n, t in zip(counts, stages)))
        floor = memory_floor(tuple(((k, tuple(terms)),) for k, *terms in rows), need)
        assert floor <= best * (1 + 1e-9), (rows, need)
        for n, t in ((n, t) for t in stages for n in range(1, need + 1)):  # layer_slack inverts relaxed_layers
            s = layer_slack(n, *t)
            if s < float("inf"):
                assert relaxed_layers(s, *t) >= n - 1e-9 and relaxed_layers(s * (1 - 1e-6), *t) < n
        if best < float("inf"):

            def held(T, rows=rows):
                return sum(k * relaxed_layers(T, *terms) for k, *terms in rows)

            continuous = least_time(held, [0.0], need) if held(1e9) >= need else float("inf")
            lifted += floor > continuous * (1 + 1e-6)
    assert lifted


def test_memory_floor_with_all_or_none_recompute_is_below_every_such_split():
    """mixed_pipelines._memory_floors with all_or_none (SearchOptions.all_or_none_recompute: every stage recomputes
    all its heavy layers or none, all stages alike) against every whole-layer split of random stages in both
    pipelines (none recomputed: n alpha <= room, n a seconds; all: n (alpha - beta) <= room, n (a + rc)): the slowest
    stage of each is at or above the floor; the floor is at least the one with recompute just where it is needed,
    and above it somewhere."""
    from planner.search.mixed_pipelines import _memory_floors

    model = mixed_job({**GPT6, "num_layers": 4}).model
    need = model.num_layers  # (a dense model: all its layers are the heavy kind)
    rng = random.Random(29)
    raised = 0
    for _ in range(200):
        rows = [_choice_terms(rng, 2, 0.9) for _ in range(rng.randint(1, 2))]
        stages = [terms for k, *terms in rows for _ in range(k)]
        best = float("inf")
        for counts in itertools.product(range(need + 1), repeat=len(stages)):
            if sum(counts) < need:
                continue
            for every in (False, True):
                times = []
                for n, (room, alpha, beta, a, rc) in zip(counts, stages):
                    fits = n * (alpha - beta if every else alpha) <= room
                    times.append(n * (a + rc if every else a) if fits else float("inf"))
                best = min(best, max(times))
        floor_rows = tuple(((k, tuple(terms)),) for k, *terms in rows)
        floor = _memory_floors(model, floor_rows, None, all_or_none=True)
        partial = _memory_floors(model, floor_rows, None)
        assert partial <= floor * (1 + 1e-9) and floor <= best * (1 + 1e-9), (rows, floor, best)
        raised += floor > partial * (1 + 1e-6)
    assert raised


def _stage_time(n, room, alpha, beta, a, rc):
    """Seconds of a stage holding n heavy layers that recomputes just enough of them to fit (inf: none fits)."""
    over = n * alpha - room
    r = 0 if over <= 0 else math.ceil(over / beta - 1e-12)
    return n * a + r * rc if r <= n else float("inf")


def _choice_terms(rng, most_stages: int = 3, most_freed: float = 1.2):
    """(stages, room, alpha, beta, a, rc) of a random stage kind: up to ``most_stages`` stages, a recompute freeing
    up to ``most_freed`` times what a layer keeps."""
    alpha = rng.uniform(1.0, 3.0)
    return (
        rng.randint(1, most_stages),
        rng.uniform(0.5, 8.0) * alpha,
        alpha,
        alpha * rng.uniform(0.2, most_freed),
        rng.uniform(0.5, 2.0),
        rng.uniform(0.1, 1.0),
    )


def test_memory_floor_of_open_choices_is_below_every_choice_and_split():
    """memory_floor with node groups whose TP is still open (several choices, each its own stage count and
    terms): at or below the slowest stage of every pick of one choice per group (or the group unused) and every
    whole-layer split; never below the floor that lets all of a group's choices hold layers at once (each choice
    its own group), and above it somewhere: a group holds with one choice, not with the stages of all."""
    from planner.search.mixed_pipeline_bounds import memory_floor

    rng = random.Random(29)
    above = 0
    for _ in range(200):
        groups = [[_choice_terms(rng) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 2))]
        need = rng.randint(1, 6)
        best = float("inf")
        for pick in itertools.product(*([None, *choices] for choices in groups)):
            stages = [terms for choice in pick if choice for k, *terms in [choice] for _ in range(k)]
            if len(stages) > 6:
                continue
            for counts in itertools.product(range(need + 1), repeat=len(stages)):
                if sum(counts) >= need:
                    best = min(best, max(_stage_time(n, *t) for n, t in zip(counts, stages)))
        floor = memory_floor(tuple(tuple((k, tuple(t)) for k, *t in choices) for choices in groups), need)
        assert floor <= best * (1 + 1e-9), (groups, need)
        apart = memory_floor(tuple(((k, tuple(t)),) for choices in groups for k, *t in choices), need)
        assert floor >= apart
        above += floor > apart
    assert above > 20


def test_kind_memory_floor_of_open_choices_is_below_every_choice_and_split():
    """kind_memory_floor with groups of several choices (stages, times): at or below the least slowest stage of
    every pick of one choice per group (or unused) and every split of the L layers; above the floor with every
    choice its own group somewhere."""
    from planner.search.mixed_pipeline_bounds import kind_memory_floor

    rng = random.Random(31)
    above = 0
    for _ in range(200):
        L = rng.randint(2, 6)

        def choice(L=L):
            steps = itertools.accumulate(rng.choice((0.5, 1.0, 1.5, 3.0)) for _ in range(L))
            fits = rng.randint(1, L)
            return (rng.randint(1, 2), tuple(t if n < fits else float("inf") for n, t in enumerate(steps)))

        groups = [[choice() for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 2))]
        best = float("inf")
        for pick in itertools.product(*([None, *choices] for choices in groups)):
            rows = [c for c in pick if c]
            for ks in itertools.product(*(range(1, k + 1) for k, _ in rows)):
                owners = [g for g, k in enumerate(ks) for _ in range(k)]
                if not owners or len(owners) > L:
                    continue
                for split in compositions(L, len(owners)):
                    best = min(best, max(rows[g][1][n - 1] for g, n in zip(owners, split)))
        bound = kind_memory_floor(tuple(tuple(choices) for choices in groups), L)
        assert bound <= best, (groups, L)
        apart = kind_memory_floor(tuple((c,) for choices in groups for c in choices), L)
        assert bound >= apart
        above += bound > apart
    assert above > 20


def tp_choice_nodes(ctx):
    """Every _TpChoiceNode of ctx's search tree: the roots and, below each, the nodes its TP choices open."""
    stack = [grp for grp, _ in mixed_pipelines._roots(ctx)]
    while stack:
        node = stack.pop()
        if isinstance(node, mixed_pipelines._TpChoiceNode):
            yield node
            stack += [child for _, child, _ in node.families(ctx)]


def test_tp_choice_nodes_count_the_layer_kinds_apart():
    """A _TpChoiceNode of MOE6 (its free groups standing for every TP choice) bounds with the two layer kinds
    counted apart (_TpChoiceNode._kind_mix: per kind the best throughput of a row's choices, the least MoE-to-dense
    ratio over every choice): at least its bound pricing every layer at the cheaper kind, above it somewhere.
    That the bounds on the way to a candidate hold for its every plan is test_mixed_pipeline_bounds_hold_for_every_plan."""
    ctx = search_context(mixed_job(MOE6))
    raised = nodes = 0
    for node in tp_choice_nodes(ctx):
        nodes += 1
        with_kinds = node.bound(ctx)
        plain = mixed_pipelines._TpChoiceNode._kind_mix
        try:
            mixed_pipelines._TpChoiceNode._kind_mix = lambda self, *args: None
            without = node.bound(ctx)
        finally:
            mixed_pipelines._TpChoiceNode._kind_mix = plain
        assert with_kinds >= without * (1 - 1e-12)
        raised += with_kinds > without * (1 + 1e-9)
    assert nodes and raised


@pytest.mark.parametrize("model", [GPT6, MOE6])
def test_zero_1_memory_floors_are_at_most_zero_0s(model):
    """A TP-choice node's memory floor leaves ZeRO-0 out where ZeRO-1 is searched (mixed_pipelines._memory_zeros):
    ZeRO-1 holds the same items with its optimizer states sharded, so its floor is at most ZeRO-0's. Checked on
    every node of two small mixed jobs, with the memory tight enough that the floors bind (some above 0, some
    inf) and differ between the stages somewhere."""
    ctx = search_context(mixed_job(model))
    seen = above = differ = 0
    for node in tp_choice_nodes(ctx):
        one, zero = (dataclasses.replace(node, zeros=(z,), memo={}, rows=None).memory_floor(ctx) for z in (1, 0))
        assert one <= zero, (node.dp, node.cp, node.mbs, node.fixed)
        seen += 1
        above += 0 < one
        differ += one < zero
    assert seen and above and differ


def candidates_under(ctx, node) -> list:
    """Every candidate under a _TpChoiceNode."""
    L = ctx.job.model.num_layers
    out = []
    for _, fam, (lo, hi) in families(ctx, node):
        for ks in boxes_points(lo, hi, L):
            out += fam.candidates(ctx, ks, 0.0)
    return out


@pytest.mark.parametrize("model", [GPT6, MOE6])
def test_an_interleaved_tp_choice_nodes_stage_cap_holds_every_candidate_under_it(model):
    """With vpp > 1 a _TpChoiceNode caps its stages at the deepest depth that takes its vpp within its stage counts
    (_TpChoiceNode._deepest; its bound is inf where there is none), and each used group's at that less one stage
    of each other used group: every candidate under it has at most that many stages, and the cap is below the
    deepest depth of all somewhere, or a node has none."""
    ctx = search_context(mixed_job(model))
    tighter = nodes = 0
    for node in tp_choice_nodes(ctx):
        if node.vpp == 1:
            continue
        nodes += 1
        cap, cands = node._deepest(ctx), candidates_under(ctx, node)
        assert all(c.pp <= cap for c in cands), (node, cap)
        used = {g for g, tp in zip(ctx.order, node.fixed) if tp}
        each = cap - len(used) + 1
        assert all(k <= each for c in cands for g, _, k in c.groups if g in used), (node, cap)
        if cap == 0:
            assert node.bound(ctx, memory=False) == float("inf")
        tighter += cap < mixed_pipelines._depths(ctx, node.vpp, node.mb)[-1]
    assert nodes and tighter


def fresh_node(node, **changes):
    """A copy of a _TpChoiceNode with its own memo and rows (a node's are its root's, shared with every node under
    it), so its bounds are worked out anew: under a patched rule, or with ``changes`` to its choices."""
    return dataclasses.replace(node, memo=mixed_pipelines._Memo(), rows=None, **changes)


@pytest.mark.parametrize("model", [GPT6, MOE6], ids=["dense", "moe"])
def test_a_node_whose_fixed_groups_fill_the_deepest_depth_leaves_its_open_groups_out(model, monkeypatch):
    """Interleaved at two micro-batches a pipeline runs at depth 2 only: a _TpChoiceNode with two used groups fixed
    has no candidate that uses a group whose TP is still open (_open_unused), so its bounds are those of the node
    whose open groups can only be unused; without the rule they are at most that, and below it somewhere (the
    groups listed third, a fast GPU with little memory, open below the H100 and the L4)."""
    fast = {**SMALL_GPU, "memory_gib": 12.0, "peak_tflops_bf16": 2000, "hbm_tbps": 8.0, "name": "fast-small"}
    ctx = search_context(four_group_job(model, fast))
    checked = raised = 0
    for node in tp_choice_nodes(ctx):
        left = len(ctx.order) - len(node.fixed)
        if not left or not node._open_unused(ctx):
            continue
        open_groups = set(ctx.order[len(node.fixed) :])
        assert not any(g in open_groups for c in candidates_under(ctx, node) for g, _, _ in c.groups), node
        shut = fresh_node(node, tp_opts=node.tp_opts[: len(node.fixed)] + ((None,),) * left)
        bound = node.bound(ctx)
        assert bound == shut.bound(ctx)
        with monkeypatch.context() as m:
            m.setattr(mixed_pipelines._TpChoiceNode, "_open_unused", lambda self, ctx: False)
            before = fresh_node(node).bound(ctx)
        assert before <= bound
        checked += 1
        raised += before < bound
    assert checked and raised


def test_a_node_with_a_tp_open_prices_the_stages_past_the_leading_dense_layers(monkeypatch):
    """A _TpChoiceNode with a group's TP still open bounds the stages past a model's leading dense layers at their
    MoE layers' seconds (mixed_pipeline_bounds.open_lead_schedule_time: the open group's choices each at its own
    seconds, a pool of the stages before that end at the least seconds): at least its bound without, above it
    somewhere. That it holds for every plan under the node is test_the_highest_bounds_on_the_way_hold_for_every_plan
    (the node bounds on the way to each candidate, brute force, one and three leading dense layers)."""
    ctx = search_context(four_group_job(MOE6))
    checked = raised = 0
    for node in tp_choice_nodes(ctx):
        if len(node.fixed) == len(ctx.order):
            continue
        bound = node.bound(ctx, memory=False)
        with monkeypatch.context() as m:
            m.setattr(mixed_pipeline_bounds, "open_lead_schedule_time", lambda *args: 0.0)
            before = fresh_node(node).bound(ctx, memory=False)
        assert before <= bound
        checked += 1
        raised += before < bound
    assert checked and raised


def test_tp_choice_nodes_bound_the_groups_memory():
    """A _TpChoiceNode's bound with its groups' memory (each group at the roomiest of its TP choices, per ZeRO
    stage) is at least its bound without, and above it somewhere (inf where no ZeRO stage holds the layers).
    That it holds for every plan below the node is test_the_highest_bounds_on_the_way_hold_for_every_plan."""
    ctx = search_context(mixed_job(MOE6))
    raised = nodes = 0
    for node in tp_choice_nodes(ctx):
        nodes += 1
        with_memory, without = node.bound(ctx), node.bound(ctx, memory=False)
        assert with_memory >= without
        raised += with_memory > without * (1 + 1e-9)
    assert nodes and raised


@pytest.mark.parametrize("model", [GPT6, MOE6])
def test_a_tp_choice_nodes_memory_floor_is_below_every_family_under_it(model):
    """_TpChoiceNode.memory_floor (per ZeRO stage, each group at the roomiest of its choices, the least over the
    ZeRO stages) on two GPUs short of memory: at most the memory floor of every ordered family below it that has
    the room at its own ZeRO stage, each of its stages as if none followed it (mixed_pipelines._memory_floor,
    tested against brute force in test_memory_floor_is_below_every_whole_layer_split_that_fits), and equal to it
    for some (a one-choice node)."""
    j = mixed_job(model, TIGHT_GPU)
    ctx = search_context(j)
    L = j.model.num_layers
    checked = equal = 0
    for node in tp_choice_nodes(ctx):
        floor = node.memory_floor(ctx)
        for _, fam, (_, hi) in families(ctx, node):
            if sum(z.room(0, k, fam.vpp) for z, k in zip(fam.zt, hi)) < L:
                continue
            below = mixed_pipelines._memory_floor(fam.zt, [0] * len(fam.zt), hi, fam.vpp)
            assert floor <= below * (1 + 1e-12), (node, fam.used, fam.zero)
            checked += 1
            equal += floor == below > 0
    assert checked and equal


def test_memory_floor_of_open_choices_is_the_least_over_the_picks():
    """memory_floor with groups standing for several choices (a group whose TP is still open) is the least of its
    floors with one choice per group: a group holds at T the most layers any of its choices holds (the slacks
    grow with the layer count), so the count summed over the groups is the largest over the picks."""
    from planner.search.mixed_pipeline_bounds import memory_floor

    rng = random.Random(31)
    finite = 0

    def terms():
        alpha = rng.uniform(1.0, 3.0)
        return (
            rng.uniform(0.5, 8.0) * alpha,
            alpha,
            alpha * rng.uniform(0.2, 1.2),
            rng.uniform(0.5, 2.0),
            rng.uniform(0.1, 1.0),
        )

    for _ in range(300):
        groups = [
            tuple((rng.randint(1, 3), terms()) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3))
        ]
        need = rng.randint(1, 10)
        floor = memory_floor(tuple(groups), need)
        each = [memory_floor(tuple((c,) for c in pick), need) for pick in itertools.product(*groups)]
        assert floor == min(each)
        finite += floor < float("inf")
    assert finite


def test_memory_floor_is_the_first_slack_at_which_the_layers_are_held():
    """memory_floor (which takes a choice's next layers in a run while no other choice's comes first) against its
    definition: every choice's layer slacks (quick.layer_slack, n = 1..need) in ascending order, a group holding at
    each the most any of its choices holds, the first at which the groups hold ``need``. Exactly equal, on terms
    with many equal slacks (whole numbers) and on random ones, with up to eight groups of up to three choices."""
    from planner.search.mixed_pipeline_bounds import memory_floor
    from planner.search.quick import layer_slack

    def by_definition(groups, need: int) -> float:
        slacks = sorted(
            (layer_slack(n, *t), g, k, n)
            for g, choices in enumerate(groups)
            for k, t in choices
            if k > 0 and t[0] > 0
            for n in range(1, need + 1)
        )
        held_by = [0] * len(groups)
        for T, g, k, n in slacks:
            if T == float("inf"):
                break
            held_by[g] = max(held_by[g], k * n)
            if sum(held_by) >= need:
                return T
        return float("inf")

    rng = random.Random(37)
    ties = finite = 0
    for case in range(600):
        whole = case % 2 == 0

        def terms(whole=whole):
            if whole:
                alpha = rng.randint(1, 3)
                return (rng.randint(0, 12) * alpha, alpha, rng.randint(0, alpha), rng.randint(1, 3), rng.randint(0, 2))
            alpha = rng.uniform(1.0, 3.0)
            room = rng.uniform(0.0, 8.0) * alpha
            return (room, alpha, alpha * rng.uniform(0.0, 1.2), rng.uniform(0.5, 2.0), rng.uniform(0.0, 1.0))

        groups = tuple(
            tuple((rng.randint(0, 3), terms()) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 8))
        )
        need = rng.randint(1, 40)
        expected = by_definition(groups, need)
        assert memory_floor(groups, need) == expected, (groups, need)
        finite += expected < float("inf")
        values = [layer_slack(n, *t) for choices in groups for k, t in choices if k for n in range(1, need + 1)]
        ties += len(values) > len(set(values))
    assert finite > 200 and ties > 100


@pytest.mark.parametrize("model", [MOE6, MOE8_LEAD3], ids=["one-dense", "three-dense"])
def test_the_highest_bounds_on_the_way_hold_for_every_plan(model):
    """The candidates of an MoE model (one or three leading dense layers) whose bounds on the way (group,
    _TpChoiceNode, unordered and ordered family boxes) come highest against their own refined bound, where a bound
    too high would show first: each is at most the brute-force best plan. (A sample of all candidates,
    test_mixed_pipeline_bounds_hold_for_every_plan, misses them: e.g. a TP node's MoE seconds taken at a row's
    worst choice instead of its best.)"""
    j = mixed_job(model)
    ctx = search_context(j)
    cache: dict = {}
    scored = []
    for bounds, fam, c in candidates_with_bounds(ctx):
        rb = refined_bound(ctx, fam, c, mixed_pipelines._stage_models(ctx, c, cache))
        if rb < float("inf"):
            scored.append((max(bounds) / rb, bounds, c))
    scored.sort(key=lambda x: -x[0])
    assert scored[0][0] > 1.0  # some bound on the way is above the candidate's own refined bound
    for _, bounds, c in scored[:30]:
        best = brute_mixed(ctx.job, c, ctx, ctx.opts.memory_margin)
        assert all(b <= best.fit_time * SLACK for b in bounds), (c.groups, bounds, best.fit_time)


# an 8-layer MoE model with an MoE layer every other layer after a dense first one (as Llama 4 Maverick), its MoE
# layers well above its dense ones in seconds (eight experts of a dense layer's size each)
MOE8_ALTERNATE = {
    **SMALL_MOE,
    "name": "moe-8-alternate",
    "num_layers": 8,
    "moe": {**SMALL_MOE["moe"], "moe_layer_freq": 2, "top_k": 8, "expert_ffn_hidden_size": 2816},
}


def alternate_job(groups: int = 2):
    """MOE8_ALTERNATE on ``groups`` one-GPU groups of different speed and memory."""
    gpus = [
        {**TIGHT_GPU, "name": name, "memory_gib": gib, "peak_tflops_bf16": tflops}
        for name, gib, tflops in (("a", 12.0, 312), ("b", 12.5, 200), ("c", 12.0, 400))[:groups]
    ]
    return parse_job(
        {
            "model": MOE8_ALTERNATE,
            "cluster": [{"gpu": gpu, "nodes": 1, "gpus_per_node": 1} for gpu in gpus],
            "training": {"seq_length": 2048, "global_batch_size": 16, "attention": "eager"},
        }
    )


def counted_sequence_cuts(monkeypatch) -> list:
    """box_sequence_holds as the mixed search calls it, patched to note each answer: the list it appends to (True:
    the check cut the box)."""
    holds = mixed_pipeline_bounds.box_sequence_holds
    cuts: list = []

    def counted(*args):
        held = holds(*args)
        cuts.append(not held)
        return held

    monkeypatch.setattr(mixed_pipelines, "box_sequence_holds", counted)
    return cuts


def test_an_ordered_box_the_layer_sequence_cuts_holds_no_plan_below_its_target(monkeypatch):
    """An ordered family's box bound with a target (_Family.bound: where the stages cannot hold the layers in their
    places within the bottleneck that would reach it, box_sequence_holds, the box is cut), on a model whose MoE
    and dense layers alternate: for every candidate, at a target just above the brute-force best plan of the
    candidate, its own box and a box spanning it and another candidate of its family are not cut; at targets below
    its best some of them are cut by the sequence check alone (the bound without it below the target)."""
    j = alternate_job()
    ctx = search_context(j)
    L = j.model.num_layers
    by_family: dict = {}  # (by identity: a family holds unhashable terms)
    for _, fam, c in candidates_with_bounds(ctx):
        if fam.runs is not None and fam.mb >= 2:
            by_family.setdefault(id(fam), (fam, []))[1].append(c)
    sequence_cuts = counted_sequence_cuts(monkeypatch)
    rng = random.Random(3)
    cut_below = 0
    for fam, c in [(fam, c) for fam, cs in by_family.values() for c in cs]:
        best = brute_mixed(j, c, ctx, ctx.opts.memory_margin).fit_time
        if best == float("inf"):
            continue
        ks = tuple(k for _, _, k in c.groups)
        other = tuple(k for _, _, k in rng.choice(by_family[id(fam)][1]).groups)
        wide = tuple(map(min, ks, other)), tuple(map(max, ks, other))
        above = best * (1 + 1e-9)
        sequence_cuts.clear()
        assert fam.bound(L, ks, ks, above) < above and fam.bound(L, *wide, above) < above, (c.groups, best)
        assert not any(sequence_cuts)
        for below in (best * 0.99, best * 0.95, best * 0.9):
            sequence_cuts.clear()
            if fam.bound(L, ks, ks, below) >= below and sequence_cuts and sequence_cuts[-1]:
                cut_below += 1
    assert cut_below


def open_families_with_candidates(ctx) -> list:
    """Every open family the search reaches under each root's TP-choice nodes (one per ZeRO stage, then per first
    and last group), as (open family, box, [(ordered family, candidate)] of every order under it)."""
    L = ctx.job.model.num_layers
    out = []

    def under(fam, box) -> list:
        found = []
        children = fam.opened()
        if not children:
            for ordered, (lo, hi) in fam.expand(ctx, *box):
                for ks in boxes_points(lo, hi, L):
                    found += [(ordered, c) for c in ordered.candidates(ctx, ks, 0.0)]
        for child in children:
            found += under(child, box)
        out.append((fam, box, found))
        return found

    def walk(node) -> None:
        for _, child, box in node.families(ctx):
            if isinstance(child, mixed_pipelines._TpChoiceNode):
                walk(child)
            else:
                under(child, box)

    for root, _ in mixed_pipelines._roots(ctx):
        walk(root)
    return out


def test_an_open_family_the_layer_sequence_cuts_holds_no_plan_below_its_target(monkeypatch):
    """An open family of at most SEQUENCE_ORDERS group orders is cut where in none of them its stages hold the
    layers in their places within the bottleneck that would reach the target (_Family._holds_in_place), on the
    model whose MoE and dense layers alternate: at a target just above the brute-force best plan of the candidates
    of any one order under it, no open family is cut; at targets below the best of all some are, by the sequence
    check alone."""
    j = alternate_job()
    ctx = search_context(j)
    L = j.model.num_layers
    sequence_cuts = counted_sequence_cuts(monkeypatch)
    best_of: dict = {}
    checked = cut_below = 0
    for fam, box, found in open_families_with_candidates(ctx):
        if not fam.in_place:
            continue
        by_order: dict = {}  # the best plan of the candidates in each group order
        for ordered, c in found:
            if c not in best_of:
                best_of[c] = brute_mixed(j, c, ctx, ctx.opts.memory_margin).fit_time
            by_order[ordered.used] = min(by_order.get(ordered.used, float("inf")), best_of[c])
        for value in by_order.values():  # (the least of them too)
            if value < float("inf"):
                above = value * (1 + 1e-9)
                sequence_cuts.clear()
                assert fam.bound(L, *box, above) < above, (fam.used, fam.zeros, value)
                assert not any(sequence_cuts)
                checked += 1
        best = min(by_order.values(), default=float("inf"))
        if best == float("inf"):
            continue
        for below in (best * 0.99, best * 0.95, best * 0.9):
            sequence_cuts.clear()
            if fam.bound(L, *box, below) >= below and sequence_cuts and all(sequence_cuts):
                cut_below += 1
    assert checked and cut_below


def test_least_forced_work_is_below_every_split_with_the_recompute_memory_forces():
    """mixed_pipeline_bounds.least_forced_work against every split of the heavy layers over the stages (at most
    cap each, at least one each where asked): a stage holding n takes n h + r rc with r = ceil((n alpha - room) /
    beta) recomputed layers (at most n, else the split does not fit); the least sum is at or above the bound, and
    the bound is above the work without recompute somewhere."""
    from planner.search.mixed_pipeline_bounds import least_forced_work

    rng = random.Random(29)
    above = 0
    for _ in range(400):
        P, need = rng.randint(1, 3), rng.randint(1, 9)
        one_each = rng.random() < 0.5
        stages = []
        for _ in range(P):
            alpha = rng.uniform(1.0, 3.0)
            beta = alpha * rng.uniform(0.2, 1.0)  # a recomputed layer frees at most what it keeps
            room = rng.uniform(-1.0, 6.0) * alpha
            stages.append((rng.uniform(0.5, 2.0), room, alpha, beta, rng.uniform(0.1, 1.0), rng.randint(1, 9)))

        def cost(n, h, room, alpha, beta, rc, cap):
            over = n * alpha - room
            r = 0 if over <= 0 else math.ceil(over / beta - 1e-12)
            return n * h + r * rc if n <= cap and r <= n else float("inf")

        best = plain = float("inf")
        low = 1 if one_each else 0
        for split in itertools.product(range(low, need + 1), repeat=P):
            if sum(split) == need:
                best = min(best, sum(cost(n, *st) for n, st in zip(split, stages)))
                if all(n <= st[-1] for n, st in zip(split, stages)):
                    plain = min(plain, sum(n * st[0] for n, st in zip(split, stages)))
        bound = least_forced_work(stages, need, one_each)
        assert bound <= best * (1 + 1e-9), (stages, need, one_each)
        above += plain < bound < float("inf")
    assert above


def test_capped_rate_is_the_most_any_stage_set_within_the_cap_takes():
    """mixed_pipeline_bounds.capped_rate against every choice of at most ``most`` stages, at most hi_g of group g
    (each taking 1/a_g layers per second): it is the largest total rate, below the uncapped one somewhere."""
    from planner.search.mixed_pipeline_bounds import capped_rate

    rng = random.Random(37)
    below = 0
    for _ in range(300):
        G = rng.randint(1, 4)
        a = [rng.uniform(0.5, 3.0) for _ in range(G)]
        hi = [rng.randint(0, 4) for _ in range(G)]
        most = rng.randint(1, 8)
        best = max(
            sum(q / x for q, x in zip(qs, a))
            for qs in itertools.product(*(range(k + 1) for k in hi))
            if sum(qs) <= most
        )
        assert capped_rate(a, hi, most) == pytest.approx(best, rel=1e-12)
        below += best < sum(k / x for k, x in zip(hi, a)) * (1 - 1e-9)
    assert below


def bounds_raised_by(monkeypatch, j, without) -> list:
    """The (bounds, family, candidate) of job j (candidates_with_bounds) some of whose bounds on the way are above
    the same bounds with a term left out (``without(monkeypatch)`` patches it away; undone after, with every patch
    made before the call)."""
    found = candidates_with_bounds(search_context(j))
    without(monkeypatch)
    bare = candidates_with_bounds(search_context(j))
    monkeypatch.undo()
    assert len(found) == len(bare) and all(x[2] == y[2] for x, y in zip(found, bare))
    return [x for x, y in zip(found, bare) if any(a > b * (1 + 1e-9) for a, b in zip(x[0], y[0]))]


def test_a_memoized_stage_row_is_the_one_of_its_own_position():
    """_stage_row shares a stage's refined-bound terms across positions and depths; with three leading dense layers
    a stage at position 1 may hold dense layers and one at position 3 or later holds MoE layers only (its DP tail
    floor, read off the tail profile from its window start, differs), so the memo must tell them apart: every row
    it returns, over every candidate in the search's order, is the one worked out afresh for that position."""
    from planner.search.mixed_pipeline_bounds import _stage_bound, _stage_bounds

    model = MOE8_LEAD3
    j = mixed_job(model, gbs=8)
    ctx = search_context(j)
    cache: dict = {}
    differ = 0
    for _, _, c in candidates_with_bounds(ctx):
        sms = mixed_pipelines._stage_models(ctx, c, cache)
        for i, (row, sm, g) in enumerate(zip(_stage_bounds(ctx, c, sms), sms, c.stage_groups)):
            fresh = _stage_bound(ctx, sm, g, i)
            assert row == fresh, (c, i)
            differ += i in (1, 2) and fresh.tail != _stage_bound(ctx, sm, g, 3).tail if c.pp > 3 else 0
    assert differ  # the positions' tails do differ somewhere


def test_the_box_tail_of_the_first_and_last_stages_holds_for_every_plan(monkeypatch):
    """A box of two or more stages takes the DP tail of the pipeline's first stage (the embedding's gradients, over
    the few layers its memory leaves it) and of its last (past three leading dense layers, MoE layers only):
    ZeroTerms.end_tails. It raises some candidate's box bound above the one without it, and every bound of those
    candidates stays at most their brute-force best plan."""
    from planner.search.mixed_context import ZeroTerms

    model = MOE8_LEAD3
    j = mixed_job(model, gbs=8)
    L = j.model.num_layers
    found = candidates_with_bounds(search_context(j))
    monkeypatch.setattr(ZeroTerms, "end_tails", lambda self, after_first, vpp=1: (0.0, 0.0))
    bare = candidates_with_bounds(search_context(j))
    monkeypatch.undo()
    raised = [x for x, y in zip(found, bare) if x[0][-1] > y[0][-1] * (1 + 1e-9)]
    assert raised and all(x[2] == y[2] for x, y in zip(found, bare))
    assert all(c.pp >= 2 and sum(k for _, _, k in c.groups) <= L for _, _, c in raised)
    assert_bounds_hold(search_context(j), random.Random(7).sample(raised, min(40, len(raised))))


def test_a_tp_choice_node_with_every_tp_fixed_prices_the_stages_past_the_leading_dense_layers(monkeypatch):
    """A _TpChoiceNode whose TP choices are all made bounds its box as its open family does: the stages past the
    model's leading dense layers hold MoE layers only, each at its MoE layer's seconds (KindMix.lead: box_bound's
    moe_split). That raises some node's bound above the one without it (three leading dense layers), and every
    bound of those candidates stays at most their brute-force best plan."""
    model = MOE8_LEAD3
    j = mixed_job(model, gbs=8)
    kind_mix = mixed_pipelines._TpChoiceNode._kind_mix

    def without_lead(self, ctx, kind_rows):
        mix = kind_mix(self, ctx, kind_rows)
        return mix if mix is None else mix._replace(lead=None)

    raised = bounds_raised_by(
        monkeypatch, j, lambda mp: mp.setattr(mixed_pipelines._TpChoiceNode, "_kind_mix", without_lead)
    )
    assert raised
    assert_bounds_hold(search_context(j), random.Random(7).sample(raised, min(40, len(raised))))


def test_box_schedule_with_tail_walks_a_box_far_below_its_target_where_the_walk_can_reach_it():
    """A box whose schedule and least tail apart stay more than TAIL_REACH below the target is still walked where
    the walk's first level (the caps at the least tail, in full) reaches the target, so the tails cut it (seed-5
    suite job 10, DP tails far above its schedule, needs it). Where that first level is
    below the target, the two apart come back without a walk."""
    from planner.search import mixed_pipeline_bounds as B

    rng = random.Random(23)
    cut_far = 0
    for trial in range(200):
        box = _random_box(rng, trial)
        L, v = box["L"], box["v"]
        reaches = tuple(tuple(itertools.accumulate(rng.uniform(0.0, 2.0) for _ in range(L))) for _ in box["a"])
        least_tail = min(r[v - 1] for r in reaches)
        sched = _box_schedule_args(box, 0.0)
        tails = B.BoxTails(reaches, B.merged_levels(reaches), least_tail)
        apart = B.box_schedule_time(*sched) + tails.least
        if apart == float("inf"):
            continue
        first = bisect.bisect_left(tails.levels, tails.least)
        caps = tuple(bisect.bisect_right(r, tails.levels[first]) // v for r in reaches)
        at_first = B.box_schedule_time(*sched, caps=caps)
        for target in (apart / (1 - B.TAIL_REACH) * 1.01, apart * 1.5):
            got = B.box_schedule_with_tail(sched, lambda tails=tails: tails, target)
            if at_first + tails.levels[first] < target:
                assert got == apart  # (the walk's least lies below the target: not walked)
            elif got >= target:
                cut_far += 1
    assert cut_far >= 5


def test_the_traffic_and_tail_term_of_a_node_bites_and_is_plain_where_one_stage_may_run():
    """_TpChoiceNode._lined_tail_bound (the ZeRO stages' traffic and least DP tail, held for every plan under the
    node by the bound tests above, which walk with it) raises the bound of some nodes with every TP fixed and of
    some with one group's TP open above their schedule floor, and is that floor where a candidate may have one
    stage (vpp 1, fewer than two used groups fixed); the node's bound counts it up to TAIL_OPEN groups open."""
    ctx = search_context(four_group_job(GPT6))
    raised = ones = opened = 0
    for node in tp_choice_nodes(ctx):
        open_groups = len(ctx.order) - len(node.fixed)
        plain = node._schedule_bound(ctx, math.inf, False)
        term = node._lined_tail_bound(ctx, plain, math.inf)
        # (above TAIL_OPEN groups open the node's bound leaves it out)
        assert node.bound(ctx, memory=False) == (term if open_groups <= mixed_pipelines.TAIL_OPEN else plain)
        if node._one_stage_possible():
            assert term == plain
            ones += 1
            continue
        raised += open_groups == 0 and term > plain
        opened += open_groups == 1 and term > plain
    assert raised and ones and opened


def test_a_node_with_its_zero_traffic_in_every_layers_seconds_holds_for_every_plan(monkeypatch):
    """_TpChoiceNode._lined_schedule: at a ZeRO stage with ZeRO-2/3 traffic, the node's schedule with that traffic
    in every layer's seconds (so in the bottleneck too, not only in the stages' sum). On short sequences (little
    compute to hide the gathers) it raises some candidates' node bounds above the ones with the traffic in the sum
    only (on MOE6: its experts' gathers), and every bound of those candidates stays at most their brute-force best
    plan."""
    j = mixed_job(MOE6, seq=512, gbs=8)
    raised = bounds_raised_by(
        monkeypatch,
        j,
        lambda mp: mp.setattr(mixed_pipelines._TpChoiceNode, "_lined_schedule", lambda self, ctx, zero, target: 0.0),
    )
    assert raised
    assert_bounds_hold(search_context(j), random.Random(7).sample(raised, min(30, len(raised))))


@pytest.mark.parametrize("model", [GPT6, MOE6], ids=["dense", "moe"])
def test_the_least_dp_tail_of_a_node_with_one_tp_open_is_at_most_each_of_its_childrens(model):
    """A node with one group's TP still open bounds its least DP tail (_least_tail; _tail_row: the open group's
    choices each a row, holding what its best one holds) at most that of each node under it (that group's TP fixed,
    or the group unused), at every ZeRO stage; above 0 somewhere."""
    ctx = search_context(four_group_job(model))
    checked = raised = 0
    for node in tp_choice_nodes(ctx):
        if len(node.fixed) != len(ctx.order) - 1:
            continue
        kids = [k for _, k, _ in node.families(ctx) if isinstance(k, mixed_pipelines._TpChoiceNode)]
        for zero in node.zeros:
            tail = node._least_tail(ctx, zero)
            assert tail <= min(k._least_tail(ctx, zero) for k in kids) * (1 + 1e-12)
            raised += tail > 0
        checked += 1
    assert checked and raised


def test_a_nodes_zero_traffic_counts_only_the_zero_stages_that_fit_and_each_groups_own_slope(monkeypatch):
    """_TpChoiceNode._fitting_lines: a node with every TP fixed, out of line with its memory terms, adds the least
    ZeRO-2/3 traffic of the ZeRO stages whose memory holds the layers (memory_zeros), each group's layers at its
    own slope (the MoE layers at their MoE slope) up to what its memory holds. On an MoE model whose 32 experts
    fit 8 GiB GPUs only sharded (ZeRO-3), it raises some candidates' node bounds (walked without the ZeRO traffic and
    DP tail term, _lined_tail_bound, which also counts traffic), and every bound of those candidates stays at most
    their brute-force best plan."""
    model = {**MOE6, "moe": {**MOE6["moe"], "num_experts": 32}}
    j = parse_job(
        {
            "model": model,
            "cluster": [
                {"gpu": {**SMALL_GPU, "memory_gib": 8.0}, "nodes": 1, "gpus_per_node": 4},
                {"gpu": {**TIGHT_GPU, "memory_gib": 8.0}, "nodes": 1, "gpus_per_node": 4},
            ],
            "training": {"seq_length": 1024, "global_batch_size": 4, "attention": "eager"},
        }
    )
    monkeypatch.setattr(mixed_pipelines._TpChoiceNode, "_lined_tail_bound", lambda self, ctx, plain, target: plain)
    raised = bounds_raised_by(
        monkeypatch, j, lambda mp: mp.setattr(mixed_pipelines._TpChoiceNode, "_fitting_lines", lambda self, ctx: 0.0)
    )
    assert raised
    assert_bounds_hold(search_context(j), random.Random(7).sample(raised, min(40, len(raised))))


def test_least_line_sum_fills_the_cheapest_rows_first():
    """mixed_pipeline_bounds.least_line_sum: the least sum over every way to put the layers in the rows (checked
    by enumeration), inf where the rows cannot hold them."""
    from planner.search.mixed_pipeline_bounds import least_line_sum

    rows = [(0.5, 3), (-0.1, 2), (0.2, 4), (0.0, 1)]
    for need in range(0, 11):
        best = min(
            sum(n * slope for n, (slope, _) in zip(ns, rows))
            for ns in itertools.product(*(range(k + 1) for _, k in rows))
            if sum(ns) == need
        )
        assert least_line_sum(rows, need) == pytest.approx(best, abs=1e-12)
    assert least_line_sum(rows, 11) == float("inf")
    assert least_line_sum([(1.0, float("inf"))], 5) == 5.0


def test_whole_layer_slack_is_the_least_time_over_whole_recompute_counts_that_fit():
    """mixed_pipeline_bounds.whole_layer_slack: n layers at a seconds each plus rc per recomputed layer, the fewest
    whole layers recomputed (each frees beta of its alpha bytes) that fit the room, checked by enumeration; inf
    where none fits; never below quick.layer_slack, its relaxed form, and above it somewhere."""
    from planner.search.mixed_pipeline_bounds import whole_layer_slack

    rng = random.Random(3)
    above = 0
    for _ in range(400):
        alpha = rng.uniform(1.0, 3.0)
        beta = rng.uniform(0.2, 1.0) * alpha
        room, a, rc = rng.uniform(0.0, 12.0), rng.uniform(0.1, 1.0), rng.uniform(0.0, 0.5)
        for n in range(1, 9):
            fits = [r for r in range(n + 1) if n * alpha - r * beta <= room + 1e-9]
            want = n * a + min(fits) * rc if fits else float("inf")
            got = whole_layer_slack(n, room, alpha, beta, a, rc)
            assert got == pytest.approx(want) if fits else got == float("inf"), (n, room, alpha, beta)
            relaxed = quick.layer_slack(n, room, alpha, beta, a, rc)
            assert got >= relaxed * (1 - 1e-12) or rc == 0.0
            above += got > relaxed * (1 + 1e-9)
    assert above


def test_the_tail_trial_stays_on_while_its_term_cuts_and_probes_when_it_does_not():
    """TailTrial: on while at least TAIL_PAYS of its tries cut; below that, every TAIL_PROBE-th call only, and on
    again once the probes' cuts bring the share back up."""
    trial = mixed_pipelines.TailTrial()
    for _ in range(10):
        assert trial.pays()
        trial.tell(True)
    while trial.cuts >= mixed_pipelines.TAIL_PAYS * trial.tries:  # nothing cuts any more: on until the share drops
        assert trial.pays()
        trial.tell(False)
    probe = mixed_pipelines.TAIL_PROBE
    on = sum(trial.pays() for _ in range(10 * probe))  # (no cut told: off, but for the probes)
    assert on == 10
    while trial.cuts < mixed_pipelines.TAIL_PAYS * trial.tries:  # the probes cut again: back on
        if trial.pays():
            trial.tell(True)
    assert all(trial.pays() for _ in range(probe))


def test_block_floors_and_kind_memory_times_are_their_definitions():
    """The two fast paths over BlockTerms read their definitions exactly: _block_floors' rows (each sequence of
    layer kinds worked out once per stage, its list shared by the starts that have it) are cst + BlockTerms.time of
    each run from each start, up to the first run that cannot fit; and kind_memory_times (BlockTerms.cost at the few
    MoE counts where its least may lie) is, per n, the least BlockTerms.cost over every MoE count
    in the window at which even every layer recomputed fits, made to grow with n (the least over n or more)."""
    from planner.search import mixed_pipeline_bounds as B
    from planner.search.mixed_context import kind_memory_times

    rng = random.Random(21)
    for L, _, before, blocks in _random_sequences(rng, 300, 14, 5):
        rows = B._block_floors(blocks, before)
        for s, (cst, cap, terms) in enumerate(blocks):
            for q in range(L):
                run = []
                for n in range(1, min(cap, L - q - (len(blocks) - 1 - s)) + 1) if q >= s else ():
                    t = cst + terms.time(n, before[q + n] - before[q])
                    if t == float("inf"):
                        break
                    run.append(t)
                assert rows[s][q] == run, (s, q)
            # the windows of any n consecutive layers: the fewest and the most MoE layers they hold
            fewest = [0] + [min(before[q + n] - before[q] for q in range(L - n + 1)) for n in range(1, L + 1)]
            most = [0] + [max(before[q + n] - before[q] for q in range(L - n + 1)) for n in range(1, L + 1)]
            times = kind_memory_times(terms, (fewest, most))
            brute = [
                min(
                    (terms.cost(n, e) for e in range(fewest[n], most[n] + 1) if terms.time(n, e) < float("inf")),
                    default=float("inf"),
                )
                for n in range(1, L + 1)
            ]
            brute = [min(brute[i:]) for i in range(L)]
            assert times == pytest.approx(tuple(brute), rel=1e-12, abs=1e-12), (s, times, brute)
