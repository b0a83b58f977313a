"""The cost seam (planner/cost/provider.py): every rate the estimator and the searches use comes from the provider.

``DoubledSource`` doubles every rate (GEMM and attention FLOP/s, HBM bytes/s, the NVLink, NIC and inter-group bus
bandwidths) and halves every time constant the provider owns: collective and send latencies, and the fixed
per-layer overhead (``layer_overhead_s`` of the calibration, which ``AnalyticCosts.layer_overhead`` returns). Every
time the cost model computes is then exactly half (a factor of 2 is exact in binary floating point), while memory
does not change. A consumer that derived a rate from the datasheet or the calibration itself, or built its own
provider, would keep part of its time unscaled, so these tests fail wherever such a bypass exists: in the
estimate of a homogeneous, a mixed-pipeline and a replica layout, in the search bounds, and in the best plan of
the homogeneous, mixed-pipeline and replica searches.
"""

import io
import itertools
import tokenize
from pathlib import Path

import pytest
from strategies import SMALL_MOE

from planner.cost.estimate import estimate
from planner.cost.provider import AnalyticCosts, CostSource, cost_source, use_cost_source
from planner.load import parse_job
from planner.search.homogeneous import global_lower_bound, search
from planner.search.mixed_pipelines import HETERO_ZERO, search_hetero
from planner.search.space import SearchOptions, enumerate_candidates

ROOT = Path(__file__).resolve().parents[1]
REL = 1e-12  # exact today (scaling by 2); the margin only absorbs a reordered sum


class DoubledRates(AnalyticCosts):
    """Every rate twice the analytic one; latencies and the per-layer overhead (provider-owned times) halved."""

    def gemm_rate(self):
        return 2 * super().gemm_rate()

    def attention_rate(self):
        return 2 * super().attention_rate()

    def hbm_rate(self):
        return 2 * super().hbm_rate()

    def stream_hbm_rate(self):
        return 2 * super().stream_hbm_rate()

    def nvlink_rate(self):
        return 2 * super().nvlink_rate()

    def network_rate(self, line_gbps):
        return 2 * super().network_rate(line_gbps)

    def latency(self, crosses_node):
        return super().latency(crosses_node) / 2

    def layer_overhead(self):
        return super().layer_overhead() / 2


class DoubledSource(CostSource):
    provider = DoubledRates


GPT = {
    "name": "gpt-seam",
    "num_layers": 8,
    "hidden_size": 1024,
    "ffn_hidden_size": 4096,
    "num_attention_heads": 16,
    "vocab_size": 32000,
    "mlp": "gelu",
}
MOE = {**SMALL_MOE, "name": "moe-seam"}
SMALL_GPU = {
    "memory_gib": 6.0,
    "peak_tflops_bf16": 312,
    "hbm_tbps": 2.0,
    "intra_node_gbps": 300,
    "inter_node_gbps": 200,
    "name": "small-gpu",
}
A100 = {"gpu": "a100-40gb", "nodes": 2, "gpus_per_node": 4}
MIXED_CLUSTER = [
    {"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 4},
    {"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 4},
]
MIXED_LINKS = [{"groups": [0, 1], "gbps": 50}]


def job(model, cluster, layout=None, seq=2048, gbs=16, attention="flash", links=(), **training):
    spec = {
        "model": model,
        "cluster": cluster,
        "links": list(links),
        "training": {"seq_length": seq, "global_batch_size": gbs, "attention": attention, **training},
    }
    if layout is not None:
        spec["layout"] = layout
    return parse_job(spec)


def doubled(fn, *args, **kwargs):
    with use_cost_source(DoubledSource):
        return fn(*args, **kwargs)


HOMOGENEOUS = {
    "tp2-pp2-dp2-zero1": job(GPT, [A100], {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "zero_stage": 1}),
    "cp-across-nodes-eager": job(
        GPT, [A100], {"tp": 4, "cp": 2, "pp": 1, "dp": 1, "micro_batch_size": 1}, attention="eager", seq=1024
    ),
    "zero3-recompute": job(
        GPT, [A100], {"tp": 1, "pp": 2, "dp": 4, "micro_batch_size": 2, "zero_stage": 3, "recompute": "full"}
    ),
    # FP8 casts and DeepSpeed's BF16_Optimizer accumulation: kernels at the streaming HBM rate
    "fp8-bf16-optimizer": job(
        GPT,
        [{"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 4}],
        {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "zero_stage": 1},
        precision="fp8",
        grad_dtype="bf16+fp32",
    ),
    "moe-ep2-vpp": job(
        MOE, [A100], {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "vpp": 3, "micro_batch_size": 1, "zero_stage": 2}
    ),
}
MIXED = {
    "mixed-pipeline-linked": job(
        GPT,
        MIXED_CLUSTER,
        {
            "dp": 2,
            "pp": 3,
            "micro_batch_size": 1,
            "zero_stage": 1,
            "recompute": "none",
            "stages": [
                {"group": 0, "tp": 4, "layers": 3, "gpus": 8},
                {"group": 1, "tp": 2, "layers": 3, "gpus": 4},
                {"group": 1, "tp": 2, "layers": 2, "gpus": 4, "recompute_layers": 1},
            ],
        },
        links=MIXED_LINKS,
    ),
    "mixed-pipeline-zero3": job(
        GPT,
        MIXED_CLUSTER,
        {
            "dp": 4,
            "pp": 2,
            "micro_batch_size": 1,
            "zero_stage": 3,
            "recompute": "none",
            "stages": [{"group": 1, "tp": 2, "layers": 3, "gpus": 8}, {"group": 0, "tp": 2, "layers": 5, "gpus": 8}],
        },
    ),
}
REPLICAS = {
    "replicas-spanning-ring": job(
        GPT,
        MIXED_CLUSTER,
        {
            "micro_batch_size": 1,
            "zero_stage": 1,
            "replicas": [
                {
                    "count": 2,
                    "micro_batches": 5,
                    "stages": [
                        {"group": 0, "tp": 2, "layers": 4, "gpus": 4},
                        {"group": 0, "tp": 2, "layers": 4, "gpus": 4},
                    ],
                },
                {
                    "count": 2,
                    "micro_batches": 3,
                    "stages": [
                        {"group": 1, "tp": 2, "layers": 4, "gpus": 4},
                        {"group": 1, "tp": 2, "layers": 4, "gpus": 4},
                    ],
                },
            ],
        },
        links=MIXED_LINKS,
    ),
}
LAYOUTS = {**HOMOGENEOUS, **MIXED, **REPLICAS}


def assert_halved(base, half):
    """Every time component of ``half`` is half of ``base``'s; memory and the layout are the same."""
    assert half.dims.as_dict() == base.dims.as_dict()
    assert half.iteration_time_s == pytest.approx(base.iteration_time_s / 2, rel=REL)
    assert base.time_breakdown_s.keys() == half.time_breakdown_s.keys()
    for k, v in base.time_breakdown_s.items():
        assert half.time_breakdown_s[k] == pytest.approx(v / 2, rel=REL, abs=0), k
    assert len(base.stages) == len(half.stages)
    for b, h in zip(base.stages, half.stages):
        assert h.microbatch_time_s == pytest.approx(b.microbatch_time_s / 2, rel=REL)
        for k, v in b.time_s.items():
            assert h.time_s[k] == pytest.approx(v / 2, rel=REL, abs=0), (b.index, k)
        assert h.memory_bytes == b.memory_bytes


@pytest.mark.parametrize("name", LAYOUTS)
def test_doubled_rates_halve_every_time_of_an_estimate(name):
    j = LAYOUTS[name]
    assert_halved(estimate(j), doubled(estimate, j))


def test_the_layouts_exercise_every_time_component():
    """Each component the estimate reports is non-zero in at least one layout above (the check above is not
    vacuous), and the mixed and replica layouts use the links between groups."""
    seen = set()
    for j in LAYOUTS.values():
        seen |= {k for k, v in estimate(j).time_breakdown_s.items() if v > 0}
    assert seen == set(estimate(HOMOGENEOUS["tp2-pp2-dp2-zero1"]).time_breakdown_s)
    for name in (*MIXED, *REPLICAS):
        assert estimate(LAYOUTS[name]).time_breakdown_s["pp_comm" if name in MIXED else "dp_comm"] > 0


@pytest.mark.parametrize("grad_dtype", ["fp32", "bf16+fp32"])
def test_doubled_rates_halve_the_homogeneous_search_bounds(grad_dtype):
    j = job(GPT, [A100], grad_dtype=grad_dtype)
    opts = SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2)
    base_costs, half_costs = cost_source(j)(0), DoubledSource(j)(0)
    base, _, _ = enumerate_candidates(j, base_costs, opts)
    half, _, _ = enumerate_candidates(j, half_costs, opts)
    assert [c.sort_key()[1:] for c in half] == [c.sort_key()[1:] for c in base]
    for b, h in zip(base, half):
        assert h.lower_bound_s == pytest.approx(b.lower_bound_s / 2, rel=REL)
    assert global_lower_bound(j, half_costs) == pytest.approx(global_lower_bound(j, base_costs) / 2, rel=REL)


def assert_same_best_plan_halved(base, half):
    assert base.plans and half.plans and base.complete == half.complete
    b, h = base.plans[0], half.plans[0]
    assert h.status == b.status
    assert_halved(b.estimate, h.estimate)


@pytest.mark.parametrize("model,gbs", [(GPT, 8), (MOE, 8)])
def test_doubled_rates_halve_the_best_homogeneous_plan(model, gbs):
    j = job(model, [A100], gbs=gbs)
    opts = SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2)

    def run():
        return search(j, top=1, time_limit_s=120, options=opts)

    assert_same_best_plan_halved(run(), doubled(run))


def test_doubled_rates_halve_the_best_mixed_pipeline():
    j = job(
        {**GPT, "num_layers": 6},
        [{"gpu": SMALL_GPU, "nodes": 1, "gpus_per_node": 4}, {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 4}],
        seq=8192,
        gbs=4,
        attention="eager",
        links=[{"groups": [0, 1], "gbps": 100}],
        grad_dtype="bf16+fp32",  # the ends' accumulation in the bounds
    )
    opts = SearchOptions(zero_stages=HETERO_ZERO, max_micro_batch=2)

    def run():
        return search_hetero(j, top=1, time_limit_s=120, options=opts, single_type=False, replicas=False)

    base = run()
    assert base.complete and len(set(base.plans[0].estimate.dims.stage_groups)) == 2  # a send between groups
    assert_same_best_plan_halved(base, doubled(run))


def test_doubled_rates_halve_the_best_replica_plan():
    """The 2x32 example, whose best plan runs replicas on both GPU types (one DP ring spanning the groups); the
    single-type searches run through the same seam."""
    from planner.io import load_yaml

    j = parse_job(load_yaml(ROOT / "examples/hetero/gpt-32l-2x32.yaml", field="job"))

    def run():
        return search_hetero(j, top=1, time_limit_s=120)

    def single():  # the single-type baselines, without the mixed plan's time as their cap
        from planner.search.single_type import best_single_type

        return best_single_type(j, SearchOptions(), 1, 120)

    base, half = run(), doubled(run)
    assert base.plans[0].estimate.dims.as_dict().get("replicas")
    assert_same_best_plan_halved(base, half)
    assert half.single_type_bound_s == pytest.approx(base.single_type_bound_s / 2, rel=REL)
    (one, group), (one_half, group_half) = single(), doubled(single)
    assert group_half == group and one_half.time == pytest.approx(one.time / 2, rel=REL)


# Datasheet rates and the calibrated efficiencies are read in the provider's modules only: a consumer that reads
# them (or builds its own provider, out of reach of use_cost_source) prices part of a plan past the seam.
SEAM_MODULES = {"provider.py", "comm.py", "compute.py", "calibration.py"}
RATE_NAMES = {
    "intra_node_gbps",
    "inter_node_gbps",
    "nic_gbps",
    "link_gbps",
    "ring_gbps",
    "hbm_tbps",
    "matmul_tflops",
    "matmul_tflops_bf16",
    "attention_tflops_bf16",
    "gemm_efficiency",
    "attention_efficiency",
    "hbm_efficiency",
    "nvlink_efficiency",
    "network_efficiency",
    "layer_overhead_s",
    "LAT_INTRA_S",
    "LAT_INTER_S",
    "roof",
    "_roof",
    "Roofline",
    "nvlink_busbw",
    "network_busbw",
}
PROVIDERS = {"AnalyticCosts", "CostSource"}  # constructed by cost_source only


def past_the_seam(path: Path) -> list[str]:
    """Lines of ``path`` whose code (not comments or strings) names a datasheet rate or builds a provider."""
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type in (tokenize.NAME, tokenize.OP)
    ]
    out = []
    for tok, nxt in itertools.pairwise(tokens):
        if tok.type == tokenize.NAME and (tok.string in RATE_NAMES or tok.string in PROVIDERS and nxt.string == "("):
            out.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.line.strip()}")
    return out


def test_no_consumer_reads_rates_past_the_seam():
    consumers = [
        p
        for d in ("planner/cost", "planner/search")
        for p in sorted((ROOT / d).rglob("*.py"))
        if not (p.parent.name == "cost" and p.name in SEAM_MODULES)
    ]
    assert consumers
    found = [line for p in consumers for line in past_the_seam(p)]
    assert not found, "\n".join(found)
