"""What `planner plan` tells the user: the search's status sentence (search.stop_reason), plans the model cannot
tell apart collapsed into one entry (plans[].equivalent), "Why #1 wins" against a plan that differs, and a job
layout that does not fit, said in words.

Nothing here depends on machine speed: the status wording is checked on constructed SearchResults and on searches
whose outcome is fixed (a CP-SAT stub that leaves a bound open, a zero time limit, a mixed search whose gap is the
heuristic replica evaluation's), and the end-to-end case runs with an hour's limit, far above what it needs.
"""

import contextlib
import dataclasses
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from planner.cli import main
from planner.cost.estimate import estimate
from planner.load import load_job
from planner.report.plan import render_plan, status_sentence
from planner.report.plan_json import plan_document
from planner.search import homogeneous
from planner.search.homogeneous import search
from planner.search.quick import RESOLUTION
from planner.search.result import Plan, keep_top, solve_limit, with_proof

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_search_exact import SMALL_GPT, TIGHT_GPU, job  # noqa: E402

EXAMPLE_70B = ROOT / "examples" / "llama3-70b-h100.yaml"


def text_of(doc: dict) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_plan(doc))
    return console.export_text()


def plan_cli(*args: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["plan", *args])
    return buf.getvalue()


# ----------------------------------------------------------------------------------- the status sentence
@pytest.fixture(scope="module")
def small():
    """A memory-bound job whose plans need CP-SAT (recompute placement), and its proven top 3."""
    j = job(model={**SMALL_GPT, "num_layers": 6}, gpu=TIGHT_GPU, gbs=4, seq=8192, attention="eager")
    result = search(j, top=3, time_limit_s=3600)
    assert result.plans and result.solved > 0
    return j, result


def sentence(j, result) -> str:
    doc = plan_document(j, result, None, timing=False, memory_margin=0.05)
    return status_sentence(doc["search"]), doc


def test_status_proven(small):
    j, result = small
    assert result.complete and result.stop_reason == "proven" and result.gap == 0
    text, doc = sentence(j, result)
    assert doc["search"]["stop_reason"] == "proven" and doc["search"]["gap"] == 0.0
    assert "gap_source" not in doc["search"]
    assert text == "proven optimal (within the modeled space)"
    assert "proven optimal (within the modeled space)" in text_of(doc)


def test_status_time_limit(small):
    j, result = small
    stopped = dataclasses.replace(
        result, complete=False, gap=0.0123, stop_reason="time_limit", plans=[with_proof(p, False) for p in result.plans]
    )
    text, doc = sentence(j, stopped)
    assert doc["search"]["stop_reason"] == "time_limit" and not doc["search"]["complete"]
    assert text == "stopped by the time limit with gap 1.23%; raise --time-limit to search further"
    assert all(p["optimality"] == {"status": "feasible", "gap": 0.0123} for p in doc["plans"])
    footer = text_of(doc)
    assert "stopped by the time limit with gap 1.23%" in footer and "proven" not in footer


def test_status_solve_cap(small):
    j, result = small
    capped = dataclasses.replace(
        result, complete=False, gap=0.0042, stop_reason="solve_cap", plans=[with_proof(p, False) for p in result.plans]
    )
    text, doc = sentence(j, capped)
    assert doc["search"]["stop_reason"] == "solve_cap"
    assert "time limit was not reached" in text and "per-solve cap" in text and "gap 0.42%" in text
    assert "stopped by the time limit" not in text
    assert text.endswith("raise --time-limit to raise the cap")  # the cap is SOLVE_SHARE of the limit
    assert solve_limit(1000.0, 60.0) < solve_limit(1000.0, 120.0)


def test_search_reports_solve_cap_when_a_solve_stops_early(monkeypatch):
    """A solve that stops at its cap with a bound below the K-th best leaves the top list unproven, and the search
    says so as solve_cap (not the time limit, which is an hour away). CP-SAT is stubbed to report exactly that."""
    real = homogeneous.solve_partition

    def capped(*args, **kwargs):
        res = real(*args, **kwargs)
        return dataclasses.replace(res, status="feasible" if res.plans else "unknown", bound_s=0.0)

    monkeypatch.setattr(homogeneous, "solve_partition", capped)
    j = job(model={**SMALL_GPT, "num_layers": 6}, gpu=TIGHT_GPU, gbs=4, seq=8192, attention="eager")
    result = search(j, top=3, time_limit_s=3600)
    assert result.solved > 0 and result.plans
    assert not result.complete and result.stop_reason == "solve_cap" and result.gap > 0
    assert all(p.status == "feasible" for p in result.plans)


def test_search_reports_time_limit_at_zero_budget():
    j = job(model={**SMALL_GPT, "num_layers": 6}, gpu=TIGHT_GPU, gbs=4, seq=8192, attention="eager")
    result = search(j, top=3, time_limit_s=0.0)
    assert not result.complete and result.stop_reason == "time_limit"


def test_mixed_gap_from_heuristic_replicas_is_named(monkeypatch):
    """A mixed-GPU search whose mixed pipelines are proven but whose replica shapes (evaluated heuristically: the
    exact evaluations left out here, as when the time limit stops them) have a bound below the best plan: `complete` stays
    true (today's meaning), the plans are feasible with a gap, and the sentence names the replica shapes instead of
    saying "complete"."""
    from test_hetero import OPTS, small_job

    import planner.search.replicas as R
    from planner.search.mixed_pipelines import search_hetero

    heuristic = R._heuristic_shape

    def nothing_exact(*args, **kwargs):
        est, infeasible, _ = heuristic(*args, **kwargs)
        return est, infeasible, False

    monkeypatch.setattr(R, "_heuristic_shape", nothing_exact)
    monkeypatch.setattr(R, "_exact_shape", lambda ctx, cand, best, *rest: (best, False, 0.0))
    j = small_job()
    result = search_hetero(j, top=3, time_limit_s=3600, options=OPTS, single_type=False)
    assert result.complete and result.gap > 0
    assert result.stop_reason == "heuristic" and result.gap_source == "replica_shapes"
    text, doc = sentence(j, result)
    assert doc["search"]["gap_source"] == "replica_shapes"
    assert text.startswith("mixed pipelines proven; gap ") and "evaluated heuristically" in text
    assert "does not close it" in text


def test_the_exact_pass_proves_the_replica_shapes():
    """The same job with the exact split of its pipelined replica shapes (planner/search/replica_partition.py):
    nothing is left open, the top plans are proven."""
    from test_hetero import OPTS, small_job

    from planner.search.mixed_pipelines import search_hetero

    result = search_hetero(small_job(), top=3, time_limit_s=3600, options=OPTS, single_type=False)
    assert result.complete and result.gap == 0.0 and result.stop_reason == "proven"
    assert all(p.status == "optimal" for p in result.plans)


def test_mixed_progress_moves():
    """search_hetero reports progress in each phase: a first look at the replica shapes, mixed-pipeline candidates
    settled (up to all of them), replica shapes, then each single-type search of this process (every group of
    group_order, on every other of its candidates from the second: the other process searches the rest), every
    phase's counts never going back."""
    from test_hetero import OPTS, small_job

    from planner.search.mixed_pipelines import MIXED_PROGRESS, search_hetero

    calls = []
    search_hetero(
        small_job(),
        top=3,
        time_limit_s=3600,
        options=OPTS,
        progress=lambda done, total, what="candidates": calls.append((what, done, total)),
    )
    phases = list(dict.fromkeys(w for w, _, _ in calls))
    assert phases[:3] == ["replica shapes, first look", MIXED_PROGRESS, "replica shapes"]
    assert phases[3:] == ["candidates, group 1 (a100-40gb) alone", "candidates, group 0 (small-gpu) alone"]
    for what in phases:
        seen = [(d, t) for w, d, t in calls if w == what]
        assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:])), what
        assert seen[-1][0] == seen[-1][1], what  # the phase ends settled (every candidate solved or cut)
    # moves while the search runs, not only at the end (without the replica plans' first cut, which settles most
    # of this small job's candidates at once)
    alone = []
    search_hetero(
        small_job(),
        top=3,
        time_limit_s=3600,
        options=OPTS,
        replicas=False,
        single_type=False,
        progress=lambda done, total, what="candidates": alone.append((what, done, total)),
    )
    assert len({d for w, d, _ in alone if w == MIXED_PROGRESS}) > 3


def search_with_one_clock_jump(monkeypatch, phase: str, to: float, **kw):
    """search_hetero of the small job (limit 100 s) on a clock of the test's own: it stands still but once, when
    ``phase`` first reports progress past 0, where it jumps to ``to`` of the limit. (result, every phase reported,
    in order)."""
    from test_hetero import OPTS, small_job

    from planner.search import mixed_pipelines
    from planner.search.mixed_pipelines import search_hetero

    limit = 100.0
    clock = [0.0]
    calls = []

    def progress(done, total, what="candidates"):
        calls.append(what)
        if what == phase and done > 0 and clock[0] == 0.0:
            clock[0] = to * limit

    monkeypatch.setattr(mixed_pipelines.time, "monotonic", lambda: clock[0])
    result = search_hetero(small_job(), top=1, time_limit_s=limit, options=OPTS, progress=progress, **kw)
    return result, calls


def test_mixed_search_goes_on_after_the_baselines(monkeypatch):
    """The mixed pipelines stopped by their share of the time limit go on with the time the single-type
    baselines left, cut by their plans: the result is the one an unlimited search proves. The clock is the
    test's own: it stands still except once, when the first mixed-pipeline candidates are settled, where it
    jumps past the mixed share (42% of the limit) to half the limit."""
    from test_hetero import OPTS, small_job

    from planner.search.mixed_pipelines import MIXED_PROGRESS, search_hetero

    free = search_hetero(small_job(), top=1, time_limit_s=3600, options=OPTS, replicas=False)
    assert free.complete and free.gap == 0.0

    result, calls = search_with_one_clock_jump(monkeypatch, MIXED_PROGRESS, 0.5, replicas=False)
    singles = [i for i, what in enumerate(calls) if what.endswith("alone")]
    assert singles and MIXED_PROGRESS in calls[singles[-1] :]  # the mixed search went on after the baselines
    assert result.complete and result.gap == 0.0 and result.stop_reason == "proven"
    assert result.plans[0].time == free.plans[0].time
    assert result.plans[0].status == "optimal"


def test_replica_shapes_left_open_are_searched_again(monkeypatch):
    """The replica search stopped by its share of the time limit is searched again with the time the other phases
    left: the result is the one an unlimited search proves. The test's clock stands still but for one jump, past
    the replica search's stop (60% of the limit), when it has opened its first shape."""
    from test_hetero import OPTS, small_job

    from planner.search.mixed_pipelines import search_hetero

    free = search_hetero(small_job(), top=1, time_limit_s=3600, options=OPTS)
    assert free.complete and free.gap == 0.0

    result, calls = search_with_one_clock_jump(monkeypatch, "replica shapes", 0.65)
    singles = [i for i, what in enumerate(calls) if what.endswith("alone")]
    assert singles and "replica shapes" in calls[singles[-1] :]  # searched again after the baselines
    assert result.complete and result.gap == 0.0 and result.stop_reason == "proven"
    assert result.plans[0].time == free.plans[0].time


def test_solves_stopped_by_their_cap_are_solved_again(monkeypatch):
    """A mixed-pipeline solve stopped by its cap (here: every candidate's first solve reports 'feasible' with a
    bound of 0, as a solve cut short would) is solved again with the time the other phases left: the result is
    the one an unlimited search proves, not one left open with the solve cap as its reason."""
    from dataclasses import replace as copy_with

    from test_hetero import OPTS, small_job

    from planner.search import mixed_pipelines
    from planner.search.mixed_pipelines import search_hetero

    free = search_hetero(small_job(), top=1, time_limit_s=3600, options=OPTS, replicas=False)
    real, seen = mixed_pipelines._solve, set()

    def capped_first(ctx, c, sms, cap_s, limit, wall, workers):
        res, est = real(ctx, c, sms, cap_s, limit, wall, workers)
        if c in seen or res.status != "optimal":
            return res, est
        seen.add(c)
        return copy_with(res, status="feasible", bound_s=0.0), est

    monkeypatch.setattr(mixed_pipelines, "_solve", capped_first)
    result = search_hetero(small_job(), top=1, time_limit_s=3600, options=OPTS, replicas=False)
    assert seen  # some solve was cut short
    assert result.complete and result.gap == 0.0 and result.stop_reason == "proven"
    assert result.plans[0].time == free.plans[0].time and result.plans[0].status == "optimal"


def test_mixed_solves_are_capped_in_deterministic_time(monkeypatch):
    """A mixed-pipeline solve's cap is CP-SAT's deterministic time (the same stop on any machine, so the same plans
    and counts after it), the cap a solve gets whatever time is left; the wall clock only backs it up."""
    from test_hetero import OPTS, small_job

    from planner.search import mixed_pipelines
    from planner.search.mixed_pipelines import search_hetero
    from planner.search.result import SOLVE_WALL, solve_cap

    real, calls = mixed_pipelines.solve_partition, []

    def record(*args, **kwargs):
        calls.append((kwargs["work_limit"], kwargs["time_limit_s"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(mixed_pipelines, "solve_partition", record)
    search_hetero(small_job(), top=1, time_limit_s=3600, options=OPTS, replicas=False)
    assert calls
    assert {work for work, _ in calls} <= {solve_cap(0.0), solve_cap(3600)}  # (no plan yet: find one)
    assert all(0 < wall <= SOLVE_WALL * work for work, wall in calls)


# ----------------------------------------------------------------------------------- ties collapsed
def fake(name: str, t: float, mem: float, key: int) -> Plan:
    """A Plan stub: keep_top reads the time, peak memory, layout (dims) and candidate order."""
    dims = SimpleNamespace(world=8, as_dict=lambda: {"name": name})
    est = SimpleNamespace(iteration_time_s=t, peak_memory_gib=mem, dims=dims)
    return Plan(SimpleNamespace(sort_key=lambda: (key,)), est, "optimal")


def names(best):
    return [
        (p.estimate.dims.as_dict()["name"], [e.estimate.dims.as_dict()["name"] for e in p.equivalent]) for p in best
    ]


def test_keep_counts_distinct_plans():
    best: list[Plan] = []
    keep_top(best, fake("a", 1.0, 10.0, 2), 2)
    keep_top(best, fake("a-twin", 1.0 * (1 + RESOLUTION / 2), 10.0, 3), 2)  # ties a: joins it
    keep_top(best, fake("b", 1.1, 10.0, 1), 2)
    keep_top(best, fake("b-more-memory", 1.1, 12.0, 4), 2)  # same time, different memory: a distinct plan
    assert names(best) == [("a", ["a-twin"]), ("b", [])]  # K = 2 distinct plans, b-more-memory falls out
    keep_top(best, fake("a-first", 1.0, 10.0, 0), 2)  # ties a and sorts first: it leads the entry
    assert names(best) == [("a-first", ["a", "a-twin"]), ("b", [])]
    keep_top(best, fake("c", 0.5, 10.0, 5), 2)  # a new best pushes b (the K-th distinct plan) out
    assert names(best) == [("c", []), ("a-first", ["a", "a-twin"])]
    keep_top(best, fake("a", 0.9, 10.0, 6), 2)  # the same layout as a member, faster: moved out of the tie
    assert names(best) == [("c", []), ("a", [])]


def test_top_k_of_distinct_plans_is_exact():
    """The K distinct plans of a K search are the first K distinct plans of a much deeper search: cutting at the
    K-th distinct time keeps every plan that could be one of them."""
    j = job(model={**SMALL_GPT, "num_layers": 6}, gpu=TIGHT_GPU, gbs=4, seq=8192, attention="eager")
    deep = search(j, top=40, time_limit_s=3600)
    for k in (1, 3, 5):
        got = search(j, top=k, time_limit_s=3600)
        assert got.complete
        assert [(p.time, p.estimate.peak_memory_gib) for p in got.plans] == [
            (p.time, p.estimate.peak_memory_gib) for p in deep.plans[:k]
        ]


@pytest.fixture(scope="module")
def doc_70b():
    """Llama-3-70B at 8K on H100 (examples/llama3-70b-h100.yaml), proven: an hour's limit is far above the seconds
    it needs, and the per-solve cap (10% of it) far above any solve."""
    return json.loads(plan_cli(str(EXAMPLE_70B), "--json", "--no-timing", "--time-limit", "3600"))


def test_70b_top5_are_distinct_and_name_their_twins(doc_70b):
    plans = doc_70b["plans"]
    assert doc_70b["search"]["stop_reason"] == "proven" and doc_70b["search"]["complete"]
    assert len(plans) == 5
    pairs = [(p["estimate"]["iteration_time_s"], p["estimate"]["peak_memory_gib"]) for p in plans]
    assert len(set(pairs)) == 5
    for i, a in enumerate(pairs):
        for b in pairs[i + 1 :]:
            assert not (abs(a[0] - b[0]) <= RESOLUTION * a[0] and abs(a[1] - b[1]) <= RESOLUTION * a[1]), (a, b)
    first = plans[0]["layout"]
    assert (first["tp"], first["pp"], first["dp"], first["cp"], first["micro_batch_size"]) == (2, 4, 8, 8, 1)
    twins = [(e["tp"], e["pp"], e["dp"], e["cp"], e["micro_batch_size"]) for e in plans[0]["equivalent"]]
    # CP 16 with 2-sequence micro-batches computes what CP 8 with one does, but its chunks are half as long and
    # their ring steps wait for their K,V blocks: no longer a twin of the best plan
    assert (2, 4, 4, 16, 2) not in twins


def test_70b_why_compares_against_a_plan_that_differs(doc_70b):
    one, two = (p["estimate"] for p in doc_70b["plans"][:2])
    assert (
        abs(one["iteration_time_s"] - two["iteration_time_s"]) > RESOLUTION * one["iteration_time_s"]
        or abs(one["peak_memory_gib"] - two["peak_memory_gib"]) > RESOLUTION * one["peak_memory_gib"]
    )
    text = text_of(doc_70b)
    row = next(line for line in text.splitlines() if line.startswith("│ iteration time s"))
    lead = row.split("│")[4].strip()  # the "#1 - #2" column
    assert float(lead) != 0, row
    assert "= tp2 pp4 dp4 cp16" not in text  # its longer ring sets CP 16 apart (test_70b_top5_are_distinct...)
    assert "proven optimal (within the modeled space)" in text


def test_plan_text_footer_end_to_end():
    """The footer of the text report, through the CLI."""
    out = plan_cli(str(EXAMPLE_70B), "--time-limit", "3600", "--top", "2")
    footer = next(line for line in out.splitlines() if line.startswith("searched "))
    assert footer.endswith("proven optimal (within the modeled space)"), footer


def test_current_layout_that_does_not_fit_is_said_in_words(tmp_path):
    raw = (ROOT / "examples" / "gpt-13b-a100-small.yaml").read_text().split("layout:")[0]
    path = tmp_path / "job.yaml"
    path.write_text(raw + "layout: {tp: 1, pp: 1, dp: 32, micro_batch_size: 4, zero_stage: 0, recompute: none}\n")
    j = load_job(path)
    current = estimate(j, capacity_margin=0.05)
    assert not current.fits
    result = search(j, top=1, time_limit_s=3600)
    doc = plan_document(j, result, current, timing=False, memory_margin=0.05)
    text = " ".join(text_of(doc).split())
    cap = j.cluster[0].gpu.memory_gib * 0.95
    need = current.to_json()["peak_memory_gib"]
    assert (
        f"your layout does not fit: it needs {need:.1f} GiB per GPU on stage 0, more than the {cap:.1f} GiB "
        f"available ({j.cluster[0].gpu.memory_gib:.0f} GiB less the 5% margin)"
    ) in text


def test_a_layout_met_again_solved_to_optimality_takes_its_status():
    """The same layout at the same time, first from a heuristic evaluation ("feasible"), then from an exact solve
    ("optimal"): the entry keeps one plan, the optimal one; the other way round nothing changes."""
    from dataclasses import replace

    from planner.search.result import keep_top

    heuristic = replace(fake("a", 1.0, 1.0, 1), status="feasible")
    exact = replace(fake("a", 1.0, 1.0, 1), status="optimal")
    best = []
    keep_top(best, heuristic, 3)
    keep_top(best, exact, 3)
    assert [p.status for p in best] == ["optimal"]
    keep_top(best, heuristic, 3)
    assert [p.status for p in best] == ["optimal"]
