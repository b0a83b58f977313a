"""Rich rendering of `planner plan`: the top plans and why the winner wins."""
from __future__ import annotations

import itertools

from rich.console import Group
from rich.table import Table

from planner.report.estimate import _layout_line


def _stages(layout: dict) -> str:
    if layout.get("replicas"):
        return "; ".join(f"{r['count']}x({_stages({'stages': r['stages']})}) m{r['micro_batches']}"
                         for r in layout["replicas"])
    layers = [s["layers"] for s in layout["stages"]]
    if layout["stages"] and layout["stages"][0].get("group") is not None:
        words = [f"g{s['group']}:tp{s['tp']}x{s['layers']}" + (f"r{s['recompute_layers']}" if s.get("recompute_layers") else "")
                 for s in layout["stages"]]
        runs = [(w, len(list(g))) for w, g in itertools.groupby(words)]  # g0:tp2x3 (x31): 31 such stages in a row
        return " ".join(w if n == 1 else f"{w}(x{n})" for w, n in runs)
    rec = [s.get("recompute_layers") or 0 for s in layout["stages"]]
    text = "even" if len(set(layers)) == 1 else "/".join(map(str, layers))
    if any(rec):
        text += " (recompute " + "/".join(map(str, rec)) + ")"
    return text


def render_plan(doc: dict) -> Group:
    top = Table(title="Best plans", title_justify="left")
    for col, just in (("#", "right"), ("layout", "left"), ("layers per stage", "left"), ("iter s", "right"),
                      ("tok/s/GPU", "right"), ("MFU", "right"), ("peak GiB", "right"), ("optimality", "left")):
        top.add_column(col, justify=just)
    for p in doc["plans"]:
        lay, est, opt = p["layout"], p["estimate"], p["optimality"]
        degrees = " ".join(f"{k}{lay[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "vpp") if k in ("tp", "pp", "dp") or lay[k] > 1)
        degrees += f" mbs{lay['micro_batch_size']} zero{lay['zero_stage']} {lay['recompute']}"
        if p["placement"]["idle_gpus"]:
            degrees += f" ({p['placement']['idle_gpus']} GPUs idle)"
        top.add_row(str(p["rank"]), degrees, _stages(lay), f"{est['iteration_time_s']:.3f}",
                    f"{est['tokens_per_s_per_gpu']:,.0f}", f"{est['mfu'] * 100:.1f}%", f"{est['peak_memory_gib']:.1f}",
                    "optimal" if opt["status"] == "optimal"
                    else f"gap {opt['gap'] * 100:.2f}%" if opt["gap"] > 0 else "feasible")
    parts = [top]
    if doc["plans"]:
        parts.append(render_why(doc))
    s = doc["search"]
    secs = "" if s["seconds"] is None else f" in {s['seconds']:.2f} s"
    parts.append(f"searched {s['candidates']:,} candidates ({s['pruned']:,} pruned, {s['solved']:,} CP-SAT solves)"
                 f"{secs}; {'complete' if s['complete'] else 'stopped by the time limit'}")
    parts += _comparisons(doc)
    if doc["plans"]:
        for grp in doc["plans"][0]["placement"].get("groups") or []:
            if grp["idle_gpus"]:
                parts.append(f"plan 1 leaves {grp['idle_gpus']} of {grp['idle_gpus'] + grp['used_gpus']} GPUs of group "
                             f"{grp['group']} ({grp['gpu']}) idle: {grp['idle_reason']}")
    return Group(*parts)


def _comparisons(doc: dict) -> list[str]:
    """What the heterogeneous plan gains over one GPU type, and what a --framework restriction costs."""
    s, out = doc["search"], []
    best = doc["plans"][0]["estimate"]["iteration_time_s"] if doc["plans"] else None
    if s.get("single_type_best_s") is not None and best:
        out.append(f"best single-type plan (group {s['single_type_group']} alone): {s['single_type_best_s']:.3f} s; "
                   f"heterogeneous / single-type = {s['hetero_vs_single_ratio']:.3f}")
        if s["single_type_best_s"] < best:
            g = s["single_type_group"]
            out.append(f"[bold yellow]note:[/] group {g} alone is faster than the best mixed plan found; plan a job "
                       f"with only cluster[{g}] (the other groups idle) to get its layout")
    if s.get("framework") and s.get("unrestricted_best_s") is not None and best:
        out.append(f"--framework {s['framework']}: best {best:.3f} s vs {s['unrestricted_best_s']:.3f} s unrestricted "
                   f"(restriction costs {(best / s['unrestricted_best_s'] - 1) * 100:+.1f}%)")
    return out


def render_why(doc: dict) -> Table:
    """Time breakdown of the winner against the runner-up and the job's current layout."""
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
    for k in keys + ["iteration_time_s"]:
        vals = [(c["iteration_time_s"] if k == "iteration_time_s" else c["time_breakdown_s"].get(k, 0.0)) for _, c in cols]
        row = [k.replace("_", " ")] + [f"{v:.3f}" for v in vals] + [f"{vals[0] - v:+.3f}" for v in vals[1:]]
        t.add_row(*row)
    t.add_row("peak memory GiB", *[f"{c['peak_memory_gib']:.1f}" for _, c in cols],
              *[f"{win['peak_memory_gib'] - c['peak_memory_gib']:+.1f}" for _, c in cols[1:]])
    if doc.get("current"):
        t.caption = "current: " + _layout_line(doc["current"]["layout"])
    return t
