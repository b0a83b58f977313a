"""ZeroTerms.covers and the ZeRO stages the mixed bounds leave out (mixed_context.uncovered): a ZeRO stage another
covers is never the least of the bounds that take the least over ZeRO stages, so leaving it out changes no bound.
Checked on small mixed jobs against every ZeRO stage's bound worked out, and on ZeroTerms with one term made
worse."""

import copy
import dataclasses
import math

import pytest
from test_bounds import GPT6, MOE6, four_group_job, mixed_job, search_context, tp_choice_nodes

from planner.search import mixed_pipelines
from planner.search.mixed_context import ZeroTails, covers_every

JOBS = {"dense": lambda: mixed_job(GPT6), "moe": lambda: mixed_job(MOE6), "four-groups": four_group_job}


def open_families(ctx):
    """(family, box) of every open family with two or more ZeRO stages a TP-choice node of ctx's search builds, and
    of each half of its box."""
    for node in tp_choice_nodes(ctx):
        for _, child, box in node.families(ctx):
            if isinstance(child, mixed_pipelines._Family) and len(child.zeros) > 1:
                yield child, box
                if box[0] != box[1]:
                    for half in mixed_pipelines._split(*box):
                        yield child, half


def each_zeros_bound(fam, L: int, lo, hi) -> list[float]:
    """The bound of an open family's box at each of its ZeRO stages, in full (no target)."""
    lined = fam.open_terms[1]
    return [fam._zero_bound_of(zt, lined[i], L, lo, hi, math.inf) for i, zt in enumerate(fam.zts)]


@pytest.mark.parametrize("name", list(JOBS))
def test_an_open_familys_bound_is_the_least_of_every_zero_stages_bound(name):
    """_Family._open_bound works out only the ZeRO stages no other covers (bounded_zeros): its bound is still the
    least over every ZeRO stage's, and a left-out stage's bound is at least that of one that covers it. Some
    family leaves a stage out."""
    ctx = search_context(JOBS[name]())
    L = ctx.job.model.num_layers
    checked = left_out = 0
    for fam, (lo, hi) in open_families(ctx):
        every = each_zeros_bound(fam, L, lo, hi)
        kept = fam.bounded_zeros
        assert fam._open_bound(L, lo, hi) == pytest.approx(min(every), rel=1e-12)
        for i in set(range(len(every))) - set(kept):
            covering = [j for j in range(len(every)) if j != i and covers_all(fam, j, i)]
            assert covering and all(every[i] >= every[j] * (1 - 1e-12) for j in covering)
            left_out += 1
        checked += 1
    assert checked and left_out


def covers_all(fam, j: int, i: int) -> bool:
    return covers_every(fam.zts[j], fam.zts[i], fam.vpp)


def a_covering_pair(ctx):
    """(ZeroTerms that covers, ZeroTerms it covers, vpp) of some open family's group, the two apart."""
    for fam, _ in open_families(ctx):
        for j in fam.bounded_zeros:
            for i in range(len(fam.zts)):
                if i != j and covers_all(fam, j, i):
                    for x, y in zip(fam.zts[j], fam.zts[i]):
                        if x is not y and x.sm is not None:
                            return x, y, fam.vpp
    raise AssertionError("no ZeRO stage covers another")


def with_way(zt, vpp: int, **changes):
    """A copy of ZeroTerms ``zt`` whose DP tail terms at ``vpp`` have ``changes`` (TailWay fields)."""
    copy = dataclasses.replace(zt, covered={})
    way = zt._tails.at(vpp)
    tails = ZeroTails(zt._tails.pays_up_to)
    tails.ways[tails.way(vpp)] = way._replace(**changes)
    copy.__dict__["_tails"] = tails  # (a cached property)
    return copy


def test_covers_reads_every_term_a_bound_reads():
    """One term of the covering ZeroTerms made worse than the other's, it no longer covers: a reach, an MoE-only
    reach, an end stage's tails, the middle stage's room, the bytes of state per parameter, a traffic line."""
    ctx = search_context(mixed_job(MOE6))
    better, worse, v = a_covering_pair(ctx)
    assert better.covers(worse, v) and better.covers(better, v)
    way = better._tails.at(v)

    def raised(values, i: int = 0):
        return (*values[:i], values[i] + 1.0, *values[i + 1 :])

    assert not with_way(better, v, reach=raised(way.reach, len(way.reach) // 2)).covers(worse, v)
    assert way.moe_reach is not None and way.ends is not None  # (MOE6: a leading dense layer)
    assert not with_way(better, v, moe_reach=raised(way.moe_reach, 1)).covers(worse, v)
    first, lasts = way.ends
    assert not with_way(better, v, ends=(raised(first), lasts)).covers(worse, v)
    assert not with_way(better, v, ends=(first, (raised(lasts[0]), *lasts[1:]))).covers(worse, v)
    assert with_way(better, v).covers(worse, v)  # (the copy itself still covers)

    assert not dataclasses.replace(better, covered={}, middle_room=worse.middle_room - 1.0).covers(worse, v)
    heavy = copy.copy(better.sm)
    heavy.bytes_per_param = {k: x + 1.0 for k, x in worse.sm.bytes_per_param.items()}
    assert not dataclasses.replace(better, covered={}, sm=heavy).covers(worse, v)
    slope, first_c, last_c, kinds = worse._lines
    lined = dataclasses.replace(better, covered={}, make_lines=lambda: (slope + 1.0, first_c, last_c, kinds))
    assert not lined.covers(worse, v)
