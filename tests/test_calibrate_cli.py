"""`planner calibrate` fits the global efficiencies to the user's runs and writes a file of the user's own, which
`--calibration` and a job's `calibration:` then price with; the repository's catalog is never touched."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = ROOT / "planner" / "data" / "calibration.yaml"


def cli(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


def run(i: int, layers: int, hidden: int, tp: int, dp: int, mb: int, measured_s: float) -> dict:
    return {
        "id": f"run-{i}",
        "model": {"layers": layers, "hidden": hidden, "heads": hidden // 128, "vocab": 32000, "seq_len": 4096,
                  "arch": "llama swiglu untied flash", "ffn_hidden": int(hidden * 3.5)},
        "hardware": {"gpu": "h100-sxm", "n_gpus": tp * dp, "gpus_per_node": 8},
        "parallel": {"tp": tp, "pp": 1, "dp": dp, "micro_batch": mb, "global_batch": 64, "sp": tp > 1,
                     "distributed_optimizer": True, "recompute": "none", "precision": "bf16"},
        "measured": {"iteration_time_s": measured_s},
    }  # fmt: skip


def test_calibrate_writes_a_file_that_lowers_the_error(tmp_path):
    shapes = [(16, 2048, 1, 8, 1), (24, 3072, 2, 8, 1), (32, 4096, 4, 4, 1)]
    runs = [run(i, *s, measured_s=1.0) for i, s in enumerate(shapes)]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(runs))
    predicted = json.loads(cli("validate", str(path), "--json").stdout)
    # measured = 1.6 x the built-in prediction: the GPU here is slower than the catalog's efficiencies say
    for r, p in zip(runs, predicted["runs"]):
        r["measured"]["iteration_time_s"] = round(1.6 * p["predicted"]["iteration_time_s"], 4)
    path.write_text(yaml.safe_dump(runs))
    builtin_before = BUILTIN.read_text()
    out = cli("calibrate", str(path), "-o", str(tmp_path / "calib.yaml"))
    assert out.returncode == 0, out.stderr
    assert BUILTIN.read_text() == builtin_before
    calib = yaml.safe_load((tmp_path / "calib.yaml").read_text())
    assert calib["schema_version"] == 1 and calib["gemm_efficiency"] < 0.775
    after = json.loads(cli("validate", str(path), "--json", "--calibration", str(tmp_path / "calib.yaml")).stdout)
    assert after["summary"]["time"]["median_abs_error_pct"] < predicted["summary"]["time"]["median_abs_error_pct"] / 2
    # a job names the file: the estimate is priced with it and says so
    job = {"model": "llama3-8b", "cluster": [{"gpu": "h100-sxm", "nodes": 1}], "calibration": "calib.yaml",
           "training": {"seq_length": 4096, "global_batch_size": 64},
           "layout": {"tp": 2, "dp": 4, "micro_batch_size": 1}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    est = json.loads(cli("estimate", str(tmp_path / "job.yaml"), "--json").stdout)
    assert est["cost_model"]["calibration"]["gemm_efficiency"] == calib["gemm_efficiency"]
    assert est["cost_model"]["calibration_file"].endswith("calib.yaml")


def test_calibrate_without_expressible_runs_is_bad_input(tmp_path):
    path = tmp_path / "runs.yaml"
    path.write_text(
        yaml.safe_dump([{"id": "x", "model": {"layers": 2}, "hardware": {}, "parallel": {}, "measured": {}}])
    )
    out = cli("calibrate", str(path), "-o", str(tmp_path / "c.yaml"))
    assert out.returncode == 2 and out.stderr.startswith("error: runs: ")
    assert not (tmp_path / "c.yaml").exists()


def test_bad_calibration_file_names_the_field(tmp_path):
    (tmp_path / "c.yaml").write_text("gemm_efficiency: 3\n")
    out = cli("estimate", "examples/llama3-70b-h100.yaml", "--calibration", str(tmp_path / "c.yaml"))
    assert out.returncode == 2 and out.stderr.startswith("error: --calibration.gemm_efficiency: ")


LOG = ROOT / "tests" / "fixtures" / "logs" / "megatron-llama3-8b-tp2.log"


def test_a_megatron_log_is_a_measured_run():
    from planner.profile.megatron_log import read_log

    case = read_log(LOG, gpu="h100-sxm")
    lay = case.job.layout
    assert (lay.tp, lay.pp, lay.dp, lay.micro_batch_size, lay.zero_stage) == (2, 1, 4, 1, 1)
    assert case.job.model.num_layers == 32 and case.job.model.vocab_size == 128256
    assert abs(case.measured.iteration_time_s - 5.00865) < 1e-12  # median after the first (warm-up) interval
    assert case.measured.memory_gib == 61100.0 / 1024  # the largest max reserved over ranks


def test_a_megatron_fp8_log_reads_its_format_and_recipe(tmp_path):
    """Megatron prints --fp8-format under its dest ``fp8`` (``fp8 ... hybrid``) and --fp8-recipe as ``fp8_recipe``."""
    from planner.profile.megatron_log import read_log

    text = LOG.read_text()
    head, sep, tail = text.partition("  fp16 ")
    assert sep, "the fixture prints its fp16 argument"
    fp8_log = tmp_path / "fp8.log"
    fp8_log.write_text(
        head + "  fp8 ............................................. hybrid\n"
        "  fp8_recipe ...................................... tensorwise\n" + sep + tail
    )
    t = read_log(fp8_log, gpu="h100-sxm").job.training
    assert (t.precision, t.fp8_recipe) == ("fp8", "tensorwise")
    assert read_log(LOG, gpu="h100-sxm").job.training.precision != "fp8"


def test_calibrate_reads_megatron_logs(tmp_path):
    out = cli("calibrate", str(LOG), "--gpu", "h100-sxm", "-o", str(tmp_path / "c.yaml"))
    assert out.returncode == 0, out.stderr
    assert "1 runs" in out.stdout and (tmp_path / "c.yaml").exists()
    no_gpu = cli("calibrate", str(LOG), "-o", str(tmp_path / "d.yaml"))
    assert no_gpu.returncode == 2 and no_gpu.stderr.startswith("error: --gpu: ")
    truncated = tmp_path / "cut.log"
    truncated.write_text("\n".join(LOG.read_text().splitlines()[:10]) + "\n elapsed time per iteration (ms): 1.0\n")
    bad = cli("calibrate", str(truncated), "--gpu", "h100-sxm", "-o", str(tmp_path / "e.yaml"))
    assert bad.returncode == 2 and "cut.log" in bad.stderr and "truncated" in bad.stderr
