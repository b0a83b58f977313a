"""Context parallelism pays for its ring: a chunk whose attention per ring step is shorter than one KV send
exposes the difference (planner/cost/stage.py ring_attention_exposed)."""

from planner.cost.comm import Link
from planner.cost.stage import ring_attention_exposed

LINK = Link(busbw=100e9, latency=10e-6, size=8)


def test_long_chunks_hide_the_ring_but_the_last_gradient_hop():
    kv = 4e6  # bytes: one send is 50 us
    exposed = ring_attention_exposed(LINK, kv_bytes=kv, attention_s=0.1, cp=8)
    assert exposed == LINK.p2p(kv)  # every step's attention (12.5 ms) is longer than its send


def test_short_chunks_expose_each_step_that_waits_for_its_block():
    kv = 4e6
    attn = 8 * 20e-6  # 20 us of forward attention per step: shorter than the 50 us send
    exposed = ring_attention_exposed(LINK, kv_bytes=kv, attention_s=attn, cp=8)
    fwd = 7 * (LINK.p2p(kv) - 20e-6)
    bwd = 7 * (LINK.p2p(2 * kv) - 2.5 * 20e-6) + LINK.p2p(kv)
    assert abs(exposed - (fwd + bwd)) < 1e-12


def test_the_exposed_ring_grows_as_the_chunks_shrink():
    kv_per_token = 1e3
    times = [
        ring_attention_exposed(LINK, kv_bytes=kv_per_token * 8192 / cp, attention_s=1e-3 / cp**2, cp=cp)
        for cp in (2, 4, 8, 16)
    ]
    assert times == sorted(times)


def test_llama3_70b_at_8k_on_256_h100_the_chosen_cp_shows_its_ring(tmp_path):
    import json
    import subprocess
    import sys

    job = tmp_path / "job.yaml"
    job.write_text(
        "model: llama3-70b\n"
        "cluster: [{gpu: h100-sxm, nodes: 32, gpus_per_node: 8}]\n"
        "training: {seq_length: 8192, global_batch_size: 512, precision: bf16}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "plan", str(job), "--json", "--top", "3"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)["plans"]
    assert plans
    for plan in plans:
        breakdown = plan["estimate"]["time_breakdown_s"]
        assert (breakdown["cp_comm"] > 0) == (plan["layout"]["cp"] > 1)
