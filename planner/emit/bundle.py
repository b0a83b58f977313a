"""What a framework emitter returns (planner/emit/<framework>.py ``render``): the files it writes, the training
command the launcher runs on every node, the environment it needs, and notes for the bundle's README."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EmitOptions:
    """Choices the user makes at `planner emit`: the launcher, the framework release, the plan file's name."""

    launcher: str = "torchrun"  # torchrun | slurm
    framework_version: str | None = None  # torchtitan: 0.3 (default, Python config) or 0.2 (TOML)
    plan_file: str = "plan.json"  # as named in the README


@dataclass
class Bundle:
    """One framework's part of an emitted launch.

    ``files``: relative path -> text (configs, argument files). ``program``: what the launcher starts on each
    GPU, as an argv after the launcher (e.g. ["pretrain_gpt.py", "--tensor-model-parallel-size", "8", ...] or
    ["-m", "torchtitan.train", "--module", "plan_config", "--config", "plan"]); the launcher script quotes it.
    ``env``: environment variables every rank needs (CUDA_DEVICE_MAX_CONNECTIONS, ...). ``workdir``: a shell
    expression for the folder the program runs in (e.g. '"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM
    checkout}"'; None: the bundle's own folder, which is also put on PYTHONPATH). ``notes``: Markdown lines for the
    README (what to edit: data paths, tokenizer; how a rule was met)."""

    files: dict[str, str] = field(default_factory=dict)
    program: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    notes: list[str] = field(default_factory=list)
