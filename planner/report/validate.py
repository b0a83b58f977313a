"""Rich table for `planner validate`."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table


def _pct(x):
    return "" if x is None else f"{x * 100:+.1f}%"


def _num(x) -> str:
    return "" if x is None else f"{x:.1f}%"


SUMMARY_KEY = (
    "time/memory: median and p90 |error|, mean signed error (+ = predicted slower); (n) runs with measured memory; "
    "OOM: measured OOMs predicted not to fit / measured OOMs; "
    "ran, pred. OOM: runs that ran but were predicted not to fit"
)


def _summary_table(title: str, first: str, rows: list[tuple[str, dict]], caption: str | None = None) -> Table:
    """One row per (name, summarize() dict): the by-group and by-file tables."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column(first, overflow="fold")  # a long path folds; the numbers never do
    for col in ("predicted", "time median", "time p90", "time mean", "memory median (n)", "OOM", "ran, pred. OOM"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for name, s in rows:
        t, m, o = s["time"], s["memory"], s["oom"]
        mean = t["mean_signed_error_pct"]
        table.add_row(
            name,
            f"{s['predicted']}/{s['runs']}",
            _num(t["median_abs_error_pct"]),
            _num(t["p90_abs_error_pct"]),
            "" if mean is None else f"{mean:+.1f}%",
            f"{_num(m['median_abs_error_pct'])} ({m['count']})".strip(),
            f"{o['predicted_not_fitting']}/{o['measured']}",
            str(o["ran_but_predicted_not_fitting"]),
        )
    return table


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
    tables = []
    if doc.get("groups"):
        tables.append(("By source group", "source group", list(doc["groups"].items())))
    if doc.get("files"):
        tables.append(("By file", "file", [(f["path"], f["summary"]) for f in doc["files"]]))
    for i, (title, first, rows) in enumerate(tables):
        parts.append(_summary_table(title, first, rows, SUMMARY_KEY if i == len(tables) - 1 else None))
    if skipped:
        sk = Table(title="Skipped", title_justify="left")
        sk.add_column("run")
        sk.add_column("reason")
        for r in skipped:
            sk.add_row(r["id"], r["reason"])
        parts.append(sk)
    return Group(*parts)
