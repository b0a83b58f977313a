"""A plan on one node group of a mixed cluster is a mixed layout too (every stage on that group): when it beats
the mixed plans found, the mixed search returns it as the job's plan (planner/search/single_type.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import planner.search.mixed_pipelines as mixed_pipelines
from planner.gate import layout_input
from planner.io import load_yaml
from planner.load import parse_job
from planner.search.mixed_pipelines import search_hetero
from planner.search.single_type import as_mixed_plan, best_single_type
from planner.search.space import SearchOptions

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples/hetero/gpt-32l-2x32.yaml"


def _job():
    return parse_job(load_yaml(JOB, field="job"))


def test_a_single_type_plan_prices_the_same_as_a_mixed_layout():
    job = _job()
    plan, group = best_single_type(job, SearchOptions(), 1, 60)
    mixed = as_mixed_plan(job, group, plan, SearchOptions())
    assert mixed is not None
    assert mixed.time == pytest.approx(plan.time, rel=1e-12)
    d = mixed.estimate.dims
    assert set(d.stage_groups) == {group} and d.pp == plan.estimate.dims.pp and d.dp == plan.estimate.dims.dp


def test_the_mixed_search_returns_a_faster_single_type_plan(monkeypatch, tmp_path):
    # no mixed candidate at all (as when a time limit stops the mixed search early): the job's plan is the best
    # single-type plan, placed on its group, and it re-prices to its time as a layout of the mixed job
    monkeypatch.setattr(mixed_pipelines, "_roots", lambda ctx: [])
    job = _job()
    res = search_hetero(job, top=1, time_limit_s=60, replicas=False)
    assert res.plans and res.single_type_best_s is not None
    best = res.plans[0]
    assert best.time == res.single_type_best_s
    assert set(best.estimate.dims.stage_groups) == {res.single_type_group}

    again = tmp_path / "again.json"
    raw = json.loads(json.dumps(load_yaml(JOB, field="job")))
    raw["layout"] = layout_input(best.estimate.dims.as_dict())
    again.write_text(json.dumps(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "estimate", str(again), "--json"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    est = json.loads(proc.stdout)
    assert est["fits"] and est["iteration_time_s"] == pytest.approx(best.time, rel=1e-6)


def test_the_baselines_price_with_the_mixed_jobs_providers():
    # best_single_type given the mixed job's cost source searches each group with that group's provider, so the
    # per-layer costs the mixed search memoized are read, not priced again; the plans are the same either way
    from planner.cost.provider import cost_source

    job = _job()
    alone = best_single_type(job, SearchOptions(), 1, 60)
    source = cost_source(job)
    shared = best_single_type(job, SearchOptions(), 1, 60, costs=source)
    assert shared[1] == alone[1]
    assert shared[0].time == alone[0].time
    assert shared[0].estimate.dims == alone[0].estimate.dims
    # the searches priced on the source's providers, one per group, and on nothing else
    assert sorted(source._groups) == list(range(len(job.cluster)))
    assert all(source(g).kind_coeffs for g in range(len(job.cluster)))
    entries = {g: len(source(g).kind_coeffs) for g in range(len(job.cluster))}
    best_single_type(job, SearchOptions(), 1, 60, costs=source)
    assert {g: len(source(g).kind_coeffs) for g in range(len(job.cluster))} == entries  # all read from the memo


def test_a_baseline_capped_by_a_time_finds_the_plan_below_it_or_none():
    # the homogeneous search given ``beat`` enumerates only candidates bounded below it; the best plan on a group
    # is the same as without a cap when it is faster than the cap, and there is none when it is not
    from planner.search.homogeneous import search

    job = _job()
    sub = job.model_copy(update={"cluster": (job.cluster[0],), "layout": None})
    free = search(sub, top=1, time_limit_s=60)
    best = free.plans[0]
    under = search(sub, top=1, time_limit_s=60, beat=best.time * 1.001)
    assert under.plans[0].time == best.time and under.plans[0].estimate.dims == best.estimate.dims
    assert under.complete and under.gap == 0.0
    assert search(sub, top=1, time_limit_s=60, beat=best.time).plans == []


def test_the_baselines_in_two_parts_keep_the_plan_of_one_search_over_every_candidate():
    """Two processes each search every other candidate of each group (best_single_type's ``part``, the homogeneous
    search's): the better of their answers (better_single_type) is the plan and group of one search over all the
    candidates, below a cap and without one; each part alone searches only its candidates."""
    from planner.search.homogeneous import search
    from planner.search.single_type import better_single_type

    job = _job()
    whole = best_single_type(job, SearchOptions(), 1, 60)
    for beat in (float("inf"), whole[0].time * 1.001):
        parts = [best_single_type(job, SearchOptions(), 1, 60, beat=beat, part=(i, 2)) for i in (0, 1)]
        plan, group = better_single_type(job, *parts)
        assert group == whole[1] and plan.time == whole[0].time and plan.estimate.dims == whole[0].estimate.dims
    sub = job.model_copy(update={"cluster": (job.cluster[whole[1]],), "layout": None})
    full = search(sub, top=1, time_limit_s=60)
    halves = [search(sub, top=1, time_limit_s=60, part=(i, 2)) for i in (0, 1)]
    assert sum(h.candidates for h in halves) == full.candidates
    assert min(h.plans[0].time for h in halves if h.plans) == full.plans[0].time


def test_better_single_type_takes_the_faster_answer_and_on_a_tie_the_group_first_in_order():
    """The two processes' parts of the single-type baselines are merged as one search over every group would
    answer: the faster plan, and on a tie the group first in group_order (a later group must beat it)."""
    from types import SimpleNamespace

    from test_hetero import small_job

    from planner.parallel import group_order
    from planner.search.single_type import better_single_type

    job = small_job()
    first, second = group_order(job.cluster)
    fast, slow = SimpleNamespace(time=1.0), SimpleNamespace(time=2.0)
    assert better_single_type(job, (slow, first), (fast, second)) == (fast, second)
    assert better_single_type(job, (fast, second), (SimpleNamespace(time=1.0), first))[1] == first
    assert better_single_type(job, (None, None), (slow, second)) == (slow, second)
    assert better_single_type(job, (None, None), (None, None)) == (None, None)
