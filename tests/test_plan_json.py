"""The plan (and estimate) JSON is self-contained and documented: it echoes the resolved job so that
``parse_job(doc["job"])`` rebuilds the Job that was planned, names the planner version and the calibration used,
describes every property of its schema, and no top-level layout value contradicts a per-stage one."""

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from planner import __version__
from planner.catalog import CATALOG_ENV, builtin_data_dir
from planner.cost import calibration as C
from planner.cost.estimate import estimate
from planner.errors import SpecError
from planner.io import dumps_json
from planner.load import load_job, parse_job
from planner.report import plan_json as P
from planner.report.provenance import cost_model_json, job_json, provenance
from planner.search.homogeneous import search
from planner.search.result import Plan, SearchResult
from planner.spec import (
    GpuSpec,
    Job,
    Layout,
    LinkSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    NodeGroup,
    ReplicaSpec,
    StageSpec,
    Training,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))

# every field of every spec model, and an output model for each (models in step with planner/spec.py)
SPEC_TO_OUT = [
    (Job, P.JobOut),
    (ModelSpec, P.ModelOut),
    (MoESpec, P.MoEOut),
    (MLASpec, P.MLAOut),
    (GpuSpec, P.GpuOut),
    (NodeGroup, P.NodeGroupOut),
    (LinkSpec, P.LinkOut),
    (Training, P.TrainingOut),
    (Layout, P.JobLayoutOut),
    (StageSpec, P.JobStageOut),
    (ReplicaSpec, P.JobReplicaOut),
]

MOE_MIXED = {
    "model": {
        "name": "tiny-moe",
        "num_layers": 8,
        "hidden_size": 1024,
        "ffn_hidden_size": 4096,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "head_dim": 64,
        "vocab_size": 32000,
        "mlp": "swiglu",
        "tie_embeddings": True,
        "dropout": True,
        "moe": {
            "num_experts": 8,
            "top_k": 2,
            "expert_ffn_hidden_size": 1408,
            "shared_experts": 1,
            "moe_layer_freq": 2,
            "first_dense_layers": 1,
        },
    },
    "cluster": [
        {"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8, "inter_node_gbps": 200},
        {"gpu": {"base": "a100-80gb", "memory_gib": 40, "name": "a100-40-custom"}, "nodes": 4, "gpus_per_node": 4},
    ],
    "links": [{"groups": [1, 0], "gbps": 100}],
    "training": {
        "seq_length": 2048,
        "global_batch_size": 64,
        "precision": "bf16",
        "optimizer": "adamw",
        "attention": "flash",
        "grad_dtype": "bf16+fp32",
    },
    "layout": {
        "micro_batch_size": 1,
        "zero_stage": 1,
        "recompute": "selective",
        "replicas": [
            {
                "count": 2,
                "micro_batches": 20,
                "stages": [
                    {"group": 0, "tp": 2, "layers": 5, "gpus": 4},
                    {"group": 0, "tp": 1, "layers": 3, "gpus": 2, "recompute_layers": 1},
                ],
            },
            {
                "count": 2,
                "micro_batches": 12,
                "stages": [
                    {"group": 1, "tp": 2, "layers": 5, "gpus": 4},
                    {"group": 1, "tp": 1, "layers": 3, "gpus": 2},
                ],
            },
        ],
    },
}


def walk_properties(schema: dict, where: str = "#"):
    """(path, property schema) of every property of every object in a JSON Schema, $defs included."""
    if isinstance(schema, dict):
        for name, prop in (schema.get("properties") or {}).items():
            yield f"{where}/properties/{name}", prop
        for key, value in schema.items():
            if key != "properties" or not isinstance(value, dict):
                yield from walk_properties(value, f"{where}/{key}")
            else:
                for name, prop in value.items():
                    yield from walk_properties(prop, f"{where}/properties/{name}")
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            yield from walk_properties(item, f"{where}/{i}")


def one_plan_result(est) -> SearchResult:
    return SearchResult(
        plans=[Plan(candidate=None, estimate=est, status="optimal")],
        candidates=1,
        pruned=0,
        solved=1,
        seconds=0.0,
        complete=True,
        gap=0.0,
    )


@pytest.fixture(scope="module")
def mixed_job() -> Job:
    return parse_job(MOE_MIXED)


@pytest.fixture(scope="module")
def homogeneous_doc():
    job = load_job(ROOT / "examples" / "gpt-13b-a100-small.yaml")
    result = search(job, top=2, time_limit_s=60)
    current = estimate(job, capacity_margin=0.05)
    warn = [SimpleNamespace(field="cluster[0].gpu.memory_gib", message="looks like GB, not GiB")]
    doc = P.plan_document(job, result, current, timing=False, memory_margin=0.05, warnings=warn)
    return job, json.loads(dumps_json(doc))


# ----------------------------------------------------------------------------- schema descriptions


@pytest.mark.parametrize("make", [P.plan_schema, P.estimate_schema])
def test_every_schema_property_has_a_description(make):
    schema = make()
    props = list(walk_properties(schema))
    assert len(props) > 100  # the walk reaches the $defs
    missing = [path for path, prop in props if not str(prop.get("description", "")).strip()]
    assert not missing, f"properties without a description: {missing}"
    assert schema["description"].strip()


def test_units_are_named():
    defs = P.plan_schema()["$defs"]
    desc = lambda model, field: defs[model]["properties"][field]["description"]  # noqa: E731
    assert "fraction" in desc("EstimateOut", "mfu") and "not percent" in desc("EstimateOut", "mfu")
    assert "TFLOP/s" in desc("EstimateOut", "model_tflops_per_gpu")
    assert "GiB" in desc("EstimateOut", "peak_memory_gib")
    assert "tokens/s" in desc("EstimateOut", "tokens_per_s")
    assert "GB/s" in desc("GpuOut", "intra_node_gbps") and "Gb/s" in desc("GpuOut", "inter_node_gbps")
    for key in ("compute", "tp_comm", "pipeline_bubble", "dp_comm", "optimizer"):
        assert key in desc("EstimateOut", "time_breakdown_s")
    for key in ("weights", "gradients", "optimizer", "activations", "overhead"):
        assert key in desc("EstimateOut", "memory_breakdown_gib")
    assert "null when stages differ" in desc("LayoutOut", "tp") and "stages[].tp" in desc("LayoutOut", "tp")


@pytest.mark.parametrize("spec, out", SPEC_TO_OUT, ids=[s.__name__ for s, _ in SPEC_TO_OUT])
def test_job_echo_models_cover_every_spec_field(spec, out):
    assert set(out.model_fields) == set(spec.model_fields)


def test_calibration_echo_covers_every_calibration_field():
    assert set(P.CalibrationOut.model_fields) == {f.name for f in dataclasses.fields(C.Calibration)}


# ----------------------------------------------------------------------------- the job echo round-trips


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_examples_round_trip_through_the_json(path):
    job = load_job(path)
    echoed = json.loads(dumps_json(provenance(job)))["job"]
    assert parse_job(echoed) == job
    P.JobOut.model_validate(echoed)


def test_every_spec_feature_round_trips(mixed_job):
    """MoE, GQA, head_dim, an inline GPU with overrides, a group NIC override, links and a replicas layout
    without pp (derived from the replicas: echoing a default pp would make the job invalid)."""
    echoed = json.loads(dumps_json(job_json(mixed_job)))
    again = parse_job(echoed)
    assert again == mixed_job
    assert again.layout.model_fields_set == mixed_job.layout.model_fields_set
    assert echoed["model"]["moe"]["shared_experts"] == 1 and echoed["cluster"][0]["inter_node_gbps"] == 200
    assert echoed["cluster"][1]["gpu"]["memory_gib"] == 40 and echoed["cluster"][1]["gpu"]["hbm_tbps"] > 0
    assert echoed["links"] == [{"groups": [1, 0], "gbps": 100.0}]
    assert "pp" not in echoed["layout"]


def test_plan_document_is_self_contained(homogeneous_doc):
    job, doc = homogeneous_doc
    jsonschema.validate(doc, P.plan_schema())
    assert {"job", "planner_version", "cost_model", "memory_margin", "warnings"} <= set(doc)
    assert doc["schema_version"] == 1 and doc["planner_version"] == __version__
    assert parse_job(doc["job"]) == job
    assert doc["memory_margin"] == 0.05
    assert doc["warnings"] == [{"field": "cluster[0].gpu.memory_gib", "message": "looks like GB, not GiB"}]
    assert doc["cost_model"] == {"calibration_file": "builtin", "calibration": C.default_calibration().as_dict()}
    assert all(isinstance(p["layout"]["tp"], int) for p in doc["plans"])  # one-group plans keep their tp
    assert doc["plans"][0]["placement"]["gpus_per_node"] == job.cluster[0].gpus_per_node


def test_plan_document_defaults(homogeneous_doc):
    job, _ = homogeneous_doc
    doc = P.plan_document(job, one_plan_result(estimate(job)), None, timing=False)
    assert doc["memory_margin"] is None and doc["warnings"] == [] and "current" not in doc


def test_plan_document_is_deterministic_and_has_no_machine_paths(homogeneous_doc):
    job, doc = homogeneous_doc
    text = dumps_json(doc)
    assert text == dumps_json(json.loads(text))
    assert str(builtin_data_dir()) not in text and str(ROOT) not in text


def test_estimate_json_echoes_the_job(mixed_job):
    est = estimate(mixed_job, capacity_margin=0.05)
    plain = est.to_json()
    assert not {"job", "planner_version", "cost_model"} & set(plain)  # nested estimates stay as before
    doc = P.estimate_document(mixed_job, est, memory_margin=0.05, warnings=[])
    doc = json.loads(dumps_json(doc))
    jsonschema.validate(doc, P.estimate_schema())
    assert parse_job(doc["job"]) == mixed_job and doc["planner_version"] == __version__
    assert {
        k: v for k, v in doc.items() if k not in ("job", "planner_version", "cost_model", "warnings", "memory_margin")
    } == json.loads(dumps_json(plain))


# ----------------------------------------------------------------------------- no contradicting top-level values


def test_mixed_tp_is_null_at_the_top(mixed_job):
    est = estimate(mixed_job, capacity_margin=0.05)
    doc = json.loads(dumps_json(P.plan_document(mixed_job, one_plan_result(est), est, timing=False)))
    jsonschema.validate(doc, P.plan_schema())
    lay = doc["plans"][0]["layout"]
    assert [s["tp"] for r in lay["replicas"] for s in r["stages"]] == [2, 1, 2, 1]
    assert lay["tp"] is None and lay["sequence_parallel"] is None
    assert [r["micro_batches"] for r in lay["replicas"]] == [20, 12] and lay["num_microbatches"] is None
    place = doc["plans"][0]["placement"]
    assert place["gpus_per_node"] is None and [g["gpus_per_node"] for g in place["groups"]] == [8, 4]


def test_mixed_plan_with_one_tp_keeps_it(mixed_job):
    layout = Layout(
        dp=2,
        pp=2,
        micro_batch_size=2,
        zero_stage=1,
        recompute="none",
        stages=(StageSpec(group=0, tp=2, layers=5, gpus=4), StageSpec(group=1, tp=2, layers=3, gpus=4)),
    )
    lay = estimate(mixed_job, layout).to_json()["layout"]
    assert lay["tp"] == 2 and lay["sequence_parallel"] is True and lay["num_microbatches"] == 16


# ----------------------------------------------------------------------------- which calibration


def test_cost_model_names_the_override_file(tmp_path, monkeypatch):
    text = re.sub(
        r"^memory_fixed_gib:\s*[0-9.]+",
        "memory_fixed_gib: 4.25",
        (builtin_data_dir() / "calibration.yaml").read_text(),
        flags=re.M,
    )
    assert "memory_fixed_gib: 4.25" in text
    (tmp_path / "calibration.yaml").write_text(text)
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path))
    C._default.cache_clear()
    try:
        cm = provenance(load_job(ROOT / "examples" / "gpt-13b-a100-small.yaml"))["cost_model"]
        assert cm["calibration_file"] == str(tmp_path / "calibration.yaml")
        assert cm["calibration"]["memory_fixed_gib"] == 4.25
    finally:
        monkeypatch.delenv(CATALOG_ENV)
        C._default.cache_clear()
    assert cost_model_json()["calibration_file"] == "builtin"
    assert cost_model_json(C.default_calibration().replace(gemm_efficiency=0.5)) == {
        "calibration_file": None,
        "calibration": {**C.default_calibration().as_dict(), "gemm_efficiency": 0.5},
    }


def test_bad_echo_is_refused(mixed_job):
    """The echo is checked like a job file: a launch script that edits it gets the same errors."""
    echoed = job_json(mixed_job)
    echoed["layout"]["replicas"][0]["stages"][0]["gpus"] = 3
    with pytest.raises(SpecError):
        parse_job(echoed)


@pytest.mark.parametrize("config", ["llama3-8b.json", "qwen3-30b-a3b.json"])
def test_hf_config_models_round_trip(config):
    """A model read from a Hugging Face config.json is echoed in full: the JSON no longer needs that file."""
    job = parse_job(
        {
            "model": f"examples/hf/{config}",
            "cluster": [{"gpu": "h100-sxm", "nodes": 2}],
            "training": {"seq_length": 4096, "global_batch_size": 64},
        },
        base_dir=ROOT,
    )
    echoed = json.loads(dumps_json(job_json(job)))
    assert parse_job(echoed) == job and echoed["model"]["num_layers"] == job.model.num_layers
