"""The README.md of an emitted launch folder: what the plan is, which file is what, how to start it, and on which
node (GPU type) each node rank must run."""

from __future__ import annotations

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch import node_runs, stage_span
from planner.emit.launch_plan import LaunchPlan

FILE_ROLES = {
    "launch.sh": "torchrun on one node: `bash launch.sh NODE_RANK MASTER_ADDR [MASTER_PORT]`",
    "sbatch.sh": "Slurm batch script: one task per node, each running launch.sh with its node rank",
    "README.md": "this file",
}


def render(plan: LaunchPlan, bundle: Bundle, options: EmitOptions, target: str) -> str:
    from planner import __version__

    p = plan
    lines = [
        f"# {p.job.model.name} on {p.world_size} GPUs with {target}",
        "",
        f"Plan #{p.plan_rank} of `{options.plan_file}`, written by planner {__version__} (`planner emit`).",
        "",
        "| degree | value |",
        "|---|---|",
    ]
    shape = [
        ("tensor parallel (TP)", p.tp),
        ("pipeline parallel (PP)", p.pp),
        ("data parallel (DP)", p.dp),
        ("context parallel (CP)", p.cp),
        ("expert parallel (EP)", p.ep),
        ("virtual stages per pipeline rank", p.vpp),
        ("sequence parallel", "yes" if p.sequence_parallel else "no"),
        ("ZeRO stage", p.zero_stage),
        ("micro-batch size", p.micro_batch_size),
        ("micro-batches per iteration", p.num_microbatches),
        ("global batch (sequences)", p.global_batch_size),
        ("layers per stage", ", ".join(map(str, p.stage_layers))),
        ("recompute", _recompute(p)),
    ]
    lines += [f"| {name} | {value} |" for name, value in shape]
    pred = p.predicted
    if pred.get("iteration_time_s") is not None:
        lines += [
            "",
            f"Predicted: {pred['iteration_time_s']:.3f} s per iteration, peak memory "
            f"{pred['peak_memory_gib']:.1f} GiB per GPU, {pred['tokens_per_s']:,.0f} tokens/s.",
        ]
    lines += ["", "## Files", ""]
    for name in sorted({*bundle.files, "launch.sh", *(["sbatch.sh"] if options.launcher == "slurm" else [])}):
        lines.append(f"- `{name}`: {FILE_ROLES.get(name, 'configuration read by the training program')}")
    lines += ["", "## Run", ""]
    if options.launcher == "slurm":
        lines += [
            "From this folder: `sbatch sbatch.sh`. Each node runs `launch.sh` with its node rank (SLURM_PROCID); "
            + (
                "the heterogeneous job's components come in node-rank order, so each lands on its GPU type "
                "(edit the `--constraint` lines to your site's node features)."
                if p.mixed
                else "node 0 is the rendezvous host."
            ),
            "",
        ]
    lines += [
        "On every node, with node 0's address as MASTER_ADDR: `bash launch.sh NODE_RANK MASTER_ADDR`. Node ranks "
        "fix which pipeline stages a node runs (static rendezvous):",
        "",
        "| node ranks | GPU | node group | pipeline stages |",
        "|---|---|---|---|",
    ]
    for group, first, count in node_runs(p):
        gpu = p.job.cluster[group].gpu.name
        lines.append(f"| {first}-{first + count - 1} | {gpu} | {group} | {stage_span(p, first, count) or '-'} |")
    if bundle.workdir:
        lines += ["", f"The program runs in {bundle.workdir.strip(chr(34))}."]
    if bundle.env:
        lines += ["", "## Environment", ""]
        lines += [f"- `{k}={v}`" for k, v in sorted(bundle.env.items())]
    if bundle.notes:
        lines += ["", "## Notes", "", *bundle.notes]
    return "\n".join(lines) + "\n"


def _recompute(p: LaunchPlan) -> str:
    if p.recompute == "full":
        return "full, every layer"
    if p.recompute_layers:
        return f"{p.recompute_layers} layers of every stage fully recomputed, the others {p.recompute}"
    return p.recompute
