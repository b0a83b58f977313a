"""Likely unit mistakes in a valid job: values that parse but that no published run or real GPU comes near.

A job can be valid and still be wrong by a unit: ``global_batch_size`` given in tokens, ``memory_gib`` in MiB. The
cost model prices such a job without complaint (a 4,194,304-sequence batch is a 112,917 s iteration), so each
check here names the field, what the value would mean in the likely unit, and leaves the decision to the user:
a warning, never an error. Every threshold sits far beyond real values (each check cites what is real), so that
no shipped example and no measured run (``shared/reference/measured-runs*.yaml``) triggers one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from planner.spec import GpuSpec, Job


@dataclass(frozen=True)
class JobWarning:
    field: str
    message: str

    def line(self) -> str:
        return f"warning: {self.field}: {self.message}"


def job_warnings(job: Job) -> list[JobWarning]:
    """Every check's warnings, in a fixed order (training first, then each node group, then links)."""
    return [w for check in CHECKS for w in check(job)]


def _count(n: float) -> str:
    """34359738368 -> '34.4B' (decimal suffixes, as batch sizes are quoted: "a 16M-token batch")."""
    for unit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= unit:
            v = n / unit
            return f"{v:.1f}{suffix}" if v < 100 else f"{v:.0f}{suffix}"
    return f"{n:g}"


# ----------------------------------------------------------------------------- training

# Tokens per iteration (global_batch_size * seq_length) above which the batch looks like a unit mistake: 2^27 =
# 134,217,728, about twice the largest published pre-training batch. Published: GPT-3 3.2M tokens (Brown et al.
# 2020, Table 2.1); Llama 3 405B 4M -> 8M -> 16M tokens (Dubey et al. 2024, "The Llama 3 Herd of Models",
# Sec. 3.4.1); DeepSeek-V3 15,360 sequences x 4,096 = 62.9M tokens (DeepSeek-AI 2024, arXiv 2412.19437, Sec. 4.2),
# the largest we know of; the measured runs reach 12.6M (megatron-h100-weak-462b). A batch given in tokens instead
# of sequences multiplies the real one by seq_length (>= 512), so even a 0.5M-token batch at 512-token sequences
# (268M) lands above the line, while any real batch stays below it.
MAX_TOKENS_PER_ITERATION = 2**27

# Sequence length above which seq_length, rather than global_batch_size, looks like the batch's tokens: 2^20 =
# 1,048,576, the longest sequence of a published training run we know of (NeMo context-parallel runs at 1M tokens,
# in measured-runs-modern.yaml).
MAX_PUBLISHED_SEQ_LENGTH = 2**20


def _seq_is_batch(job: Job) -> bool:
    t = job.training
    return (
        t.global_batch_size * t.seq_length > MAX_TOKENS_PER_ITERATION
        and t.seq_length > MAX_PUBLISHED_SEQ_LENGTH
        and t.seq_length > t.global_batch_size
    )


def batch_in_tokens(job: Job) -> Iterator[JobWarning]:
    """global_batch_size counts sequences; a token count there makes the batch seq_length times too big."""
    t = job.training
    tokens = t.global_batch_size * t.seq_length
    if tokens <= MAX_TOKENS_PER_ITERATION or _seq_is_batch(job):
        return
    msg = (
        f"{t.global_batch_size} sequences of {t.seq_length} tokens is {_count(tokens)} tokens per iteration; "
        "global_batch_size counts sequences"
    )
    if t.global_batch_size >= t.seq_length:
        sequences = t.global_batch_size / t.seq_length
        shown = (
            f"{t.global_batch_size // t.seq_length}"
            if t.global_batch_size % t.seq_length == 0
            else f"about {sequences:.0f}"
        )
        msg += f": {t.global_batch_size} tokens would be {shown} sequences"
    yield JobWarning("training.global_batch_size", msg)


def seq_length_is_batch_tokens(job: Job) -> Iterator[JobWarning]:
    """seq_length is one sequence's length; the whole batch's tokens there look like a longer-than-any sequence."""
    t = job.training
    if not _seq_is_batch(job):
        return
    msg = (
        f"{t.global_batch_size} sequences of {t.seq_length} tokens is {_count(t.global_batch_size * t.seq_length)} "
        f"tokens per iteration, and no published run trains on sequences over {MAX_PUBLISHED_SEQ_LENGTH}; "
        "seq_length is the length of one sequence"
    )
    if t.global_batch_size > 1 and t.seq_length % t.global_batch_size == 0:
        msg += (
            f": {t.seq_length} tokens in {t.global_batch_size} sequences would be "
            f"{t.seq_length // t.global_batch_size} tokens each"
        )
    yield JobWarning("training.seq_length", msg)


def fp8_without_fp8_peak(job: Job) -> Iterator[JobWarning]:
    """precision fp8 on a GPU with no ``peak_tflops_fp8``: planner.cost.compute prices its GEMMs at the bf16 rate
    and takes the bf16 peak for MFU (memory does not depend on precision), so the plan is the bf16 one. FP8 tensor
    cores came with Hopper and Ada (H100, L4, L40S, RTX 4090) and CDNA 3 (MI300X); V100, A100, A10 and MI250X have
    none, and their catalog entries carry no FP8 peak."""
    if job.training.precision != "fp8":
        return
    seen = set()
    for group in job.cluster:
        gpu = group.gpu
        if gpu.peak_tflops_fp8 is None and gpu.name not in seen:
            seen.add(gpu.name)
            yield JobWarning(
                "training.precision", f"{gpu.name} has no FP8 tensor cores (no peak_tflops_fp8); priced as bf16"
            )


# ----------------------------------------------------------------------------- GPUs and networks

# Each limit is several times the largest real value and below the smallest real value in the likely wrong unit.
# memory_gib: the largest GPU memory shipping is 288 GB HBM3E (AMD MI355X, NVIDIA B300), NVIDIA's announced
# Rubin Ultra 1 TB; in MiB even an 8 GB card is 8,192.
MAX_MEMORY_GIB = 2048
# hbm_tbps: B200/GB200 reach 8 TB/s (catalog); in GB/s even an L4 is 300.
MAX_HBM_TBPS = 100
# peak/matmul/attention TFLOP/s: GB200 is 2,500 dense bf16 and 5,000 fp8 (catalog); in GFLOP/s a V100, A10 or L4
# is 121,000-125,000.
MAX_TFLOPS = 100_000
# intra_node_gbps, GB/s per direction: NVLink 5 is 900 (B200), NVLink 6 1,800; in MB/s a PCIe Gen3 x16 is 15,750.
MAX_SCALE_UP_GBPS = 10_000
# NIC Gb/s per GPU: 400-800 today (ConnectX-7/-8), 1,600 announced; in Mb/s a 25 GbE share is 25,000.
MAX_NIC_GBPS = 10_000

_TFLOPS_FIELDS = (
    "peak_tflops_bf16",
    "peak_tflops_fp16",
    "peak_tflops_fp8",
    "matmul_tflops_bf16",
    "attention_tflops_bf16",
)


def _gpu_fields(gpu: GpuSpec):
    """(field, value, limit, unit, likely unit, factor between them) of a GPU's unit-bearing numbers."""
    yield "memory_gib", gpu.memory_gib, MAX_MEMORY_GIB, "GiB", "MiB", 1024
    yield "hbm_tbps", gpu.hbm_tbps, MAX_HBM_TBPS, "TB/s", "GB/s", 1000
    for name in _TFLOPS_FIELDS:
        yield name, getattr(gpu, name), MAX_TFLOPS, "TFLOP/s", "GFLOP/s", 1000
    yield "intra_node_gbps", gpu.intra_node_gbps, MAX_SCALE_UP_GBPS, "GB/s", "MB/s", 1000
    yield "inter_node_gbps", gpu.inter_node_gbps, MAX_NIC_GBPS, "Gb/s", "Mb/s", 1000


def _too_big(field: str, value, limit, unit: str, likely: str, factor: int) -> Iterator[JobWarning]:
    if value is not None and value > limit:
        yield JobWarning(field, f"{value:g} {unit} looks like {likely}: {value / factor:g} {unit}")


def gpu_units(job: Job) -> Iterator[JobWarning]:
    """Each node group's GPU numbers, e.g. ``cluster[0].gpu.memory_gib: 81920 GiB looks like MiB: 80 GiB``."""
    for i, group in enumerate(job.cluster):
        for name, value, limit, unit, likely, factor in _gpu_fields(group.gpu):
            yield from _too_big(f"cluster[{i}].gpu.{name}", value, limit, unit, likely, factor)


def network_units(job: Job) -> Iterator[JobWarning]:
    """NIC overrides of node groups and links between groups (Gb/s), against the same limit as a GPU's NIC."""
    for i, group in enumerate(job.cluster):
        yield from _too_big(f"cluster[{i}].inter_node_gbps", group.inter_node_gbps, MAX_NIC_GBPS, "Gb/s", "Mb/s", 1000)
    for j, link in enumerate(job.links):
        yield from _too_big(f"links[{j}].gbps", link.gbps, MAX_NIC_GBPS, "Gb/s", "Mb/s", 1000)


CHECKS = (batch_in_tokens, seq_length_is_batch_tokens, fp8_without_fp8_peak, gpu_units, network_units)
