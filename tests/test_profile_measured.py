"""Measured profiles reach every consumer: layer and collective times from a profile replace the analytic ones
where the profile covers the point (planner/profile/measured.py), in `estimate` and in the search."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.cost.estimate import estimate
from planner.cost.provider import cost_source
from planner.errors import SpecError
from planner.load import load_profile, parse_job, with_profile
from planner.profile.interpolate import loglog
from planner.profile.measured import shape_of
from planner.profile.schema import Profile

ROOT = Path(__file__).resolve().parents[1]

JOB = {
    "model": "llama2-7b",
    "cluster": [{"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 8}],
    "training": {"seq_length": 4096, "global_batch_size": 64},
    "layout": {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
}


def scaled_profile(job, factor: float, micro_batches=(1, 2, 4), tps=(1, 2, 4, 8), collectives=()) -> Profile:
    """A profile whose whole-layer times are ``factor`` x the analytic ones at every measured point."""
    costs = cost_source(job)(0)
    m, seq = job.model, job.training.seq_length
    points = []
    for tp in tps:
        for mb in micro_batches:
            lt = costs.layer(m, mb * seq, seq, tp, tp > 1, 1, 1, False, True, "none")
            points.append(
                {"kind": "layer", "micro_batch_size": mb, "seq_length": seq, "tp": tp,
                 "forward_s": lt.forward * factor, "backward_s": lt.backward * factor}
            )  # fmt: skip
    return Profile.model_validate(
        {
            "schema_version": 1,
            "gpu": job.cluster[0].gpu.name,
            "provenance": {"tool": "test", "command": "scaled analytic"},
            "model": shape_of(m).model_dump(),
            "layers": points,
            "collectives": list(collectives),
        }
    )


def with_group_profile(raw: dict, profile: Profile) -> dict:
    raw = json.loads(json.dumps(raw))
    raw["cluster"][0]["profile"] = profile.model_dump()
    return raw


def test_loglog_reads_points_interpolates_and_stops_past_its_reach():
    pts = [(1, 1.0), (2, 2.0), (8, 4.0)]
    assert loglog(pts, 2, 2) == 2.0
    assert math.isclose(loglog(pts, 4, 2), 2 * math.sqrt(2))  # power law between 2 and 8
    assert math.isclose(loglog(pts, 16, 2), 4 * math.sqrt(2))  # the end segment, extended
    assert loglog(pts, 17, 2) is None and loglog(pts, 0.4, 2) is None


def test_measured_layer_times_are_used_at_measured_points():
    job = parse_job(JOB)
    base = estimate(job)
    doubled = estimate(parse_job(with_group_profile(JOB, scaled_profile(job, 2.0))))
    t0, t1 = base.stages[0].layer_times_s["dense"], doubled.stages[0].layer_times_s["dense"]
    assert math.isclose(t1["forward"], 2 * t0["forward"]) and math.isclose(t1["backward"], 2 * t0["backward"])
    assert doubled.cost_sources == {0: {"layer": "measured", "collectives": "analytic", "embedding": "analytic",
                                        "logits": "analytic", "pipeline sends": "analytic"}}  # fmt: skip
    layers = base.stages[0].layers
    # compute grows by exactly the layers' extra forward and backward (embedding and logits stay analytic)
    extra = layers * (t0["forward"] + t0["backward"])
    assert math.isclose(doubled.stages[0].time_s["compute"] - base.stages[0].time_s["compute"], extra, rel_tol=1e-9)
    assert doubled.iteration_time_s > base.iteration_time_s


def test_between_points_the_curve_is_interpolated_and_outside_it_is_analytic():
    job = parse_job(JOB)
    profile = scaled_profile(job, 2.0, micro_batches=(1, 4), tps=(2,))
    measured = parse_job(with_group_profile(JOB, profile))
    costs = cost_source(measured)(0)
    m, seq = measured.model, 4096
    lt = costs.layer(m, 2 * seq, seq, 2, True, 1, 1, False, True, "none")
    f1, f4 = (p.forward_s for p in profile.layers)
    assert math.isclose(lt.forward, math.exp((math.log(f1) + math.log(f4)) / 2))  # log-log midpoint
    analytic = cost_source(job)(0).layer(m, seq, seq, 4, True, 1, 1, False, True, "none")
    scaled = costs.layer(m, seq, seq, 4, True, 1, 1, False, True, "none")  # tp 4 not measured: scaled by 2
    assert math.isclose(scaled.forward, 2 * analytic.forward) and math.isclose(scaled.backward, 2 * analytic.backward)
    assert costs.source_report()["layer"] == "measured+scaled"


def test_measured_collectives_price_the_matching_group():
    job = parse_job(JOB)
    rows = [{"op": "all_reduce", "bytes": b, "ranks": 8, "nodes": 1, "time_s": b / 50e9} for b in (1e6, 1e8, 1e10)]
    costs = cost_source(parse_job(with_group_profile(JOB, scaled_profile(job, 1.0, collectives=rows))))(0)
    link = costs.link(8, 8)
    assert math.isclose(link.all_reduce(1e8), 1e8 / 50e9)
    assert link.all_gather(1e8) == cost_source(job)(0).link(8, 8).all_gather(1e8)  # op not measured
    assert costs.link(4, 4) == cost_source(job)(0).link(4, 4)  # group size not measured


def test_a_slower_measured_gpu_changes_the_plan():
    """Layer times measured at twice the analytic ones: the best plan changes, its compute doubles (embedding and
    logits stay analytic: a little less than 2x) and the components the layers do not touch stay as they were."""
    from planner.search import run_search
    from planner.search.space import SearchOptions

    raw = {k: v for k, v in JOB.items() if k != "layout"}
    job = parse_job(raw)
    base = run_search(job, SearchOptions(), top=1, time_limit_s=60).plans[0]
    slow = run_search(
        parse_job(with_group_profile(raw, scaled_profile(job, 2.0))), SearchOptions(), top=1, time_limit_s=60
    ).plans[0]
    assert slow.candidate != base.candidate
    b, s = base.estimate.time_breakdown_s, slow.estimate.time_breakdown_s
    assert 1.9 < s["compute"] / b["compute"] <= 2.0
    assert s["optimizer"] == b["optimizer"]
    assert slow.estimate.cost_sources[0]["layer"] in ("measured", "measured+scaled")


def test_profile_file_from_the_job_and_from_the_command_line(tmp_path):
    job = parse_job(JOB)
    profile = scaled_profile(job, 2.0)
    (tmp_path / "a100.yaml").write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    raw = json.loads(json.dumps(JOB))
    raw["cluster"][0]["profile"] = "a100.yaml"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    out = subprocess.run(
        [sys.executable, "-m", "planner", "estimate", str(tmp_path / "job.yaml"), "--json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cost_sources"]["0"]["layer"] == "measured"
    again = with_profile(job, tmp_path / "a100.yaml")
    assert estimate(again).cost_sources[0]["layer"] == "measured"


def test_profile_errors_name_the_field(tmp_path):
    job = parse_job(JOB)
    bad = scaled_profile(job, 1.0).model_dump(mode="json")
    bad["layers"][1]["forward_s"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError, match=r"^--profile\.layers\[1\]\.forward_s: "):
        load_profile(tmp_path / "bad.yaml", "--profile")
    other = scaled_profile(job, 1.0).model_copy(update={"gpu": "h100-sxm"})
    (tmp_path / "h100.yaml").write_text(yaml.safe_dump(other.model_dump(mode="json")))
    with pytest.raises(SpecError, match="measured on h100-sxm"):
        with_profile(job, tmp_path / "h100.yaml")


def test_a_slower_measured_gpu_moves_work_off_it_in_a_mixed_cluster():
    """A profile that finds the A100 three times slower than the datasheet model: its layers are priced 3x (scaled
    where the profile has no point, e.g. with CP) and the mixed plan gives it a smaller share of the work."""
    from planner.search import run_search
    from planner.search.space import SearchOptions

    raw = {
        "model": "llama2-7b",
        "cluster": [{"gpu": "h100-sxm", "nodes": 2}, {"gpu": "a100-80gb", "nodes": 2}],
        "training": {"seq_length": 4096, "global_batch_size": 64},
    }
    job = parse_job(raw)
    a100_only = parse_job({**raw, "cluster": [raw["cluster"][1]]})
    measured_raw = json.loads(json.dumps(raw))
    measured_raw["cluster"][1]["profile"] = scaled_profile(a100_only, 3.0).model_dump()
    measured = parse_job(measured_raw)

    def a100_share(plan) -> float:
        """Share of the micro-batches (or layers) that run on the A100 group."""
        d = plan.estimate.dims
        if hasattr(d, "replicas"):
            runs = [(r.stage_groups[0], r.num_microbatches * r.dp) for r in d.replicas]
        else:
            runs = [(g, n) for g, n in zip(d.stage_groups, d.stage_layers)]
        return sum(n for g, n in runs if g == 1) / sum(n for _, n in runs)

    base = run_search(job, SearchOptions(), top=1, time_limit_s=60).plans[0]
    slow = run_search(measured, SearchOptions(), top=1, time_limit_s=60).plans[0]
    assert slow.estimate.cost_sources[1]["layer"] in ("measured", "scaled", "measured+scaled")
    assert a100_share(slow) < a100_share(base)
    # every A100 stage's layer time is 3x the analytic one at its own shape
    analytic = cost_source(job)(1)
    for st, d in zip(slow.estimate.stages, _stage_dims(slow.estimate.dims)):
        if d["group"] != 1:
            continue
        tokens = d["mbs"] * 4096 // d["cp"]
        a = analytic.layer(job.model, tokens, 4096, d["tp"], d["tp"] > 1, d["cp"], 1, False, True, "none")
        assert math.isclose(st.layer_times_s["dense"]["forward"], 3 * a.forward, rel_tol=1e-9)


def _stage_dims(dims) -> list[dict]:
    """Group, TP, CP and micro-batch of each estimate stage (replica entry after replica entry)."""
    reps = dims.replicas if hasattr(dims, "replicas") else [dims]
    return [
        {"group": r.stage_groups[s], "tp": r.stage_tp[s], "cp": r.cp, "mbs": r.micro_batch_size}
        for r in reps
        for s in range(len(r.stage_groups))
    ]


def test_validate_prices_the_runs_of_the_profiles_gpu_with_it(tmp_path):
    doc_runs = [
        {
            "id": "r1",
            "model": {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096, "ffn_hidden": 11008,
                      "arch": "llama swiglu untied flash", "name": "llama2-7b"},
            "hardware": {"gpu": "a100-80gb", "n_gpus": 16, "gpus_per_node": 8},
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 64, "sp": True,
                         "distributed_optimizer": True, "recompute": "none", "precision": "bf16"},
            "measured": {"iteration_time_s": 10.0},
        }
    ]  # fmt: skip
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(doc_runs))
    job = parse_job(JOB)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(scaled_profile(job, 2.0).model_dump(mode="json")))

    def predicted(*extra):
        out = subprocess.run(
            [sys.executable, "-m", "planner", "validate", str(tmp_path / "runs.yaml"), "--json", *extra],
            capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["runs"][0]["predicted"]["iteration_time_s"]

    assert predicted("--profile", str(tmp_path / "p.yaml")) > 1.5 * predicted()


def test_measured_links_with_other_curves_do_not_share_a_cached_collective_line():
    """forms.collective_line caches by link value: two measured links alike in bus bandwidth, latency and size but
    with other curves (two node groups' profiles) must each get their own line."""
    from planner.cost.forms import collective_line
    from planner.profile.measured import MeasuredLink

    slow = MeasuredLink(1e11, 1e-5, 8, {"all_reduce": ((1e9, 0.04), (1e10, 0.4))})
    fast = MeasuredLink(1e11, 1e-5, 8, {"all_reduce": ((1e9, 0.02), (1e10, 0.2))})
    assert collective_line(slow, "all_reduce", 2.0).at(1e9) > collective_line(fast, "all_reduce", 2.0).at(1e9)
