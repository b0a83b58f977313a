"""GPU variants added to planner/data/gpus.yaml: H100 96 GB HBM2e (torchtitan's Grand Teton H100), H100 NVL, H20,
GH200, B300, GB300, MI325X, MI355X."""

from __future__ import annotations

import pytest

from planner.catalog import aliases, ambiguous_gpus, gpu_names, resolve_gpu
from planner.sanity import MAX_HBM_TBPS, MAX_MEMORY_GIB, MAX_NIC_GBPS, MAX_SCALE_UP_GBPS, MAX_TFLOPS

NEW_GPUS = ["h100-96gb-hbm2e", "h100-nvl", "h20", "gh200", "b300", "gb300", "mi325x", "mi355x"]


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_gpu_resolves_with_a_source(name):
    assert name in gpu_names()
    gpu = resolve_gpu(name)
    assert gpu.name == name
    assert gpu.source != "user supplied" and ("http" in gpu.source or "/" in gpu.source)
    for alias in aliases("gpus", name):
        assert resolve_gpu(alias).name == name
        assert resolve_gpu(alias.upper()).name == name


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_gpu_numbers_are_in_catalog_units(name):
    gpu = resolve_gpu(name)
    assert 0 < gpu.memory_gib <= MAX_MEMORY_GIB and 0 < gpu.hbm_tbps <= MAX_HBM_TBPS
    assert 0 < gpu.intra_node_gbps <= MAX_SCALE_UP_GBPS and 0 < gpu.inter_node_gbps <= MAX_NIC_GBPS
    assert gpu.peak_tflops_fp16 == gpu.peak_tflops_bf16
    assert gpu.peak_tflops_bf16 < gpu.peak_tflops_fp8 <= MAX_TFLOPS  # every new GPU has FP8 tensor cores
    for rate in (gpu.matmul_tflops_bf16, gpu.attention_tflops_bf16):
        assert rate is None or rate < gpu.peak_tflops_bf16


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_gpu_names_are_not_ambiguous(name):
    taken = set(ambiguous_gpus())
    assert not {name, *(a.lower() for a in aliases("gpus", name))} & taken


@pytest.mark.parametrize("spelling", ["H100-96GB-HBM2e", "h100-96gb-hbm2e", "h100-hbm2e-96gb", "grand-teton-h100"])
def test_torchtitan_h100_resolves(spelling):
    assert resolve_gpu(spelling).name == "h100-96gb-hbm2e"


def test_torchtitan_h100_lies_between_nvl_and_sxm():
    """torchtitan: "the actual peak TFLOPs number is between SXM and NVL, and we don't know its exact value"."""
    h100, nvl, sxm = resolve_gpu("H100-96GB-HBM2e"), resolve_gpu("h100-nvl"), resolve_gpu("h100-sxm")
    for field in ("peak_tflops_bf16", "peak_tflops_fp16", "peak_tflops_fp8"):
        assert getattr(nvl, field) < getattr(h100, field) < getattr(sxm, field), field
    assert h100.memory_gib == 96 and h100.hbm_tbps == 2.4  # the benchmark's own figures
    assert (h100.gpus_per_node, h100.inter_node_gbps) == (8, 400)
    assert "torchtitan" in h100.source and "ASSUMPTION" in h100.source


def test_h100_nvl_bridges_pairs_only_so_scale_up_is_pcie():
    nvl, pcie = resolve_gpu("h100-nvl"), resolve_gpu("h100-pcie")
    assert nvl.intra_node_gbps == pcie.intra_node_gbps
    assert nvl.memory_gib > pcie.memory_gib and nvl.hbm_tbps > pcie.hbm_tbps


def test_same_silicon_families():
    # H20: Hopper memory system with export-capped compute; GH200: the H100 GPU with HBM3e.
    h20, gh200, h100 = resolve_gpu("h20"), resolve_gpu("gh200"), resolve_gpu("h100-sxm")
    assert h20.peak_tflops_bf16 < h100.peak_tflops_bf16 / 5 and h20.intra_node_gbps == h100.intra_node_gbps
    assert gh200.peak_tflops_bf16 == h100.peak_tflops_bf16 and gh200.memory_gib > h100.memory_gib
    # MI325X: MI300X compute with more and faster memory.
    mi325x, mi300x = resolve_gpu("mi325x"), resolve_gpu("mi300x")
    assert mi325x.peak_tflops_bf16 == pytest.approx(mi300x.peak_tflops_bf16, rel=1e-3)
    assert mi325x.memory_gib > mi300x.memory_gib and mi325x.hbm_tbps > mi300x.hbm_tbps
    assert resolve_gpu("mi355x").peak_tflops_bf16 > mi325x.peak_tflops_bf16


def test_blackwell_ultra_mirrors_blackwell():
    b200, b300, gb200, gb300 = (resolve_gpu(n) for n in ("b200", "b300", "gb200", "gb300"))
    assert b300.peak_tflops_bf16 == b200.peak_tflops_bf16 and gb300.peak_tflops_bf16 == gb200.peak_tflops_bf16
    assert b300.memory_gib > b200.memory_gib and gb300.memory_gib > gb200.memory_gib
    assert b300.inter_node_gbps == gb300.inter_node_gbps == 800  # ConnectX-8
    assert (b300.gpus_per_node, gb300.gpus_per_node) == (b200.gpus_per_node, gb200.gpus_per_node)


def test_gh200_96gb_variant_is_an_inline_override():
    gpu = resolve_gpu({"base": "gh200", "memory_gib": 96, "hbm_tbps": 4.0})
    assert (gpu.memory_gib, gpu.hbm_tbps, gpu.peak_tflops_bf16) == (96, 4.0, 989)
