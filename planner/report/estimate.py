"""Rich tables for one estimate."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table

from planner.cost.estimate import Estimate


def _layout_line(d: dict) -> str:
    parts = [f"tp={d['tp']}", f"pp={d['pp']}", f"dp={d['dp']}", f"cp={d['cp']}", f"ep={d['ep']}", f"vpp={d['vpp']}",
             f"mbs={d['micro_batch_size']}", f"sp={'on' if d['sequence_parallel'] else 'off'}",
             f"zero={d['zero_stage']}", f"recompute={d['recompute']}", f"micro-batches={d['num_microbatches']}"]
    if d.get("tp_comm_overlap"):
        parts.append("tp-overlap")
    return " ".join(parts)


def render_estimate(est: Estimate, title: str = "Estimate") -> Group:
    j = est.to_json()
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    head.add_row("layout", _layout_line(j["layout"]))
    head.add_row("fits", ("[green]yes[/]" if j["fits"] else "[red]no[/]")
                 + f"  (peak {j['peak_memory_gib']:.1f} GiB on stage {j['peak_memory_stage']} of {j['memory_capacity_gib']:.1f} GiB)")
    head.add_row("iteration time", f"{j['iteration_time_s']:.3f} s")
    head.add_row("throughput", f"{j['tokens_per_s']:,.0f} tokens/s  ({j['tokens_per_s_per_gpu']:,.1f} per GPU)")
    head.add_row("model TFLOP/s per GPU", f"{j['model_tflops_per_gpu']:.1f}  (MFU {j['mfu'] * 100:.1f}% of {j['mfu_peak_tflops']:.0f})")

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
    return Group(head, time, mem)
