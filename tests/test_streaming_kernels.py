"""Kernels that stream over large tensors run at compute.STREAM_HBM_EFFICIENCY of the HBM bandwidth, not at the
calibrated rate of a layer's small element-wise kernels: a materialized attention's b*a*s^2 scores (written by
QK^T, read and written by the fused scale-mask-softmax and the dropout, read by P.V: 11 bytes per score forward,
twice that backward). Counted here from the shapes, not through the function under test."""

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import compute as C
from planner.cost.provider import AnalyticCosts
from planner.spec import NodeGroup

GPT = resolve_model("gpt3-175b")


def eager_layer(costs: AnalyticCosts, tokens: int, seq: int, tp: int) -> C.PassTime:
    return costs.layer(GPT, tokens, seq, tp, False, 1, 1, False, False, "none")


@pytest.mark.parametrize("tp", [1, 8])
def test_the_scores_of_an_eager_attention_move_at_the_streaming_rate(tp):
    group = NodeGroup(gpu=resolve_gpu("a100-80gb"), nodes=1, gpus_per_node=8)
    costs, faster = AnalyticCosts(group, "bf16"), AnalyticCosts(group, "bf16")
    faster.stream_hbm_rate = lambda: 2 * costs.stream_hbm_rate()  # only the streaming rate doubles
    tokens, seq = 4096, 2048
    base, quick = eager_layer(costs, tokens, seq, tp), eager_layer(faster, tokens, seq, tp)
    scores = tokens * seq * GPT.num_attention_heads / tp
    rate = 2.039e12 * C.STREAM_HBM_EFFICIENCY  # A100 80GB HBM2e, gpus.yaml
    # halving the time of the score traffic saves half of it: 11 bytes per score forward, 22 backward
    assert base.forward - quick.forward == pytest.approx(11.0 * scores / rate / 2, rel=1e-9)
    assert base.backward - quick.backward == pytest.approx(22.0 * scores / rate / 2, rel=1e-9)


def test_a_fused_attention_moves_no_scores():
    group = NodeGroup(gpu=resolve_gpu("a100-80gb"), nodes=1, gpus_per_node=8)
    costs, faster = AnalyticCosts(group, "bf16"), AnalyticCosts(group, "bf16")
    faster.stream_hbm_rate = lambda: 2 * costs.stream_hbm_rate()
    args = (GPT, 4096, 2048, 8, False, 1, 1, False, True, "none")
    assert costs.layer(*args) == faster.layer(*args)
