"""Megatron-LM: a plan as `pretrain_gpt.py` flags (``render``), and a Megatron-LM launch script or args file read
back into a job (``read``, `planner import`).

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
import difflib
import re
import shlex
from dataclasses import dataclass, field
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
class Settings:
    """What Megatron-Core is told for one plan, after every rule was checked (``settings``)."""

    plan: LaunchPlan
    target: str
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
    # parallel shape
    tp: int
    pp: int
    cp: int
    ep: int
    sequence_parallel: bool
    vpp: int
    virtual_stages: int | None  # --num-virtual-stages-per-pipeline-rank (even split with vpp > 1)
    layout: str | None  # --pipeline-model-parallel-layout (any uneven split); never together with the above
    chunk_layers: tuple[int, ...]  # decoder layers per model chunk, Megatron's order (vpp_rank * pp + pp_rank)
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
    grad_reduce_in_bf16: bool
    accumulate_grads_in_fp32: bool  # fp16 parameters with fp32 gradient accumulation and all-reduce
    tp_comm_overlap: bool
    unfused_attention: bool
    optimizer: str  # adam | sgd
    env: dict[str, str]
    arches: tuple[tuple[str, tuple[int, int] | None], ...]  # (GPU name, compute capability) of the plan's stages
    forced_sequence_parallel: bool = False  # EP > 1 with TP > 1 and the plan without SP (emitters.md 5.2)
    dropped_selective: bool = False  # selective + partial full recompute with flash attention: selective dropped
    notes: tuple[str, ...] = field(default=())


def _redo(target: str) -> str:
    return f"re-plan with `planner plan JOB --framework {target}`"


def settings(plan: LaunchPlan, target: str = TARGET) -> Settings:
    """Every Megatron rule the plan must meet that check_runnable (planner/frameworks.py) does not already apply,
    and the values Megatron-Core takes. Raises Inexpressible (exit 4) naming `planner plan JOB --framework
    TARGET`. Sources: emitters.md 1.2-1.4 and 5; Megatron-LM arguments.py validate_args."""
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
    megatron_fsdp = fsdp and not torch_fsdp2
    if zero not in (0, 1, 3):
        refuse("zero_stage", f"{target} runs ZeRO stage 0, 1 or 3 (FSDP), not {zero}; {redo}")

    # ---- precision (arguments.py _add_mixed_precision_args, _add_transformer_engine_args)
    arches = tuple(
        (name, gpu_arch(name)) for name in dict.fromkeys(plan.job.cluster[s.group].gpu.name for s in plan.stages)
    )
    if t.precision == "fp8":
        old = [name for name, arch in arches if arch is not None and arch < (8, 9)]
        if old:
            raise Inexpressible(
                "job.training.precision",
                f"FP8 (Transformer Engine) needs compute capability 8.9 or newer; {', '.join(old)} has less: train in "
                f"bf16, then {redo}",
            )
    if t.grad_dtype == "bf16+fp32":
        raise Inexpressible(
            "job.training.grad_dtype",
            f"{target} keeps gradients in one buffer (fp32 main grads, or bf16 ones reduced in bf16); "
            f"bf16+fp32 is DeepSpeed's BF16_Optimizer: set training.grad_dtype to fp32 or bf16, then {redo}",
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
        target=target,
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
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        sequence_parallel=sp,
        vpp=vpp,
        virtual_stages=virtual_stages,
        layout=layout,
        chunk_layers=chunks,
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
        grad_reduce_in_bf16=grad_bf16,
        accumulate_grads_in_fp32=accumulate_fp32,
        tp_comm_overlap=tp_comm_overlap,
        unfused_attention=t.attention == "eager",
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
    if s.unfused_attention:
        add("--attention-backend", "unfused")
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
        add("--fp8-recipe", "delayed")
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
            "- `--fp8-format hybrid --fp8-recipe delayed`: FP8 GEMMs through Transformer Engine (E4M3 "
            "forward, E5M2 backward); on Blackwell `--fp8-recipe mxfp8` is the usual choice."
        )
    if s.tp_comm_overlap:
        lines.append("- `--tp-comm-overlap` overlaps TP communication with GEMMs (Transformer Engine userbuffers).")
    if s.unfused_attention:
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


# ---------------------------------------------------------------------------------------------------------------
# The importer: a Megatron-LM launch script or args file -> a job dict (planner/spec.py), `planner import`.
# Flag meanings: arguments.py (defaults included: --moe-router-topk 2, dropout 0.1, ffn 4h or int(8h/3/64)*64
# with --swiglu, --global-batch-size = micro-batch x DP); torchrun: emitters.md 4.3.

_INT_FLAGS = {
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--kv-channels",
    "--seq-length",
    "--vocab-size",
    "--padded-vocab-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--recompute-num-layers",
    "--num-experts",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--moe-router-topk",
    "--num-distributed-optimizer-instances",
    "--cpu-offloading-num-layers",
    "--mtp-num-layers",
}
_FLOAT_FLAGS = {"--attention-dropout", "--hidden-dropout"}
_CHOICE_FLAGS = {
    "--recompute-granularity": ("full", "selective"),
    "--recompute-method": ("uniform", "block"),
    "--fp8-format": ("e4m3", "hybrid"),
    "--optimizer": ("adam", "sgd"),
    "--data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    "--attention-backend": ("flash", "fused", "unfused", "local", "auto"),
}
_STR_FLAGS = {"--pipeline-model-parallel-layout", "--moe-layer-freq", "--recompute-modules"}
_BOOL_FLAGS = {
    "--group-query-attention",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--use-torch-fsdp2",
    "--torch-fsdp2-no-reshard-after-forward",
    "--use-megatron-fsdp",
    "--bf16",
    "--fp16",
    "--grad-reduce-in-bf16",
    "--accumulate-allreduce-grads-in-fp32",
    "--tp-comm-overlap",
    "--recompute-activations",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--use-flash-attn",
}
# Flags that change what the plan would be but that the planner does not model: refused, naming the flag.
_UNMODELLED = {
    "--multi-latent-attention": "multi-latent attention (MLA) changes the attention shapes",
    "--heterogeneous-layers-config-path": "per-layer heterogeneous architectures",
    "--heterogeneous-layers-config-encoded-json": "per-layer heterogeneous architectures",
    "--use-tp-pp-dp-mapping": "the tp-cp-ep-pp-dp rank order (the planner places ranks as tp-cp-ep-dp-pp)",
    "--encoder-num-layers": "encoder-decoder models",
    "--decoder-num-layers": "encoder-decoder models",
    "--fp4-format": "FP4 training",
    "--optimizer-cpu-offload": "optimizer CPU offload",
    "--squared-relu": "squared-ReLU MLPs",
    "--quick-geglu": "quick-GeGLU MLPs",
    "--hybrid-override-pattern": "hybrid Mamba models",
    "--is-hybrid-model": "hybrid Mamba models",
    "--yaml-cfg": "arguments read from a YAML file (give the flags instead)",
    "--use-checkpoint-args": "arguments read from a checkpoint (give the flags instead)",
}
_RELEVANT = _INT_FLAGS | _FLOAT_FLAGS | set(_CHOICE_FLAGS) | _STR_FLAGS | _BOOL_FLAGS | set(_UNMODELLED)
_SYNONYMS = {  # spellings from other tools that Megatron rejects
    "--tensor-parallel-size": "--tensor-model-parallel-size",
    "--tp": "--tensor-model-parallel-size",
    "--pipeline-parallel-size": "--pipeline-model-parallel-size",
    "--pp": "--pipeline-model-parallel-size",
    "--context-parallel": "--context-parallel-size",
    "--expert-parallel-size": "--expert-model-parallel-size",
    "--virtual-pipeline-model-parallel-size": "--num-virtual-stages-per-pipeline-rank",
    "--num-key-value-heads": "--num-query-groups",
    "--batch-size": "--micro-batch-size",
    "--micro-batch": "--micro-batch-size",
    "--mbs": "--micro-batch-size",
    "--global-batch": "--global-batch-size",
    "--gbs": "--global-batch-size",
    "--model-parallel-size": "--tensor-model-parallel-size",
    "--checkpoint-activations": "--recompute-activations",
}
# Megatron-LM flags the planner does not read (data, schedule, logging, checkpoints, kernels): known, so that a
# name close to a flag it reads is not taken for a misspelling of it (arguments.py).
_KNOWN_OTHER = frozenset(
    """
    --use-mcore-models --use-legacy-models --transformer-impl --spec --max-position-embeddings
    --position-embedding-type --rotary-base --rotary-percent --rotary-interleaved --use-rope-scaling
    --rope-scaling-factor --use-rotary-position-embeddings --no-position-embedding --normalization --norm-epsilon
    --apply-layernorm-1p --qk-layernorm --disable-bias-linear --add-qkv-bias --openai-gelu --init-method-std
    --make-vocab-size-divisible-by --vocab-file --merge-file --vocab-extra-ids --tokenizer-type --tokenizer-model
    --tiktoken-pattern --mock-data --data-path --split --data-cache-path --train-data-path --valid-data-path
    --test-data-path --num-workers --no-mmap-bin-files --no-create-attention-mask-in-dataloader --reset-position-ids
    --reset-attention-mask --eod-mask-loss --decoder-seq-length --encoder-seq-length --retriever-seq-length
    --train-iters --train-samples --exit-interval --exit-duration-in-mins --exit-signal-handler --lr --min-lr
    --lr-decay-style --lr-decay-iters --lr-decay-samples --lr-warmup-fraction --lr-warmup-iters --lr-warmup-samples
    --lr-warmup-init --decoupled-lr --decoupled-min-lr --weight-decay --start-weight-decay --end-weight-decay
    --weight-decay-incr-style --clip-grad --adam-beta1 --adam-beta2 --adam-eps --sgd-momentum --seed
    --rampup-batch-size --decrease-batch-size-if-needed --log-interval --log-throughput --log-params-norm
    --log-num-zeros-in-grad --timing-log-level --tensorboard-dir --tensorboard-log-interval --wandb-project
    --wandb-exp-name --wandb-save-dir --eval-iters --eval-interval --save --load --save-interval --ckpt-format
    --no-save-optim --no-load-optim --no-load-rng --finetune --async-save --ckpt-fully-parallel-load
    --distributed-backend --distributed-timeout-minutes --local-rank --tp-comm-overlap-cfg --tp-comm-overlap-rs-dgrad
    --tp-comm-bootstrap-backend --disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs --cp-comm-type
    --hierarchical-context-parallel-sizes --microbatch-group-size-per-virtual-pipeline-stage
    --no-overlap-p2p-communication --overlap-p2p-communication-warmup-flush --pipeline-model-parallel-comm-backend
    --overlap-grad-reduce --overlap-param-gather --overlap-param-gather-with-optimizer-step --no-align-grad-reduce
    --no-align-param-gather --ddp-bucket-size --ddp-num-buckets --ddp-average-in-collective
    --defer-embedding-wgrad-compute --distribute-saved-activations --moe-layer-recompute --fp8-recipe --fp8-margin
    --fp8-interval --fp8-amax-history-len --fp8-amax-compute-algo --fp8-param-gather --no-fp8-wgrad
    --first-last-layers-bf16 --num-layers-at-start-in-bf16 --num-layers-at-end-in-bf16 --fp16-lm-cross-entropy
    --attention-softmax-in-fp32 --apply-query-key-layer-scaling --fp32-residual-connection --loss-scale
    --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis --moe-router-load-balancing-type
    --moe-aux-loss-coeff --moe-z-loss-coeff --moe-token-dispatcher-type --moe-grouped-gemm
    --moe-use-legacy-grouped-gemm --moe-router-topk-scaling-factor --moe-router-dtype --moe-router-fusion
    --moe-router-score-function --moe-router-pre-softmax --moe-router-num-groups --moe-router-group-topk
    --moe-router-enable-expert-bias --moe-router-bias-update-rate --moe-permute-fusion --moe-shared-expert-overlap
    --moe-expert-capacity-factor --moe-pad-expert-input-to-capacity --moe-token-drop-policy
    --overlap-moe-expert-parallel-comm --moe-enable-deepep --moe-aux-loss-coeff --cross-entropy-loss-fusion
    --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion --no-bias-dropout-fusion
    --no-rope-fusion --no-persist-layer-norm --no-gradient-accumulation-fusion --manual-gc --manual-gc-interval
    --calculate-per-token-loss --empty-unused-memory-level --profile --profile-step-start --profile-step-end
    --use-cpu-initialization --use-dist-ckpt --data-parallel-random-init --mtp-loss-scaling-factor
    --use-precision-aware-optimizer --main-grads-dtype --main-params-dtype --exp-avg-dtype --exp-avg-sq-dtype
    --cuda-graph-impl --cuda-graph-scope --use-nccl-ub --use-sharp --no-check-for-nan-in-loss-and-grad
    --nccl-communicator-config-path --high-priority-stream-groups
    """.split()
)
_LAUNCHERS = {"torchrun", "python", "python3", "torch.distributed.run", "torch.distributed.launch"}


def read(
    path: Path | str,
    *,
    world_size: int | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
) -> dict:
    """A job dict (planner/spec.py) from a Megatron-LM args file or a shell launch script (`torchrun ...
    pretrain_gpt.py FLAGS`). Literal values only: shell variables assigned literally in the file (scalars,
    arrays, ``$((...))`` arithmetic, ``${X:-default}``) are substituted; control flow (if/for/case) is not
    evaluated, its bodies are read as straight-line code. Bad input: SpecError (exit 2) naming the flag."""
    from planner.io import read_text

    text = read_text(path, "config")  # a file, or standard input for "-"
    script = _read_script(text, str(path))
    opts = _parse_flags(script.flags)
    return _job(opts, script, world_size=world_size, gpu=gpu, gpus_per_node=gpus_per_node, model=model)


def read_arguments(arguments: dict[str, str], where: str, **given) -> dict:
    """A job dict from the argument values a Megatron-LM run prints at start (``arguments`` block of its log:
    dest -> printed value), through the same rules as ``read``. Only the arguments the importer reads are taken:
    a True switch becomes its flag, False/None are left out, lists become several values. The world size comes
    from ``world_size`` unless given."""
    flags: list[str] = []
    dests = dict(arguments)
    if dests.get("vocab_size", "None") == "None" and dests.get("padded_vocab_size", "None") != "None":
        dests["vocab_size"] = dests["padded_vocab_size"]  # a real tokenizer: the padded size is what was trained
    vpp = dests.pop("virtual_pipeline_model_parallel_size", "None")
    if vpp not in ("None", "1") and dests.get("pipeline_model_parallel_layout", "None") == "None":
        dests.setdefault("num_virtual_stages_per_pipeline_rank", vpp)
    for dest, value in dests.items():
        flag = "--" + dest.replace("_", "-")
        if flag not in _RELEVANT or value in ("None", "False", ""):
            continue
        if value == "True":
            flags.append(flag)
        elif value.startswith("[") and value.endswith("]"):
            flags += [flag, *(v.strip(" '\"") for v in value[1:-1].split(",") if v.strip())]
        else:
            flags += [flag, value]
    if given.get("world_size") is None and arguments.get("world_size", "None").isdigit():
        given["world_size"] = int(arguments["world_size"])
    script = _Script(flags, [], {}, where)
    return _job(
        _parse_flags(flags), script, **{k: given.get(k) for k in ("world_size", "gpu", "gpus_per_node", "model")}
    )


@dataclass
class _Script:
    flags: list[str]
    launcher: list[str]  # tokens before the .py of the training command (torchrun and its flags)
    variables: dict[str, str]
    where: str


_CONTROL = {"if", "then", "else", "elif", "fi", "for", "do", "done", "while", "until", "case", "esac", "function"}
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_ARRAY = re.compile(r"^\s*(?:export\s+|declare\s+-a\s+|local\s+)?([A-Za-z_]\w*)(\+?)=\((.*)\)\s*(?:#.*)?$", re.S)


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and multi-line array assignments `X=( ... )` kept whole."""
    text = re.sub(r"\\\r?\n", " ", text.replace("\r\n", "\n"))
    out: list[str] = []
    buf: list[str] = []
    depth = 0
    for line in text.split("\n"):
        code = _strip_comment(line)
        if buf:
            buf.append(line)
            depth += code.count("(") - code.count(")")
            if depth <= 0:
                out.append("\n".join(buf))
                buf, depth = [], 0
            continue
        if re.match(r"^\s*(?:export\s+|declare\s+-a\s+|local\s+)?[A-Za-z_]\w*\+?=\(", code):
            depth = code.count("(") - code.count(")")
            if depth > 0:
                buf = [line]
                continue
        out.append(line)
    if buf:
        out.append("\n".join(buf))
    return out


def _strip_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (outside quotes, at a word start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise SpecError(where, f"cannot split shell words ({exc}): {text.strip()[:80]!r}")


_VAR = re.compile(
    r"\$\(\((?P<arith>[^()]*(?:\([^()]*\)[^()]*)*)\)\)"
    r"|\$\{(?P<name>[A-Za-z_]\w*)(?P<index>\[[@*]\])?(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_]\w*)"
)


def _expand(word: str, variables: dict[str, str], arrays: dict[str, list[str]]) -> str:
    """A word with literally assigned variables substituted; anything else (``$1``, ``$(cmd)``, unknown names) is
    left as written, so that a value that matters is refused as not literal."""

    def sub(mt: re.Match) -> str:
        if mt.group("arith") is not None:
            expr = _expand(mt.group("arith"), variables, arrays).replace("$", "")
            value = _arith(expr)
            return mt.group(0) if value is None else str(value)
        name = mt.group("name") or mt.group("bare")
        if mt.group("index"):
            return " ".join(arrays[name]) if name in arrays else mt.group(0)
        if name in variables and (variables[name] != "" or mt.group("op") != ":-"):
            return variables[name]
        if name in arrays:
            return arrays[name][0] if arrays[name] else ""
        if mt.group("op"):
            return _expand(mt.group("default") or "", variables, arrays)
        return mt.group(0)

    return _VAR.sub(sub, word)


def _arith(expr: str) -> int | None:
    """An integer shell arithmetic expression (+ - * / % and parentheses), None otherwise."""
    if not re.fullmatch(r"[\d\s+\-*/%()]+", expr or ""):
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return None

    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            if type(node.op) in ops:
                return ops[type(node.op)]
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b:
                return a // b if not isinstance(node.op, ast.Mod) else a % b
        raise ValueError

    try:
        return value(tree)
    except (ValueError, RecursionError):
        return None


def _words(tokens: list[str], variables: dict[str, str], arrays: dict[str, list[str]]) -> list[str]:
    """Tokens after substitution, split into words at white space as bash splits an unquoted expansion (an array
    or a variable holding several flags gives several words)."""
    out: list[str] = []
    for token in tokens:
        expanded = _expand(token, variables, arrays)
        out.extend([token] if expanded == token else expanded.split())
    return out


def _read_script(text: str, where: str) -> _Script:
    """The flags of the training command of a shell script, or of an args file (no command: every flag line)."""
    variables: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    command: tuple[list[str], str, list[str]] | None = None
    loose: list[str] = []
    for line in _logical_lines(text):
        code = line.strip()
        if not code or code.startswith("#"):
            continue
        arr = _ARRAY.match(code)
        if arr:
            name, append, inner = arr.groups()
            elements = []
            for element in _split(inner, where):
                elements.append(_expand(element, variables, arrays))
            arrays[name] = (arrays.get(name, []) if append else []) + elements
            continue
        tokens = _split(code, where)
        if not tokens:
            continue
        if tokens[0] in _CONTROL or tokens[0] in ("{", "}") or tokens[0].endswith("()"):
            tokens = tokens[1:]  # control flow is not evaluated: its bodies are read as straight-line code
            while tokens and tokens[0] in _CONTROL:
                tokens = tokens[1:]
            if not tokens or tokens[0].startswith("["):
                continue
        if tokens[0] in ("export", "declare", "local", "readonly"):
            tokens = [t for t in tokens[1:] if not t.startswith("-")]
        env_prefix = []
        while tokens and _ASSIGN.match(tokens[0]):
            env_prefix.append(tokens.pop(0))
        for assignment in env_prefix:
            name, append, value = _ASSIGN.match(assignment).groups()
            value = _expand(value, variables, arrays)
            variables[name] = variables.get(name, "") + value if append else value
        if not tokens:
            continue
        words = _words(tokens, variables, arrays)
        script_at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
        if script_at is not None and (
            words[script_at].endswith(PROGRAM) or Path(words[0]).name in _LAUNCHERS or "-m" in words[:script_at]
        ):
            found = (words[:script_at], words[script_at], words[script_at + 1 :])
            if command is None or (found[1].endswith(PROGRAM) and not command[1].endswith(PROGRAM)):
                command = found  # the first pretrain_gpt.py command, else the first python command
            continue
        if words[0].startswith("--"):
            loose.extend(words)
    if command is not None:
        launcher, _, rest = command
        return _Script(flags=rest, launcher=launcher, variables=variables, where=where)
    if not loose:
        raise SpecError(where, f"found no `{PROGRAM}` command and no --flags")
    return _Script(flags=loose, launcher=[], variables=variables, where=where)


def _parse_flags(tokens: list[str]) -> dict[str, list[str]]:
    """Flag -> its values (the last occurrence wins, as in argparse); ``--flag=value`` split."""
    opts: dict[str, list[str]] = {}
    current: str | None = None
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token.partition("=")
            current = name
            opts[current] = [value] if eq else []
        elif current is not None:
            opts[current].append(token)
    return opts


class _Opts:
    """Typed access to the parsed flags, each error naming its flag."""

    def __init__(self, opts: dict[str, list[str]]):
        self.opts = opts

    def has(self, flag: str) -> bool:
        return flag in self.opts

    def flag(self, flag: str) -> bool:
        values = self.opts.get(flag)
        if values is None:
            return False
        if values:
            raise SpecError(flag, f"takes no value (got {' '.join(values)!r})")
        return True

    def raw(self, flag: str) -> str | None:
        values = self.opts.get(flag)
        if values is None:
            return None
        if len(values) != 1:
            what = "a value" if not values else f"one value, got {len(values)} ({' '.join(values)!r})"
            raise SpecError(flag, f"expects {what}")
        value = values[0]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # quotes kept by a bash expansion (an array element "--flag 'value'")
        if "$" in value or "`" in value:
            raise SpecError(
                flag,
                f"value {value!r} is not a literal (a shell variable or command this reader "
                "cannot resolve); write the number in the script or pass the flag's value",
            )
        return value

    def int(self, flag: str, default: int | None = None, minimum: int = 1) -> int | None:
        value = self.raw(flag)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise SpecError(flag, f"expected an integer, got {value!r}")
        if number < minimum:
            raise SpecError(flag, f"must be >= {minimum}, got {number}")
        return number

    def float(self, flag: str, default: float) -> float:
        value = self.raw(flag)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise SpecError(flag, f"expected a number, got {value!r}")
        if not 0 <= number < 1:
            raise SpecError(flag, f"expected a probability in [0, 1), got {value!r}")
        return number

    def choice(self, flag: str, default: str | None = None) -> str | None:
        value = self.raw(flag)
        if value is None:
            return default
        choices = _CHOICE_FLAGS[flag]
        if value not in choices:
            raise SpecError(flag, f"invalid choice {value!r}; choose one of {', '.join(choices)}")
        return value


def _check_flags(opts: dict[str, list[str]]) -> None:
    """Refuse flags the planner does not model, and misspellings of the flags it reads."""
    for flag in opts:
        if flag in _UNMODELLED:
            raise SpecError(flag, f"{_UNMODELLED[flag]}: not modelled by the planner")
        if flag in _RELEVANT:
            continue
        if flag in _KNOWN_OTHER or any(flag.startswith(known + "-") for known in _RELEVANT):
            continue
        alt = _SYNONYMS.get(flag) or next(iter(difflib.get_close_matches(flag, sorted(_RELEVANT), 1, 0.85)), None)
        if alt:
            raise SpecError(flag, f"unknown Megatron-LM flag (did you mean '{alt}'?)")


def _launch_world(script: _Script) -> tuple[int | None, int | None, list[str]]:
    """(world size, GPUs per node, what was not literal) from torchrun's --nnodes/--nproc-per-node (emitters.md 4.3)
    or a WORLD_SIZE assignment; a value that is not a literal count counts as not given."""
    opts: dict[str, str] = {}
    tokens = script.launcher
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        key = name.replace("_", "-")
        if key in ("--nnodes", "--nproc-per-node"):
            if not eq:
                value = tokens[i + 1] if i + 1 < len(tokens) else ""
                i += 1
            opts[key] = value
        elif key == "--standalone":
            opts.setdefault("--nnodes", "1")
        i += 1
    counts: dict[str, int] = {}
    unresolved: list[str] = []
    for key, value in opts.items():
        if value.isdigit() and int(value) >= 1:
            counts[key] = int(value)
        else:
            unresolved.append(f"torchrun {key} {value!r}")
    gpn = counts.get("--nproc-per-node")
    if "--nnodes" in counts and gpn is not None:
        return counts["--nnodes"] * gpn, gpn, unresolved
    ws = script.variables.get("WORLD_SIZE")
    if ws is not None:
        if ws.isdigit() and int(ws) >= 1:
            return int(ws), gpn, unresolved
        unresolved.append(f"WORLD_SIZE={ws!r}")
    return None, gpn, unresolved


def _job(
    opts_raw: dict[str, list[str]],
    script: _Script,
    *,
    world_size: int | None,
    gpu: str | None,
    gpus_per_node: int | None,
    model: str | None,
) -> dict:
    """The job dict of parsed Megatron flags. Sources: arguments.py defaults and validate_args (quoted per rule)."""
    from planner.catalog import resolve_gpu

    _check_flags(opts_raw)
    o = _Opts(opts_raw)
    if o.int("--mtp-num-layers", 0, minimum=0):
        raise SpecError("--mtp-num-layers", "multi-token prediction layers are not modelled by the planner")
    if o.int("--num-distributed-optimizer-instances", 1) != 1:
        raise SpecError("--num-distributed-optimizer-instances", "partial distributed optimizers are not modelled")
    if o.int("--cpu-offloading-num-layers", 0, minimum=0):
        raise SpecError("--cpu-offloading-num-layers", "activation CPU offload is not modelled by the planner")

    # ---- cluster
    launch_ws, launch_gpn, unresolved = _launch_world(script)
    ws = world_size if world_size is not None else launch_ws
    if gpu is None:
        raise SpecError("--gpu", "a Megatron-LM config does not name its GPU: pass --gpu NAME (e.g. h100-sxm)")
    gpu_spec = resolve_gpu(gpu, field="--gpu")
    if ws is None:
        found = f" ({', '.join(unresolved)} is not a literal count)" if unresolved else ""
        raise SpecError(
            "--world-size",
            f"the config gives no world size{found}; it reads torchrun --nnodes/--nproc-per-node and WORLD_SIZE=N: "
            "pass --world-size N",
        )
    if ws < 1:
        raise SpecError("--world-size", f"must be >= 1, got {ws}")
    gpn = gpus_per_node or launch_gpn or gpu_spec.gpus_per_node
    if ws % gpn:
        raise SpecError("--world-size", f"{ws} GPUs do not fill whole nodes of {gpn} GPUs; pass --gpus-per-node")
    cluster = [{"gpu": gpu, "nodes": ws // gpn, "gpus_per_node": gpn}]

    # ---- model
    layers = o.int("--num-layers")
    hidden = o.int("--hidden-size")
    heads = o.int("--num-attention-heads")
    swiglu = o.flag("--swiglu")
    gqa = o.flag("--group-query-attention")
    groups = o.int("--num-query-groups", 1)
    kv_heads = groups if gqa else heads  # without --group-query-attention the groups are ignored (emitters 1.2)
    ffn = o.int("--ffn-hidden-size")
    if ffn is None and hidden is not None:
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden  # validate_args default
    kv_channels = o.int("--kv-channels")
    vocab = o.int("--vocab-size") or o.int("--padded-vocab-size")
    dropout = o.float("--attention-dropout", 0.1) > 0 or o.float("--hidden-dropout", 0.1) > 0
    tied = not o.flag("--untie-embeddings-and-output-weights")
    moe = _read_moe(o, ffn, layers)
    if model is not None:
        model_value: Any = model
        _check_preset(model, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads if heads else None)
    else:
        for flag, value in (
            ("--num-layers", layers),
            ("--hidden-size", hidden),
            ("--num-attention-heads", heads),
            ("--vocab-size", vocab),
        ):
            if value is None:
                raise SpecError(flag, "missing: the model shape needs it (or pass --model PRESET)")
        model_value = {
            "num_layers": layers,
            "hidden_size": hidden,
            "ffn_hidden_size": ffn,
            "num_attention_heads": heads,
            "vocab_size": vocab,
            "mlp": "swiglu" if swiglu else "gelu",
            "tie_embeddings": tied,
            "dropout": dropout,
        }
        if kv_heads != heads:
            model_value["num_kv_heads"] = kv_heads
        if kv_channels is not None and kv_channels * heads != hidden:
            model_value["head_dim"] = kv_channels
        if moe is not None:
            model_value["moe"] = moe
    num_layers = layers if layers is not None else _preset_layers(model)

    # ---- training
    seq = o.int("--seq-length")
    if seq is None:
        raise SpecError("--seq-length", "missing: the plan needs the sequence length")
    bf16, fp16 = o.flag("--bf16"), o.flag("--fp16")
    if bf16 and fp16:
        raise SpecError("--fp16", "--bf16 and --fp16 together (validate_args refuses them)")
    if not (bf16 or fp16):
        raise SpecError("--bf16", "no --bf16 or --fp16: the config trains in fp32, which the planner does not model")
    fp8 = o.choice("--fp8-format") is not None
    precision = "fp8" if fp8 else "bf16" if bf16 else "fp16"
    if fp16:
        grad_dtype = "fp32" if o.flag("--accumulate-allreduce-grads-in-fp32") else "bf16"
    else:
        grad_dtype = "bf16" if o.flag("--grad-reduce-in-bf16") else "fp32"
    backend = o.choice("--attention-backend", "auto")
    attention = "eager" if backend in ("unfused", "local") else "flash"
    o.flag("--use-flash-attn")
    optimizer = o.choice("--optimizer", "adam")

    # ---- parallel shape
    tp = o.int("--tensor-model-parallel-size", 1)
    pp = o.int("--pipeline-model-parallel-size", 1)
    cp = o.int("--context-parallel-size", 1)
    ep = o.int("--expert-model-parallel-size", 1)
    etp = o.int("--expert-tensor-parallel-size")
    if etp is not None and etp != tp:
        raise SpecError(
            "--expert-tensor-parallel-size",
            f"{etp} differs from TP ({tp}); the planner shards experts with expert TP = TP",
        )
    if ws % (tp * pp * cp):
        raise SpecError("--world-size", f"{ws} GPUs are not divisible by tp*pp*cp = {tp}*{pp}*{cp} (validate_args)")
    dp = ws // (tp * pp * cp)
    mbs = o.int("--micro-batch-size")
    if mbs is None:
        raise SpecError("--micro-batch-size", "missing (Megatron requires it)")
    gbs = o.int("--global-batch-size", mbs * dp)
    sp = o.flag("--sequence-parallel") and tp > 1  # validate_args turns SP off at TP 1
    tp_overlap = o.flag("--tp-comm-overlap")
    if tp_overlap and not sp:
        raise SpecError("--tp-comm-overlap", "needs --sequence-parallel (validate_args)")
    chunks, vpp = _read_split(o, num_layers, pp)
    stage_layers = [sum(chunks[v * pp + r] for v in range(vpp)) for r in range(pp)]

    # ---- recompute
    recompute, per_stage = _read_recompute(o, chunks, pp, vpp)

    # ---- ZeRO
    zero = _read_zero(o)

    layout: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "ep": ep,
        "vpp": vpp,
        "micro_batch_size": mbs,
        "sequence_parallel": sp,
        "zero_stage": zero,
        "recompute": recompute,
        "tp_comm_overlap": tp_overlap and tp > 1,
    }
    even = len(set(stage_layers)) == 1
    if not even or per_stage:
        stages = []
        for r in range(pp):
            stage: dict[str, Any] = {"layers": stage_layers[r]}
            if per_stage:
                stage["recompute_layers"] = per_stage[r]
            stages.append(stage)
        layout["stages"] = stages
    return {
        "model": model_value,
        "cluster": cluster,
        "training": {
            "seq_length": seq,
            "global_batch_size": gbs,
            "precision": precision,
            "optimizer": optimizer,
            "attention": attention,
            "grad_dtype": grad_dtype,
        },
        "layout": layout,
    }


def _preset_layers(model: str | None) -> int | None:
    if model is None:
        return None
    from planner.catalog import resolve_model

    try:
        return resolve_model(model, base_dir=Path.cwd(), field="--model").num_layers
    except SpecError as exc:
        raise SpecError("--model", exc.message)


def _check_preset(model: str, **given: int | None) -> None:
    """Shape flags that disagree with the model named by --model are refused, naming the flag."""
    from planner.catalog import resolve_model

    try:
        spec = resolve_model(model, base_dir=Path.cwd(), field="--model")
    except SpecError as exc:
        raise SpecError("--model", exc.message)
    names = {
        "layers": ("--num-layers", spec.num_layers),
        "hidden": ("--hidden-size", spec.hidden_size),
        "heads": ("--num-attention-heads", spec.num_attention_heads),
        "kv_heads": ("--num-query-groups", spec.kv_heads),
    }
    for key, value in given.items():
        flag, expected = names[key]
        if value is not None and value != expected:
            raise SpecError(flag, f"{value} disagrees with model {model} ({expected})")


def _read_moe(o: _Opts, ffn: int | None, layers: int | None) -> dict | None:
    """MoESpec fields from --num-experts and friends (arguments.py _add_moe_args)."""
    experts = o.int("--num-experts")
    if not experts:
        if o.has("--moe-layer-freq") or o.has("--moe-ffn-hidden-size"):
            flag = "--moe-layer-freq" if o.has("--moe-layer-freq") else "--moe-ffn-hidden-size"
            raise SpecError(flag, "given without --num-experts")
        return None
    top_k = o.int("--moe-router-topk", 2)
    expert_ffn = o.int("--moe-ffn-hidden-size", ffn)
    shared = o.int("--moe-shared-expert-intermediate-size", 0, minimum=0)
    shared_experts = 0
    if shared:
        if shared % expert_ffn:
            raise SpecError(
                "--moe-shared-expert-intermediate-size",
                f"{shared} is not a whole number of experts of {expert_ffn}; the planner sizes shared experts like "
                "routed ones",
            )
        shared_experts = shared // expert_ffn
    freq_raw = o.raw("--moe-layer-freq")
    first_dense, freq = 0, 1
    if freq_raw is not None:
        if "[" in freq_raw:
            pattern = eval_pattern(freq_raw)
            if layers is not None and len(pattern) != layers:
                raise SpecError("--moe-layer-freq", f"the pattern has {len(pattern)} entries, the model {layers}")
            first_dense, freq = _pattern_form(pattern, freq_raw)
        else:
            try:
                freq = int(freq_raw)
            except ValueError:
                raise SpecError("--moe-layer-freq", f"expected an integer or a pattern, got {freq_raw!r}")
            if freq < 1:
                raise SpecError("--moe-layer-freq", f"must be >= 1, got {freq}")
    return {
        "num_experts": experts,
        "top_k": top_k,
        "expert_ffn_hidden_size": expert_ffn,
        "shared_experts": shared_experts,
        "moe_layer_freq": freq,
        "first_dense_layers": first_dense,
    }


def _pattern_form(pattern: list[int], text: str) -> tuple[int, int]:
    """(first_dense_layers, moe_layer_freq) of a 0/1 layer pattern, when it has that form."""
    ones = [i for i, v in enumerate(pattern) if v]
    if not ones:
        return len(pattern), 1  # every layer dense (first_dense_layers covers the model)
    d = ones[0]
    k = ones[1] - ones[0] if len(ones) > 1 else len(pattern) - d
    if pattern != [1 if i >= d and (i - d) % k == 0 else 0 for i in range(len(pattern))]:
        raise SpecError(
            "--moe-layer-freq",
            f"pattern {text!r} is not 'some dense layers, then every k-th layer MoE', the form the planner models",
        )
    return d, k


def _read_split(o: _Opts, num_layers: int | None, pp: int) -> tuple[list[int], int]:
    """Decoder layers per model chunk (Megatron's order) and the vpp, from the layout, VPP and uneven-split flags
    (arguments.py validate_args: at most one of the three VPP flags; layout excludes first/last)."""
    layout = o.raw("--pipeline-model-parallel-layout")
    virtual = o.int("--num-virtual-stages-per-pipeline-rank")
    per_virtual = o.int("--num-layers-per-virtual-pipeline-stage")
    first = o.int("--decoder-first-pipeline-num-layers", minimum=0)
    last = o.int("--decoder-last-pipeline-num-layers", minimum=0)
    emb = o.flag("--account-for-embedding-in-pipeline-split")
    loss = o.flag("--account-for-loss-in-pipeline-split")
    given = [
        f
        for f, v in (
            ("--pipeline-model-parallel-layout", layout),
            ("--num-virtual-stages-per-pipeline-rank", virtual),
            ("--num-layers-per-virtual-pipeline-stage", per_virtual),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise SpecError(given[1], f"cannot be set together with {given[0]} (validate_args)")
    if layout is not None:
        if first is not None or last is not None or emb or loss:
            raise SpecError("--pipeline-model-parallel-layout", "cannot be set with other pipeline layout arguments")
        chunks = parse_layout(layout)
        if len(chunks) % pp:
            raise SpecError("--pipeline-model-parallel-layout", f"{len(chunks)} stages are not a multiple of PP ({pp})")
        if num_layers is not None and sum(chunks) != num_layers:
            raise SpecError(
                "--pipeline-model-parallel-layout", f"holds {sum(chunks)} decoder layers, the model {num_layers}"
            )
        return chunks, len(chunks) // pp
    if num_layers is None:
        raise SpecError("--num-layers", "missing: the pipeline split needs it")
    if first is not None or last is not None:
        if emb or loss:
            flag = "--account-for-embedding-in-pipeline-split" if emb else "--account-for-loss-in-pipeline-split"
            raise SpecError(flag, "cannot be combined with --decoder-first/last-pipeline-num-layers")
        if per_virtual is not None:
            raise SpecError(
                "--num-layers-per-virtual-pipeline-stage",
                "cannot be combined with uneven first/last stages; use --num-virtual-stages-per-pipeline-rank",
            )
        stages = _first_last(num_layers, pp, first, last)
    else:
        total = num_layers + emb + loss
        if total % pp:
            raise SpecError("--pipeline-model-parallel-size", f"{total} layers are not divisible by PP ({pp})")
        per = total // pp
        stages = [per] * pp
        if emb:
            stages[0] -= 1
        if loss:
            stages[-1] -= 1
    vpp = 1
    if virtual is not None:
        vpp = virtual
    elif per_virtual is not None:
        per_stage = (num_layers + emb + loss) // pp
        if per_stage % per_virtual:
            raise SpecError(
                "--num-layers-per-virtual-pipeline-stage",
                f"{per_virtual} does not divide the {per_stage} layers of a stage",
            )
        vpp = per_stage // per_virtual
    if vpp > 1:
        if emb or loss:
            flag = "--account-for-embedding-in-pipeline-split" if emb else "--account-for-loss-in-pipeline-split"
            raise SpecError(flag, "with virtual pipeline stages: use --pipeline-model-parallel-layout instead")
        bad = [n for n in stages if n % vpp]
        if bad:
            raise SpecError(
                "--num-virtual-stages-per-pipeline-rank",
                f"stage layer counts {sorted(set(bad))} do not split into {vpp} chunks",
            )
    chunks = [stages[r] // vpp for _ in range(vpp) for r in range(pp)]
    return chunks, vpp


def _first_last(num_layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Per-stage layers of --decoder-first/last-pipeline-num-layers: the rest split evenly over the middle stages
    (TransformerConfig.__post_init__, emitters.md 1.3)."""
    middle_stages = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    flag = "--decoder-first-pipeline-num-layers" if first is not None else "--decoder-last-pipeline-num-layers"
    if rest < 0 or (middle_stages <= 0 and rest) or (middle_stages > 0 and rest % middle_stages):
        raise SpecError(
            flag, f"the {rest} remaining layers do not split evenly over {max(middle_stages, 0)} middle stages"
        )
    per = rest // middle_stages if middle_stages > 0 else 0
    stages = [per] * pp
    if first is not None:
        stages[0] = first
    if last is not None:
        stages[-1] = last
    if min(stages) < 1:
        raise SpecError(flag, "every pipeline stage needs at least one layer")
    return stages


def _read_recompute(o: _Opts, chunks: list[int], pp: int, vpp: int) -> tuple[str, list[int] | None]:
    """The layout's recompute baseline and per-stage fully recomputed layers (arguments.py --recompute-*; block
    recomputes the first N layers of every model chunk)."""
    granularity = o.choice("--recompute-granularity")
    if o.flag("--recompute-activations"):
        granularity = "selective"  # validate_args
    method = o.choice("--recompute-method")
    num = o.int("--recompute-num-layers", minimum=1)
    modules = o.opts.get("--recompute-modules")
    if modules is not None and granularity == "selective" and [m for m in modules if m != "core_attn"]:
        raise SpecError("--recompute-modules", f"{' '.join(modules)}: only core_attn selective recompute is modelled")
    if granularity is None:
        return "none", None
    if granularity == "selective":
        if method is not None:
            raise SpecError("--recompute-method", "is not allowed with selective recompute (validate_args)")
        return "selective", None
    if method is None or num is None:
        flag = "--recompute-method" if method is None else "--recompute-num-layers"
        raise SpecError(flag, "full recompute needs --recompute-method and --recompute-num-layers (TransformerConfig)")
    if method == "uniform":
        return "full", None
    per_stage = [sum(min(num, chunks[v * pp + r]) for v in range(vpp)) for r in range(pp)]
    return "none", per_stage


def _read_zero(o: _Opts) -> int:
    """ZeRO stage: --use-torch-fsdp2 = 3 (2 without resharding after forward), --use-megatron-fsdp by its
    sharding strategy, --use-distributed-optimizer = 1, else 0 (emitters.md 1.2)."""
    distopt = o.flag("--use-distributed-optimizer")
    if o.flag("--use-torch-fsdp2"):
        if distopt:
            raise SpecError("--use-torch-fsdp2", "is not supported with --use-distributed-optimizer (validate_args)")
        return 2 if o.flag("--torch-fsdp2-no-reshard-after-forward") else 3
    if o.flag("--use-megatron-fsdp"):
        strategy = o.choice("--data-parallel-sharding-strategy")
        if strategy is None:
            raise SpecError(
                "--data-parallel-sharding-strategy",
                "missing with --use-megatron-fsdp; its default differs between Megatron releases, give it",
            )
        return {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy]
    return 1 if distopt else 0
