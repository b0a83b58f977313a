"""Megatron-Bridge: a plan as Hydra overrides of `scripts/training/run_recipe.py` (``render``).

Megatron-Bridge's ``cfg.model`` is a Megatron-Core ``TransformerConfig`` (GPTModelProvider), so the rules and values
are those of planner/emit/megatron.py (``settings``); only their spelling differs. No importer: Bridge configs are
Python recipes, not files to read back.

Sources (keys verified there): shared/reference/emitters.md 4.1; NVIDIA-NeMo/Megatron-Bridge
``docs/megatron-lm-to-megatron-bridge.md`` (the flag -> override table), ``scripts/translate_mlm_to_bridge.py``
(ARG_MAP), ``scripts/training/run_recipe.py`` (``--recipe`` + trailing overrides),
``src/megatron/bridge/recipes/gpt/vanilla_gpt.py`` (``vanilla_gpt_pretrain_config``: bare GPTModelProvider with
Megatron-LM pretrain_gpt.py defaults, NullTokenizer, no data blend = mock data; exported by
``megatron.bridge.recipes``), ``src/megatron/bridge/training/mixed_precision.py`` (preset names and modifiers),
``src/megatron/bridge/training/config.py`` (``dist.use_torch_fsdp2``, ``ddp.use_megatron_fsdp`` with
``checkpoint.ckpt_format=fsdp_dtensor``, ``dataset.seq_length``).
"""

from __future__ import annotations

from typing import Any

from planner.emit import megatron
from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible

TARGET = "megatron-bridge"
PROGRAM = "scripts/training/run_recipe.py"
RECIPE = "vanilla_gpt_pretrain_config"
WORKDIR = '"${MEGATRON_BRIDGE:?set MEGATRON_BRIDGE to your Megatron-Bridge checkout}"'
OVERRIDES_FILE = "bridge_overrides.txt"


def _value(value: Any) -> str:
    """A Hydra override value: true/false, numbers, lists as [a,b], strings with | ( ) * quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    text = str(value)
    if any(c in text for c in "|()*[]{},= '\""):
        return "'" + text.replace("'", "\\'") + "'"
    return text


# --fp8-recipe -> the registered preset with that recipe (Megatron-Bridge training/mixed_precision.py, read at
# 05097809 and d9f7643 and in the version with MIXED_PRECISION_MODIFIERS): bf16_with_fp8_delayed_scaling_mixed sets
# fp8="hybrid", fp8_recipe="delayed"; bf16_with_fp8_current_scaling_mixed sets fp8="hybrid", fp8_recipe="tensorwise"
# (and keeps the first and last transformer layer in BF16: first_last_layers_bf16, one layer each).
FP8_PRESETS = {
    "delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "tensorwise": "bf16_with_fp8_current_scaling_mixed",
}


def mixed_precision(s: megatron.Settings) -> str:
    """The mixed_precision preset: bf16_mixed, fp16_mixed, or for fp8 the preset of the plan's recipe (FP8_PRESETS:
    bf16_with_fp8_delayed_scaling_mixed for Megatron-LM's --fp8-format hybrid --fp8-recipe delayed,
    bf16_with_fp8_current_scaling_mixed for --fp8-recipe tensorwise), with the _bf16_grad_reduce modifier for bf16
    gradients. Source: Megatron-Bridge training/mixed_precision.py (registered presets, MIXED_PRECISION_MODIFIERS).
    An FP8 recipe without a preset is refused (Inexpressible, exit 4)."""
    if s.fp8:
        name = FP8_PRESETS.get(s.fp8_recipe)
        if name is None:  # megatron.settings refuses it first; kept for recipes Megatron-LM has and Bridge has not
            raise Inexpressible(
                "job.training.fp8_recipe",
                f"Megatron-Bridge has no mixed_precision preset for the {s.fp8_recipe} FP8 recipe (presets: "
                f"{', '.join(f'{r}: {p}' for r, p in FP8_PRESETS.items())}); change training.fp8_recipe, then "
                f"{megatron._redo(TARGET)}",
            )
    else:
        name = "fp16_mixed" if s.precision == "fp16" else "bf16_mixed"
    if s.grad_reduce_in_bf16:
        name += "_bf16_grad_reduce"
    return name


def overrides(s: megatron.Settings) -> list[str]:
    """run_recipe.py overrides of vanilla_gpt_pretrain_config for a plan's settings. Mapping: Megatron-Bridge
    docs/megatron-lm-to-megatron-bridge.md and scripts/translate_mlm_to_bridge.py ARG_MAP (each line names the
    Megatron-LM flag of planner/emit/megatron.py ``flags`` it stands for)."""
    if s.mla is not None:
        # Multi-latent attention needs Megatron-Core's MLATransformerConfig (q_lora_rank, kv_lora_rank, qk_head_dim,
        # qk_pos_emb_head_dim, v_head_dim): Bridge has it only in its DeepSeek/Kimi providers
        # (models/deepseek/deepseek_provider.py DeepSeekModelProvider(MLATransformerConfig, GPTModelProvider)).
        # The recipe's GPTModelProvider has none of these fields (Hydra refuses the override keys) and its layer
        # spec (gpt_provider.py transformer_engine_layer_spec) builds no MLA, so the overrides cannot express it.
        raise Inexpressible(
            "job.model.mla",
            f"{RECIPE} builds a GPTModelProvider, which has no multi-latent attention (MLATransformerConfig's "
            "q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim): emit the plan for megatron, "
            "or start from Megatron-Bridge's DeepSeek recipes",
        )
    out: list[str] = []

    def add(key: str, value: Any) -> None:
        out.append(f"{key}={_value(value)}")

    # model shape (--num-layers ... ; --swiglu -> gated_linear_unit + activation_func=silu)
    add("model.num_layers", s.num_layers)
    add("model.hidden_size", s.hidden_size)
    add("model.ffn_hidden_size", s.ffn_hidden_size)
    add("model.num_attention_heads", s.num_attention_heads)
    if s.num_query_groups is not None:
        add("model.num_query_groups", s.num_query_groups)
    if s.kv_channels is not None:
        add("model.kv_channels", s.kv_channels)
    if s.swiglu:
        add("model.gated_linear_unit", True)
        add("model.activation_func", "silu")
    add("model.position_embedding_type", "rope")
    add("model.normalization", "RMSNorm")
    add("model.add_bias_linear", False)  # --disable-bias-linear
    add("model.share_embeddings_and_output_weights", not s.untie_embeddings)
    add("model.attention_dropout", s.dropout)
    add("model.hidden_dropout", s.dropout)
    add("model.seq_length", s.seq_length)  # --seq-length: model.seq_length and dataset.seq_length
    add("dataset.seq_length", s.seq_length)
    add("model.max_position_embeddings", s.seq_length)
    add("tokenizer.vocab_size", s.vocab_size)  # the recipe's NullTokenizer
    if s.attention_backend:
        add("model.attention_backend", s.attention_backend)
    # MoE (--num-experts -> model.num_moe_experts, --moe-* -> model.moe_*)
    if s.moe is not None:
        mo = s.moe
        add("model.num_moe_experts", mo.num_experts)
        add("model.moe_router_topk", mo.top_k)
        add("model.moe_ffn_hidden_size", mo.ffn_hidden_size)
        if mo.shared_intermediate_size:
            add("model.moe_shared_expert_intermediate_size", mo.shared_intermediate_size)
        add("model.moe_layer_freq", mo.layer_freq)  # an int, or the 0/1 list per layer
        add("model.moe_token_dispatcher_type", mo.token_dispatcher)
        add("model.moe_router_load_balancing_type", "aux_loss")
        add("model.moe_aux_loss_coeff", 0.01)
        if mo.top_k == 1:  # TransformerConfig: top-1 softmax routing needs the softmax before the top-k
            add("model.moe_router_pre_softmax", True)
        if mo.grouped_gemm:
            add("model.moe_grouped_gemm", True)
    # parallel shape
    add("model.tensor_model_parallel_size", s.tp)
    add("model.pipeline_model_parallel_size", s.pp)
    if s.layout is not None:
        add("model.pipeline_model_parallel_layout", s.layout)
    if s.vpp > 1:  # Megatron-Core checks it against the layout's vpp when both are given
        add("model.virtual_pipeline_model_parallel_size", s.vpp)
    add("model.context_parallel_size", s.cp)
    if s.moe is not None:
        add("model.expert_model_parallel_size", s.ep)
        add("model.expert_tensor_parallel_size", s.tp)
    add("model.sequence_parallel", s.sequence_parallel)
    # batch
    add("train.micro_batch_size", s.micro_batch_size)
    add("train.global_batch_size", s.global_batch_size)
    # recompute
    if s.recompute_granularity is not None:
        add("model.recompute_granularity", s.recompute_granularity)
    if s.recompute_method is not None:
        add("model.recompute_method", s.recompute_method)
        add("model.recompute_num_layers", s.recompute_num_layers)
    # data parallelism / ZeRO (Bridge syncs ddp.* and optimizer.use_distributed_optimizer; FSDP2 is dist.*)
    add("ddp.use_distributed_optimizer", s.distributed_optimizer)
    add("optimizer.use_distributed_optimizer", s.distributed_optimizer)
    add("ddp.overlap_grad_reduce", s.overlap_grad_reduce)
    add("ddp.overlap_param_gather", s.overlap_param_gather)
    if s.torch_fsdp2:
        add("dist.use_torch_fsdp2", True)
        add("model.gradient_accumulation_fusion", False)
        add("checkpoint.ckpt_format", "torch_dist")
    if s.megatron_fsdp:  # Bridge config.py: Megatron-FSDP only with the fsdp_dtensor checkpoint format
        add("ddp.use_megatron_fsdp", True)
        add("ddp.data_parallel_sharding_strategy", "optim_grads_params")
        add("model.gradient_accumulation_fusion", False)
        add("checkpoint.ckpt_format", "fsdp_dtensor")
    # precision
    add("mixed_precision", mixed_precision(s))
    # the run (a smoke run, as megatron.py)
    add("optimizer.optimizer", s.optimizer)
    add("train.train_iters", megatron.TRAIN_ITERS)
    add("optimizer.lr", megatron.LR)
    add("optimizer.min_lr", megatron.MIN_LR)
    add("scheduler.lr_warmup_iters", megatron.WARMUP_ITERS)
    add("rng.seed", megatron.SEED)
    add("logger.log_interval", 1)
    return out


def render(plan: LaunchPlan, options: EmitOptions) -> Bundle:
    """Megatron-Bridge run_recipe.py for one plan: overrides (program and bridge_overrides.txt), environment and
    README notes. Raises Inexpressible (exit 4) for what Megatron-Core cannot run (megatron.settings)."""
    s = megatron.settings(plan, TARGET)
    lines = overrides(s)
    return Bundle(
        files={OVERRIDES_FILE: "".join(line + "\n" for line in lines)},
        program=[PROGRAM, "--recipe", RECIPE, *lines],
        env=dict(s.env),
        workdir=WORKDIR,
        notes=notes(s),
    )


def notes(s: megatron.Settings) -> list[str]:
    """README lines for a Megatron-Bridge bundle."""
    lines = [
        f"- `--recipe {RECIPE}` (Megatron-Bridge `src/megatron/bridge/recipes/gpt/vanilla_gpt.py`) is the bare "
        "GPT recipe with Megatron-LM `pretrain_gpt.py` defaults; every model, parallel and batch setting of the "
        f"plan is an override, listed one per line in `{OVERRIDES_FILE}`.",
        "- The recipe has no data blend, so Bridge trains on mock data with a NullTokenizer "
        f"(`tokenizer.vocab_size={s.vocab_size}`): set `dataset.data_path=PREFIX` and your tokenizer "
        "(`tokenizer.tokenizer_type=HuggingFaceTokenizer tokenizer.tokenizer_model=PATH`) for real training.",
        f"- `train.train_iters={megatron.TRAIN_ITERS}` and the learning rates are a smoke run; the plan fixes the "
        "parallel shape and the batch.",
        "- The planner does not model position embeddings, norms or biases: `model.position_embedding_type=rope "
        "model.normalization=RMSNorm model.add_bias_linear=false` are Llama conventions; change them to your model's.",
        "- Key names follow Bridge's `docs/megatron-lm-to-megatron-bridge.md`; releases before `dataset.seq_length` "
        "call it `dataset.sequence_length`.",
    ]
    if s.layout is not None:
        split = megatron.split_text(s.plan.stage_layers)
        lines.append(
            f"- `model.pipeline_model_parallel_layout` gives the uneven split ({split} layers per stage): `|` "
            "separates model chunks (chunk = vpp_rank x PP + pp_rank), `t` is a decoder layer, `E` the embedding "
            "and `L` the loss."
        )
    if s.recompute_method == "block":
        lines.append(
            f"- `model.recompute_method=block model.recompute_num_layers={s.recompute_num_layers}` recomputes the "
            f"first {s.recompute_num_layers} layer(s) of every model chunk: {s.plan.recompute_layers} per stage."
        )
    if s.dropped_selective:
        lines.append(
            "- The plan also recomputes attention selectively; Megatron-Core takes one granularity, and with flash "
            "attention there are no attention scores to recompute, so only the full recompute is set."
        )
    if s.megatron_fsdp:
        lines.append(
            "- ZeRO-3 runs as Megatron-FSDP (`ddp.use_megatron_fsdp=true "
            "ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.ckpt_format=fsdp_dtensor`): torch "
            "FSDP2 refuses tied embeddings and fp16. CUDA_DEVICE_MAX_CONNECTIONS must be unset or above 1."
        )
    elif s.torch_fsdp2:
        lines.append(
            "- `dist.use_torch_fsdp2=true` shards weights, gradients and optimizer states (ZeRO-3); it needs untied "
            "embeddings and no gradient-accumulation fusion, and CUDA_DEVICE_MAX_CONNECTIONS unset or above 1."
        )
    elif s.distributed_optimizer:
        lines.append(
            "- `ddp.use_distributed_optimizer=true` shards the optimizer states over data parallelism (ZeRO-1)."
        )
    if s.forced_sequence_parallel:
        lines.append(
            "- The plan had sequence parallelism off; Megatron-Core wants it with expert parallelism and TP > 1 "
            "(emitters.md 5.2), so `model.sequence_parallel=true` is set (it only lowers activation memory)."
        )
    if s.fp8:
        lines.append(
            f"- `mixed_precision={mixed_precision(s)}`: FP8 GEMMs through Transformer Engine (`fp8=hybrid`) with "
            f"{megatron.FP8_RECIPE_TEXT[s.fp8_recipe]}, the plan's training.fp8_recipe (Megatron-LM `--fp8-recipe "
            f"{s.fp8_recipe}`); the preset also gathers parameters in FP8 (`fp8_param_gather`)."
        )
    if s.fp8 and s.fp8_recipe == "tensorwise":
        lines.append(
            "- The current-scaling preset keeps the first and the last transformer layer in BF16 "
            "(`first_last_layers_bf16`, one layer each); the plan prices every layer's GEMMs in FP8. Set "
            "`first_last_layers_bf16=False` on the MixedPrecisionConfig in a custom recipe to match it."
        )
    if s.grad_reduce_in_bf16:
        lines.append(
            f"- `mixed_precision={mixed_precision(s)}`: the `_bf16_grad_reduce` modifier keeps gradients in bf16 "
            "(the plan's training.grad_dtype); Bridge releases without preset modifiers need "
            "`grad_reduce_in_fp32=False` in a custom recipe."
        )
    if s.accumulate_grads_in_fp32:
        lines.append(
            "- The plan accumulates fp16 gradients in fp32; the `fp16_mixed` preset reduces them in fp16: set "
            "`grad_reduce_in_fp32=True` on the MixedPrecisionConfig in a custom recipe to match it."
        )
    if s.tp_comm_overlap:
        lines.append(
            "- The plan overlaps TP communication with GEMMs (Megatron-LM `--tp-comm-overlap`). In Bridge that is a "
            "`comm_overlap` CommOverlapConfig(tp_comm_overlap=True) built in a Python recipe, which "
            f"`{RECIPE}` does not have: add one, or expect the step to run slower than the plan predicts."
        )
    if "CUDA_DEVICE_MAX_CONNECTIONS" in s.env:
        lines.append(
            "- `CUDA_DEVICE_MAX_CONNECTIONS=1`: Megatron-Core wants it with TP > 1 or CP > 1 before Blackwell "
            "(compute capability < 10)."
        )
    return lines
