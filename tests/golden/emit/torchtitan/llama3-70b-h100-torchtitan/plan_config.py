"""torchtitan 0.3 config of plan #1 (llama3-70b, 512 GPUs: tp 8 pp 4 vpp 10 dp 16 cp 1 ep 1, ZeRO-0), written by `planner emit`.

Run: python -m torchtitan.train --module plan_config --config plan  (with this folder on PYTHONPATH)
"""

from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_70b
from torchtitan.trainer import Trainer

# model parts in torchtitan's order: part v*pp + r is the v-th chunk of pipeline rank r
MODULE_FQNS_PER_MODEL_PART = [
    ["tok_embeddings", "layers.0", "layers.1"],
    ["layers.2", "layers.3"],
    ["layers.4", "layers.5"],
    ["layers.6", "layers.7"],
    ["layers.8", "layers.9"],
    ["layers.10", "layers.11"],
    ["layers.12", "layers.13"],
    ["layers.14", "layers.15"],
    ["layers.16", "layers.17"],
    ["layers.18", "layers.19"],
    ["layers.20", "layers.21"],
    ["layers.22", "layers.23"],
    ["layers.24", "layers.25"],
    ["layers.26", "layers.27"],
    ["layers.28", "layers.29"],
    ["layers.30", "layers.31"],
    ["layers.32", "layers.33"],
    ["layers.34", "layers.35"],
    ["layers.36", "layers.37"],
    ["layers.38", "layers.39"],
    ["layers.40", "layers.41"],
    ["layers.42", "layers.43"],
    ["layers.44", "layers.45"],
    ["layers.46", "layers.47"],
    ["layers.48", "layers.49"],
    ["layers.50", "layers.51"],
    ["layers.52", "layers.53"],
    ["layers.54", "layers.55"],
    ["layers.56", "layers.57"],
    ["layers.58", "layers.59"],
    ["layers.60", "layers.61"],
    ["layers.62", "layers.63"],
    ["layers.64", "layers.65"],
    ["layers.66", "layers.67"],
    ["layers.68", "layers.69"],
    ["layers.70", "layers.71"],
    ["layers.72", "layers.73"],
    ["layers.74", "layers.75"],
    ["layers.76", "layers.77"],
    ["layers.78", "layers.79", "norm", "lm_head"],
]


def plan() -> Trainer.Config:
    cfg = llama3_70b()
    cfg.model_spec = model_registry("70B")
    p = cfg.parallelism
    p.data_parallel_replicate_degree = 16
    p.data_parallel_shard_degree = 1
    p.tensor_parallel_degree = 8
    p.enable_sequence_parallel = True
    p.pipeline_parallel_degree = 4
    p.pipeline_parallel_schedule = "Interleaved1F1B"
    p.pipeline_parallel_microbatch_size = 1
    p.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART
    p.context_parallel_degree = 1
    p.expert_parallel_degree = 1
    t = cfg.training
    t.local_batch_size = 64
    t.global_batch_size = 1024
    t.seq_len = 8192
    t.dtype = "float32"
    t.mixed_precision_param = "bfloat16"
    t.mixed_precision_reduce = "float32"
    t.disable_cuda_graphs = True
    cfg.activation_checkpoint = None
    return cfg
