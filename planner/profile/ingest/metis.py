"""Metis device profiles (SamsungLabs/Metis ``profile_data_samples/DeviceType.<GPU>_tp<N>_bs<M>.json``, and
the Sailor-generated copies ``mbs<M>_tmp<N>.json``; shared/reference/layer-profiles/README.md section 4).

``model``: ``model_name``, ``num_layers`` (embedding + transformer layers + head), ``parameters``;
``execution_time``: ``total_time_ms``, ``forward_backward_time_ms``, ``optimizer_time_ms``, ...,
``layer_compute_total_ms[]`` = per layer **forward + backward**, milliseconds; ``execution_memory``:
``layer_memory_total_mb[]`` (parameters + gradients + optimizer states + activations: not an activation size,
so not imported).

Points: ``embedding`` = entry 0, ``layer`` = the median of the transformer entries (1 .. n-2), ``logits`` = the
last entry. The file gives forward + backward together; it is split as forward = total / (1 + r), backward =
total x r / (1 + r) with r = ``backward_ratio`` (2 by default). The TP degree and batch size are only in the file
name (``_tp<N>_bs<M>`` or ``mbs<M>_tmp<N>``; Metis' own data_loader reads them there), the device name too
(``DeviceType.<GPU>_``); sequence length and precision are not stated anywhere: the caller gives them.
"""

from __future__ import annotations

import re

from planner.profile.ingest._common import LayerRow, Parsed, Source, clean, median

NAMES = (re.compile(r"_tp(\d+)_bs(\d+)", re.I), re.compile(r"mbs(\d+)_tmp(\d+)", re.I))
DEVICE = re.compile(r"DeviceType\.(\w+?)_")


def detect(data) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("model"), dict)
        and isinstance(data.get("execution_time"), dict)
        and "layer_compute_total_ms" in data["execution_time"]
    )


def _from_name(name: str) -> tuple[int | None, int | None]:
    """(tp, micro-batch) from the file name."""
    m = NAMES[0].search(name)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = NAMES[1].search(name)
    if m:
        return int(m.group(2)), int(m.group(1))
    return None, None


def parse(src: Source, given) -> Parsed:
    data = src.data
    r = given.backward_ratio
    out = Parsed(tool=f"Metis profile (forward + backward split {1:g}:{r:g})")
    times = data["execution_time"]["layer_compute_total_ms"]
    line = src.line_of('"layer_compute_total_ms"')
    if not isinstance(times, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
        raise src.fail(line, "layer_compute_total_ms must be a list of milliseconds")
    declared = data["model"].get("num_layers")
    if isinstance(declared, int) and declared != len(times):
        raise src.fail(line, f"{len(times)} layer times for num_layers {declared} (truncated or inconsistent)")
    if len(times) < 3:
        raise src.fail(line, f"{len(times)} layer times: expected embedding, layers and head")
    if any(t < 0 for t in times):
        raise src.fail(line, "a layer time is negative")
    tp, mbs = _from_name(src.path.name)
    device = DEVICE.search(src.path.name)
    if device:
        out.state("gpu", device.group(1))
    model_name = data["model"].get("model_name")
    if isinstance(model_name, str):
        out.notes.append(f"{src.name}: Metis profile of model '{model_name}' (its dimensions are not in the file)")
    for kind, total in (("embedding", times[0]), ("layer", median(times[1:-1])), ("logits", times[-1])):
        if total <= 0:
            out.notes.append(f"{src.name}: {kind} time is zero; not imported")
            continue
        fwd = total / (1 + r) / 1e3
        out.layers.append(LayerRow(kind, clean(fwd), clean(fwd * r), src, line, micro_batch_size=mbs, tp=tp))
    out.notes.append(f"{src.name}: Metis times are forward + backward; split 1:{r:g}")
    return out
