"""`planner validate` on the shared published runs meets the accuracy bars of the foundation issue."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured-runs.yaml"
pytestmark = pytest.mark.skipif(not RUNS.exists(), reason="shared/reference/measured-runs.yaml not present")


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(RUNS), "--json"], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def test_coverage(report):
    s = report["summary"]
    assert s["coverage"] >= 0.95
    for run in report["runs"]:
        assert run["status"] in ("ok", "skipped")
        if run["status"] == "skipped":
            assert run["reason"]


def test_iteration_time_accuracy(report):
    t = report["summary"]["time"]
    assert t["count"] >= 140
    # no worse than before the modern stacks' terms (5.08% / 17.81% at the time they landed). The TP overlap of
    # each collective with its own GEMM (stage.tp_overlap_share) moved the median to 5.11%: Megatron's H100
    # weak-scaling rows with --tp-comm-overlap now show the reduce-scatter the short output projection cannot hide.
    # MT-NLG read without sequence parallelism (its 2022-01 source predates it) moved the p90 to 16.98%. DeepSpeed's
    # BF16_Optimizer accumulating every micro-batch's gradients in fp32 (compute.GRAD_ACCUMULATION_BYTES) moved
    # them to 4.83% / 16.21%; a materialized attention's scores at the streaming HBM rate and the backward TP
    # all-reduce of Megatron's 2021-22 layers on the critical path (runs.synchronous_tp) to 4.83% / 14.96%.
    assert t["median_abs_error_pct"] <= 5.0
    assert t["p90_abs_error_pct"] <= 15.0


def test_bf16_optimizer_rows_pay_their_per_micro_batch_accumulation(report):
    """BLOOM's sweep (Megatron-DeepSpeed, BF16_Optimizer) was 4-6% too fast at two micro-batches per step and right
    at four: a cost paid per micro-batch was missing. With the fp32 accumulation pass every TP-4 row is within 4%
    (it was 3.7-5.7% too fast at mbs 2) and their median within 2%, except the 104-head row, measured 14% slower
    than its 128-head sibling, which has the same shape and more attention work."""
    rows = {
        r["id"]: r["error"]["iteration_time"]
        for r in report["runs"]
        if r["source_group"] == "bloom" and r["layout"]["tp"] == 4 and r["error"]["iteration_time"] is not None
    }
    outlier = "bloom-prequel-0228-h13312-l82-tp4pp12dp8-mbs2-a104"
    assert len(rows) == 14 and outlier in rows
    errors = sorted(abs(e) for i, e in rows.items() if i != outlier)
    assert errors[-1] <= 0.04, rows
    assert errors[len(errors) // 2] <= 0.02, rows  # 1.8% (4.7% without the pass)


def test_narayanan_table_1_has_no_error_trend_with_model_size(report):
    """Narayanan et al. 2021 Table 1 (GPT 1.7B-1T, eager attention): the small models, whose b*a*s^2 attention scores
    outweigh their hidden-size GEMMs most, were priced 24/17/10% too slow (1.7B/3.6B/7.5B) while the large ones were
    within 5%: the scores' traffic was priced at the rate of small element-wise kernels. At the streaming rate of
    kernels over large tensors every row is within 6.5%."""
    rows = {r["id"]: r["error"]["iteration_time"] for r in report["runs"] if r["id"].startswith("narayanan21-t1-")}
    assert len(rows) == 10
    assert all(abs(e) <= 0.065 for e in rows.values()), rows


def test_memory_accuracy(report):
    m = report["summary"]["memory"]
    assert m["count"] >= 15
    assert m["median_abs_error_pct"] <= 10.0


def test_measured_ooms(report):
    o = report["summary"]["oom"]
    assert o["measured"] == 3
    # bloom-prequel h14336-l82 OOMed while h13312-l94, whose stages hold as many parameters and more activations,
    # ran at 67 GB; no physical term separates the two (see README, accuracy).
    assert o["predicted_not_fitting"] >= 2


def test_json_is_deterministic(report):
    again = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(RUNS), "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(again.stdout) == report


MODERN = RUNS.parent / "measured-runs-modern.yaml"


@pytest.mark.skipif(not MODERN.exists(), reason="shared/reference/measured-runs-modern.yaml not present")
def test_modern_runs_read_their_frameworks_defaults():
    """NeMo and torchtitan runs that leave attention and the optimizer unstated are read with their frameworks'
    defaults (fused attention, the distributed optimizer): before that reading the median time error was 265%."""
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(MODERN), "--json"], capture_output=True, text=True, check=True
    )
    doc = json.loads(proc.stdout)
    nemo = [r for r in doc["runs"] if r["status"] == "ok" and r["id"].startswith("nemo")]
    assert nemo and all("attention=flash3 (cuDNN fused attention, nemo default)" in r["assumed"] for r in nemo)
    assert not any("attention=flash (nemo default)" in r["assumed"] for r in nemo)  # one kernel named, not two
    # NeMo recipes leave recompute off: the runs that state none are priced without it, not with the least that fits
    nemotron = next(r for r in nemo if r["id"] == "nemo2407-nemotron-340b-128gpu")
    assert "recompute=none (nemo default)" in nemotron["assumed"] and nemotron["layout"]["recompute"] == "none"
    # torchtitan's DTensor TP: every backward collective exposed
    titan_tp = [r for r in doc["runs"] if r["source_group"] == "torchtitan" and r["layout"]["tp"] > 1]
    assert titan_tp and all("tp_backward_overlap=false (DTensor TP, torchtitan)" in r["assumed"] for r in titan_tp)
    s = doc["summary"]
    assert s["coverage"] >= 0.95  # presets by name, the H100 96 GB variant, the flagged B200 rows
    # 4.74 (5.65 with cuDNN attention at 1.5x FlashAttention-2, the low end of the FA3 paper's abstract, instead of
    # the 1.61x of its head-dim-128 figures; 6.06 with every async-TP collective fused)
    assert s["time"]["median_abs_error_pct"] <= 5.0
    # the FP8 recipes' casts took it from 17.1 to 14.7; the compiled loss of the 2025 torchtitan runs (a cheaper
    # loss, physically right) moved the async-TP rows, already too fast, past the 90th percentile: 16.2; async TP's
    # unfused backward reduce-scatters (pytorch/pytorch#149946) brought them back: 10.9
    assert s["time"]["p90_abs_error_pct"] <= 11.5
    assert s["oom"]["measured"] == 0
    # NeMo (FP8, long-sequence CP up to 1M tokens): cuDNN fused attention, bf16 gradients, the ring per step
    g = doc["groups"]["nemo-perf"]
    assert g["predicted"] == g["runs"] == 29
    assert g["time"]["median_abs_error_pct"] <= 4.0  # 3.3 (4.8 at 1.5x)
    assert g["time"]["p90_abs_error_pct"] <= 8.0  # 7.2 (7.9 at 1.5x)
    # attention-bound at long sequences: with cuDNN attention at 1.5x FlashAttention-2 the H100 rows went from +2%
    # at 4K to +10.5% at 512K; at the measured 1.61x no trend is left
    longseq = [r["error"]["iteration_time"] for r in doc["runs"] if r["id"].startswith("nemo-longseq-llama2-7b-h100")]
    assert len(longseq) == 9 and all(abs(e) <= 0.04 for e in longseq), longseq
    # torchtitan's memory readings: per-op checkpointing, the loss (unfused; compiled from 2025-04) and FSDP's fp32
    # parameters
    assert doc["groups"]["torchtitan"]["memory"]["median_abs_error_pct"] <= 5.0
    trainy = {r["id"]: r for r in doc["runs"] if "trainy" in r["id"]}
    assert len(trainy) == 2
    for r in trainy.values():
        assert "cross_entropy=fused (torchtitan compiles the loss with torch.compile since 2025-04)" in r["assumed"]
        assert abs(r["error"]["peak_memory"]) <= 0.15, r["error"]  # +42% with the eager loss's 10 bytes per logit
    assert all("cross_entropy=unfused (torchtitan default)" in r["assumed"] for r in doc["runs"] if "2412" in r["id"])
    # the async-TP study (8B, TP 8 on 64 H100): vanilla TP with every DTensor collective exposed, async TP with the
    # forward's collectives and the backward's all-gathers pipelined with their GEMMs (the backward's reduce-scatters
    # are not fused: pytorch/pytorch#149946), Float8 with torchao's casts. The rowwise-Float8 pair, which the
    # authors flag as abnormal, is checked for its order only.
    study = {
        r["id"].removeprefix("torchtitan-2506-asynctp-8b-"): r["error"]["iteration_time"]
        for r in doc["runs"]
        if "asynctp" in r["id"] and "rowwise" not in r["id"]
    }
    assert len(study) == 4
    assert all(abs(e) <= 0.12 for e in study.values()), study  # bf16 async TP -11.1% (-18.0% with every one fused)
    assert abs(study["float8-tensorwise-async-tp"]) <= 0.06  # -5.3% (-11.9%)
    assert abs(study["float8-tensorwise-vanilla-tp"]) <= 0.05  # was -10.6% before the casts were priced
    time = {r["id"]: r["predicted"]["iteration_time_s"] for r in doc["runs"] if "asynctp" in r["id"]}
    for tp in ("vanilla-tp", "async-tp"):  # rowwise moves more bytes per cast than tensorwise (Fp8Casts)
        stem = "torchtitan-2506-asynctp-8b-float8-"
        assert time[f"{stem}rowwise-{tp}"] > time[f"{stem}tensorwise-{tp}"]


def test_the_training_stack_comes_from_the_stated_framework_else_the_source():
    from planner.runs import _Section, training_stack

    def stack(run):
        return training_stack(run, _Section(run, "parallel", "run"))

    assert stack({"parallel": {}, "source": {"title": "NVIDIA/NeMo docs performance_summary.md"}}) == "nemo"
    assert stack({"parallel": {}, "source_group": "torchtitan"}) == "torchtitan"
    assert stack({"parallel": {"framework": "Megatron-DeepSpeed"}, "source": {"title": "NeMo"}}) is None
    assert stack({"parallel": {}, "source": "a 2021 paper"}) is None


@pytest.mark.skipif(not MODERN.exists(), reason="shared/reference/measured-runs-modern.yaml not present")
def test_both_shared_files_report_every_source_group_and_file():
    import yaml

    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(RUNS), str(MODERN), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(proc.stdout)
    raw = yaml.safe_load(RUNS.read_text()) + yaml.safe_load(MODERN.read_text())
    groups = {e.get("source_group") or "(none)" for e in raw}
    assert set(doc["groups"]) == groups
    assert list(doc["groups"]) == sorted(groups)
    for group, s in doc["groups"].items():
        assert s["runs"] == sum((e.get("source_group") or "(none)") == group for e in raw)
    assert sum(s["runs"] for s in doc["groups"].values()) == doc["summary"]["runs"] == len(raw)
    assert [f["path"] for f in doc["files"]] == [str(RUNS), str(MODERN)]
    assert [f["summary"]["runs"] for f in doc["files"]] == [len(yaml.safe_load(p.read_text())) for p in (RUNS, MODERN)]
