"""Aceso op profiles (CSV; eth-easl/sailor baselines/Aceso/profiler/<gpu>/profiled-data-{fp16,fp32}/
<model>_mbs<M>_tp<T>_algo<A>.csv; shared/reference/layer-profiles/README.md section 3).

Columns ``op_name, forward-compute, backward-compute, input_size, output_size, weights, activations, fwd_reserved,
bwd_reserved``; times in **microseconds** per op, each op run alone (sums include per-op launch and sync costs);
sizes in MiB. Rows: ``encoder-embedding``, 13 per-layer ops (``enc-1st-layernorm`` ... ``enc-post-MLP-dropout``),
``final-layernorm``, ``gpt-post-process``.

Points: ``layer`` = the 13 layer ops, ``attention`` = ``enc-1st-layernorm`` .. ``enc-post-attention-dropout``,
``mlp`` = ``enc-2nd-layernorm`` .. ``enc-post-MLP-dropout``. Forward = the sum of ``forward-compute``.
**Backward:** Aceso's ``backward-compute`` is ``autograd.grad`` with respect to the op's activation inputs only,
so the weight-gradient GEMMs never ran (measured bwd is about 1.0-1.1 x fwd, a full backward about 2 x). The
backward recorded here adds to the measured input-gradient time the forward time of the four weight GEMMs
(``enc-attention-qkv``, ``enc-attention-dense``, ``enc-MLP-GEMM-1``, ``enc-MLP-GEMM-2``): a weight gradient is a
GEMM of the forward's shape and FLOPs. The embedding and post-process rows are not imported (their weight
gradients are missing too, and have no forward GEMM of the same shape to stand in).

``10000000.000`` in any column is Aceso's out-of-memory sentinel: such a file gives no point. TP all-reduces are not
in the op times. The micro-batch size and TP degree are read from the file name (``_mbs<M>_tp<T>``), the precision
from a ``fp16``/``fp32`` folder or file name; the sequence length (2048 in the Sailor repository) comes from the
caller.

Aceso's other CSVs are recognised and refused with the reason: ``layer_time/<gpu>.csv`` (sums of the same
input-gradient-only backward, no per-op split to correct) and ``prim_*`` collective tables (sizes in
"MB" with the group placement only in the file name: measure with nccl-tests instead).
"""

from __future__ import annotations

import re

from planner.profile.ingest._common import LayerRow, Parsed, Source, clean, number, precision_token

HEADER = "op_name,forward-compute,backward-compute,input_size,output_size,weights,activations,fwd_reserved,bwd_reserved"
LAYER_TIME = "mbs,tp,algo,fwd,bwd,fwd+bwd"
PRIM = ("data_size(mb),time(ms)",)
ATTENTION = (
    "enc-1st-layernorm",
    "enc-attention-qkv",
    "enc-attention-score",
    "enc-attention-softmax",
    "enc-attention-dropout",
    "enc-attention-context",
    "enc-attention-dense",
    "enc-post-attention-dropout",
)
MLP = ("enc-2nd-layernorm", "enc-MLP-GEMM-1", "enc-MLP-gelu", "enc-MLP-GEMM-2", "enc-post-MLP-dropout")
OTHER = ("encoder-embedding", "final-layernorm", "gpt-post-process")
WEIGHT_GEMMS = ("enc-attention-qkv", "enc-attention-dense", "enc-MLP-GEMM-1", "enc-MLP-GEMM-2")
OOM = 10000000.0
NAME = re.compile(r"_mbs(\d+)_tp(\d+)(?:_algo(\d+))?", re.I)


def _header(text: str) -> str:
    first = text.lstrip("\ufeff").lstrip().split("\n", 1)[0]
    return first.strip().replace(" ", "").lower()


def detect(text: str) -> bool:
    head = _header(text)
    return head in (HEADER.lower(), LAYER_TIME, *PRIM)


def parse(src: Source, given) -> Parsed:
    head = _header(src.text)
    if head == LAYER_TIME:
        raise src.fail(
            1,
            "an Aceso layer_time CSV: its bwd sums input-gradient-only op times (no weight gradients) and has no "
            "per-op split to correct that; ingest the per-op CSVs (<model>_mbs<M>_tp<T>_algo<A>.csv) instead",
        )
    if head != HEADER.lower():
        raise src.fail(
            1,
            "an Aceso collective table (prim_*.csv): sizes in MB with the group placement only in the file "
            "name; measure collectives with nccl-tests and ingest its output instead",
        )
    rows: dict[str, tuple[list[float], int]] = {}
    lines = src.text.lstrip("\ufeff").splitlines()
    last = 1
    oom = None
    for at, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        last = at
        cells = [c.strip() for c in raw.split(",")]
        if len(cells) != 9:
            raise src.fail(at, f"{len(cells)} columns, expected 9 ({HEADER})")
        values = [number(c) for c in cells[1:]]
        bad = [c for c, v in zip(cells[1:], values) if v is None or v < 0]
        if bad:
            raise src.fail(at, f"'{bad[0]}' is not a non-negative number")
        if cells[0] in rows:
            raise src.fail(at, f"op '{cells[0]}' appears twice (first at line {rows[cells[0]][1]})")
        if any(v >= OOM for v in values) and oom is None:
            oom = at
        rows[cells[0]] = (values, at)
    missing = [op for op in (*ATTENTION, *MLP, *OTHER) if op not in rows]
    if missing:
        raise src.fail(last + 1, f"truncated Aceso op profile: no row for {', '.join(missing[:4])}")
    out = Parsed(tool="Aceso op profile (CSV)")
    if oom is not None:
        out.notes.append(f"{src.name}:{oom}: Aceso's out-of-memory sentinel (10000000): no point from this file")
        return out
    name = NAME.search(src.path.name)
    mbs, tp = (int(name.group(1)), int(name.group(2))) if name else (None, None)
    precision = precision_token(str(src.path))
    line = rows[ATTENTION[0]][1]
    parts = {"attention": ATTENTION, "mlp": MLP, "layer": (*ATTENTION, *MLP)}
    for kind, ops in parts.items():
        fwd = sum(rows[op][0][0] for op in ops)
        bwd = sum(rows[op][0][1] for op in ops) + sum(rows[op][0][0] for op in ops if op in WEIGHT_GEMMS)
        if fwd <= 0:
            raise src.fail(line, f"the {kind} ops sum to zero forward time")
        out.layers.append(
            LayerRow(
                kind,
                clean(fwd / 1e6),
                clean(bwd / 1e6),
                src,
                line,
                micro_batch_size=mbs,
                tp=tp,
                precision=precision,
            )
        )
    return out
