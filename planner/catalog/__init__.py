"""GPU and model catalogs (``planner/data/``) and resolution of names, paths and inline mappings."""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import SpecError, did_you_mean

CATALOG_ENV = "PLANNER_CATALOG"


def builtin_data_dir() -> Path:
    """The catalogs shipped inside the package (``planner/data/``, package data of the wheel)."""
    return Path(str(importlib.resources.files("planner") / "data"))


def data_file(name: str) -> Path:
    """``gpus.yaml``, ``models.yaml`` or ``calibration.yaml``: from the folder ``$PLANNER_CATALOG`` names when it
    holds that file, else the built-in copy."""
    env = os.environ.get(CATALOG_ENV)
    if env and (Path(env) / name).is_file():
        return Path(env) / name
    return builtin_data_dir() / name


@functools.cache
def _catalog_file(kind: str) -> tuple[Path, dict[str, Any]]:
    from planner.io import load_yaml

    path = data_file(f"{kind}.yaml")
    return path, load_yaml(path, field=str(path), data_file=True)


@functools.cache
def _catalog(kind: str) -> dict[str, dict[str, Any]]:
    """name -> entry for ``gpus`` or ``models``; every alias maps to the same entry (lower-cased)."""
    _, data = _catalog_file(kind)
    table: dict[str, dict[str, Any]] = {}
    for name, entry in data[kind].items():
        entry = dict(entry)
        others = entry.pop("aliases", [])
        entry.setdefault("name", name)
        for key in [name, *others]:
            table[key.lower()] = entry
    return table


def aliases(kind: str, name: str) -> list[str]:
    """The aliases of the ``gpus`` or ``models`` entry ``name`` (as the catalog spells them)."""
    _, data = _catalog_file(kind)
    entry = data[kind].get(_catalog(kind).get(name.strip().lower(), {}).get("name", name)) or {}
    return [str(a) for a in entry.get("aliases", [])]


@functools.cache
def ambiguous_gpus() -> dict[str, tuple[Any, ...]]:
    """Lower-cased name -> its variants (catalog names or inline GPU mappings), from gpus.yaml ``ambiguous:``:
    names like ``A100`` that fit GPUs differing in memory or interconnect, so that no entry may claim them."""
    path, data = _catalog_file("gpus")
    table = _catalog("gpus")
    found: dict[str, tuple[Any, ...]] = {}
    for name, choices in (data.get("ambiguous") or {}).items():
        key = str(name).strip().lower()
        where = f"{path}: ambiguous.{name}"
        if key in table:
            raise SpecError(where, f"'{name}' is also the GPU {table[key]['name']} (a name or an alias)")
        if not isinstance(choices, list) or len(choices) < 2:
            raise SpecError(where, "expected a list of at least two variants")
        for choice in choices:  # each variant is a catalog GPU, or one with overrides: never another ambiguous name
            base = choice if isinstance(choice, str) else choice.get("base") if isinstance(choice, dict) else None
            if not isinstance(base, str) or base.strip().lower() not in table:
                raise SpecError(where, f"variant {choice!r} is neither a GPU name nor {{base: <GPU name>, ...}}")
            resolve_gpu(choice, field=where)
        found[key] = tuple(choices)
    return found


def _ambiguity(value: str, choices: tuple[Any, ...]) -> str:
    """``'A100' is ambiguous: a100-40gb (40 GiB), a100-80gb (80 GiB); name one``: each variant as a job names it,
    with its memory, and its scale-up bandwidth where the variants differ in it (H100 SXM vs PCIe)."""
    gpus = [resolve_gpu(c) for c in choices]
    links = len({g.intra_node_gbps for g in gpus}) > 1
    shown = []
    for choice, gpu in zip(choices, gpus):
        name = choice if isinstance(choice, str) else "{" + ", ".join(f"{k}: {v}" for k, v in choice.items()) + "}"
        notes = f"{gpu.memory_gib:g} GiB" + (f", {gpu.intra_node_gbps:g} GB/s scale-up" if links else "")
        shown.append(f"{name} ({notes})")
    return f"'{value}' is ambiguous: {', '.join(shown)}; name one"


def gpu_names() -> list[str]:
    return sorted({e["name"] for e in _catalog("gpus").values()})


def model_names() -> list[str]:
    return sorted({e["name"] for e in _catalog("models").values()})


# ----------------------------------------------------------------------------- loose model names

# Hugging Face organisations whose "<org>/<model>" repo ids name a preset ("meta-llama/Meta-Llama-3-8B"). Only these
# are dropped: any other "a/b" is left whole (a path, or an unknown model), and so matches nothing.
VENDOR_PREFIXES = frozenset(
    {
        "meta-llama",
        "meta",
        "qwen",
        "deepseek-ai",
        "mistralai",
        "mistral-community",
        "nvidia",
        "openai",
        "google",
        "moonshotai",
        "zai-org",
        "thudm",
    }
)
# Trailing words that name a release of the same weights' shape (base / instruction-tuned / HF-format copies).
_VARIANT_WORDS = frozenset({"hf", "base", "instruct", "chat", "it", "pt"})
_PARENS = re.compile(r"\([^()]*\)")
_TOKENS = re.compile(r"[a-z]+|[0-9]+")


def model_name_key(name: str) -> tuple[str, ...]:
    """The normalised key of a model name: lower-case runs of letters and of digits, every other character a
    separator. ``Llama-3-8B``, ``llama_3_8b``, ``LLAMA3 8B`` -> ('llama', '3', '8', 'b'); a version keeps its parts,
    so ``Llama 3.1 8B`` -> ('llama', '3', '1', '8', 'b') differs from Llama 3 (3.1 matches Llama 3 only through an
    alias in models.yaml), and adjacent digits never merge with others (``GPT-3 5B`` != ``GPT-35B``)."""
    text = name.strip()
    while _PARENS.search(text):  # "(174.6B)", "(w/ MTP)", nested ones from the inside out
        text = _PARENS.sub(" ", text)
    org, sep, rest = text.partition("/")
    if sep and "/" not in rest and org.strip().lower() in VENDOR_PREFIXES:
        text = rest
    tokens = _TOKENS.findall(text.lower())
    while len(tokens) > 1 and tokens[-1] in _VARIANT_WORDS:
        tokens.pop()
    return tuple(tokens)


@functools.cache
def _model_keys() -> dict[tuple[str, ...], str | None]:
    """Normalised key of every model preset name and alias -> the preset; None where two presets share a key."""
    keys: dict[tuple[str, ...], str | None] = {}
    for alias, entry in _catalog("models").items():
        key = model_name_key(alias)
        if not key:
            continue
        keys[key] = entry["name"] if keys.get(key, entry["name"]) == entry["name"] else None
    return keys


def match_model_name(name: str) -> str | None:
    """The canonical preset name for a loosely written model name, or None.

    Case, ``-``/``_``/space/``.`` separators, a parenthesised note (``"GPT-3 175B (174.6B)"``), a known vendor prefix
    (``"Qwen/Qwen3-8B"``) and a trailing release word (``-hf``, ``-Base``, ``-Instruct``, ``-Chat``, ``-it``, ``-pt``)
    are ignored; every other word and number must equal those of a preset name or alias. Nothing is guessed: sizes
    and versions must match exactly (``gpt3-5b`` is not ``gpt3-175b``; ``Llama 3.1 8B`` is ``llama3-8b`` only because
    models.yaml lists ``llama3.1-8b`` as its alias)."""
    if not isinstance(name, str):
        return None
    exact = _catalog("models").get(name.strip().lower())
    if exact is not None:
        return exact["name"]
    key = model_name_key(name)
    return _model_keys().get(key) if key else None


def resolve_gpu(value: Any, field: str = "gpu"):
    """A catalog name (or alias), or an inline mapping of GpuSpec fields (optionally ``base: <name>`` + overrides).
    A name that fits several GPUs (gpus.yaml ``ambiguous:``) is an error listing them."""
    from planner.load import format_validation_error
    from planner.spec import GpuSpec

    table = _catalog("gpus")
    if isinstance(value, str):
        entry = table.get(value.strip().lower())
        if entry is None:
            choices = ambiguous_gpus().get(value.strip().lower())
            if choices:
                raise SpecError(field, _ambiguity(value, choices))
            raise SpecError(
                field, f"unknown GPU '{value}'{did_you_mean(value, gpu_names())}; known: {', '.join(gpu_names())}"
            )
        return GpuSpec.model_validate(entry)
    if isinstance(value, dict):
        data = dict(value)
        base = data.pop("base", None)
        if base is not None:
            merged = dict(resolve_gpu(base, field=f"{field}.base").model_dump())
            merged.update(data)
            data = merged
        try:
            return GpuSpec.model_validate(data)
        except ValidationError as exc:
            raise format_validation_error(exc, prefix=field + ".")
    raise SpecError(field, f"expected a GPU name or a mapping of GPU fields, got {type(value).__name__}")


def resolve_model(value: Any, base_dir: Path | None = None, field: str = "model", _files: tuple[Path, ...] = ()):
    """A preset name, a path to a Hugging Face config.json (or a model YAML), or an inline mapping."""
    from planner.io import path_exists
    from planner.load import format_validation_error
    from planner.spec import ModelSpec

    if isinstance(value, str):
        entry = _catalog("models").get(value.strip().lower())
        if entry is not None:
            return ModelSpec.model_validate(entry)
        path = Path(value)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        is_file = value.endswith((".json", ".yaml", ".yml")) or path_exists(path, field)
        loose = None if is_file else match_model_name(value)  # "Llama 3.1 8B"; an existing path is never a name
        if loose is not None:
            return ModelSpec.model_validate(_catalog("models")[loose.lower()])
        if is_file:
            if not path_exists(path, field):
                raise SpecError(field, f"no such model file '{value}'")
            if value.endswith(".json") or path.is_dir():
                from planner.catalog.hf import load_hf_config

                return load_hf_config(path / "config.json" if path.is_dir() else path, field=field)
            from planner.io import load_yaml

            if path.resolve() in _files:  # a model YAML that names itself (directly or through others)
                chain = " -> ".join(p.name for p in (*_files, path.resolve()))
                raise SpecError(field, f"model files refer to each other in a cycle: {chain}")
            return resolve_model(
                load_yaml(path, field=field), base_dir=path.parent, field=field, _files=(*_files, path.resolve())
            )
        raise SpecError(
            field,
            f"unknown model '{value}'{did_you_mean(value, model_names())}; known presets: "
            f"{', '.join(model_names())}, or a path to a config.json",
        )
    if isinstance(value, dict):
        data = dict(value)
        base = data.pop("preset", None)
        if base is not None:
            merged = resolve_model(base, base_dir, field=f"{field}.preset", _files=_files).model_dump(exclude_none=True)
            merged.update(data)
            data = merged
        try:
            return ModelSpec.model_validate(data)
        except ValidationError as exc:
            raise format_validation_error(exc, prefix=field + ".")
    raise SpecError(field, f"expected a preset name, a config.json path or a mapping, got {type(value).__name__}")
