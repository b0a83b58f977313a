"""Reading a job: YAML (a file, or standard input for ``-``) -> catalog names resolved -> a validated ``Job``.

Every error names the field it is about (``error: cluster[0].nodes: ...``, exit 2): the first pydantic error is
turned into a field path, unknown fields get a "did you mean" from our own names and from the names other tools
use for them (Megatron-LM / DeepSpeed flags, Hugging Face config keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import SpecError, did_you_mean
from planner.spec import (
    GpuSpec,
    Job,
    Layout,
    LinkSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    NodeGroup,
    ReplicaSpec,
    StageSpec,
    Training,
)

# Names other tools use for our fields (Megatron-LM / DeepSpeed flags, Hugging Face config keys).
_SYNONYMS = {
    "tensor_parallel": "tp",
    "tensor_parallel_size": "tp",
    "tensor_model_parallel_size": "tp",
    "tp_size": "tp",
    "pipeline_parallel": "pp",
    "pipeline_parallel_size": "pp",
    "pipeline_model_parallel_size": "pp",
    "pp_size": "pp",
    "data_parallel": "dp",
    "data_parallel_size": "dp",
    "dp_size": "dp",
    "context_parallel": "cp",
    "context_parallel_size": "cp",
    "cp_size": "cp",
    "expert_parallel": "ep",
    "expert_parallel_size": "ep",
    "expert_model_parallel_size": "ep",
    "ep_size": "ep",
    "virtual_pipeline": "vpp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "interleave": "vpp",
    "micro_batch": "micro_batch_size",
    "mbs": "micro_batch_size",
    "zero": "zero_stage",
    "num_hidden_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "num_key_value_heads": "num_kv_heads",
    "seq_len": "seq_length",
    "global_batch": "global_batch_size",
}


def suggest_field(name: str, allowed) -> str:
    """`` (did you mean 'x'?)`` for an unknown field: a known synonym first, else the closest spelling."""
    alt = _SYNONYMS.get(name.strip().lower().replace("-", "_"))
    if alt in allowed:
        return f" (did you mean '{alt}'?)"
    return did_you_mean(name, allowed)


def format_validation_error(exc: ValidationError, prefix: str = "") -> SpecError:
    """The first pydantic error as a SpecError naming the field path (``cluster[0].nodes``).

    An unknown field is reported before anything else: ``seq_lenght`` also makes ``seq_length`` missing, and the
    typo is the thing to fix."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    parts: list[str] = []
    for item in err["loc"]:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    field = prefix + "".join(parts) if parts else (prefix.rstrip(".") or "job")
    if field.startswith("."):
        field = field[1:]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        model_fields = _fields_at(exc, err["loc"])
        msg = "unknown field" + suggest_field(str(err["loc"][-1]), model_fields)
        if model_fields:
            msg += f"; allowed: {', '.join(sorted(model_fields))}"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] in ("model_type", "dict_type"):
        msg = f"expected a mapping, got {type(err.get('input')).__name__}"
    elif "input" in err and isinstance(err["input"], (str, int, float, bool, type(None))):  # not a whole mapping
        shown = repr(err["input"])
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg = f"{msg} (got {shown})"
    return SpecError(field or "job", msg)


def _fields_at(exc: ValidationError, loc) -> list[str]:
    model = {"Job": Job}.get(exc.title)
    names = {
        "model": ModelSpec,
        "moe": MoESpec,
        "mla": MLASpec,
        "training": Training,
        "layout": Layout,
        "cluster": NodeGroup,
        "gpu": GpuSpec,
        "links": LinkSpec,
        "replicas": ReplicaSpec,
        "stages": StageSpec,
    }
    target = model
    for item in loc[:-1]:
        if isinstance(item, str) and item in names:
            target = names[item]
    if target is None:
        target = {"ModelSpec": ModelSpec, "GpuSpec": GpuSpec, "Layout": Layout}.get(exc.title)
    return list(target.model_fields) if target is not None else []


def parse_job(raw: Any, base_dir: Path | None = None) -> Job:
    """Validate a raw mapping (already YAML-decoded) into a Job, resolving catalog names."""
    from planner.catalog import resolve_gpu, resolve_model

    if not isinstance(raw, dict):
        raise SpecError("job", f"expected a mapping with model, cluster, training; got {type(raw).__name__}")
    allowed = {"version", "model", "cluster", "training", "links", "layout", "calibration"}
    for key in raw:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed)
            alt = _SYNONYMS.get(str(key).strip().lower().replace("-", "_"), str(key))
            for section, model in (("layout", Layout), ("training", Training)):
                if not hint and alt in model.model_fields:  # e.g. `tp: 8` or `tensor_parallel: 8` at the top
                    hint = f" (did you mean '{section}.{alt}'?)"
            raise SpecError(str(key), "unknown field" + hint + f"; allowed: {', '.join(sorted(allowed))}")
    version = raw.get("version", 1)
    if isinstance(version, bool) or version != 1:
        raise SpecError("version", f"unsupported spec version {version!r}; this planner reads version 1")
    for key in ("model", "cluster", "training"):
        if key not in raw or raw[key] is None:
            raise SpecError(key, "required field is missing")
    data = dict(raw)
    data.pop("version", None)
    data["model"] = resolve_model(raw["model"], base_dir=base_dir)
    cluster = raw["cluster"]
    if isinstance(cluster, dict):
        cluster = [cluster]
    if not isinstance(cluster, list) or not cluster:
        raise SpecError(
            "cluster", "expected a non-empty list of node groups like {gpu: h100-sxm, nodes: 4, gpus_per_node: 8}"
        )
    groups = []
    for i, group in enumerate(cluster):
        if not isinstance(group, dict):
            raise SpecError(f"cluster[{i}]", "expected a mapping like {gpu: h100-sxm, nodes: 4, gpus_per_node: 8}")
        if "gpu" not in group:
            raise SpecError(f"cluster[{i}].gpu", "required field is missing")
        g = dict(group)
        g["gpu"] = resolve_gpu(group["gpu"], field=f"cluster[{i}].gpu")
        if "gpus_per_node" not in g:
            g["gpus_per_node"] = g["gpu"].gpus_per_node
        if isinstance(g.get("profile"), str):
            g["profile"] = load_profile(_resolve(g["profile"], base_dir), f"cluster[{i}].profile")
        groups.append(g)
    data["cluster"] = groups
    if isinstance(raw.get("calibration"), str):
        data["calibration"] = load_calibration_file(_resolve(raw["calibration"], base_dir), "calibration")
    try:
        job = Job.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc)
    _check_links(job)
    _check_profiles(job)
    if job.layout is not None:
        from planner.parallel import dims_from_layout

        dims_from_layout(job.layout, job).check()
    return job


def _resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def load_profile(path: str | Path, field: str = "profile"):
    """A measured-profile file (planner/profile/schema.py), with errors at its fields (``field.layers[3]...``)."""
    from planner.io import load_yaml
    from planner.profile.schema import Profile

    raw = load_yaml(path, field=field)
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        raise format_validation_error(exc, prefix=f"{field}.")


def with_profile(job: Job, path: str | Path) -> Job:
    """``job`` with the profile at ``path`` on every node group of its GPU type (`--profile`)."""
    profile = load_profile(path, "--profile")
    out = apply_profile(job, profile)
    if out is job:
        names = ", ".join(sorted({g.gpu.name for g in job.cluster}))
        raise SpecError("--profile", f"the profile was measured on {profile.gpu}; the cluster has {names}")
    return out


def apply_profile(job: Job, profile) -> Job:
    """``job`` with ``profile`` on every node group of the profile's GPU type (``job`` itself when there is none)."""
    matched = [i for i, g in enumerate(job.cluster) if _same_gpu(g.gpu.name, profile.gpu)]
    if not matched:
        return job
    cluster = tuple(g.model_copy(update={"profile": profile}) if i in matched else g for i, g in enumerate(job.cluster))
    return job.model_copy(update={"cluster": cluster})


def _same_gpu(a: str, b: str) -> bool:
    from planner.catalog import resolve_gpu

    try:
        return resolve_gpu(a).name == resolve_gpu(b).name
    except SpecError:
        return a.strip().lower() == b.strip().lower()


def load_calibration_file(path: str | Path, field: str = "calibration") -> dict:
    """A calibration file (the format of planner/data/calibration.yaml; `planner calibrate -o`) as the mapping of a
    job's ``calibration``, with its path as ``source``."""
    from planner.io import load_yaml

    raw = load_yaml(path, field=field)
    if not isinstance(raw, dict):
        raise SpecError(field, f"'{path}' is not a mapping of efficiencies")
    data = {k: v for k, v in raw.items() if k != "schema_version"}
    data["source"] = str(path)
    return data


def load_calibration(path: str | Path, field: str = "--calibration"):
    """A calibration file as a validated planner.spec.CalibrationSpec (`--calibration FILE`)."""
    from planner.spec import CalibrationSpec

    try:
        return CalibrationSpec.model_validate(load_calibration_file(path, field))
    except ValidationError as exc:
        raise format_validation_error(exc, prefix=f"{field}.")


def _check_links(job: Job) -> None:
    """Each link joins two existing, different node groups, and each pair is given once."""
    seen = set()
    for i, link in enumerate(job.links):
        a, b = link.groups
        for g in (a, b):
            if g >= len(job.cluster) or g < 0:
                raise SpecError(f"links[{i}].groups", f"no node group {g}; the cluster has {len(job.cluster)}")
        if a == b:
            raise SpecError(f"links[{i}].groups", f"a link joins two different groups (got {a} twice)")
        if frozenset((a, b)) in seen:
            raise SpecError(f"links[{i}].groups", f"the link between groups {a} and {b} is given twice")
        seen.add(frozenset((a, b)))


def _check_profiles(job: Job) -> None:
    """A node group's profile was measured on that group's GPU type."""
    for i, g in enumerate(job.cluster):
        if g.profile is not None and not _same_gpu(g.profile.gpu, g.gpu.name):
            raise SpecError(
                f"cluster[{i}].profile", f"measured on {g.profile.gpu}, but the group's GPU is {g.gpu.name}"
            )


def load_job(path: str | Path) -> Job:
    """A job file, or standard input for ``-`` (relative model paths then resolve from the working folder)."""
    from planner.io import STDIN, load_yaml

    raw = load_yaml(path, field="job")
    return parse_job(raw, base_dir=Path.cwd() if str(path) == STDIN else Path(path).resolve().parent)
