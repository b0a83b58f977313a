"""Random small jobs for the property tests (tests/test_properties.py) and the fuzzer (scripts/fuzz.py).

One generator, two sources of randomness: every choice goes through a ``Chooser`` (``integer``, ``choice``,
``boolean``), backed either by hypothesis (``HypothesisChooser``: shrinkable) or by ``random.Random``
(``RandomChooser``: fast, seeded, for 10,000-case fuzz runs). The result is a raw job mapping, the same shape as a
job YAML file, to be handed to ``planner.load.parse_job``, plus the search options to plan it with.

Generated jobs are small on purpose (<= 16 layers, <= 64 GPUs) so each search takes well under a second; they are
*mostly* valid: a few generated combinations are rejected by parse_job (a SpecError), which callers count or skip.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# A 6-layer MoE model (one dense layer, then 8 experts top-2, GQA) small enough for brute force over its layouts;
# the exactness, bound and cost-seam tests share it (each under its own name).
SMALL_MOE = {
    "name": "moe-small",
    "num_layers": 6,
    "hidden_size": 1024,
    "ffn_hidden_size": 2816,
    "num_attention_heads": 16,
    "num_kv_heads": 4,
    "vocab_size": 32000,
    "mlp": "swiglu",
    "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1408, "first_dense_layers": 1},
}

CATALOG_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm", "l4")
GPUS_PER_NODE = (1, 2, 4, 8)
MAX_GPUS = 64
HEAD_DIMS = (32, 64, 128)


class Chooser:
    def integer(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def choice(self, options: Sequence[Any]) -> Any:
        raise NotImplementedError

    def boolean(self, p_true: float = 0.5) -> bool:
        raise NotImplementedError


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def boolean(self, p_true: float = 0.5) -> bool:
        return self.rng.random() < p_true


class HypothesisChooser(Chooser):
    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(self.st.sampled_from(list(options)))

    def boolean(self, p_true: float = 0.5) -> bool:
        # hypothesis shrinks booleans towards False; p_true is only honoured by RandomChooser
        return self.draw(self.st.booleans())


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ----------------------------------------------------------------------------- model / cluster / training


def gen_model(ch: Chooser) -> dict:
    """A small dense or MoE transformer: heads divide hidden, kv_heads divide heads."""
    layers = ch.integer(1, 16)
    head_dim = ch.choice(HEAD_DIMS)
    # hidden in [256, 4096], a multiple of 64 and of head_dim
    step = max(64, head_dim)
    hidden = step * ch.integer(-(-256 // step), 4096 // step)
    heads = hidden // head_dim
    kv_heads = ch.choice(_divisors(heads))
    mlp = ch.choice(("gelu", "swiglu"))
    if mlp == "gelu":
        ffn = ch.choice((4 * hidden, 64 * ch.integer(hidden // 64, 4 * hidden // 64)))
    else:
        ffn = ch.choice((64 * -(-8 * hidden // 3 // 64), 64 * ch.integer(hidden // 64, 4 * hidden // 64)))
    model: dict[str, Any] = {
        "name": "fuzz",
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "vocab_size": ch.integer(1000, 64000),
        "mlp": mlp,
        "tie_embeddings": ch.boolean(),
        "dropout": ch.boolean(0.2),
    }
    if ch.boolean(0.3):
        experts = ch.integer(2, 16)
        model["moe"] = {
            "num_experts": experts,
            "top_k": ch.integer(1, min(experts, 4)),
            "expert_ffn_hidden_size": 64 * ch.integer(max(1, hidden // 256), hidden // 32),
            "shared_experts": ch.choice((0, 0, 1, 2)),
            "moe_layer_freq": ch.choice((1, 1, 2)),
            "first_dense_layers": ch.integer(0, min(2, layers)),
        }
    return model


def gen_gpu(ch: Chooser) -> Any:
    """A catalog name, or an inline GPU with little memory (so that memory limits bind)."""
    if ch.boolean(0.75):
        return ch.choice(CATALOG_GPUS)
    return {
        "name": "small-gpu",
        "memory_gib": float(ch.choice((2, 4, 6, 8, 12, 16))),
        "peak_tflops_bf16": float(ch.choice((50, 120, 300))),
        "hbm_tbps": ch.choice((0.5, 1.0, 2.0)),
        "intra_node_gbps": float(ch.choice((16, 64, 300))),
        "inter_node_gbps": float(ch.choice((25, 100, 400))),
    }


def gen_cluster(ch: Chooser) -> list[dict]:
    gpn = ch.choice(GPUS_PER_NODE)
    nodes = ch.integer(1, min(8, MAX_GPUS // gpn))
    return [{"gpu": gen_gpu(ch), "nodes": nodes, "gpus_per_node": gpn}]


def gen_mixed_cluster(ch: Chooser) -> list[dict]:
    """2-3 node groups of different GPUs, at most 32 GPUs in all (mixed-GPU searches are costlier)."""
    groups = []
    for _ in range(ch.integer(2, 3)):
        gpn = ch.choice((1, 2, 4, 8))
        groups.append({"gpu": gen_gpu(ch), "nodes": ch.integer(1, max(1, 8 // gpn)), "gpus_per_node": gpn})
    return groups


def gen_mixed_case(ch: Chooser) -> tuple[dict, SearchSettings]:
    raw = {"model": gen_model(ch), "cluster": gen_mixed_cluster(ch), "training": gen_training(ch)}
    if ch.boolean(0.3):
        raw["links"] = [{"groups": [0, 1], "gbps": float(ch.choice((10, 50, 200)))}]
    return raw, gen_settings(ch)


def gen_training(ch: Chooser) -> dict:
    training = {
        "seq_length": 2 ** ch.integer(8, 13),
        "global_batch_size": ch.integer(1, 512),
        "attention": ch.choice(("flash", "eager")),
        "precision": ch.choice(("bf16", "fp16")),
        "optimizer": ch.choice(("adam", "adamw", "sgd")),
    }
    if training["precision"] == "bf16" and ch.boolean(0.25):
        training["grad_dtype"] = "bf16+fp32"  # DeepSpeed's BF16_Optimizer: an accumulation pass per micro-batch
    return training


def gen_raw_job(ch: Chooser) -> dict:
    """A raw job mapping (the shape of a job YAML file)."""
    return {"model": gen_model(ch), "cluster": gen_cluster(ch), "training": gen_training(ch)}


@dataclass(frozen=True)
class SearchSettings:
    memory_margin: float
    allow_cross_node_tp: bool
    partial_recompute: bool
    framework: str | None = None  # plan as `plan --framework` does (scripts/fuzz.py --framework)

    def options(self):
        from planner.frameworks import FRAMEWORKS
        from planner.search.space import SearchOptions

        return SearchOptions(
            allow_cross_node_tp=self.allow_cross_node_tp,
            memory_margin=self.memory_margin,
            partial_recompute=self.partial_recompute,
            framework=FRAMEWORKS[self.framework] if self.framework else None,
        )

    def job(self, raw: dict):
        """The parsed job as `plan --framework` searches it (planner.frameworks.priced_for; check_training raises
        SpecError where the framework cannot train it at all)."""
        from planner.frameworks import FRAMEWORKS, check_training, priced_for
        from planner.load import parse_job

        job = parse_job(raw)
        if self.framework is None:
            return job
        fw = FRAMEWORKS[self.framework]
        t = job.training
        check_training(fw, t.precision, t.fp8_recipe, t.grad_dtype)
        return priced_for(job, fw)

    def refusals(self, doc: dict) -> list[str]:
        """Under a framework, every plan must emit for it: what planner.frameworks.check_runnable refuses of each
        (the rules the search obeys under `--framework`)."""
        if self.framework is None:
            return []
        from planner.emit.launch_plan import LaunchPlan
        from planner.errors import Inexpressible
        from planner.frameworks import check_runnable

        out = []
        for p in doc["plans"]:
            try:
                check_runnable(self.framework, LaunchPlan.of(doc, p["rank"], self.framework))
            except Inexpressible as exc:
                out.append(f"plan {p['rank']}: {self.framework} cannot run it: {exc.line()}")
        return out


def gen_settings(ch: Chooser) -> SearchSettings:
    return SearchSettings(
        memory_margin=ch.choice((0.05, 0.0, 0.1, 0.3)),
        allow_cross_node_tp=ch.boolean(0.2),
        partial_recompute=not ch.boolean(0.2),
    )


def gen_case(ch: Chooser) -> tuple[dict, SearchSettings]:
    return gen_raw_job(ch), gen_settings(ch)


# ----------------------------------------------------------------------------- hypothesis strategies


def _composite(fn):
    from hypothesis import strategies as st

    return st.composite(lambda draw: fn(HypothesisChooser(draw)))()


def raw_jobs():
    """hypothesis strategy of raw job mappings."""
    return _composite(gen_raw_job)


def cases():
    """hypothesis strategy of (raw job, SearchSettings)."""
    return _composite(gen_case)


def mixed_cases():
    """hypothesis strategy of (raw job on 2-3 GPU types, SearchSettings)."""
    return _composite(gen_mixed_case)


# ----------------------------------------------------------------------------- one case, end to end


def run_case(raw: dict, settings: SearchSettings, *, top: int = 3, time_limit_s: float = 10.0, workers: int = 1):
    """Parse, search and check one case. Returns (job, result, doc, violations); job is None when parse_job
    rejected the input (the SpecError is re-raised for the caller to count). Anything else propagates."""
    from invariants import check_plan, check_result  # tests/ is on sys.path for both callers

    from planner.report.plan_json import plan_document
    from planner.search.homogeneous import search

    job = settings.job(raw)
    result = search(job, top=top, time_limit_s=time_limit_s, workers=workers, options=settings.options())
    doc = plan_document(job, result, None, timing=False, framework=settings.framework)
    violations = check_result(job, result, settings.memory_margin, top=top) + settings.refusals(doc)
    violations += check_plan(
        job, doc, settings.memory_margin, allow_cross_node_tp=settings.allow_cross_node_tp, top=top
    )
    return job, result, doc, violations


def run_mixed_case(raw: dict, settings: SearchSettings, *, top: int = 3, time_limit_s: float = 5.0):
    """Parse, run the mixed-GPU search and check every plan with tests/invariants_mixed.py."""
    from invariants import check_proof
    from invariants_mixed import check_mixed_plan

    from planner.report.plan_json import plan_document
    from planner.search.mixed_pipelines import search_hetero

    job = settings.job(raw)
    result = search_hetero(job, top=top, time_limit_s=time_limit_s, options=settings.options(), single_type=False)
    doc = plan_document(job, result, None, timing=False, framework=settings.framework)
    violations = [
        f"plan {p['rank']}: {msg}" for p in doc["plans"] for msg in check_mixed_plan(job, p, settings.memory_margin)
    ] + settings.refusals(doc)
    violations += check_proof(result)
    times = [p["estimate"]["iteration_time_s"] for p in doc["plans"]]
    if times != sorted(times):
        violations.append(f"plans not sorted by time: {times}")
    return job, result, doc, violations
