"""Validate the emitters (planner/emit/) with each framework's OWN config code, on CPU.

    scripts/setup_validators.sh                          # once: the framework venvs under .venv-validators/
    python scripts/validate_emitters.py --plans 200      # random plans x every framework, torchrun launcher
    python scripts/validate_emitters.py --plans 50 --seed 3 --frameworks deepspeed torchtitan --launcher both
    python scripts/validate_emitters.py --only 17 --frameworks megatron --keep /tmp/plan17   # one plan, files kept

Plan i of seed S is drawn from random.Random(f"{S}:{i}"): a model with the shapes tests/strategies.py uses (GQA,
MoE, gelu/swiglu), a one-type cluster (or, in about one plan in ten, a pipeline over two GPU types with one TP
degree), and a layout drawn from the option generators of planner/parallel.py (TP, CP, PP, EP, uneven splits,
interleaving, partial recompute, ZeRO stages). It is priced with planner.cost.estimate (which runs the layout's
check()) and wrapped by planner.report.plan_json.plan_document, the writer of `planner plan --json`: no search runs.

Each plan is emitted for every framework asked (planner.emit.emit; errors.Inexpressible counts as "not
expressible", not as a failure). The launch scripts run under bash with stand-ins for torchrun, srun and scontrol
that record each node's torchrun command line and environment, so the validators see exactly what a node would run.
The validators run in batches, one subprocess per framework venv (scripts/validators/check_*.py, recipes of
shared/reference/emitters.md 1.6, 2.4, 3.4, 4.3):

    megatron         Megatron-LM parse_args/validate_args/TransformerConfig/micro-batch calculator + rank groups
    megatron-bridge  its model.* overrides through megatron-core's TransformerConfig (recipe C), same venv
    deepspeed        DeepSpeedConfig with a data-parallel mpu
    torchtitan       0.3.0: ConfigManager (--module/--config) + ParallelDims + build_mesh + the PP split
    torchtitan-0.2   0.2.2: the same with the TOML config (venv .venv-validators/torchtitan-0.2)
    torchrun         torch.distributed.run parse_args + config_from_args on every node's torchrun line
    slurm            `bash -n`, the #SBATCH components against the plan's node groups, srun over every task

An accepted config is also compared with the plan (degrees, batch, micro-batches, layers per pipeline stage,
stage ranks, model shape): a difference is a "mismatch". Accepted plans then go through the import round trip
(planner/emit/<framework>.read on the emitted config gives back the plan's layout).

Exit 0 when nothing was rejected, mismatched, failed the round trip, crashed in an emitter or broke a harness;
1 otherwise; 2 on bad input. A validator whose venv is missing is reported as skipped (with the setup command
that builds it), never a crash.

Needs a checkout with tests/strategies.py (the model generator), bash, and for the validators the venvs of
scripts/setup_validators.sh (.venv-validators/, or --venvs DIR). Time on 2 cores: generating and emitting take
about 1 s per 100 plans, the launch scripts under bash about 0.05 s per bundle, each validator subprocess 3 to 10 s
to import its framework then milliseconds per case: about 120 s for --plans 200 with every framework.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, run, shown  # noqa: E402

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

VALIDATORS_DIR = Path(__file__).resolve().parent / "validators"
DEFAULT_VENVS = ROOT / ".venv-validators"
FRAMEWORKS = ("megatron", "megatron-bridge", "deepspeed", "torchtitan", "torchtitan-0.2")
# framework -> (emit target, EmitOptions.framework_version, venv, harness)
SETUP = {
    "megatron": ("megatron", None, "megatron", "check_megatron.py"),
    "megatron-bridge": ("megatron-bridge", None, "megatron", "check_megatron.py"),
    "deepspeed": ("deepspeed", None, "deepspeed", "check_deepspeed.py"),
    "torchtitan": ("torchtitan", "0.3", "torchtitan", "check_torchtitan.py"),
    "torchtitan-0.2": ("torchtitan", "0.2", "torchtitan-0.2", "check_torchtitan.py"),
    "torchrun": (None, None, "deepspeed", "check_torchrun.py"),
}
SETUP_COMMAND = {
    "megatron": "scripts/setup_validators.sh --only megatron",
    "deepspeed": "scripts/setup_validators.sh --only deepspeed",
    "torchtitan": "scripts/setup_validators.sh --only torchtitan",
    "torchtitan-0.2": "scripts/setup_validators.sh --only torchtitan",
}
LAUNCHER_FILES = ("launch.sh", "sbatch.sh", "README.md")

# ---------------------------------------------------------------------------------------------------------------
# Random valid plans


PLAN_GPUS = ("a100-80gb", "h100-sxm", "h200", "b200", "a100-40gb", "l4")


class _Retry(Exception):
    """This draw has no valid layout; draw again."""


@dataclass
class GeneratedPlan:
    index: int
    doc: dict  # a plan JSON document (planner.report.plan_json.plan_document), one plan
    summary: str
    kind: str  # dense | moe
    mixed: bool


def _pick(rng: random.Random, options, bias_up: float = 0.0):
    """One of ``options`` (ascending); with probability ``bias_up`` one of the upper half."""
    options = list(options)
    if not options:
        raise _Retry("no option")
    if len(options) > 1 and rng.random() < bias_up:
        return rng.choice(options[len(options) // 2 :])
    return rng.choice(options)


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
    """``total`` over ``parts`` bins, each >= 1: even when it divides and a coin says so, else a random uneven
    split near the balanced one."""
    from planner.parallel import balanced_split

    if total < parts:
        raise _Retry("fewer layers than stages")
    split = balanced_split(total, parts)
    if total % parts == 0 and rng.random() < 0.5:
        return split
    for _ in range(rng.randint(1, 3)):
        a, b = rng.randrange(parts), rng.randrange(parts)
        if a != b and split[a] > 1:
            split[a] -= 1
            split[b] += 1
    return split


def _model(rng: random.Random, ch) -> dict:
    from strategies import gen_model

    model = gen_model(ch)
    if rng.random() < 0.5:  # deeper models than the fuzz generator's (<= 16 layers): room for pp * vpp
        model["num_layers"] = rng.choice((8, 12, 16, 24, 30, 32, 40, 48))
    if "moe" not in model and rng.random() < 0.15:
        hidden = model["hidden_size"]
        experts = rng.choice((4, 8, 16))
        model["moe"] = {
            "num_experts": experts,
            "top_k": rng.randint(1, min(4, experts)),
            "expert_ffn_hidden_size": 64 * rng.randint(max(1, hidden // 256), hidden // 32),
        }
    return model


def _recompute(rng: random.Random, training, stage_layers: list[int]) -> tuple[str, list[int] | None]:
    """(baseline recompute mode, per-stage fully recomputed layers or None), as the search writes them."""
    from planner.parallel import baseline_recompute_modes
    from planner.search.result import stage_recompute

    modes = baseline_recompute_modes(training)
    base = "full" if rng.random() < 0.3 else rng.choice(modes)
    if base == "full" or rng.random() < 0.7:
        return base, None
    k = rng.randint(1, min(stage_layers))
    counts = [k] * len(stage_layers)
    if rng.random() < 0.1:  # per-stage counts: stock frameworks take one (Inexpressible)
        counts = [rng.randint(0, n) for n in stage_layers]
    rec, base = stage_recompute(stage_layers, counts, base)
    return base, list(rec) if rec else None


def _homogeneous_layout(rng: random.Random, job_raw: dict, model, training) -> dict:
    from planner.parallel import cp_options, divisors, ep_options, pp_options, seq_shard_error, tp_options

    group = job_raw["cluster"][0]
    gpn, world = group["gpus_per_node"], group["nodes"] * group["gpus_per_node"]
    tp = _pick(rng, tp_options(model, world, gpn), bias_up=0.5)
    cp = _pick(rng, cp_options(training, world // tp)) if rng.random() < 0.3 else 1
    rest = world // (tp * cp)
    pp = _pick(rng, pp_options(model.num_layers, rest), bias_up=0.5)
    dp = rest // pp
    ep = _pick(rng, ep_options(model, dp, cp), bias_up=0.6) if model.moe else 1
    mbs = rng.choice((1, 1, 2, 4))
    nmb = rng.choice((1, 2, 3, 4, 6, 8, 12, 16))
    vpp = 1
    if pp > 1 and rng.random() < 0.35:
        chunks = [v for v in divisors(model.num_layers) if v > 1 and model.num_layers // v >= pp]
        if chunks:
            vpp = rng.choice(chunks)
    if vpp > 1 or (pp > 1 and rng.random() < 0.5):
        nmb = pp * rng.randint(1, 4)  # the interleaved schedule runs micro-batches in rounds of pp
    if vpp > 1:
        stage_layers = [vpp * n for n in _split(rng, model.num_layers // vpp, pp)]
    else:
        stage_layers = _split(rng, model.num_layers, pp)
    recompute, counts = _recompute(rng, training, stage_layers)
    # with pp > 1 Megatron and DeepSpeed run ZeRO 0/1 and torchtitan 0/3: weights that give each enough plans
    zero = rng.choice((0, 0, 1, 1, 3, 2)) if pp > 1 else rng.choice((0, 1, 2, 3, 3))
    job_raw["training"]["global_batch_size"] = mbs * dp * nmb
    sp = tp > 1 and seq_shard_error(training, cp, tp) is None
    return {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "ep": ep,
        "vpp": vpp,
        "micro_batch_size": mbs,
        "sequence_parallel": sp,
        "zero_stage": zero,
        "recompute": recompute,
        "tp_comm_overlap": tp > 1 and rng.random() < 0.2,
        "stages": [
            {"layers": n, **({"recompute_layers": counts[i]} if counts else {})} for i, n in enumerate(stage_layers)
        ],
    }


def _mixed_layout(rng: random.Random, job_raw: dict, model, training) -> dict:
    """A pipeline over two node groups (different GPUs), one TP degree, stages of each group consecutive; now and
    then a group keeps idle GPUs."""
    from planner.parallel import node_group_tp_options

    gpus = rng.sample(PLAN_GPUS, 2)
    gpns = [rng.choice((4, 8)), rng.choice((4, 8))]
    tp = _pick(rng, node_group_tp_options(model, gpns))
    dp = rng.choice([d for d in (1, 2, 4, 8) if tp * d <= 16])
    per_stage = tp * dp
    pp_max = min(model.num_layers, 8)
    if pp_max < 2:
        raise _Retry("one layer")
    pp = rng.randint(2, pp_max)
    first = rng.randint(1, pp - 1)
    order = [0, 1] if rng.random() < 0.5 else [1, 0]
    stage_groups = [order[0]] * first + [order[1]] * (pp - first)
    cluster = []
    for g in range(2):
        used = per_stage * stage_groups.count(g)
        nodes = math.ceil(used / gpns[g]) + (1 if rng.random() < 0.15 else 0)
        cluster.append({"gpu": gpus[g], "nodes": nodes, "gpus_per_node": gpns[g]})
    job_raw["cluster"] = cluster
    mbs = rng.choice((1, 2))
    nmb = pp * rng.randint(1, 3)
    job_raw["training"]["global_batch_size"] = mbs * dp * nmb
    stage_layers = _split(rng, model.num_layers, pp)
    recompute, counts = _recompute(rng, training, stage_layers)
    return {
        "pp": pp,
        "dp": dp,
        "cp": 1,
        "micro_batch_size": mbs,
        "zero_stage": rng.choice((0, 1)),
        "recompute": recompute,
        "stages": [
            {
                "layers": n,
                "group": stage_groups[i],
                "tp": tp,
                "gpus": per_stage,
                **({"recompute_layers": counts[i]} if counts else {}),
            }
            for i, n in enumerate(stage_layers)
        ],
    }


def _draw(index: int, rng: random.Random) -> GeneratedPlan:
    from emit_fixtures import fixed_layout_doc
    from strategies import RandomChooser, gen_training

    from planner.cost.estimate import estimate
    from planner.errors import SpecError
    from planner.load import parse_job
    from planner.spec import Layout

    ch = RandomChooser(rng)
    mixed = rng.random() < 0.1
    raw = {"model": _model(rng, ch), "training": gen_training(ch)}
    if rng.random() < 0.5:  # torchtitan trains in bf16 only: keep fp16 to a quarter of the plans
        raw["training"]["precision"] = "bf16"
    gpn = rng.choice((1, 2, 4, 8, 8, 8))
    raw["cluster"] = [
        {"gpu": rng.choice(PLAN_GPUS), "nodes": rng.randint(1, max(1, min(8, 64 // gpn))), "gpus_per_node": gpn}
    ]
    try:
        base = parse_job(raw)
    except SpecError as exc:
        raise _Retry(str(exc))
    layout_raw = (_mixed_layout if mixed else _homogeneous_layout)(rng, raw, base.model, base.training)
    try:
        job = parse_job(raw)
        layout = Layout.model_validate(layout_raw)
        est = estimate(job, layout)  # runs the layout's check() (planner.parallel rules)
    except SpecError as exc:
        raise _Retry(str(exc))
    doc = fixed_layout_doc(job, est)
    lay = doc["plans"][0]["layout"]
    split = "/".join(str(s["layers"]) for s in lay["stages"])
    m = job.model
    moe = f" moe {m.moe.num_experts}x top{m.moe.top_k}" if m.moe else ""
    gpus = "+".join(f"{g.nodes}x{g.gpus_per_node} {g.gpu.name}" for g in job.cluster)
    summary = (
        f"{m.num_layers}L h{m.hidden_size} heads {m.num_attention_heads}/{m.kv_heads}{moe} on {gpus}: "
        f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']} cp {lay['cp']} ep {lay['ep']} vpp {lay['vpp']} "
        f"mbs {lay['micro_batch_size']} x{lay['num_microbatches']} zero {lay['zero_stage']} {lay['recompute']} "
        f"split {split}"
    )
    return GeneratedPlan(index, doc, summary, "moe" if m.moe else "dense", mixed)


def gen_plan(seed: int, index: int) -> GeneratedPlan:
    """Plan ``index`` of ``seed``: the first valid draw of random.Random(f"{seed}:{index}")."""
    rng = random.Random(f"{seed}:{index}")
    for _ in range(200):
        try:
            return _draw(index, rng)
        except _Retry:
            continue
    raise RuntimeError(f"plan {index} of seed {seed}: no valid layout in 200 draws")


# ---------------------------------------------------------------------------------------------------------------
# Emitting, and running the launch scripts with stand-ins


@dataclass
class Bundle:
    """One plan emitted for one framework and launcher, written to ``folder``."""

    plan: GeneratedPlan
    framework: str
    launcher: str
    folder: Path
    files: dict[str, str]
    launch_plan: object  # planner.emit.LaunchPlan
    nodes: list[dict] = field(default_factory=list)  # per recorded node: argv, env, cwd, tag
    launch_error: str | None = None
    verdicts: dict = field(default_factory=dict)  # validator name -> list of (result, case)
    config_error: str | None = None  # the framework's config is not among the emitted files
    slurm_diffs: list = field(default_factory=list)  # sbatch.sh against the plan (slurm_differences)
    render_groups: list = field(default_factory=list)  # node groups of nodes made up from render() (launch failed)
    nodes_from_render: bool = False

    @property
    def key(self) -> str:
        return f"plan {self.plan.index} {self.framework} ({self.launcher})"


TORCHRUN_STUB = """#!/bin/bash
# stand-in for torchrun: records the command line, environment and folder it was started with
tag="${STUB_TAG:-x}"; n=0
while [ -e "$STUB_OUT/$tag.$n.argv" ]; do n=$((n + 1)); done
printf '%s\\0' "$@" > "$STUB_OUT/$tag.$n.argv"
env -0 > "$STUB_OUT/$tag.$n.env"
pwd > "$STUB_OUT/$tag.$n.cwd"
"""

SCONTROL_STUB = """#!/bin/bash
# stand-in for `scontrol show hostnames LIST`: node names node0 ... node<N-1>. scontrol writes its few lines in one
# buffered write; bash writes line by line, so a reader such as `head -n1` that exits early would turn this into
# SIGPIPE (exit 141) under `set -o pipefail`: ignore it, as the real one never meets it
trap '' PIPE
for ((i = 0; i < ${STUB_NODES:-1}; i++)); do echo "node$i"; done 2>/dev/null
exit 0
"""

SRUN_STUB = '''#!{python}
"""stand-in for srun inside an allocation: runs the command once per task of the hetjob components asked for
(--het-group, default component 0), in order, with SLURM_PROCID / SLURM_NODEID / SLURM_LOCALID set."""
import os, subprocess, sys
comps = [tuple(map(int, c.split("x"))) for c in os.environ["STUB_COMPONENTS"].split(",")]  # nodes x tasks/node
VALUED = {{"-N", "-n", "--nodes", "--ntasks", "--ntasks-per-node", "--het-group", "--gpus-per-node", "-c",
          "--cpus-per-task", "--export", "--mpi", "-o", "-e", "--output", "--error", "-w", "--nodelist",
          "--gres", "-p", "--partition", "-J", "--job-name", "--container-image", "--container-mounts"}}
args, groups, i = sys.argv[1:], "0", 0
while i < len(args) and args[i].startswith("-"):
    a = args[i]
    if a.startswith("--het-group="):
        groups = a.split("=", 1)[1]
    elif a in VALUED:
        if a == "--het-group":
            groups = args[i + 1]
        i += 1
    i += 1
cmd = args[i:]
picked = []
for part in groups.split(","):
    lo, _, hi = part.partition("-")
    picked += list(range(int(lo), int(hi or lo) + 1))
procid = node = 0
for c in picked:
    if c >= len(comps):
        sys.exit(f"srun: error: --het-group={{groups}}: the job has {{len(comps)}} components")
    nodes, tasks = comps[c]
    for _ in range(nodes):
        for local in range(tasks):
            env = dict(os.environ, SLURM_PROCID=str(procid), SLURM_NODEID=str(node), SLURM_LOCALID=str(local),
                       SLURM_HET_GROUP=str(c), STUB_TAG=str(procid))
            code = subprocess.run(cmd, env=env).returncode
            if code:
                sys.exit(code)
            procid += 1
        node += 1
'''


def plan_nodes(doc: dict) -> list[tuple[int, int]]:
    """(node group, node within the group) of every node the plan JSON places a stage on, in node-rank order
    (stages in pipeline order, PP outermost): read from the document itself, not from planner.emit."""
    order: list[tuple[int, int]] = []
    for s in doc["plans"][0]["placement"]["stages"]:
        for node in range(s["first_node"], s["last_node"] + 1):
            if (s["group"], node) not in order:
                order.append((s["group"], node))
    return order


def plan_world(doc: dict) -> int:
    """GPUs the plan uses (placement.world_size of the plan JSON)."""
    return doc["plans"][0]["placement"]["world_size"]


def _stub_dir(work: Path) -> Path:
    stubs = work / "stubs"
    if not stubs.is_dir():
        stubs.mkdir(parents=True)
        for name, text in (
            ("torchrun", TORCHRUN_STUB),
            ("scontrol", SCONTROL_STUB),
            ("srun", SRUN_STUB.format(python=sys.executable)),
        ):
            (stubs / name).write_text(text)
            (stubs / name).chmod(0o755)
    return stubs


def sbatch_components(text: str) -> list[dict]:
    """The #SBATCH options of each heterogeneous-job component (one component without `#SBATCH hetjob`)."""
    comps = [{}]
    for line in text.splitlines():
        m = re.match(r"#SBATCH\s+(.*)$", line.strip())
        if not m:
            continue
        words = shlex.split(m.group(1), comments=True)
        if words and words[0] in ("hetjob", "packjob"):
            comps.append({})
            continue
        i = 0
        while i < len(words):
            w = words[i]
            if "=" in w:
                k, v = w.split("=", 1)
            elif i + 1 < len(words) and not words[i + 1].startswith("-"):
                k, v = w, words[i + 1]
                i += 1
            else:
                k, v = w, True
            comps[-1][{"-N": "--nodes", "-G": "--gpus"}.get(k, k)] = v
            i += 1
    return comps


def _int(value, default=None):
    try:
        return int(str(value).split("-")[0])
    except (TypeError, ValueError):
        return default


def run_launcher(bundle: Bundle, work: Path) -> None:
    """Run the bundle's launch script(s) under bash with the stand-ins; fill ``bundle.nodes`` (one record per
    torchrun call: argv, the environment the script added, cwd, and which node or task it ran as)."""
    out = work / "records" / f"{bundle.plan.index}-{bundle.framework}-{bundle.launcher}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stubs = _stub_dir(work)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "STUB_"))}
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    nodes = len(plan_nodes(bundle.plan.doc))
    env.update(PATH=f"{stubs}:{env.get('PATH', '')}", STUB_OUT=str(out), STUB_NODES=str(nodes))
    texts = "\n".join(bundle.files.get(n, "") for n in ("launch.sh", "sbatch.sh"))
    for name in sorted(set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", texts))):  # ${VAR:?...}: a workdir
        if name not in ("1", "2") and name not in env:
            env[name] = str(work / "workdirs" / name)
            (work / "workdirs" / name).mkdir(parents=True, exist_ok=True)
    for script in ("launch.sh", "sbatch.sh"):
        if script in bundle.files:
            syntax = subprocess.run(["bash", "-n", str(bundle.folder / script)], capture_output=True, text=True)
            if syntax.returncode:
                bundle.launch_error = f"bash -n {script}: {syntax.stderr.strip()[-300:]}"
                return
    if bundle.launcher == "slurm":
        comps = sbatch_components(bundle.files["sbatch.sh"])
        env["STUB_NODES"] = str(max(1, sum(_int(c.get("--nodes"), 1) for c in comps)))
        spec = ",".join(
            f"{_int(c.get('--nodes'), 1)}x{_int(c.get('--ntasks-per-node'), 1)}" for c in comps
        )  # fmt: skip
        env.update(
            STUB_COMPONENTS=spec,
            SLURM_JOB_ID="4242",
            SLURM_SUBMIT_DIR=str(bundle.folder),
            SLURM_JOB_NODELIST=f"node[0-{int(env['STUB_NODES']) - 1}]",
            SLURM_NNODES=env["STUB_NODES"],
        )
        if len(comps) > 1:
            env["SLURM_JOB_NODELIST_HET_GROUP_0"] = "node[0]"
        cmd = ["bash", str(bundle.folder / "sbatch.sh")]
        proc = subprocess.run(cmd, cwd=bundle.folder, env=env, capture_output=True, text=True, timeout=600)
    else:
        loop = 'for ((r = 0; r < $1; r++)); do STUB_TAG=$r bash "$2" "$r" 10.0.0.1 29500 || exit $?; done'
        cmd = ["bash", "-c", loop, "loop", str(nodes), str(bundle.folder / "launch.sh")]
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        bundle.launch_error = f"{cmd[-1] if bundle.launcher == 'slurm' else 'launch.sh'} exited {proc.returncode}: " + (
            " | ".join(err[-3:]) or "no message"
        )
        return
    records = []
    for argv_file in sorted(out.glob("*.argv")):
        stem = argv_file.name[: -len(".argv")]
        argv = argv_file.read_bytes().split(b"\0")[:-1]
        node_env = dict(
            item.split("=", 1) for item in (out / f"{stem}.env").read_text().split("\0") if "=" in item
        )  # fmt: skip
        added = {k: v for k, v in node_env.items() if env.get(k) != v and not k.startswith(("SLURM_", "STUB_"))}
        for k in ("PWD", "OLDPWD", "SHLVL", "_"):
            added.pop(k, None)
        records.append(
            {
                "tag": stem.split(".")[0],
                "argv": [a.decode() for a in argv],
                "env": added,
                "cwd": (out / f"{stem}.cwd").read_text().strip(),
            }
        )
    records.sort(key=lambda r: (_int(r["tag"], 10**9), r["tag"]))
    bundle.nodes = records


def split_torchrun(argv: list[str]) -> tuple[list[str], list[str]]:
    """(torchrun options, the program: script or `-m module` with its arguments) of a torchrun argv."""
    flags = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "--virtual-local-rank"}
    flags |= {"--virtual_local_rank"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-m", "--module"):
            return argv[:i], argv[i:]
        if not a.startswith("-"):
            return argv[:i], argv[i:]
        if "=" not in a and a not in flags:
            i += 1
        i += 1
    return argv, []


# ---------------------------------------------------------------------------------------------------------------
# Validator cases of a bundle, and what an accepted config must say about the plan


def _program_of(bundle: Bundle, node: dict) -> list[str]:
    return split_torchrun(node["argv"])[1]


def _node_group(doc: dict, node_rank: int) -> int:
    order = plan_nodes(doc)
    return order[node_rank][0] if 0 <= node_rank < len(order) else order[0][0]


def rendered_program(bundle: Bundle) -> tuple[list[str], dict]:
    """(program argv, environment) the emitter gives the launcher (``render`` of planner/emit/<framework>.py)."""
    from planner.emit import EmitOptions, target_module

    target, version = SETUP[bundle.framework][0], SETUP[bundle.framework][1]
    rendered = target_module(target).render(
        bundle.launch_plan, EmitOptions(launcher=bundle.launcher, framework_version=version)
    )
    return list(rendered.program), dict(rendered.env)


def _per_group_nodes(bundle: Bundle) -> list[tuple[int, dict]]:
    """(node group, first recorded node of that group) for each node group the plan uses."""
    if bundle.render_groups:
        return list(zip(bundle.render_groups, bundle.nodes))
    seen, out = set(), []
    for node in bundle.nodes:
        rank = _node_rank_of(bundle, node)
        g = _node_group(bundle.plan.doc, rank if rank is not None else 0)
        if g not in seen:
            seen.add(g)
            out.append((g, node))
    return out


def _nproc(node: dict) -> int | None:
    """--nproc-per-node of a recorded torchrun call (None: not a number)."""
    opts, _ = split_torchrun(node["argv"])
    for i, o in enumerate(opts):
        for name in ("--nproc-per-node", "--nproc_per_node"):
            if o.startswith(name + "="):
                return _int(o.split("=", 1)[1])
            if o == name and i + 1 < len(opts):
                return _int(opts[i + 1])
    return None


def launched_world(bundle: Bundle) -> int:
    """The world size the launch creates: the sum of every node's --nproc-per-node (torch elastic numbers ranks
    cumulatively), else the plan's."""
    if bundle.nodes_from_render:
        return plan_world(bundle.plan.doc)
    counts = [_nproc(n) for n in bundle.nodes]
    return sum(counts) if counts and None not in counts else plan_world(bundle.plan.doc)


def _node_rank_of(bundle: Bundle, node: dict) -> int | None:
    opts, _ = split_torchrun(node["argv"])
    for i, o in enumerate(opts):
        for name in ("--node-rank", "--node_rank"):
            if o.startswith(name + "="):
                return _int(o.split("=", 1)[1])
            if o == name and i + 1 < len(opts):
                return _int(opts[i + 1])
    return _int(node["tag"])


def _overrides(words: list[str]) -> dict:
    return {w.split("=", 1)[0].lstrip("+~"): w.split("=", 1)[1] for w in words if re.match(r"^[+~]?\w+\.[\w.]+=", w)}


def _yaml_overrides(files: dict[str, str]) -> dict:
    """model.*/train.*/... keys of YAML files in the bundle (a Bridge config file), flattened."""
    import yaml

    out = {}
    for name, text in files.items():
        if not name.endswith((".yaml", ".yml")):
            continue
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue

        def walk(prefix, value):
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = value if not isinstance(value, bool) else str(value).lower()

        if isinstance(data, dict):
            walk("", data)
    return out


def _deepspeed_json(bundle: Bundle, program: list[str]) -> tuple[str, dict] | None:
    names = [n for n in bundle.files if n.endswith(".json")]
    for word in program:
        base = word.split("=", 1)[-1]
        for n in names:
            if base == n or base.endswith("/" + n):
                return n, json.loads(bundle.files[n])
    for n in names:
        data = json.loads(bundle.files[n])
        if isinstance(data, dict) and ("train_batch_size" in data or "zero_optimization" in data):
            return n, data
    return None


def cases_of(bundle: Bundle) -> dict[str, list[dict]]:
    """validator name -> cases for this bundle."""
    from planner.emit.megatron import gpu_arch

    plan = bundle.launch_plan
    out: dict[str, list[dict]] = defaultdict(list)
    for node in bundle.nodes:
        out["torchrun"].append({"id": f"{bundle.key} node {node['tag']}", "argv": node["argv"][:]})
    fw = bundle.framework
    if not bundle.nodes:  # the launch script failed (a launcher finding): judge the framework part on its own
        bundle.nodes_from_render = True
        program, env = rendered_program(bundle)
        for group in dict.fromkeys(g for g, _ in plan_nodes(bundle.plan.doc)):
            bundle.nodes.append({"tag": f"render-{group}", "argv": ["--node-rank=-1", *program], "env": env})
            bundle.render_groups.append(group)
    seen = set()
    for group, node in _per_group_nodes(bundle):
        program = _program_of(bundle, node)
        # GPU major architecture (Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 below 10 with TP/CP); unknown and
        # inline GPUs count as pre-Blackwell (9), the stricter case
        arch = (gpu_arch(plan.job.cluster[group].gpu.name) or (9, 0))[0]
        base = {"world_size": launched_world(bundle), "arch": arch, "env": node["env"], "group": group}
        if fw == "megatron":
            case = {**base, "kind": "megatron", "argv": program[1:]}
        elif fw == "megatron-bridge":
            overrides = {**_yaml_overrides(bundle.files), **_overrides(program)}
            case = {**base, "kind": "bridge", "overrides": overrides}
        elif fw == "deepspeed":
            found = _deepspeed_json(bundle, program)
            if found is None:
                bundle.config_error = "no DeepSpeed JSON config among the emitted files"
                return out
            case = {**base, "file": found[0], "config": found[1], "tp": plan.tp, "pp": plan.pp}
            if "deepspeed_partition.py" in bundle.files:
                case["partition_folder"] = str(bundle.folder)
        else:  # torchtitan: -m torchtitan.train ARGS
            args = program[2:] if program[:1] in (["-m"], ["--module"]) else program[1:]
            case = {**base, "folder": str(bundle.folder), "argv": args}
        key = json.dumps({k: v for k, v in case.items() if k not in ("group",)}, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        case["id"] = f"{bundle.key} group {group}"
        out[SETUP[fw][2] if fw != "megatron-bridge" else "megatron"].append(case)
    return out


def _cmp(diffs: list, what: str, got, want) -> None:
    if got != want:
        diffs.append(f"{what} {got!r}, plan {want!r}")


def _stage_ranks(d: list, p, got_ranks) -> None:
    """The framework's global ranks of each pipeline stage ([first, last, count]) against the plan's placement."""
    want_ranks = {}
    for s in p.stages:
        lo, hi = want_ranks.get(s.stage, (s.first_rank, s.last_rank))
        want_ranks[s.stage] = (min(lo, s.first_rank), max(hi, s.last_rank))
    for s, (lo, hi) in sorted(want_ranks.items()):
        got = (got_ranks or [])[s : s + 1]
        if got and tuple(got[0]) != (lo, hi, hi - lo + 1):
            d.append(f"stage {s} on ranks {got[0][0]}-{got[0][1]}, plan places it on {lo}-{hi}")
            return


def expected_differences(bundle: Bundle, facts: dict) -> list[str]:
    """What an accepted config says that the plan does not (empty: it runs the plan)."""
    p = bundle.launch_plan
    m, t = p.job.model, p.job.training
    d: list[str] = []
    fw = bundle.framework
    if fw in ("megatron", "megatron-bridge"):
        for k in ("tp", "pp", "dp", "cp", "ep", "vpp"):
            _cmp(d, k, facts.get(k), getattr(p, k))
        _cmp(d, "micro_batch_size", facts.get("micro_batch_size"), p.micro_batch_size)
        _cmp(d, "global_batch_size", facts.get("global_batch_size"), p.global_batch_size)
        _cmp(d, "num_microbatches", facts.get("num_microbatches"), p.num_microbatches)
        _cmp(d, "sequence_parallel", facts.get("sequence_parallel"), p.sequence_parallel)
        _cmp(d, "layers per stage", facts.get("stage_layers"), list(p.stage_layers))
        if p.vpp > 1 and facts.get("chunk_layers"):
            want = [[n // p.vpp] * p.vpp for n in p.stage_layers]
            _cmp(d, "layers per (stage, chunk)", facts["chunk_layers"], want)
        _stage_ranks(d, p, facts.get("stage_ranks"))
        _cmp(d, "num_layers", facts.get("num_layers"), m.num_layers)
        _cmp(d, "hidden_size", facts.get("hidden_size"), m.hidden_size)
        _cmp(d, "num_attention_heads", facts.get("num_attention_heads"), m.num_attention_heads)
        _cmp(d, "query groups", facts.get("num_query_groups"), m.kv_heads)
        if facts.get("ffn_hidden_size") is not None:
            _cmp(d, "ffn_hidden_size", facts.get("ffn_hidden_size"), m.ffn_hidden_size)
        _cmp(d, "num_experts", facts.get("num_experts"), m.moe.num_experts if m.moe else None)
        if facts.get("seq_length") is not None:
            _cmp(d, "seq_length", facts.get("seq_length"), t.seq_length)
        gran = facts.get("recompute_granularity")
        if p.recompute == "full":
            _cmp(d, "recompute", (gran, facts.get("recompute_num_layers") is not None), ("full", True))
        elif p.recompute_layers:
            # method block recomputes the first recompute_num_layers layers of every model chunk (TransformerBlock
            # _checkpointed_forward counts within the block), so a stage of vpp chunks recomputes vpp times that
            per_chunk = facts.get("recompute_num_layers")
            got = (gran, facts.get("recompute_method"), per_chunk * p.vpp if per_chunk is not None else None)
            _cmp(d, "recompute (granularity, method, layers per stage)", got, ("full", "block", p.recompute_layers))
        elif p.recompute == "selective":
            _cmp(d, "recompute_granularity", gran, "selective")
        else:
            _cmp(d, "recompute_granularity", gran, None)
        if fw == "megatron":
            sharded = (
                facts.get("use_distributed_optimizer") or facts.get("use_torch_fsdp2") or facts.get("use_megatron_fsdp")
            )
            _cmp(d, "optimizer sharding (ZeRO >= 1)", bool(sharded), p.zero_stage >= 1)
    elif fw == "deepspeed":
        _cmp(d, "data-parallel size (world / (pp*tp))", facts.get("dp"), p.dp)
        if facts.get("topology"):
            want = {"pipe": p.pp, "data": p.dp, "model": p.tp}
            _cmp(d, "PipeModelDataParallelTopology (pipe, data, model)", facts["topology"], want)
            _cmp(d, "layers per stage (deepspeed_partition.parts)", facts.get("stage_layers"), list(p.stage_layers))
            _stage_ranks(d, p, facts.get("stage_ranks"))
        _cmp(d, "train_batch_size", facts.get("train_batch_size"), p.global_batch_size)
        _cmp(d, "micro_batch_size", facts.get("micro_batch_size"), p.micro_batch_size)
        _cmp(d, "gradient_accumulation_steps", facts.get("gradient_accumulation_steps"), p.num_microbatches)
        _cmp(d, "zero_stage", facts.get("zero_stage"), p.zero_stage)
        if t.precision == "bf16":
            _cmp(d, "bf16 enabled", facts.get("bf16"), True)
        elif t.precision == "fp16":
            _cmp(d, "fp16 enabled", facts.get("fp16"), True)
        if t.grad_dtype == "bf16+fp32":  # BF16_Optimizer's fp32 accumulation, as priced
            _cmp(d, "optimizer wrapper (engine._do_optimizer_sanity_check)", facts.get("optimizer_wrapper"), "bf16")
            _cmp(d, "gradient accumulation dtype", facts.get("grad_accum_dtype"), "float32")
        else:  # 16-bit gradients in the model's dtype
            want = "float16" if t.precision == "fp16" else "bfloat16"
            _cmp(d, "gradient accumulation dtype", facts.get("grad_accum_dtype"), want)
    else:  # torchtitan
        dp = (facts.get("dp_replicate") or 0) * (facts.get("dp_shard") or 0)
        _cmp(d, "dp_replicate*dp_shard", dp, p.dp)
        for k in ("tp", "pp", "cp", "ep"):
            _cmp(d, k, facts.get(k), getattr(p, k))
        _cmp(d, "global_batch_size", facts.get("global_batch_size"), p.global_batch_size)
        if p.pp > 1:
            _cmp(d, "pipeline micro-batch size", facts.get("pp_microbatch_size"), p.micro_batch_size)
            total = (facts.get("n_microbatches") or 0) * (facts.get("grad_accum") or 0)
            _cmp(d, "micro-batches per step", total, p.num_microbatches)
            _cmp(d, "layers per PP rank", facts.get("stage_layers"), list(p.stage_layers))
            if p.vpp > 1:
                _cmp(d, "model parts per PP rank", facts.get("parts_per_rank"), p.vpp)
        else:
            _cmp(d, "local_batch_size", facts.get("local_batch_size"), p.micro_batch_size)
            _cmp(d, "gradient accumulation", facts.get("grad_accum"), p.num_microbatches)
        _cmp(d, "seq_len", facts.get("seq_len"), t.seq_length)
        mf = facts.get("model") or {}
        _cmp(d, "n_layers", facts.get("n_layers"), m.num_layers)
        if mf.get("dim") is not None:
            _cmp(d, "dim", mf.get("dim"), m.hidden_size)
        if mf.get("n_heads") is not None:
            _cmp(d, "n_heads", mf.get("n_heads"), m.num_attention_heads)
        if mf.get("n_kv_heads") is not None:
            _cmp(d, "n_kv_heads", mf.get("n_kv_heads"), m.kv_heads)
        if m.moe and mf.get("num_experts") is not None:
            _cmp(d, "num_experts", mf.get("num_experts"), m.moe.num_experts)
        ac = facts.get("activation_checkpoint")
        if p.recompute == "full":
            _cmp(d, "activation checkpointing", ac, "full")
        elif p.recompute == "op" and ac not in ("selective", "selective:op"):  # 0.3 SelectiveAC / 0.2 option op
            d.append(f"activation checkpointing {ac!r}, plan per-op selective")
    return d


def launcher_differences(bundle: Bundle, node_facts: list[tuple[dict, dict]]) -> list[str]:
    """Checks of the torchrun lines against the plan: every node rank once, node count, processes per node within
    the node group's GPUs per node and adding up to the plan's GPUs, static rendezvous with pinned node ranks for
    mixed plans, one program."""
    p = bundle.launch_plan
    doc = bundle.plan.doc
    nodes, world = len(plan_nodes(doc)), plan_world(doc)
    d: list[str] = []
    ranks = Counter()
    programs = set()
    for node, facts in node_facts:
        rank = facts.get("node_rank")
        ranks[rank] += 1
        if facts.get("min_nodes") != nodes or facts.get("max_nodes") != nodes:
            d.append(f"node {node['tag']}: --nnodes {facts.get('min_nodes')}:{facts.get('max_nodes')}, plan {nodes}")
        if isinstance(rank, int) and 0 <= rank < nodes:
            # a node the plan uses partly starts only its ranks (the total is checked against the plan below)
            most = p.job.cluster[_node_group(doc, rank)].gpus_per_node
            nproc = facts.get("nproc_per_node")
            if not isinstance(nproc, int) or not 1 <= nproc <= most:
                d.append(f"node rank {rank}: --nproc-per-node {nproc}, its node has {most} GPUs")
        if p.mixed and facts.get("rdzv_backend") != "static":
            d.append(f"node {node['tag']}: rendezvous {facts.get('rdzv_backend')} ignores --node-rank (mixed plan)")
        programs.add(json.dumps([facts.get("training_script"), facts.get("training_script_args")]))
    missing = [r for r in range(nodes) if ranks[r] != 1]
    if missing:
        d.append(f"node ranks not started exactly once: {missing[:8]} (started: {dict(ranks)})")
    if len(node_facts) != nodes:
        d.append(f"{len(node_facts)} torchrun calls for the plan's {nodes} nodes")
    total = sum(f.get("nproc_per_node") or 0 for _, f in node_facts)
    if total != world:
        d.append(f"processes started {total}, the plan uses {world} GPUs")
    if len(programs) > 1:
        d.append("nodes run different programs")
    return d[:6]


def slurm_differences(bundle: Bundle) -> list[str]:
    """The #SBATCH components against the plan's runs of node groups (emitters.md 4.3: one task per node; a
    heterogeneous job with components in node-rank order, each on its own GPU type)."""
    from planner.emit.launch import node_runs

    p = bundle.launch_plan
    comps = sbatch_components(bundle.files["sbatch.sh"])
    runs = node_runs(p)
    d = []
    nodes = [_int(c.get("--nodes")) for c in comps]
    if None in nodes:
        d.append("a component without --nodes")
    elif sum(nodes) != len(plan_nodes(bundle.plan.doc)):
        d.append(f"components ask for {sum(nodes)} nodes, the plan runs on {len(plan_nodes(bundle.plan.doc))}")
    if len(comps) != len(runs):
        d.append(f"{len(comps)} components for {len(runs)} runs of node groups")
    for i, (c, (group, _, count)) in enumerate(zip(comps, runs)):
        gpn = p.job.cluster[group].gpus_per_node
        gpus = c.get("--gpus-per-node") or (str(c.get("--gres", "")).rsplit(":", 1)[-1] or None)
        if _int(gpus) != gpn:
            d.append(f"component {i}: {gpus} GPUs per node, node group {group} has {gpn}")
        if _int(c.get("--nodes")) != count:
            d.append(f"component {i}: {c.get('--nodes')} nodes, node group {group}'s run has {count}")
        if _int(c.get("--ntasks-per-node"), 1) != 1:
            d.append(
                f"component {i}: --ntasks-per-node {c.get('--ntasks-per-node')} (torchrun wants one task per node)"
            )
        if len(runs) > 1 and not (c.get("--constraint") or c.get("--partition") or c.get("-p") or c.get("-C")):
            d.append(f"component {i}: no --constraint/--partition, so its nodes may be any GPU type")
    return d[:6]


# ---------------------------------------------------------------------------------------------------------------
# Running the validators


def venv_python(venvs: Path, name: str) -> Path | None:
    py = venvs / name / "bin" / "python"
    return py if py.is_file() and os.access(py, os.X_OK) else None


def run_harness(python: Path, harness: str, cases: list[dict], log: Path, timeout: float) -> list[dict]:
    """One subprocess of ``harness`` in a venv over all ``cases``; a result per case (harness errors for those it
    never answered)."""
    if not cases:
        return []
    payload = json.dumps([{k: v for k, v in c.items() if k != "group"} for c in cases], default=str)
    with open(log, "w") as err:
        try:
            proc = subprocess.run(
                [str(python), str(VALIDATORS_DIR / harness)],
                input=payload,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                timeout=timeout,
                cwd=str(log.parent),
            )
            stdout, why = proc.stdout, f"exited {proc.returncode}"
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            why = f"timed out after {timeout:.0f} s"
    results = []
    for line in stdout.splitlines():
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    for case in cases[len(results) :]:
        tail = log.read_text(errors="replace").strip().splitlines()[-2:] if log.is_file() else []
        results.append(
            {"id": case["id"], "status": "error", "message": f"{harness} {why} before this case: {' | '.join(tail)}"}
        )
    return results


def round_trip(bundle: Bundle) -> str | None:
    """None when planner/emit/<fw>.read on the emitted config gives back the plan's layout, else what differs.
    Raises LookupError when the framework has no importer (or no config file to read)."""
    import inspect

    import yaml

    from planner.emit import target_module
    from planner.errors import SpecError
    from planner.load import parse_job

    target = SETUP[bundle.framework][0]
    module = target_module(target)
    if not hasattr(module, "read") or bundle.framework == "megatron-bridge":
        raise LookupError("no importer")
    path = config_file(bundle)
    if path is None:
        raise LookupError("no config file to read")
    p = bundle.launch_plan
    group = p.job.cluster[p.stage_group(0)]
    world = launched_world(bundle)
    # the importers build a one-group cluster; the layout does not depend on it, so where the plan's node groups
    # differ in GPUs per node (or the world is no whole number of nodes) nodes of one GPU stand in
    gpn = group.gpus_per_node
    if len({g.gpus_per_node for g in p.job.cluster}) > 1 or world % gpn:
        gpn = 1
    given = {
        "world_size": world,
        "gpu": group.gpu.name,
        "gpus_per_node": gpn,
        "tp": p.tp,
        "pp": p.pp,
        "seq_length": p.job.training.seq_length,
    }
    accepted = inspect.signature(module.read).parameters
    kwargs = {k: v for k, v in given.items() if k in accepted}
    try:
        job = module.read(path, **kwargs)
    except SpecError as exc:  # a config without the model's shape (ds_config.json): give it as a model file
        if exc.field != "--model" or "model" not in accepted:
            raise
        model_file = bundle.folder.parent / f"{bundle.framework}-model.yaml"
        model_file.write_text(yaml.safe_dump(bundle.plan.doc["job"]["model"], sort_keys=False))
        job = module.read(path, **kwargs, model=str(model_file))
    if not isinstance(job, dict) or not job.get("layout"):
        return "the importer gave no layout"
    lay = job["layout"]
    diffs: list[str] = []
    want = {
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "cp": p.cp,
        "ep": p.ep,
        "vpp": p.vpp,
        "micro_batch_size": p.micro_batch_size,
        "zero_stage": p.zero_stage,
    }
    defaults = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "micro_batch_size": 1, "zero_stage": 1}
    for k, v in want.items():
        got = lay.get(k, defaults.get(k))
        if k == "dp" and got is None:
            continue
        if k == "zero_stage" and p.dp * p.cp == 1:
            continue  # one data-parallel rank: nothing to shard, every ZeRO stage is the same run
        _cmp(diffs, k, got, v)
    stages = lay.get("stages")
    got_layers = [s["layers"] for s in stages] if stages else None
    if got_layers is not None or not p.even_split:
        _cmp(diffs, "layers per stage", got_layers, list(p.stage_layers))
    got_rec = lay.get("recompute", "selective")
    want_rec = p.recompute
    if bundle.framework.startswith("torchtitan") and want_rec == "selective" and got_rec == "none":
        pass  # documented: torchtitan has no attention-only recompute, the emitter writes none (recompute_mode)
    elif got_rec != want_rec and not (p.recompute_layers and got_rec in ("none", "selective")):
        diffs.append(f"recompute {got_rec!r}, plan {want_rec!r}")
    if p.recompute_layers and p.recompute != "full":
        counts = {s.get("recompute_layers") or 0 for s in stages or []}
        _cmp(diffs, "recompute_layers", counts, {p.recompute_layers})
    train = job.get("training") or {}
    if "global_batch_size" in train:
        _cmp(diffs, "global_batch_size", train["global_batch_size"], p.global_batch_size)
    if "model" in job and isinstance(job["model"], dict):
        for k in ("num_layers", "hidden_size", "num_attention_heads"):
            if k in job["model"]:
                _cmp(diffs, f"model.{k}", job["model"][k], getattr(p.job.model, k))
    try:
        parse_job(job)
    except Exception as exc:  # noqa: BLE001 - the importer's job must load
        diffs.append(f"the imported job does not load: {exc}")
    return "; ".join(diffs[:5]) or None


def config_file(bundle: Bundle) -> Path | None:
    """The emitted file the framework's importer reads (`planner import FRAMEWORK CONFIG`)."""
    names = [n for n in bundle.files if n not in LAUNCHER_FILES]
    fw = bundle.framework
    if fw == "deepspeed":
        pick = [n for n in names if n.endswith(".json")]
    elif fw == "torchtitan":
        pick = [n for n in names if n.endswith(".py")]
    elif fw == "torchtitan-0.2":
        pick = [n for n in names if n.endswith(".toml")]
    else:
        pick = [n for n in names if n.endswith((".args", ".txt", ".sh"))] or ["launch.sh"]
    return bundle.folder / pick[0] if pick else None


# ---------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class Tally:
    emitted: int = 0
    inexpressible: int = 0
    emit_errors: int = 0  # SpecError on a valid plan, or a crash
    unchecked: int = 0  # emitted, but its launch script failed (see the launcher rows) or its validator is missing
    validated: int = 0
    accepted: int = 0
    rejected: int = 0
    mismatched: int = 0
    harness_errors: int = 0
    round_trip_ok: int = 0
    round_trip_failed: int = 0
    round_trip_skipped: str | None = None
    skipped: str | None = None
    messages: dict = field(default_factory=lambda: defaultdict(list))  # kind -> [(key, message)]
    inexpressible_why: Counter = field(default_factory=Counter)

    def note(self, kind: str, key: str, message: str) -> None:
        self.messages[kind].append((key, message))


def _crash_site(exc: BaseException) -> str:
    """file:line of the innermost planner frame of an exception."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/planner/" in f.filename.replace(os.sep, "/")]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} in {f.name}"


def _short(text: str, n: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def main(argv=None) -> int:
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one `error:` line, exit 2 (the planner's bad-input convention)
            m = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message)
            fail(m.group(1) if m else "arguments", m.group(2) if m else message)

    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=200, help="random plans to generate (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frameworks", nargs="+", default=None, metavar="NAME", help=f"any of {', '.join(FRAMEWORKS)}")
    ap.add_argument("--launcher", default="torchrun", help="torchrun, slurm or both")
    ap.add_argument("--only", type=int, default=None, help="run just this plan index (print its summary)")
    ap.add_argument("--keep", default=None, help="write the emitted bundles under this folder and keep them")
    ap.add_argument("--venvs", default=str(DEFAULT_VENVS), help="where setup_validators.sh built the venvs")
    ap.add_argument("--show", type=int, default=3, help="messages to print per framework and kind")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per validator subprocess")
    a = ap.parse_args(argv)

    if a.plans < 1:
        fail("--plans", f"must be at least 1, got {a.plans}")
    frameworks = list(dict.fromkeys(n.strip().lower() for n in (a.frameworks or FRAMEWORKS)))
    for name in frameworks:
        if name not in FRAMEWORKS:
            from planner.errors import did_you_mean

            fail(
                "--frameworks",
                f"unknown framework '{name}'{did_you_mean(name, FRAMEWORKS)}; choose from {', '.join(FRAMEWORKS)}",
            )
    launchers = {"torchrun": ["torchrun"], "slurm": ["slurm"], "both": ["torchrun", "slurm"]}.get(a.launcher.lower())
    if launchers is None:
        fail("--launcher", f"unknown launcher '{a.launcher}'; choose torchrun, slurm or both")
    if a.only is not None and not 0 <= a.only:
        fail("--only", f"must be a plan index >= 0, got {a.only}")
    venvs = Path(a.venvs)
    if venvs.exists() and not venvs.is_dir():
        fail("--venvs", f"{a.venvs} is not a folder")
    if a.keep:
        keep = Path(a.keep)
        if keep.exists() and not keep.is_dir():
            fail("--keep", f"{a.keep} exists and is not a folder")
    if shutil.which("bash") is None:
        fail("bash", "the launch scripts are run with bash; none on PATH")
    if not (ROOT / "tests" / "strategies.py").is_file():
        fail(
            "tests",
            f"scripts/validate_emitters.py needs tests/strategies.py of a checkout; none at {shown(ROOT / 'tests')}",
        )

    from planner.emit import EmitOptions, emit
    from planner.emit.launch_plan import LaunchPlan
    from planner.errors import Inexpressible, SpecError

    start = time.perf_counter()
    tallies = {fw: Tally() for fw in frameworks}
    launch_tallies = {ln: Tally() for ln in launchers}

    indices = [a.only] if a.only is not None else list(range(a.plans))
    plans: list[GeneratedPlan] = []
    gen_start = time.perf_counter()
    for i in indices:
        plans.append(gen_plan(a.seed, i))
    gen_s = time.perf_counter() - gen_start
    kinds = Counter(p.kind for p in plans)
    mixed = sum(p.mixed for p in plans)
    if a.only is not None:
        print(f"plan {a.only} (seed {a.seed}): {plans[0].summary}")

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="validate-emitters-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    bundles: list[Bundle] = []
    emit_start = time.perf_counter()
    for gp in plans:
        for fw in frameworks:
            t = tallies[fw]
            if t.skipped:
                continue
            target, version = SETUP[fw][0], SETUP[fw][1]
            for n, ln in enumerate(launchers):
                key = f"plan {gp.index} {fw} ({ln})"
                # the framework's part is judged on the first launcher; a later one only adds its own refusals
                tally = t if n == 0 else launch_tallies[ln]
                try:
                    files = emit(gp.doc, target, 1, EmitOptions(launcher=ln, framework_version=version))
                except Inexpressible as exc:
                    tally.inexpressible += 1
                    tally.inexpressible_why[re.sub(r"\d+", "N", exc.message.split(";")[0])[:90]] += 1
                    break
                except SpecError as exc:
                    tally.emit_errors += 1
                    tally.note("emit error", key, f"{exc.line()} ({gp.summary})")
                    break
                except Exception as exc:  # noqa: BLE001 - an emitter crash is a finding
                    tally.emit_errors += 1
                    tally.note("emit crash", key, f"{type(exc).__name__}: {exc} [{_crash_site(exc)}] ({gp.summary})")
                    break
                if ln == launchers[0]:
                    t.emitted += 1
                folder = work / "bundles" / f"plan{gp.index:04d}" / f"{fw}-{ln}"
                shutil.rmtree(folder, ignore_errors=True)
                from planner.io import write_folder

                write_folder(folder, files)
                lp = LaunchPlan.of(gp.doc, 1, target)
                bundles.append(Bundle(gp, fw, ln, folder, files, lp))
    emit_s = time.perf_counter() - emit_start

    # the launch scripts under bash, with the stand-ins
    launch_start = time.perf_counter()
    for b in bundles:
        try:
            run_launcher(b, work)
        except subprocess.TimeoutExpired:
            b.launch_error = "the launch script ran over 600 s"
        if not b.launch_error and not b.nodes:
            b.launch_error = "the launch script ran but started no torchrun"
        lt = launch_tallies[b.launcher]
        lt.emitted += 1
        if b.launch_error:
            lt.rejected += 1
            lt.note("rejected", b.key, b.launch_error)
        elif b.launcher == "slurm":
            b.slurm_diffs = slurm_differences(b)
    launch_s = time.perf_counter() - launch_start

    # cases per validator venv
    per_venv: dict[str, list[tuple[Bundle, dict]]] = defaultdict(list)
    for b in bundles:
        for venv, cases in cases_of(b).items():
            for c in cases:
                per_venv[venv].append((b, c))
        if b.config_error:  # cases_of found no config
            tallies[b.framework].rejected += 1
            tallies[b.framework].note("rejected", b.key, b.config_error)
    harness_of = {
        "megatron": "check_megatron.py",
        "deepspeed": "check_deepspeed.py",
        "torchtitan": "check_torchtitan.py",
        "torchtitan-0.2": "check_torchtitan.py",
        "torchrun": "check_torchrun.py",
    }
    venv_of = {"torchrun": "deepspeed"}
    missing: dict[str, str] = {}
    for venv in {*(SETUP[fw][2] for fw in frameworks), "torchrun"}:
        real = venv_of.get(venv, venv)
        if venv_python(venvs, real) is None:
            missing[venv] = (
                f"venv {shown(venvs / real)} missing: build it with "
                f"{SETUP_COMMAND.get(real, 'scripts/setup_validators.sh')}"
            )
    jobs = {}
    for venv, items in per_venv.items():
        if venv in missing:
            continue
        py = venv_python(venvs, venv_of.get(venv, venv))
        jobs[venv] = (py, harness_of[venv], [c for _, c in items])
    val_start = time.perf_counter()
    results: dict[str, list[dict]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            venv: pool.submit(run_harness, py, h, cases, work / "logs" / f"{venv}.log", a.timeout)
            for venv, (py, h, cases) in jobs.items()
        }
        for venv, fut in futures.items():
            results[venv] = fut.result()
    val_s = time.perf_counter() - val_start

    # verdicts
    for venv, items in per_venv.items():
        for (b, case), res in zip(items, results.get(venv, [None] * len(items))):
            b.verdicts.setdefault(venv, []).append((res, case))
    for b in bundles:
        t = tallies[b.framework]
        fw_venv = "megatron" if b.framework == "megatron-bridge" else SETUP[b.framework][2]
        # launcher (torchrun lines)
        lt = launch_tallies[b.launcher]
        tr = b.verdicts.get("torchrun", [])
        if b.launch_error:
            pass  # counted with the launch scripts
        elif "torchrun" in missing:
            lt.unchecked += 1
        elif tr:
            bad = [(r, c) for r, c in tr if r is None or r["status"] != "accepted"]
            if any(r and r["status"] == "error" for r, _ in bad):
                lt.harness_errors += 1
                r = next(r for r, _ in bad if r and r["status"] == "error")
                lt.note("harness error", b.key, f"{r['message']} {r.get('where', '')}")
            elif bad:
                lt.rejected += 1
                r, c = bad[0]
                lt.note("rejected", b.key, f"torchrun {' '.join(c['argv'][:6])} ...: {r['message']}")
            else:
                diffs = b.slurm_diffs + launcher_differences(b, [(n, r["facts"]) for n, (r, _) in zip(b.nodes, tr)])
                if diffs:
                    lt.mismatched += 1
                    lt.note("mismatch", b.key, "; ".join(diffs))
                else:
                    lt.accepted += 1
        if b.launcher != launchers[0]:
            continue  # the framework's config is the same whichever launcher wraps it: judge it once
        verdicts = b.verdicts.get(fw_venv, [])
        if b.config_error:
            continue
        if fw_venv in missing or not verdicts:
            t.unchecked += 1
            continue
        t.validated += 1
        errors = [r for r, _ in verdicts if r is None or r["status"] == "error"]
        rejected = [(r, c) for r, c in verdicts if r and r["status"] == "rejected"]
        if errors:
            t.harness_errors += 1
            r = errors[0] or {"message": "no result"}
            t.note("harness error", b.key, f"{r['message']} {r.get('where', '')}")
            continue
        if rejected:
            t.rejected += 1
            r, c = rejected[0]
            where = f" [{r['where']}]" if r.get("where") else ""
            t.note("rejected", b.key, f"{r['message']}{where} -- {b.plan.summary}")
            continue
        diffs = []
        for r, _ in verdicts:
            diffs += expected_differences(b, r["facts"])
        if diffs:
            t.mismatched += 1
            t.note("mismatch", b.key, f"{'; '.join(dict.fromkeys(diffs))} -- {b.plan.summary}")
            continue
        t.accepted += 1
        try:
            why = round_trip(b)
        except LookupError as exc:
            t.round_trip_skipped = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - an importer that crashes on its own output is a finding
            why = f"read raised {type(exc).__name__}: {exc}"
        if why:
            t.round_trip_failed += 1
            t.note("round trip", b.key, f"{why} -- {b.plan.summary}")
        else:
            t.round_trip_ok += 1
    for fw in frameworks:
        v = "megatron" if fw == "megatron-bridge" else SETUP[fw][2]
        if not tallies[fw].skipped and v in missing:
            tallies[fw].skipped = missing[v]
    for ln in launchers:
        if "torchrun" in missing:
            launch_tallies[ln].skipped = "torchrun lines not parsed: " + missing["torchrun"]

    # report
    wall = time.perf_counter() - start
    print(
        f"\nvalidate_emitters: seed {a.seed}, {len(plans)} plans ({kinds['dense']} dense, {kinds['moe']} MoE; "
        f"{mixed} on two GPU types), launcher {a.launcher}, venvs {shown(venvs)}"
    )
    head = (
        "framework",
        "emitted",
        "inexpr.",
        "accepted",
        "rejected",
        "mismatch",
        "unchecked",
        "emit err",
        "harness err",
    )
    head += ("round trip",)
    rows = []
    for fw in frameworks:
        t = tallies[fw]
        rt = f"{t.round_trip_ok} ok, {t.round_trip_failed} failed" if (t.round_trip_ok or t.round_trip_failed) else "-"
        if t.round_trip_skipped and not (t.round_trip_ok or t.round_trip_failed):
            rt = f"n/a ({t.round_trip_skipped})"
        counts = (t.emitted, t.inexpressible, t.accepted, t.rejected, t.mismatched, t.unchecked, t.emit_errors)
        rows.append((fw, *counts, t.harness_errors, rt))
    for ln in launchers:
        t = launch_tallies[ln]
        counts = (t.emitted, t.inexpressible, t.accepted, t.rejected, t.mismatched, t.unchecked, t.emit_errors)
        rows.append((f"{ln} (launcher)", *counts, t.harness_errors, "-"))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print(
        "  " + "  ".join(str(h).ljust(w) if i == 0 else str(h).rjust(w) for i, (h, w) in enumerate(zip(head, widths)))
    )
    for r in rows:
        print(
            "  " + "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
        )
    skipped = [(fw, tallies[fw].skipped) for fw in frameworks if tallies[fw].skipped]
    skipped += [(ln, launch_tallies[ln].skipped) for ln in launchers if launch_tallies[ln].skipped]
    if skipped:
        print("\nskipped validators:")
        for name, why in skipped:
            print(f"  {name}: {why}")
    for name, t in [*tallies.items(), *((f"{ln} (launcher)", lt) for ln, lt in launch_tallies.items())]:
        if t.inexpressible_why and a.show:
            top = "; ".join(f"{n}x {w}" for w, n in t.inexpressible_why.most_common(3))
            print(f"\n{name}: not expressible: {top}")
        for kind in ("emit crash", "emit error", "rejected", "mismatch", "round trip", "harness error"):
            msgs = t.messages.get(kind) or []
            if not msgs:
                continue
            print(f"\n{name}: {kind} ({len(msgs)}):")
            for key, msg in msgs[: a.show]:
                print(f"  {key}: {_short(msg)}")
    print(
        f"\n  time: generate {gen_s:.1f}s, emit {emit_s:.1f}s, launch scripts {launch_s:.1f}s, "
        f"validators {val_s:.1f}s, wall {wall:.1f}s; files under "
        f"{shown(work) if a.keep else '(a temporary folder, removed)'}"
    )
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    failed = sum(
        t.rejected + t.mismatched + t.round_trip_failed + t.emit_errors + t.harness_errors
        for t in [*tallies.values(), *launch_tallies.values()]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    run(main)
