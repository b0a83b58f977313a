"""A provider prices a layer once per shape: its forward and backward do not depend on the recompute mode, and
full recompute (the forward again) and none (nothing) follow from the forward (compute.recompute_from_forward), so
AnalyticCosts.layer reads them from the same layer priced under another mode. Checked here against
compute.layer_time called directly, bit for bit, in every order the modes can be asked in."""

import itertools

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import compute as C
from planner.cost.provider import AnalyticCosts
from planner.spec import NodeGroup

MODES = C.RECOMPUTE_MODES
SHAPES = [  # (model, tokens, seq, tp, cp, ep, moe, flash)
    ("llama3-8b", 8192, 8192, 1, 1, 1, False, True),
    ("llama3-8b", 4096, 8192, 2, 2, 1, False, True),
    ("llama3-70b", 2048, 2048, 8, 1, 1, False, False),
    ("mixtral-8x7b", 4096, 4096, 2, 1, 4, True, True),
]


def _direct(c: AnalyticCosts, shape, mode) -> C.PassTime:
    name, tokens, seq, tp, cp, ep, moe, flash = shape
    return C.layer_time(
        resolve_model(name), c._roof, tokens=tokens, seq=seq, tp=tp, sp=tp > 1, cp=cp, ep=ep, moe=moe,
        flash=flash, recompute=mode,
    )  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("order", list(itertools.permutations(MODES, 2)) + [("op", "selective", "none", "full")])
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_a_layer_under_each_mode_is_what_layer_time_gives(shape, order, precision):
    c = AnalyticCosts(NodeGroup(gpu=resolve_gpu("h100-sxm"), nodes=1, gpus_per_node=8), precision)
    name, tokens, seq, tp, cp, ep, moe, flash = shape
    model = resolve_model(name)
    for mode in order:
        got = c.layer(model, tokens, seq, tp, tp > 1, cp, ep, moe, flash, mode)
        assert got == _direct(c, shape, mode), mode


def test_full_and_none_are_read_from_the_layer_priced_first(monkeypatch):
    c = AnalyticCosts(NodeGroup(gpu=resolve_gpu("h100-sxm"), nodes=1, gpus_per_node=8), "bf16")
    model = resolve_model("llama3-8b")
    priced = []
    real = C.layer_time
    monkeypatch.setattr(C, "layer_time", lambda *a, **k: priced.append(k["recompute"]) or real(*a, **k))
    for mode in ("op", "full", "none", "selective"):
        c.layer(model, 4096, 4096, 1, False, 1, 1, False, True, mode)
    # full and none (and selective under flash attention) come from the op layer's forward and backward
    assert priced == ["op"]
    c.layer(model, 4096, 4096, 1, False, 1, 1, False, False, "selective")  # no flash: its own attention recompute
    assert priced == ["op", "selective"]
