"""Launcher scripts around a framework's program: torchrun on every node (``launch.sh``), and a Slurm batch script
(``sbatch.sh``) that runs launch.sh on each node of its allocation.

Placement is what makes a mixed-GPU plan run on stock frameworks (emitters.md 4.3-4.4): PP is the outermost rank
dimension in Megatron-LM, DeepSpeed and torchtitan, so pipeline stage s owns a contiguous block of global ranks, and
node rank r gets ranks [r*gpus, (r+1)*gpus). The scripts therefore pin node ranks: torchrun's static rendezvous with
an explicit ``--node-rank`` (with c10d the node rank is ignored and nodes join in arrival order), and under Slurm a
heterogeneous job whose components come in pipeline-stage order, one task per node, node rank = SLURM_PROCID.
"""

from __future__ import annotations

import shlex

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible

MASTER_PORT = 29500


def render(plan: LaunchPlan, bundle: Bundle, options: EmitOptions) -> dict[str, str]:
    """launch.sh always (Slurm runs it too), sbatch.sh with ``--launcher slurm``."""
    files = {"launch.sh": launch_script(plan, bundle)}
    if options.launcher == "slurm":
        files["sbatch.sh"] = sbatch_script(plan)
    return files


def node_runs(plan: LaunchPlan) -> list[tuple[int, int, int]]:
    """(node group, first node rank, node count) of each run of consecutive node ranks on one node group, in node
    rank order."""
    runs: list[list[int]] = []
    for rank, (group, _) in enumerate(plan.node_order()):
        if runs and runs[-1][0] == group:
            runs[-1][2] += 1
        else:
            runs.append([group, rank, 1])
    return [(g, first, count) for g, first, count in runs]


def torchrun_command(plan: LaunchPlan, bundle: Bundle, nproc: str) -> list[str]:
    """The torchrun line of one node, as shell words (the node rank and master address come from the script's
    arguments). torchrun flags: torch/distributed/run.py (emitters.md 4.3)."""
    head = [
        "torchrun",
        f"--nnodes={plan.nodes}",
        f"--nproc-per-node={nproc}",
        '--node-rank="$NODE_RANK"',
        '--master-addr="$MASTER_ADDR"',
        '--master-port="$MASTER_PORT"',
        "--rdzv-backend=static",
    ]
    return head + [shlex.quote(word) for word in bundle.program]


def launch_script(plan: LaunchPlan, bundle: Bundle) -> str:
    runs = node_runs(plan)
    lines = [
        "#!/usr/bin/env bash",
        f"# {_summary(plan)}",
        f"# Run on every one of the {plan.nodes} nodes: bash launch.sh NODE_RANK MASTER_ADDR [MASTER_PORT]",
        "# NODE_RANK decides which pipeline stages a node runs; start each rank on a node of the GPU type below.",
    ]
    for group, first, count in runs:
        gpu = plan.job.cluster[group].gpu.name
        lines.append(
            f"#   node ranks {first}-{first + count - 1}: {gpu} (node group {group}): {_stages_on(plan, first, count)}"
        )
    lines += [
        "set -euo pipefail",
        'NODE_RANK="${1:?usage: launch.sh NODE_RANK MASTER_ADDR [MASTER_PORT]}"',
        'MASTER_ADDR="${2:?usage: launch.sh NODE_RANK MASTER_ADDR [MASTER_PORT]}"',
        f'MASTER_PORT="${{3:-{MASTER_PORT}}}"',
        f"if (( NODE_RANK < 0 || NODE_RANK >= {plan.nodes} )); then",
        f'  echo "launch.sh: NODE_RANK must be 0..{plan.nodes - 1}, got $NODE_RANK" >&2; exit 2',
        "fi",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',
    ]
    for key, value in sorted(bundle.env.items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    nprocs = plan.node_gpus()
    if len(set(nprocs)) == 1:
        lines.append(f"NPROC={nprocs[0]}")
    else:  # nodes the plan uses partly, or groups with other GPU counts: torch elastic numbers ranks cumulatively
        lines.append(f"NPROCS=({' '.join(map(str, nprocs))})  # processes of each node rank")
        lines.append('NPROC="${NPROCS[$NODE_RANK]}"')
    lines.append(f"cd {bundle.workdir}" if bundle.workdir else 'cd "$HERE"')
    words = torchrun_command(plan, bundle, "$NPROC")
    head, program = words[: len(words) - len(bundle.program)], words[len(words) - len(bundle.program) :]
    lines.append("exec " + " \\\n  ".join(head + _wrap(program)))
    return "\n".join(lines) + "\n"


def sbatch_script(plan: LaunchPlan) -> str:
    """One task per node; a heterogeneous job (one component per run of node ranks on one GPU type, in node-rank
    order) when the plan spans node groups. Slurm: sbatch(1), heterogeneous_jobs.html (emitters.md 4.3)."""
    runs = node_runs(plan)
    groups = [g for g, _, _ in runs]
    if len(set(groups)) != len(groups):
        raise Inexpressible(
            "--launcher",
            "the plan returns to a node group after leaving it along the node ranks, which a Slurm heterogeneous "
            "job cannot order; use --launcher torchrun",
        )
    lines = ["#!/bin/bash", f"# {_summary(plan)}", "#SBATCH --job-name=" + _job_name(plan)]
    for i, (group, _, count) in enumerate(runs):
        if i:
            lines.append("#SBATCH hetjob")
        gpn = plan.job.cluster[group].gpus_per_node
        lines += [f"#SBATCH --nodes={count}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={gpn}"]
        lines.append("#SBATCH --exclusive")
        if len(runs) > 1:
            lines.append(f"#SBATCH --constraint={plan.job.cluster[group].gpu.name}")
    lines += [
        "set -euo pipefail",
        "# sbatch runs a copy of this script: submit it from the bundle's folder (cd DIR && sbatch sbatch.sh)",
        'HERE="${SLURM_SUBMIT_DIR:-$(pwd)}"',
        'NODES="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"',
        'MASTER_ADDR="$(scontrol show hostnames "$NODES" | head -n1)"',
        "# one task per node; node rank = SLURM_PROCID (components in node-rank order)",
    ]
    het = f" --het-group=0-{len(runs) - 1}" if len(runs) > 1 else ""
    task = 'bash -c \'exec bash "$0" "$SLURM_PROCID" "$1"\' "$HERE/launch.sh" "$MASTER_ADDR"'
    lines.append(f"srun{het} --kill-on-bad-exit=1 {task}")
    return "\n".join(lines) + "\n"


def _wrap(words: list[str]) -> list[str]:
    """Shell words grouped as one flag with its values per line."""
    out: list[str] = []
    for word in words:
        if out and not word.startswith("-"):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def stage_span(plan: LaunchPlan, first: int, count: int) -> str | None:
    """The pipeline stages on node ranks first .. first+count-1 as "3" or "0-19" (None: no stage)."""
    nodes = range(first, first + count)
    stages = sorted(
        {
            s.stage
            for s in plan.stages
            if plan.node_of_rank(s.first_rank) in nodes or plan.node_of_rank(s.last_rank) in nodes
        }
    )
    if not stages:
        return None
    return str(stages[0]) if stages[0] == stages[-1] else f"{stages[0]}-{stages[-1]}"


def _stages_on(plan: LaunchPlan, first: int, count: int) -> str:
    span = stage_span(plan, first, count)
    return "no stage" if span is None else f"stage{'' if '-' not in span else 's'} {span}"


def _summary(plan: LaunchPlan) -> str:
    return (
        f"planner plan #{plan.plan_rank}: {plan.job.model.name}, tp {plan.tp} pp {plan.pp} dp {plan.dp} "
        f"cp {plan.cp} ep {plan.ep} vpp {plan.vpp}, micro-batch {plan.micro_batch_size}, "
        f"{plan.world_size} GPUs on {plan.nodes} nodes"
    )


def _job_name(plan: LaunchPlan) -> str:
    return "planner-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in plan.job.model.name)
