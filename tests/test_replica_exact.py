"""Pipelined replica shapes (DP replicas on different GPU types sharing one layer split) are solved exactly:
planner/search/replica_partition.py against every layer split, per-replica recompute and micro-batch split."""

import itertools

import pytest
from test_hetero import SMALL, SMALL_GPU, compositions

from planner.cost.estimate import estimate_replicas
from planner.cost.provider import cost_source
from planner.load import parse_job
from planner.parallel import group_order
from planner.search.mixed_context import MixedContext, end_costs, per_layer_bound
from planner.search.quick import RESOLUTION
from planner.search.replica_partition import micro_batch_choices, micro_batch_range
from planner.search.replicas import ReplicaCandidate, _exact_shape, _replica_dims
from planner.search.space import SearchOptions


def replica_job(gbs: int = 8):
    return parse_job(
        {
            "model": {**SMALL, "num_layers": 4},
            "cluster": [
                {"gpu": SMALL_GPU, "nodes": 1, "gpus_per_node": 4},
                {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 2},
            ],
            "training": {"seq_length": 4096, "global_batch_size": gbs, "attention": "eager"},
        }
    )


def brute_force(job, shape, zero, counts, base, ep=1):
    """Every layer split, every recompute count of every replica's stages, every micro-batch split."""
    tp, cp, pp, mbs = shape
    L, M = job.model.num_layers, job.training.global_batch_size // mbs
    d = [c for _, c in counts]
    best = float("inf")
    for layers in compositions(L, pp):
        recs_per_replica = list(itertools.product(*[range(n + 1) for n in layers]))
        for recs in itertools.product(recs_per_replica, repeat=len(counts)):
            for m0 in range(1, M):
                rest = M - d[0] * m0
                if rest < d[1] or rest % d[1]:
                    continue
                dims = _replica_dims(job, shape, zero, counts, layers, list(recs), [m0, rest // d[1]], base, ep)
                est = estimate_replicas(job, dims, SearchOptions().memory_margin)
                if est.fits:
                    best = min(best, est.iteration_time_s)
    return best


def test_the_exact_split_of_a_pipelined_replica_shape_is_the_brute_force_optimum(monkeypatch):
    import planner.cost.estimate as E

    zero = 1
    job = replica_job()
    shared = E.costs_by_group(job)  # one cost source for the brute force's many estimates (its caches)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    opts = SearchOptions()
    ctx = MixedContext(job, opts, None, cost_source(job), group_order(job.cluster))
    shape, base, counts = (1, 1, 2, 1), "none", ((0, 2), (1, 1))
    work = [
        job.model.num_layers * per_layer_bound(ctx, g, 1, 1, 1, base) + sum(end_costs(ctx, (g, 1), (g, 1), 1, 1))
        for g, _ in counts
    ]
    cand = ReplicaCandidate(*shape, zero, base, counts, 0.0)
    est, proven, open_s = _exact_shape(ctx, cand, None, 120.0, 1, float("inf"), work)
    expected = brute_force(job, shape, zero, counts, base)
    assert proven and open_s == float("inf")
    assert expected < float("inf") and est is not None
    assert est.iteration_time_s == pytest.approx(expected, rel=RESOLUTION)


def test_micro_batch_range_holds_every_choice_below_the_bound():
    counts, work, pp = ((0, 2), (1, 3)), [1.0, 1.5], 2
    for beat in (20.0, 30.0, float("inf")):
        choices, complete = micro_batch_choices(40, counts, work, pp, beat)
        ranges = micro_batch_range(40, counts, work, pp, beat)
        assert complete
        for _, ms in choices:
            assert all(lo <= m <= hi for m, (lo, hi) in zip(ms, ranges))
            assert max(max((m + pp - 1) * w / pp, w) for m, w in zip(ms, work)) < beat


@pytest.mark.parametrize("memory_gib", [6.0, 5.5])
@pytest.mark.parametrize("zero", [0, 1, 3])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 2, 1), (1, 1, 2, 2)])
def test_the_pipeline_floor_of_a_replica_shape_is_below_every_plan_of_it(monkeypatch, shape, zero, memory_gib):
    """replicas.pipeline_floor bounds every layer split, recompute and micro-batch split of the shape (on a roomy
    GPU and on one so tight that some shapes fit only by recomputing), and proves the shape infeasible only when no plan
    fits."""
    import planner.cost.estimate as E
    from planner.search.replicas import pipeline_floor

    job = replica_job()
    raw = job.model_dump(mode="json", exclude_none=True)
    raw["cluster"][0]["gpu"] = {**SMALL_GPU, "memory_gib": memory_gib}
    job = parse_job(raw)
    shared = E.costs_by_group(job)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    base, counts = "none", ((0, 2), (1, 1))
    if job.training.global_batch_size // shape[3] < sum(d for _, d in counts):
        pytest.skip("fewer micro-batches than replicas")
    floor = pipeline_floor(ctx, ReplicaCandidate(*shape, zero, base, counts, 0.0))
    expected = brute_force(job, shape, zero, counts, base)
    assert floor <= expected * (1 + 1e-9)
    if expected < float("inf"):
        assert floor > 0
    if (shape, zero) == ((1, 1, 2, 1), 3):  # fits on both GPUs, on the 5.5 GiB one only by recomputing
        assert expected < float("inf")


def test_the_micro_batch_enumeration_stops_at_its_visit_budget():
    """Two small replica groups and a large one whose count never divides what is left (odd M, even counts): two
    million partial choices and not one complete choice. The enumeration stops at MAX_VISITS and says it is
    incomplete (the shape then stays open) instead of walking them all."""
    work = [1e-3, 1e-3, 1e-3]
    choices, complete = micro_batch_choices(4097, ((0, 2), (1, 2), (2, 1024)), work, 2, float("inf"))
    assert choices == [] and not complete
    small, small_complete = micro_batch_choices(40, ((0, 3), (1, 4), (2, 7)), work, 2, float("inf"))
    assert small_complete and small
