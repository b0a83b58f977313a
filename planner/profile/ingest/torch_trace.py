"""torch.profiler Chrome traces (Kineto ``export_chrome_trace``, ``.json`` or gzip; shared/reference/profiling.md 1).

**Label convention.** Per-layer times come from ``record_function`` ranges whose label ends in
``<kind>[.<index>].<pass>``, anywhere after a ``.`` or ``/``:

- ``<kind>``: ``layer``/``layers``/``block``/``blocks`` (a whole transformer layer), ``attention``/``attn``/
  ``self_attn``, ``mlp``/``ffn``, ``moe``, ``embedding``/``embed``, ``logits``/``head``/``lm_head``;
- ``<pass>``: ``fwd``/``forward`` or ``bwd``/``backward``.

So ``layer.3.forward`` and ``layer.3.backward`` (as shared/reference/samples/make_torch_trace.py labels them, the
backward opened and closed by module full-backward pre/post hooks), ``decoder.3.attn.fwd`` and
``model.layers.3.mlp.backward`` all count. Other labels are ignored. ``layer_pattern`` (``--layer-pattern``)
replaces the convention: a regex (``re.search``) with the named groups ``kind`` (one of the names above) and
``pass``.

**Which time.** On a GPU trace the ``gpu_user_annotation`` span (the range projected onto the GPU stream: the
kernels launched under it, start to end) is used, since a CPU range of asynchronous launches is not GPU time; a
trace without them (CPU-only) uses the ``user_annotation`` range's ``dur``. The value of a kind and pass is the
median over all its ranges (every layer index, every profiled step), in seconds.

A kind with a forward range but no backward range (the sample's ``embed.forward``, ``head.forward``) is not
imported: a point needs both passes.

**Micro-batch, sequence, TP, precision.** Read from the trace's top-level metadata when the profiling script
recorded it (``prof.add_metadata_json("micro_batch_size", "4")``, likewise ``seq_length``, ``tp``, ``precision``;
make_torch_trace.py records none), else from the caller. TP is 1 for a trace without ``distributedInfo`` or with
``world_size`` 1. The precision, when not recorded, is read from the ``Input type`` of the matrix-multiply ops
(``aten::mm``/``addmm``/``bmm``/``baddbmm``, ``record_shapes=True``): ``float`` = fp32, ``c10::BFloat16`` = bf16,
``c10::Half`` = fp16, ``c10::Float8_*`` = fp8.

Provenance: ``deviceProperties[0].name`` (GPU), ``host_name``, ``distributedInfo.nccl_version``,
``baseTimeNanoseconds`` (date), ``cuda_runtime_version`` / ``cuda_driver_version`` where present.
"""

from __future__ import annotations

import datetime
import re
from collections import Counter

from planner.profile.ingest._common import LayerRow, Parsed, Source, clean, integer, median

KINDS = {
    "layer": "layer",
    "layers": "layer",
    "block": "layer",
    "blocks": "layer",
    "attention": "attention",
    "attn": "attention",
    "self_attn": "attention",
    "mlp": "mlp",
    "ffn": "mlp",
    "moe": "moe",
    "embedding": "embedding",
    "embed": "embedding",
    "logits": "logits",
    "head": "logits",
    "lm_head": "logits",
}
PASSES = {"fwd": "forward", "forward": "forward", "bwd": "backward", "backward": "backward"}
DEFAULT_PATTERN = re.compile(
    r"(?:^|[./])(?P<kind>" + "|".join(sorted(KINDS, key=len, reverse=True)) + r")(?:[./]\d+)?[./]"
    r"(?P<pass>fwd|bwd|forward|backward)$"
)
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm")
DTYPES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}
PRECISION_NAMES = {
    **{p: p for p in ("bf16", "fp16", "fp8", "fp32")},
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}


def detect(data) -> bool:
    if isinstance(data, dict):
        return isinstance(data.get("traceEvents"), list)
    return isinstance(data, list) and bool(data) and all(isinstance(e, dict) and "ph" in e for e in data[:50])


def parse(src: Source, given) -> Parsed:
    data = src.data
    events = data["traceEvents"] if isinstance(data, dict) else data
    meta = data if isinstance(data, dict) else {}
    out = Parsed(tool="torch.profiler trace")
    _provenance(meta, out)
    pattern = given.layer_pattern or DEFAULT_PATTERN
    gpu = _spans(events, "gpu_user_annotation", pattern)
    spans = gpu or _spans(events, "user_annotation", pattern)
    where = "GPU annotation spans" if gpu else "CPU user_annotation ranges"
    if not gpu and spans and meta.get("deviceProperties"):
        out.notes.append(
            f"{src.name}: a GPU trace without gpu_user_annotation spans: the CPU ranges are used (launch time, "
            "not GPU time, where kernels run asynchronously)"
        )
    if not spans:
        how = f"--layer-pattern {pattern.pattern!r}" if given.layer_pattern else "the label convention"
        raise src.fail(
            1,
            f"no record_function range matches {how}: label layers `layer.<i>.forward` / `layer.<i>.backward` "
            "(or `<module>.<kind>.<fwd|bwd>`), or pass --layer-pattern with groups (?P<kind>...) and (?P<pass>...)",
        )
    by_kind: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for label, kind_text, pass_text, dur in spans:
        kind, which = KINDS.get(kind_text.lower()), PASSES.get(pass_text.lower())
        if kind is None or which is None:
            out.notes.append(f"{src.name}: range '{label}' skipped: kind '{kind_text}' / pass '{pass_text}' unknown")
            continue
        by_kind.setdefault(kind, {}).setdefault(which, []).append((label, dur))
    stated = _stated(src, meta, events, out)
    for kind, passes in by_kind.items():
        fwd, bwd = passes.get("forward", []), passes.get("backward", [])
        if not fwd or not bwd:
            missing = "backward" if fwd else "forward"
            labels = sorted({label for label, _ in fwd or bwd})
            out.notes.append(f"{src.name}: {kind} has no {missing} range ({', '.join(labels[:4])}); not imported")
            continue
        line = src.line_of(f'"{fwd[0][0]}"')
        out.layers.append(
            LayerRow(
                kind,
                clean(median(d for _, d in fwd) / 1e6),
                clean(median(d for _, d in bwd) / 1e6),
                src,
                line,
                **stated,
            )
        )
    if not out.layers:
        raise src.fail(1, "no layer kind has both a forward and a backward range")
    out.tool = f"torch.profiler trace ({where})"
    return out


def _spans(events, category: str, pattern: re.Pattern) -> list[tuple[str, str, str, float]]:
    """(label, kind, pass, microseconds) of each matching range; GPU spans of one range (same External id) merged
    start to end."""
    found: dict[tuple, list[float]] = {}
    order: list[tuple] = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("cat") != category or ev.get("ph") != "X":
            continue
        name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur")
        if not isinstance(name, str) or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        m = pattern.search(name)
        if m is None:
            continue
        ext = (ev.get("args") or {}).get("External id") if category == "gpu_user_annotation" else None
        key = (name, m.group("kind"), m.group("pass"), ext if ext is not None else ("event", i))
        # offsets from the first piece: ts is ~1e12 us, where ts + dur would lose the digits of dur
        if key not in found:
            found[key] = [ts, 0.0, float(dur)]
            order.append(key)
        else:
            ref, start, end = found[key]
            found[key] = [ref, min(start, ts - ref), max(end, ts - ref + dur)]
    spans = [(k[0], k[1], k[2], found[k][2] - found[k][1]) for k in order]
    return [s for s in spans if s[3] > 0]


def _meta_int(meta: dict, key: str) -> int | None:
    value = meta.get(key)
    if isinstance(value, str):
        value = integer(value.strip())
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _stated(src: Source, meta: dict, events, out: Parsed) -> dict:
    stated = {k: _meta_int(meta, k) for k in ("micro_batch_size", "seq_length", "tp")}
    dist = meta.get("distributedInfo")
    if stated["tp"] is None and (not isinstance(dist, dict) or dist.get("world_size") in (None, 1)):
        stated["tp"] = 1
    precision = meta.get("precision")
    named = PRECISION_NAMES.get(precision.strip().lower()) if isinstance(precision, str) else None
    if named:
        stated["precision"] = named
    else:
        stated["precision"] = _matmul_precision(src, events, out)
    return stated


def _matmul_precision(src: Source, events, out: Parsed) -> str | None:
    """The most frequent operand type of the matrix multiplies (None without ``record_shapes``)."""
    seen: Counter = Counter()
    for ev in events:
        if not isinstance(ev, dict) or ev.get("cat") != "cpu_op" or ev.get("name") not in MATMULS:
            continue
        types = (ev.get("args") or {}).get("Input type")
        operand = 1 if ev["name"] in ("aten::addmm", "aten::baddbmm") else 0  # addmm(bias, a, b)
        if isinstance(types, list) and len(types) > operand and isinstance(types[operand], str):
            kind = DTYPES.get(types[operand]) or ("fp8" if "Float8" in types[operand] else None)
            if kind:
                seen[kind] += 1
    if not seen:
        return None
    best, count = seen.most_common(1)[0]
    if count < sum(seen.values()):
        out.notes.append(f"{src.name}: matmul operand types {dict(seen)}; precision {best} (the most frequent)")
    return best


def _provenance(meta: dict, out: Parsed) -> None:
    devices = meta.get("deviceProperties")
    if isinstance(devices, list):
        for dev in devices:
            if isinstance(dev, dict):
                out.state("gpu", dev.get("name"))
    out.state("host", meta.get("host_name") if isinstance(meta.get("host_name"), str) else None)
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict):
        out.state("nccl", dist.get("nccl_version") if isinstance(dist.get("nccl_version"), str) else None)
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, int) and not isinstance(base, bool) and base > 0:
        when = datetime.datetime.fromtimestamp(base / 1e9, tz=datetime.UTC)
        out.state("date", when.isoformat(timespec="seconds"))
    for key, field in (("cuda_runtime_version", "cuda"), ("cuda_driver_version", "driver")):
        value = meta.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            out.state(field, value)
