"""FP8 recipes price their cast kernels' HBM traffic (planner/cost/compute.py Fp8Casts, Roofline.fp8_casts): torchao's
tensorwise and rowwise casts per linear layer, Transformer Engine's delayed scaling only where no producer kernel
fuses the cast. Counted here from the GEMM shapes on their own, not through the function under test."""

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import compute as C
from planner.cost import flops as F
from planner.cost.provider import AnalyticCosts
from planner.errors import SpecError
from planner.frameworks import FRAMEWORKS, check_training, priced_for
from planner.load import parse_job
from planner.spec import NodeGroup

MODEL = resolve_model("llama3-8b")


def costs(recipe: str | None, precision: str = "fp8", gpu: str = "h100-sxm") -> AnalyticCosts:
    group = NodeGroup(gpu=resolve_gpu(gpu), nodes=1, gpus_per_node=8)
    return AnalyticCosts(group, precision, fp8_recipe=recipe or "delayed")


def layer(c: AnalyticCosts, tp: int = 1, recompute: str = "none", tokens: int = 8192) -> C.PassTime:
    return c.layer(MODEL, tokens, 8192, tp, tp > 1, 1, 1, False, True, recompute)


def counted_bytes(recipe: str, tp: int, tokens: int) -> tuple[float, float]:
    """(forward, backward) cast bytes of one Llama-3-8B layer, from the layer's four GEMMs written out by hand."""
    h, f, q, kv = 4096, 14336, 4096, 2 * 1024
    # (rows, in, out) of QKV, attention output, fc1 (SwiGLU: gate and up), fc2 on one TP rank
    gemms = [(tokens, h, (q + kv) // tp), (tokens, q // tp, h), (tokens, h, 2 * f // tp), (tokens, f // tp, h)]
    act, wf, wb = {"tensorwise": (4, 5, 3), "rowwise": (6, 3, 7)}.get(recipe, (4, 0, 0))
    weights = sum(k * n for _, k, n in gemms)
    if recipe == "delayed":  # the attention output's cast, the two closing projections' output gradients
        (m1, k1, n1), (m3, _, n3) = gemms[1], gemms[3]
        return act * m1 * k1, act * (m1 * n1 + m3 * n3)
    inputs = sum(m * k for m, k, _ in gemms)
    grads = sum(m * n for m, _, n in gemms)
    return act * inputs + wf * weights, act * grads + wb * weights


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "delayed"])
@pytest.mark.parametrize("tp", [1, 8])
def test_each_recipe_adds_its_cast_bytes_at_the_cast_bandwidth(recipe, tp):
    with_casts, bf16_rate = costs(recipe), costs(recipe)
    bare = C.Roofline(
        with_casts.gemm_rate(),
        with_casts.attention_rate(),
        with_casts.hbm_rate(),
        with_casts.layer_overhead(),
        stream_hbm=with_casts.stream_hbm_rate(),
    )
    bf16_rate.__dict__["_roof"] = bare  # the same rates without the casts
    got, without = layer(with_casts, tp), layer(bf16_rate, tp)
    fwd, bwd = counted_bytes(recipe, tp, 8192)
    rate = 3.35e12 * C.STREAM_HBM_EFFICIENCY  # H100 SXM HBM3, gpus.yaml
    assert got.forward - without.forward == pytest.approx(fwd / rate, rel=1e-9)
    assert got.backward - without.backward == pytest.approx(bwd / rate, rel=1e-9)


def test_recipes_order_by_the_bytes_they_move_and_bf16_has_none():
    times = {r: layer(costs(r), tp=8) for r in ("delayed", "tensorwise", "rowwise")}
    total = {r: t.forward + t.backward for r, t in times.items()}
    assert total["delayed"] < total["tensorwise"] < total["rowwise"]
    bf16 = costs("rowwise", precision="bf16")
    assert bf16._roof.casts is None  # no FP8 GEMMs, no casts, whatever the recipe says
    a100 = costs("tensorwise", gpu="a100-80gb")  # no FP8 tensor cores: fp8 is priced as bf16
    assert a100._roof.casts is None


def test_full_recompute_recasts_and_op_recompute_recasts_what_it_reruns():
    c = costs("tensorwise")
    plain, full, op = layer(c), layer(c, recompute="full"), layer(c, recompute="op")
    assert full.recompute == pytest.approx(plain.forward)  # the forward again, casts included
    redo = F.op_checkpoint_recomputed_gemms(MODEL, 8192, 1, False, 1)
    attn, mlp = F.attention_gemms(MODEL, 8192, 1), F.mlp_gemms(MODEL, 8192, 1, False, 1)
    recast = c._roof.fp8_casts(redo, [attn[-1], mlp[1]])[0]
    assert recast > 0
    bare = costs("tensorwise")
    bare.__dict__["_roof"] = C.Roofline(
        c.gemm_rate(), c.attention_rate(), c.hbm_rate(), c.layer_overhead(), stream_hbm=c.stream_hbm_rate()
    )
    assert op.recompute - layer(bare, recompute="op").recompute == pytest.approx(recast, rel=1e-9)


def test_fp8_gains_less_at_high_tp_because_the_gathered_inputs_are_cast_whole():
    """Column-parallel inputs are all-gathered before the GEMM, so every TP rank casts the whole micro-batch's
    activations while its GEMMs shrink with TP: the FP8 speed-up over bf16 falls with TP (torchtitan issue 1207)."""

    def speedup(tp: int) -> float:
        bf16, fp8 = layer(costs(None, "bf16"), tp), layer(costs("tensorwise"), tp)
        return (bf16.forward + bf16.backward) / (fp8.forward + fp8.backward)

    assert speedup(1) > speedup(2) > speedup(4) > speedup(8) > 1.0  # without the casts: flat from TP 1 to 4


def job(training: dict):
    return parse_job(
        {
            "model": "llama3-8b",
            "cluster": [{"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}],
            "training": {"seq_length": 8192, "global_batch_size": 32, "precision": "fp8", **training},
        }
    )


def test_the_framework_prices_its_own_recipe_and_refuses_one_it_lacks():
    titan = FRAMEWORKS["torchtitan"]
    assert priced_for(job({}), titan).training.fp8_recipe == "rowwise"  # torchtitan 0.3's Float8 converter
    assert priced_for(job({}), FRAMEWORKS["megatron"]).training.fp8_recipe == "delayed"
    assert priced_for(job({"fp8_recipe": "tensorwise"}), titan).training.fp8_recipe == "tensorwise"  # stated: kept
    with pytest.raises(SpecError) as e:
        check_training(titan, "fp8", "delayed")
    assert e.value.field == "training.fp8_recipe"
    check_training(titan, "bf16", "delayed")  # no FP8 GEMMs: the recipe is moot
    with pytest.raises(SpecError):
        check_training(FRAMEWORKS["megatron"], "fp8", "rowwise")


def test_measured_runs_read_the_recipe_from_the_precision_else_the_stack():
    from pathlib import Path

    from planner.runs import load_runs

    modern = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured-runs-modern.yaml"
    if not modern.exists():
        pytest.skip("shared/reference/measured-runs-modern.yaml not present")
    cases = {c.id: c for c in load_runs(modern) if hasattr(c, "job")}
    rowwise = cases["torchtitan-2506-asynctp-8b-float8-rowwise-vanilla-tp"]
    assert rowwise.job.training.fp8_recipe == "rowwise"
    assert not any("fp8_recipe" in a for a in rowwise.assumed)  # stated, not assumed
    titan = cases["torchtitan-2412-t1-8b-8gpu-2"]
    assert titan.job.training.fp8_recipe == "tensorwise"
    assert "fp8_recipe=tensorwise (torchtitan default before 0.3)" in titan.assumed
    nemo = cases["nemo2407-llama3-70b-64gpu"]
    assert nemo.job.training.fp8_recipe == "delayed" and "fp8_recipe=delayed (nemo default)" in nemo.assumed
