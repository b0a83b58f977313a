"""torchtitan 0.3 config of plan #1 (llama2-7b, 8 GPUs: tp 1 pp 1 vpp 1 dp 8 cp 1 ep 1, ZeRO-3), written by `planner emit`.

Run: python -m torchtitan.train --module plan_config --config plan  (with this folder on PYTHONPATH)
"""

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.trainer import Trainer

# the model's dimensions (llama3 architecture: RMSNorm, SwiGLU, RoPE); `planner import` reads them back
MODEL = {"name": "llama2-7b", "n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 32, "ffn_hidden": 11008, "vocab_size": 32000, "tie_embeddings": False}
FLAVOR = "planner"


def _model_config(attn_backend: str, tp_gemm_backend: str = "default") -> llama3.Llama3Model.Config:
    dim, vocab, heads = MODEL["dim"], MODEL["vocab_size"], MODEL["n_heads"]
    return llama3.Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=MODEL["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)
        ),
        layers=llama3._build_llama3_layers(
            fuse_qkv=True,
            n_layers=MODEL["n_layers"],
            dim=dim,
            n_heads=heads,
            n_kv_heads=MODEL["n_kv_heads"],
            hidden_dim=MODEL["ffn_hidden"],
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=131072, theta=10000.0),
            attn_backend=attn_backend,
            tp_gemm_backend=tp_gemm_backend,
        ),
    )


llama3.llama3_configs[FLAVOR] = _model_config


def plan() -> Trainer.Config:
    cfg = llama3_8b()  # optimizer, data and checkpoint settings; the model is replaced below
    cfg.model_spec = llama3.model_registry(FLAVOR)
    cfg.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(cfg.model_spec)),
    )
    p = cfg.parallelism
    p.data_parallel_replicate_degree = 1
    p.data_parallel_shard_degree = 8
    p.tensor_parallel_degree = 1
    p.enable_sequence_parallel = False
    p.pipeline_parallel_degree = 1
    p.context_parallel_degree = 1
    p.expert_parallel_degree = 1
    t = cfg.training
    t.local_batch_size = 2
    t.global_batch_size = 64
    t.seq_len = 4096
    t.dtype = "float32"
    t.mixed_precision_param = "bfloat16"
    t.mixed_precision_reduce = "float32"
    t.disable_cuda_graphs = False
    cfg.activation_checkpoint = None
    return cfg
