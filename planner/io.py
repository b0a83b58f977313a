"""File reading and writing: safe YAML/JSON loading with field-precise errors, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from planner.errors import SpecError

MAX_INPUT_BYTES = 16 * 1024 * 1024


def _construct_mapping(loader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "mapping keys must be plain scalars", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicated key '{key}'", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _unique_keys(base: type) -> type:
    """``base`` (a safe loader) refusing duplicated mapping keys (a silent overwrite hides typos)."""
    loader = type(f"UniqueKey{base.__name__}", (base,), {})
    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    return loader


_UniqueKeyLoader = _unique_keys(yaml.SafeLoader)
# The same safe loader on libyaml's parser where PyYAML has it (its wheels do): the same constructors and resolver,
# about 7x faster on the catalogs every command reads (gpus.yaml 29 -> 4 ms, models.yaml 42 -> 6 ms). For data
# files only: it parses nesting the pure-Python parser reports as "nested too deeply", so a job or runs file with
# it would reach the schema instead of that error.
_FastUniqueKeyLoader = _unique_keys(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def path_exists(path: str | Path, field: str = "file") -> bool:
    """``Path.exists`` that turns an unusable path (too long, NUL byte, no permission) into a SpecError."""
    try:
        return Path(path).exists()
    except (OSError, ValueError) as exc:
        raise SpecError(field, f"cannot use '{path}' as a path: {getattr(exc, 'strerror', None) or exc}")


STDIN = "-"  # a path of "-" means standard input, as in other Unix tools


def read_text(path: str | Path, field: str = "file") -> str:
    if str(path) == STDIN:
        import sys

        raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(raw) > MAX_INPUT_BYTES:
            raise SpecError(field, f"standard input is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB")
        return _decode(raw, "standard input", field)
    p = Path(path)
    if not path_exists(p, field):
        raise SpecError(field, f"no such file '{path}'")
    try:
        if p.is_dir():
            raise SpecError(field, f"'{path}' is a directory, expected a file")
        if p.stat().st_size > MAX_INPUT_BYTES:
            raise SpecError(field, f"'{path}' is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB")
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(field, f"cannot read '{path}': {exc.strerror or exc}")
    return _decode(raw, f"'{path}'", field)


def _decode(raw: bytes, source: str, field: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(field, f"{source} is not UTF-8 text")


def load_yaml(path: str | Path, field: str = "file", data_file: bool = False) -> Any:
    """Load a YAML file with a safe loader; errors name the file and line. ``data_file``: a catalog of the package
    (or one that replaces it), read with libyaml's parser (_FastUniqueKeyLoader)."""
    text = read_text(path, field)
    shown = "standard input" if str(path) == STDIN else f"'{path}'"
    if not text.strip():
        raise SpecError(field, f"{shown} is empty")
    try:
        loader = _FastUniqueKeyLoader if data_file else _UniqueKeyLoader
        data = yaml.load(text, Loader=loader)  # noqa: S506 - SafeLoader subclasses
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if problem.startswith("could not determine a constructor for the tag"):  # !!python/object and friends
            tag = problem.split("'")[1].replace("tag:yaml.org,2002:", "!!") if "'" in problem else "?"
            problem = f"the tag {tag} is not allowed; only plain mappings, lists and scalars are read"
        raise SpecError(field, f"invalid YAML in {shown}{where}: {problem}")
    except (ValueError, RecursionError) as exc:  # a scalar the safe constructors reject, or absurd nesting
        raise SpecError(field, f"invalid YAML in {shown}: {_decode_problem(exc)}")
    if data is None:
        raise SpecError(field, f"{shown} is empty (no YAML content, only comments or null)")
    return data


def _decode_problem(exc: Exception) -> str:
    """A short reason for a ValueError/RecursionError raised while decoding (not the parser's own error type)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc).split(";")[0]  # int-digit limit: drop the sys.set_int_max_str_digits() advice
    if "integer string conversion" in text:
        return f"a number is too long ({text})"
    return text


def load_json(path: str | Path, field: str = "file") -> Any:
    text = read_text(path, field)
    if not text.strip():
        raise SpecError(field, f"'{path}' is empty")

    def no_dupes(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise SpecError(field, f"duplicated key '{k}' in '{path}'")
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=no_dupes)
    except json.JSONDecodeError as exc:
        raise SpecError(field, f"invalid JSON in '{path}' at line {exc.lineno}: {exc.msg}")
    except (ValueError, RecursionError) as exc:
        raise SpecError(field, f"invalid JSON in '{path}': {_decode_problem(exc)}")


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, fixed float formatting -> byte-identical output for equal input."""
    return json.dumps(obj, sort_keys=True, indent=2, allow_nan=False) + "\n"


def write_atomic(path: str | Path, text: str, mode: int = 0o644) -> None:
    """Write via a temp file in the same folder + rename, so readers never see a partial file (permissions
    ``mode``; the temp file would otherwise keep mkstemp's 0600)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_folder(folder: str | Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` (relative path -> text) under ``folder``, each atomically; shell scripts executable."""
    root = Path(folder)
    written = []
    for name in sorted(files):
        target = root / name
        write_atomic(target, files[name], 0o755 if name.endswith(".sh") else 0o644)
        written.append(target)
    return written
