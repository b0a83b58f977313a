"""planner/gate.py: each check of `planner check` passing and failing, baselines (locks, plan JSON, stale locks
re-priced), targets of every kind, and bad input. In-process; the command line is tests/test_check_cli.py."""

import json
from pathlib import Path

import pytest

from planner import __version__
from planner.cost.estimate import estimate
from planner.errors import SpecError
from planner.gate import (
    FAIL,
    PASS,
    SKIPPED,
    GateOptions,
    lock_key,
    read_target,
    run_gate,
)
from planner.io import dumps_json
from planner.load import load_job, parse_job

# line 8 is `layout:`, then one key a line: tp 9, pp 10, dp 11, micro_batch_size 12, zero_stage 13, recompute 14
JOB = """# a 13B GPT on 32 A100-80GB
model:
  {{name: gpt-13b, num_layers: 40, hidden_size: 5120, ffn_hidden_size: 20480, num_attention_heads: 40,
   vocab_size: 50257, mlp: gelu, tie_embeddings: true}}
cluster:
  - {{gpu: a100-80gb, nodes: 4, gpus_per_node: 8}}
training: {{seq_length: 2048, global_batch_size: 256, precision: bf16, optimizer: adam}}
layout:
  tp: {tp}
  pp: {pp}
  dp: {dp}
  micro_batch_size: {mbs}
  zero_stage: {zero}
  recompute: {recompute}
{extra}"""
LAYOUT_LINE, ZERO_LINE, MBS_LINE = 8, 13, 12

LLAMA = {
    "model": "llama3-8b",
    "cluster": [{"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8}],
    "training": {"seq_length": 8192, "global_batch_size": 128, "precision": "bf16", "optimizer": "adam"},
    "layout": {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 1, "zero_stage": 0, "recompute": "selective"},
}


def job_file(folder: Path, name: str = "job.yaml", **changes) -> Path:
    values = {"tp": 2, "pp": 2, "dp": 8, "mbs": 2, "zero": 1, "recompute": "selective", "extra": ""}
    values.update(changes)
    path = folder / name
    path.write_text(JOB.format(**values))
    return path


def checks(report, target: int = 0) -> dict:
    return {c.name: c for c in report.results[target].checks}


def gate(targets, **options):
    return run_gate([str(t) for t in targets], GateOptions(**options))


def write_lock(folder: Path, targets, name: str = "plan.lock.json") -> Path:
    lock = folder / name
    report = gate(targets, baseline=lock, update_baseline=True)
    lock.write_text(dumps_json(report.lock))
    return lock


# ----------------------------------------------------------------------------------------------- valid


def test_a_good_layout_passes_valid_and_fits(tmp_path):
    report = gate([job_file(tmp_path)])
    c = checks(report)
    assert [x.name for x in report.results[0].checks] == ["valid", "fits", "no_regression", "efficiency"]
    assert c["valid"].status == PASS and "tp=2 pp=2 dp=8" in c["valid"].detail
    assert c["fits"].status == PASS and "stage 0" in c["fits"].detail
    assert c["no_regression"].status == SKIPPED and "--baseline" in c["no_regression"].detail
    assert c["efficiency"].status == SKIPPED and "--min-efficiency" in c["efficiency"].detail
    assert not report.failed


@pytest.mark.parametrize(
    "changes, field, line",
    [
        ({"mbs": 3}, "layout.micro_batch_size", MBS_LINE),  # 256 sequences do not split into 3*8
        ({"tp": 16, "dp": 1}, "layout.tp", 9),  # 40 heads by tp 16
        ({"pp": 3}, "layout.pp", 10),  # 40 layers by 3 stages
        ({"tp": 3}, "layout", LAYOUT_LINE),  # 3*2*8 GPUs on a 32-GPU cluster
    ],
)
def test_a_broken_degree_rule_fails_valid_at_its_line(tmp_path, changes, field, line):
    report = gate([job_file(tmp_path, **changes)])
    c = checks(report)
    assert c["valid"].status == FAIL
    assert c["valid"].detail.startswith(f"{field}: ")
    assert c["valid"].line == line
    assert all(c[n].status == SKIPPED and "not valid" in c[n].detail for n in ("fits", "no_regression", "efficiency"))
    assert report.failed


def test_the_rules_are_those_of_parallel_py(tmp_path):
    """The same message as parse_job (planner/parallel.py check()), not a rule of the gate's own."""
    path = job_file(tmp_path, tp=16, dp=1)
    with pytest.raises(SpecError) as exc:
        load_job(path)
    assert checks(gate([path]))["valid"].detail == f"{exc.value.field}: {exc.value.message}"


def test_a_framework_rule_fails_valid(tmp_path):
    path = job_file(tmp_path)  # ZeRO-1 with a pipeline: torchtitan runs ZeRO 0 or 3 (FSDP2)
    c = checks(gate([path], framework="torchtitan"))
    assert c["valid"].status == FAIL
    assert c["valid"].detail.startswith("layout.zero_stage: torchtitan runs ZeRO stage 0, 3 with pipeline")
    assert c["valid"].line == ZERO_LINE
    ok = checks(gate([path], framework="megatron"))["valid"]
    assert ok.status == PASS and "megatron runs it" in ok.detail


def test_the_emitters_own_rules_count_too(tmp_path):
    """torchtitan has no gelu GPT: the emitter refuses it, so the gate does (zero 0 passes frameworks.py)."""
    c = checks(gate([job_file(tmp_path, zero=0)], framework="torchtitan"))
    assert c["valid"].status == FAIL and "torchtitan has no model" in c["valid"].detail


# ----------------------------------------------------------------------------------------------- fits


def test_fits_fails_naming_the_stage_and_the_largest_terms(tmp_path):
    c = checks(gate([job_file(tmp_path, mbs=16)]))
    assert c["valid"].status == PASS
    assert c["fits"].status == FAIL
    assert c["fits"].detail.startswith("stage 0 needs ")
    assert "largest terms GiB: activations" in c["fits"].detail  # 16 sequences of activations in flight
    assert c["fits"].line == LAYOUT_LINE


def test_fits_holds_to_the_memory_margin(tmp_path):
    path = job_file(tmp_path)
    peak = estimate(load_job(path)).peak_memory_gib  # ~45 GiB of 80
    assert checks(gate([path], memory_margin=0.05))["fits"].status == PASS
    tight = checks(gate([path], memory_margin=1 - (peak - 1) / 80))["fits"]
    assert tight.status == FAIL and "kept free" in tight.detail


# ----------------------------------------------------------------------------------------------- no regression


def test_no_regression_passes_and_fails_with_the_breakdown(tmp_path):
    path = job_file(tmp_path)
    lock = write_lock(tmp_path, [path])
    same = checks(gate([path], baseline=lock))["no_regression"]
    assert same.status == PASS and "+0.0%" in same.detail
    job_file(tmp_path, recompute="full")  # the same config, now recomputing every layer: ~30% slower
    slow = checks(gate([path], baseline=lock))["no_regression"]
    assert slow.status == FAIL
    assert "more than +5.0%" in slow.detail and "slower: compute +" in slow.detail
    assert slow.line == LAYOUT_LINE
    assert checks(gate([path], baseline=lock, max_regression=0.5))["no_regression"].status == PASS


def test_a_target_missing_from_the_lock_is_skipped(tmp_path):
    lock = write_lock(tmp_path, [job_file(tmp_path, "a.yaml")])
    c = checks(gate([job_file(tmp_path, "b.yaml")], baseline=lock))["no_regression"]
    assert c.status == SKIPPED and "no entry for b.yaml" in c.detail


def test_update_baseline_records_and_keeps_other_entries(tmp_path):
    a, b = job_file(tmp_path, "a.yaml"), job_file(tmp_path, "b.yaml", recompute="full")
    lock = write_lock(tmp_path, [a, b])
    job_file(tmp_path, "a.yaml", recompute="none")
    report = gate([a], baseline=lock, update_baseline=True)
    c = checks(report)["no_regression"]
    assert c.status == PASS and c.detail.startswith("baseline updated: ") and "(was " in c.detail
    doc = report.lock
    assert sorted(doc["targets"]) == ["a.yaml", "b.yaml"]
    assert doc["targets"]["a.yaml"]["layout"]["recompute"] == "none"
    assert doc["targets"]["b.yaml"]["layout"]["recompute"] == "full"  # kept as it was
    entry = doc["targets"]["a.yaml"]
    assert entry["planner_version"] == __version__
    assert set(entry["cost_model"]) >= {"version", "calibration", "profiles"}
    assert parse_job(entry["job"]).layout.recompute == "none"  # the recorded job re-prices on its own


def test_update_baseline_needs_a_lock_path(tmp_path):
    with pytest.raises(SpecError) as exc:
        gate([job_file(tmp_path)], update_baseline=True)
    assert exc.value.field == "--update-baseline"


def test_lock_keys_are_relative_to_the_lock(tmp_path):
    (tmp_path / "configs").mkdir()
    assert lock_key(str(tmp_path / "configs" / "a.yaml"), tmp_path / "configs" / "plan.lock.json") == "a.yaml"
    assert lock_key(str(tmp_path / "configs" / "a.yaml"), tmp_path / "plan.lock.json") == "configs/a.yaml"


def _tamper(lock: Path, **entry_changes) -> Path:
    doc = json.loads(lock.read_text())
    for entry in doc["targets"].values():
        for key, value in entry_changes.items():
            if key == "calibration":
                entry["cost_model"]["calibration"].update(value)
            elif key == "version":
                entry["cost_model"]["version"] = value
            else:
                entry[key] = value
    out = lock.with_name("tampered.lock.json")
    out.write_text(json.dumps(doc))
    return out


def test_a_lock_of_another_planner_version_is_repriced(tmp_path):
    path = job_file(tmp_path)
    lock = write_lock(tmp_path, [path])
    # A recorded time far below today's price: compared blindly it is a regression ...
    blind = checks(gate([path], baseline=_tamper(lock, iteration_time_s=1.0)))["no_regression"]
    assert blind.status == FAIL and "re-priced" not in blind.detail
    # ... but priced by another planner, the lock's layout is estimated again with today's model.
    old = checks(gate([path], baseline=_tamper(lock, iteration_time_s=1.0, planner_version="0.0.1")))["no_regression"]
    assert old.status == PASS
    assert "baseline re-priced" in old.detail and f"planner 0.0.1, now {__version__}" in old.detail
    assert "1.000 s recorded" in old.detail and "+0.0%" in old.detail


def test_a_lock_of_other_cost_model_code_is_repriced(tmp_path):
    path = job_file(tmp_path)
    lock = write_lock(tmp_path, [path])
    c = checks(gate([path], baseline=_tamper(lock, iteration_time_s=1.0, version="sha256:0123")))["no_regression"]
    assert c.status == PASS and "re-priced" in c.detail and "cost-model code sha256:0123" in c.detail


def test_a_lock_of_another_calibration_is_repriced_with_todays(tmp_path):
    """A job that now prices with its own calibration: the lock (built-in calibration) is re-priced with the job's,
    so the comparison is of layouts, not of calibrations."""
    path = job_file(tmp_path)
    lock = write_lock(tmp_path, [path])
    (tmp_path / "calib.yaml").write_text("gemm_efficiency: 0.6\n")
    job_file(tmp_path, extra="calibration: calib.yaml\n")
    slower = (
        estimate(load_job(path)).iteration_time_s
        / json.loads(lock.read_text())["targets"]["job.yaml"]["iteration_time_s"]
    )
    assert slower > 1.05  # compared blindly this would fail
    c = checks(gate([path], baseline=lock))["no_regression"]
    assert c.status == PASS
    assert "re-priced" in c.detail and "calibration gemm_efficiency" in c.detail and "-> 0.6" in c.detail


def test_a_stale_lock_whose_layout_no_longer_prices_is_skipped(tmp_path):
    path = job_file(tmp_path)
    lock = write_lock(tmp_path, [path])
    doc = json.loads(lock.read_text())
    doc["targets"]["job.yaml"]["job"]["layout"].update(tp=16, dp=1)  # 40 heads by 16: not a layout today
    doc["targets"]["job.yaml"]["planner_version"] = "0.0.1"
    lock.write_text(json.dumps(doc))
    c = checks(gate([path], baseline=lock))["no_regression"]
    assert c.status == SKIPPED and "--update-baseline" in c.detail and "layout.tp" in c.detail


def test_a_bad_lock_is_bad_input(tmp_path):
    path = job_file(tmp_path)
    (tmp_path / "lock.json").write_text('{"schema_version": 1, "planner_version": "x", "targets": {"a": {}}}')
    with pytest.raises(SpecError) as exc:
        gate([path], baseline=tmp_path / "lock.json")
    assert exc.value.field.startswith("--baseline.targets")
    with pytest.raises(SpecError) as exc:
        gate([path], baseline=tmp_path / "missing.json")
    assert exc.value.field == "--baseline" and "--update-baseline" in exc.value.message


# ----------------------------------------------------------------------------------------------- plan JSON


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory) -> tuple[Path, dict]:
    """`planner plan --out` of the 13B job (searched in-process)."""
    from planner.report.plan_json import plan_document
    from planner.search import run_search
    from planner.search.space import SearchOptions

    folder = tmp_path_factory.mktemp("plan")
    job = load_job(job_file(folder))
    result = run_search(job, SearchOptions(), top=2, time_limit_s=30)
    doc = plan_document(job, result, estimate(job), timing=False, memory_margin=0.05)
    path = folder / "plan.json"
    path.write_text(dumps_json(doc))
    return path, doc


def test_a_plan_json_is_a_target_and_a_baseline(tmp_path, plan_doc):
    plan_path, doc = plan_doc
    target = read_target(plan_path)
    assert target.kind == "plan"
    report = gate([plan_path, job_file(tmp_path)], baseline=plan_path)
    best = checks(report, 0)
    assert best["valid"].status == PASS and best["fits"].status == PASS
    assert best["no_regression"].status == PASS and "plan 1 of" in best["no_regression"].detail
    current = checks(report, 1)["no_regression"]  # the job's own layout is slower than the plan's best
    expected = doc["current"]["iteration_time_s"] / doc["plans"][0]["estimate"]["iteration_time_s"] - 1
    assert expected > 0.05 and current.status == FAIL and f"+{expected:.1%}" in current.detail


def test_a_plan_json_baseline_of_another_job_is_skipped(tmp_path, plan_doc):
    other = tmp_path / "llama.yaml"
    other.write_text(json.dumps(LLAMA))
    c = checks(gate([other], baseline=plan_doc[0]))["no_regression"]
    assert c.status == SKIPPED and "another job" in c.detail


def test_a_plan_json_recorded_by_another_planner_is_repriced(tmp_path, plan_doc):
    doc = {**plan_doc[1], "planner_version": "0.0.1"}
    doc["plans"] = [{**doc["plans"][0], "estimate": {**doc["plans"][0]["estimate"], "iteration_time_s": 0.5}}]
    old = tmp_path / "old-plan.json"
    old.write_text(dumps_json(doc))
    c = checks(gate([plan_doc[0]], baseline=old))["no_regression"]
    assert c.status == PASS and "re-priced" in c.detail and "planner 0.0.1" in c.detail


# ----------------------------------------------------------------------------------------------- efficiency


def test_efficiency_against_the_best_plan(tmp_path, plan_doc, monkeypatch):
    import planner.search

    searches = []
    real = planner.search.run_search
    monkeypatch.setattr(planner.search, "run_search", lambda *a, **k: searches.append(1) or real(*a, **k))
    plan_path, doc = plan_doc
    report = gate([job_file(tmp_path), plan_path], min_efficiency=0.99, time_limit_s=30)
    own, best = checks(report, 0)["efficiency"], checks(report, 1)["efficiency"]
    ratio = doc["plans"][0]["estimate"]["iteration_time_s"] / doc["current"]["iteration_time_s"]
    assert own.status == FAIL and f"{ratio:.1%} of the best plan's throughput" in own.detail
    layout = doc["plans"][0]["layout"]
    assert f"tp={layout['tp']} pp={layout['pp']} dp={layout['dp']}" in own.detail  # names the best plan
    assert own.line == LAYOUT_LINE
    assert best.status == PASS and "100.0%" in best.detail
    assert len(searches) == 1  # one search per distinct job
    assert checks(gate([job_file(tmp_path)], min_efficiency=0.5, time_limit_s=30))["efficiency"].status == PASS


# ----------------------------------------------------------------------------------------------- targets


def _emitted(tmp_path: Path, framework: str, **options) -> Path:
    """The launch folder `planner emit` writes for LLAMA's layout."""
    from planner.emit import EmitOptions, emit
    from planner.io import write_folder
    from planner.report.plan_json import placement
    from planner.report.provenance import job_json

    job = parse_job(LLAMA)
    est = estimate(job)
    j = est.to_json()
    doc = {
        "schema_version": 1,
        "job": job_json(job),
        "plans": [{"layout": j["layout"], "placement": placement(job, est), "estimate": j}],
    }
    folder = tmp_path / framework
    write_folder(folder, emit(doc, framework, 1, EmitOptions(**options)))
    return folder


@pytest.mark.parametrize(
    "framework, file, given",
    [
        ("megatron", "megatron_args.txt", {"gpu": "h100-sxm", "world_size": 16}),
        ("megatron", "launch.sh", {"gpu": "h100-sxm", "world_size": 16}),
        (
            "deepspeed",
            "ds_config.json",
            {"gpu": "h100-sxm", "world_size": 16, "model": "llama3-8b", "seq_length": 8192},
        ),
        ("torchtitan", "plan_config.py", {"gpu": "h100-sxm"}),
    ],
)
def test_framework_configs_are_read_by_their_importer(tmp_path, framework, file, given):
    path = _emitted(tmp_path, framework) / file
    target = read_target(path, given)
    assert target.kind == framework and target.framework == framework
    report = gate([path], given=given)
    c = checks(report)
    assert c["valid"].status == PASS and f"{framework} runs it" in c["valid"].detail
    assert c["fits"].status == PASS


def test_torchtitan_toml(tmp_path):
    path = _emitted(tmp_path, "torchtitan", framework_version="0.2") / "plan.toml"
    c = checks(gate([path], given={"gpu": "h100-sxm"}))
    assert c["valid"].status == PASS and "torchtitan runs it" in c["valid"].detail


def test_a_framework_config_without_what_it_lacks_is_bad_input(tmp_path):
    path = _emitted(tmp_path, "deepspeed") / "ds_config.json"
    with pytest.raises(SpecError):
        gate([path], given={"gpu": "h100-sxm", "world_size": 16})  # no model, no sequence length


def test_the_line_of_a_flag_in_a_megatron_config(tmp_path):
    path = _emitted(tmp_path, "megatron") / "megatron_args.txt"
    target = read_target(path, {"gpu": "h100-sxm", "world_size": 16})
    lines = path.read_text().splitlines()
    assert lines[target.line_of("layout.tp") - 1].startswith("--tensor-model-parallel-size")
    assert lines[target.line_of("plans[0].layout.micro_batch_size") - 1].startswith("--micro-batch-size")
    # ZeRO-0 has no flag: the line of the parallel degrees
    assert lines[target.line_of("layout.zero_stage") - 1].startswith("--tensor-model-parallel-size")


def test_an_estimate_json_is_a_target(tmp_path):
    from planner.report.plan_json import estimate_document

    job = parse_job(LLAMA)
    path = tmp_path / "estimate.json"
    path.write_text(dumps_json(estimate_document(job, estimate(job), memory_margin=0.05)))
    target = read_target(path)
    assert target.kind == "estimate" and target.layout.tp == 2
    assert checks(gate([path]))["valid"].status == PASS


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("workflow.yaml", "name: ci\non: push\n", "is not a job"),
        ("notes.md", "hello\n", "is not a job"),
        ("list.json", "[1, 2]\n", "is not a job"),
        ("other.json", '{"a": 1}\n', "is not a job"),
        ("empty.yaml", "", "is empty"),
        ("broken.yaml", "model: [\n", "invalid YAML"),
        ("lock.json", '{"schema_version": 1, "planner_version": "0.1.0", "targets": {}}', "pass it as --baseline"),
    ],
)
def test_a_target_that_is_not_a_job_is_bad_input(tmp_path, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as exc:
        gate([path])
    assert exc.value.field == "target" and fragment in exc.value.message


def test_a_job_without_a_layout_or_with_a_bad_one_is_bad_input(tmp_path):
    no_layout = {k: v for k, v in LLAMA.items() if k != "layout"}
    (tmp_path / "a.yaml").write_text(json.dumps(no_layout))
    with pytest.raises(SpecError) as exc:
        gate([tmp_path / "a.yaml"])
    assert exc.value.field.endswith("a.yaml:layout") and "no layout" in exc.value.message
    (tmp_path / "b.yaml").write_text(json.dumps({**LLAMA, "layout": {"tp": 2, "zero_stage": 7}}))
    with pytest.raises(SpecError) as exc:
        gate([tmp_path / "b.yaml"])
    assert exc.value.field.endswith("b.yaml:layout.zero_stage")
    (tmp_path / "c.yaml").write_text(json.dumps({**LLAMA, "cluster": [{"gpu": "h100-sxm", "nodes": 0}]}))
    with pytest.raises(SpecError) as exc:
        gate([tmp_path / "c.yaml"])
    assert exc.value.field.endswith("c.yaml:cluster[0].nodes")
