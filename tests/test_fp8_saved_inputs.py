"""FP8 training under Transformer Engine keeps the FP8-cast inputs of its linear layers for the backward; torchao's
Float8Linear (torchtitan) keeps the 16-bit ones (planner/cost/memory.py activation_bytes_per_layer, fp8_inputs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.cost import memory as M

MODERN = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured-runs-modern.yaml"


@pytest.mark.parametrize("sp", [False, True])
def test_the_qkv_fc1_and_fc2_inputs_take_one_byte(sp):
    m = resolve_model("llama3-8b")
    t, tp = 8192, 4
    kw = {"tokens": t, "seq": t, "tp": tp, "sp": sp, "flash": True, "recompute": "none", "moe": False}
    saved = M.activation_bytes_per_layer(m, **kw) - M.activation_bytes_per_layer(m, **kw, fp8_inputs=True)
    h, f = m.hidden_size, m.ffn_hidden_size
    # QKV and fc1 inputs (replicated over TP unless SP splits them) and the fc2 input (split by TP): 1 byte less each
    assert saved == pytest.approx(2 * t * h / (tp if sp else 1) + t * f / tp)
    # full recompute keeps the 16-bit layer input either way
    full = {**kw, "recompute": "full"}
    assert M.activation_bytes_per_layer(m, **full) == M.activation_bytes_per_layer(m, **full, fp8_inputs=True)


def test_an_fp8_job_states_which_kernels_it_runs(tmp_path):
    def planned(framework: list[str]) -> dict:
        job = tmp_path / "job.json"
        job.write_text(
            json.dumps(
                {
                    "model": "llama3-8b",
                    "cluster": [{"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}],
                    "training": {"seq_length": 8192, "global_batch_size": 32, "precision": "fp8"},
                }
            )
        )
        cmd = [sys.executable, "-m", "planner", "plan", str(job), "--json", "--time-limit", "20", *framework]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["job"]["training"]

    assert planned([])["fp8_saved_inputs"] is True  # the default: Transformer Engine (Megatron, NeMo)
    assert planned(["--framework", "torchtitan"])["fp8_saved_inputs"] is False


@pytest.mark.skipif(not MODERN.exists(), reason="shared/reference/measured-runs-modern.yaml not present")
def test_nemo_gpt3_175b_on_512_h100_fits_as_it_ran():
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(MODERN), "--json"], capture_output=True, text=True, check=True
    )
    runs = {r["id"]: r for r in json.loads(proc.stdout)["runs"]}
    # NeMo's recipe ran it without recompute on 80 GB: with 16-bit saved inputs it came out at 84 GiB
    gpt3 = runs["nemo2407-gpt3-175b-512gpu"]
    assert gpt3["layout"]["recompute"] == "none" and gpt3["predicted"]["fits"]
    titan = [r for r in runs.values() if r["id"].startswith("torchtitan") and "float8" in r["id"]]
    assert titan and all("fp8_saved_inputs=false (torchao Float8Linear, torchtitan)" in r["assumed"] for r in titan)
