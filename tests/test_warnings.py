"""Likely unit mistakes (planner.sanity: warnings, exit 0) and ambiguous GPU names (planner.catalog: bad input, exit 2).

Every shipped example and every measured run stays warning-free: a warning that fires on real jobs is noise.
The ``test_cli_wiring_*`` tests check the command line end to end (warnings on stderr and in the JSON).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.catalog import ambiguous_gpus, gpu_names, resolve_gpu
from planner.cli import main
from planner.errors import SpecError
from planner.load import load_job, parse_job
from planner.sanity import MAX_TOKENS_PER_ITERATION, JobWarning, job_warnings

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
SHARED = REPO.parent / "shared" / "reference"
MEASURED = [SHARED / "measured-runs.yaml", SHARED / "measured-runs-modern.yaml"]


def job(gpu="h100-sxm", seq=8192, gbs=512, precision="bf16", **extra) -> dict:
    raw = {
        "model": "llama3-8b",
        "cluster": [{"gpu": gpu, "nodes": 1, "gpus_per_node": 8}],
        "training": {"seq_length": seq, "global_batch_size": gbs, "precision": precision},
    }
    raw.update(extra)
    return raw


def lines(raw: dict) -> list[str]:
    return [w.line() for w in job_warnings(parse_job(raw))]


# ----------------------------------------------------------------------------- warnings


def test_warning_line():
    w = JobWarning("training.global_batch_size", "x")
    assert w.line() == "warning: training.global_batch_size: x"
    with pytest.raises(AttributeError):
        w.field = "y"  # frozen


def test_batch_in_tokens():
    assert lines(job(gbs=4194304)) == [
        "warning: training.global_batch_size: 4194304 sequences of 8192 tokens is 34.4B tokens per iteration; "
        "global_batch_size counts sequences: 4194304 tokens would be 512 sequences"
    ]


def test_batch_in_tokens_not_a_multiple_of_seq_length():
    (line,) = lines(job(seq=4096, gbs=100_000))
    assert line.startswith("warning: training.global_batch_size: 100000 sequences of 4096 tokens is 410M tokens")
    assert line.endswith("100000 tokens would be about 24 sequences")


def test_large_real_batches_are_quiet():
    # DeepSeek-V3: 15,360 sequences of 4,096 tokens (62.9M); the threshold itself is not above itself.
    assert lines(job(seq=4096, gbs=15360)) == []
    assert lines(job(seq=2**13, gbs=MAX_TOKENS_PER_ITERATION // 2**13)) == []
    assert lines(job(seq=2**13, gbs=MAX_TOKENS_PER_ITERATION // 2**13 + 1)) != []
    assert lines(job(seq=2**20, gbs=4)) == []  # 1M-token context-parallel runs (NeMo long-sequence)


def test_seq_length_is_batch_tokens():
    assert lines(job(seq=4194304, gbs=1024)) == [
        "warning: training.seq_length: 1024 sequences of 4194304 tokens is 4.3B tokens per iteration, and no "
        "published run trains on sequences over 1048576; seq_length is the length of one sequence: 4194304 tokens "
        "in 1024 sequences would be 4096 tokens each"
    ]


def test_gpu_memory_in_mib():
    assert lines(job(gpu={"base": "h100-sxm", "memory_gib": 81920})) == [
        "warning: cluster[0].gpu.memory_gib: 81920 GiB looks like MiB: 80 GiB"
    ]
    assert lines(job(gpu={"base": "h100-sxm", "memory_gib": 288})) == []  # MI355X / B300


def test_hbm_in_gbs():
    assert lines(job(gpu={"base": "h100-sxm", "hbm_tbps": 3350})) == [
        "warning: cluster[0].gpu.hbm_tbps: 3350 TB/s looks like GB/s: 3.35 TB/s"
    ]


def test_tflops_in_gflops():
    assert lines(
        job(
            gpu={
                "base": "a100-80gb",
                "peak_tflops_bf16": 312000,
                "peak_tflops_fp16": 312000,
                "matmul_tflops_bf16": None,
                "attention_tflops_bf16": None,
            }
        )
    ) == [
        "warning: cluster[0].gpu.peak_tflops_bf16: 312000 TFLOP/s looks like GFLOP/s: 312 TFLOP/s",
        "warning: cluster[0].gpu.peak_tflops_fp16: 312000 TFLOP/s looks like GFLOP/s: 312 TFLOP/s",
    ]


def test_scale_up_in_mbs():
    assert lines(job(gpu={"base": "h100-sxm", "intra_node_gbps": 450000})) == [
        "warning: cluster[0].gpu.intra_node_gbps: 450000 GB/s looks like MB/s: 450 GB/s"
    ]


def test_nic_in_mbps():
    assert lines(job(gpu={"base": "h100-sxm", "inter_node_gbps": 400000})) == [
        "warning: cluster[0].gpu.inter_node_gbps: 400000 Gb/s looks like Mb/s: 400 Gb/s"
    ]
    raw = job()
    raw["cluster"] = [
        {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8, "inter_node_gbps": 200000},
        {"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
    ]
    raw["links"] = [{"groups": [0, 1], "gbps": 100000}]
    assert lines(raw) == [
        "warning: cluster[0].inter_node_gbps: 200000 Gb/s looks like Mb/s: 200 Gb/s",
        "warning: links[0].gbps: 100000 Gb/s looks like Mb/s: 100 Gb/s",
    ]


def test_fp8_without_fp8_tensor_cores():
    assert lines(job(gpu="a100-80gb", precision="fp8")) == [
        "warning: training.precision: a100-80gb has no FP8 tensor cores (no peak_tflops_fp8); priced as bf16"
    ]
    assert lines(job(gpu="h100-sxm", precision="fp8")) == []
    assert lines(job(gpu="a100-80gb", precision="bf16")) == []


def test_fp8_warning_is_true():
    """What the warning says: fp8 on a GPU without an FP8 peak is priced exactly as bf16."""
    from planner.cost.estimate import estimate

    layout = {"tp": 8, "pp": 1}
    fp8 = estimate(parse_job(job(gpu="a100-80gb", precision="fp8", layout=layout)))
    bf16 = estimate(parse_job(job(gpu="a100-80gb", precision="bf16", layout=layout)))
    assert fp8.to_json() == bf16.to_json()


def test_fp8_in_a_mixed_cluster_names_only_the_gpus_without_it():
    raw = job(precision="fp8")
    raw["cluster"] = [
        {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8},
        {"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
        {"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 8},
        {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 8},
    ]
    assert [w.message.split()[0] for w in job_warnings(parse_job(raw))] == ["a100-80gb", "a100-40gb"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(REPO / "examples")) for p in EXAMPLES])
def test_shipped_examples_are_warning_free(path):
    assert job_warnings(load_job(path)) == []


def test_examples_were_found():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", MEASURED, ids=[p.name for p in MEASURED])
def test_measured_runs_are_warning_free(path):
    if not path.exists():
        pytest.skip(f"{path} not present")
    from planner.runs import RunCase, load_runs

    cases = [c for c in load_runs(path) if isinstance(c, RunCase)]
    assert cases
    assert {c.run_id: job_warnings(c.job) for c in cases if job_warnings(c.job)} == {}
    # The runs the planner cannot express (skipped) are checked on their raw numbers.
    for run in yaml.safe_load(path.read_text()):
        seq, gbs = run["model"].get("seq_len"), run["parallel"].get("global_batch")
        if seq and gbs:
            assert seq * gbs <= MAX_TOKENS_PER_ITERATION, run["id"]


# ----------------------------------------------------------------------------- ambiguous GPU names

AMBIGUOUS = {
    "A100": ["a100-40gb (40 GiB)", "a100-80gb (80 GiB)"],
    "a100-sxm": ["a100-40gb (40 GiB)", "a100-80gb (80 GiB)"],
    "a100-sxm4": ["a100-40gb (40 GiB)", "a100-80gb (80 GiB)"],
    "h100": ["h100-sxm (80 GiB, 450 GB/s scale-up)", "h100-pcie (80 GiB, 63 GB/s scale-up)"],
    "H100-80GB": ["h100-sxm (80 GiB, 450 GB/s scale-up)", "h100-pcie (80 GiB, 63 GB/s scale-up)"],
    "V100": ["v100-32gb (32 GiB)", "{base: v100-32gb, memory_gib: 16} (16 GiB)"],
    "v100-sxm2": ["v100-32gb (32 GiB)", "{base: v100-32gb, memory_gib: 16} (16 GiB)"],
    "tesla-v100": ["v100-32gb (32 GiB)", "{base: v100-32gb, memory_gib: 16} (16 GiB)"],
}


def test_ambiguous_message():
    with pytest.raises(SpecError) as exc:
        parse_job(job(gpu="A100"))
    assert exc.value.line() == (
        "error: cluster[0].gpu: 'A100' is ambiguous: a100-40gb (40 GiB), a100-80gb (80 GiB); name one"
    )


@pytest.mark.parametrize("name", sorted(AMBIGUOUS))
def test_ambiguous_gpu_name(name):
    raw = job()
    raw["cluster"] = [{"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}, {"gpu": name, "nodes": 1}]
    with pytest.raises(SpecError) as exc:
        parse_job(raw)
    assert exc.value.field == "cluster[1].gpu"
    assert exc.value.message == f"'{name}' is ambiguous: {', '.join(AMBIGUOUS[name])}; name one"


def test_every_declared_ambiguous_name_is_tested():
    assert set(ambiguous_gpus()) == {n.lower() for n in AMBIGUOUS}


def test_ambiguous_base_of_an_inline_gpu():
    with pytest.raises(SpecError) as exc:
        parse_job(job(gpu={"base": "a100", "memory_gib": 40}))
    assert exc.value.field == "cluster[0].gpu.base" and "is ambiguous: a100-40gb" in exc.value.message


def test_ambiguous_names_are_no_entry_and_their_variants_resolve():
    for name, choices in ambiguous_gpus().items():
        assert name not in gpu_names()
        for choice in choices:
            resolve_gpu(choice)


def test_variants_stay_reachable_by_their_own_names():
    for alias, name in [
        ("a100-sxm4-80gb", "a100-80gb"),
        ("a100-80g", "a100-80gb"),
        ("a100-sxm4-40gb", "a100-40gb"),
        ("h100-sxm5", "h100-sxm"),
        ("dgx-h100", "h100-sxm"),
        ("h100-pcie-80gb", "h100-pcie"),
        ("v100-sxm2-32gb", "v100-32gb"),
    ]:
        assert resolve_gpu(alias).name == name


def test_ambiguous_gpu_is_bad_input(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(gpu="A100", layout={"tp": 8})))
    with pytest.raises(SystemExit) as exc:
        main(["estimate", str(path), "--json"])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""
    assert captured.err == (
        "error: cluster[0].gpu: 'A100' is ambiguous: a100-40gb (40 GiB), a100-80gb (80 GiB); name one\n"
    )


# ----------------------------------------------------------------------------- command line (planner/cli.py wiring)


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(gbs=4194304, layout={"tp": 8})))
    return subprocess.run(
        [sys.executable, "-m", "planner", args[0], str(path), *args[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_wiring_estimate_json_reports_warnings(tmp_path):
    proc = _run(tmp_path, "estimate", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "warning: training.global_batch_size: 4194304 sequences of 8192 tokens" in proc.stderr
    warnings = json.loads(proc.stdout)["warnings"]
    assert [w["field"] for w in warnings] == ["training.global_batch_size"]
    assert "4194304 tokens would be 512 sequences" in warnings[0]["message"]


def test_cli_wiring_estimate_text_prints_warnings(tmp_path):
    proc = _run(tmp_path, "estimate")
    assert proc.returncode == 0, proc.stderr
    assert "warning: training.global_batch_size:" in proc.stderr


def test_cli_wiring_plan_json_reports_warnings(tmp_path):
    proc = _run(tmp_path, "plan", "--json", "--top", "1", "--time-limit", "20")
    assert proc.returncode in (0, 3), proc.stderr
    assert "warning: training.global_batch_size:" in proc.stderr
    assert [w["field"] for w in json.loads(proc.stdout)["warnings"]] == ["training.global_batch_size"]


def test_cli_wiring_no_warnings_for_an_example():
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "estimate", str(REPO / "examples/llama3-70b-h100.yaml"), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning:" not in proc.stderr and json.loads(proc.stdout)["warnings"] == []
