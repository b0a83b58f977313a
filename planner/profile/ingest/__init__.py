"""`planner profile ingest`: measured files of other tools -> one measured Profile (planner/profile/schema.py).

Each file's format is recognised from its content, never its name (a gzip stream is unpacked first):

| format | module | gives |
|---|---|---|
| nccl-tests / rccl-tests text output | nccl_text | collective points |
| nccl-tests ``-J`` JSON | nccl_json | collective points |
| torch.profiler Chrome trace (JSON, gzip) | torch_trace | layer points from ``record_function`` ranges |
| Sailor ``profile.json`` | sailor | embedding, layer, logits points |
| Aceso op CSV | aceso | layer, attention, mlp points |
| Galvatron ``computation_profiling_*.json`` / ``memory_profiling_*.json`` | galvatron | layer points / sizes |
| Metis ``DeviceType.<GPU>_tp<N>_bs<M>.json`` | metis | embedding, layer, logits points |
| Mist op database (``cache_<GPU>/<op>.json``) | mist | layer, attention, mlp, embedding, logits points |

Each module's docstring says what it reads, in which unit, and what it assumes. What a file does not state (the
micro-batch size, sequence length, TP degree or precision of a layer point) comes from the caller; a value the
file states wins over the caller's (a note says so where they differ); a value neither gives is an error naming the
file. Layer points need the model shape they were measured on (``model``), which only Mist files carry.

All points are merged into one profile: points with the same key (collectives: op, bytes, ranks, nodes; layers:
kind, micro-batch, sequence, TP, precision) but different times keep the median, and a note reports them.
Provenance records the tools, the files, and what the inputs state (device names, hosts, NCCL version, dates,
command lines). A truncated, foreign or self-contradicting file is a SpecError whose field is ``<file>:<line>``.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import SpecError
from planner.profile.ingest import aceso, galvatron, metis, mist, nccl_json, nccl_text, sailor, torch_trace
from planner.profile.ingest._common import PRECISIONS, CollectiveRow, Given, LayerRow, Parsed, Source, clean, median
from planner.profile.schema import (
    LAYER_KINDS,
    SCHEMA_VERSION,
    CollectivePoint,
    LayerPoint,
    LayerShape,
    Profile,
    Provenance,
)

MAX_FILE_BYTES = 512 * 1024 * 1024  # a real per-rank trace reaches 100s of MB
MAX_UNPACKED_BYTES = 2 * 1024 * 1024 * 1024
PROVENANCE_FIELDS = ("gpu", "date", "command", "host", "driver", "cuda", "torch", "nccl")
MAX_HOSTS_SHOWN = 8

# (detect, parse, format name) for JSON documents, then for text; the first whose detect accepts parses the file
JSON_FORMATS: tuple[tuple[Callable, Callable, str], ...] = (
    (torch_trace.detect, torch_trace.parse, "torch.profiler trace"),
    (nccl_json.detect, nccl_json.parse, "nccl-tests JSON"),
    (metis.detect, metis.parse, "Metis profile"),
    (mist.detect, mist.parse, "Mist op database"),
    (galvatron.detect_computation, galvatron.parse_computation, "Galvatron computation profile"),
    (galvatron.detect_memory, galvatron.parse_memory, "Galvatron memory profile"),
    (sailor.detect, sailor.parse, "Sailor profile.json"),
)
TEXT_FORMATS: tuple[tuple[Callable, Callable, str], ...] = (
    (aceso.detect, aceso.parse, "Aceso op profile"),
    (nccl_text.detect, nccl_text.parse, "nccl-tests output"),
)
KNOWN = (
    "nccl-tests/rccl-tests output (text or -J JSON), a torch.profiler trace, a Sailor profile.json, an Aceso op "
    "CSV, a Galvatron computation/memory profile, a Metis profile or a Mist op database file"
)


def ingest(
    paths: Sequence[str | Path],
    gpu: str,
    *,
    layer_pattern: str | None = None,
    model: Any = None,
    micro_batch_size: int | None = None,
    seq_length: int | None = None,
    tp: int | None = None,
    precision: str | None = None,
    backward_ratio: float = 2.0,
    notes: list[str] | None = None,
) -> Profile:
    """One Profile from ``paths`` measured on the catalog GPU ``gpu`` (module docstring).

    ``model``: the shape the layer points were measured on: a catalog model name, a path to a config.json or
    model YAML, a ModelSpec, a LayerShape or a mapping of LayerShape fields (None: only Mist files state one).
    ``micro_batch_size``, ``seq_length``, ``tp``, ``precision``: for files that do not state them.
    ``backward_ratio``: backward / forward time for files that measure only the forward (Galvatron) or the sum of
    both (Metis). ``notes``: when a list, receives one line per assumption, skipped part or merged duplicate.
    """
    from planner.catalog import resolve_gpu

    if not isinstance(gpu, str):
        raise SpecError("--gpu", "expected a GPU name from the catalog (`planner list gpus`)")
    gpu_name = resolve_gpu(gpu, field="--gpu").name
    given = _given(layer_pattern, micro_batch_size, seq_length, tp, precision, backward_ratio)
    shape = _shape(model)
    if not paths:
        raise SpecError("files", "no file to ingest")
    said: list[str] = []
    parsed = [_parse(read_source(p), given) for p in paths]
    for part in parsed:
        said.extend(part.notes)
    rows = [row for part in parsed for row in part.layers]
    mist_ops = [op for part in parsed for op in part.ops]
    if mist_ops:
        extra, mist_notes = mist.assemble(mist_ops)
        rows.extend(extra)
        said.extend(mist_notes)
    filled = [_fill(row, given, said) for row in rows]
    shape = _model_shape(shape, filled, said)
    layers = _attach_activations(filled, [h for part in parsed for h in part.activations], said)
    layers = _merge_layers(layers, said)
    collectives = _merge_collectives([c for part in parsed for c in part.collectives], said)
    if not layers and not collectives:
        first = str(paths[0])
        raise SpecError(
            f"{first}:1",
            "no layer or collective point in the files ingested"
            + (" (notes: " + "; ".join(said[:3]) + ")" if said else ""),
        )
    provenance = _provenance(parsed, paths)
    said.extend(_device_notes(parsed, gpu_name))
    profile = Profile(
        schema_version=SCHEMA_VERSION,
        gpu=gpu_name,
        provenance=provenance,
        model=shape if layers else None,
        layers=tuple(layers),
        collectives=tuple(collectives),
    )
    if notes is not None:
        notes.extend(said)
    return profile


# --------------------------------------------------------------------------- caller's values


def _given(layer_pattern, micro_batch_size, seq_length, tp, precision, backward_ratio) -> Given:
    for flag, value in (("--micro-batch-size", micro_batch_size), ("--seq-length", seq_length), ("--tp", tp)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise SpecError(flag, f"expected a positive integer, got {value!r}")
    if precision is not None and precision not in PRECISIONS:
        raise SpecError("--precision", f"expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if isinstance(backward_ratio, bool) or not isinstance(backward_ratio, (int, float)) or not 0 < backward_ratio <= 10:
        raise SpecError("--backward-ratio", f"expected a number in (0, 10], got {backward_ratio!r}")
    pattern = None
    if layer_pattern is not None:
        try:
            pattern = re.compile(layer_pattern)
        except re.error as exc:
            raise SpecError("--layer-pattern", f"invalid regular expression: {exc}")
        missing = [g for g in ("kind", "pass") if g not in pattern.groupindex]
        if missing:
            raise SpecError(
                "--layer-pattern",
                f"needs the named groups (?P<kind>...) and (?P<pass>...); missing: {', '.join(missing)}",
            )
    return Given(micro_batch_size, seq_length, tp, precision, float(backward_ratio), pattern)


def _shape(model: Any) -> LayerShape | None:
    if model is None or isinstance(model, LayerShape):
        return model
    from planner.load import format_validation_error
    from planner.profile.measured import shape_of
    from planner.spec import ModelSpec

    if isinstance(model, dict) and "num_layers" not in model and "preset" not in model:
        try:
            return LayerShape.model_validate(model)
        except ValidationError as exc:
            raise format_validation_error(exc, prefix="--model.")
    if not isinstance(model, ModelSpec):
        from planner.catalog import resolve_model

        model = resolve_model(model, field="--model")
    try:
        return shape_of(model)
    except ValidationError as exc:
        raise SpecError("--model", f"'{model.name}' has no layer shape a profile can record: {_first_error(exc)}")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


# --------------------------------------------------------------------------- reading and recognising


def read_source(path: str | Path) -> Source:
    """One input file, unpacked (gzip) and decoded, with its JSON document parsed when it is JSON."""
    from planner.io import path_exists

    name = str(path)
    if name == "-":
        raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        p = Path("-")
    else:
        p = Path(path)
        if not path_exists(p, name):
            raise SpecError(name, f"no such file '{name}'")
        try:
            if p.is_dir():
                raise SpecError(name, f"'{name}' is a directory, expected a file")
            if p.stat().st_size > MAX_FILE_BYTES:
                raise SpecError(name, f"larger than {MAX_FILE_BYTES // 2**20} MiB")
            raw = p.read_bytes()
        except OSError as exc:
            raise SpecError(name, f"cannot read '{name}': {exc.strerror or exc}")
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(name, f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(name, raw)
    if not raw.strip():
        raise SpecError(f"{name}:1", "the file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(f"{name}:{line}", "not UTF-8 text (a binary file?)")
    src = Source(name, p, text.lstrip("\ufeff"))
    head = src.text.lstrip()[:1]
    if head in ("{", "["):
        try:
            src.data = json.loads(src.text)
        except json.JSONDecodeError as exc:
            ends = " (the file ends early: truncated?)" if exc.pos >= len(src.text.rstrip()) else ""
            raise SpecError(f"{name}:{exc.lineno}", f"invalid JSON: {exc.msg}{ends}")
        except (ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise SpecError(f"{name}:1", f"invalid JSON: {why}")
    return src


def _gunzip(name: str, raw: bytes) -> bytes:
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
            while chunk := fh.read(1 << 20):
                out.write(chunk)
                if out.tell() > MAX_UNPACKED_BYTES:
                    raise SpecError(name, f"unpacks to more than {MAX_UNPACKED_BYTES // 2**30} GiB")
    except (EOFError, OSError, zlib.error) as exc:
        line = out.getvalue().count(b"\n") + 1
        what = "the gzip stream ends early (truncated?)" if isinstance(exc, EOFError) else f"bad gzip data ({exc})"
        raise SpecError(f"{name}:{line}", what)
    return out.getvalue()


def detect_format(src: Source) -> str | None:
    """The name of the format ``src`` holds (None: none known)."""
    formats = JSON_FORMATS if src.data is not None else TEXT_FORMATS
    for detect, _, label in formats:
        if detect(src.data if src.data is not None else src.text):
            return label
    return None


def _parse(src: Source, given: Given) -> Parsed:
    formats = JSON_FORMATS if src.data is not None else TEXT_FORMATS
    for detect, parse, _ in formats:
        if detect(src.data if src.data is not None else src.text):
            return parse(src, given)
    raise src.fail(1, _foreign(src))


def _foreign(src: Source) -> str:
    text = src.text
    if isinstance(src.data, dict) and "schema_version" in src.data or re.match(r"\s*schema_version\s*:", text):
        return "already a planner profile (schema_version): nothing to ingest"
    if "elapsed time per iteration (ms)" in text:
        return "a Megatron-LM training log: `planner calibrate` reads those, not `profile ingest`"
    kind = "JSON" if src.data is not None else "text"
    return f"unrecognised {kind}: expected {KNOWN}"


# --------------------------------------------------------------------------- filling and merging


FLAGS = {
    "micro_batch_size": ("micro-batch size", "--micro-batch-size"),
    "seq_length": ("sequence length", "--seq-length"),
    "tp": ("TP degree", "--tp"),
    "precision": ("precision", "--precision"),
}


def _fill(row: LayerRow, given: Given, said: list[str]) -> tuple[LayerPoint, LayerRow]:
    values = {}
    for key, (what, flag) in FLAGS.items():
        stated, supplied = getattr(row, key), getattr(given, key)
        if stated is not None:
            if supplied is not None and supplied != stated:
                note = f"{row.source.name}: the file states {what} {stated}; {flag} {supplied} not used for it"
                if note not in said:
                    said.append(note)
            values[key] = stated
        elif supplied is not None:
            values[key] = supplied
        elif key == "precision" and row.precision_default:
            values[key] = row.precision_default
            note = f"{row.source.name}: precision {row.precision_default} (the format's; --precision to change)"
            if note not in said:
                said.append(note)
        else:
            raise row.source.fail(row.line, f"the file does not state the {what} of its {row.kind} times; pass {flag}")
    scale = values["micro_batch_size"] if row.per_sample else 1
    try:
        point = LayerPoint(
            kind=row.kind,
            forward_s=clean(row.forward_s * scale),
            backward_s=clean(row.backward_s * scale),
            activation_bytes=row.activation_bytes,
            **values,
        )
    except ValidationError as exc:
        raise row.source.fail(row.line, f"{row.kind} point: {_first_error(exc)}")
    return point, row


def _model_shape(shape: LayerShape | None, filled: list, said: list[str]) -> LayerShape | None:
    """The caller's shape, checked against what the files state; else one the files state in full (Mist)."""
    for _, row in filled:
        for key, value in row.shape.items():
            if shape is not None and getattr(shape, key) not in (None, value):
                raise row.source.fail(
                    row.line, f"measured with {key} {value}, but the model given has {getattr(shape, key)}"
                )
    if shape is not None or not filled:
        return shape
    stated = [row.shape for _, row in filled]
    needed = ("hidden_size", "num_attention_heads", "ffn_hidden_size")
    if all(all(k in s for k in needed) for s in stated) and all(s == stated[0] for s in stated):
        said.append(f"model shape read from the measured tensors: {stated[0]}")
        return LayerShape(**stated[0])
    _, row = filled[0]
    raise SpecError(
        "--model",
        f"layer points (from {row.source.name}) need the model shape they were measured on: pass --model (a catalog "
        "name, a config.json or a model YAML)",
    )


def _attach_activations(filled: list, hints: list, said: list[str]) -> list[tuple[LayerPoint, LayerRow]]:
    used = set()
    out = []
    for point, row in filled:
        if point.kind == "layer" and point.activation_bytes is None:
            match = [
                i
                for i, h in enumerate(hints)
                if h.tp == point.tp
                and h.seq_length in (None, point.seq_length)
                and h.precision in (None, point.precision)
            ]
            if match:
                used.update(match)
                per_sample = median(hints[i].per_sample_bytes for i in match)
                point = point.model_copy(update={"activation_bytes": float(per_sample * point.micro_batch_size)})
        out.append((point, row))
    unused = [h for i, h in enumerate(hints) if i not in used]
    if unused:
        where = sorted({f"tp {h.tp}" + (f", seq {h.seq_length}" if h.seq_length else "") for h in unused})
        said.append(
            f"{unused[0].source.name}: activation sizes without a timed layer point ({'; '.join(where)}): unused"
        )
    return out


def _merge_layers(filled: list, said: list[str]) -> list[LayerPoint]:
    groups: dict[tuple, list[tuple[LayerPoint, LayerRow]]] = {}
    for point, row in filled:
        key = (point.kind, point.micro_batch_size, point.seq_length, point.tp, point.precision)
        groups.setdefault(key, []).append((point, row))
    out = []
    for key, members in groups.items():
        points = [p for p, _ in members]
        if len({(p.forward_s, p.backward_s) for p in points}) == 1:
            out.append(points[0])
            continue
        acts = [p.activation_bytes for p in points if p.activation_bytes is not None]
        merged = points[0].model_copy(
            update={
                "forward_s": clean(median(p.forward_s for p in points)),
                "backward_s": clean(median(p.backward_s for p in points)),
                "activation_bytes": median(acts) if acts else None,
            }
        )
        kind, mbs, seq, tp, precision = key
        files = sorted({row.source.name for _, row in members})
        fwd = [p.forward_s for p in points]
        said.append(
            f"{kind} mbs {mbs} seq {seq} tp {tp} {precision}: {len(points)} measurements differ (forward "
            f"{min(fwd):.6g}-{max(fwd):.6g} s; {', '.join(files)}); kept the median "
            f"{merged.forward_s:.6g} s / {merged.backward_s:.6g} s"
        )
        out.append(merged)
    order = {k: i for i, k in enumerate(LAYER_KINDS)}
    return sorted(out, key=lambda p: (order[p.kind], p.precision, p.tp, p.seq_length, p.micro_batch_size))


def _merge_collectives(rows: list[CollectiveRow], said: list[str]) -> list[CollectivePoint]:
    groups: dict[tuple, list[CollectiveRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.bytes, row.ranks, row.nodes), []).append(row)
    out = []
    for (op, size, ranks, nodes), members in groups.items():
        times = [m.time_s for m in members]
        buses = [m.busbw_gbps for m in members if m.busbw_gbps is not None]
        time_s, busbw = times[0], (buses[0] if buses else None)
        if len(set(times)) > 1:
            time_s, busbw = clean(median(times)), (clean(median(buses)) if buses else None)
            where = sorted({f"{m.source.name}:{m.line}" for m in members})
            said.append(
                f"{op} {size:.0f} B on {ranks} ranks / {nodes} node(s): {len(members)} measurements differ "
                f"({min(times):.6g}-{max(times):.6g} s; {', '.join(where[:4])}); kept the median {time_s:.6g} s"
            )
        first = members[0]
        try:
            out.append(CollectivePoint(op=op, bytes=size, ranks=ranks, nodes=nodes, time_s=time_s, busbw_gbps=busbw))
        except ValidationError as exc:
            raise first.source.fail(first.line, f"{op} row: {_first_error(exc)}")
    return sorted(out, key=lambda c: (c.op, c.ranks, c.nodes, c.bytes))


def _provenance(parsed: list[Parsed], paths: Sequence[str | Path]) -> Provenance:
    tools: list[str] = []
    fields: dict[str, list[str]] = {}
    for part in parsed:
        if part.tool not in tools:
            tools.append(part.tool)
        for key, values in part.provenance.items():
            for value in values:
                if value not in fields.setdefault(key, []):
                    fields[key].append(value)
    joined = {}
    for key in PROVENANCE_FIELDS:
        values = fields.get(key)
        if not values:
            continue
        if key == "host" and len(values) > MAX_HOSTS_SHOWN:
            values = [*values[:MAX_HOSTS_SHOWN], f"... ({len(values)} hosts)"]
        joined[key] = ("; " if key in ("command", "date") else ", ").join(values)
    return Provenance(tool="; ".join(tools), files=tuple(str(p) for p in paths), **joined)


def _device_notes(parsed: list[Parsed], gpu_name: str) -> list[str]:
    """A note for each device name the files state that does not look like the catalog GPU (``--gpu a100-40gb``
    for a file measured on ``NVIDIA H100 80GB HBM3``)."""
    family = re.sub(r"[^a-z0-9]", "", gpu_name.split("-")[0].lower())
    notes = []
    for part in parsed:
        for device in part.provenance.get("gpu", []):
            if family not in re.sub(r"[^a-z0-9]", "", device.lower()):
                notes.append(f"the files name the device '{device}', which does not look like {gpu_name}: check --gpu")
    return list(dict.fromkeys(notes))
