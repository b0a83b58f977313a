"""Each cost-model formula against hand-computed values from its source."""

import math

import pytest

from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.comm import Link
from planner.cost.schedule import bubble_fraction, pipeline_time
from planner.spec import ModelSpec

# GPT-3 175B as in Korthikanti et al. 2022 (Table 3): s=2048, h=12288, a=96, L=96, V=51200.
GPT = ModelSpec(
    name="gpt",
    num_layers=96,
    hidden_size=12288,
    ffn_hidden_size=4 * 12288,
    num_attention_heads=96,
    vocab_size=51200,
    mlp="gelu",
    dropout=True,
    tie_embeddings=True,
)
S, B = 2048, 1
SBH = S * B * GPT.hidden_size


def act(tp=1, sp=False, flash=False, recompute="none"):
    return M.activation_bytes_per_layer(
        GPT, tokens=S * B, seq=S, tp=tp, sp=sp, flash=flash, recompute=recompute, moe=False
    )


def test_korthikanti_no_parallelism():
    a, h = GPT.num_attention_heads, GPT.hidden_size
    assert act() == pytest.approx(SBH * (34 + 5 * a * S / h))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tensor_parallel(t):
    a, h = GPT.num_attention_heads, GPT.hidden_size
    assert act(tp=t) == pytest.approx(SBH * (10 + 24 / t + 5 * a * S / (h * t)))


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_sequence_parallel_and_selective(t):
    a, h = GPT.num_attention_heads, GPT.hidden_size
    assert act(tp=t, sp=True) == pytest.approx(SBH / t * (34 + 5 * a * S / h))
    assert act(tp=t, recompute="selective") == pytest.approx(SBH * (10 + 24 / t))
    assert act(tp=t, sp=True, recompute="selective") == pytest.approx(34 * SBH / t)


def test_full_recompute_keeps_layer_input_only():
    assert act(tp=8, recompute="full") == pytest.approx(2 * SBH)
    assert act(tp=8, sp=True, recompute="full") == pytest.approx(2 * SBH / 8)


def test_flash_attention_drops_the_quadratic_term():
    lse = 4 * S * B * GPT.num_attention_heads  # fp32 log-sum-exp per head and query
    assert act(tp=1, flash=True) == pytest.approx(34 * SBH + lse)


def test_gqa_shrinks_kv_activations():
    gqa = GPT.model_copy(update={"num_kv_heads": 8})
    full = act(tp=1, recompute="selective")
    small = M.activation_bytes_per_layer(
        gqa, tokens=S, seq=S, tp=1, sp=False, flash=False, recompute="selective", moe=False
    )
    # K and V shrink from 2*sbh each to 2*sbh*kv/a each
    assert full - small == pytest.approx(4 * SBH * (1 - 8 / 96))


def test_zero_16_bytes_per_param():
    p, d = 1e9, 64
    total = lambda st: sum(st.values())  # noqa: E731
    assert total(M.model_state_bytes(p, d, 0, "bf16", "adam")) == pytest.approx(16 * p)
    assert total(M.model_state_bytes(p, d, 1, "bf16", "adam")) == pytest.approx((4 + 12 / d) * p)
    assert total(M.model_state_bytes(p, d, 2, "bf16", "adam")) == pytest.approx((2 + 14 / d) * p)
    assert total(M.model_state_bytes(p, d, 3, "bf16", "adam")) == pytest.approx(16 / d * p)


def test_megatron_18_bytes_and_distributed_optimizer():
    p, d = 1e9, 8
    assert sum(M.model_state_bytes(p, d, 0, "fp32", "adam").values()) == pytest.approx(18 * p)
    assert sum(M.model_state_bytes(p, d, 1, "fp32", "adam").values()) == pytest.approx((6 + 12 / d) * p)


def test_bubble_fraction_and_pipeline_time():
    assert bubble_fraction(8, 1, 32) == pytest.approx(7 / 32)
    assert bubble_fraction(8, 4, 32) == pytest.approx(7 / 128)
    steady, bubble = pipeline_time([1.0] * 8, vpp=1, num_microbatches=32)
    assert (steady, bubble) == (32.0, 7.0)
    steady, bubble = pipeline_time([1.0] * 8, vpp=4, num_microbatches=32)
    assert bubble / steady == pytest.approx(bubble_fraction(8, 4, 32))
    # an uneven stage paces the steady state
    steady, bubble = pipeline_time([1.0, 2.0, 1.0], vpp=1, num_microbatches=10)
    assert (steady, bubble) == (20.0, 2.0)


def test_inflight_microbatches():
    assert M.inflight_microbatches(0, 8, 1, 64) == 8
    assert M.inflight_microbatches(7, 8, 1, 64) == 1
    assert M.inflight_microbatches(0, 8, 1, 4) == 4  # fewer micro-batches than stages
    # interleaved: Korthikanti's factor 1 + (p-1)/(p*v) is the continuous version of Megatron's warm-up count
    p, v = 8, 4
    chunks = (p - 1) * 2 + (v - 1) * p + 1
    assert M.inflight_microbatches(0, p, v, 64) == pytest.approx(chunks / v)
    assert M.inflight_microbatches(0, p, v, 64) == pytest.approx(p * (1 + (p - 1) / (p * v)), rel=0.1)


def test_model_flops_match_korthikanti_appendix():
    layers, h, v = GPT.num_layers, GPT.hidden_size, GPT.vocab_size
    expected = 72 * B * layers * S * h * h * (1 + S / (6 * h) + v / (12 * layers * h))
    assert F.model_flops_per_iteration(GPT, S, B) == pytest.approx(expected)


def test_narayanan_eq3():
    layers, h, v = GPT.num_layers, GPT.hidden_size, GPT.vocab_size
    assert F.narayanan_hardware_flops(GPT, S, 1536) == pytest.approx(
        96 * 1536 * S * layers * h * h * (1 + S / (6 * h) + v / (16 * layers * h))
    )


def test_swiglu_and_moe_params():
    llama = ModelSpec(name="l", num_layers=1, hidden_size=8, ffn_hidden_size=16, num_attention_heads=2, vocab_size=10)
    assert F.dense_mlp_params(llama) == 3 * 8 * 16
    moe = ModelSpec.model_validate(
        {**llama.model_dump(), "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 6, "shared_experts": 1}}
    )
    assert F.expert_params(moe) == 3 * 8 * 6
    assert F.active_params_per_token(moe) == F.attention_params(moe) + 8 * 4 + 3 * F.expert_params(moe)


def test_ring_collectives():
    link = Link(busbw=100e9, latency=0.0, size=8)
    s = 1e9
    assert link.all_reduce(s) == pytest.approx(2 * 7 / 8 * s / 100e9)
    assert link.all_gather(s) == pytest.approx(7 / 8 * s / 100e9)
    assert Link(100e9, 0.0, 1).all_reduce(s) == 0.0
    with_lat = Link(100e9, 1e-5, 8)
    assert with_lat.all_reduce(s) - link.all_reduce(s) == pytest.approx(1e-5 * (1 + math.log2(8)))
