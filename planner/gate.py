"""The CI gate (`planner check`): a config in, four checks out, each with a status and a detail. No printing: the
report formats are planner/report/check.py, the command line planner/cli.py.

A target is a job YAML with a ``layout``, a plan JSON (`planner plan --out`: its plan 1 is checked), an estimate
JSON (`planner estimate --json`), or a framework config the importers read (planner/emit/<framework>.py ``read``),
recognized by content. Each target gets, in order:

- ``valid``: the layout keeps every degree rule (planner/parallel.py, through the estimator's ``check()``) and, when a
  framework is known (``--framework``, the importer's, or the plan JSON's ``search.framework``), everything that
  framework's emitter refuses (planner/emit ``emit``: planner/frameworks.py ``check_runnable`` and the emitter's own
  rules);
- ``fits``: every stage's predicted peak memory within its GPU's memory less the margin (planner/cost/estimate.py);
- ``no_regression``: the predicted iteration time within ``max_regression`` of the baseline: a lock file this module
  writes (``lock_document``) or a plan JSON. A baseline priced by another planner version, cost-model code,
  calibration or profile set is re-priced (its recorded job and layout estimated with today's cost model) before the
  comparison;
- ``efficiency`` (opt-in): at least ``min_efficiency`` of the throughput of the best plan a search
  (planner.search.run_search) finds for the same job in ``time_limit_s``.

Bad input (a target that is not a job, an unreadable baseline) raises SpecError: exit 2. A rule the layout breaks
is a failed check: exit 1.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.cost.estimate import Estimate, estimate
from planner.cost.memory import DEFAULT_MEMORY_MARGIN, GIB
from planner.errors import Inexpressible, SpecError
from planner.spec import Job, Layout

LOCK_SCHEMA_VERSION = 1
CHECKS = ("valid", "fits", "no_regression", "efficiency")
PASS, FAIL, SKIPPED = "pass", "fail", "skipped"

# Where a layout field is spelled in each framework's config, to point an annotation at its line (best effort; the
# importers in planner/emit/ own what the keys mean). Paths of keys, searched one after the other.
CONFIG_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "megatron": {
        "tp": ("--tensor-model-parallel-size",),
        "pp": ("--pipeline-model-parallel-size",),
        "cp": ("--context-parallel-size",),
        "ep": ("--expert-model-parallel-size",),
        "vpp": ("--num-layers-per-virtual-pipeline-stage",),
        "micro_batch_size": ("--micro-batch-size",),
        "sequence_parallel": ("--sequence-parallel",),
        "zero_stage": ("--use-distributed-optimizer",),
        "recompute": ("--recompute-granularity",),
        "stages": ("--pipeline-model-parallel-layout",),
        "layout": ("--tensor-model-parallel-size",),
    },
    "deepspeed": {
        "tp": ("tensor_parallel", "autotp_size"),
        "pp": ("pipeline", "stages"),
        "micro_batch_size": ("train_micro_batch_size_per_gpu",),
        "zero_stage": ("zero_optimization", "stage"),
        "recompute": ("activation_checkpoint_interval",),
        "layout": ("train_micro_batch_size_per_gpu",),
    },
    "torchtitan": {
        "tp": ("tensor_parallel_degree",),
        "pp": ("pipeline_parallel_degree",),
        "cp": ("context_parallel_degree",),
        "ep": ("expert_parallel_degree",),
        "dp": ("data_parallel_shard_degree",),
        "zero_stage": ("data_parallel_shard_degree",),
        "micro_batch_size": ("pipeline_parallel_microbatch_size",),
        "sequence_parallel": ("enable_sequence_parallel",),
        "recompute": ("mode",),
        "stages": ("module_fqns_per_model_part",),
        "layout": ("tensor_parallel_degree",),
    },
}
_DEEPSPEED_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "pipeline",
    "tensor_parallel",
    "bf16",
    "fp16",
}
_MEGATRON_FLAG = re.compile(
    r"(?<![\w-])--(tensor-model-parallel-size|pipeline-model-parallel-size|num-layers|micro-batch-size|"
    r"global-batch-size|hidden-size)(?![\w-])"
)


# ----------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CheckResult:
    """One check of one target: ``status`` pass, fail or skipped, ``detail`` why, ``line`` the 1-based line of the
    offending key in the target's file where known (for annotations)."""

    name: str
    status: str
    detail: str
    line: int | None = None


@dataclass
class TargetResult:
    target: str  # the path as given
    kind: str  # job | plan | estimate | megatron | deepspeed | torchtitan
    checks: list[CheckResult]

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)


@dataclass
class GateReport:
    results: list[TargetResult]
    lock: dict | None = None  # with update_baseline: the lock document to write to GateOptions.baseline

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.results)

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, SKIPPED: 0}
        for r in self.results:
            for c in r.checks:
                out[c.status] += 1
        return out


@dataclass(frozen=True)
class GateOptions:
    baseline: Path | None = None  # a lock file (this module's) or a plan JSON
    max_regression: float = 0.05  # allowed iteration-time increase over the baseline, as a fraction
    min_efficiency: float | None = None  # opt-in: least fraction of the best plan's throughput
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    framework: str | None = None  # check every target against this framework's rules
    time_limit_s: float = 10.0  # the efficiency search's budget per distinct job
    update_baseline: bool = False  # record the targets' estimates in the lock file (GateReport.lock)
    given: dict[str, Any] = field(default_factory=dict)  # importer pass-through: world_size, gpu, model, ...


# ----------------------------------------------------------------------------------------------- targets


@dataclass
class Target:
    path: str
    kind: str
    text: str  # the file's text, for finding the line of a key
    job: Job  # without its layout
    layout: Layout
    framework: str | None = None  # the framework the config is written for (importers, plan --framework)
    prefix: tuple[str, ...] = ()  # keys above the job's fields in the file (a plan JSON: its plan 1, its job)

    @property
    def with_layout(self) -> Job:
        return self.job.model_copy(update={"layout": self.layout})

    def line_of(self, field_path: str | None) -> int | None:
        """The 1-based line of the key a field path (``layout.tp``, ``plans[0].layout.stages``,
        ``job.training.precision``) names in this target's file; the nearest enclosing key found, else None."""
        keys = [k for k in re.sub(r"\[\d+\]", "", field_path or "layout").split(".") if k]
        while keys and keys[0] in ("plans", "job"):
            keys = keys[1:]
        if self.kind in CONFIG_KEYS:
            spelled = CONFIG_KEYS[self.kind]
            name = keys[1] if len(keys) > 1 and keys[0] == "layout" else keys[0] if keys else "layout"
            flags = self.kind == "megatron"
            found = _find_keys(self.text, spelled.get(name) or spelled["layout"], flags=flags)
            return found or _find_keys(self.text, spelled["layout"], flags=flags)  # a key left at its default
        if self.kind == "plan":
            path = ("plans", *keys) if keys and keys[0] == "layout" else ("job", *keys)
        else:
            path = (*self.prefix, *keys)
        return _find_keys(self.text, path)


def _find_keys(text: str, keys, flags: bool = False) -> int | None:
    """The line of the last of ``keys`` found, each searched from the line of the one before (YAML ``key:``, JSON
    ``"key":``, TOML or Python ``key =``; ``--flag`` for command lines)."""
    lines = text.splitlines()
    found, start = None, 0
    for key in keys:
        pattern = (
            re.compile(rf"(?<![\w-]){re.escape(key)}(?![\w-])")
            if flags
            else re.compile(r"(?:^|[\s{,\[.\"'])" + re.escape(key) + r"[\"']?\s*[:=]")
        )
        hit = next(
            (i for i in range(start, len(lines)) if not lines[i].lstrip().startswith("#") and pattern.search(lines[i])),
            None,
        )
        if hit is None:
            break
        found, start = hit + 1, hit
    return found


def read_target(path: str | Path, given: dict[str, Any] | None = None) -> Target:
    """The target at ``path``, its kind recognized by content. Bad input (not a job, a job without a layout, a
    layout outside the job schema) raises SpecError naming the file."""
    from planner.io import read_text

    shown = str(path)
    if shown == "-":
        raise SpecError("target", "standard input is not a target here: name the config files")
    text = read_text(path, "target")
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return _json_target(shown, text, given or {})
    suffix = Path(shown).suffix.lower()
    if suffix == ".toml" or (suffix == ".py" and "torchtitan" in text):
        return _imported(shown, text, "torchtitan", given or {})
    raw = _yaml_job(path, text)
    if isinstance(raw, dict) and {"model", "cluster", "training"} & set(raw):
        job, layout = _job_and_layout(raw, shown, Path(shown).resolve().parent)
        return Target(shown, "job", text, job, layout)
    if _MEGATRON_FLAG.search(text):
        return _imported(shown, text, "megatron", given or {})
    raise _not_a_job(shown)


def _yaml_job(path, text: str):
    """The YAML of a target (planner.io.load_yaml: duplicated keys refused), or None for a command line that is not
    YAML (a Megatron-LM launch script); YAML that does not parse otherwise is bad input, with its line."""
    from planner.io import load_yaml

    try:
        return load_yaml(path, "target")
    except SpecError:
        if _MEGATRON_FLAG.search(text):
            return None
        raise


def _not_a_job(shown: str, what: str = "") -> SpecError:
    return SpecError(
        "target",
        f"'{shown}' is not a job{what}: expected a job YAML with a layout, a plan JSON (`planner plan --out`), or a "
        "Megatron-LM, DeepSpeed or torchtitan config",
    )


def _json_target(shown: str, text: str, given: dict) -> Target:
    from planner.io import load_json

    doc = load_json(shown, "target")
    if not isinstance(doc, dict):
        raise _not_a_job(shown, " (a JSON value that is not an object)")
    if "plans" in doc and "job" in doc:
        plans = doc["plans"]
        if not isinstance(plans, list) or not plans or not isinstance(plans[0], dict) or "layout" not in plans[0]:
            raise SpecError(f"{shown}:plans", "the plan JSON has no plan with a layout")
        job = _job(_job_only(doc["job"], shown), shown, None)
        layout = _layout(layout_input(plans[0]["layout"]), shown, "plans[0].layout.")
        fw = (doc.get("search") or {}).get("framework") if isinstance(doc.get("search"), dict) else None
        return Target(shown, "plan", text, job, layout, framework=fw)
    if {"model", "cluster", "training"} & set(doc):  # a job written as JSON (YAML reads it too)
        job, layout = _job_and_layout(doc, shown, Path(shown).resolve().parent)
        return Target(shown, "job", text, job, layout)
    if "job" in doc and "iteration_time_s" in doc:  # `planner estimate --json`: its job's own layout
        job, layout = _job_and_layout(_job_only(doc["job"], shown, keep_layout=True), shown, None)
        return Target(shown, "estimate", text, job, layout, prefix=("job",))
    if "targets" in doc and "schema_version" in doc:
        raise SpecError("target", f"'{shown}' is a `planner check` lock file: pass it as --baseline, not as a target")
    if _DEEPSPEED_KEYS & set(doc):
        return _imported(shown, text, "deepspeed", given)
    raise _not_a_job(shown)


def _job_only(raw, shown: str, keep_layout: bool = False) -> dict:
    if not isinstance(raw, dict):
        raise SpecError(f"{shown}:job", f"expected the echoed job mapping, got {type(raw).__name__}")
    return {k: v for k, v in raw.items() if keep_layout or k != "layout"}


def _imported(shown: str, text: str, framework: str, given: dict) -> Target:
    from planner.emit import target_module

    module = target_module(framework)
    accepted = inspect.signature(module.read).parameters
    raw = module.read(Path(shown), **{k: v for k, v in given.items() if v is not None and k in accepted})
    job, layout = _job_and_layout(raw, shown, None)
    return Target(shown, framework, text, job, layout, framework=framework)


def _job_and_layout(raw: dict, shown: str, base_dir: Path | None) -> tuple[Job, Layout]:
    """The job without its layout (it must load: exit 2 otherwise) and the layout, schema-checked only; its degree
    rules are the `valid` check."""
    job = _job(raw, shown, base_dir)
    if "layout" not in raw or raw["layout"] is None:
        raise SpecError(f"{shown}:layout", "the job has no layout to check; add one, or check a `planner plan` JSON")
    return job, _layout(raw["layout"], shown, "layout.")


def _job(raw: dict, shown: str, base_dir: Path | None) -> Job:
    """The job of a target without its layout; a job that does not load is bad input, its field after the file."""
    from planner.load import parse_job

    try:
        return parse_job({k: v for k, v in raw.items() if k != "layout"}, base_dir=base_dir)
    except SpecError as exc:
        raise SpecError(f"{shown}:{exc.field}", exc.message)


def _layout(raw, shown: str, prefix: str) -> Layout:
    from planner.load import format_validation_error

    try:
        return Layout.model_validate(raw)
    except ValidationError as exc:
        err = format_validation_error(exc, prefix=prefix)
        raise SpecError(f"{shown}:{err.field}", err.message)


def layout_input(lay: dict) -> dict:
    """A plan or estimate JSON's layout (planner.report.plan_json.LayoutOut) as a job's ``layout``: the derived
    and null fields left out."""
    keep = set(Layout.model_fields)

    def stages(items):
        return [{k: v for k, v in s.items() if v is not None} for s in items]

    if not isinstance(lay, dict):
        return lay
    out = {k: v for k, v in lay.items() if k in keep and v is not None}
    if out.get("replicas"):
        out.pop("stages", None)
        out["replicas"] = [{**r, "stages": stages(r.get("stages") or [])} for r in out["replicas"]]
    elif out.get("stages"):
        out["stages"] = stages(out["stages"])
    return out


# ----------------------------------------------------------------------------------------------- baselines


@dataclass(frozen=True)
class BaselineEntry:
    """What a target is compared with: a recorded job (with its layout), its predicted time and the cost model it
    was priced with."""

    source: str  # for the detail: "plan.lock.json", "plan 1 of plan.json"
    job: dict  # the resolved job with the baseline's layout (planner.report.provenance.job_json)
    iteration_time_s: float
    time_breakdown_s: dict[str, float]
    planner_version: str
    calibration: dict[str, float]
    profiles: dict[str, str]  # node group index -> digest of its measured profile
    version: str | None = None  # cost_model_version() of the code that priced it; None: not recorded


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CostModelOut(_Out):
    """The cost model a lock entry was priced with; another one makes the entry stale (re-priced when read)."""

    version: str = Field(description="digest of the cost model's code (planner/cost/*.py, planner/parallel.py)")
    calibration: dict[str, float] = Field(description="the calibrated efficiencies (planner/data/calibration.yaml)")
    calibration_file: str | None = Field(None, description="where they came from: 'builtin' or a file")
    profiles: dict[str, str] = Field(
        description="node groups priced from a measured profile (index into job.cluster, as a string) -> sha256 "
        "digest of the profile; empty: analytic only"
    )


class LockEntry(_Out):
    """The recorded prediction for one target."""

    planner_version: str = Field(description="version of the planner that priced this entry")
    cost_model: CostModelOut = Field(description="the cost model this entry was priced with")
    job: dict = Field(description="the resolved job with the layout checked (planner.load.parse_job reads it)")
    layout: dict = Field(description="the layout's resolved degrees (as estimate.layout of `planner estimate --json`)")
    iteration_time_s: float = Field(description="predicted seconds per training iteration")
    time_breakdown_s: dict[str, float] = Field(description="seconds per iteration by component")
    peak_memory_gib: float = Field(description="predicted peak memory per GPU, GiB")


class LockDocument(_Out):
    """A `planner check --update-baseline` lock file: per target, the predicted iteration time to compare with."""

    schema_version: int = Field(description="version of this format")
    planner_version: str = Field(description="version of the planner that last wrote the file")
    targets: dict[str, LockEntry] = Field(description="target path, relative to the lock file's folder -> entry")


def lock_key(target: str, lock_path: Path) -> str:
    """A target's key in a lock: its path relative to the lock's folder (POSIX separators)."""
    try:
        rel = os.path.relpath(Path(target).resolve(), Path(lock_path).resolve().parent)
    except ValueError:  # another drive
        rel = str(Path(target).resolve())
    return Path(rel).as_posix()


@dataclass
class Baseline:
    path: Path
    lock: LockDocument | None = None  # a lock file
    plan: BaselineEntry | None = None  # or plan 1 of a plan JSON, for targets of the same job
    plan_job: Job | None = None

    def entry_for(self, target: str, job: Job) -> tuple[BaselineEntry | None, str]:
        """The entry of ``target`` (with ``job``, its job), or None and why there is none."""
        if self.plan is not None:
            if _job_differs(job_json_of(job), job_json_of(self.plan_job)):
                return None, f"{self.path} is the plan of another job; give a lock file for several jobs"
            return self.plan, ""
        key = lock_key(target, self.path)
        entry = self.lock.targets.get(key) if self.lock is not None else None
        if entry is None:
            return None, f"no entry for {key} in {self.path}; record one with --update-baseline"
        return (
            BaselineEntry(
                source=str(self.path),
                job=entry.job,
                iteration_time_s=entry.iteration_time_s,
                time_breakdown_s=entry.time_breakdown_s,
                planner_version=entry.planner_version,
                calibration=entry.cost_model.calibration,
                profiles=entry.cost_model.profiles,
                version=entry.cost_model.version,
            ),
            "",
        )


def load_baseline(path: Path, for_update: bool = False) -> Baseline:
    """A lock file or a plan JSON as a baseline (a lock that does not exist yet is empty with ``for_update``)."""
    from planner.io import load_json, path_exists

    if not path_exists(path, "--baseline"):
        if for_update:
            return Baseline(Path(path), lock=None)
        raise SpecError(
            "--baseline",
            f"no such file '{path}'; write one with `planner check TARGET... --baseline {path} --update-baseline`",
        )
    doc = load_json(path, "--baseline")
    if isinstance(doc, dict) and "plans" in doc and "job" in doc:
        if for_update:
            raise SpecError("--baseline", f"'{path}' is a plan JSON; --update-baseline writes a lock file: name one")
        return _plan_baseline(Path(path), doc)
    if isinstance(doc, dict) and "targets" in doc:
        try:
            lock = LockDocument.model_validate(doc)
        except ValidationError as exc:
            from planner.load import format_validation_error

            raise format_validation_error(exc, prefix="--baseline.")
        if lock.schema_version != LOCK_SCHEMA_VERSION:
            raise SpecError(
                "--baseline.schema_version", f"{lock.schema_version} is not {LOCK_SCHEMA_VERSION}; rewrite the lock"
            )
        return Baseline(Path(path), lock=lock)
    raise SpecError(
        "--baseline",
        f"'{path}' is neither a lock file (`planner check --update-baseline`) nor a plan JSON (`planner plan --out`)",
    )


def _plan_baseline(path: Path, doc: dict) -> Baseline:
    from planner.load import parse_job
    from planner.report.provenance import job_json

    try:
        plan = doc["plans"][0]
        job = parse_job({k: v for k, v in doc["job"].items() if k != "layout"})
        layout = _layout(layout_input(plan["layout"]), str(path), "plans[0].layout.")
        est = plan["estimate"]
        entry = BaselineEntry(
            source=f"plan 1 of {path}",
            job=job_json(job.model_copy(update={"layout": layout})),
            iteration_time_s=float(est["iteration_time_s"]),
            time_breakdown_s={k: float(v) for k, v in est["time_breakdown_s"].items()},
            planner_version=str(doc["planner_version"]),
            calibration={k: float(v) for k, v in doc["cost_model"]["calibration"].items()},
            profiles=cost_model_of(job)["profiles"],
        )  # a plan JSON records no code digest: its planner version and calibration decide
    except SpecError as exc:
        raise SpecError(f"--baseline.{exc.field}", exc.message)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
        raise SpecError("--baseline", f"not a complete plan JSON ({type(exc).__name__}: {exc})")
    return Baseline(path, plan=entry, plan_job=job)


def _digest(profile) -> str:
    text = json.dumps(profile.model_dump(mode="json"), sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def cost_model_version() -> str:
    """A digest of the cost model's code (planner/cost/*.py and the degree rules, planner/parallel.py): a lock
    priced by other code is re-priced, even under the same planner version."""
    import planner.cost
    import planner.parallel

    digest = hashlib.sha256()
    files = sorted(Path(planner.cost.__file__).parent.glob("*.py")) + [Path(planner.parallel.__file__)]
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


def cost_model_of(job: Job) -> dict:
    """What prices ``job`` today: the cost model's code, its calibration's values and which node groups use which
    measured profile."""
    from planner.cost.calibration import job_calibration

    return {
        "version": cost_model_version(),
        "calibration": {k: float(v) for k, v in job_calibration(job).as_dict().items()},
        "profiles": {str(i): _digest(g.profile) for i, g in enumerate(job.cluster) if g.profile is not None},
    }


def staleness(entry: BaselineEntry, job: Job) -> list[str]:
    """Why ``entry`` was priced by another cost model than the one ``job`` is priced with today (empty: the same)."""
    from planner import __version__

    now = cost_model_of(job)
    why = []
    if entry.planner_version != __version__:
        why.append(f"planner {entry.planner_version}, now {__version__}")
    elif entry.version is not None and entry.version != now["version"]:
        why.append(f"cost-model code {entry.version}, now {now['version']}")
    keys = sorted(set(now["calibration"]) | set(entry.calibration))
    changed = [k for k in keys if now["calibration"].get(k) != entry.calibration.get(k)]
    if changed:
        shown = ", ".join(f"{k} {_g(entry.calibration.get(k))} -> {_g(now['calibration'].get(k))}" for k in changed[:3])
        why.append("calibration " + shown + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))
    if now["profiles"] != entry.profiles:
        was = ", ".join(sorted(entry.profiles)) or "none"
        is_ = ", ".join(sorted(now["profiles"])) or "none"
        why.append(f"measured profiles on groups {was}, now {is_}" if was != is_ else "other measured profiles")
    return why


def _g(x) -> str:
    return "none" if x is None else f"{x:.4g}"


def job_json_of(job: Job) -> dict:
    from planner.report.provenance import job_json

    return job_json(job)


def _job_differs(a: dict, b: dict) -> list[str]:
    """The job sections (model, cluster, training, links) that differ between two echoed jobs; the layout, the
    calibration and the measured profiles (the cost model) aside."""

    def plain(j: dict, key: str):
        value = j.get(key)
        if key == "cluster" and isinstance(value, list):
            return [{k: v for k, v in g.items() if k != "profile"} for g in value if isinstance(g, dict)]
        return value

    return [k for k in ("model", "cluster", "training", "links") if plain(a, k) != plain(b, k)]


def reprice(entry: BaselineEntry, job: Job) -> Estimate:
    """The baseline's recorded job and layout estimated with the cost model ``job`` is priced with today (its
    calibration; the profile of each node group's GPU type)."""
    from planner.load import parse_job

    base = parse_job(entry.job)
    by_gpu = {g.gpu.name: g.profile for g in job.cluster}
    cluster = tuple(g.model_copy(update={"profile": by_gpu.get(g.gpu.name)}) for g in base.cluster)
    base = base.model_copy(update={"calibration": job.calibration, "cluster": cluster})
    return estimate(base)


# ----------------------------------------------------------------------------------------------- the checks


def _s(x: float) -> str:
    return f"{x:.3f} s" if x < 100 else f"{x:,.1f} s"


def _layout_line(est: Estimate) -> str:
    from planner.report.estimate import layout_line

    return layout_line(est.to_json()["layout"])


def check_valid(t: Target, framework: str | None, margin: float) -> tuple[CheckResult, Estimate | None]:
    """The degree rules (the estimator's ``check()``) and, with a framework, what its emitter refuses."""
    job = t.with_layout
    try:
        est = estimate(job, capacity_margin=margin)
    except SpecError as exc:
        return CheckResult("valid", FAIL, f"{exc.field}: {exc.message}", t.line_of(exc.field)), None
    if framework is None:
        return CheckResult("valid", PASS, f"{_layout_line(est)}: every degree rule holds"), est
    from planner.emit import emit
    from planner.report.plan_json import placement

    j = est.to_json()
    doc = {
        "schema_version": j["schema_version"],
        "job": job_json_of(job),
        "plans": [{"layout": j["layout"], "placement": placement(job, est), "estimate": j}],
    }
    try:
        emit(doc, framework)
    except (Inexpressible, SpecError) as exc:
        where = exc.field.removeprefix("plans[0].").removeprefix("job.")
        return CheckResult("valid", FAIL, f"{where}: {exc.message}", t.line_of(exc.field)), est
    return CheckResult("valid", PASS, f"{_layout_line(est)}: every degree rule holds and {framework} runs it"), est


def check_fits(t: Target, est: Estimate, margin: float) -> CheckResult:
    """Every stage's peak memory within its GPU's capacity less the margin; else the worst stage and its largest
    memory terms."""
    excess = [(st.peak_bytes / GIB - est.capacity_of(i), i) for i, st in enumerate(est.stages)]
    over = [(x, i) for x, i in excess if x > 0]
    kept = f"{margin:.0%} kept free"
    if not over:
        i = est.peak_position
        return CheckResult(
            "fits",
            PASS,
            f"peak {est.peak_memory_gib:.1f} GiB on {_stage_name(est, i)}, within {est.capacity_of(i):.1f} GiB "
            f"({kept})",
        )
    _, i = max(over, key=lambda o: (o[0], -o[1]))
    st = est.stages[i]
    terms = sorted(st.memory_bytes.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    largest = ", ".join(f"{k} {v / GIB:.1f}" for k, v in terms)
    more = f" (and {len(over) - 1} more stage{'s' if len(over) > 2 else ''})" if len(over) > 1 else ""
    return CheckResult(
        "fits",
        FAIL,
        f"{_stage_name(est, i)} needs {st.peak_bytes / GIB:.1f} GiB of {est.capacity_of(i):.1f} GiB ({kept}){more}; "
        f"largest terms GiB: {largest}",
        t.line_of("layout"),
    )


def _stage_name(est: Estimate, position: int) -> str:
    st = est.stages[position]
    return f"stage {st.index}" + (f" of replica {st.replica}" if st.replica is not None else "")


def check_regression(t: Target, est: Estimate, opts: GateOptions, baseline: Baseline | None) -> CheckResult:
    """The predicted iteration time against the baseline's (re-priced when another cost model priced it)."""
    if opts.update_baseline:
        old = None
        if baseline is not None and baseline.lock is not None:
            old = baseline.lock.targets.get(lock_key(t.path, baseline.path))
        was = f" (was {_s(old.iteration_time_s)})" if old is not None else ""
        return CheckResult(
            "no_regression", PASS, f"baseline updated: {_s(est.iteration_time_s)} recorded in {opts.baseline}{was}"
        )
    if baseline is None:
        return CheckResult("no_regression", SKIPPED, "no --baseline given (a lock file or a `planner plan` JSON)")
    job = t.with_layout
    entry, why = baseline.entry_for(t.path, job)
    if entry is None:
        return CheckResult("no_regression", SKIPPED, why)
    stale = staleness(entry, job)
    base_s, base_parts, note = entry.iteration_time_s, entry.time_breakdown_s, ""
    if stale:
        try:
            priced = reprice(entry, job)
        except SpecError as exc:
            return CheckResult(
                "no_regression",
                SKIPPED,
                f"baseline from another cost model ({'; '.join(stale)}) and its layout does not price today "
                f"({exc.field}: {exc.message}); refresh it with --update-baseline",
            )
        base_s, base_parts = priced.iteration_time_s, priced.time_breakdown_s
        note = (
            f"; baseline re-priced: it was priced by another cost model ({'; '.join(stale)}), "
            f"{_s(entry.iteration_time_s)} recorded, {_s(base_s)} with today's"
        )
    changed = _job_differs(job_json_of(job), entry.job)
    if changed:
        note += f"; the job changed too ({', '.join(changed)})"
    change = round(est.iteration_time_s / base_s - 1, 6) or 0.0  # no "-0.0%"
    head = f"{_s(est.iteration_time_s)} vs {_s(base_s)} ({entry.source}): {change:+.1%}"
    if change <= opts.max_regression:
        return CheckResult("no_regression", PASS, f"{head}, within +{opts.max_regression:.1%}{note}")
    slower = sorted(
        ((k, v - base_parts.get(k, 0.0)) for k, v in est.time_breakdown_s.items()),
        key=lambda kv: (-kv[1], kv[0]),
    )
    grew = [f"{k} +{d:.3f} s" for k, d in slower if d > max(5e-4, 1e-3 * base_s)][:4]
    what = f"; slower: {', '.join(grew)}" if grew else ""
    return CheckResult(
        "no_regression",
        FAIL,
        f"{head}, more than +{opts.max_regression:.1%}{what}{note}",
        t.line_of("layout"),
    )


def check_efficiency(t: Target, est: Estimate, opts: GateOptions, framework: str | None, searched: dict) -> CheckResult:
    """At least ``min_efficiency`` of the best plan's throughput (the same tokens per iteration: the ratio of the
    iteration times). One search per distinct job and framework (``searched`` memoizes)."""
    if opts.min_efficiency is None:
        return CheckResult("efficiency", SKIPPED, "opt-in: --min-efficiency F (runs a search, --time-limit)")
    from planner.frameworks import get_framework
    from planner.io import dumps_json
    from planner.search import run_search
    from planner.search.space import SearchOptions

    key = dumps_json([{**job_json_of(t.job), "layout": None}, framework, t.layout.tp_comm_overlap])
    if key not in searched:
        options = SearchOptions(
            memory_margin=opts.memory_margin,
            tp_comm_overlap=t.layout.tp_comm_overlap,
            framework=get_framework(framework),
        )
        searched[key] = run_search(t.job, options, top=1, time_limit_s=opts.time_limit_s)
    result = searched[key]
    if not result.plans:
        limit = f"--time-limit {opts.time_limit_s:g}"
        why = "nothing fits the cluster" if result.complete else f"no plan found within {limit}"
        return CheckResult("efficiency", SKIPPED, f"no best plan to compare with: {why}")
    best = result.plans[0]
    ratio = best.time / est.iteration_time_s
    found = f"best found, {result.stop_reason}, gap {result.gap:.1%}"
    proven = "proven best" if result.stop_reason == "proven" else found
    detail = (
        f"{ratio:.1%} of the best plan's throughput ({_s(est.iteration_time_s)} vs {_s(best.time)} per iteration); "
        f"best plan ({proven}): {_layout_line(best.estimate)}"
    )
    if ratio + 1e-9 >= opts.min_efficiency:
        return CheckResult("efficiency", PASS, f"{detail}; at least {opts.min_efficiency:.0%} asked")
    return CheckResult("efficiency", FAIL, f"{detail}; below the {opts.min_efficiency:.0%} asked", t.line_of("layout"))


# ----------------------------------------------------------------------------------------------- the gate


def check_target(
    t: Target, opts: GateOptions, baseline: Baseline | None, searched: dict
) -> tuple[TargetResult, Estimate | None]:
    framework = (opts.framework or t.framework or "").strip().lower() or None
    valid, est = check_valid(t, framework, opts.memory_margin)
    checks = [valid]
    if valid.status != PASS or est is None:
        why = "the layout is not valid (see valid)"
        checks += [CheckResult(name, SKIPPED, why) for name in CHECKS[1:]]
        return TargetResult(t.path, t.kind, checks), None
    checks.append(check_fits(t, est, opts.memory_margin))
    checks.append(check_regression(t, est, opts, baseline))
    checks.append(check_efficiency(t, est, opts, framework, searched))
    return TargetResult(t.path, t.kind, checks), est


def run_gate(targets: list[str | Path], opts: GateOptions) -> GateReport:
    """Every target read (bad input raises before any check runs), then checked; with ``update_baseline`` the
    lock document to write (``GateReport.lock``)."""
    from planner.frameworks import get_framework

    if opts.framework is not None:
        get_framework(opts.framework)  # an unknown name is bad input
    if opts.update_baseline and opts.baseline is None:
        raise SpecError("--update-baseline", "name the lock file to write with --baseline FILE")
    read = [read_target(p, opts.given) for p in targets]
    baseline = load_baseline(opts.baseline, for_update=opts.update_baseline) if opts.baseline is not None else None
    searched: dict = {}
    results, priced = [], []
    for t in read:
        result, est = check_target(t, opts, baseline, searched)
        results.append(result)
        priced.append((t, est))
    lock = lock_document(baseline, priced) if opts.update_baseline else None
    return GateReport(results, lock)


def lock_entry(t: Target, est: Estimate) -> dict:
    from planner import __version__
    from planner.report.provenance import calibration_file

    j = est.to_json()
    model = cost_model_of(t.with_layout)
    source = t.job.calibration.source if t.job.calibration is not None else None  # the job's own calibration file
    return {
        "planner_version": __version__,
        "cost_model": {**model, "calibration_file": source or calibration_file(est.calibration)},
        "job": job_json_of(t.with_layout),
        "layout": j["layout"],
        "iteration_time_s": j["iteration_time_s"],
        "time_breakdown_s": j["time_breakdown_s"],
        "peak_memory_gib": j["peak_memory_gib"],
    }


def lock_document(baseline: Baseline, priced: list[tuple[Target, Estimate | None]]) -> dict:
    """The lock with an entry for every target that priced (the entries of other targets kept)."""
    from planner import __version__

    kept = baseline.lock.model_dump(mode="json")["targets"] if baseline.lock is not None else {}
    for t, est in priced:
        if est is not None:
            kept[lock_key(t.path, baseline.path)] = lock_entry(t, est)
    doc = {"schema_version": LOCK_SCHEMA_VERSION, "planner_version": __version__, "targets": kept}
    LockDocument.model_validate(doc)
    return doc
