"""Per-op selective checkpointing (layout.recompute: op, torchtitan's SAC policy): what it keeps, what it
recomputes, and who can run it."""

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.calibration import default_calibration
from planner.cost.compute import Roofline, attention_rate, gemm_rate, hbm_rate, layer_time
from planner.errors import Inexpressible
from planner.frameworks import FRAMEWORKS
from planner.parallel import baseline_recompute_modes
from planner.search.space import SearchOptions
from planner.spec import Training

LLAMA = resolve_model("llama3-8b")
T = 8192


def act(recompute, tp=1, sp=False, model=LLAMA):
    return M.activation_bytes_per_layer(
        model, tokens=T, seq=T, tp=tp, sp=sp, flash=True, recompute=recompute, moe=model.moe is not None
    )


def test_a_llama_block_keeps_its_input_q_v_attention_output_w1_and_w2_outputs():
    h, q, kv, f = 4096, 4096, 1024, 14336
    lse = 4 * 32  # fp32 log-sum-exp per head
    assert act("op") == T * (4 * h + 4 * q + 2 * kv + 2 * f + lse)


def test_it_keeps_about_half_of_what_selective_recompute_keeps():
    ratio = act("op") / act("selective")
    assert 0.4 < ratio < 0.55  # torchtitan's readings: about half (measured-runs.md, section 8)
    assert act("full") < act("op") < act("none")


def test_tensor_parallel_splits_what_it_keeps():
    assert act("op", tp=8, sp=True) == pytest.approx(act("op") / 8)


def test_moe_layers_keep_per_routed_token():
    moe = resolve_model("mixtral-8x7b")
    assert act("full", model=moe) < act("op", model=moe) < act("none", model=moe)


def test_it_recomputes_wk_wo_and_w3_and_the_elementwise_kernels():
    gemms = F.op_checkpoint_recomputed_gemms(LLAMA, T, 1, False, 1)
    total = F.attention_gemms(LLAMA, T, 1) + F.mlp_gemms(LLAMA, T, 1, False, 1)
    share = sum(g.flops for g in gemms) / sum(g.flops for g in total)
    assert share == pytest.approx(
        (4096 * 1024 + 4096 * 4096 + 4096 * 14336) / (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    )
    gpu, cal = resolve_gpu("h100-sxm"), default_calibration()
    roof = Roofline(gemm_rate(gpu, "bf16", cal), attention_rate(gpu, cal), hbm_rate(gpu, cal), 0.0)
    kw = dict(tokens=T, seq=T, tp=1, sp=False, cp=1, ep=1, moe=False, flash=True)
    op, full, none = (layer_time(LLAMA, roof, recompute=r, **kw) for r in ("op", "full", "none"))
    assert none.recompute == 0 < op.recompute < full.recompute
    assert op.forward == none.forward and op.backward == none.backward


def test_torchtitan_runs_it_megatron_and_deepspeed_do_not():
    assert FRAMEWORKS["torchtitan"].allows(recompute="op")
    for name in ("megatron", "megatron-bridge", "deepspeed"):
        assert FRAMEWORKS[name].rejects(recompute="op")[0] == "recompute"


def test_the_search_tries_it_only_for_a_framework_that_has_it():
    t = Training(seq_length=T, global_batch_size=8)
    assert "op" not in baseline_recompute_modes(t, SearchOptions().op_recompute)
    assert "op" in baseline_recompute_modes(t, SearchOptions(framework=FRAMEWORKS["torchtitan"]).op_recompute)


def test_emitting_it_for_megatron_is_refused(tmp_path):
    import copy

    from emit_fixtures import load

    from planner.emit import emit

    doc = copy.deepcopy(load("llama3-70b-h100-megatron"))
    doc["plans"][0]["layout"]["recompute"] = "op"
    with pytest.raises(Inexpressible) as info:
        emit(doc, "megatron", 1)
    assert info.value.field.endswith("recompute")
