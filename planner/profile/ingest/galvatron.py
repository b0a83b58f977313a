"""Galvatron computation and memory profiles (PKU-DAIR/Hetu-Galvatron ``models/<m>/configs/
computation_profiling_*.json`` and ``memory_profiling_*.json``; shared/reference/layer-profiles/README.md section 5).

**Computation** (TP 1, one GPU, flash-attn, no recompute; **forward only**, milliseconds):

- ``layernum[L]_bsz{B}[_seq{S}]``: forward of a model with L layers at batch B;
- ``layertype_0_bsz{B}_seq{S}`` (current format), or ``layertype_0`` with B from the ``layernum`` keys and S from
  the file name (``..._seqlen2048.json``; Galvatron-2 format): forward ms of one layer for **one sample**,
  = (T(L2) - T(L1)) / (L2 - L1) / B. It is checked against the ``layernum`` keys where both depths are present, and
  derived from them where the ``layertype`` key is missing.

A point is one ``layer`` at micro-batch B: forward = per-sample ms x B / 1000 s; the file has no backward, so
backward = ``backward_ratio`` x forward (2 by default: the 2:1 FLOP ratio Galvatron's own cost model assumes).
``layertype_other_*`` (embedding + head + loss together) has no kind of its own here and is dropped.

**Memory** (MB = MiB): ``layertype_0[_sp]`` -> ``tp_activation_per_bsz_dict``: activation memory of one layer per
sample at each TP degree (``_sp``: with Megatron sequence parallelism, used only without the plain key). These
give no time; they fill ``activation_bytes`` (per-sample MiB x 2^20 x micro-batch) of the layer points measured
at the same sequence length, TP degree and precision (from a computation profile ingested with it).

The precision comes from the file name (``_bf16_``), the GPU from the caller (the repository never names it).
"""

from __future__ import annotations

import re

from planner.profile.ingest._common import ActivationHint, LayerRow, Parsed, Source, clean, integer, precision_token

LAYERNUM = re.compile(r"^layernum\[(\d+)\]_bsz(\d+)(?:_seq(\d+))?$")
LAYERTYPE = re.compile(r"^layertype_(\d+)(?:_bsz(\d+)_seq(\d+))?$")
OTHER = re.compile(r"^layertype_other")
GROUP = re.compile(r"^\d+_\d+_\d+(?:_\w+)?$")
MEMORY_LAYER = re.compile(r"^layertype_(\d+)(_sp)?$")
SEQ_NAME = re.compile(r"seq(?:len)?(\d+)", re.I)
SHAPE_NAME = re.compile(r"hidden(\d+)_head(\d+)", re.I)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def detect_computation(data) -> bool:
    return (
        isinstance(data, dict)
        and bool(data)
        and all(_num(v) for v in data.values())
        and any(LAYERNUM.match(k) or LAYERTYPE.match(k) for k in data)
    )


def detect_memory(data) -> bool:
    return (
        isinstance(data, dict)
        and bool(data)
        and all(isinstance(v, dict) for v in data.values())
        and any(MEMORY_LAYER.match(k) or GROUP.match(k) for k in data)
        and all(MEMORY_LAYER.match(k) or GROUP.match(k) or k.startswith("other_memory") for k in data)
    )


def _file_seq(src: Source) -> int | None:
    m = SEQ_NAME.search(src.path.name)
    return int(m.group(1)) if m else None


def _shape(src: Source) -> dict:
    m = SHAPE_NAME.search(src.path.name)
    return {"hidden_size": int(m.group(1)), "num_attention_heads": int(m.group(2))} if m else {}


def parse_computation(src: Source, given) -> Parsed:
    data = src.data
    out = Parsed(tool=f"Galvatron computation profile (forward only; backward = {given.backward_ratio:g} x forward)")
    depths: dict[tuple[int, int | None], dict[int, tuple[float, int]]] = {}  # (B, S) -> L -> (ms, line)
    per_layer: list[tuple[int | None, int | None, float, int]] = []  # B, S, ms per sample, line
    for key, value in data.items():
        line = src.line_of(f'"{key}"')
        if value < 0:
            raise src.fail(line, f"'{key}' is negative")
        m = LAYERNUM.match(key)
        if m:
            depths.setdefault((int(m.group(2)), integer(m.group(3) or "")), {})[int(m.group(1))] = (value, line)
            continue
        m = LAYERTYPE.match(key)
        if m and m.group(1) != "0":
            out.notes.append(f"{src.name}: '{key}' (a second layer type) skipped: one layer kind per profile")
            continue
        if m:
            b, s = integer(m.group(2) or ""), integer(m.group(3) or "")
            per_layer.append((b, s, value, line))
            continue
        if not OTHER.match(key):
            out.notes.append(f"{src.name}: key '{key}' not understood; skipped")
    file_seq = _file_seq(src)
    batches = {b for b, _ in depths}
    points: dict[tuple[int | None, int | None], tuple[float, int]] = {}
    for b, s, ms, line in per_layer:
        if b is None:  # Galvatron-2 `layertype_0`: B from the layernum keys, S from the file name
            if len(batches) > 1:
                raise src.fail(line, f"'layertype_0' without a batch, but the layernum keys use {sorted(batches)}")
            b = next(iter(batches)) if batches else None
        points[(b, s if s is not None else file_seq)] = (ms, line)
    for (b, s), by_depth in depths.items():
        if len(by_depth) < 2:
            continue
        (l1, (t1, _)), (l2, (t2, line2)) = sorted(by_depth.items())[:2]
        derived = (t2 - t1) / (l2 - l1) / b
        key = (b, s if s is not None else file_seq)
        if key in points:
            ms, line = points[key]
            if abs(ms - derived) > 0.01 * abs(derived) + 1e-6:
                raise src.fail(
                    line,
                    f"per-layer time {ms:.6g} ms disagrees with the layernum keys: "
                    f"({t2:.6g} - {t1:.6g}) / ({l2} - {l1}) / {b} = {derived:.6g} ms",
                )
        else:
            points[key] = (derived, line2)
    if not points:
        raise src.fail(
            1, "no per-layer time: neither a layertype_0 key nor layernum keys at two depths for one batch size"
        )
    precision, shape = precision_token(src.path.name), _shape(src)
    for (b, s), (ms, line) in points.items():
        if ms <= 0:
            raise src.fail(line, f"per-layer forward time {ms:g} ms: expected a positive time")
        fwd = ms / 1e3
        out.layers.append(
            LayerRow(
                "layer",
                clean(fwd),
                clean(fwd * given.backward_ratio),
                src,
                line,
                micro_batch_size=b,
                seq_length=s,
                tp=1,
                precision=precision,
                shape=shape,
                per_sample=True,
            )
        )
    out.notes.append(
        f"{src.name}: Galvatron profiles the forward pass only; backward = {given.backward_ratio:g} x forward"
    )
    return out


def parse_memory(src: Source, given) -> Parsed:
    data = src.data
    out = Parsed(tool="Galvatron memory profile")
    keys = [k for k in data if MEMORY_LAYER.match(k)]
    plain = [k for k in keys if not k.endswith("_sp")]
    use = plain or keys
    if not use:
        out.notes.append(f"{src.name}: no processed layertype_0 entry (only raw per-run memory); nothing to attach")
        return out
    if not plain:
        out.notes.append(f"{src.name}: only sequence-parallel (_sp) activation sizes; used as they are")
    precision, file_seq = precision_token(src.path.name), _file_seq(src)
    for key in use:
        if MEMORY_LAYER.match(key).group(1) != "0":
            out.notes.append(f"{src.name}: '{key}' (a second layer type) skipped")
            continue
        line = src.line_of(f'"{key}"')
        entry = data[key]
        by_seq = {file_seq: entry} if "tp_activation_per_bsz_dict" in entry else entry
        for seq_key, item in by_seq.items():
            seq = seq_key if isinstance(seq_key, int) or seq_key is None else integer(seq_key)
            acts = item.get("tp_activation_per_bsz_dict") if isinstance(item, dict) else None
            if not isinstance(acts, dict):
                raise src.fail(line, f"'{key}': expected tp_activation_per_bsz_dict (activation MB per sample by TP)")
            for tp_key, mib in acts.items():
                tp = integer(str(tp_key))
                if tp is None:
                    continue  # "checkpoint": what recomputation keeps
                if not _num(mib) or mib < 0:
                    raise src.fail(line, f"'{key}'.tp_activation_per_bsz_dict.{tp_key} must be a size in MB")
                out.activations.append(ActivationHint(mib * 2**20, seq, tp, precision, src, line))
    return out
