"""Multi-head latent attention (planner.spec.MLASpec; DeepSeek-V2 arXiv 2405.04434 sec. 2.1, DeepSeek-V3, Kimi K2):
parameter totals of the MLA presets against the published ones, attention FLOPs against a hand computation from the
paper's projections (and Megatron-LM's own MLA FLOP formula), field-precise validation, the per-op checkpointing
counter over the MLA matmuls, the Megatron-LM flags and their round trip, and the Hugging Face config.json reader."""

from __future__ import annotations

import json
import math

import pytest
from emit_fixtures import fixed_layout_doc, flag_values

from planner.catalog import resolve_model
from planner.catalog.hf import load_hf_config
from planner.cost import compute as C
from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.estimate import estimate
from planner.emit import EmitOptions, LaunchPlan, megatron, megatron_bridge
from planner.errors import Inexpressible, SpecError
from planner.load import parse_job
from planner.spec import Layout, ModelSpec

V3_MLA = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


# ----------------------------------------------------------------------------- parameters


def hand_params(L, h, ffn, heads, vocab, ql, kvl, dn, dr, dv, experts, fe, shared, dense) -> int:
    """Parameters from config.json, written out module by module (Hugging Face DeepseekV3 names)."""
    q = h * heads * (dn + dr) if ql is None else h * ql + ql + ql * heads * (dn + dr)  # q_a, q_a_norm, q_b | q_proj
    kv = h * (kvl + dr) + kvl + kvl * heads * (dn + dv)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
    attention = q + kv + heads * dv * h + 2 * h  # + o_proj, input and post-attention norms
    moe = h * experts + (experts + shared) * 3 * h * fe  # router + routed and shared experts
    return L * attention + dense * 3 * h * ffn + (L - dense) * moe + 2 * vocab * h


# name: (config.json dimensions, published total in billions, where it is published)
PRESETS = {
    # 671B without the 14B multi-token-prediction module (the 685B checkpoint): DeepSeek-V3 report, Table 1
    "deepseek-v3": ((61, 7168, 18432, 128, 129280, 1536, 512, 128, 64, 128, 256, 2048, 1, 3), 671.0),
    # DeepSeek-V2: arXiv 2405.04434 (236B); V2-Lite: its model card (15.7B)
    "deepseek-v2": ((60, 5120, 12288, 128, 102400, 1536, 512, 128, 64, 128, 160, 1536, 2, 1), 236.0),
    "deepseek-v2-lite": ((27, 2048, 10944, 16, 102400, None, 512, 128, 64, 128, 64, 1408, 2, 1), 15.7),
    # Kimi K2 tech report: "1.04 trillion total parameters" (model card: 1T)
    "kimi-k2": ((61, 7168, 18432, 64, 163840, 1536, 512, 128, 64, 128, 384, 2048, 1, 1), 1040.0),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_parameters_are_the_config_count(name):
    dims, _ = PRESETS[name]
    assert F.total_params(resolve_model(name)) == hand_params(*dims)


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite"])
def test_preset_parameters_match_published_total_within_one_percent(name):
    published = PRESETS[name][1]
    assert abs(F.total_params(resolve_model(name)) / 1e9 - published) / published < 0.01


def test_kimi_k2_parameters_against_published_total():
    # The released config.json gives 1.0264T; the tech report rounds to 1.04T (1.3% more), the model card to 1T.
    total = F.total_params(resolve_model("kimi-k2")) / 1e9
    assert total == pytest.approx(1026.41, abs=0.01)
    assert abs(total - 1040.0) / 1040.0 < 0.015 and abs(total - 1000.0) / 1000.0 < 0.03


def test_active_parameters_match_published():
    # activated per token, with the input embedding: DeepSeek-V3 37B, V2 21B, V2-Lite 2.4B, Kimi K2 32B
    for name, published in (("deepseek-v3", 37.0), ("deepseek-v2", 21.0), ("deepseek-v2-lite", 2.4), ("kimi-k2", 32)):
        m = resolve_model(name)
        active = (F.active_params_per_token(m) + F.embedding_params(m)) / 1e9
        assert abs(active - published) / published < 0.05, (name, active)


def test_tp_rank_holds_the_replicated_down_projections():
    m = resolve_model("deepseek-v3")
    h = m.hidden_size
    replicated = h * 1536 + 1536 + h * (512 + 64) + 512  # q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm
    assert F.attention_params_per_tp_rank(m, 1) == F.attention_params(m)
    assert F.attention_params_per_tp_rank(m, 8) == pytest.approx((F.attention_params(m) - replicated) / 8 + replicated)
    llama = resolve_model("llama3-8b")
    assert F.attention_params_per_tp_rank(llama, 8) == F.attention_params(llama) / 8


# ----------------------------------------------------------------------------- FLOPs


def test_v3_attention_flops_per_token_by_hand():
    m = resolve_model("deepseek-v3")
    h, n, ql, kvl, dn, dr, dv = 7168, 128, 1536, 512, 128, 64, 128
    tokens, seq = 4096, 4096
    # arXiv 2405.04434 eqs. 9-19: W^DQ (h x d_c'), W^UQ and W^QR (d_c' x n(d_n + d_r)), W^DKV and W^KR
    # (h x (d_c + d_r)), W^UK and W^UV (d_c x n(d_n + d_v)), W^O (n d_v x h); 2 FLOPs per multiply-add
    projections = 2 * (h * ql + ql * n * (dn + dr) + h * (kvl + dr) + kvl * n * (dn + dv) + n * dv * h)
    assert projections == 2 * 187_105_280
    assert sum(g.flops for g in F.attention_gemms(m, tokens, 1)) / tokens == projections
    # Q.K^T over d_n + d_r and P.V over d_v against every one of seq keys (no causal halving)
    core = 2 * seq * n * (dn + dr) + 2 * seq * n * dv
    assert F.attention_core_flops(m, tokens, seq, 1, causal=False) / tokens == core
    assert F.attention_core_flops(m, tokens, seq, 1, causal=True) / tokens == core / 2
    # Megatron-LM training.py num_floating_point_operations, MLA branch (forward + backward = 3x, per token): the
    # token-linear term counts the latent norms as "+1" columns, which are no GEMMs
    q_term = ql * (h + n * (dn + dr) + 1)
    megatron_linear = 3 * 2 * (q_term + kvl * (h + n * (dn + dv) + 1) + h * dr + n * dv * h)
    assert 3 * projections == megatron_linear - 3 * 2 * (ql + kvl)
    megatron_core = 3 * 2 * (n * (dn + dr) / 2 + n * dv / 2)  # per token and key, causal
    assert 3 * F.attention_core_flops(m, tokens, seq, 1, causal=True) / tokens / seq == megatron_core


def test_tensor_parallel_splits_up_projections_only():
    m = resolve_model("deepseek-v3")
    tokens, tp = 4096, 8
    full = F.attention_gemms(m, tokens, 1)
    split = F.attention_gemms(m, tokens, tp)
    assert [g.n for g in split] == [1536, 128 * 192 // 8, 576, 128 * 256 // 8, 7168]
    assert [g.k for g in split] == [7168, 1536, 7168, 512, 128 * 128 // 8]
    assert split[0].flops == full[0].flops and split[2].flops == full[2].flops  # replicated down-projections
    # Megatron-Core with sequence parallelism runs them on the sequence shard (multi_latent_attention.py)
    shard = F.attention_gemms(m, tokens, tp, sp=True)
    assert shard[0].m == shard[2].m == tokens // tp and shard[1].m == tokens
    lite = F.attention_gemms(resolve_model("deepseek-v2-lite"), tokens, 1)
    assert [(g.k, g.n) for g in lite] == [(2048, 16 * 192), (2048, 576), (512, 16 * 256), (16 * 128, 2048)]


def test_model_flops_and_palm_use_both_head_widths():
    m = resolve_model("deepseek-v3")
    seq, batch = 4096, 2
    tokens = seq * batch
    norms = 2 * 7168 + 1536 + 512
    gemm = 6.0 * (F.active_params_per_token(m) - 61 * norms) * tokens
    attn = 3.0 * 61 * 2.0 * tokens * seq * 128 * (192 + 128)
    logits = 6.0 * 7168 * 129280 * tokens
    assert F.model_flops_per_iteration(m, seq, batch) == pytest.approx(gemm + attn + logits)
    non_embedding = F.total_params(m) - 2 * 129280 * 7168
    assert F.palm_flops_per_token(m, seq) == pytest.approx(6.0 * non_embedding + 6.0 * 61 * 128 * 320 * seq)


def test_context_parallel_kv_bytes():
    m, tokens = resolve_model("deepseek-v3"), 1024
    assert F.attention_kv_bytes(m, tokens, 4) == 2.0 * tokens * 128 * (192 + 128) / 4  # per-head K and V
    llama = resolve_model("llama3-8b")
    assert F.attention_kv_bytes(llama, tokens, 2) == 2.0 * 2.0 * tokens * 8 * 128 / 2


# ----------------------------------------------------------------------------- per-op checkpointing, memory


def test_op_checkpointing_counts_the_mla_matmuls():
    # torchtitan deepseek_v3: wq_a, wq_b, wkv_a, wkv_b, wo, then w1, w3, w2: every second one is recomputed
    m, tokens = resolve_model("deepseek-v3"), 1024
    h, f = 7168, 18432
    dense = F.op_checkpoint_recomputed_gemms(m, tokens, 1, moe=False, ep=1)
    assert [(g.m, g.k, g.n) for g in dense] == [
        (tokens, 1536, 128 * 192),  # wq_b
        (tokens, 512, 128 * 256),  # wkv_b
        (tokens, h, f),  # w1 (the 6th matmul)
        (tokens, f, h),  # w2 (the 8th)
    ]
    assert F.op_checkpoint_attention_matmul_count(m) == 5
    # without q_lora_rank the attention has four matmuls (wq, wkv_a, wkv_b, wo) and the MLP keeps Llama's parity
    lite = resolve_model("deepseek-v2-lite")
    ops = F.op_checkpoint_recomputed_gemms(lite, tokens, 1, moe=False, ep=1)
    assert [(g.k, g.n) for g in ops] == [(2048, 576), (16 * 128, 2048), (2048, 10944)]  # wkv_a, wo, w3


def test_op_checkpoint_bytes_keep_the_other_matmul_outputs():
    m, t = resolve_model("deepseek-v3"), 1024
    h, f, n = 7168, 18432, 128
    # block input, wq_a and wkv_a outputs, attention output + fp32 LSE, wo output, w3 output
    expected = 2 * t * h + 2 * t * (1536 + 576) + 2 * t * n * 128 + 4 * t * n + 2 * t * h + 2 * t * f
    assert M.op_checkpoint_bytes(m, tokens=t, tp=1, sp=False, moe=False) == expected
    assert M.op_checkpoint_bytes(m, tokens=t, tp=8, sp=True, moe=True) > 0


def test_activation_bytes_use_the_mla_widths():
    m, t = resolve_model("deepseek-v3"), 1024
    h, f, n = 7168, 18432, 128
    kw = {"tokens": t, "seq": t, "tp": 1, "sp": False, "flash": True, "recompute": "selective", "moe": False}
    # norm inputs, QKV and fc1 inputs (8th); both latents as norm input and up-projection input; Q, K (192 per head),
    # V and the output-projection input (128 per head); SwiGLU (3 f-wide); fp32 LSE
    expected = 8 * t * h + 4 * t * (1536 + 512) + 4 * t * n * 192 + 4 * t * n * 128 + 6 * t * f + 4 * t * n
    assert M.activation_bytes_per_layer(m, **kw) == expected
    sp = M.activation_bytes_per_layer(m, **{**kw, "tp": 8, "sp": True})
    assert sp == pytest.approx(expected / 8)


def test_elementwise_bytes_use_the_mla_widths():
    m, t = resolve_model("deepseek-v3"), 1024
    h, f, n = 7168, 18432, 128
    expected = 20 * t * h + 4 * t * (1536 + 512) + 4 * t * n * (2 * 192 + 128) + 6 * t * f
    assert C.elementwise_bytes(m, t, 1, False, False) == expected


# ----------------------------------------------------------------------------- the job spec

MLA_MODEL = {
    "name": "tiny-mla",
    "num_layers": 8,
    "hidden_size": 1024,
    "ffn_hidden_size": 2816,
    "num_attention_heads": 16,
    "vocab_size": 32000,
    "mlp": "swiglu",
    "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 512, "shared_experts": 1, "first_dense_layers": 1},
    "mla": {"q_lora_rank": 384, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64},
}


def job(model=None, **extra) -> dict:
    return {
        "model": MLA_MODEL if model is None else model,
        "cluster": [{"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8}],
        "training": {"seq_length": 2048, "global_batch_size": 64},
        **extra,
    }


def test_inline_mla_job_validates():
    m = parse_job(job()).model
    assert m.mla.q_lora_rank == 384 and m.mla.qk_head_dim == 96
    assert m.head_dim == m.dim_head == 96 and m.kv_heads == 16  # filled in: the query/key head width
    assert F.attention_params(m) == (
        1024 * 384 + 384 + 384 * 16 * 96 + 1024 * (128 + 32) + 128 + 128 * 16 * 128 + 16 * 64 * 1024 + 2 * 1024
    )
    # written out (the plan JSON echo), it reads back to the same spec
    again = ModelSpec.model_validate(m.model_dump())
    assert again == m
    no_q = parse_job(job({**MLA_MODEL, "mla": {**MLA_MODEL["mla"], "q_lora_rank": None}})).model
    assert no_q.mla.q_lora_rank is None


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mla": {**MLA_MODEL["mla"], "kv_lora_rank": 0}}, "model.mla.kv_lora_rank"),
        ({"mla": {**MLA_MODEL["mla"], "kv_lora_rank": "512"}}, "model.mla.kv_lora_rank"),
        ({"mla": {k: v for k, v in MLA_MODEL["mla"].items() if k != "kv_lora_rank"}}, "model.mla.kv_lora_rank"),
        ({"mla": {**MLA_MODEL["mla"], "kv_lora_rnk": 128}}, "model.mla.kv_lora_rnk"),
        ({"mla": {**MLA_MODEL["mla"], "v_head_dim": 1.5}}, "model.mla.v_head_dim"),
        ({"num_kv_heads": 4}, "model.num_kv_heads"),
        ({"head_dim": 64}, "model.head_dim"),
    ],
)
def test_bad_mla_field_is_named(change, field):
    with pytest.raises(SpecError) as err:
        parse_job(job({**MLA_MODEL, **change}))
    assert err.value.field == field, err.value


def test_matching_head_fields_are_accepted():
    m = parse_job(job({**MLA_MODEL, "num_kv_heads": 16, "head_dim": 96})).model
    assert m == parse_job(job()).model


def test_mla_job_estimates():
    est = estimate(parse_job(job()), Layout(tp=2, pp=2, ep=2, micro_batch_size=1))
    assert est.iteration_time_s > 0 and math.isfinite(est.iteration_time_s)


# ----------------------------------------------------------------------------- Megatron-LM


def plan_doc(raw: dict, layout: dict) -> dict:
    """A plan JSON document for one fixed layout (as scripts/validate_emitters.py builds them)."""
    j = parse_job(raw)
    est = estimate(j, Layout.model_validate(layout))
    return json.loads(json.dumps(fixed_layout_doc(j, est)))


LAYOUT = {"tp": 2, "pp": 2, "ep": 2, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"}


def test_megatron_flags_and_round_trip(tmp_path):
    doc = plan_doc(job(), LAYOUT)
    bundle = megatron.render(LaunchPlan.of(doc, 1, "megatron"), EmitOptions())
    argv = bundle.program[1:]
    assert flag_values(argv, "--multi-latent-attention") == []
    assert flag_values(argv, "--q-lora-rank") == ["384"]
    assert flag_values(argv, "--kv-lora-rank") == ["128"]
    assert flag_values(argv, "--qk-head-dim") == ["64"]
    assert flag_values(argv, "--qk-pos-emb-head-dim") == ["32"]
    assert flag_values(argv, "--v-head-dim") == ["64"]
    assert flag_values(argv, "--qk-layernorm") == []
    for absent in ("--kv-channels", "--group-query-attention", "--num-query-groups"):
        assert absent not in argv
    args = tmp_path / "megatron_args.txt"
    args.write_text(bundle.files["megatron_args.txt"])
    back = megatron.read(args, gpu="h100-sxm", world_size=16)
    assert back["model"]["mla"] == MLA_MODEL["mla"]
    planned = parse_job(job()).model.model_dump(exclude={"name", "source"})
    assert parse_job(back).model.model_dump(exclude={"name", "source"}) == planned
    assert back["layout"]["tp"] == 2 and back["layout"]["ep"] == 2


def test_megatron_without_query_latent(tmp_path):
    model = {**MLA_MODEL, "mla": {**MLA_MODEL["mla"], "q_lora_rank": None}}
    bundle = megatron.render(LaunchPlan.of(plan_doc(job(model), LAYOUT), 1, "megatron"), EmitOptions())
    assert "--q-lora-rank" not in bundle.program and "--multi-latent-attention" in bundle.program
    args = tmp_path / "megatron_args.txt"
    args.write_text(bundle.files["megatron_args.txt"])
    assert megatron.read(args, gpu="h100-sxm", world_size=16)["model"]["mla"]["q_lora_rank"] is None


def test_megatron_import_defaults_and_preset_check(tmp_path):
    base = (
        "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096 --vocab-size 129280 "
        "--micro-batch-size 1 --bf16 --multi-latent-attention --kv-channels 128 "
    )
    script = tmp_path / "args.txt"
    script.write_text(base)
    plain = megatron.read(script, gpu="h100-sxm", world_size=8)  # arguments.py defaults of the MLA flags
    assert plain["model"]["mla"] == {
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    assert "head_dim" not in plain["model"]  # --kv-channels does not shape MLA
    script.write_text(base + "--q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --v-head-dim 128")
    assert megatron.read(script, gpu="h100-sxm", world_size=8, model="deepseek-v3")["model"] == "deepseek-v3"
    script.write_text(base + "--q-lora-rank 1536 --kv-lora-rank 256")
    with pytest.raises(SpecError) as err:
        megatron.read(script, gpu="h100-sxm", world_size=8, model="deepseek-v3")
    assert err.value.field == "--kv-lora-rank"
    script.write_text(base.replace("--multi-latent-attention ", ""))
    with pytest.raises(SpecError) as err:
        megatron.read(script, gpu="h100-sxm", world_size=8, model="deepseek-v3")
    assert err.value.field == "--multi-latent-attention"
    script.write_text(base + "--group-query-attention --num-query-groups 8")
    with pytest.raises(SpecError) as err:
        megatron.read(script, gpu="h100-sxm", world_size=8)
    assert err.value.field == "--group-query-attention"


def test_megatron_bridge_refuses_mla():
    plan = LaunchPlan.of(plan_doc(job(), LAYOUT), 1, "megatron-bridge")
    with pytest.raises(Inexpressible) as err:
        megatron_bridge.render(plan, EmitOptions())
    assert err.value.field == "job.model.mla"


# ----------------------------------------------------------------------------- Hugging Face config.json

TINY_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 8,
    "vocab_size": 32000,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "q_lora_rank": 384,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "head_dim": 32,  # newer DeepseekV3Config writes the rotary width here; MLA's head_dim is qk_nope + qk_rope
    "tie_word_embeddings": False,
}


def write_config(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2", "kimi_k2"])
def test_hf_config_reads_mla(tmp_path, model_type):
    m = load_hf_config(write_config(tmp_path, {**TINY_V3, "model_type": model_type}))
    assert m.mla.model_dump() == MLA_MODEL["mla"]
    assert m.head_dim == 96 and m.kv_heads == 16 and "MLA" in m.source
    inline = parse_job(job()).model
    assert m.model_dump(exclude={"name", "source"}) == inline.model_dump(exclude={"name", "source"})


def test_hf_config_without_query_latent_and_missing_key(tmp_path):
    m = load_hf_config(write_config(tmp_path, {**TINY_V3, "q_lora_rank": None}))
    assert m.mla.q_lora_rank is None
    cfg = {k: v for k, v in TINY_V3.items() if k != "q_lora_rank"}
    with pytest.raises(SpecError) as err:
        load_hf_config(write_config(tmp_path, cfg))
    assert err.value.field == "model.q_lora_rank"
    with pytest.raises(SpecError) as err:
        load_hf_config(write_config(tmp_path, {**TINY_V3, "kv_lora_rank": "512"}))
    assert err.value.field == "model.kv_lora_rank"
