"""planner/runs.py reads what published runs leave unstated: presets by name, framework defaults, flagged
inconsistencies, GPUs the catalog does not know; one malformed run is skipped, not the whole file."""

import copy

import pytest
import yaml

from planner.errors import SpecError
from planner.runs import RunCase, Skipped, load_runs

RUN = {
    "id": "r0",
    "source_group": "nemo-perf",
    "source": {"title": "NVIDIA/NeMo docs performance_summary.md"},
    "model": {"name": "LLAMA2-7B", "seq_len": 4096},
    "hardware": {"gpu": "H100-SXM5-80GB", "n_gpus": 8, "gpus_per_node": 8},
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 128, "precision": "fp8"},
    "measured": {"tflops_per_gpu": 500, "tflops_definition": "Megatron model TFLOP/s per GPU"},
}


def read(tmp_path, *runs):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(list(runs)))
    return load_runs(path)


def run(**changes):
    r = copy.deepcopy(RUN)
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        r[section][key] = value
    return r


def test_a_model_named_without_dimensions_takes_its_presets_dimensions(tmp_path):
    (case,) = read(tmp_path, RUN)
    assert isinstance(case, RunCase)
    m = case.job.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size, m.mlp) == (32, 4096, 11008, 32000, "swiglu")
    assert any("from preset llama2-7b" in a for a in case.assumed)


def test_stated_dimensions_win_over_the_preset(tmp_path):
    (case,) = read(tmp_path, run(model__layers=16))
    assert case.job.model.num_layers == 16
    assert case.job.model.hidden_size == 4096  # the rest from the preset


def test_an_unknown_model_without_dimensions_is_skipped_with_the_reason(tmp_path):
    (case,) = read(tmp_path, run(model__name="GPT-7.1B"))
    assert isinstance(case, Skipped)
    assert case.reason == "model.hidden is not stated and the model name is no known preset"


def test_nemo_defaults_flash3_attention_bf16_gradients_distributed_optimizer(tmp_path):
    (case,) = read(tmp_path, RUN)
    assert case.job.training.attention == "flash3"
    assert case.job.training.grad_dtype == "bf16"
    assert case.layout_choices[0].zero_stage == 1
    assert case.source_group == "nemo-perf"


def test_float8_linears_are_fp8(tmp_path):
    (case,) = read(tmp_path, run(parallel__precision="bf16 + float8 linear (torchao)"))
    assert case.job.training.precision == "fp8"


def test_torchtitan_seq_len_default(tmp_path):
    r = run(model__seq_len=None)
    r["source"] = {"title": "pytorch/torchtitan benchmarks"}
    r["source_group"] = "torchtitan"
    (case,) = read(tmp_path, r)
    assert case.job.training.seq_length == 8192
    assert "seq_len=8192 (torchtitan default)" in case.assumed


def test_async_tp_overlaps_tp_communication(tmp_path):
    (case,) = read(tmp_path, run(parallel__tp=8, parallel__dp=1, parallel__async_tp=True))
    assert case.layout_choices[0].tp_comm_overlap


def test_flagged_inconsistent_degrees_keep_the_degrees(tmp_path):
    r = run(parallel__dp=2)
    r["flags"] = ["inconsistent: TP*PP*DP*CP = GPUs/4"]
    (case,) = read(tmp_path, r)
    assert isinstance(case, RunCase)
    assert case.job.num_gpus == 2 and case.layout_choices[0].dp == 2
    assert any(a.startswith("n_gpus=2 (stated 8") for a in case.assumed)
    # the same mismatch without the flag is not guessed at
    (plain,) = read(tmp_path, run(parallel__dp=2))
    assert isinstance(plain, Skipped) and "the cluster has 8 GPUs" in plain.reason


def test_a_gpu_the_catalog_does_not_know_is_built_from_its_family(tmp_path):
    # closest in memory: h100-sxm and h100-pcie (80 GiB); of those the family's flagship, h100-sxm
    (case,) = read(tmp_path, run(hardware__gpu="H100-HBM3e-Custom", hardware__mem_gb=82))
    gpu = case.job.cluster[0].gpu
    assert gpu.memory_gib == 82 and gpu.peak_tflops_bf16 == 989
    assert any(a.startswith("gpu=H100-HBM3e-Custom built from h100-sxm") for a in case.assumed)
    (other,) = read(tmp_path, run(hardware__gpu="Zeta-9000", hardware__mem_gb=82))
    assert isinstance(other, Skipped) and "no catalog GPU is of its family" in other.reason


def test_one_malformed_run_is_skipped_with_its_field_not_the_file(tmp_path):
    bad = run(parallel__vpp="interleaved (value not stated)")
    bad["id"] = "bad"
    cases = read(tmp_path, bad, RUN)
    assert isinstance(cases[0], Skipped) and cases[0].reason.startswith("runs[0].parallel.vpp: expected an integer")
    assert isinstance(cases[1], RunCase)


def test_a_file_whose_every_run_is_malformed_is_bad_input(tmp_path):
    with pytest.raises(SpecError) as err:
        read(tmp_path, run(parallel__tp=0))
    assert err.value.field == "runs[0].parallel.tp"


@pytest.mark.parametrize(
    "text, layers, stages",
    [
        ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", 30, [7, 8, 8, 7]),
        ("--account-for-embedding-in-pipeline-split", 31, [7, 8, 8, 8]),
        ("account-for-loss", 31, [8, 8, 8, 7]),
    ],
)
def test_megatron_embedding_and_loss_take_pipeline_slots(tmp_path, text, layers, stages):
    r = run(parallel__pp=4, parallel__dp=2, parallel__pp_partition=text, model__layers=layers)
    (case,) = read(tmp_path, r)
    assert [s.layers for s in case.layout_choices[0].stages] == stages


def test_torchtitan_runs_price_its_unfused_loss(tmp_path):
    from planner.cost.memory import logits_bytes

    r = run()
    r["source"] = {"title": "pytorch/torchtitan benchmarks"}
    r["source_group"] = "torchtitan"
    (case,) = read(tmp_path, r)
    assert case.job.training.cross_entropy == "unfused"
    m = case.job.model
    assert logits_bytes(m, 4096, 1, "unfused") == 2.5 * logits_bytes(m, 4096, 1, "fused") == 10.0 * 4096 * m.vocab_size
    (nemo,) = read(tmp_path, RUN)
    assert nemo.job.training.cross_entropy == "fused"


def test_a_gpu_built_from_its_family_scales_every_compute_rate_with_the_stated_peak(tmp_path):
    from planner.catalog import resolve_gpu

    r = run(hardware__gpu="H100-Custom", hardware__mem_gb=82, hardware__peak_tflops_16bit=989 / 2)
    (case,) = read(tmp_path, r)
    built, base = case.job.cluster[0].gpu, resolve_gpu("h100-sxm")
    for key in ("peak_tflops_bf16", "peak_tflops_fp8", "matmul_tflops_bf16", "attention_tflops_bf16"):
        assert getattr(built, key) == pytest.approx(getattr(base, key) / 2)
    assert built.attention3_tflops_bf16 == pytest.approx(base.attention3_tflops_bf16 / 2)


@pytest.mark.parametrize(
    "title, compile_on, loss",
    [
        ("pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy.md", True, "fused"),  # compiled loss
        ("pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md", True, "fused"),
        ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md", True, "unfused"),  # before #1033
        ("pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy.md", False, "unfused"),  # eager
        ("pytorch/torchtitan benchmarks", True, "unfused"),  # no date: the eager loss
    ],
)
def test_torchtitan_compiles_its_loss_from_2025_04_when_compile_is_on(tmp_path, title, compile_on, loss):
    r = run(parallel__torch_compile=compile_on)
    r["source"] = {"title": title}
    r["source_group"] = "torchtitan"
    (case,) = read(tmp_path, r)
    assert case.job.training.cross_entropy == loss


def test_pytorch_fsdp_keeps_fp32_parameters_as_the_master_copy(tmp_path):
    from planner.cost.memory import model_state_bytes

    # 16 bytes per parameter under FSDP (fp32 shard, fp32 gradient, Adam's two moments), 18 with a 16-bit copy
    fsdp = model_state_bytes(1.0, 1, 3, "fp32", "adam", fp32_params=True)
    assert fsdp == {"weights": 4.0, "gradients": 4.0, "optimizer": 8.0}
    assert sum(model_state_bytes(1.0, 1, 3, "fp32", "adam").values()) == 18.0
    assert sum(model_state_bytes(1.0, 8, 3, "fp32", "adam", fp32_params=True).values()) == 2.0
    for zero in (0, 1, 2):  # below ZeRO-3 the 16-bit parameters stay resident: as without
        assert model_state_bytes(1.0, 8, zero, "fp32", "adam", True) == model_state_bytes(1.0, 8, zero, "fp32", "adam")

    composer = run(parallel__zero=3, parallel__framework="Composer + PyTorch FSDP", parallel__precision="bf16")
    composer["source"] = {"title": "mosaicml/llm-foundry benchmarking README"}
    composer["source_group"] = "llm-foundry"
    titan = run(parallel__zero="FSDP2", parallel__precision="bf16")
    titan["source"] = {"title": "pytorch/torchtitan benchmarks"}
    titan["source_group"] = "torchtitan"
    megatron = run(parallel__zero=3, parallel__framework="Megatron-DeepSpeed", parallel__precision="bf16")
    replicated = run(parallel__framework="Composer + PyTorch FSDP", parallel__zero=0, parallel__precision="bf16")
    for i, r in enumerate((composer, titan, megatron, replicated)):
        r["id"] = f"r{i}"
    cases = read(tmp_path, composer, titan, megatron, replicated)
    assert [c.job.training.fp32_params for c in cases] == [True, True, False, False]
    assert "fp32_params=true (PyTorch FSDP keeps fp32 parameters, cast when gathered)" in cases[0].assumed


@pytest.mark.parametrize(
    "title, sp",
    [
        ("Smith et al. 2022, 'Using DeepSpeed and Megatron to Train MT-NLG 530B' (arXiv 2201.11990)", False),
        ("Zeng et al. 2022, 'GLM-130B' (arXiv 2210.02414)", True),  # after arXiv 2205.05198
        ("NVIDIA/Megatron-LM README.md (commit f2e5db402c, 2024-07)", True),
        ("a blog post", True),  # no date: Megatron-Core practice
    ],
)
def test_unstated_sequence_parallelism_is_off_where_the_source_predates_it(tmp_path, title, sp):
    r = run(parallel__tp=8, parallel__dp=1)
    r["source"] = {"title": title}
    r["source_group"] = "other"
    (case,) = read(tmp_path, r)
    assert all(layout.sequence_parallel is sp for layout in case.layout_choices)
    if not sp:
        assert "sp=false (the source, 2022-01, predates sequence parallelism, 2022-05)" in case.assumed
    stated = run(parallel__tp=8, parallel__dp=1, parallel__sp=True)
    stated["source"] = {"title": title}
    (case,) = read(tmp_path, stated)
    assert all(layout.sequence_parallel for layout in case.layout_choices)  # a stated value wins


@pytest.mark.parametrize(
    "framework, title, tp, synchronous",
    [
        ("Megatron-DeepSpeed", "bigscience-workshop/bigscience chronicles-prequel.md", 4, True),
        ("DeepSpeed (PP, DP/ZeRO) + Megatron (TP)", "Smith et al. 2022 (arXiv 2201.11990)", 8, True),
        (None, "Narayanan et al. 2021, 'Efficient Large-Scale ...' (SC'21, arXiv 2104.04473)", 8, True),
        (None, "Narayanan et al. 2021, 'Efficient Large-Scale ...' (SC'21, arXiv 2104.04473)", 1, False),  # no TP
        ("Megatron-LM", "NVIDIA/Megatron-LM README.md (commit f2e5db402c, 2024-07)", 8, False),
        ("DeepSpeed ZeRO-3 (no model parallelism)", "a 2021 paper", 8, False),  # DeepSpeed without Megatron's TP
    ],
)
def test_megatron_tp_layers_of_2021_22_all_reduce_the_input_gradient_on_the_critical_path(
    tmp_path, framework, title, tp, synchronous
):
    r = run(parallel__tp=tp, parallel__dp=8 // tp, parallel__precision="bf16")
    r["source"], r["source_group"] = {"title": title}, "other"
    if framework:
        r["parallel"]["framework"] = framework
    (case,) = read(tmp_path, r)
    assert case.job.training.tp_backward_overlap is not synchronous
    note = "tp_backward_overlap=false (Megatron's TP layers before the asynchronous all-reduce)"
    assert (note in case.assumed) is synchronous
