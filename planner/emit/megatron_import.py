"""Megatron-LM, the importer: a Megatron-LM launch script or args file (``read``), or the arguments a run prints
at start (``read_arguments``, for planner/profile/megatron_log.py), read back into a job dict with a `layout`
(planner/spec.py), `planner import`. The flags are parsed here; the shell script around them is read by
planner/emit/shell_script.py; the layout and MoE pattern grammars are planner/emit/megatron.py's.

Sources: NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (read at 000c4ac: every flag name, default and
``validate_args`` rule quoted below); ``megatron/core/transformer/transformer_config.py`` (uneven first/last
stages); shared/reference/emitters.md sections 1.2-1.4 (flags and layout grammar) and 4.3 (torchrun).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from planner.emit.megatron import FP8_RECIPES, PROGRAM, eval_pattern, parse_layout
from planner.emit.shell_script import Script, launch_world, read_script
from planner.errors import SpecError

# ---------------------------------------------------------------------------------------------------------------
# The flags the importer reads, by type. Flag meanings: arguments.py (defaults included: --moe-router-topk 2,
# dropout 0.1, ffn 4h or int(8h/3/64)*64 with --swiglu, --global-batch-size = micro-batch x DP).

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
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
}
_FLOAT_FLAGS = {"--attention-dropout", "--hidden-dropout"}
_CHOICE_FLAGS = {
    "--recompute-granularity": ("full", "selective"),
    "--recompute-method": ("uniform", "block"),
    "--fp8-format": ("e4m3", "hybrid"),
    "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
    "--optimizer": ("adam", "sgd"),
    "--data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    "--attention-backend": ("flash", "fused", "unfused", "local", "auto"),
}
_STR_FLAGS = {"--pipeline-model-parallel-layout", "--moe-layer-freq", "--recompute-modules"}
_BOOL_FLAGS = {
    "--group-query-attention",
    "--multi-latent-attention",
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
# --fp8-recipe value -> training.fp8_recipe, for the recipes the planner models (the emitter's FP8_RECIPES turned
# around); the others (mxfp8, blockwise, custom) are refused
FP8_RECIPE_OF_FLAG = {flag: recipe for recipe, flag in FP8_RECIPES.items()}
# Flags that change what the plan would be but that the planner does not model: refused, naming the flag.
_UNMODELLED = {
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
KNOWN_OTHER = frozenset(
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
    --defer-embedding-wgrad-compute --distribute-saved-activations --moe-layer-recompute --fp8-margin
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
    script = read_script(text, str(path), PROGRAM)
    opts = _parse_flags(script.flags)
    return _job(opts, script, world_size=world_size, gpu=gpu, gpus_per_node=gpus_per_node, model=model)


# Printed argument names (argparse dests) that are not their flag's name: Megatron-Core's TransformerConfig field
# ``fp8`` is the --fp8-format flag (its argparse metadata), printed as ``fp8 ... hybrid``.
DEST_FLAGS = {"fp8": "--fp8-format"}


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
        flag = DEST_FLAGS.get(dest) or "--" + dest.replace("_", "-")
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
    script = Script(flags, [], {}, where)
    return _job(
        _parse_flags(flags), script, **{k: given.get(k) for k in ("world_size", "gpu", "gpus_per_node", "model")}
    )


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
        if flag in KNOWN_OTHER or any(flag.startswith(known + "-") for known in _RELEVANT):
            continue
        alt = _SYNONYMS.get(flag) or next(iter(difflib.get_close_matches(flag, sorted(_RELEVANT), 1, 0.85)), None)
        if alt:
            raise SpecError(flag, f"unknown Megatron-LM flag (did you mean '{alt}'?)")


def _job(
    opts_raw: dict[str, list[str]],
    script: Script,
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
    launch_ws, launch_gpn, unresolved = launch_world(script)
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
    mla = _read_mla(o, gqa)
    if mla is not None:
        kv_heads, kv_channels = heads, None  # MLA: a key and value per head, widths from the MLA flags
    if model is not None:
        model_value: Any = model
        _check_preset(model, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads if heads else None)
        _check_preset_mla(model, mla)
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
        if mla is not None:
            model_value["mla"] = mla  # head_dim follows from it (planner.spec.ModelSpec)
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
    fp8_recipe = None
    if fp8:  # without --fp8-format Megatron takes no FP8 recipe (arguments.py: --fp8-recipe, default delayed)
        recipe = o.choice("--fp8-recipe", "delayed")
        if recipe not in FP8_RECIPE_OF_FLAG:
            raise SpecError(
                "--fp8-recipe",
                f"{recipe}: not modelled by the planner (its FP8 recipes: {', '.join(FP8_RECIPE_OF_FLAG)})",
            )
        fp8_recipe = FP8_RECIPE_OF_FLAG[recipe]
    if fp16:
        grad_dtype = "fp32" if o.flag("--accumulate-allreduce-grads-in-fp32") else "bf16"
    else:
        grad_dtype = "bf16" if o.flag("--grad-reduce-in-bf16") else "fp32"
    backend = o.choice("--attention-backend", "auto")
    attention = "eager" if backend in ("unfused", "local") else "flash3" if backend == "fused" else "flash"
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
            **({"fp8_recipe": fp8_recipe} if fp8_recipe else {}),
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


# MLA flag -> planner.spec.MLASpec field, with arguments.py's defaults (_add_mla_args).
_MLA_FLAGS = {
    "--q-lora-rank": ("q_lora_rank", None),
    "--kv-lora-rank": ("kv_lora_rank", 32),
    "--qk-head-dim": ("qk_nope_head_dim", 128),
    "--qk-pos-emb-head-dim": ("qk_rope_head_dim", 64),
    "--v-head-dim": ("v_head_dim", 128),
}


def _read_mla(o: _Opts, gqa: bool) -> dict | None:
    """MLASpec fields from --multi-latent-attention and the MLA flags (arguments.py _add_mla_args, with its
    defaults; without --multi-latent-attention the MLA flags are unused, as in Megatron-LM)."""
    if not o.flag("--multi-latent-attention"):
        return None
    if gqa:  # validate_args
        raise SpecError(
            "--group-query-attention", "Megatron-LM refuses group query attention with --multi-latent-attention"
        )
    return {field: o.int(flag, default) for flag, (field, default) in _MLA_FLAGS.items()}


def _check_preset_mla(model: str, mla: dict | None) -> None:
    """The MLA flags must describe the attention of the model named by --model (each error names its flag)."""
    from planner.catalog import resolve_model

    spec = resolve_model(model, base_dir=Path.cwd(), field="--model")
    if (spec.mla is None) != (mla is None):
        has = "has" if spec.mla is not None else "has no"
        raise SpecError("--multi-latent-attention", f"model {model} {has} multi-latent attention")
    if mla is None:
        return
    for flag, (field, _) in _MLA_FLAGS.items():
        expected = getattr(spec.mla, field)
        if mla[field] != expected:
            raise SpecError(flag, f"{mla[field]} disagrees with model {model} ({expected})")


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
            first_dense, freq = pattern_form(pattern, freq_raw)
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


def pattern_form(pattern: list[int], text: str) -> tuple[int, int]:
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
