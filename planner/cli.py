"""The `planner` command line: parse, call, print. Exit codes: 0 ok, 1 a check failed, 2 bad input,
3 nothing fits, 4 the target framework cannot express the plan, 130 interrupted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from planner.cost.memory import DEFAULT_MEMORY_MARGIN
from planner.errors import Inexpressible, SpecError

app = typer.Typer(
    no_args_is_help=True,
    help="Auto-parallel planner for distributed LLM training.\n\n"
    "Start with: planner plan examples/llama3-70b-h100.yaml (or `planner list gpus` for the presets).",
)
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 150)

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_NO_FIT, EXIT_UNSUPPORTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


def _show_flags_without_type() -> None:
    """Newer typer prints a switch as ``--json <bool>`` in --help, as if it took a value; a switch takes none."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is not None and not getattr(shown, "_planner_switch", False):

        def display_type_rich(self, ctx):
            return None if self.is_flag else shown(self, ctx)

        display_type_rich._planner_switch = True
        TyperOption.display_type_rich = display_type_rich


_show_flags_without_type()


def _version(value: bool) -> None:
    if value:
        from planner import __version__

        print(f"planner {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Auto-parallel planner for distributed LLM training."""


JOB_HELP = "job YAML, or - to read it from standard input"
PROFILE_HELP = "measured profile (docs/profiles.md) for every node group of its GPU type"
CALIBRATION_HELP = "cost-model efficiencies to price with (a `planner calibrate` file) instead of the built-in ones"


def _calibration(path: Path | None):
    """The Calibration of a `planner calibrate` file (None: the default)."""
    if path is None:
        return None
    from planner.cost.calibration import calibration_from

    return calibration_from(_calibration_spec(path))


def _calibration_spec(path: Path):
    from planner.load import load_calibration

    return load_calibration(path)


def _with_profile(job, profile: Path | None, calibration: Path | None = None):
    """The job with `--profile` on its node groups of the profile's GPU type and `--calibration` as its own."""
    if profile is not None:
        from planner.load import with_profile

        job = with_profile(job, profile)
    if calibration is not None:
        job = job.model_copy(update={"calibration": _calibration_spec(calibration)})
    return job


MARGIN_HELP = "share of each GPU's memory kept free (the same default for plan and estimate)"


def _warn(job) -> list:
    """The job's likely unit mistakes, each as one `warning:` line on stderr; returned for the JSON."""
    from planner.sanity import job_warnings

    found = job_warnings(job)
    for w in found:
        print(_one_line(w.line()), file=sys.stderr)
    return found


def _emit_json(doc: dict, out_path: Path | None = None) -> None:
    from planner.io import dumps_json, write_atomic

    text = dumps_json(doc)
    if out_path is not None:
        write_atomic(out_path, text)
    sys.stdout.write(text)


@app.command()
def estimate(
    job: Path = typer.Argument(..., help=JOB_HELP + "; its `layout` is evaluated"),
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
    memory_margin: float = typer.Option(DEFAULT_MEMORY_MARGIN, "--memory-margin", min=0.0, max=0.9, help=MARGIN_HELP),
    profile: Path | None = typer.Option(None, "--profile", help=PROFILE_HELP),
    calibration: Path | None = typer.Option(None, "--calibration", help=CALIBRATION_HELP),
) -> None:
    """Predict iteration time, throughput and per-GPU memory of the job's layout.

    Example: planner estimate examples/llama3-70b-h100.yaml --json
    """
    from planner.cost.estimate import estimate as run_estimate
    from planner.load import load_job

    spec = _with_profile(load_job(job), profile, calibration)
    warnings = _warn(spec)
    est = run_estimate(spec, capacity_margin=memory_margin)
    if json_:
        from planner.report.plan_json import estimate_document

        _emit_json(estimate_document(spec, est, memory_margin=memory_margin, warnings=warnings))
    else:
        from planner.report.estimate import render_estimate

        out.print(render_estimate(est, title=f"Estimate: {job}"))


@app.command()
def validate(
    runs: list[Path] = typer.Argument(
        ..., help="measured-runs YAML file(s) (format: docs/measured-runs.md); run ids unique across them"
    ),
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
    calibration: Path | None = typer.Option(None, "--calibration", help=CALIBRATION_HELP),
    profile: Path | None = typer.Option(None, "--profile", help="measured profile for the runs on its GPU type"),
) -> None:
    """Predict published or your own measured runs and report the error against what was measured, over all runs,
    per source group and (given several files) per file.

    Example: planner validate ../shared/reference/measured-runs.yaml ../shared/reference/measured-runs-modern.yaml
    """
    from dataclasses import replace

    from planner.load import apply_profile, load_profile
    from planner.runs import RunCase
    from planner.validate import load_files, run_validation, to_json

    by_file = load_files(runs)
    if profile is not None:
        measured = load_profile(profile, "--profile")
        by_file = {
            path: [replace(c, job=apply_profile(c.job, measured)) if isinstance(c, RunCase) else c for c in cases]
            for path, cases in by_file.items()
        }
    cal = _calibration(calibration)
    results = {path: run_validation(cases, cal) for path, cases in by_file.items()}
    doc = to_json([r for rs in results.values() for r in rs], results)
    if json_:
        _emit_json(doc)
    else:
        from planner.report.validate import render_validation

        out.print(render_validation(doc))


@app.command()
def calibrate(
    runs: list[Path] = typer.Argument(
        ..., help="measured-runs YAML file(s) (format: docs/measured-runs.md) and/or Megatron-LM training logs"
    ),
    out_path: Path = typer.Option(
        ...,
        "--out",
        "-o",
        help="calibration file to write (name it in a job as `calibration: FILE`, or pass --calibration FILE)",
    ),
    start: Path | None = typer.Option(None, "--calibration", help="start from this calibration (default: built-in)"),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type of the Megatron-LM logs (`planner list gpus`)"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="for logs: default the GPU's"),
) -> None:
    """Fit the cost model's global efficiencies to your measured runs and write them to a file of your own.

    Example: planner calibrate my-runs.yaml -o calib.yaml && planner plan job.yaml --calibration calib.yaml
    """
    from planner.cost.calibration import default_calibration
    from planner.io import read_text, write_atomic
    from planner.profile.calibrate import calibrate as fit
    from planner.profile.calibrate import calibration_yaml
    from planner.profile.megatron_log import is_megatron_log, read_log
    from planner.runs import RunCase, load_runs

    cases = []
    for path in runs:
        if is_megatron_log(read_text(path, "runs")):
            cases.append(read_log(path, gpu=gpu, gpus_per_node=gpus_per_node))
        else:
            cases += [c for c in load_runs(path) if isinstance(c, RunCase)]
    if not cases:
        raise SpecError("runs", "no run the planner can express (see `planner validate RUNS.yaml` for why)")
    cal0 = _calibration(start) or default_calibration()
    cal, before, after = fit(cases, cal0)
    write_atomic(out_path, calibration_yaml(cal, ", ".join(map(str, runs)), len(cases)))
    rows = [
        ("time median |error| %", "time", "median_abs_error_pct"),
        ("time p90 |error| %", "time", "p90_abs_error_pct"),
    ]
    rows.append(("memory median |error| %", "memory", "median_abs_error_pct"))
    print(f"{len(cases)} runs{'':17s}{'before':>10s}{'after':>10s}")
    for label, group, key in rows:
        print(f"{label:27s}{before[group][key]!s:>10s}{after[group][key]!s:>10s}")
    for k, v in cal.as_dict().items():
        if v != getattr(cal0, k):
            print(f"  {k:24s} {getattr(cal0, k):.4g} -> {v:.4g}")
    print(f"wrote {out_path}")


profile_app = typer.Typer(no_args_is_help=True, help="Measured costs: run the layer profiler, ingest measurements.")
app.add_typer(profile_app, name="profile")


@profile_app.command("run")
def profile_run(
    job: Path = typer.Option(..., "--job", help="job YAML whose model is profiled (its GPU: node group --group)"),
    out_path: Path | None = typer.Option(None, "--out", "-o", help="profile file to write (default: stdout)"),
    micro_batches: str = typer.Option("1,2,4", "--micro-batches", help="micro-batch sizes to time, e.g. 1,2,4"),
    seq_lengths: str | None = typer.Option(None, "--seq-lengths", help="sequence lengths (default: the job's)"),
    tps: str | None = typer.Option(None, "--tp", help="TP shards to time (default: every TP degree within a node)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N"),
    warmup: int = typer.Option(3, "--warmup", min=0, max=1000, help="untimed passes before each point"),
    repeats: int = typer.Option(10, "--repeats", min=1, max=10000, help="timed passes per point (median kept)"),
    group: int = typer.Option(0, "--group", min=0, help="the job's node group whose GPU this is"),
) -> None:
    """Time one transformer layer of the job's model on this machine's GPU and write a profile (needs torch).

    Example: planner profile run --job job.yaml --micro-batches 1,2,4 -o profiles/h100.yaml
    """
    import shlex

    from planner.load import load_job
    from planner.profile.runner import parse_ints, profile_yaml, run_profile, write_profile

    spec = load_job(job)
    profile = run_profile(
        spec,
        micro_batches=parse_ints(micro_batches, "--micro-batches"),
        seq_lengths=parse_ints(seq_lengths, "--seq-lengths") if seq_lengths else None,
        tps=parse_ints(tps, "--tp") if tps else None,
        device=device,
        warmup=warmup,
        repeats=repeats,
        group=group,
        command=shlex.join(["planner", *sys.argv[1:]]),
        progress=lambda done, total: print(f"planner: profiled {done}/{total} points", file=sys.stderr, flush=True),
        warn=lambda message: print(_one_line(f"warning: {message}"), file=sys.stderr),
    )
    if out_path is None:
        sys.stdout.write(profile_yaml(profile))
    else:
        write_profile(profile, out_path)
        print(f"planner: wrote {len(profile.layers)} layer points to {out_path}", file=sys.stderr)


@profile_app.command("ingest")
def profile_ingest(
    files: list[Path] = typer.Argument(..., help="nccl-tests outputs, torch.profiler traces, other planners' profiles"),
    gpu: str = typer.Option(..., "--gpu", help="the GPU type they were measured on (`planner list gpus`)"),
    out_path: Path | None = typer.Option(None, "--out", "-o", help="profile file to write (default: stdout)"),
    model: str | None = typer.Option(None, "--model", help="model shape of layer points (preset or config path)"),
    micro_batch_size: int | None = typer.Option(None, "--micro-batch-size", min=1, help="of layer points, if unstated"),
    seq_length: int | None = typer.Option(None, "--seq-length", min=1, help="of layer points, if unstated"),
    tp: int | None = typer.Option(None, "--tp", min=1, help="TP shard of layer points, if unstated"),
    precision: str | None = typer.Option(None, "--precision", help="bf16, fp16, fp8 or fp32, if unstated"),
    layer_pattern: str | None = typer.Option(
        None, "--layer-pattern", help="regex with named groups kind and pass for trace range labels"
    ),
    backward_ratio: float = typer.Option(
        2.0, "--backward-ratio", min=0.1, max=10.0, help="backward/forward for forward-only sources"
    ),
) -> None:
    """Read measurements other tools wrote (format detected from the content) into one measured profile.

    Example: planner profile ingest ar_1x8.txt ar_2x8.txt --gpu h100-sxm -o profiles/h100.yaml
    """
    import yaml

    from planner.io import write_atomic
    from planner.profile.ingest import ingest

    notes: list[str] = []
    profile = ingest(
        files,
        gpu,
        layer_pattern=layer_pattern,
        model=model,
        micro_batch_size=micro_batch_size,
        seq_length=seq_length,
        tp=tp,
        precision=precision,
        backward_ratio=backward_ratio,
        notes=notes,
    )
    for note in notes:
        print(_one_line(f"warning: {note}"), file=sys.stderr)
    text = "# Written by `planner profile ingest` (docs/profiles.md).\n" + yaml.safe_dump(
        profile.model_dump(mode="json", exclude_none=True), sort_keys=False
    )
    if out_path is None:
        sys.stdout.write(text)
    else:
        write_atomic(out_path, text)
        counts = f"{len(profile.layers)} layer and {len(profile.collectives)} collective points"
        print(f"planner: wrote {counts} to {out_path}", file=sys.stderr)


def _one_line(text: str) -> str:
    """Whitespace runs collapsed, other control characters escaped: stderr gets exactly one printable line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(str(text).split()))


def _usage_error_types() -> tuple[type, ...]:
    """Command-line usage errors: click's, and the copy of click that newer typer versions vendor."""
    import typer

    types = [t for t in (getattr(typer, "TyperException", None),) if t is not None]
    try:
        import click

        types.append(click.ClickException)
    except ImportError:  # typer >= 0.2x vendors click
        pass
    return tuple(types)


def _usage_error_line(exc: Exception) -> str:
    """``error: <option or argument>: <click's message>`` for a bad command line."""
    field = getattr(exc, "option_name", None)
    param = getattr(exc, "param", None)
    if not field and param is not None:
        hint = param.get_error_hint() if hasattr(param, "get_error_hint") else param.name
        field = str(hint).split(" / ")[0].strip("'\"")
    return f"error: {field or 'command line'}: {_one_line(exc.format_message())}"


@app.command()
def plan(
    job: Path = typer.Argument(..., help=JOB_HELP + " (a `layout`, if present, is compared as the current one)"),
    top: int = typer.Option(5, "--top", min=1, max=100, help="how many plans to show"),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1, max=86400.0, help="search budget in seconds"),
    memory_margin: float = typer.Option(DEFAULT_MEMORY_MARGIN, "--memory-margin", min=0.0, max=0.9, help=MARGIN_HELP),
    allow_cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp", help="let TP groups span nodes"),
    tp_comm_overlap: bool = typer.Option(
        False, "--tp-comm-overlap", help="the framework overlaps TP collectives with GEMMs (Megatron + TE)"
    ),
    workers: int = typer.Option(
        1, "--workers", min=1, max=64, help="CP-SAT worker threads (same answer for any count)"
    ),
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
    out_path: Path | None = typer.Option(None, "--out", help="also write the JSON object to this file (atomically)"),
    no_timing: bool = typer.Option(False, "--no-timing", help="write search.seconds as null: byte-identical output"),
    framework: str | None = typer.Option(
        None,
        "--framework",
        help="megatron|deepspeed|torchtitan: only plans that framework runs (`planner list frameworks`)",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="report the search's phases on stderr"),
    emit_targets: str | None = typer.Option(
        None, "--emit", help="also write launch files of the best plan: megatron,megatron-bridge,deepspeed,torchtitan"
    ),
    emit_dir: Path | None = typer.Option(
        None, "--emit-dir", "-o", help="folder for --emit (one subfolder per framework)"
    ),
    launcher: str = typer.Option("torchrun", "--launcher", help="for --emit: torchrun or slurm"),
    profile: Path | None = typer.Option(None, "--profile", help=PROFILE_HELP),
    calibration: Path | None = typer.Option(None, "--calibration", help=CALIBRATION_HELP),
) -> None:
    """Search for the fastest layout that fits: degrees, micro-batch, interleaving, ZeRO, recompute, layer split.

    Example: planner plan examples/llama3-70b-h100.yaml --top 3 --out plan.json
    """
    import time

    from planner.cost.estimate import estimate as run_estimate
    from planner.frameworks import get_framework, priced_for
    from planner.load import load_job
    from planner.report.plan_json import plan_document
    from planner.search import run_search
    from planner.search.space import SearchOptions

    started = time.monotonic()
    fw = get_framework(framework)
    targets = _emit_targets(emit_targets, emit_dir)
    spec = priced_for(_with_profile(load_job(job), profile, calibration), fw)
    warnings = _warn(spec)
    opts = SearchOptions(
        allow_cross_node_tp=allow_cross_node_tp,
        memory_margin=memory_margin,
        tp_comm_overlap=tp_comm_overlap,
        framework=fw,
    )
    current = run_estimate(spec, capacity_margin=memory_margin) if spec.layout is not None else None
    # The budget counts from the command's start (after Python's imports), keeping a little for the output.
    budget = time_limit - (time.monotonic() - started) - min(0.05, 0.05 * time_limit)
    if verbose:
        print(
            f"planner: searching {spec.num_gpus:,} GPUs in {len(spec.cluster)} node group(s): enumerating candidates",
            file=sys.stderr,
            flush=True,
        )
    result = _with_progress(
        lambda progress: run_search(spec, opts, top=top, time_limit_s=budget, workers=workers, progress=progress),
        quiet=json_,
        verbose=verbose,
    )
    if not result.plans and not result.complete:
        print(
            f"error: time-limit: no plan found within --time-limit {time_limit:g} s (nothing was proven not to "
            f"fit); raise the limit",
            file=sys.stderr,
        )
        sys.exit(EXIT_CHECK_FAILED)
    if not result.plans:
        from planner.search.advice import nothing_fits_message

        print(nothing_fits_message(spec, opts), file=sys.stderr)
        sys.exit(EXIT_NO_FIT)
    doc = plan_document(
        spec,
        result,
        current,
        timing=not no_timing,
        framework=fw.name if fw else None,
        memory_margin=memory_margin,
        warnings=warnings,
    )
    if targets:
        _write_launches(doc, targets, emit_dir, launcher, 1, None, plan_file=str(out_path or "plan.json"))
    if json_:
        _emit_json(doc, out_path)
        return
    if out_path is not None:
        from planner.io import dumps_json, write_atomic

        write_atomic(out_path, dumps_json(doc))
    from planner.report.plan import render_plan

    out.print(render_plan(doc))


def _emit_targets(names: str | None, folder: Path | None) -> list[str]:
    """The --emit list, checked before the search runs."""
    if names is None:
        return []
    from planner.emit import target_module

    targets = [n.strip().lower() for n in names.split(",") if n.strip()]
    if not targets:
        raise SpecError("--emit", "name at least one framework: megatron, megatron-bridge, deepspeed, torchtitan")
    for name in targets:
        target_module(name)
    if folder is None:
        raise SpecError("--emit-dir", "--emit needs a folder to write into (-o DIR)")
    return targets


def _write_launches(doc, targets, folder, launcher, plan_rank, version, plan_file) -> None:
    """Emit plan ``plan_rank`` of ``doc`` for every target into ``folder`` (a subfolder each when several); every
    target is rendered before any file is written, so a refusal (exit 4) leaves nothing half-written."""
    from planner.emit import EmitOptions, emit
    from planner.io import write_folder

    opts = EmitOptions(launcher=launcher, framework_version=version, plan_file=Path(plan_file).name)
    bundles = {name: emit(doc, name, plan_rank, opts) for name in targets}
    for name, files in bundles.items():
        where = folder if len(targets) == 1 else folder / name
        write_folder(where, files)
        print(f"planner: wrote {len(files)} files for {name} to {where} (see {where / 'README.md'})", file=sys.stderr)


@app.command("emit")
def emit_command(
    plan_file: Path = typer.Argument(..., help="plan JSON written by `planner plan --out` (or --json), or -"),
    framework: str = typer.Option(..., "--framework", help="megatron, megatron-bridge, deepspeed or torchtitan"),
    out_dir: Path = typer.Option(..., "--out-dir", "-o", help="folder to write the launch files into"),
    launcher: str = typer.Option("torchrun", "--launcher", help="torchrun (launch.sh per node) or slurm (+ sbatch.sh)"),
    plan_rank: int = typer.Option(1, "--plan-rank", min=1, help="which plan of the file (1 = the best)"),
    framework_version: str | None = typer.Option(
        None, "--framework-version", help="torchtitan: 0.3 (default, Python config) or 0.2 (TOML)"
    ),
) -> None:
    """Write the launch files of a plan for a training framework: its config, launch scripts and a README.

    Example: planner emit plan.json --framework megatron -o launch/
    """
    from planner.io import load_json

    doc = load_json(plan_file, "plan")
    _write_launches(doc, [framework], out_dir, launcher, plan_rank, framework_version, plan_file=str(plan_file))


@app.command("import")
def import_command(
    framework: str = typer.Argument(..., help="megatron, deepspeed or torchtitan"),
    config: Path = typer.Argument(
        ...,
        help="the framework's config: Megatron args file or launch script, "
        "ds_config.json, torchtitan TOML or emitted plan_config.py",
    ),
    world_size: int | None = typer.Option(None, "--world-size", min=1, help="GPUs the config runs on"),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type (`planner list gpus`)"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="default: the GPU's usual count"),
    model: str | None = typer.Option(None, "--model", help="model preset when the config has no model shape"),
    tp: int | None = typer.Option(None, "--tp", min=1, help="DeepSpeed: TP degree when the JSON has none"),
    pp: int | None = typer.Option(None, "--pp", min=1, help="DeepSpeed: PP degree when the JSON has none"),
    seq_length: int | None = typer.Option(None, "--seq-length", min=1, help="DeepSpeed: sequence length"),
    out_path: Path | None = typer.Option(None, "--out", "-o", help="write the job YAML here (atomically)"),
) -> None:
    """Read a framework config into a job YAML with a `layout`, for `planner estimate` and `planner check`.

    Example: planner import deepspeed ds_config.json --world-size 64 --gpu h100-sxm --model llama3-8b --seq-length 8192
    """
    import inspect

    import yaml

    from planner.emit import target_module
    from planner.io import path_exists, write_atomic
    from planner.load import parse_job

    if framework.strip().lower() == "megatron-bridge":
        raise SpecError("framework", "no importer for megatron-bridge overrides; import the Megatron-LM flags instead")
    module = target_module(framework)
    if not path_exists(config, "config"):
        raise SpecError("config", f"{config}: no such file")
    given = {"world_size": world_size, "gpu": gpu, "gpus_per_node": gpus_per_node, "model": model, "tp": tp}
    given.update(pp=pp, seq_length=seq_length)
    accepted = inspect.signature(module.read).parameters
    for name, value in given.items():
        if value is not None and name not in accepted:
            raise SpecError("--" + name.replace("_", "-"), f"not used by the {framework} importer")
    job = module.read(config, **{k: v for k, v in given.items() if v is not None})
    parse_job(job)  # the job must load as it is written
    text = yaml.safe_dump(job, sort_keys=False, default_flow_style=None, width=120)
    if out_path is not None:
        write_atomic(out_path, text)
    sys.stdout.write(text)


@app.command("check")
def check_command(
    targets: list[Path] = typer.Argument(
        ...,
        help="job YAML with a layout, plan JSON (`planner plan --out`), or a Megatron-LM, DeepSpeed or torchtitan "
        "config (recognized by content)",
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="lock file (written by --update-baseline) or a plan JSON to compare times with"
    ),
    max_regression: float = typer.Option(
        0.05, "--max-regression", min=0.0, max=100.0, help="allowed iteration-time increase over the baseline"
    ),
    min_efficiency: float | None = typer.Option(
        None,
        "--min-efficiency",
        min=0.0,
        max=1.0,
        help="opt-in: least share of the best plan's throughput (runs a search per job, --time-limit)",
    ),
    memory_margin: float = typer.Option(DEFAULT_MEMORY_MARGIN, "--memory-margin", min=0.0, max=0.9, help=MARGIN_HELP),
    format_: str = typer.Option("text", "--format", help="text, json, github (annotations + step summary) or junit"),
    output: Path | None = typer.Option(None, "--output", help="write the report to this file (atomically)"),
    update_baseline: bool = typer.Option(
        False, "--update-baseline", help="record the targets' predictions in the --baseline lock file"
    ),
    framework: str | None = typer.Option(
        None, "--framework", help="also check what this framework runs (default: an imported config's framework)"
    ),
    time_limit: float = typer.Option(
        10.0, "--time-limit", min=0.1, max=86400.0, help="search budget per job for --min-efficiency, seconds"
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="framework configs: GPU type (`planner list gpus`)"),
    world_size: int | None = typer.Option(None, "--world-size", min=1, help="framework configs: GPUs they run on"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="framework configs: per node"),
    model: str | None = typer.Option(None, "--model", help="framework configs: model preset when they name none"),
    seq_length: int | None = typer.Option(None, "--seq-length", min=1, help="DeepSpeed configs: sequence length"),
) -> None:
    """Gate configs in CI: valid layout, fits in memory, no time regression against a baseline, and (opt-in)
    efficiency against the best plan. Exit 0 all pass, 1 a check failed, 2 bad input.

    Example: planner check configs/*.yaml --baseline configs/plan.lock.json --format github
    """
    from planner.gate import GateOptions, run_gate
    from planner.io import dumps_json, write_atomic
    from planner.report import check as report_check

    fmt = format_.strip().lower()
    if fmt not in report_check.FORMATS:
        raise SpecError("--format", f"unknown format '{format_}'; choose one of {', '.join(report_check.FORMATS)}")
    given = {"gpu": gpu, "world_size": world_size, "gpus_per_node": gpus_per_node, "model": model}
    given["seq_length"] = seq_length
    options = GateOptions(
        baseline=baseline,
        max_regression=max_regression,
        min_efficiency=min_efficiency,
        memory_margin=memory_margin,
        framework=framework,
        time_limit_s=time_limit,
        update_baseline=update_baseline,
        given=given,
    )
    report = run_gate([str(t) for t in targets], options)
    if report.lock is not None:
        write_atomic(baseline, dumps_json(report.lock))
        entries = len(report.lock["targets"])
        print(f"planner: wrote {entries} baseline entr{'y' if entries == 1 else 'ies'} to {baseline}", file=sys.stderr)
    if fmt == "github":
        sys.stdout.write(report_check.github_annotations(report))
        summary = report_check.markdown_summary(report)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(summary)
        if output is not None:
            write_atomic(output, summary)
        if not step_summary and output is None:
            sys.stdout.write(summary)
    elif fmt in ("json", "junit"):
        text = dumps_json(report_check.check_document(report)) if fmt == "json" else report_check.junit_xml(report)
        if output is not None:
            write_atomic(output, text)
        else:
            sys.stdout.write(text)
    elif output is not None:
        write_atomic(output, report_check.plain_text(report_check.render_table(report)))
    else:
        out.print(report_check.render_table(report))
    if output is not None:
        print(f"planner: wrote the {fmt} report to {output} ({report_check.tally(report)})", file=sys.stderr)
    if report.failed:
        sys.exit(EXIT_CHECK_FAILED)


@app.command("list")
def list_presets(
    what: str = typer.Argument(..., help="gpus, models or frameworks"),
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """List the GPU and model presets a job can name, and the frameworks --framework knows, with key numbers.

    Example: planner list gpus
    """
    from planner.report.catalog import LISTS, catalog_rows, render_catalog

    kind = what.strip().lower()
    if kind not in LISTS:
        from planner.errors import did_you_mean

        raise SpecError("what", f"unknown list '{what}'{did_you_mean(what, LISTS)}; choose one of {', '.join(LISTS)}")
    rows = catalog_rows(kind)
    if json_:
        _emit_json({"schema_version": 1, kind: rows})
    else:
        out.print(render_catalog(kind, rows))


@app.command()
def schema(kind: str = typer.Argument("plan", help="which output: plan, estimate or check")) -> None:
    """Print the JSON Schema of a versioned output.

    Example: planner schema plan > plan.schema.json
    """
    from planner.report.plan_json import estimate_schema, plan_schema

    def check_schema() -> dict:
        from planner.report.check import check_schema as schema_of_check

        return schema_of_check()

    schemas = {"plan": plan_schema, "estimate": estimate_schema, "check": check_schema}
    if kind not in schemas:
        raise SpecError("kind", f"unknown schema '{kind}'; available: {', '.join(schemas)}")
    _emit_json(schemas[kind]())


def _with_progress(run, quiet: bool, verbose: bool = False):
    """Run a search with a progress bar on stderr when it is a terminal; with --verbose, one line per report.
    The search calls ``progress(done, total)`` (candidates visited) or, in the mixed-GPU search's phases,
    ``progress(done, total, what)`` with ``what`` naming what it counts."""
    if verbose:

        def report(done: int, total: int, what: str | None = None) -> None:
            line = (
                f"solving candidates with CP-SAT: {done:,} of {total:,} visited"
                if what is None
                else f"{what}: {done:,} of {total:,}"
            )
            print(f"planner: {line}", file=sys.stderr, flush=True)

        return run(report)
    if quiet or not sys.stderr.isatty():
        return run(None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("searching"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} {task.fields[what]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("search", total=1, what="candidates")

        def progress(done: int, total: int, what: str | None = None) -> None:
            bar.update(task, completed=done, total=total, what=what or "candidates")

        return run(progress)


def main(argv: list[str] | None = None) -> None:
    """Entry point: map every failure to its exit code and one line on stderr, never a traceback."""
    try:
        code = app(args=argv, standalone_mode=False)
        # typer >= 0.2x turns Ctrl-C into Exit(130) and, outside standalone mode, *returns* the code
        if code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
    except SpecError as exc:
        print(_one_line(exc.line()), file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Inexpressible as exc:
        print(_one_line(exc.line()), file=sys.stderr)
        sys.exit(EXIT_UNSUPPORTED)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # the reader closed the pipe (`planner plan --json | head`): stop quietly, like other Unix tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_CHECK_FAILED)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors and anything unexpected
        name = type(exc).__name__
        if name == "Abort":  # click/typer turn Ctrl-C into Abort
            print("error: interrupted", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        if name == "NoArgsIsHelpError":  # bare `planner`: the help has been printed, as for --help
            sys.exit(EXIT_OK)
        if isinstance(exc, _usage_error_types()):
            print(_usage_error_line(exc), file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        if os.environ.get("PLANNER_DEBUG"):
            raise
        print(f"error: internal: {name}: {_one_line(exc)} (set PLANNER_DEBUG=1 for a traceback)", file=sys.stderr)
        sys.exit(EXIT_CHECK_FAILED)


if __name__ == "__main__":
    main()
