"""Offline reading of a Hugging Face ``config.json`` into a ModelSpec.

Key names follow the ``transformers`` configuration classes (LlamaConfig, MistralConfig, MixtralConfig,
Qwen2/Qwen3[Moe]Config, DeepseekV2/V3Config, GPT2Config; Kimi K2's ``kimi_k2`` config.json uses DeepseekV3Config's
keys); defaults below are those classes' defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import SpecError, did_you_mean
from planner.io import load_json


class _Reader:
    """Typed access to config.json keys; every error names ``<field>.<key>``."""

    def __init__(self, cfg: dict[str, Any], field: str):
        self.cfg, self.field = cfg, field

    def int(self, key: str, default: Any = ...) -> Any:
        value = self.cfg.get(key)
        if value is None:  # absent, or null in the file
            if default is ...:
                raise SpecError(f"{self.field}.{key}", "required field is missing in config.json")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{self.field}.{key}", f"expected an integer, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(f"{self.field}.{key}", f"expected true or false, got {value!r}")
        return value

    def list(self, key: str) -> list:
        value = self.cfg.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SpecError(f"{self.field}.{key}", f"expected a list, got {value!r}")
        return value


def _decoder(r: _Reader, tie: bool = False, ffn: Any = ...) -> dict[str, Any]:
    """Llama-style decoder (RMSNorm, RoPE, SwiGLU MLP, GQA); also the base of the MoE families."""
    heads, hidden = r.int("num_attention_heads"), r.int("hidden_size")
    data = {
        "num_layers": r.int("num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": r.int("intermediate_size", ffn),
        "num_attention_heads": heads,
        "num_kv_heads": r.int("num_key_value_heads", heads),
        "vocab_size": r.int("vocab_size"),
        "mlp": "swiglu",
        "tie_embeddings": r.bool("tie_word_embeddings", tie),
    }
    head_dim = r.int("head_dim", None)
    if head_dim is not None and head_dim * heads != hidden:  # e.g. Qwen3: 32 x 128 != 2048
        data["head_dim"] = head_dim
    return data


def _mixtral(r: _Reader) -> dict[str, Any]:
    data = _decoder(r)  # intermediate_size is each expert's FFN; every layer is MoE
    data["moe"] = {
        "num_experts": r.int("num_local_experts"),
        "top_k": r.int("num_experts_per_tok"),
        "expert_ffn_hidden_size": data["ffn_hidden_size"],
    }
    return data


def _qwen_moe(r: _Reader) -> dict[str, Any]:
    expert_ffn = r.int("moe_intermediate_size")
    data = _decoder(r, ffn=expert_ffn)  # intermediate_size is the dense FFN (mlp_only_layers)
    # Qwen2-MoE has one shared expert of shared_expert_intermediate_size; count it in expert-FFN units.
    shared = r.int("shared_expert_intermediate_size", 0)
    # Qwen makes layer i MoE when (i + 1) % decoder_sparse_step == 0: indices step-1, 2*step-1, ...
    step = r.int("decoder_sparse_step", 1)
    data["moe"] = {
        "num_experts": r.int("num_experts"),
        "top_k": r.int("num_experts_per_tok"),
        "expert_ffn_hidden_size": expert_ffn,
        "shared_experts": round(shared / expert_ffn) if expert_ffn else 0,
        "moe_layer_freq": step,
        "first_dense_layers": max(step - 1, 0),
    }
    if r.list("mlp_only_layers"):
        data["_note"] = "mlp_only_layers ignored (all sparse-step layers treated as MoE)"
    return data


def _mla(r: _Reader) -> dict[str, Any]:
    """Multi-head latent attention (planner.spec.MLASpec): the DeepseekV2/V3Config keys of the same names. Every
    key is required (a silently defaulted width would misprice the attention); q_lora_rank written as null
    (DeepSeek-V2-Lite) is no query compression."""
    if "q_lora_rank" not in r.cfg:
        raise SpecError(f"{r.field}.q_lora_rank", "required field is missing in config.json (null: no query latent)")
    return {
        "q_lora_rank": r.int("q_lora_rank", None),
        "kv_lora_rank": r.int("kv_lora_rank"),
        "qk_nope_head_dim": r.int("qk_nope_head_dim"),
        "qk_rope_head_dim": r.int("qk_rope_head_dim"),
        "v_head_dim": r.int("v_head_dim"),
    }


def _deepseek(r: _Reader) -> dict[str, Any]:
    data = _decoder(r)  # intermediate_size is the dense FFN of the first_k_dense_replace layers
    # MLA: head_dim is the query/key width qk_nope + qk_rope (newer DeepseekV3Config writes head_dim =
    # qk_rope_head_dim, the rotary width, which is not ours); num_key_value_heads equals the heads.
    data["mla"] = _mla(r)
    data["head_dim"] = data["mla"]["qk_nope_head_dim"] + data["mla"]["qk_rope_head_dim"]
    data["moe"] = {
        "num_experts": r.int("n_routed_experts"),
        "top_k": r.int("num_experts_per_tok"),
        "expert_ffn_hidden_size": r.int("moe_intermediate_size"),
        "shared_experts": r.int("n_shared_experts", 0),
        "moe_layer_freq": r.int("moe_layer_freq", 1),
        "first_dense_layers": r.int("first_k_dense_replace", 0),
    }
    data["_note"] = "MLA read exactly; multi-token-prediction layers (num_nextn_predict_layers) not modelled"
    return data


def _gpt2(r: _Reader) -> dict[str, Any]:
    hidden = r.int("n_embd")
    r.int("n_positions", None)  # type-checked only; sequence length comes from the job
    return {
        "num_layers": r.int("n_layer"),
        "hidden_size": hidden,
        "ffn_hidden_size": r.int("n_inner", 4 * hidden),  # GPT2Config: n_inner None -> 4 * n_embd
        "num_attention_heads": r.int("n_head"),
        "vocab_size": r.int("vocab_size"),
        "mlp": "gelu",
        "tie_embeddings": r.bool("tie_word_embeddings", True),
    }


_MAPPERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _decoder,
    "mistral": _decoder,
    "qwen2": _decoder,
    "qwen3": _decoder,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "gpt2": _gpt2,
}


def _name(cfg: dict[str, Any], path: Path, model_type: str) -> str:
    name = cfg.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        return name.strip()
    if path.stem != "config":  # e.g. examples/hf/llama3-8b.json
        return path.stem
    return path.resolve().parent.name or model_type


def load_hf_config(path: str | Path, field: str = "model"):
    """Map a Hugging Face config.json (read offline) to a ModelSpec; errors name ``<field>.<key>``."""
    from planner.load import format_validation_error
    from planner.spec import ModelSpec

    path = Path(path)
    cfg = load_json(path, field=field)
    if not isinstance(cfg, dict):
        raise SpecError(field, f"'{path}' must hold a JSON object (a Hugging Face config.json)")
    supported = ", ".join(sorted(_MAPPERS))
    model_type = cfg.get("model_type")
    if model_type is None:
        raise SpecError(f"{field}.model_type", f"required field is missing in config.json; supported: {supported}")
    if model_type not in _MAPPERS:
        hint = did_you_mean(model_type, _MAPPERS) if isinstance(model_type, str) else ""
        raise SpecError(f"{field}.model_type", f"unsupported model_type {model_type!r}{hint}; supported: {supported}")
    data = _MAPPERS[model_type](_Reader(cfg, field))
    note = data.pop("_note", None)
    data["name"] = _name(cfg, path, model_type)
    data["source"] = f"Hugging Face config.json: {path}" + (f" ({note})" if note else "")
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, prefix=field + ".")
