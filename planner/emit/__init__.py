"""Emitters: a plan becomes a launch a stock framework accepts (`planner emit`, `planner plan --emit`), and the
importers read those frameworks' configs back into a job with a `layout` (`planner import`).

One emitter module per framework (flag and key names in one place): ``megatron.py`` (Megatron-LM `pretrain_gpt.py`
flags), ``megatron_bridge.py`` (Megatron-Bridge `run_recipe.py` overrides), ``deepspeed.py`` (`ds_config.json`),
``torchtitan.py`` (0.3 Python config, 0.2 TOML). Each has ``render(plan: LaunchPlan, options: EmitOptions) ->
Bundle`` and ``read(path, **given) -> dict`` (a job dict), which forwards to its importer ``<name>_import.py``.
``launch.py`` wraps a bundle's program in torchrun or Slurm scripts that put each pipeline stage on the node group
the plan placed it on. What a framework cannot run is refused with exit code 4 (errors.Inexpressible): the shape
rules in ``launch_plan.py`` (one global shape) and the framework's own rules in planner/frameworks.py (the rules
the search obeys under `--framework`). Sources: shared/reference/emitters.md.
"""

from __future__ import annotations

import importlib

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import SpecError, did_you_mean

# target name -> module of planner/emit; each module's ``render`` first applies its framework's rules
# (planner/frameworks.py check_runnable)
TARGETS = {
    "megatron": "megatron",
    "megatron-bridge": "megatron_bridge",
    "deepspeed": "deepspeed",
    "torchtitan": "torchtitan",
}
LAUNCHERS = ("torchrun", "slurm")

__all__ = ["TARGETS", "LAUNCHERS", "Bundle", "EmitOptions", "LaunchPlan", "emit", "target_module"]


def _target_name(target: str) -> str:
    key = target.strip().lower()
    if key not in TARGETS:
        hint = did_you_mean(target, TARGETS)
        raise SpecError("--framework", f"unknown framework '{target}'{hint}; choose one of {', '.join(TARGETS)}")
    return key


def target_module(target: str):
    """The emitter module of ``target`` (bad input when unknown)."""
    return importlib.import_module(f"planner.emit.{TARGETS[_target_name(target)]}")


def emit(doc: dict, target: str, plan_rank: int = 1, options: EmitOptions | None = None) -> dict[str, str]:
    """The files of a launch of plan ``plan_rank`` of plan JSON ``doc`` on ``target``: the framework's configs,
    the launcher scripts and a README. Raises Inexpressible (exit 4) for what the framework cannot run."""
    from planner.emit import launch, readme

    opts = options or EmitOptions()
    if opts.launcher not in LAUNCHERS:
        raise SpecError("--launcher", f"unknown launcher '{opts.launcher}'; choose one of {', '.join(LAUNCHERS)}")
    name = _target_name(target)
    plan = LaunchPlan.of(doc, plan_rank, name)
    bundle = target_module(name).render(plan, opts)  # Inexpressible (exit 4) first: its framework's rules
    files = dict(bundle.files)
    files.update(launch.render(plan, bundle, opts))
    files["README.md"] = readme.render(plan, bundle, opts, name)
    return files
