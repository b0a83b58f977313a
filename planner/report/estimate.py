"""Rich tables for one estimate."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from planner.cost.estimate import Estimate


def layout_line(d: dict) -> str:
    # mixed-GPU layouts: tp, sequence_parallel and num_microbatches are null where stages (or replicas) differ
    tp = "per-stage" if d["tp"] is None else d["tp"]
    sp = "per-stage" if d["sequence_parallel"] is None else "on" if d["sequence_parallel"] else "off"
    micro = "per-replica" if d["num_microbatches"] is None else d["num_microbatches"]
    parts = [
        f"tp={tp}",
        f"pp={d['pp']}",
        f"dp={d['dp']}",
        f"cp={d['cp']}",
        f"ep={d['ep']}",
        f"vpp={d['vpp']}",
        f"mbs={d['micro_batch_size']}",
        f"sp={sp}",
        f"zero={d['zero_stage']}",
        f"recompute={d['recompute']}",
        f"micro-batches={micro}",
    ]
    if d.get("tp_comm_overlap"):
        parts.append("tp-overlap")
    return " ".join(parts)


def render_estimate(est: Estimate, title: str = "Estimate") -> Group:
    j = est.to_json()
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    head.add_row("layout", layout_line(j["layout"]))
    where = f"stage {j['peak_memory_stage']}"
    if "peak_memory_replica" in j:
        where += f" of replica {j['peak_memory_replica']}"
    head.add_row(
        "fits",
        ("[green]yes[/]" if j["fits"] else "[red]no[/]")
        + f"  (peak {j['peak_memory_gib']:.1f} GiB on {where} of {j['memory_capacity_gib']:.1f} GiB)",
    )
    head.add_row("iteration time", f"{j['iteration_time_s']:.3f} s")
    head.add_row("throughput", f"{j['tokens_per_s']:,.0f} tokens/s  ({j['tokens_per_s_per_gpu']:,.1f} per GPU)")
    head.add_row(
        "model TFLOP/s per GPU",
        f"{j['model_tflops_per_gpu']:.1f}  (MFU {j['mfu'] * 100:.1f}% of {j['mfu_peak_tflops']:.0f})",
    )

    time = Table(title="Time per iteration", title_justify="left")
    time.add_column("component")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    total = j["iteration_time_s"]
    for k, v in j["time_breakdown_s"].items():
        if v > 0:
            time.add_row(k.replace("_", " "), f"{v:.4f}", f"{v / total * 100:.1f}%")

    mem = Table(title=f"Memory per GPU (stage {j['peak_memory_stage']})", title_justify="left")
    mem.add_column("component")
    mem.add_column("GiB", justify="right")
    for k, v in j["memory_breakdown_gib"].items():
        mem.add_row(k, f"{v:.2f}")
    mem.add_row("[bold]peak[/]", f"[bold]{j['peak_memory_gib']:.2f}[/]")
    parts = [head, time, mem]
    if "group" in j["stages"][0]:
        parts.append(_stage_table(j))
    return Group(*parts)


def _stage_table(j: dict) -> Table:
    """Mixed-GPU layouts: every stage (of every replica) with its node group, micro-batch time and memory."""
    lay = j["layout"]
    replicas = lay.get("replicas") or [
        {"count": lay["dp"], "micro_batches": lay["num_microbatches"], "stages": lay["stages"]}
    ]
    table = Table(title="Stages", title_justify="left")
    for col in (
        "replica",
        "count",
        "micro-batches",
        "stage",
        "group",
        "tp",
        "layers",
        "recomputed",
        "µbatch s",
        "peak / capacity GiB",
    ):
        table.add_column(col, justify="left" if col == "replica" else "right")
    for st in j["stages"]:
        r = st.get("replica", 0)
        rep = replicas[r]
        spec = rep["stages"][st["index"]]
        table.add_row(
            str(r),
            str(rep["count"]),
            str(rep["micro_batches"]),
            str(st["index"]),
            str(st["group"]),
            str(spec["tp"]),
            str(st["layers"]),
            str(spec.get("recompute_layers", 0)),
            f"{st['microbatch_time_s']:.4f}",
            f"{st['peak_memory_gib']:.1f} / {st['memory_capacity_gib']:.1f}",
        )
    return table
