"""Measured training runs (the format of shared/reference/measured-runs.yaml) -> jobs to predict + what was measured.

A run the planner cannot express becomes a ``Skipped`` with the reason; nothing is dropped silently.
A malformed file is bad input instead (SpecError, exit 2, naming ``runs[i]...``): not a list, an entry or section
that is not a mapping, duplicated ids; a value of the wrong type (``hidden: big``, ``tp: 0``) skips its run.
Where a source leaves a setting unstated, the reader fills the framework's documented default and records it in
``assumed`` so the report can show it:
- ffn_hidden -> 4*hidden (GPT/Megatron default); kv_heads -> heads (MHA); cp, ep, vpp -> 1; micro_batch -> 1;
- sequence parallelism -> on when tp > 1 (Megatron-Core default practice), off where the source predates it
  (SEQUENCE_PARALLEL_SINCE);
- recompute -> the least of none/selective/full with which the layout fits in memory;
- attention kernel -> flash when the architecture or framework names a fused kernel (flash, Megatron-Core) or the
  run comes from a stack whose default it is (NeMo, Megatron-Bridge, torchtitan: ``training_stack``), else the
  materialized softmax of pre-2022 Megatron/DeepSpeed;
- distributed optimizer -> on for NeMo and Megatron-Bridge runs that do not state it (their recipes' default);
- NeMo/Megatron-Bridge: cuDNN fused attention (flash3); NeMo: bf16 gradient reduction; torchtitan: seq_len 8192;
- model dimensions -> from the preset the model's name resolves to (planner.catalog.match_model_name);
- a GPU the catalog does not know -> built from its family's catalog GPU with the stated memory and peak;
- a run flagged ``inconsistent`` whose degrees divide its GPU count -> the degrees, on as many GPUs.
A value of the wrong type skips its run (the reason names the field); only a file with no usable run is bad input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.cost import flops as F
from planner.errors import SpecError
from planner.frameworks import FRAMEWORKS
from planner.spec import GpuSpec, Job, Layout


@dataclass
class Measured:
    iteration_time_s: float | None
    time_source: str
    memory_gib: float | None
    oom: bool


@dataclass
class RunCase:
    id: str
    job: Job
    layout_choices: list[Layout]  # first that fits is the run's layout (unstated recompute)
    measured: Measured
    assumed: list[str] = field(default_factory=list)
    source_group: str = ""  # the run's `source_group` (validate reports each group on its own)


@dataclass
class Skipped:
    id: str
    reason: str
    source_group: str = ""


def load_runs(path: str | Path) -> list[RunCase | Skipped]:
    from planner.io import load_yaml

    raw = load_yaml(path, field="runs")
    if not isinstance(raw, list):
        raise SpecError("runs", f"expected a YAML list of runs, got {type(raw).__name__}")
    if not raw:
        raise SpecError("runs", f"'{path}' lists no runs")
    out: list[RunCase | Skipped] = []
    seen: set[str] = set()
    malformed: list[SpecError] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise SpecError(f"runs[{i}]", f"expected a mapping, got {type(entry).__name__}")
        run_id = str(entry.get("id") or f"run-{i}")
        if run_id in seen:
            raise SpecError(f"runs[{i}].id", f"duplicated run id '{run_id}'")
        seen.add(run_id)
        try:
            out.append(_read_run(run_id, entry, where=f"runs[{i}]"))
        except _Skip as skip:
            out.append(Skipped(run_id, str(skip), _group(entry)))
        except SpecError as bad:  # one malformed value skips its run, with the field that is wrong
            malformed.append(bad)
            out.append(Skipped(run_id, f"{bad.field}: {bad.message}", _group(entry)))
    if malformed and not any(isinstance(r, RunCase) for r in out):
        raise malformed[0]  # nothing in the file is usable: the file itself is bad input
    return out


class _Skip(Exception):
    pass


class _Section:
    """One mapping of a run entry (model, hardware, parallel, measured) with typed reads.

    A value that is absent or null is "not stated": the default, or a skip when the run needs it. A value of the
    wrong type is bad input: SpecError naming ``runs[i].<section>.<key>``."""

    def __init__(self, entry: dict, name: str, where: str):
        raw = entry.get(name)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise SpecError(f"{where}.{name}", f"expected a mapping, got {type(raw).__name__}")
        self.raw, self.name, self.where = raw, name, f"{where}.{name}"

    def get(self, key: str, default: Any = None) -> Any:
        """Untyped (free text such as arch, framework, recompute)."""
        return self.raw.get(key, default)

    def need(self, key: str) -> Any:
        value = self.raw.get(key)
        if value is None:
            raise _Skip(f"{self.name}.{key} is not stated")
        return value

    def int(self, key: str, default: Any = None, required: bool = False, minimum: int = 1) -> Any:
        value = self.need(key) if required else self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise SpecError(f"{self.where}.{key}", f"expected an integer >= {minimum}, got {value!r}")
        return value

    def num(self, key: str) -> float | None:
        """A positive finite number, or None when not stated."""
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise SpecError(f"{self.where}.{key}", f"expected a positive number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(f"{self.where}.{key}", f"expected true or false, got {value!r}")
        return value


def _text(*values) -> str:
    return " ".join(str(v) for v in values if v is not None).lower()


def _read_run(run_id: str, e: dict[str, Any], where: str = "run") -> RunCase:
    from planner.catalog import resolve_gpu
    from planner.load import parse_job

    model_s = _Section(e, "model", where)
    hw = _Section(e, "hardware", where)
    par = _Section(e, "parallel", where)
    meas = _Section(e, "measured", where)
    assumed: list[str] = []

    # ---- model: the stated dimensions; what is not stated comes from the preset the name resolves to
    preset = _preset(model_s)
    arch = _text(model_s.get("arch"), par.get("framework"))

    filled: list[str] = []  # the dimensions taken from the preset

    def dim(key: str, attr: str, required: bool = True) -> int | None:
        """The stated value, else the preset's; a required one that neither gives skips the run."""
        value = model_s.int(key)
        if value is None and preset is not None and getattr(preset, attr) is not None:
            value = getattr(preset, attr)
            filled.append(key)
        if value is None and required:
            raise _Skip(f"model.{key} is not stated" + ("" if preset else " and the model name is no known preset"))
        return value

    hidden = dim("hidden", "hidden_size")
    heads = dim("heads", "num_attention_heads")
    layers = dim("layers", "num_layers")
    vocab = dim("vocab", "vocab_size")
    ffn = dim("ffn_hidden", "ffn_hidden_size", required=False)
    if ffn is None:
        ffn = 4 * hidden
        assumed.append("ffn_hidden=4*hidden")
    kv = dim("kv_heads", "num_kv_heads", required=False)
    if kv is None:
        kv = heads
        assumed.append("kv_heads=heads")
    if preset is not None and model_s.get("arch") is None:
        mlp, tied, dropout = preset.mlp, preset.tie_embeddings, preset.dropout
    else:
        mlp = "swiglu" if ("swiglu" in arch or "geglu" in arch) else ("relu" if "relu" in arch else "gelu")
        tied = "untied" not in arch
        dropout = "gpt" in arch and "mpt" not in arch  # Megatron GPT defaults: hidden/attention dropout 0.1
    model = {
        "name": str(model_s.get("name") or run_id),
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "vocab_size": vocab,
        "mlp": mlp,
        "tie_embeddings": tied,
        "dropout": dropout,
    }
    if preset is not None and preset.head_dim and "head_dim" not in model_s.raw and hidden == preset.hidden_size:
        model["head_dim"] = preset.head_dim
    if model_s.int("num_experts", minimum=0):
        model["moe"] = {
            "num_experts": model_s.int("num_experts"),
            "top_k": model_s.int("top_k", required=True),
            "expert_ffn_hidden_size": model_s.int("expert_ffn_hidden") or ffn,
            "shared_experts": model_s.int("shared_experts", 0, minimum=0),
        }
    elif preset is not None and preset.moe is not None and model_s.get("num_experts") is None:
        model["moe"] = preset.moe.model_dump()
        filled.append("moe")
    if (
        preset is not None
        and preset.mla is not None
        and hidden == preset.hidden_size
        and heads == preset.num_attention_heads
    ):
        model["mla"] = preset.mla.model_dump()  # the preset's latent attention (head_dim and kv heads follow from it)
        model.pop("head_dim", None)
        model["num_kv_heads"] = heads
        filled.append("mla")
    if filled:
        assumed.append(f"model {', '.join(filled)} from preset {preset.name}")

    # ---- hardware: catalog name, else the catalog GPU with the same memory and 16-bit peak
    gpu_name = str(hw.need("gpu"))
    try:
        gpu = resolve_gpu(gpu_name)
    except SpecError:
        gpu = _match_gpu(hw)
        if gpu is not None:
            assumed.append(f"gpu={gpu.name}")
        else:
            gpu, note = _family_gpu(gpu_name, hw)
            assumed.append(note)
    n_gpus = hw.int("n_gpus", required=True)
    gpn = hw.int("gpus_per_node") or gpu.gpus_per_node
    group = {"gpu": gpu.model_dump(), **_node_group(n_gpus, gpn)}
    nic = _nic_gbps(hw.get("interconnect"), gpn)
    if nic:
        group["inter_node_gbps"] = nic

    # ---- training
    prec_text = _text(par.get("precision"))
    precision = (
        "fp8"
        if ("fp8" in prec_text or "float8" in prec_text)
        else ("fp16" if "fp16" in prec_text or "mixed 16" in prec_text else "bf16")
    )
    stack = training_stack(e, par)
    seq = model_s.int("seq_len")
    if seq is None:
        seq = SEQ_LEN_DEFAULTS.get(stack)
        if seq is None:
            raise _Skip("model.seq_len is not stated")
        assumed.append(f"seq_len={seq} ({stack} default)")
    gbs = par.int("global_batch", required=True)
    flash = "flash" in arch or "megatron-core" in arch or par.bool("flash_attention", False)
    flash_assumed = not flash and stack in FUSED_ATTENTION_STACKS
    flash = flash or flash_assumed
    attention = "flash" if flash else "eager"
    if flash and stack in FLASH3_STACKS and _text(model_s.get("attention_kernel")) in ("", "flash3", "cudnn"):
        attention = "flash3"
        assumed.append(f"attention=flash3 (cuDNN fused attention, {stack} default)")
    elif flash_assumed:
        assumed.append(f"attention=flash ({stack} default)")
    training = {
        "seq_length": seq,
        "global_batch_size": gbs,
        "precision": precision,
        "attention": attention,
    }
    if "fp32 grad accumulation" in prec_text and "bf16" in prec_text:
        training["grad_dtype"] = "bf16+fp32"  # DeepSpeed BF16_Optimizer
    elif stack in BF16_GRADIENT_STACKS and "grad" not in prec_text:
        training["grad_dtype"] = "bf16"
        assumed.append(f"gradients reduced in bf16 ({stack} default)")
    if stack in UNFUSED_LOSS_STACKS:
        since = COMPILED_LOSS_SINCE.get(stack)
        month = _source_month(e)
        if since and par.bool("torch_compile", False) and month is not None and month >= since:
            training["cross_entropy"] = "fused"
            assumed.append(
                f"cross_entropy=fused ({stack} compiles the loss with torch.compile since {since[0]}-{since[1]:02d})"
            )
        else:
            training["cross_entropy"] = "unfused"
            assumed.append(f"cross_entropy=unfused ({stack} default)")
    # how the stack's framework runs TP and FP8 (planner/frameworks.py), where the run uses them; TP collectives all
    # on the critical path: DTensor TP, and Megatron's layers of 2021-22 (synchronous_tp)
    fw = FRAMEWORKS.get(stack or "")
    if (par.int("tp") or 1) > 1:
        if fw is not None and not fw.tp_backward_overlap:
            exposed = f"DTensor TP, {stack}"
        else:
            exposed = "Megatron's TP layers before the asynchronous all-reduce" if synchronous_tp(e, par) else None
        if exposed:
            training["tp_backward_overlap"] = False
            assumed.append(f"tp_backward_overlap=false ({exposed})")
    if fw is not None and not fw.fp8_saved_inputs and precision == "fp8":
        training["fp8_saved_inputs"] = False
        assumed.append(f"fp8_saved_inputs=false (torchao Float8Linear, {stack})")
    if precision == "fp8":
        stated = next((r for r in ("rowwise", "tensorwise", "delayed") if r in prec_text), None)
        if stated is not None:
            training["fp8_recipe"] = stated
        else:
            recipe, why = RUN_FP8_RECIPES.get(stack or "", ("delayed", f"{stack or 'Transformer Engine'} default"))
            training["fp8_recipe"] = recipe
            assumed.append(f"fp8_recipe={recipe} ({why})")

    # ---- layout
    tp = par.int("tp")
    pp = par.int("pp")
    if tp is None or pp is None:
        raise _Skip("parallel.tp/pp are not stated")
    cp = par.int("cp", 1)
    dp = par.int("dp", n_gpus // (tp * pp * cp))
    if tp * pp * dp * cp != n_gpus and _flagged_inconsistent(e) and n_gpus % (tp * pp * cp * dp) == 0:
        # The source's degrees and GPU count disagree and the run says so. The degrees are kept (they are what the
        # framework was configured with; at the longest sequences a larger DP would exceed the global batch) and
        # the GPU count follows them: a per-GPU measurement (TFLOP/s per GPU) does not depend on which is wrong.
        stated, n_gpus = n_gpus, tp * pp * dp * cp
        group.update(_node_group(n_gpus, gpn))
        assumed.append(f"n_gpus={n_gpus} (stated {stated}; flagged inconsistent: TP*PP*DP*CP is kept)")
    vpp = par.int("vpp")
    if vpp is None:
        vpp = 1
        assumed.append("vpp=1")
    mbs = par.int("micro_batch")
    if mbs is None:
        mbs = 1
        assumed.append("micro_batch=1")
    sp = par.bool("sp")
    if sp is None:
        month = _source_month(e)
        if tp > 1 and month is not None and month < SEQUENCE_PARALLEL_SINCE:
            sp = False
            since = "-".join(f"{x:02d}" for x in SEQUENCE_PARALLEL_SINCE)
            assumed.append(f"sp=false (the source, {month[0]}-{month[1]:02d}, predates sequence parallelism, {since})")
        else:
            sp = tp > 1
            assumed.append(f"sp={str(sp).lower()}")
    zero_text = _text(par.get("zero"), par.get("fsdp_sharding_strategy"))
    if "full_shard" in zero_text or "fsdp" in zero_text or zero_text.strip() == "3":
        zero = 3
    elif "shard_grad_op" in zero_text or zero_text.strip() == "2":
        zero = 2
    elif (
        zero_text.strip() == "1"
        or par.bool("distributed_optimizer", False)
        or "overlap-param-gather" in _text(par.get("overlap"))
    ):
        zero = 1  # --overlap-param-gather only exists with Megatron's distributed optimizer
    elif par.get("distributed_optimizer") is None and not zero_text and stack in DISTRIBUTED_OPTIMIZER_STACKS:
        zero = 1
        assumed.append(f"distributed_optimizer=true ({stack} default)")
    else:
        zero = 0
    stated_fw = _text(par.get("framework"))
    if zero == 3 and ((fw is not None and fw.fp32_params) or any(n in stated_fw for n in FP32_PARAMS_FRAMEWORKS)):
        training["fp32_params"] = True
        assumed.append("fp32_params=true (PyTorch FSDP keeps fp32 parameters, cast when gathered)")
    layout = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "ep": par.int("ep", 1),
        "vpp": vpp,
        "micro_batch_size": mbs,
        "sequence_parallel": sp,
        "zero_stage": zero,
        # Megatron's --tp-comm-overlap (Transformer Engine userbuffers) and torchtitan's async TP
        # (torch.distributed._symmetric_memory micro-pipelining) both overlap TP collectives with the GEMMs
        "tp_comm_overlap": "tp-comm-overlap" in _text(par.get("overlap")) or bool(par.bool("async_tp", False)),
    }
    from planner.parallel import balanced_split

    partition = _text(par.get("pp_partition"))
    uneven = model["num_layers"] % pp != 0
    # Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the embedding
    # (loss) counts as one layer of the first (last) stage, which holds one transformer layer fewer
    # (megatron/core/transformer/transformer_block.py get_num_layers_to_build); with interleaving the lighter
    # chunk is the stage's first (last), so the stage totals are the same.
    first = "account-for-embedding" in partition
    last = "account-for-loss" in partition
    if pp > 1 and (first or last):
        slots = balanced_split(model["num_layers"] + first + last, pp)
        slots[0] -= first
        slots[-1] -= last
        layout["stages"] = [{"layers": n} for n in slots]
    elif pp > 1 and ("embedding" in partition or (uneven and "deepspeed" in arch)):
        # DeepSpeed "type:transformer|embedding": both embeddings take a pipeline slot of their own.
        slots = balanced_split(model["num_layers"] + 2, pp)
        slots[0] -= 1
        slots[-1] -= 1
        layout["stages"] = [{"layers": n} for n in slots]
        if not partition:
            assumed.append("pp_partition=type:transformer|embedding")
    elif uneven:
        layout["stages"] = [{"layers": n} for n in balanced_split(model["num_layers"], pp)]
        assumed.append("pp_partition=balanced")
    rc = _text(par.get("recompute"))
    if rc.startswith(("full", "yes", "true")):
        choices = ["full"]
    elif rc.startswith("selective"):
        # torchtitan's "selective (op)" / per-op SAC is its own policy (recompute: op), not Korthikanti's
        choices = ["op"] if re.search(r"\bop\b|per-op", rc) else ["selective"]
    elif rc.startswith(("none", "no", "false")):
        choices = ["none"]
    elif (
        "full activation checkpointing" in _text(e.get("notes"))
        or "counts recompute" in _text(meas.get("tflops_definition"))
        or "hardware" in _text(meas.get("tflops_definition"))
    ):
        # The source's notes name full checkpointing, or its hardware-FLOP count includes the recompute pass.
        choices = ["full"]
        assumed.append("recompute=full (from notes / hardware-FLOP convention)")
    elif stack in RECOMPUTE_DEFAULTS:
        choices = [RECOMPUTE_DEFAULTS[stack]]
        assumed.append(f"recompute={choices[0]} ({stack} default)")
    else:
        choices = ["none", "selective", "full"]
        assumed.append("recompute=least that fits")

    raw_job = {"model": model, "cluster": [group], "training": training, "layout": {**layout, "recompute": choices[0]}}
    try:
        job = parse_job(raw_job)
    except SpecError as exc:
        raise _Skip(f"cannot express the run: {exc.field}: {exc.message}")
    layouts = [Layout.model_validate({**layout, "recompute": c}) for c in choices]
    megatron_flops = stack in MEGATRON_FLOPS_STACKS
    return RunCase(run_id, job, layouts, _measured(e, job, meas, hw, megatron_flops), assumed, _group(e))


def _group(e: dict) -> str:
    return str(e.get("source_group") or "")


# The training stacks whose defaults fill what a run leaves unstated, recognised by name in the run's
# `parallel.framework` or, where that is not stated, in its `source` (title, group): the source names the
# framework whose published numbers these are.
STACK_NAMES = (
    ("nemo", ("nemo",)),
    ("megatron-bridge", ("megatron-bridge",)),
    ("torchtitan", ("torchtitan",)),
    ("megatron-core", ("megatron-core", "mcore")),
)
# Fused attention is the default: NeMo and Megatron-Core/Bridge run Transformer Engine's fused attention
# (cuDNN/flash) unless disabled; torchtitan's attention is torch SDPA (flash kernels).
FUSED_ATTENTION_STACKS = frozenset({"nemo", "megatron-bridge", "torchtitan", "megatron-core"})
# Stacks whose TFLOP/s per GPU are Megatron's model FLOPs (megatron/training/training.py
# num_floating_point_operations; NeMo's flops callback, nemo/utils/flops_formulas.py, uses the same terms).
MEGATRON_FLOPS_STACKS = frozenset({"nemo", "megatron-bridge", "megatron-core"})
# NeMo's published performance runs reduce gradients in bf16: NeMo-Framework-Launcher
# examples/training/*/h100/*.sh set `training.model.optim.grad_sync_dtype=bf16` (2-byte main grads).
BF16_GRADIENT_STACKS = frozenset({"nemo"})
# torchtitan's loss is torch cross_entropy over the upcast logits (components/loss.py cross_entropy_loss, 0.2):
# no fused vocab-parallel kernel.
UNFUSED_LOSS_STACKS = frozenset({"torchtitan"})
# From when a stack's torch.compile also compiles that loss (year, month): torchtitan's build_cross_entropy_loss
# wraps it in torch.compile when compile is on since pytorch/torchtitan#1033 (merged 2025-04-01); before, train.py
# left it out ("TODO: compiling loss function causes CUDA errors"). Compiled, the upcast and log-softmax fuse into
# the kernel: the loss keeps the 16-bit logits and, in the backward, their 16-bit gradient (about the input's size,
# Dao-AILab/quack#48), the 4 bytes per logit of a fused loss (memory.logits_bytes).
COMPILED_LOSS_SINCE = {"torchtitan": (2025, 4)}
# Frameworks named in a run's parallel.framework whose ZeRO-3 is PyTorch FSDP with mixed precision: the model is
# built in fp32 and FSDP casts each gathered layer to 16 bits (MixedPrecision param_dtype), so the sharded fp32
# parameters are the optimizer's master copy (Composer's FSDP, as in llm-foundry's benchmarks; torchtitan is a
# stack of its own, planner/frameworks.py).
FP32_PARAMS_FRAMEWORKS = ("pytorch fsdp", "fsdp2")
# The FP8 recipe of a run whose precision names none, when its stack's default is not Transformer Engine's delayed
# scaling: the published torchtitan runs (2024-12 to 2025-06) predate 0.3, whose converter is rowwise-only; their
# Float8 linears ran torchao's default Float8LinearConfig(), tensorwise (0.2 components/quantization/float8.py).
RUN_FP8_RECIPES = {"torchtitan": ("tensorwise", "torchtitan default before 0.3")}
# Megatron-LM's sequence parallelism appeared with Korthikanti et al., 'Reducing Activation Recomputation in Large
# Transformer Models' (arXiv 2205.05198, 2022-05): a run whose source is older and leaves sp unstated ran without it.
SEQUENCE_PARALLEL_SINCE = (2022, 5)
# Activation recomputation where a run leaves it unstated: NeMo's and Megatron-Bridge's recipes leave it off
# (Megatron-Core TransformerConfig recompute_granularity = None; NeMo 1.x configs
# activations_checkpoint_granularity: null) unless the recipe sets it, which the run would then state.
RECOMPUTE_DEFAULTS = {"nemo": "none", "megatron-bridge": "none"}
# Sequence length of the stack's reference configs where a run leaves it unstated: torchtitan's Llama 3
# train_configs (llama3_8b.toml, llama3_70b.toml, llama3_405b.toml: [training] seq_len = 8192).
SEQ_LEN_DEFAULTS = {"torchtitan": 8192}
# Transformer Engine's DotProductAttention picks cuDNN fused attention (FlashAttention-3 class on Hopper) by
# default with cuDNN 9 (TE >= 1.x, 2024); NeMo's and Megatron-Bridge's recipes run it. Megatron-Core runs are
# not assumed to (the published Megatron-LM H100 tables predate it).
FLASH3_STACKS = frozenset({"nemo", "megatron-bridge"})
# The distributed optimizer (ZeRO-1) is on in NeMo's and Megatron-Bridge's pretraining recipes
# (OptimizerConfig use_distributed_optimizer=True).
DISTRIBUTED_OPTIMIZER_STACKS = frozenset({"nemo", "megatron-bridge"})


def training_stack(e: dict[str, Any], par: _Section) -> str | None:
    """The training stack a run was measured on: named in parallel.framework, else in its source; None if neither
    names one of STACK_NAMES."""
    stated = _text(par.get("framework"))
    source = e.get("source")
    cited = _text(e.get("source_group"), *(source.values() if isinstance(source, dict) else [source]))
    for text in (stated, cited):
        for stack, names in STACK_NAMES:
            if any(n in text for n in names):
                return stack
        if stated:
            return None  # a stated framework that is none of these: no source-based guess
    return None


def _preset(model_s: _Section):
    """The catalog preset the run's model name resolves to (loose matching: case, separators, suffixes such as
    "(174.6B)"), or None."""
    from planner.catalog import match_model_name, resolve_model

    name = model_s.get("name")
    found = match_model_name(str(name)) if name else None
    return None if found is None else resolve_model(found)


def _match_gpu(hw: _Section):
    from planner.catalog import gpu_names, resolve_gpu

    mem, peak = hw.num("mem_gb"), hw.num("peak_tflops_16bit")
    if mem is None or peak is None:
        return None
    for name in gpu_names():
        g = resolve_gpu(name)
        if abs(g.memory_gib - mem) < 1 and abs(g.peak_tflops_bf16 - peak) < 0.01 * peak:
            return g
    return None


def _node_group(n_gpus: int, gpus_per_node: int) -> dict[str, int]:
    """nodes and GPUs per node of ``n_gpus`` GPUs on nodes of ``gpus_per_node``: fewer GPUs than a node holds
    are one node; a count that does not fill whole nodes is not a cluster the run can be read as."""
    if n_gpus <= gpus_per_node:
        return {"nodes": 1, "gpus_per_node": n_gpus}
    if n_gpus % gpus_per_node:
        raise _Skip(f"hardware.n_gpus ({n_gpus}) does not fill whole nodes of {gpus_per_node} GPUs")
    return {"nodes": n_gpus // gpus_per_node, "gpus_per_node": gpus_per_node}


# Megatron's tensor-parallel layers of 2021-22 all-reduce the input gradient on the critical path: a
# ColumnParallelLinear enters its input through copy_to_tensor_model_parallel_region, whose backward is a blocking
# all-reduce (NVIDIA/Megatron-LM megatron/mpu/layers.py at aed2f75; bigscience-workshop/Megatron-DeepSpeed
# megatron/mpu/layers.py, BLOOM's code); the PTD-P paper describes it as the f operator's backward all-reduce
# (Narayanan et al. 2021, arXiv 2104.04473, Fig. 5) and names the pipeline's scatter/gather as its communication
# optimization (Sec. 4.1), no overlap of this all-reduce. Later Megatron-LM runs it under the weight-gradient GEMM
# (ColumnParallelLinearWithAsyncAllreduce, turned off by --no-async-tensor-model-parallel-allreduce;
# megatron/mpu/layers.py at 02bb1f5), Training.tp_backward_overlap's default. Runs on the older layers: the PTD-P
# paper's own, and those that name Megatron-DeepSpeed or DeepSpeed with Megatron's TP (BLOOM, MT-NLG).
PTD_P_PAPER = "arxiv 2104.04473"


def synchronous_tp(e: dict[str, Any], par: _Section) -> bool:
    """The run's tensor parallelism is Megatron's of 2021-22, with the backward all-reduce on the critical path
    (PTD_P_PAPER)."""
    framework = _text(par.get("framework"))
    if "megatron" in framework and "deepspeed" in framework:
        return True
    source = e.get("source")
    return PTD_P_PAPER in _text(*(source.values() if isinstance(source, dict) else [source]))


def _source_month(e: dict) -> tuple[int, int] | None:
    """(year, month) a run's source names in its title: a benchmark file such as 'llama3_h100_202412_torchtitan.md'
    or 'asyncTP_llama3_h100_2025-06_torchtitan.md', or an arXiv identifier ('arXiv 2201.11990': YYMM.number, the
    month of its first version); None if it names neither."""
    source = e.get("source")
    title = str(source.get("title") or "") if isinstance(source, dict) else str(source or "")
    m = re.search(r"(?<!\d)(20[1-3]\d)-?(0[1-9]|1[0-2])(?!\d)", title)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.search(r"arxiv[: ]*(\d{2})(0[1-9]|1[0-2])\.\d{4,5}", title, re.IGNORECASE)
    return (2000 + int(m.group(1)), int(m.group(2))) if m else None


def _flagged_inconsistent(e: dict) -> bool:
    return any("inconsistent" in str(f).lower() for f in (e.get("flags") or []))


def _family_gpu(name: str, hw: _Section):
    """A GPU the catalog does not know, built from the catalog GPU of its family (the name's leading model
    number: 'H100-96GB-HBM2e' -> h100) with the stated memory and 16-bit peak; rates scale with the peak.
    Skips the run when no catalog GPU shares the family."""
    from planner.catalog import gpu_names, resolve_gpu

    m = re.match(r"[a-z]+\d+[a-z]*", name.strip().lower().replace("nvidia", "").replace("amd", "").strip(" -_"))
    family = [g for g in gpu_names() if m and g.startswith(m.group(0))]
    if not family:
        raise _Skip(f"GPU '{name}' is not in the catalog and no catalog GPU is of its family")
    mem, peak = hw.num("mem_gb"), hw.num("peak_tflops_16bit")
    # the family member closest in memory; among equals the flagship (highest peak, then fastest scale-up link)
    base = min(
        (resolve_gpu(g) for g in family),
        key=lambda g: (abs(g.memory_gib - (mem or g.memory_gib)), -g.peak_tflops_bf16, -g.intra_node_gbps, g.name),
    )
    data = base.model_dump()
    data["name"] = name
    if mem:
        data["memory_gib"] = mem
    if peak:
        k = peak / base.peak_tflops_bf16
        for key in (f for f in GpuSpec.model_fields if "tflops" in f):  # every compute rate of the spec
            if data.get(key):
                data[key] = data[key] * k
    note = (
        f"gpu={name} built from {base.name} with {data['memory_gib']:g} GiB and "
        f"{data['peak_tflops_bf16']:g} TFLOP/s 16-bit peak" + ("" if peak else f" ({base.name}'s: not stated)")
    )
    return resolve_gpu(data), note


def _nic_gbps(interconnect: Any, gpus_per_node: int) -> float | None:
    """Per-GPU NIC rate when the interconnect text states a fabric different from the catalog's typical one:
    Omni-Path (100 Gb/s per link) with N links per node."""
    text = _text(interconnect)
    m = re.search(r"(\d+)\s*(?:x\s*)?(?:opa|omni-path)?\s*links? per node", text)
    if "omni-path" in text and m:
        return int(m.group(1)) * 100.0 / gpus_per_node
    return None


def _measured(e: dict, job: Job, meas: _Section, hw: _Section, megatron_flops: bool = False) -> Measured:
    """Iteration time from what the source measured, converting with the source's own FLOP convention.
    ``megatron_flops``: the run's stack reports TFLOP/s with Megatron's model-FLOP formula (NeMo's FLOPs
    callback and Megatron-Core/Bridge use it), which stands for an unstated definition."""
    t, m = job.training, job.model
    n = job.num_gpus
    tokens = t.global_batch_size * t.seq_length
    time, src = None, ""
    defn = _text(meas.get("tflops_definition"), meas.get("mfu_definition"))
    if meas.num("iteration_time_s"):
        time, src = meas.num("iteration_time_s"), "iteration_time_s"
    elif meas.num("tokens_per_s"):
        time, src = tokens / meas.num("tokens_per_s"), "tokens_per_s"
    elif meas.num("tokens_per_s_per_gpu"):
        time, src = tokens / (meas.num("tokens_per_s_per_gpu") * n), "tokens_per_s_per_gpu"
    elif meas.num("tflops_per_gpu") and "not stated" not in defn:
        x = meas.num("tflops_per_gpu") * 1e12 * n
        if "eq.3" in defn or "hardware" in defn or "4*2" in defn:
            time, src = (
                F.narayanan_hardware_flops(m, t.seq_length, t.global_batch_size) / x,
                "tflops_per_gpu (Narayanan Eq. 3)",
            )
        elif e.get("source_group") == "megatron-lm-h100" or "megatron" in defn or (not defn and megatron_flops):
            time, src = (
                F.model_flops_per_iteration(m, t.seq_length, t.global_batch_size) / x,
                "tflops_per_gpu (Megatron model FLOPs)",
            )
    elif meas.num("mfu") and "palm" in defn:
        peak = hw.num("peak_tflops_16bit") or job.cluster[0].gpu.peak_tflops_bf16
        time = F.palm_flops_per_token(m, t.seq_length) * tokens / (meas.num("mfu") * peak * 1e12 * n)
        src = "mfu (PaLM)"
    return Measured(time, src, meas.num("memory_gb"), meas.bool("oom", False))
