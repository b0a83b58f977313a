"""Megatron-LM, the emitter: a plan as `pretrain_gpt.py` flags (``render``), and the flag spellings both directions
share (the pipeline layout grammar, the MoE layer pattern). The importer (a Megatron-LM launch script or args file
read back into a job, `planner import`) is planner/emit/megatron_import.py; ``read`` here forwards to it.

The target-neutral part (``settings``: every rule a plan must meet, and the values Megatron-Core takes) is shared
with planner/emit/megatron_bridge.py, whose ``model.*``/``ddp.*`` keys are the same Megatron-Core fields.

Sources (flag names are verified there, not guessed):
* shared/reference/emitters.md section 1 (flags dumped from the live parser of megatron-core 0.16.1, 0.19.2 and
  main; the rules of ``validate_args`` and ``TransformerConfig.__post_init__``; the layout grammar, 1.4), 4.1
  (Megatron-Bridge) and 5 (rules Megatron checks only at run time or not at all);
* NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (read at 000c4ac: every ``add_argument`` below, and
  ``validate_args``), ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (layout grammar),
  ``megatron/core/recompute.py`` (block recompute counts the layers of one model chunk),
  ``docs/discussions/megatron-fsdp-user-guide/megatron-fsdp-user-guide.md`` (the flags Megatron-FSDP requires).
Checked with megatron-core 0.19.2's own parse_args/validate_args/TransformerConfig (scripts/validate_emitters.py).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError

TARGET = "megatron"
PROGRAM = "pretrain_gpt.py"
WORKDIR = '"${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout}"'
ARGS_FILE = "megatron_args.txt"

# A short smoke run: the plan fixes the parallel shape and the batch, not the schedule (replace for real training).
TRAIN_ITERS = 100
LR, MIN_LR, WARMUP_ITERS, SEED = "1.0e-4", "1.0e-5", "10", "1234"

# ---------------------------------------------------------------------------------------------------------------
# GPU architecture (CUDA compute capability) by catalog name. Source: NVIDIA's compute-capability table,
# https://developer.nvidia.com/cuda-gpus (V100 7.0, A100/A800/A30 8.0, A10/A40 8.6, L4/L40S/RTX 4090 8.9,
# H100/H200/H800/H20/GH200 9.0, B200/GB200/B300/GB300 10.x). Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1
# on arch < 10 when TP > 1 or CP > 1 (arguments.py validate_args, get_device_arch_version(); emitters.md 1.2, 5.3).
# AMD Instinct cards report gfx9 (major 9) to torch on ROCm, so they fall under the same check.
_ARCH = (  # (prefix of the lower-cased GPU name, (major, minor)); longest prefixes first where they overlap
    ("gb300", (10, 3)),
    ("gb200", (10, 0)),
    ("b300", (10, 3)),
    ("b200", (10, 0)),
    ("b100", (10, 0)),
    ("gh200", (9, 0)),
    ("h100", (9, 0)),
    ("h200", (9, 0)),
    ("h800", (9, 0)),
    ("h20", (9, 0)),
    ("l40", (8, 9)),
    ("l4", (8, 9)),
    ("rtx4090", (8, 9)),
    ("rtx-4090", (8, 9)),
    ("a100", (8, 0)),
    ("a800", (8, 0)),
    ("a30", (8, 0)),
    ("a40", (8, 6)),
    ("a10", (8, 6)),
    ("v100", (7, 0)),
    ("mi300", (9, 4)),
    ("mi250", (9, 0)),
)


def gpu_arch(name: str) -> tuple[int, int] | None:
    """(major, minor) compute capability of a catalog GPU name, None when unknown (see _ARCH for the source)."""
    key = name.strip().lower()
    for prefix, arch in _ARCH:
        if key.startswith(prefix):
            return arch
    return None


# ---------------------------------------------------------------------------------------------------------------
# Target-neutral settings: the rules and values Megatron-Core takes, shared with megatron_bridge.py.


# Training.attention -> Megatron-Core's --attention-backend (megatron/core/transformer/enums.py AttnBackend):
# the materialized softmax is "unfused"; cuDNN fused attention (FlashAttention-3 class on Hopper) is "fused";
# flash (FlashAttention-2 class) keeps the default "auto".
ATTENTION_BACKENDS = {"eager": "unfused", "flash3": "fused"}

# Training.fp8_recipe -> Megatron-Core's --fp8-recipe (arguments.py _add_transformer_engine_args: choices tensorwise,
# delayed, mxfp8, blockwise, custom; megatron-core TransformerConfig.fp8_recipe, enums.py Fp8Recipe). delayed is
# Transformer Engine DelayedScaling, tensorwise its Float8CurrentScaling (megatron/core/fp8_utils.py); the planner's
# rowwise (torchao per-row scaling) has no Megatron recipe (check_runnable refuses it: Framework.fp8_recipes).
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "tensorwise"}
# what each recipe is, for README notes (Transformer Engine transformer_engine/common/recipe/__init__.py)
FP8_RECIPE_TEXT = {
    "delayed": "delayed scaling (Transformer Engine DelayedScaling: each tensor's scale comes from the amax history "
    "of earlier steps)",
    "tensorwise": "per-tensor current scaling (Transformer Engine Float8CurrentScaling: each tensor is scaled by its "
    "own amax when it is cast)",
}


@dataclass(frozen=True)
class MoESettings:
    num_experts: int
    top_k: int
    ffn_hidden_size: int
    shared_intermediate_size: int | None  # all shared experts together (Megatron sums them into one MLP)
    layer_freq: int | list[int]  # Megatron moe_layer_freq: every k-th layer, or a 0/1 list per layer
    grouped_gemm: bool
    token_dispatcher: str  # alltoall with EP, Megatron's default allgather otherwise


@dataclass(frozen=True)
class MLASettings:
    """Multi-latent attention, Megatron-Core's MLATransformerConfig fields (planner.spec.MLASpec renamed)."""

    q_lora_rank: int | None  # None: no query latent (linear_q_proj)
    kv_lora_rank: int
    qk_head_dim: int  # MLASpec.qk_nope_head_dim
    qk_pos_emb_head_dim: int  # MLASpec.qk_rope_head_dim
    v_head_dim: int


@dataclass(frozen=True)
class Settings:
    """What Megatron-Core is told for one plan, after every rule was checked (``settings``)."""

    plan: LaunchPlan
    # model shape
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None  # GQA groups; None: MHA
    kv_channels: int | None  # head dim when it is not hidden / heads
    swiglu: bool
    untie_embeddings: bool
    vocab_size: int
    seq_length: int
    dropout: float
    moe: MoESettings | None
    mla: MLASettings | None
    # parallel shape
    tp: int
    pp: int
    cp: int
    ep: int
    sequence_parallel: bool
    vpp: int
    virtual_stages: int | None  # --num-virtual-stages-per-pipeline-rank (even split with vpp > 1)
    layout: str | None  # --pipeline-model-parallel-layout (any uneven split); never together with the above
    micro_batch_size: int
    global_batch_size: int
    # recompute
    recompute_granularity: str | None  # full | selective | None
    recompute_method: str | None  # uniform | block (full only)
    recompute_num_layers: int | None
    # data parallelism / ZeRO
    distributed_optimizer: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    torch_fsdp2: bool  # ZeRO-3 as torch FSDP2 (untied embeddings, not fp16)
    megatron_fsdp: bool  # ZeRO-3 as Megatron-FSDP (otherwise)
    # precision and kernels
    precision: str  # bf16 | fp16 (the parameter dtype)
    fp8: bool
    fp8_recipe: str | None  # --fp8-recipe (FP8_RECIPES[training.fp8_recipe]) when fp8, else None
    grad_reduce_in_bf16: bool
    accumulate_grads_in_fp32: bool  # fp16 parameters with fp32 gradient accumulation and all-reduce
    tp_comm_overlap: bool
    attention_backend: str | None  # --attention-backend: unfused (eager), fused (cuDNN, flash3); None: auto
    optimizer: str  # adam | sgd
    env: dict[str, str]
    arches: tuple[tuple[str, tuple[int, int] | None], ...]  # (GPU name, compute capability) of the plan's stages
    forced_sequence_parallel: bool = False  # EP > 1 with TP > 1 and the plan without SP (emitters.md 5.2)
    dropped_selective: bool = False  # selective + partial full recompute with flash attention: selective dropped


def _redo(target: str) -> str:
    return f"re-plan with `planner plan JOB --framework {target}`"


def settings(plan: LaunchPlan, target: str = TARGET) -> Settings:
    """Every Megatron rule the plan must meet that check_runnable (planner/frameworks.py, run here first) does not
    already apply, and the values Megatron-Core takes. Raises Inexpressible (exit 4) naming `planner plan JOB
    --framework TARGET`. Sources: emitters.md 1.2-1.4 and 5; Megatron-LM arguments.py validate_args."""
    from planner.frameworks import check_runnable

    check_runnable("megatron", plan, target)  # the rules the search obeys under --framework (ZeRO stages, ...)
    field_ = f"plans[{plan.plan_rank - 1}].layout"
    redo = _redo(target)
    m, t = plan.model, plan.training

    def refuse(key: str, message: str) -> None:
        raise Inexpressible(f"{field_}.{key}" if key else field_, message)

    # ---- model shape (emitters.md 1.2 "Model shape"; arguments.py _add_network_size_args)
    if m.mlp == "relu":
        raise Inexpressible(
            "job.model.mlp",
            f"{target}'s pretrain_gpt.py has no plain-ReLU MLP (its flags give GeLU, --swiglu, --squared-relu or "
            f"--quick-geglu); change model.mlp, then {redo}",
        )
    kv = m.kv_heads
    groups = kv if kv < m.num_attention_heads else None
    head_dim = m.dim_head
    kv_channels = head_dim if m.head_dim is not None and head_dim * m.num_attention_heads != m.hidden_size else None
    mla = None
    if m.mla is not None:  # arguments.py _add_mla_args; MLA sets its head widths itself, so no --kv-channels
        ml = m.mla
        mla = MLASettings(ml.q_lora_rank, ml.kv_lora_rank, ml.qk_nope_head_dim, ml.qk_rope_head_dim, ml.v_head_dim)
        groups = kv_channels = None

    # ---- parallel rules Megatron asserts (TransformerConfig / validate_args) or checks only at run time (5.1-5.2)
    tp, pp, cp, ep, vpp = plan.tp, plan.pp, plan.cp, plan.ep, plan.vpp
    if m.num_attention_heads % tp:
        refuse("tp", f"num_attention_heads ({m.num_attention_heads}) is not divisible by TP ({tp}); {redo}")
    if kv % tp and tp % kv:
        refuse("tp", f"TP ({tp}) and the {kv} query groups do not divide one another (Megatron-Core); {redo}")
    if m.ffn_hidden_size % tp:
        refuse("tp", f"ffn_hidden_size ({m.ffn_hidden_size}) is not divisible by TP ({tp}); {redo}")
    seq = t.seq_length
    if cp > 1 and seq % (2 * cp):
        refuse("cp", f"seq_length ({seq}) must be a multiple of 2*CP ({2 * cp}) (Megatron validate_args); {redo}")
    forced_sp = False
    sp = plan.sequence_parallel and tp > 1  # Megatron turns SP off at TP 1 (validate_args)
    if ep > 1 and tp > 1 and not sp:
        sp, forced_sp = True, True  # MoE with TP needs SP; only a warning upstream (emitters.md 1.3, 5.2)
    if sp and (seq // cp) % tp:
        refuse(
            "sequence_parallel",
            f"sequence parallelism splits each CP shard ({seq // cp} tokens) over TP ({tp}): not divisible; {redo}",
        )
    if plan.tp_comm_overlap and tp > 1 and not sp:
        refuse("tp_comm_overlap", f"TP communication overlap needs sequence parallelism (validate_args); {redo}")
    tp_comm_overlap = plan.tp_comm_overlap and tp > 1
    if vpp > 1:
        if pp == 1:
            refuse("vpp", f"the interleaved schedule (vpp {vpp}) needs pipeline parallelism; {redo}")
        mb = plan.num_microbatches
        if mb < pp or mb % pp:  # schedules.py, default microbatch group size = pp (emitters.md 1.3, 5.1)
            refuse(
                "vpp",
                f"the interleaved schedule needs micro-batches per replica ({mb}) to be a multiple of PP ({pp}) and "
                f"at least PP; {redo}",
            )
        bad = sorted({n for n in plan.stage_layers if n % vpp})
        if bad:
            refuse("stages", f"stage layer counts {bad} do not split into {vpp} model chunks each; {redo}")
    chunks = tuple(plan.chunk_layers())
    virtual_stages = layout = None
    if not plan.even_split:
        layout = layout_string(chunks)  # any uneven split (emitters.md 1.4); the layout also gives the vpp
    elif vpp > 1:
        virtual_stages = vpp

    # ---- recompute (emitters.md 1.2 "Batch, recompute"; arguments.py --recompute-*; 1.3: one count per stage)
    granularity = method = num = None
    dropped_selective = False
    r = plan.recompute_layers
    if plan.recompute == "full":
        granularity, method, num = "full", "uniform", 1
    elif r > 0:
        # --recompute-method block recomputes the first N layers of every model chunk (a TransformerBlock):
        # N = r / vpp per chunk gives r per stage
        if r % vpp:
            refuse(
                "stages",
                f"{r} fully recomputed layers per stage do not split over the {vpp} model chunks of a stage "
                f"(Megatron-Core's recompute_num_layers counts per model chunk); {redo}",
            )
        if r // vpp > min(chunks):
            refuse("stages", f"{r} recomputed layers per stage exceed a model chunk's layers; {redo}")
        granularity, method, num = "full", "block", r // vpp
        dropped_selective = plan.recompute == "selective"  # flash attention: selective is a no-op to drop
    elif plan.recompute == "selective":
        granularity = "selective"

    # ---- data parallelism / ZeRO (emitters.md 1.2: distributed optimizer = ZeRO-1; --use-torch-fsdp2 = ZeRO-3)
    # ZeRO-3: torch FSDP2 (--use-torch-fsdp2) where validate_args lets it run (untied embeddings, not fp16), else
    # Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params, the required flags of
    # Megatron-LM docs/discussions/megatron-fsdp-user-guide), which has neither restriction.
    zero = plan.zero_stage
    fsdp = zero == 3
    torch_fsdp2 = fsdp and not m.tie_embeddings and t.precision != "fp16"
    megatron_fsdp = fsdp and not torch_fsdp2  # ZeRO-2, and ZeRO-3 with PP: refused by check_runnable

    # ---- precision (arguments.py _add_mixed_precision_args, _add_transformer_engine_args)
    arches = tuple(
        (name, gpu_arch(name)) for name in dict.fromkeys(plan.job.cluster[s.group].gpu.name for s in plan.stages)
    )
    fp8_recipe = None
    if t.precision == "fp8":
        old = [name for name, arch in arches if arch is not None and arch < (8, 9)]
        if old:
            raise Inexpressible(
                "job.training.precision",
                f"FP8 (Transformer Engine) needs compute capability 8.9 or newer; {', '.join(old)} has less: train in "
                f"bf16, then {redo}",
            )
        fp8_recipe = FP8_RECIPES.get(t.fp8_recipe)
        if fp8_recipe is None:  # check_runnable refuses it first (Framework.fp8_recipes); kept for other callers
            raise Inexpressible(
                "job.training.fp8_recipe",
                f"{target} has no {t.fp8_recipe} FP8 recipe (--fp8-recipe {' | '.join(FP8_RECIPES.values())}); {redo}",
            )
    precision = "fp16" if t.precision == "fp16" else "bf16"
    grad_bf16 = t.grad_dtype == "bf16" and precision == "bf16"
    accumulate_fp32 = precision == "fp16" and t.grad_dtype == "fp32"

    # ---- MoE (arguments.py _add_moe_args; planner.spec.MoESpec)
    moe = None
    if m.moe is not None:
        mo = m.moe
        if mo.num_experts % ep:
            refuse("ep", f"num_experts ({mo.num_experts}) is not divisible by EP ({ep}); {redo}")
        if mo.expert_ffn_hidden_size % tp:
            refuse("tp", f"the expert FFN ({mo.expert_ffn_hidden_size}) is not divisible by TP ({tp}); {redo}")
        moe = MoESettings(
            num_experts=mo.num_experts,
            top_k=mo.top_k,
            ffn_hidden_size=mo.expert_ffn_hidden_size,
            shared_intermediate_size=mo.shared_experts * mo.expert_ffn_hidden_size if mo.shared_experts else None,
            layer_freq=moe_layer_freq(m),
            grouped_gemm=precision == "bf16",  # validate_args: GroupedGEMM only supports bf16
            token_dispatcher="alltoall" if ep > 1 else "allgather",
        )

    # ---- environment (emitters.md 1.2 last paragraph, 5.3; mixed plans: any stage's arch that needs it)
    env: dict[str, str] = {}
    needs = any(arch is None or arch[0] < 10 for _, arch in arches)
    if (tp > 1 or cp > 1) and not fsdp and needs:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"

    return Settings(
        plan=plan,
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=groups,
        kv_channels=kv_channels,
        swiglu=m.mlp == "swiglu",
        untie_embeddings=not m.tie_embeddings,
        vocab_size=m.vocab_size,
        seq_length=seq,
        dropout=0.1 if m.dropout else 0.0,
        moe=moe,
        mla=mla,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        sequence_parallel=sp,
        vpp=vpp,
        virtual_stages=virtual_stages,
        layout=layout,
        micro_batch_size=plan.micro_batch_size,
        global_batch_size=plan.global_batch_size,
        recompute_granularity=granularity,
        recompute_method=method,
        recompute_num_layers=num,
        distributed_optimizer=zero == 1 or megatron_fsdp,
        overlap_grad_reduce=zero in (0, 1) or megatron_fsdp,
        overlap_param_gather=zero == 1 or megatron_fsdp,
        torch_fsdp2=torch_fsdp2,
        megatron_fsdp=megatron_fsdp,
        precision=precision,
        fp8=t.precision == "fp8",
        fp8_recipe=fp8_recipe,
        grad_reduce_in_bf16=grad_bf16,
        accumulate_grads_in_fp32=accumulate_fp32,
        tp_comm_overlap=tp_comm_overlap,
        attention_backend=ATTENTION_BACKENDS.get(t.attention),
        optimizer="sgd" if t.optimizer == "sgd" else "adam",
        env=env,
        arches=arches,
        forced_sequence_parallel=forced_sp,
        dropped_selective=dropped_selective,
    )


# ---------------------------------------------------------------------------------------------------------------
# Pipeline layout string. Grammar: megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list
# (emitters.md 1.4): stages split by "|", E embedding, t decoder layer, m MTP layer, L loss, "x*n" and "(...)*n"
# repeat, commas cosmetic; stage index = vpp_rank * pp + pp_rank.


def _chunk_text(layers: int) -> str:
    return "" if layers == 0 else "t" if layers == 1 else f"t*{layers}"


def layout_string(chunks) -> str:
    """``--pipeline-model-parallel-layout`` for decoder-layer counts per model chunk (Megatron's chunk order): E on
    the first chunk, L on the last, runs of equal middle chunks as ``(t*n|)*k``."""
    chunks = list(chunks)
    if len(chunks) == 1:
        return "E" + _chunk_text(chunks[0]) + "L"
    first = "E" + _chunk_text(chunks[0])
    last = _chunk_text(chunks[-1]) + "L"
    middle = ""
    i, mid = 0, chunks[1:-1]
    while i < len(mid):
        j = i
        while j < len(mid) and mid[j] == mid[i]:
            j += 1
        run, text = j - i, _chunk_text(mid[i])
        middle += f"({text}|)*{run}" if run > 1 and text else (text + "|") * run
        i = j
    return f"{first}|{middle}{last}"


def parse_layout(text: str, field: str = "--pipeline-model-parallel-layout") -> list[int]:
    """Decoder layers per model chunk of a layout string, as Megatron parses it (see above); E must open the first
    chunk and L close the last. MTP layers are not modelled (SpecError)."""
    s = text.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    stages = s.split("|")
    flat = "".join(stages)
    bad = sorted(set(flat) - set("ELtm"))
    if bad:
        raise SpecError(field, f"invalid layer character(s) {', '.join(map(repr, bad))} in {text!r}; known: E t m L")
    if "m" in flat:
        raise SpecError(field, f"MTP layers (m) in {text!r} are not modelled by the planner")
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise SpecError(field, f"{text!r}: the embedding (E) must open the first stage and the loss (L) close the last")
    return [st.count("t") for st in stages]


# ---------------------------------------------------------------------------------------------------------------
# MoE layer pattern. Megatron --moe-layer-freq (arguments.py moe_freq_type): an int N (layer i is MoE when
# i % N == 0) or a Python list expression of 0/1 per layer; the planner's MoESpec: first_dense_layers dense layers,
# then every moe_layer_freq-th layer MoE (planner.spec.ModelSpec.is_moe_layer).


def moe_layer_freq(model) -> int | list[int]:
    """Megatron's moe_layer_freq for a model: the int when no layer is kept dense first, else the 0/1 list."""
    mo = model.moe
    if mo.first_dense_layers == 0:
        return mo.moe_layer_freq
    return [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]


def pattern_string(model) -> str:
    """The --moe-layer-freq pattern expression of a model with leading dense layers (only ``,\\d[]()+*``, as
    Megatron's _eval_pattern allows)."""
    mo = model.moe
    d, k, n = mo.first_dense_layers, mo.moe_layer_freq, model.num_layers
    parts = [f"[0]*{d}"] if d else []
    q, rest = divmod(max(n - d, 0), k)
    period = "[1]" if k == 1 else f"[1]+[0]*{k - 1}"
    if q:
        parts.append(f"[1]*{q}" if k == 1 else f"({period})*{q}")
    if rest:
        parts.append("[1]" if rest == 1 else f"[1]+[0]*{rest - 1}")
    return "(" + "+".join(parts) + ")"


def eval_pattern(text: str, field: str = "--moe-layer-freq") -> list[int]:
    """A Megatron pattern expression (list literals, + and * by an int) as a list, without eval()."""
    if re.search(r"[^,\d\[\]()+*\s]", text):
        raise SpecError(field, f"invalid pattern {text!r} (only digits, [ ] ( ) , + * are allowed)")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise SpecError(field, f"invalid pattern {text!r}")

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and type(a) is type(b):
                return a + b
            if isinstance(node.op, ast.Mult) and {type(a), type(b)} == {list, int}:
                return a * b if isinstance(b, int) else b * a
        raise SpecError(field, f"invalid pattern {text!r}")

    result = value(tree)
    if not isinstance(result, list) or any(v not in (0, 1) for v in result):
        raise SpecError(field, f"pattern {text!r} must give a list of 0 (dense) and 1 (MoE) per layer")
    return result


# ---------------------------------------------------------------------------------------------------------------
# Flags. Every name below is an add_argument of Megatron-LM megatron/training/arguments.py (emitters.md 1.2).


def flags(s: Settings) -> list[tuple[str, list[str]]]:
    """The pretrain_gpt.py flags of a plan's settings, grouped (model, MoE, parallel, batch, recompute, data
    parallelism, precision, run). Source: arguments.py (_add_network_size_args, _add_moe_args,
    _add_distributed_args, _add_training_args, _add_mixed_precision_args, _add_transformer_engine_args,
    _add_tokenizer_args, _add_data_args) and emitters.md 1.2."""
    out: list[tuple[str, list[str]]] = []

    def add(flag: str, *values: Any) -> None:
        out.append((flag, [str(v) for v in values]))

    # model shape
    add("--num-layers", s.num_layers)
    add("--hidden-size", s.hidden_size)
    add("--ffn-hidden-size", s.ffn_hidden_size)
    add("--num-attention-heads", s.num_attention_heads)
    if s.num_query_groups is not None:
        add("--group-query-attention")  # without it --num-query-groups is ignored (emitters.md 1.2)
        add("--num-query-groups", s.num_query_groups)
    if s.kv_channels is not None:
        add("--kv-channels", s.kv_channels)
    if s.mla is not None:  # arguments.py _add_mla_args; --multi-latent-attention is TransformerConfig's field
        ml = s.mla
        add("--multi-latent-attention")
        if ml.q_lora_rank is not None:  # default None: linear_q_proj without a query latent
            add("--q-lora-rank", ml.q_lora_rank)
        add("--kv-lora-rank", ml.kv_lora_rank)
        add("--qk-head-dim", ml.qk_head_dim)
        add("--qk-pos-emb-head-dim", ml.qk_pos_emb_head_dim)
        add("--v-head-dim", ml.v_head_dim)
        add("--qk-layernorm")  # the latent RMSNorms (q_a_layernorm, kv_a_layernorm): gpt_layer_specs.py MLA branch
    if s.swiglu:
        add("--swiglu")
    add("--position-embedding-type", "rope")
    add("--normalization", "RMSNorm")
    add("--disable-bias-linear")
    if s.untie_embeddings:
        add("--untie-embeddings-and-output-weights")
    add("--attention-dropout", s.dropout)
    add("--hidden-dropout", s.dropout)
    add("--seq-length", s.seq_length)
    add("--max-position-embeddings", s.seq_length)
    add("--tokenizer-type", "NullTokenizer")
    add("--vocab-size", s.vocab_size)
    add("--mock-data")
    if s.attention_backend:
        add("--attention-backend", s.attention_backend)
    # MoE
    if s.moe is not None:
        mo = s.moe
        add("--num-experts", mo.num_experts)
        add("--moe-router-topk", mo.top_k)
        add("--moe-ffn-hidden-size", mo.ffn_hidden_size)
        if mo.shared_intermediate_size:
            add("--moe-shared-expert-intermediate-size", mo.shared_intermediate_size)
        freq = mo.layer_freq if isinstance(mo.layer_freq, int) else pattern_string(s.plan.model)
        add("--moe-layer-freq", freq)
        add("--moe-token-dispatcher-type", mo.token_dispatcher)
        add("--moe-router-load-balancing-type", "aux_loss")
        add("--moe-aux-loss-coeff", "1e-2")
        if mo.top_k == 1:  # TransformerConfig: top-1 softmax routing needs the softmax before the top-k
            add("--moe-router-pre-softmax")
        if mo.grouped_gemm:
            add("--moe-grouped-gemm")
    # parallel shape
    add("--tensor-model-parallel-size", s.tp)
    add("--pipeline-model-parallel-size", s.pp)
    if s.virtual_stages is not None:
        add("--num-virtual-stages-per-pipeline-rank", s.virtual_stages)
    if s.layout is not None:
        add("--pipeline-model-parallel-layout", s.layout)
    add("--context-parallel-size", s.cp)
    if s.moe is not None:
        add("--expert-model-parallel-size", s.ep)
        add("--expert-tensor-parallel-size", s.tp)
    if s.sequence_parallel:
        add("--sequence-parallel")
    if s.tp_comm_overlap:
        add("--tp-comm-overlap")
    # batch
    add("--micro-batch-size", s.micro_batch_size)
    add("--global-batch-size", s.global_batch_size)
    # recompute
    if s.recompute_granularity is not None:
        add("--recompute-granularity", s.recompute_granularity)
    if s.recompute_method is not None:
        add("--recompute-method", s.recompute_method)
        add("--recompute-num-layers", s.recompute_num_layers)
    # data parallelism / ZeRO
    if s.distributed_optimizer:
        add("--use-distributed-optimizer")
    if s.overlap_grad_reduce:
        add("--overlap-grad-reduce")
    if s.overlap_param_gather:
        add("--overlap-param-gather")
    if s.torch_fsdp2:
        add("--use-torch-fsdp2")
        add("--no-gradient-accumulation-fusion")  # validate_args: FSDP2 refuses gradient accumulation fusion
        add("--ckpt-format", "torch_dist")
    if s.megatron_fsdp:  # the required flags of Megatron-LM's Megatron-FSDP user guide
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy", "optim_grads_params")
        add("--no-gradient-accumulation-fusion")
        add("--ckpt-format", "fsdp_dtensor")
    # precision
    add(f"--{s.precision}")
    if s.fp8:
        add("--fp8-format", "hybrid")
        add("--fp8-recipe", s.fp8_recipe)
    if s.grad_reduce_in_bf16:
        add("--grad-reduce-in-bf16")
    if s.accumulate_grads_in_fp32:
        add("--accumulate-allreduce-grads-in-fp32")
    # the run
    add("--optimizer", s.optimizer)
    add("--train-iters", TRAIN_ITERS)
    add("--lr", LR)
    add("--min-lr", MIN_LR)
    add("--lr-decay-style", "cosine")
    add("--lr-warmup-iters", WARMUP_ITERS)
    add("--weight-decay", "0.1")
    add("--clip-grad", "1.0")
    add("--seed", SEED)
    add("--log-interval", 1)
    add("--eval-iters", 0)
    return out


def render(plan: LaunchPlan, options: EmitOptions) -> Bundle:
    """Megatron-LM `pretrain_gpt.py` for one plan: the flags (program and megatron_args.txt), the environment and
    README notes. Raises Inexpressible (exit 4) for what Megatron cannot run (``settings``)."""
    s = settings(plan, TARGET)
    pairs = flags(s)
    argv = [token for flag, values in pairs for token in (flag, *values)]
    text = "".join(shlex.join([flag, *values]) + "\n" for flag, values in pairs)
    return Bundle(
        files={ARGS_FILE: text},
        program=[PROGRAM, *argv],
        env=dict(s.env),
        workdir=WORKDIR,
        notes=notes(s),
    )


def split_text(stage_layers) -> str:
    """Layers per stage for a README line, runs of equal stages shortened: ``1 (x32), 2, 3 (x30), 2``."""
    out, i, layers = [], 0, list(stage_layers)
    while i < len(layers):
        j = i
        while j < len(layers) and layers[j] == layers[i]:
            j += 1
        out.append(f"{layers[i]} (x{j - i})" if j - i > 2 else ", ".join([str(layers[i])] * (j - i)))
        i = j
    return ", ".join(out)


def notes(s: Settings) -> list[str]:
    """README lines for a Megatron-LM bundle: what to replace, and what the non-obvious flags do."""
    plan = s.plan
    lines = [
        f"- `{ARGS_FILE}` holds the same flags as the launch command, one per line.",
        "- Replace `--mock-data` with your data (`--data-path PREFIX --split 99,1,0`) and `--tokenizer-type "
        f"NullTokenizer --vocab-size {s.vocab_size}` with your tokenizer (e.g. `--tokenizer-type "
        "HuggingFaceTokenizer --tokenizer-model PATH`). NullTokenizer adds one end-of-document token, and Megatron "
        "pads the vocabulary to a multiple of 128 x TP.",
        f"- `--train-iters {TRAIN_ITERS} --lr {LR} ...` is a smoke run: the plan fixes the parallel shape and the "
        "batch, not the schedule. Add `--save`/`--load` for checkpoints.",
        "- The planner does not model position embeddings, norms or biases: `--position-embedding-type rope "
        "--normalization RMSNorm --disable-bias-linear` are Llama conventions; change them to your model's.",
    ]
    if s.layout is not None:
        per_stage = split_text(plan.stage_layers)
        lines.append(
            f"- `--pipeline-model-parallel-layout {s.layout}` gives the uneven split ({per_stage} layers per "
            "stage): `|` separates model chunks in Megatron's order (chunk = vpp_rank x PP + pp_rank), `t` is a "
            "decoder layer, `E` the embedding and `L` the loss."
        )
    if s.virtual_stages is not None:
        lines.append(
            f"- `--num-virtual-stages-per-pipeline-rank {s.virtual_stages}` runs the interleaved 1F1B schedule: "
            f"each pipeline rank holds {s.virtual_stages} model chunks."
        )
    if s.recompute_method == "block":
        lines.append(
            f"- `--recompute-granularity full --recompute-method block --recompute-num-layers "
            f"{s.recompute_num_layers}` recomputes the first {s.recompute_num_layers} layer(s) of every model chunk "
            f"in the backward pass: {plan.recompute_layers} of each stage's layers."
        )
    elif s.recompute_method == "uniform":
        lines.append(
            "- `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1` "
            "recomputes every layer in the backward pass."
        )
    elif s.recompute_granularity == "selective":
        lines.append(
            "- `--recompute-granularity selective` recomputes the attention core (Megatron's default "
            "`--recompute-modules core_attn`)."
        )
    if s.dropped_selective:
        lines.append(
            "- The plan also recomputes attention selectively; Megatron takes one granularity, and with flash "
            "attention there are no attention scores to recompute, so only the full recompute is set."
        )
    if s.megatron_fsdp:
        why = "tied embeddings" if plan.model.tie_embeddings else "fp16"
        lines.append(
            "- ZeRO-3 runs as Megatron-FSDP (`--use-megatron-fsdp --data-parallel-sharding-strategy "
            "optim_grads_params --use-distributed-optimizer --no-gradient-accumulation-fusion --ckpt-format "
            f"fsdp_dtensor`): torch FSDP2 (`--use-torch-fsdp2`) refuses the model's {why}. It shards weights, "
            "gradients and optimizer states; CUDA_DEVICE_MAX_CONNECTIONS must be unset or above 1."
        )
    elif s.distributed_optimizer:
        lines.append(
            "- `--use-distributed-optimizer` shards the optimizer states over data parallelism (ZeRO-1); "
            "`--overlap-grad-reduce --overlap-param-gather` overlap its reduce-scatter and all-gather with compute."
        )
    elif s.torch_fsdp2:
        lines.append(
            "- `--use-torch-fsdp2` shards weights, gradients and optimizer states (ZeRO-3); it needs untied "
            "embeddings, `--ckpt-format torch_dist`, no gradient-accumulation fusion, and CUDA_DEVICE_MAX_CONNECTIONS "
            "unset or above 1."
        )
    else:
        lines.append("- Plain data parallelism (ZeRO-0); `--overlap-grad-reduce` overlaps the gradient all-reduce.")
    if s.sequence_parallel:
        lines.append("- `--sequence-parallel` splits the norm and dropout activations over the TP ranks.")
    if s.forced_sequence_parallel:
        lines.append(
            "- The plan had sequence parallelism off; Megatron-Core wants it with expert parallelism and TP > 1 "
            "(emitters.md 5.2), so `--sequence-parallel` is set (it only lowers activation memory)."
        )
    if s.moe is not None:
        lines.append(
            f"- MoE: `--expert-model-parallel-size {s.ep} --expert-tensor-parallel-size {s.tp}` shard the experts "
            "as planned (expert TP = TP); `--moe-token-dispatcher-type` and the aux-loss settings are common "
            "defaults, not part of the plan."
        )
    if s.mla is not None:
        q = f"--q-lora-rank {s.mla.q_lora_rank} " if s.mla.q_lora_rank is not None else ""
        lines.append(
            f"- `--multi-latent-attention {q}--kv-lora-rank {s.mla.kv_lora_rank} ...`: DeepSeek-style multi-head "
            "latent attention as planned; `--qk-layernorm` gives it the RMSNorms of the query and kv latents. RoPE "
            "scaling (`--rope-type`, `--rotary-scaling-factor`, `--mscale`) and multi-token prediction "
            "(`--mtp-num-layers`) are not part of the plan: set them as your model has them."
        )
    if s.moe is not None and not isinstance(s.moe.layer_freq, int):
        mo = plan.model.moe
        lines.append(
            f"- `--moe-layer-freq` lists dense (0) and MoE (1) layers: {mo.first_dense_layers} dense layer(s) first, "
            f"then every {mo.moe_layer_freq}. layer MoE."
        )
    if s.grad_reduce_in_bf16:
        lines.append(
            "- `--grad-reduce-in-bf16` keeps gradient buffers and their reduction in bf16 (the plan's "
            "training.grad_dtype)."
        )
    if s.fp8:
        lines.append(
            f"- `--fp8-format hybrid --fp8-recipe {s.fp8_recipe}`: FP8 GEMMs through Transformer Engine (E4M3 "
            f"forward, E5M2 backward) with {FP8_RECIPE_TEXT[s.fp8_recipe]}, the plan's training.fp8_recipe; on "
            "Blackwell `--fp8-recipe mxfp8` is the usual choice (not modelled by the planner)."
        )
    if s.tp_comm_overlap:
        lines.append("- `--tp-comm-overlap` overlaps TP communication with GEMMs (Transformer Engine userbuffers).")
    if s.attention_backend == "fused":
        lines.append(
            "- `--attention-backend fused` runs cuDNN fused attention (FlashAttention-3 class on Hopper and newer), "
            "as the plan assumed (training.attention: flash3)."
        )
    if s.attention_backend == "unfused":
        lines.append(
            "- `--attention-backend unfused` materializes the attention scores, as the plan assumed "
            "(training.attention: eager)."
        )
    if "CUDA_DEVICE_MAX_CONNECTIONS" in s.env:
        which = ", ".join(f"{name} (sm_{a[0]}{a[1]})" if a else f"{name} (unknown arch)" for name, a in s.arches)
        lines.append(
            "- `CUDA_DEVICE_MAX_CONNECTIONS=1`: Megatron requires it with TP > 1 or CP > 1 before Blackwell "
            f"(compute capability < 10); this plan runs on {which}."
        )
    if plan.mixed:
        lines.append(
            "- Mixed GPU types: Megatron runs one parallel shape on every stage; the launcher orders the nodes so "
            "that each pipeline stage lands on the GPU type the plan chose (PP is the outermost rank dimension)."
        )
    return lines


def read(
    path: Path | str,
    *,
    world_size: int | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
) -> dict:
    """A job dict from a Megatron-LM args file or launch script: planner/emit/megatron_import.py ``read``."""
    from planner.emit import megatron_import

    return megatron_import.read(path, world_size=world_size, gpu=gpu, gpus_per_node=gpus_per_node, model=model)
