"""planner/parallel.py's rules against brute-force definitions, and the search space against ParallelDims.check().

Each predicate and option generator is compared with the rule written out naively (every integer tried, every
pipeline split listed); the enumeration of planner/search/space.py must propose exactly the layouts check()
accepts within the search's own limits (TP within a node, micro-batch cap, sequence parallelism on with TP).
"""

import itertools

import pytest

from planner.cost.provider import AnalyticCosts
from planner.errors import SpecError
from planner.load import parse_job
from planner.parallel import (
    RANK_ORDER,
    HeteroDims,
    ParallelDims,
    baseline_recompute_modes,
    cp_options,
    divisors,
    dp_options,
    ep_options,
    interleaved_split,
    micro_batch_options,
    node_group_tp_options,
    pp_options,
    rank_strides,
    ranks_per_node,
    seq_shard_error,
    tp_heads_error,
    tp_options,
    vpp_error,
    vpp_options,
)
from planner.search.space import SearchOptions, dims_for, enumerate_candidates

DENSE = {
    "name": "dense",
    "num_layers": 4,
    "hidden_size": 512,
    "ffn_hidden_size": 2048,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "vocab_size": 1000,
    "mlp": "swiglu",
}
MOE = {**DENSE, "name": "moe", "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024}}
GPT96 = {
    "name": "gpt96",
    "num_layers": 6,
    "hidden_size": 1536,
    "ffn_hidden_size": 6144,
    "num_attention_heads": 96,
    "vocab_size": 1000,
    "mlp": "gelu",
}


def job(model, nodes=2, gpus_per_node=4, seq=1004, gbs=8, attention="eager", cluster=None):
    cluster = cluster or [{"gpu": "h100-sxm", "nodes": nodes, "gpus_per_node": gpus_per_node}]
    return parse_job(
        {
            "model": model,
            "cluster": cluster,
            "training": {"seq_length": seq, "global_batch_size": gbs, "attention": attention},
        }
    )


def compositions(total: int, parts: int, step: int = 1):
    """Every split of ``total`` into ``parts`` positive multiples of ``step``."""
    if parts == 1:
        if total >= step and total % step == 0:
            yield (total,)
        return
    for first in range(step, total - step * (parts - 1) + 1, step):
        for rest in compositions(total - first, parts - 1, step):
            yield (first,) + rest


# ----------------------------------------------------------------------------------------------- rank layout
def brute_strides(tp: int, cp: int, dp: int, pp: int) -> dict[str, int]:
    """Rank distance between neighbours of each dimension, read off the rank -> coordinates map of
    tp-cp-ep-dp-pp (TP fastest); EP groups are carved out of DP, so an EP neighbour is a DP neighbour."""
    world = tp * cp * dp * pp
    coords = {r: (r % tp, r // tp % cp, r // (tp * cp) % dp, r // (tp * cp * dp)) for r in range(world)}
    out = {}
    for i, dim in enumerate(("tp", "cp", "dp", "pp")):
        step = [0, 0, 0, 0]
        step[i] = 1
        target = tuple(step)
        out[dim] = next((r for r in range(world) if coords[r] == target), None)
    out["ep"] = out["dp"]
    return out


@pytest.mark.parametrize("tp,cp,dp,pp", [(2, 2, 4, 2), (4, 1, 2, 8), (1, 4, 8, 1), (8, 2, 2, 2), (2, 4, 2, 4)])
def test_rank_strides_match_the_rank_order(tp, cp, dp, pp):
    assert RANK_ORDER == "tp-cp-ep-dp-pp"
    strides = rank_strides({"tp": tp, "cp": cp, "ep": 2, "dp": dp, "pp": pp})
    brute = brute_strides(tp, cp, dp, pp)
    for dim in ("tp", "cp", "ep", "dp", "pp"):
        size = {"tp": tp, "cp": cp, "ep": 2, "dp": dp, "pp": pp}[dim]
        if size > 1 or dim == "ep":
            assert strides[dim] == brute[dim], dim


def test_rank_strides_need_only_the_earlier_sizes():
    assert rank_strides({"tp": 4, "cp": 2, "ep": 8}) == {"tp": 1, "cp": 4, "ep": 8, "dp": 8}


@pytest.mark.parametrize("gpn", [1, 2, 4, 8])
def test_ranks_per_node_counts_the_members_on_the_first_node(gpn):
    for size, stride in itertools.product([1, 2, 4, 8, 16], [1, 2, 4, 8, 16, 32]):
        members = [k * stride for k in range(size)]
        assert ranks_per_node(size, stride, gpn) == sum(1 for r in members if r // gpn == 0), (size, stride)


def test_spans_and_group_span_use_the_same_strides():
    j = job(DENSE, nodes=4, gpus_per_node=8)
    d = ParallelDims(
        tp=2,
        pp=2,
        dp=4,
        cp=2,
        ep=1,
        vpp=1,
        micro_batch_size=1,
        sequence_parallel=True,
        zero_stage=1,
        recompute="none",
        tp_comm_overlap=False,
        stage_layers=(2, 2),
        stage_recompute=None,
        world=32,
        model=j.model,
        training=j.training,
    )
    spans = ParallelDims.spans(2, 2, 1, 8)
    for dim in ("tp", "cp", "ep"):
        assert d.group_span(dim, 8) == spans[dim]
    assert d.group_span("dp", 8) == (4, 2) and d.group_span("pp", 8) == (2, 1)


# ----------------------------------------------------------------------------------------------- predicates
def test_divisors():
    for n in range(1, 200):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


GQA12 = {**DENSE, "hidden_size": 768, "num_attention_heads": 12, "num_kv_heads": 3}


@pytest.mark.parametrize("model", [DENSE, GPT96, GQA12])
def test_tp_heads(model):
    m = job(model).model
    for tp in range(1, 130):
        ok = m.num_attention_heads % tp == 0 and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0)
        assert (tp_heads_error(m, tp) is None) == ok, tp


@pytest.mark.parametrize("model,world,gpn", [(DENSE, 16, 4), (GPT96, 24, 8), (GPT96, 48, 8), (DENSE, 64, 8)])
def test_tp_options(model, world, gpn):
    m = job(model).model
    for cross in (False, True):
        brute = [
            tp
            for tp in range(1, world + 1)
            if world % tp == 0
            and (cross or tp <= gpn)
            and m.num_attention_heads % tp == 0
            and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0)
        ]
        assert tp_options(m, world, gpn, cross) == brute


@pytest.mark.parametrize("gpns", [[8], [4], [8, 4], [6, 8], [12]])
def test_node_group_tp_options(gpns):
    m = job(GPT96).model
    brute = [
        tp
        for tp in range(1, max(gpns) + 1)
        if all(g % tp == 0 for g in gpns)
        and m.num_attention_heads % tp == 0
        and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0)
    ]
    assert node_group_tp_options(m, gpns) == brute


@pytest.mark.parametrize("seq", [1004, 2048, 4096, 6144])
def test_seq_shard_and_cp_options(seq):
    t = job(DENSE, seq=seq).training
    for cp, tp in itertools.product(range(1, 33), range(1, 33)):
        assert (seq_shard_error(t, cp, tp) is None) == ((seq // cp) % tp == 0)
    for gpus in (1, 16, 24, 64):
        brute = [cp for cp in range(1, gpus + 1) if gpus % cp == 0 and (cp == 1 or seq % (2 * cp) == 0)]
        assert cp_options(t, gpus) == brute


@pytest.mark.parametrize("model", [DENSE, MOE, {**MOE, "moe": {**MOE["moe"], "num_experts": 6}}])
def test_ep_options(model):
    m = job(model).model
    for dp, cp in itertools.product([1, 2, 3, 4, 8], [1, 2, 4]):
        brute = [
            ep
            for ep in range(1, dp * cp + 1)
            if (dp * cp) % ep == 0 and (ep == 1 or (m.moe is not None and m.moe.num_experts % ep == 0))
        ]
        assert ep_options(m, dp, cp) == brute


def test_pp_options():
    for layers, gpus in itertools.product([1, 4, 7, 61], [1, 8, 24, 128]):
        assert pp_options(layers, gpus) == [pp for pp in range(1, gpus + 1) if gpus % pp == 0 and pp <= layers]


def test_vpp_options_and_interleaved_split():
    for layers, pp, nmb in itertools.product(range(1, 13), range(1, 6), [1, 2, 3, 4, 6, 8]):
        brute = []
        for v in range(1, layers + 1):
            splits = list(compositions(layers, pp, v))
            split = interleaved_split(layers, pp, v)
            assert (split is None) == (not splits)
            if split is not None:
                assert tuple(split) in splits
            if splits and (v == 1 or (pp > 1 and nmb % pp == 0)):
                brute.append(v)
        assert list(vpp_options(layers, pp, nmb)) == brute, (layers, pp, nmb)


def test_vpp_error_reports_the_first_broken_rule():
    assert vpp_error(1, 1, 3, (5,)) is None
    assert vpp_error(2, 1, 4, (4,)) == "interleaving (vpp > 1) needs pp > 1"
    assert vpp_error(2, 2, 3, (3, 3)) == "stage layer counts [3] are not divisible by vpp (2)"
    assert "divisible by pp (2)" in vpp_error(2, 2, 3, (4, 4))


@pytest.mark.parametrize("gbs", [1, 12, 64, 96])
def test_batch_options(gbs):
    t = job(DENSE, gbs=gbs).training
    assert dp_options(t) == [dp for dp in range(1, gbs + 1) if gbs % dp == 0]
    for dp, cap in itertools.product(range(1, 20), [1, 4, 64]):
        brute = [mbs for mbs in range(1, cap + 1) if gbs % (mbs * dp) == 0]
        assert micro_batch_options(t, dp, cap) == brute


def test_baseline_recompute_modes():
    for attention in ("flash", "eager"):
        t = job(DENSE, attention=attention).training
        # selective recompute only differs from none where attention stores its scores (not flash)
        brute = tuple(mode for mode in ("none", "selective") if mode == "none" or attention != "flash")
        assert baseline_recompute_modes(t) == brute


# ----------------------------------------------------------------------------------------------- the checkers
def dims(j, tp, cp, pp, dp, ep, mbs, vpp, layers):
    return ParallelDims(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        vpp=vpp,
        micro_batch_size=mbs,
        sequence_parallel=tp > 1,
        zero_stage=1,
        recompute="none",
        tp_comm_overlap=False,
        stage_layers=layers,
        stage_recompute=None,
        world=tp * cp * pp * dp,
        model=j.model,
        training=j.training,
    )


def accepted(j, tp, cp, pp, dp, ep, mbs, vpp) -> bool:
    """Whether ParallelDims.check() accepts the degrees with some split of the layers."""
    for layers in compositions(j.model.num_layers, pp):
        try:
            dims(j, tp, cp, pp, dp, ep, mbs, vpp, layers).check()
            return True
        except SpecError:
            continue
    return False


def brute_space(j, opts: SearchOptions) -> set:
    """Every (tp, cp, pp, dp, ep, mbs, vpp) on all GPUs that check() accepts within the search's limits."""
    world, gpn = j.num_gpus, j.cluster[0].gpus_per_node
    out = set()
    for tp, cp, pp in itertools.product(divisors(world), repeat=3):
        if world % (tp * cp * pp) or not (tp <= gpn or opts.allow_cross_node_tp):
            continue
        dp = world // (tp * cp * pp)
        # a micro-batch larger than the batch, or EP larger than dp*cp, never passes: not tried
        mbs_top = min(opts.max_micro_batch, j.training.global_batch_size)
        for ep, mbs, vpp in itertools.product(
            range(1, dp * cp + 1), range(1, mbs_top + 1), range(1, j.model.num_layers + 1)
        ):
            if accepted(j, tp, cp, pp, dp, ep, mbs, vpp):
                out.add((tp, cp, pp, dp, ep, mbs, vpp))
    return out


SPACE_JOBS = [
    (DENSE, {}),
    (MOE, {}),
    (MOE, {"seq": 2048, "attention": "flash"}),
    (DENSE, {"gbs": 12, "seq": 4096}),
    (GPT96, {"nodes": 3, "gpus_per_node": 2, "gbs": 6, "seq": 1020}),
]


@pytest.mark.parametrize("model,kw", SPACE_JOBS)
@pytest.mark.parametrize(
    "opts",
    [
        SearchOptions(allow_idle_nodes=False, zero_stages=(1,)),
        SearchOptions(allow_idle_nodes=False, zero_stages=(1,), max_micro_batch=2, allow_cross_node_tp=True),
    ],
)
def test_space_is_what_check_accepts(model, kw, opts):
    """The homogeneous enumeration proposes exactly the degrees check() accepts (within its limits)."""
    j = job(model, **kw)
    cands, _, complete = enumerate_candidates(j, AnalyticCosts(j.cluster[0], j.training.precision), opts)
    assert complete
    found = {(c.tp, c.cp, c.pp, c.dp, c.ep, c.mbs, c.vpp) for c in cands}
    assert found == brute_space(j, opts)


@pytest.mark.parametrize("model,kw", SPACE_JOBS + [(GPT96, {"nodes": 5, "gpus_per_node": 8, "gbs": 60, "seq": 1020})])
def test_every_candidate_passes_check(model, kw):
    """Every candidate, idle nodes included, with the split its stage counts range around, passes check()."""
    j = job(model, **kw)
    cands, _, _ = enumerate_candidates(j, AnalyticCosts(j.cluster[0], j.training.precision), SearchOptions())
    assert cands
    for c in cands:
        split = interleaved_split(j.model.num_layers, c.pp, c.vpp)
        assert split is not None
        d = dims_for(j, c, stage_layers=tuple(split)).check()
        assert d.world == c.world <= j.num_gpus and c.world % j.cluster[0].gpus_per_node == 0


def test_hetero_check_uses_the_node_group_tp_rule():
    """A stage on a node group passes HeteroDims.check()'s TP rules exactly for node_group_tp_options (and the
    sequence shard)."""
    j = job(
        GPT96,
        seq=1020,
        cluster=[
            {"gpu": "h100-sxm", "nodes": 4, "gpus_per_node": 8},
            {"gpu": "a100-80gb", "nodes": 8, "gpus_per_node": 6},
        ],
    )
    for g, tp in itertools.product((0, 1), range(1, 13)):
        d = HeteroDims(
            stage_groups=(g,),
            stage_tp=(tp,),
            dp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute="none",
            stage_layers=(j.model.num_layers,),
            stage_recompute=None,
            cluster=j.cluster,
            model=j.model,
            training=j.training,
        )
        ok = (
            tp in node_group_tp_options(j.model, [j.cluster[g].gpus_per_node])
            and seq_shard_error(j.training, 1, tp) is None
        )
        try:
            d.check()
            assert ok, (g, tp)
        except SpecError as e:
            assert not ok and e.field == "layout.stages[0].tp", (g, tp, str(e))


@pytest.mark.parametrize("model,kw", SPACE_JOBS)
def test_a_cap_leaves_out_exactly_the_candidates_bounded_at_or_above_it(model, kw):
    """enumerate_candidates with ``cap`` (the time a single-type baseline must beat) returns the candidates whose
    lower bound is below it, in the same order, and counts the others as pruned."""
    j = job(model, **kw)
    costs = AnalyticCosts(j.cluster[0], j.training.precision)
    every, pruned, _ = enumerate_candidates(j, costs, SearchOptions())
    bounds = sorted({c.lower_bound_s for c in every})
    for cap in (bounds[0], bounds[len(bounds) // 2], bounds[-1], bounds[-1] * 2):
        kept, capped, complete = enumerate_candidates(j, costs, SearchOptions(), cap=cap)
        assert complete
        assert kept == [c for c in every if c.lower_bound_s < cap]
        assert capped == pruned + len(every) - len(kept)
