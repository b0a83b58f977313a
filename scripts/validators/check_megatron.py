"""Megatron harness (emitters.md 1.6, recipes A and C): run with .venv-validators/megatron/bin/python (Python 3.12,
torch 2.14.1, megatron-core 0.19.2, whose wheel ships megatron/training).

Two kinds of case:
  {"id", "kind": "megatron", "argv": pretrain_gpt.py's arguments, "env": the environment the launcher exports,
   "world_size", "arch": the node's GPU major arch (8 A100, 9 H100, 10 B200)}
      parse_args + validate_args + core_transformer_config_from_args (TransformerConfig.__post_init__) + the
      micro-batch calculator, with the recipe's two monkeypatches (GPU arch query, moe_grouped_gemm capability
      query) and apply_rope_fusion=False; then initialize_model_parallel on a `fake` process group (rank groups,
      expert constraints) and the layers each (pipeline rank, virtual stage) builds.
  {"id", "kind": "bridge", "overrides": {"model.x": value, "train.y": value, ...}, "world_size"}
      Megatron-Bridge's model.* block through megatron-core's TransformerConfig (recipe C; Bridge's
      GPTModelProvider is a TransformerConfig subclass), ConfigContainer's world-size rule, and the same rank
      groups and layer split.
Facts: what Megatron derived (degrees, micro-batches, recompute, model shape, layers per stage, stage ranks)."""

from __future__ import annotations

import os
import shlex
import sys

from _harness import Rejected, serve

M: dict = {}
ARCH = {"value": 9}
BASE_ENV = dict(os.environ)

# Fields Bridge's GPTModelProvider adds to TransformerConfig (Megatron-Bridge src/megatron/bridge/models/
# gpt_provider.py); they are accepted as model.* overrides but not passed to TransformerConfig.
BRIDGE_PROVIDER_FIELDS = {
    "fp16_lm_cross_entropy", "parallel_output", "share_embeddings_and_output_weights", "make_vocab_size_divisible_by",
    "position_embedding_type", "rotary_base", "rotary_percent", "seq_len_interpolation_factor", "seq_length",
    "attention_softmax_in_fp32", "deallocate_pipeline_outputs", "scatter_embedding_sequence_parallel",
    "tp_only_amax_red", "tp_comm_overlap_cfg", "use_transformer_engine_full_layer_spec",
    "use_transformer_engine_op_fuser", "transformer_layer_spec", "generation_config", "vocab_size", "should_pad_vocab",
    "num_moe_experts", "moe_grouped_gemm", "qk_layernorm", "fp8", "normalization", "mtp_enabled",
    "init_model_with_meta_device", "use_te_rng_tracker", "enable_cuda_graph", "virtual_pipeline_model_parallel_size",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "masked_softmax_fusion",
    "cross_entropy_loss_fusion", "gradient_accumulation_fusion", "restore_modelopt_state",
    # Bridge's own MLM translator (scripts/translate_mlm_to_bridge.py ARG_MAP) and docs/megatron-lm-to-megatron-
    # bridge.md write model.max_position_embeddings; not a TransformerConfig field, so not checked beyond the name
    "max_position_embeddings",
}  # fmt: skip


def setup() -> None:
    import dataclasses

    import megatron.core.parallel_state as ps
    import megatron.training.arguments as A
    import torch
    import torch.distributed as dist
    from megatron.core import num_microbatches_calculator as nmc
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from torch.testing._internal.distributed.fake_pg import FakeStore

    A.get_device_arch_version = lambda: ARCH["value"]  # validate_args queries cuda:0 when TP>1 or CP>1
    torch.cuda.get_device_capability = lambda *a, **k: (ARCH["value"], 0)  # only --moe-grouped-gemm asks
    M.update(
        A=A, nmc=nmc, ps=ps, dist=dist, FakeStore=FakeStore, torch=torch, TransformerConfig=TransformerConfig,
        layers_to_build=get_num_layers_to_build, tc_fields={f.name for f in dataclasses.fields(TransformerConfig)},
    )  # fmt: skip


def _env(extra: dict, world: int) -> None:
    os.environ.clear()
    os.environ.update({k: v for k, v in BASE_ENV.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"})
    os.environ.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"})
    os.environ.update({k: str(v) for k, v in (extra or {}).items()})


def _groups_and_split(cfg, world: int, tp: int, pp: int, vpp, cp: int, ep: int, etp, order: str) -> dict:
    """initialize_model_parallel on a fake process group, then the layers each (pp rank, virtual stage) builds and
    the global ranks of each pipeline stage."""
    ps, dist = M["ps"], M["dist"]
    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    dist.init_process_group("fake", store=M["FakeStore"](), rank=0, world_size=world)
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            order=order,
            create_gloo_process_groups=False,
        )
        gen = ps.RankGenerator(tp=tp, ep=1, dp=world // (tp * pp * cp), pp=pp, cp=cp, order=order)
        pp_groups = gen.get_ranks("pp")
        stage_ranks = [sorted(g[s] for g in pp_groups) for s in range(pp)]
        layers = []
        for r in range(pp):
            ps.set_pipeline_model_parallel_rank(r)
            chunks = []
            for v in range(vpp or 1):
                chunks.append(M["layers_to_build"](cfg, vp_stage=v if vpp else None, pp_rank=r))
            layers.append(chunks)
        return {
            "expert_dp": ps.get_expert_data_parallel_world_size() if ep > 1 else None,
            "stage_ranks": [[rs[0], rs[-1], len(rs)] for rs in stage_ranks],
            "chunk_layers": layers,
            "stage_layers": [sum(c) for c in layers],
        }
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def check_megatron(case: dict) -> dict:
    A, nmc = M["A"], M["nmc"]
    world = int(case["world_size"])
    ARCH["value"] = int(case.get("arch") or 9)
    _env(case.get("env"), world)
    sys.argv = ["pretrain_gpt.py"] + [str(a) for a in case["argv"]]
    args = A.validate_args(A.parse_args())  # unknown flag -> SystemExit(2)
    args.apply_rope_fusion = False  # the fused-RoPE check needs Transformer Engine; a kernel choice only
    cfg = A.core_transformer_config_from_args(args)
    nmc.destroy_num_microbatches_calculator()
    nmc.init_num_microbatches_calculator(
        0,
        args.rampup_batch_size,
        args.global_batch_size,
        args.micro_batch_size,
        args.data_parallel_size,
        args.decrease_batch_size_if_needed,
    )
    vpp = args.virtual_pipeline_model_parallel_size
    order = "tp-cp-ep-pp-dp" if getattr(args, "use_tp_pp_dp_mapping", False) else "tp-cp-ep-dp-pp"
    facts = {
        "tp": args.tensor_model_parallel_size,
        "pp": args.pipeline_model_parallel_size,
        "dp": args.data_parallel_size,
        "cp": args.context_parallel_size,
        "ep": args.expert_model_parallel_size,
        "etp": args.expert_tensor_parallel_size,
        "vpp": vpp or 1,
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
        "num_microbatches": nmc.get_num_microbatches(),
        "seq_length": args.seq_length,
        "sequence_parallel": bool(args.sequence_parallel),
        "use_distributed_optimizer": bool(args.use_distributed_optimizer),
        "use_torch_fsdp2": bool(getattr(args, "use_torch_fsdp2", False)),
        "use_megatron_fsdp": bool(getattr(args, "use_megatron_fsdp", False)),
        "recompute_granularity": args.recompute_granularity,
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "ffn_hidden_size": args.ffn_hidden_size,
        "num_attention_heads": args.num_attention_heads,
        "num_query_groups": args.num_query_groups if args.group_query_attention else args.num_attention_heads,
        "kv_channels": args.kv_channels,
        "num_experts": args.num_experts,
        "moe_router_topk": args.moe_router_topk if args.num_experts else None,
        "swiglu": bool(args.swiglu),
        "untie_embeddings_and_output_weights": bool(args.untie_embeddings_and_output_weights),
        "bf16": bool(args.bf16),
        "fp16": bool(args.fp16),
        "padded_vocab_size": getattr(args, "padded_vocab_size", None),
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
    }
    facts.update(
        _groups_and_split(
            cfg,
            world,
            facts["tp"],
            facts["pp"],
            vpp,
            facts["cp"],
            facts["ep"],
            facts["etp"],
            order,
        )
    )
    return facts


def _value(text):
    """A Hydra/OmegaConf override value: null, true/false, numbers, [lists], else the string."""
    if not isinstance(text, str):
        return text
    low = text.strip().lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_value(x.strip()) for x in inner.split(",")] if inner else []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return shlex.split(text)[0]
    return text


def check_bridge(case: dict) -> dict:
    torch = M["torch"]
    world = int(case["world_size"])
    ARCH["value"] = int(case.get("arch") or 9)
    _env(case.get("env"), world)
    raw = {k: _value(v) for k, v in case["overrides"].items()}
    model = {k.split(".", 1)[1]: v for k, v in raw.items() if k.startswith("model.")}
    unknown = sorted(k for k in model if k not in M["tc_fields"] and k not in BRIDGE_PROVIDER_FIELDS)
    if unknown:
        raise Rejected(f"model.* overrides that are no field of GPTModelProvider/TransformerConfig: {unknown}")
    kwargs = {k: v for k, v in model.items() if k in M["tc_fields"]}
    if kwargs.get("pipeline_model_parallel_size", 1) > 1 and kwargs.get("pipeline_dtype") is None:
        kwargs["pipeline_dtype"] = torch.bfloat16 if kwargs.get("bf16", True) else torch.float16
    for key in ("params_dtype", "pipeline_dtype"):  # dtypes arrive as strings in overrides
        if isinstance(kwargs.get(key), str):
            kwargs[key] = getattr(torch, kwargs[key].replace("torch.", ""))
    cfg = M["TransformerConfig"](**kwargs)  # __post_init__: the model-parallel rules
    tp, pp, cp = cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size
    if world % (tp * pp * cp):  # ConfigContainer.validate (Bridge training/config.py)
        raise Rejected(f"world size {world} is not divisible by tp*pp*cp = {tp}*{pp}*{cp}")
    dp = world // (tp * pp * cp)
    mbs, gbs = raw.get("train.micro_batch_size"), raw.get("train.global_batch_size")
    if mbs is not None and gbs is not None and gbs % (mbs * dp):
        raise Rejected(f"train.global_batch_size {gbs} is not divisible by micro_batch_size*dp = {mbs}*{dp}")
    seq = model.get("seq_length")
    if cp > 1 and seq is not None and seq % (2 * cp):
        raise Rejected(f"model.seq_length {seq} is not a multiple of 2*context_parallel_size ({2 * cp})")
    ep = cfg.expert_model_parallel_size
    facts = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "ep": ep,
        "etp": cfg.expert_tensor_parallel_size,
        "vpp": cfg.virtual_pipeline_model_parallel_size or 1,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "num_microbatches": gbs // (mbs * dp) if mbs and gbs else None,
        "sequence_parallel": bool(cfg.sequence_parallel),
        "use_distributed_optimizer": raw.get("ddp.use_distributed_optimizer"),
        "recompute_granularity": cfg.recompute_granularity,
        "recompute_method": cfg.recompute_method,
        "recompute_num_layers": cfg.recompute_num_layers,
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "ffn_hidden_size": cfg.ffn_hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_query_groups,
        "num_experts": cfg.num_moe_experts,
        "seq_length": seq,
    }
    facts.update(
        _groups_and_split(cfg, world, tp, pp, cfg.virtual_pipeline_model_parallel_size, cp, ep,
                          cfg.expert_tensor_parallel_size, "tp-cp-ep-dp-pp")
    )  # fmt: skip
    return facts


def check(case: dict) -> dict:
    return check_bridge(case) if case.get("kind") == "bridge" else check_megatron(case)


if __name__ == "__main__":
    serve(check, setup)
