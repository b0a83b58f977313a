"""The mixed search's share of lockstep (mixed_pipelines._PipelineSearch): what it gives the other share."""

import dataclasses
import heapq
from pathlib import Path
from types import SimpleNamespace

from planner.cost.provider import cost_source
from planner.load import load_job
from planner.parallel import group_order
from planner.search import mixed_pipelines as mp
from planner.search.lockstep import Meet
from planner.search.mixed_context import MixedContext
from planner.search.mixed_pipeline_bounds import refined_bound
from planner.search.partition import PRECISION
from planner.search.space import SearchOptions

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_405B = ROOT / "examples" / "hetero" / "llama3-405b-3types-4096.yaml"


def _context(job) -> MixedContext:
    opts = SearchOptions().for_job(job)
    return MixedContext(job, opts, opts.framework, cost_source(job), group_order(job.cluster))


def test_a_candidate_waiting_for_its_solve_is_given_with_its_stage_models_built_again():
    """A share's line near its end may hold little but candidates back with their refined bounds: they are given
    too, without their stage models, which the other share (its own context, as in the other process) builds
    again; the taker gets the same candidate, family and bound, stage models that bound it the same, and counts
    it."""
    job = load_job(ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml")
    ctx = _context(job)
    dealt = mp._shares(mp._roots(ctx))
    giver = mp._PipelineSearch(ctx, dealt[0], 1, 30, 1, 0)
    giver.prepare()
    kth = 1.2  # (above the best plan, 1.06 s: candidates far above the line's best wait in line)
    while not any(isinstance(e[2], mp.HeteroCandidate) for e in giver.heap):
        lb, _, node, box = heapq.heappop(giver.heap)
        giver.step(kth, lb, node, box)
    waiting = min(e for e in giver.heap if isinstance(e[2], mp.HeteroCandidate))
    _, _, node, box = next(e for e in giver.heap if not isinstance(e[2], mp.HeteroCandidate))
    first = (waiting[0] * 0.5, -1, node, box)
    giver.heap = [first, waiting]  # (every other one of the best goes: the candidate)
    counted = giver.counted

    taker = mp._PipelineSearch(_context(job), dealt[1], 1, 30, 1, 0)
    taken_before = taker.counted
    taker.take_gift(giver.give())

    assert giver.heap == [first]
    [(lb, _, node, (family, sms))] = taker.heap
    assert (lb, node) == (waiting[0], waiting[2])
    # the same family (its ZeroTerms each the taker's own, built again from their key)
    assert dataclasses.replace(family, zt=()) == dataclasses.replace(waiting[3][0], zt=())
    theirs = waiting[3][1]
    assert [sm.dims for sm in sms] == [sm.dims for sm in theirs]
    assert refined_bound(taker.ctx, family, node, sms, kth) == refined_bound(ctx, family, node, theirs, kth)
    assert giver.counted == counted - 1 and taker.counted == taken_before + 1


def test_a_tail_way_counts_once_for_each_share_that_reads_it():
    """mixed_context.WayMeter counts a tail way (ZeroTails.at) the first time the share now stepping reads it (its
    ``seen`` set): again for another share, though this process has it worked out already, so that a share's count
    is the same whether the two share a process or not; each way of a ZeroTails apart."""
    from planner.search.mixed_context import TailWay, WayMeter, ZeroTails

    built = []
    tails = ZeroTails(2.0, lambda w: built.append(w) or TailWay((float(w),), None, None))
    mine, theirs = set(), set()
    before = WayMeter.firsts
    WayMeter.seen = mine
    assert tails.at(1).reach == (0.0,) and tails.at(2).reach == (0.0,)  # (both vpp take way 0)
    assert WayMeter.firsts == before + 1
    assert tails.at(4).reach == (1.0,)  # (the other way)
    assert WayMeter.firsts == before + 2
    WayMeter.seen = theirs
    tails.at(1)
    assert WayMeter.firsts == before + 3 and built == [0, 1]  # (counted, not worked out again)
    WayMeter.seen = set()


def test_the_first_shares_roots_are_the_same_in_line_however_far_the_other_share_bounded_them():
    """The child works out the first share's root bounds from its last root back (prepare_for) while the parent
    works them out from its first root on, until the two meet (shared counters: front, the parent's next root, and
    back, the child's last one taken); the first share's line holds the same entries however far each got, as where
    it bounds every root itself."""
    job = load_job(EXAMPLE_405B)
    ctx = _context(job)
    dealt = mp._shares(mp._roots(ctx))
    size = len(dealt[0])

    def first_share(meet=None):
        share = mp._PipelineSearch(ctx, dealt[0], 1, 30, 1, 0, first=True)
        share.meet = meet
        share._bound_roots()
        return sorted(share.heap, key=lambda e: e[:2])

    alone = first_share()
    assert len(alone) == size > 4
    helper = mp._PipelineSearch(_context(job), dealt[1], 1, 30, 1, 0)
    for parent_at in (0, 1, size // 2, size - 1, size):
        front, back = SimpleNamespace(value=parent_at), SimpleNamespace(value=2**62)
        theirs = helper.prepare_for(mp._PipelineSearch(ctx, dealt[0], 1, 30, 1, 0), front, back)
        assert [n for n, _ in theirs] == list(range(size - 1, parent_at - 1, -1))  # (from the last back to it)
        asked = []
        assert (
            first_share(
                Meet(SimpleNamespace(value=0), back, lambda theirs=theirs, asked=asked: asked.append(1) or theirs)
            )
            == alone
        )
        assert asked == ([1] if parent_at < size else [])  # (asked for theirs only where they hold some roots)


def test_a_gift_carries_its_nodes_without_their_memos_and_with_the_same_bounds():
    """Nodes given to the other share go without what their roots' memos (and their families' box memos) hold: the
    nodes of one root share one new, empty memo there, and their bounds, worked out again, are the same."""
    job = load_job(ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml")
    ctx = _context(job)
    giver = mp._PipelineSearch(ctx, mp._shares(mp._roots(ctx))[0], 1, 30, 1, 0)
    giver.prepare()
    root = SimpleNamespace(rough=True)
    while root.rough:  # (a root first comes out of line at its rough bound: back in line at its bound)
        lb, _, root, box = heapq.heappop(giver.heap)
        giver.step(float("inf"), lb, root, box)  # (then its children, sharing its memo, in line)
    kids = [e for e in giver.heap if isinstance(e[2], mp._TpChoiceNode) and e[2].memo is root.memo]
    assert len(kids) >= 2 and root.memo
    nodes = [(e[0], e[2], e[3]) for e in kids]
    payload = mp._pickle_nodes(ctx, nodes, 0)
    other = _context(job)
    taken, _ = mp._unpickle_nodes(other, payload)
    memos = {id(node.memo) for _, node, _ in taken}
    assert len(memos) == 1 and not taken[0][1].memo and isinstance(taken[0][1].memo, mp._Memo)
    for (lb, node, _), (lb2, mine, _) in zip(taken, nodes):
        assert lb2 == lb and node.fixed == mine.fixed
        assert node.bound(other, memory=False) == mine.bound(ctx, memory=False)
    assert len(payload) < len(mp.pickle.dumps(nodes[0][1].memo, protocol=mp.pickle.HIGHEST_PROTOCOL))


def test_a_gift_taken_in_after_the_deadline_counts_in_what_is_left_open():
    """A share whose explore stopped at its deadline takes in a gift still in flight (lockstep._take_late): the
    nodes wait in its line for the next explore, and what it leaves open (``frontier``, the gap's bound) counts
    their bounds; during an explore a gift leaves the frontier alone."""
    job = load_job(ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml")
    ctx = _context(job)
    dealt = mp._shares(mp._roots(ctx))
    giver = mp._PipelineSearch(ctx, dealt[0], 1, 30, 1, 0)
    giver.prepare()
    assert len(giver.heap) >= 2
    given = heapq.nsmallest(mp.GIFT, giver.heap)[1::2]  # (what give gives)
    taker = mp._PipelineSearch(_context(job), dealt[1], 1, 30, 1, 0)
    taker.prepare()
    taker.timed_out, taker.frontier = True, float("inf")
    before = len(taker.heap)
    taker.take_gift(giver.give())
    assert len(taker.heap) == before + len(given)
    assert taker.frontier == min(lb for lb, *_ in given)
    again = mp._PipelineSearch(_context(job), dealt[1], 1, 30, 1, 0)
    again.frontier = float("inf")
    again.take_gift(mp._pickle_nodes(ctx, [(lb, node, box) for lb, _, node, box in given], 0))
    assert again.frontier == float("inf")


def test_families_built_at_once_or_after_the_nodes_memory_bound_give_the_same_plans(monkeypatch):
    """A share builds the family of a TP-choice node with every TP fixed at once where the node's bound with
    memory does not cut (MemoryTrial), else after that bound puts the node back in line: the top plans and their
    proof are the same either way, and the steps differ."""

    def pays(way: bool) -> None:
        monkeypatch.setattr(mp.MemoryTrial, "pays", lambda self: way)

    (plans, complete, gap, steps), (plans2, complete2, gap2, steps2) = _both_ways(
        monkeypatch, pays, mp._PipelineSearch, "step"
    )
    assert plans == plans2 and complete and complete2 and gap == gap2 == 0.0
    assert steps != steps2


def test_roots_in_line_at_their_rough_bounds_give_the_same_plans(monkeypatch):
    """Roots go in line at their rough bound (_TpChoiceNode.rough_bound: no rows, at most their bound) and back in
    line at their bound the first time they come out: the top plans and their proof are the same as with every
    root in line at its bound at once, and fewer roots are bounded."""
    ctx = _context(load_job(EXAMPLE_405B))
    roots = [grp for grp, _ in mp._roots(ctx)]
    assert all(grp.rough_bound(ctx) <= grp.bound(ctx, memory=False) * (1 + 1e-12) for grp in roots)

    def rough(way: bool) -> None:
        if not way:  # (each root's rough bound is its bound)
            monkeypatch.setattr(mp._TpChoiceNode, "rough_bound", lambda self, ctx: self.bound(ctx, memory=False))

    (plans, complete, gap, bounds), (plans2, complete2, gap2, bounds2) = _both_ways(
        monkeypatch, rough, mp._TpChoiceNode, "_schedule_bound"
    )
    assert plans == plans2 and complete and complete2 and gap == gap2 == 0.0
    assert bounds < bounds2


def _both_ways(monkeypatch, set_way, owner, counted: str) -> list[tuple]:
    """The 405B example's mixed search (top 3, one process) with ``set_way(True)`` and with ``set_way(False)``
    applied, each as (plans, complete, gap, calls of ``owner.counted``)."""
    job = load_job(EXAMPLE_405B)
    answers = []
    for way in (True, False):
        set_way(way)
        calls: list = []
        monkeypatch.setattr(owner, counted, _counting(getattr(owner, counted), calls))
        r = mp.search_hetero(job, top=3, time_limit_s=120, single_type=False, processes=1)
        monkeypatch.undo()
        answers.append(([(p.time, p.estimate.dims) for p in r.plans], r.complete, r.gap, len(calls)))
    return answers


def _counting(step, calls: list):
    def counted(self, *args):
        calls.append(1)
        return step(self, *args)

    return counted


def test_before_its_first_plan_a_share_puts_a_fixed_node_back_at_its_memory_bound_uncounted():
    """With no plan known nothing is cut, so a TP-choice node with every TP fixed goes back in line at its bound
    with memory (which orders the line) and MemoryTrial counts nothing; once a plan is known the trial decides, and
    where it says no the node's family is built at once."""
    job = load_job(ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml")
    ctx = _context(job)
    share = mp._PipelineSearch(ctx, mp._shares(mp._roots(ctx))[0], 1, 30, 1, 0)
    share.prepare()
    node = None
    while node is None:
        lb, _, fam, box = heapq.heappop(share.heap)
        if isinstance(fam, mp._TpChoiceNode) and len(fam.fixed) == len(ctx.order) and not fam.memory:
            node = (lb, fam, box)
        else:
            share.step(float("inf"), lb, fam, box)
    share.heap = []
    share.step(float("inf"), *node)
    [(_, _, back, _)] = share.heap
    assert back.memory and share.memory_trial.tries == 0
    share.heap = []
    share.memory_trial.pays = lambda: False
    share.cut = lambda: float("inf")
    share.step(1e9, *node)
    assert share.heap and all(isinstance(e[2], mp._Family) for e in share.heap)


def test_before_its_first_plan_a_share_solves_a_candidate_capped_and_puts_it_back_where_nothing_is_below_the_cap():
    """With no plan known a candidate is solved capped at FIRST_CAP above its bound (solve_capped): where CP-SAT
    proves no split that fast, the candidate goes back in line at the cap less the partition model's rounding,
    uncounted; where the cap holds its optimum, the solve finds it and counts once."""
    job = load_job(ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml")
    ctx = _context(job)
    share = mp._PipelineSearch(ctx, mp._shares(mp._roots(ctx))[0], 1, 30, 1, 0)
    share.prepare()
    while not any(isinstance(e[2], mp.HeteroCandidate) for e in share.heap):
        lb, _, node, box = heapq.heappop(share.heap)
        share.step(1.2, lb, node, box)  # (a cut above the best plan: candidates wait in line)
    _, _, c, (family, sms) = min(e for e in share.heap if isinstance(e[2], mp.HeteroCandidate))
    alone = mp._PipelineSearch(_context(job), [], 1, 30, 1, 0)
    res = alone.solve(c, sms, float("inf"), 0.0, limit=30.0)
    assert res.status == "optimal"
    best = alone.best[0].time

    share.heap, share.best, share.solved, settled = [], [], 0, share.settled
    low = best / 1.2
    share.solve_capped(c, sms, low, family)
    [(lb, _, back, (back_family, back_sms))] = share.heap
    assert back is c and back_family is family and back_sms is sms
    assert lb == low * (1 + mp.FIRST_CAP) * (1 - PRECISION)
    assert share.best == [] and share.solved == 0 and share.settled == settled

    share.heap = []
    share.solve_capped(c, sms, best / (1 + mp.FIRST_CAP / 2), family)
    assert share.heap == [] and share.solved == 1 and share.settled == settled + 1
    assert [p.time for p in share.best] == [best]
