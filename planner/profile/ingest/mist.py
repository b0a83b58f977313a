"""Mist op database (Dazz993/Mist ``mist/node_database/cache_<GPU>/<op>.json``; shared/reference/layer-profiles/
README.md section 7).

One file per op type: ``{"NodeSpec(target_spec=..., bounded_signature={'x': TensorSpec(shape=(b, s, h),
dtype=torch.float16, ...), ...})": {"fwd": [mean, median, std], "bwd": [mean, median, std]}}``, **seconds**, CUDA
events with L2 flushed; the backward includes weight gradients. Times are the **mean** (what Mist's own cost model
reads: ``ThroughputResult.fwd_latency``).

An op file alone is not a layer: the files ingested together are combined, per micro-batch b, into the GPT layer
Mist models (README 8.F; residual adds are not in the database):

- ``attention`` = layer_norm(x) + fused_dense QKV (weight 3h x h) + flash_attn_qkvpacked_func + fused_dense
  out-projection (h x h) + functional dropout;
- ``mlp`` = layer_norm(x) + fused_dense FC1 (f x h) + gelu + fused_dense FC2 (h x f) + functional dropout;
- ``layer`` = attention + mlp;
- ``embedding`` = VocabParallelEmbedding; ``logits`` = fused_dense head (V x h) + _vocab_parallel_cross_entropy.

Shapes give the micro-batch, sequence length, hidden size, heads, FFN width and vocabulary (checked against the
model, or used as the model shape when none is given); the tensors' dtype gives the precision, the ``cache_<GPU>``
folder name the device (provenance). Entries of a TP process group larger than 1 are not combined (TP 1 only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.profile.ingest._common import LayerRow, Parsed, Source, clean, median

TARGET = re.compile(r"target_spec=(?:FunctionSpec|NNModuleSpec|MethodDescriptorSpec)\(([\w.]+)")
TENSOR = re.compile(r"'(\w+)': TensorSpec\(shape=\(([\d,\s]*)\), dtype=torch\.(\w+)")
WORLD = re.compile(r"MistProcessGroup\(world_size=(\d+)")
VOCAB = re.compile(r"'num_embeddings': (\d+)")
DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}

LAYER_NORM = "mist.modules.layer_norm.layer_norm"
DENSE = "mist.modules.fused_dense.fused_dense_func"
FLASH = "mist.modules.flash_attn.flash_attn_qkvpacked_func"
GELU = "torch._C._nn.gelu"
DROPOUT = "torch.nn.functional.dropout"
EMBEDDING = "mist.modules.embedding.VocabParallelEmbedding"
LOSS = "mist.modules.losses._vocab_parallel_cross_entropy"


@dataclass
class MistOp:
    target: str
    tensors: dict[str, tuple[tuple[int, ...], str]]
    world: int
    vocab: int | None
    fwd: float
    bwd: float
    source: Source
    line: int


def detect(data) -> bool:
    return (
        isinstance(data, dict)
        and bool(data)
        and all(isinstance(k, str) and k.startswith("NodeSpec(") for k in data)
        and all(isinstance(v, dict) and "fwd" in v for v in data.values())
    )


def _stat(src: Source, line: int, value, key: str) -> float:
    ok = isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value)
    if not ok or value[0] < 0:
        raise src.fail(line, f"'{key}' must be [mean, median, std] seconds")
    return float(value[0])


def parse(src: Source, given) -> Parsed:
    out = Parsed(tool="Mist op database")
    folder = re.match(r"cache_(.+)$", src.path.parent.name)
    if folder:  # Mist names its database folder after the device (cache_NVIDIA_L4)
        out.state("gpu", folder.group(1).replace("_", " "))
    lines = src.lines_of(r'"NodeSpec\(')
    for i, (key, value) in enumerate(src.data.items()):
        line = lines[i] if i < len(lines) else 1
        target = TARGET.search(key)
        if target is None:
            raise src.fail(line, "a NodeSpec without target_spec")
        tensors = {
            name: (tuple(int(x) for x in dims.replace(" ", "").split(",") if x), dtype)
            for name, dims, dtype in TENSOR.findall(key)
        }
        world = WORLD.search(key)
        vocab = VOCAB.search(key)
        fwd = _stat(src, line, value.get("fwd"), "fwd")
        bwd = _stat(src, line, value.get("bwd"), "bwd") if "bwd" in value else 0.0
        out.ops.append(
            MistOp(
                target.group(1),
                tensors,
                int(world.group(1)) if world else 1,
                int(vocab.group(1)) if vocab else None,
                fwd,
                bwd,
                src,
                line,
            )
        )
    return out


def assemble(ops: list[MistOp]) -> tuple[list[LayerRow], list[str]]:
    """Layer points from the ops of all Mist files ingested together (module docstring)."""
    rows: list[LayerRow] = []
    notes: list[str] = []
    ops = [op for op in ops if op.world == 1]

    def find(target: str, **shapes) -> MistOp | None:
        hits = [op for op in ops if op.target == target and all(_dims(op, n) == s for n, s in shapes.items())]
        if not hits:
            return None
        if len(hits) == 1:
            return hits[0]
        one = hits[0]
        fwd, bwd = median(h.fwd for h in hits), median(h.bwd for h in hits)
        return MistOp(one.target, one.tensors, 1, one.vocab, fwd, bwd, one.source, one.line)

    norms = sorted({_dims(op, "x") for op in ops if op.target == LAYER_NORM and len(_dims(op, "x")) == 3})
    vocab = next((op.vocab for op in ops if op.target == EMBEDDING and op.vocab), None)
    for b, s, h in norms:
        fc2 = next(
            (
                op
                for op in ops
                if op.target == DENSE
                and len(_dims(op, "x")) == 3
                and _dims(op, "x")[:2] == (b, s)
                and _dims(op, "x")[2] != h
                and _dims(op, "weight") == (h, _dims(op, "x")[2])
            ),
            None,
        )
        f = fc2.tensors["x"][0][2] if fc2 else None
        flash = next((op for op in ops if op.target == FLASH and _dims(op, "qkv")[:3] == (b, s, 3)), None)
        parts = {
            "layer_norm": find(LAYER_NORM, x=(b, s, h)),
            "QKV": find(DENSE, x=(b, s, h), weight=(3 * h, h)),
            "flash attention": flash,
            "out-projection": find(DENSE, x=(b, s, h), weight=(h, h)),
            "dropout": find(DROPOUT, input=(b, s, h)),
            "FC1": find(DENSE, x=(b, s, h), weight=(f, h)) if f else None,
            "gelu": find(GELU, input=(b, s, f)) if f else None,
            "FC2": fc2,
        }
        missing = [k for k, v in parts.items() if v is None]
        if missing:
            notes.append(f"Mist: micro-batch {b}: no {', '.join(missing)} entry; no layer point")
            continue
        heads = flash.tensors["qkv"][0][3]
        precision = DTYPES.get(parts["QKV"].tensors["x"][1])
        shape = {"hidden_size": h, "num_attention_heads": heads, "ffn_hidden_size": f, "mlp": "gelu"}
        if vocab:
            shape["vocab_size"] = vocab
        p = parts
        attention = [p["layer_norm"], p["QKV"], p["flash attention"], p["out-projection"], p["dropout"]]
        mlp = [p["layer_norm"], p["FC1"], p["gelu"], p["FC2"], p["dropout"]]
        for kind, group in (("attention", attention), ("mlp", mlp), ("layer", attention + mlp)):
            rows.append(_row(kind, group, flash, b, s, precision, shape))
        emb = find(EMBEDDING, input=(b, s))
        if emb is not None:
            rows.append(_row("embedding", [emb], emb, b, s, precision, shape))
        if vocab:
            head = find(DENSE, x=(b, s, h), weight=(vocab, h))
            loss = find(LOSS, vocab_parallel_logits=(b * s, vocab))
            if head is not None and loss is not None:
                rows.append(_row("logits", [head, loss], head, b, s, precision, shape))
    if ops and not rows:
        notes.append(
            "Mist: the op files ingested do not make up a layer (layer_norm, fused_dense, flash_attn, gelu and "
            "dropout are needed together)"
        )
    return rows, notes


def _dims(op: MistOp, name: str) -> tuple[int, ...]:
    return op.tensors.get(name, ((), ""))[0]


def _row(kind, group, anchor: MistOp, b, s, precision, shape) -> LayerRow:
    return LayerRow(
        kind,
        clean(sum(op.fwd for op in group)),
        clean(sum(op.bwd for op in group)),
        anchor.source,
        anchor.line,
        micro_batch_size=b,
        seq_length=s,
        tp=1,
        precision=precision,
        shape=dict(shape),
    )
