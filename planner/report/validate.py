"""Rich table for `planner validate`."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table


def _pct(x):
    return "" if x is None else f"{x * 100:+.1f}%"


def render_validation(doc: dict) -> Group:
    runs = Table(title="Predicted vs measured", title_justify="left")
    for col, just in (
        ("run", "left"),
        ("measured s", "right"),
        ("predicted s", "right"),
        ("time err", "right"),
        ("measured GiB", "right"),
        ("predicted GiB", "right"),
        ("mem err", "right"),
        ("fits", "left"),
    ):
        runs.add_column(col, justify=just)
    skipped = []
    for r in doc["runs"]:
        if r["status"] != "ok":
            skipped.append(r)
            continue
        m, p, e = r["measured"], r["predicted"], r["error"]
        fits = "yes" if p["fits"] else "no"
        if m["oom"]:
            fits += " (OOM measured)"
        runs.add_row(
            r["id"],
            "" if m["iteration_time_s"] is None else f"{m['iteration_time_s']:.3f}",
            f"{p['iteration_time_s']:.3f}",
            _pct(e["iteration_time"]),
            "" if m["memory_gib"] is None else f"{m['memory_gib']:.1f}",
            f"{p['peak_memory_gib']:.1f}",
            _pct(e["peak_memory"]),
            fits,
        )
    s = doc["summary"]
    summary = Table(title="Summary", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row(
        "runs predicted", f"{s['predicted']} of {s['runs']} ({s['coverage'] * 100:.1f}%), {s['skipped']} skipped"
    )
    t = s["time"]
    summary.add_row(
        "iteration time",
        f"median |error| {t['median_abs_error_pct']}%, p90 {t['p90_abs_error_pct']}% over {t['count']} runs",
    )
    mm = s["memory"]
    if mm["count"]:
        summary.add_row(
            "peak memory",
            f"median |error| {mm['median_abs_error_pct']}%, p90 {mm['p90_abs_error_pct']}% over {mm['count']} runs",
        )
    o = s["oom"]
    summary.add_row(
        "OOM",
        f"{o['predicted_not_fitting']} of {o['measured']} measured OOMs predicted not to fit; "
        f"{o['ran_but_predicted_not_fitting']} runs that ran predicted not to fit",
    )
    parts = [runs, summary]
    if skipped:
        sk = Table(title="Skipped", title_justify="left")
        sk.add_column("run")
        sk.add_column("reason")
        for r in skipped:
            sk.add_row(r["id"], r["reason"])
        parts.append(sk)
    return Group(*parts)
