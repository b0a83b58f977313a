"""GPU/model catalogs (planner/data/*.yaml) and Hugging Face config.json mapping (planner.catalog.hf)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import data_file, gpu_names, model_names, resolve_gpu, resolve_model
from planner.catalog.hf import load_hf_config
from planner.errors import SpecError
from planner.io import load_yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "hf"

REQUIRED_GPUS = [
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "h800",
    "b200",
    "gb200",
    "v100-32gb",
    "l40s",
    "l4",
    "a10",
    "rtx4090",
    "mi250x",
    "mi300x",
]
REQUIRED_MODELS = [
    "gpt3-175b",
    "gpt-530b",
    "llama2-7b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "deepseek-v3",
]


# ----------------------------------------------------------------------------- catalogs


@pytest.mark.parametrize("name", gpu_names())
def test_every_gpu_preset_loads(name):
    gpu = resolve_gpu(name)
    assert gpu.name == name
    assert gpu.source != "user supplied"
    if gpu.matmul_tflops_bf16 is not None:
        assert gpu.matmul_tflops_bf16 < gpu.peak_tflops_bf16


@pytest.mark.parametrize("name", model_names())
def test_every_model_preset_loads(name):
    model = resolve_model(name)
    assert model.name == name
    assert model.source != "user supplied"


def test_required_presets_exist():
    assert set(REQUIRED_GPUS) <= set(gpu_names())
    assert set(REQUIRED_MODELS) <= set(model_names())


@pytest.mark.parametrize("kind", ["gpus", "models"])
def test_names_and_aliases_are_unique(kind):
    entries = load_yaml(data_file(f"{kind}.yaml"))[kind]
    seen: dict[str, str] = {}
    for name, entry in entries.items():
        assert entry.get("name", name) == name
        for key in [name, *entry.get("aliases", [])]:
            assert key.lower() not in seen, f"{key} used by {seen.get(key.lower())} and {name}"
            seen[key.lower()] = name


@pytest.mark.parametrize(
    "alias, name",
    [
        ("HGX-H100", "h100-sxm"),
        ("a100-sxm4-80gb", "a100-80gb"),
        ("h200-sxm-141gb", "h200"),
        ("h100-sxm5-80gb", "h100-sxm"),
        ("h100-pcie-80gb", "h100-pcie"),
        ("b200-sxm-180gb", "b200"),
        ("gb200-nvl72", "gb200"),
        ("v100-sxm2-32gb", "v100-32gb"),
        ("rtx-4090", "rtx4090"),
        ("a100-sxm4-40gb", "a100-40gb"),
    ],
)
def test_gpu_aliases_resolve(alias, name):
    assert resolve_gpu(alias).name == name


def test_model_aliases_resolve():
    assert resolve_model("MT-NLG-530B").name == "gpt-530b"
    assert resolve_model("llama-3.1-405b").name == "llama3-405b"


def test_selected_preset_values():
    h800, h100 = resolve_gpu("h800"), resolve_gpu("h100-sxm")
    assert h800.peak_tflops_bf16 == h100.peak_tflops_bf16 and h800.intra_node_gbps == 200
    assert resolve_gpu("gb200").gpus_per_node == 72
    assert resolve_gpu("a10").peak_tflops_fp8 is None
    gpt3 = resolve_model("gpt3-175b")
    assert (gpt3.num_layers, gpt3.hidden_size, gpt3.mlp, gpt3.tie_embeddings) == (96, 12288, "gelu", True)
    ds = resolve_model("deepseek-v3")
    assert ds.num_moe_layers == 58 and ds.dim_head == 192 and ds.moe.shared_experts == 1


def test_unknown_gpu_suggests_near_miss():
    with pytest.raises(SpecError) as exc:
        resolve_gpu("h100-sxn", field="cluster[0].gpu")
    assert exc.value.field == "cluster[0].gpu"
    assert "did you mean 'h100-sxm'" in exc.value.message


def test_unknown_model_suggests_near_miss():
    with pytest.raises(SpecError) as exc:
        resolve_model("llama3-8c")
    assert exc.value.field == "model"
    assert "did you mean 'llama3-8b'" in exc.value.message


# ----------------------------------------------------------------------------- Hugging Face config.json


def write(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


def test_llama(tmp_path):
    m = load_hf_config(write(tmp_path, LLAMA3_8B))
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size) == (32, 4096, 14336)
    assert (m.num_attention_heads, m.kv_heads, m.head_dim, m.vocab_size) == (32, 8, None, 128256)
    assert m.mlp == "swiglu" and m.tie_embeddings is False and m.moe is None
    assert m.name == tmp_path.name and m.source == f"Hugging Face config.json: {tmp_path / 'config.json'}"


def test_kv_heads_default_to_heads_and_name_from_file(tmp_path):
    # meta-llama/Llama-2-7b-hf (older configs may omit num_key_value_heads)
    cfg = dict(LLAMA3_8B, intermediate_size=11008, vocab_size=32000, _name_or_path="meta-llama/Llama-2-7b-hf")
    del cfg["num_key_value_heads"]
    m = load_hf_config(write(tmp_path, cfg))
    assert m.kv_heads == 32 and m.name == "meta-llama/Llama-2-7b-hf"


def test_mistral(tmp_path):
    cfg = dict(LLAMA3_8B, model_type="mistral", vocab_size=32000, sliding_window=4096)
    m = load_hf_config(write(tmp_path, cfg, "mistral-7b.json"))
    assert m.name == "mistral-7b" and m.kv_heads == 8 and m.vocab_size == 32000


def test_qwen2(tmp_path):
    # Qwen/Qwen2-7B
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }
    m = load_hf_config(write(tmp_path, cfg))
    assert (m.num_layers, m.kv_heads, m.dim_head, m.mlp) == (28, 4, 128, "swiglu")


def test_qwen3_head_dim_only_when_it_differs(tmp_path):
    # Qwen/Qwen3-0.6B: 16 heads x 128 != 1024 hidden; Qwen/Qwen3-8B: 32 x 128 == 4096
    small = {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    m = load_hf_config(write(tmp_path, small))
    assert m.head_dim == 128 and m.tie_embeddings is True
    big = dict(small, hidden_size=4096, num_attention_heads=32, intermediate_size=12288)
    assert load_hf_config(write(tmp_path, big)).head_dim is None


def test_mixtral(tmp_path):
    cfg = dict(LLAMA3_8B, model_type="mixtral", vocab_size=32000, num_local_experts=8, num_experts_per_tok=2)
    m = load_hf_config(write(tmp_path, cfg))
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (8, 2, 14336)
    assert m.num_moe_layers == 32


def test_qwen2_moe_shared_expert_and_sparse_step(tmp_path):
    # Qwen/Qwen1.5-MoE-A2.7B: one shared expert of 5632 = 4 x 1408
    cfg = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    m = load_hf_config(write(tmp_path, cfg))
    assert (m.moe.num_experts, m.moe.top_k, m.moe.shared_experts, m.moe.expert_ffn_hidden_size) == (60, 4, 4, 1408)
    assert m.num_moe_layers == 24
    # Qwen: layer i is MoE when (i + 1) % step == 0 -> layers 1, 3, ..., 23
    m2 = load_hf_config(write(tmp_path, dict(cfg, decoder_sparse_step=2)))
    assert [i for i in range(24) if m2.is_moe_layer(i)] == list(range(1, 24, 2))


def test_qwen3_moe_example():
    m = load_hf_config(EXAMPLES / "qwen3-30b-a3b.json")
    assert m.name == "qwen3-30b-a3b"
    assert (m.num_layers, m.hidden_size, m.kv_heads, m.head_dim) == (48, 2048, 4, 128)
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size, m.moe.shared_experts) == (128, 8, 768, 0)
    preset = resolve_model("qwen3-30b-a3b")
    assert m.model_dump(exclude={"name", "source"}) == preset.model_dump(exclude={"name", "source"})


def test_llama3_8b_example_matches_preset():
    m = resolve_model(str(EXAMPLES / "llama3-8b.json"))
    preset = resolve_model("llama3-8b")
    assert m.model_dump(exclude={"name", "source"}) == preset.model_dump(exclude={"name", "source"})


DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "vocab_size": 129280,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "tie_word_embeddings": False,
}


def test_deepseek_v3(tmp_path):
    m = load_hf_config(write(tmp_path, DEEPSEEK_V3))
    assert (m.moe.first_dense_layers, m.moe.shared_experts, m.moe.num_experts, m.moe.top_k) == (3, 1, 256, 8)
    assert m.ffn_hidden_size == 18432 and m.moe.expert_ffn_hidden_size == 2048 and m.head_dim == 192
    assert m.num_moe_layers == 58 and "MLA" in m.source
    preset = resolve_model("deepseek-v3")
    assert m.model_dump(exclude={"name", "source"}) == preset.model_dump(exclude={"name", "source"})


def test_deepseek_v2(tmp_path):
    # deepseek-ai/DeepSeek-V2-Lite
    cfg = dict(
        DEEPSEEK_V3,
        model_type="deepseek_v2",
        hidden_size=2048,
        intermediate_size=10944,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_hidden_layers=27,
        vocab_size=102400,
        n_routed_experts=64,
        num_experts_per_tok=6,
        moe_intermediate_size=1408,
        n_shared_experts=2,
        first_k_dense_replace=1,
    )
    m = load_hf_config(write(tmp_path, cfg))
    assert (m.moe.num_experts, m.moe.top_k, m.moe.shared_experts, m.num_moe_layers) == (64, 6, 2, 26)


def test_gpt2(tmp_path):
    # openai-community/gpt2: no n_inner key -> 4 * n_embd
    cfg = {
        "model_type": "gpt2",
        "n_layer": 12,
        "n_embd": 768,
        "n_head": 12,
        "n_positions": 1024,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
        "n_inner": None,
    }
    m = load_hf_config(write(tmp_path, cfg))
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads) == (12, 768, 3072, 12)
    assert m.mlp == "gelu" and m.tie_embeddings is True and m.vocab_size == 50257


def test_directory_with_config_json_resolves(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    write(folder, LLAMA3_8B)
    m = resolve_model(str(folder))
    assert m.name == "Meta-Llama-3-8B" and m.num_layers == 32


# ----------------------------------------------------------------------------- errors


def test_missing_key_names_the_field(tmp_path):
    cfg = dict(LLAMA3_8B)
    del cfg["num_hidden_layers"]
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, cfg), field="model")
    assert exc.value.field == "model.num_hidden_layers"
    assert "missing" in exc.value.message


def test_missing_moe_key_names_the_field(tmp_path):
    cfg = dict(DEEPSEEK_V3)
    del cfg["qk_rope_head_dim"]
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, cfg))
    assert exc.value.field == "model.qk_rope_head_dim"


def test_unsupported_model_type(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, dict(LLAMA3_8B, model_type="lama")))
    assert exc.value.field == "model.model_type"
    assert "did you mean 'llama'" in exc.value.message and "supported:" in exc.value.message
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, dict(LLAMA3_8B, model_type="t5")))
    assert exc.value.field == "model.model_type" and "'t5'" in exc.value.message


def test_missing_model_type(tmp_path):
    cfg = dict(LLAMA3_8B)
    del cfg["model_type"]
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, cfg))
    assert exc.value.field == "model.model_type"


@pytest.mark.parametrize(
    "key, value",
    [("hidden_size", "4096"), ("num_hidden_layers", 32.5), ("vocab_size", True), ("tie_word_embeddings", "no")],
)
def test_wrong_type_names_the_key(tmp_path, key, value):
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, dict(LLAMA3_8B, **{key: value})))
    assert exc.value.field == f"model.{key}"


def test_inconsistent_values_are_validated(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, dict(LLAMA3_8B, num_key_value_heads=5)), field="job.model")
    assert exc.value.field.startswith("job.model") and "num_kv_heads" in exc.value.message
    with pytest.raises(SpecError) as exc:
        load_hf_config(write(tmp_path, dict(LLAMA3_8B, num_hidden_layers=0)))
    assert exc.value.field == "model.num_layers"


def test_not_an_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(SpecError) as exc:
        load_hf_config(path)
    assert exc.value.field == "model"


def test_the_catalogs_read_the_same_through_libyaml(tmp_path):
    # the package catalogs are read with libyaml's parser (planner.io, data_file=True): the same data as the
    # pure-Python safe loader, duplicated keys refused by both
    from planner.catalog import builtin_data_dir
    from planner.errors import SpecError
    from planner.io import load_yaml

    for name in ("gpus.yaml", "models.yaml", "calibration.yaml"):
        path = builtin_data_dir() / name
        assert load_yaml(path, data_file=True) == load_yaml(path)
    dup = tmp_path / "dup.yaml"
    dup.write_text("a: 1\na: 2\n")
    for fast in (False, True):
        with pytest.raises(SpecError, match="duplicated key 'a'"):
            load_yaml(dup, data_file=fast)
