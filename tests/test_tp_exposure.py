"""What TP communication a layer exposes: per training stack (planner/cost/stage.py tp_exposed) and, when TP
collectives are overlapped with GEMMs, per collective and its GEMM (stage.tp_overlap_share)."""

import json
import subprocess
import sys

import pytest

from planner.cost.estimate import estimate
from planner.cost.stage import tp_exposed, tp_overlap_share
from planner.load import parse_job


def test_megatron_hides_the_backward_and_dtensor_does_not():
    assert tp_exposed(1.0, "none", backward_overlap=True) == (2.0, 1.0)
    assert tp_exposed(1.0, "none", backward_overlap=False) == (4.0, 2.0)  # 2 forward + 2 backward; rerun 2


def test_per_op_checkpointing_reruns_the_all_gathers_it_did_not_keep():
    # torchtitan's SAC keeps reduce-scatter outputs, not all-gather outputs: one all-reduce's bytes again
    assert tp_exposed(1.0, "op", backward_overlap=False) == (5.0, 1.0)
    base, full_extra = tp_exposed(1.0, "op", backward_overlap=False)
    assert base + full_extra == sum(tp_exposed(1.0, "none", backward_overlap=False))  # full: the whole forward


def test_a_collective_under_a_long_gemm_is_hidden_and_one_over_a_short_gemm_shows():
    assert tp_overlap_share(1.0, (10.0, 10.0, 10.0, 10.0), 8) == 0.0
    assert tp_overlap_share(1.0, (0.0, 0.0, 0.0, 0.0), 8) == 1.0
    # c - g (tp-1)/tp for the short ones (Wang et al. 2023 decomposition: the last GEMM chunk is after the last
    # transfer), nothing for the long ones
    share = tp_overlap_share(1.0, (0.5, 0.4, 3.0, 2.0), 8)
    assert share == pytest.approx(((1 - 0.5 * 7 / 8) + (1 - 0.4 * 7 / 8)) / 4)


def _job(tp_backward_overlap: bool, tp_comm_overlap: bool):
    # the torchtitan async-TP study's shape: Llama 3.1 8B, TP 8 x FSDP 8 on 64 H100, 12 x 8K tokens per TP group
    return parse_job(
        {
            "model": "llama3-8b",
            "cluster": [{"gpu": "h100-sxm", "nodes": 8, "gpus_per_node": 8}],
            "training": {"seq_length": 8192, "global_batch_size": 96, "tp_backward_overlap": tp_backward_overlap},
            "layout": {
                "tp": 8,
                "dp": 8,
                "zero_stage": 3,
                "micro_batch_size": 12,
                "recompute": "op",
                "tp_comm_overlap": tp_comm_overlap,
            },
        }
    )


def test_the_estimate_prices_the_stack_and_the_overlap():
    tp = {
        (b, o): estimate(_job(b, o), _job(b, o).layout).time_breakdown_s["tp_comm"]
        for b in (True, False)
        for o in (False, True)
    }
    # DTensor exposes 5 all-reduces a layer under per-op checkpointing, Megatron's linears 2 (+1 rerun gathers)
    assert tp[False, False] / tp[True, False] == pytest.approx(5 / 3)
    # overlap hides the MLP's collectives under its long GEMMs but not the attention's (GQA: short projections):
    # Megatron + TE pipelines every collective; PyTorch's async TP fuses the forward's and the backward's gathers
    # (3 all-reduces' worth) but not the backward's reduce-scatters nor the re-gathered inputs (2)
    share = tp[True, True] / tp[True, False]
    assert 0.0 < share < 0.5
    unit = tp[False, False] / 5
    assert tp[False, True] == pytest.approx(share * 3 * unit + 2 * unit)


def test_async_tp_fuses_the_forward_and_the_backward_gathers_only():
    # pytorch/pytorch#149946: no matmul -> reduce-scatter pattern in the backward graph (its input is a sum)
    assert tp_exposed(1.0, "none", backward_overlap=False, overlap_share=0.0) == (1.0, 0.0)
    assert tp_exposed(1.0, "op", backward_overlap=False, overlap_share=0.0) == (2.0, 0.0)
    assert tp_exposed(1.0, "none", backward_overlap=False, overlap_share=1.0) == tp_exposed(1.0, "none", False)
    assert tp_exposed(1.0, "op", backward_overlap=False, overlap_share=1.0) == tp_exposed(1.0, "op", False)
    # Megatron + Transformer Engine userbuffers: every collective pipelined
    assert tp_exposed(1.0, "none", backward_overlap=True, overlap_share=0.5) == (1.0, 0.5)


def test_plan_for_torchtitan_prices_dtensor_tp_unless_the_job_says(tmp_path):
    def planned(training_extra: dict) -> dict:
        job = tmp_path / "job.json"
        job.write_text(
            json.dumps(
                {
                    "model": "llama3-8b",
                    "cluster": [{"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}],
                    "training": {"seq_length": 8192, "global_batch_size": 32, **training_extra},
                }
            )
        )
        cmd = [sys.executable, "-m", "planner", "plan", str(job), "--json", "--framework", "torchtitan"]
        proc = subprocess.run(cmd + ["--time-limit", "20"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["job"]["training"]

    assert planned({})["tp_backward_overlap"] is False
    assert planned({"tp_backward_overlap": True})["tp_backward_overlap"] is True
