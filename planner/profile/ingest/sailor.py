"""Sailor ``profile.json`` (eth-easl/sailor, sailor_planner/profiles/<model>/<gpu>/profile.json; shared/reference/
layer-profiles/README.md section 2).

``{"<mbs>": {"<tp>": {"<layer index>": [fwd_s, bwd_s, update_s]}}}``: seconds of one forward and one backward
pass of one micro-batch, measured in a real Megatron-DeepSpeed training step (CUDA events in module hooks, TP
all-reduces inside). Row 0 is the embedding, row 1 the first transformer layer, rows 2..N copies of the measured
second layer, the rows after the copies the final norm and head + loss (LLaMA: two rows, RMSNorm then head).

Points: ``embedding`` = row 0; ``layer`` = row 2 (the steady-state layer; row 1 when there is only one);
``logits`` = the sum of the rows after the copies. ``update_s`` (the optimizer step of the whole 2-layer profiling
model, repeated on every row) is not a per-layer quantity and is dropped. The sequence length is not in the file
(Sailor ran 2048, 8192 for LLaMA-3-8): the caller gives it. Precision: Sailor profiles fp32 parameters (no
``--fp16``/``--bf16``; TF32 matmuls on A100/GH200), so ``fp32`` unless the caller says otherwise.
"""

from __future__ import annotations

from planner.profile.ingest._common import LayerRow, Parsed, Source, clean, integer


def _digits(d) -> bool:
    return isinstance(d, dict) and bool(d) and all(isinstance(k, str) and integer(k) is not None for k in d)


def detect(data) -> bool:
    if not _digits(data):
        return False
    first = next(iter(data.values()))
    if not _digits(first):
        return False
    rows = next(iter(first.values()))
    if not _digits(rows):
        return False
    row = next(iter(rows.values()))
    return isinstance(row, list) and len(row) == 3


def _row(src: Source, line: int, where: str, value) -> tuple[float, float]:
    ok = (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value)
    )
    if not ok:
        raise src.fail(line, f"{where}: expected [forward_s, backward_s, update_s] (non-negative seconds)")
    return float(value[0]), float(value[1])


def parse(src: Source, given) -> Parsed:
    out = Parsed(tool="Sailor profile.json")
    skipped = []
    for mbs_key, by_tp in src.data.items():
        mbs_line = src.line_of(f'"{mbs_key}"')
        if not _digits(by_tp):
            raise src.fail(mbs_line, f"micro-batch {mbs_key}: expected a mapping of TP degree -> layer rows")
        for tp_key, rows in by_tp.items():
            line = src.line_of(f'"{tp_key}"', mbs_line)
            where = f"mbs {mbs_key}, tp {tp_key}"
            if not _digits(rows):
                raise src.fail(line, f"{where}: expected a mapping of layer index -> [fwd, bwd, update]")
            idx = sorted(int(k) for k in rows)
            if idx != list(range(len(idx))):
                raise src.fail(line, f"{where}: layer indexes must run 0..{len(idx) - 1}, got {idx[:6]}...")
            if len(idx) < 3:
                raise src.fail(line, f"{where}: {len(idx)} rows; expected embedding, layers and head")
            vals = [_row(src, line, f"{where}, layer {i}", rows[str(i)]) for i in idx]
            mbs, tp = int(mbs_key), int(tp_key)
            if mbs < 1 or tp < 1:
                raise src.fail(line, f"{where}: micro-batch size and TP degree must be at least 1")
            steady = 2 if len(vals) > 3 else 1
            end = steady
            while end + 1 < len(vals) and vals[end + 1] == vals[steady]:
                end += 1
            tail = vals[end + 1 :]
            points = [("embedding", vals[0]), ("layer", vals[steady])]
            if tail:
                points.append(("logits", (sum(f for f, _ in tail), sum(b for _, b in tail))))
            for kind, (fwd, bwd) in points:
                if fwd <= 0:
                    skipped.append(f"{kind} at {where}")
                    continue
                out.layers.append(
                    LayerRow(
                        kind,
                        clean(fwd),
                        clean(bwd),
                        src,
                        line,
                        micro_batch_size=mbs,
                        tp=tp,
                        precision_default="fp32",
                    )
                )
    if skipped:
        out.notes.append(f"{src.name}: zero forward time, not imported: {', '.join(skipped[:4])}")
    return out
