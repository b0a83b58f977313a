"""The model of plan #1 as a torchtitan 0.2.2 llama3 flavor, written by `planner emit`.

plan.toml imports it (experimental.custom_import); `planner import` reads MODEL back.
"""

from torchtitan.models.llama3 import TransformerModelArgs, llama3_args

MODEL = {"name": "llama2-7b", "n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 32, "ffn_hidden": 11008, "vocab_size": 32000, "tie_embeddings": False}
FLAVOR = "planner"

llama3_args[FLAVOR] = TransformerModelArgs(
    dim=MODEL["dim"],
    n_layers=MODEL["n_layers"],
    n_heads=MODEL["n_heads"],
    n_kv_heads=MODEL["n_kv_heads"],
    vocab_size=MODEL["vocab_size"],
    multiple_of=MODEL["ffn_hidden"],
    ffn_dim_multiplier=None,
    max_seq_len=131072,
)
