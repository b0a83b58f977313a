"""DeepSpeed's BF16_Optimizer folds every micro-batch's 16-bit gradients into fp32 buffers (compute.
GRAD_ACCUMULATION_BYTES, 18 bytes per parameter at the streaming HBM rate); Megatron's fused main_grad and PyTorch's
per-micro-batch reduction add no such pass. Checked here against the stage's own parameter count (its 16-bit
weights), not through the function under test, and in the searches' bounds, which must stay below the estimate."""

import pytest

from planner.catalog import resolve_gpu
from planner.cost import compute as C
from planner.cost.estimate import estimate
from planner.load import parse_job
from planner.search.homogeneous import search
from planner.spec import Layout

A100 = resolve_gpu("a100-80gb")
RATE = A100.hbm_tbps * 1e12 * C.STREAM_HBM_EFFICIENCY


def job(grad_dtype: str, tie: bool = True) -> dict:
    return {
        "model": {
            "name": "bloom-like",
            "num_layers": 8,
            "hidden_size": 2048,
            "ffn_hidden_size": 8192,
            "num_attention_heads": 16,
            "vocab_size": 50304,
            "tie_embeddings": tie,
        },
        "cluster": [{"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
        "training": {"seq_length": 2048, "global_batch_size": 64, "precision": "bf16", "grad_dtype": grad_dtype},
    }


LAYOUT = Layout(tp=2, pp=2, micro_batch_size=2, zero_stage=1, recompute="full")


@pytest.mark.parametrize("tie", [True, False])
def test_each_stage_pays_18_bytes_per_parameter_per_micro_batch(tie):
    with_pass, without = (
        estimate(parse_job(job("bf16+fp32", tie)), LAYOUT),
        estimate(parse_job(job("fp32", tie)), LAYOUT),
    )
    assert len(with_pass.stages) == 2
    for a, b in zip(with_pass.stages, without.stages):
        params = a.memory_bytes["weights"] / 2.0  # 16-bit weights: every parameter the GPU holds, ends included
        assert a.microbatch_time_s - b.microbatch_time_s == pytest.approx(18.0 * params / RATE, rel=1e-9)
    assert with_pass.iteration_time_s > without.iteration_time_s


def test_in_place_accumulation_adds_no_pass():
    """fp32 (Megatron main_grad) and bf16 gradients change the traffic and the memory, not the compute: their
    stages compute for as long; the BF16_Optimizer's stages longer, by the pass."""
    compute = {
        g: [s.time_s["compute"] for s in estimate(parse_job(job(g)), LAYOUT).stages]
        for g in ("fp32", "bf16", "bf16+fp32")
    }
    assert compute["fp32"] == compute["bf16"]
    assert all(a > b for a, b in zip(compute["bf16+fp32"], compute["fp32"]))


def test_the_search_bounds_include_the_pass_and_stay_valid():
    """The homogeneous search prices and bounds candidates with the same per-layer and end terms: its best plan is
    no faster than the estimate of its own layout, and slower than the same job without the pass."""
    with_pass = search(parse_job(job("bf16+fp32")), top=1)
    without = search(parse_job(job("fp32")), top=1)
    best = with_pass.plans[0]
    assert best.candidate.lower_bound_s <= best.time * (1 + 1e-9)
    assert best.time > without.plans[0].time
