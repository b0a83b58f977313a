"""Rich rendering of `planner plan`: the top plans, why the winner wins and what the search proved."""

from __future__ import annotations

import itertools
import math

from rich.console import Group
from rich.table import Table

from planner.report.estimate import layout_line
from planner.search.quick import RESOLUTION


def _stages(layout: dict) -> str:
    if layout.get("replicas"):
        return "; ".join(
            f"{r['count']}x({_stages({'stages': r['stages']})}) m{r['micro_batches']}" for r in layout["replicas"]
        )
    layers = [s["layers"] for s in layout["stages"]]
    if layout["stages"] and layout["stages"][0].get("group") is not None:
        words = [
            f"g{s['group']}:tp{s['tp']}x{s['layers']}"
            + (f"r{s['recompute_layers']}" if s.get("recompute_layers") else "")
            for s in layout["stages"]
        ]
        runs = [(w, len(list(g))) for w, g in itertools.groupby(words)]  # g0:tp2x3 (x31): 31 such stages in a row
        return " ".join(w if n == 1 else f"{w}(x{n})" for w, n in runs)
    rec = [s.get("recompute_layers") or 0 for s in layout["stages"]]
    text = "even" if len(set(layers)) == 1 else "/".join(map(str, layers))
    if any(rec):
        text += " (recompute " + "/".join(map(str, rec)) + ")"
    return text


def _degrees(lay: dict) -> str:
    """tp2 pp4 dp8 cp8 mbs1 zero1 none: the degrees of a layout (tp*: per stage, in mixed-GPU plans)."""
    text = " ".join(
        f"{k}{'*' if lay[k] is None else lay[k]}"
        for k in ("tp", "pp", "dp", "cp", "ep", "vpp")
        if k in ("tp", "pp", "dp") or lay[k] > 1
    )
    return text + f" mbs{lay['micro_batch_size']} zero{lay['zero_stage']} {lay['recompute']}"


SHOWN_EQUIVALENTS = 3  # equivalent layouts listed under a plan's row (all of them are in the JSON)


def render_plan(doc: dict) -> Group:
    top = Table(title="Best plans", title_justify="left")
    for col, just in (
        ("#", "right"),
        ("layout", "left"),
        ("layers per stage", "left"),
        ("iter s", "right"),
        ("tok/s/GPU", "right"),
        ("MFU", "right"),
        ("peak GiB", "right"),
        ("optimality", "left"),
    ):
        top.add_column(col, justify=just)
    for p in doc["plans"]:
        lay, est, opt = p["layout"], p["estimate"], p["optimality"]
        degrees = _degrees(lay)
        if p["placement"]["idle_gpus"]:
            degrees += f" ({p['placement']['idle_gpus']} GPUs idle)"
        top.add_row(
            str(p["rank"]),
            degrees,
            _stages(lay),
            f"{est['iteration_time_s']:.3f}",
            f"{est['tokens_per_s_per_gpu']:,.0f}",
            f"{est['mfu'] * 100:.1f}%",
            f"{est['peak_memory_gib']:.1f}",
            "optimal"
            if opt["status"] == "optimal"
            else f"gap {opt['gap'] * 100:.2f}%"
            if opt["gap"] > 0
            else "feasible",
        )
        same = p.get("equivalent") or []
        for alt in same[:SHOWN_EQUIVALENTS]:  # the same time and memory by the model: one choice, several layouts
            top.add_row("", f"  = {_degrees(alt)}", _stages(alt), "", "", "", "", "equivalent", style="dim")
        if len(same) > SHOWN_EQUIVALENTS:
            top.add_row(
                "",
                f"  = and {len(same) - SHOWN_EQUIVALENTS} more (JSON: equivalent)",
                "",
                "",
                "",
                "",
                "",
                "",
                style="dim",
            )
    parts = [top]
    if any(p.get("equivalent") for p in doc["plans"]):
        parts.append(
            "= rows: layouts the model cannot tell apart from the plan above them (time and peak memory within 0.01%)"
        )
    if doc["plans"]:
        parts.append(render_why(doc))
    misfit = current_misfit(doc)
    if misfit:
        parts.append(misfit)
    s = doc["search"]
    secs = "" if s["seconds"] is None else f" in {s['seconds']:.2f} s"
    parts.append(
        f"searched {s['candidates']:,} candidates ({s['pruned']:,} pruned, {s['solved']:,} CP-SAT solves)"
        f"{secs}; {status_sentence(s)}"
    )
    parts += _comparisons(doc)
    if doc["plans"]:
        for grp in doc["plans"][0]["placement"].get("groups") or []:
            if grp["idle_gpus"]:
                parts.append(
                    f"plan 1 leaves {grp['idle_gpus']} of {grp['idle_gpus'] + grp['used_gpus']} GPUs of group "
                    f"{grp['group']} ({grp['gpu']}) idle: {grp['idle_reason']}"
                )
    return Group(*parts)


def _comparisons(doc: dict) -> list[str]:
    """What the heterogeneous plan gains over one GPU type, and what a --framework restriction costs."""
    s, out = doc["search"], []
    best = doc["plans"][0]["estimate"]["iteration_time_s"] if doc["plans"] else None
    if s.get("single_type_bound_s") is not None:
        out.append(
            "no plan on one node group alone is faster than this plan (the single-type searches stop at its time)"
        )
    if s.get("single_type_best_s") is not None and best:
        out.append(
            f"best single-type plan (group {s['single_type_group']} alone): {s['single_type_best_s']:.3f} s; "
            f"heterogeneous / single-type = {s['hetero_vs_single_ratio']:.3f}"
        )
        if s["single_type_best_s"] < best:
            g = s["single_type_group"]
            out.append(
                f"[bold yellow]note:[/] group {g} alone is faster than the best mixed plan found; plan a job "
                f"with only cluster[{g}] (the other groups idle) to get its layout"
            )
    if s.get("framework") and s.get("unrestricted_best_s") is not None and best:
        out.append(
            f"--framework {s['framework']}: best {best:.3f} s vs {s['unrestricted_best_s']:.3f} s unrestricted "
            f"(restriction costs {(best / s['unrestricted_best_s'] - 1) * 100:+.1f}%)"
        )
    return out


def status_sentence(search: dict) -> str:
    """What the search proved, from the plan document's ``search`` (stop_reason, gap, gap_source)."""
    reason = search.get("stop_reason") or ("proven" if search["complete"] else "time_limit")
    gap = f"{search.get('gap', 0.0) * 100:.2f}%"
    if reason != "proven" and round(search.get("gap", 0.0) * 100, 2) == 0:
        gap += " (plan 1 is proven, the plans after it are not)"
    source = search.get("gap_source")
    where = {
        "mixed_pipelines": " (to the bound of mixed pipelines not yet ruled out)",
        "replica_shapes": " (to the bound of replica shapes, replicas on different GPU types, which are "
        "evaluated heuristically)",
    }.get(source, "")
    if reason == "proven":
        return "proven optimal (within the modeled space)"
    if reason == "time_limit":
        return f"stopped by the time limit with gap {gap}{where}; raise --time-limit to search further"
    if reason == "solve_cap":
        return (
            f"the time limit was not reached, but a CP-SAT solve stopped at its per-solve cap (10% of the "
            f"search's time limit, at least 1 s) and left gap {gap}{where}; raise --time-limit to raise the cap"
        )
    if reason == "heuristic":
        return (
            f"mixed pipelines proven; gap {gap} to the bound of replica shapes (replicas on different GPU "
            f"types), which are evaluated heuristically, not proven: a longer --time-limit does not close it"
        )
    return f"not proven ({reason}), gap {gap}"


def current_misfit(doc: dict) -> str | None:
    """Why the job's own layout (doc["current"]) does not fit, in words; None when it fits or there is none."""
    cur = doc.get("current")
    if not cur or cur["fits"]:
        return None
    over = []
    for st in cur["stages"]:
        cap = st.get("memory_capacity_gib", cur["memory_capacity_gib"])
        if st["peak_memory_gib"] > cap:
            over.append((st, cap))
    if not over:  # the estimate's own peak stage
        over = [
            (
                {
                    "index": cur["peak_memory_stage"],
                    "peak_memory_gib": cur["peak_memory_gib"],
                    **({"replica": cur["peak_memory_replica"]} if "peak_memory_replica" in cur else {}),
                },
                cur["memory_capacity_gib"],
            )
        ]
    st, cap = max(over, key=lambda x: x[0]["peak_memory_gib"] - x[1])
    where = f"stage {st['index']}" + (f" of replica {st['replica']}" if st.get("replica") is not None else "")
    if st.get("group") is not None:
        where += f" (node group {st['group']})"
    margin = doc.get("memory_margin")
    total = _gpu_memory(doc, st.get("group", 0))
    if margin is not None and total is not None:
        avail = f"{_num(total)} GiB less the {_num(margin * 100)}% margin"
    elif margin is not None:
        avail = f"the GPU's memory less the {_num(margin * 100)}% margin"
    else:
        avail = "the GPU's memory less the --memory-margin"
    more = f" ({len(over)} stages do not fit)" if len(over) > 1 else ""
    return (
        f"[bold red]your layout does not fit:[/] it needs {st['peak_memory_gib']:.1f} GiB per GPU on {where}, "
        f"more than the {cap:.1f} GiB available ({avail}){more}"
    )


def _gpu_memory(doc: dict, group: int | None) -> float | None:
    try:
        return float(doc["job"]["cluster"][group or 0]["gpu"]["memory_gib"])
    except (KeyError, IndexError, TypeError):
        return None


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-6 else f"{x:.1f}"


def render_why(doc: dict) -> Table:
    """Time breakdown of the winner against the runner-up and the job's current layout. The runner-up is the
    next distinct plan: plans the model cannot tell apart are one entry of the top list (doc plans' equivalent),
    so #2 differs from #1 in time or memory."""
    win = doc["plans"][0]["estimate"]
    cols = [("#1", win)]
    if len(doc["plans"]) > 1:
        cols.append(("#2", doc["plans"][1]["estimate"]))
    if doc.get("current"):
        cols.append(("current", doc["current"]))
    t = Table(title="Why #1 wins (seconds per iteration)", title_justify="left")
    t.add_column("component")
    for name, _ in cols:
        t.add_column(name, justify="right")
    for name, _ in cols[1:]:
        t.add_column(f"#1 - {name}", justify="right")
    keys = [k for k in win["time_breakdown_s"] if any(c["time_breakdown_s"].get(k, 0) > 0 for _, c in cols)]
    # enough decimals that #1's lead over each column shows (a lead of 0.4 ms is not "+0.000")
    leads = [abs(win["iteration_time_s"] - c["iteration_time_s"]) for _, c in cols[1:]]
    digits = min(6, max([3] + [1 - math.floor(math.log10(x)) for x in leads if x > 0]))
    for k in keys + ["iteration_time_s"]:
        vals = [
            (c["iteration_time_s"] if k == "iteration_time_s" else c["time_breakdown_s"].get(k, 0.0)) for _, c in cols
        ]
        row = (
            [k.replace("_", " ")] + [f"{v:.{digits}f}" for v in vals] + [f"{vals[0] - v:+.{digits}f}" for v in vals[1:]]
        )
        t.add_row(*row)
    t.add_row(
        "peak memory GiB",
        *[f"{c['peak_memory_gib']:.1f}" for _, c in cols],
        *[f"{win['peak_memory_gib'] - c['peak_memory_gib']:+.1f}" for _, c in cols[1:]],
    )
    notes = []
    if len(doc["plans"]) > 1:
        two = doc["plans"][1]["estimate"]
        if abs(win["iteration_time_s"] - two["iteration_time_s"]) <= RESOLUTION * win["iteration_time_s"]:
            notes.append(
                f"#1 and #2 are equally fast by the model (within 0.01%); they differ in peak memory: "
                f"{win['peak_memory_gib']:.1f} vs {two['peak_memory_gib']:.1f} GiB"
            )
    if doc.get("current"):
        notes.append("current: " + layout_line(doc["current"]["layout"]))
    if notes:
        t.caption = "\n".join(notes)
    return t
