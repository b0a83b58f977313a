"""`planner profile ingest` readers (planner/profile/ingest/): exact values read by hand from the shared reference
files (shared/reference/samples, shared/reference/layer-profiles) and from the small fixtures in
tests/fixtures/profiles, format detection from content, the errors for truncated, foreign and self-contradicting
files, merging, and that the result is a valid Profile that survives a YAML round trip."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
import yaml

from planner.errors import SpecError
from planner.load import load_profile
from planner.profile.ingest import detect_format, ingest, read_source
from planner.profile.schema import LayerShape, Profile

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "profiles"
_CANDIDATES = (Path(__file__).resolve().parents[2] / "shared" / "reference", Path("/work/shared/reference"))
REF = next((p for p in _CANDIDATES if (p / "samples").is_dir()), None)
needs_ref = pytest.mark.skipif(
    REF is None, reason="shared/reference not found (expected at ../shared/reference from the repo root)"
)
SAMPLES = REF / "samples" if REF else Path("missing")
LAYERS = REF / "layer-profiles" if REF else Path("missing")

OPT350 = LayerShape(hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, mlp="gelu", vocab_size=50272)
TINY = LayerShape(hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, mlp="gelu", vocab_size=256)


def coll(profile: Profile, op: str, size: float, ranks: int | None = None):
    hits = [c for c in profile.collectives if c.op == op and c.bytes == size and (ranks is None or c.ranks == ranks)]
    assert len(hits) == 1, hits
    return hits[0]


def layer(profile: Profile, kind: str, mbs: int, tp: int = 1, precision: str | None = None):
    hits = [
        p
        for p in profile.layers
        if p.kind == kind and p.micro_batch_size == mbs and p.tp == tp and precision in (None, p.precision)
    ]
    assert len(hits) == 1, hits
    return hits[0]


def error_of(*args, **kwargs) -> SpecError:
    with pytest.raises(SpecError) as exc:
        ingest(*args, **kwargs)
    return exc.value


# --------------------------------------------------------------------------- nccl-tests text


@needs_ref
def test_nccl_text_h100_two_nodes_rows_not_the_average_line():
    p = ingest([SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt"], "h100-sxm")
    assert [c.bytes for c in p.collectives] == [2**30, 2**31, 2**32, 2**33, 2**34]
    first = coll(p, "all_reduce", 1073741824)
    assert (first.ranks, first.nodes) == (16, 2)
    assert first.time_s == pytest.approx(4511.2e-6, rel=1e-12) and first.busbw_gbps == 446.28
    last = coll(p, "all_reduce", 17179869184)
    assert last.time_s == pytest.approx(0.069338, rel=1e-12) and last.busbw_gbps == 464.57
    assert all(c.busbw_gbps != 458.452 for c in p.collectives)  # the "# Avg bus bandwidth" line is not a point
    assert p.gpu == "h100-sxm" and p.provenance.gpu == "NVIDIA H100 80GB HBM3"
    assert p.provenance.host == "inst-xxxxx-h100-ol89, inst-yyyyy-h100-ol89"
    assert "all_reduce_perf -b 1G -e 16G -f 2" in p.provenance.command and not p.provenance.command.startswith("$")
    assert p.provenance.tool == "nccl-tests" and p.layers == () and p.model is None


@needs_ref
def test_nccl_text_new_header_one_and_two_nodes():
    one = coll(ingest([SAMPLES / "nccl_allreduce_a100_1x8_oci.txt"], "a100-40gb"), "all_reduce", 10737418240)
    assert (one.ranks, one.nodes, one.busbw_gbps) == (8, 1, 232.20)
    assert one.time_s == pytest.approx(0.080922, rel=1e-12)
    two = coll(ingest([SAMPLES / "nccl_allreduce_a100_2x8_roce_oci.txt"], "a100-40gb"), "all_reduce", 10737418240)
    assert (two.ranks, two.nodes, two.busbw_gbps) == (16, 2, 191.76)
    assert two.time_s == pytest.approx(0.104989, rel=1e-12)


@needs_ref
def test_nccl_sendrecv_without_device_lines_reads_ranks_from_the_command():
    p = ingest([SAMPLES / "nccl_sendrecv_a100_1x8.txt"], "a100-40gb")  # `sendrecv_perf ... -g 8`, one process
    assert len(p.collectives) == 4 and {c.op for c in p.collectives} == {"send_recv"}
    first = coll(p, "send_recv", 134217728)
    assert (first.ranks, first.nodes, first.busbw_gbps) == (8, 1, 110.81)
    assert first.time_s == pytest.approx(1211.2e-6, rel=1e-12)
    assert coll(p, "send_recv", 1073741824).time_s == pytest.approx(5503.4e-6, rel=1e-12)


def test_nccl_srun_labels_old_layout_and_several_blocks():
    notes = []
    p = ingest([FIX / "nccl_srun_label_old_layout.txt"], "a100-80gb", notes=notes)
    assert {c.op for c in p.collectives} == {"all_gather", "reduce_scatter", "all_to_all"}
    assert len(p.collectives) == 7 and all((c.ranks, c.nodes) == (4, 2) for c in p.collectives)
    rs = coll(p, "reduce_scatter", 4194304)
    assert rs.time_s == pytest.approx(170e-6, rel=1e-12) and rs.busbw_gbps == 18.50
    assert coll(p, "all_to_all", 1048576).time_s == pytest.approx(70e-6, rel=1e-12)
    assert p.provenance.nccl == "2.18.5" and p.provenance.host == "node001, node002"
    assert any("broadcast_perf skipped" in n for n in notes)  # not a collective a profile holds


def test_nccl_json_counts_one_device_entry_per_process():
    p = ingest([FIX / "nccl_allgather_2x4.json"], "h200")
    assert len(p.collectives) == 2
    small = coll(p, "all_gather", 1048576)
    assert (small.ranks, small.nodes) == (8, 2)  # 2 processes x 4 GPUs (-g 4)
    assert small.time_s == pytest.approx(80e-6, rel=1e-12) and small.busbw_gbps == pytest.approx(11.4688)
    assert p.provenance.nccl == "2.27.3" and p.provenance.date == "2025-11-03T14:02:11"
    assert p.provenance.command.startswith("./build/all_gather_perf -b 1M")


def test_nccl_inconsistent_rank_count_is_refused_at_its_row():
    path = FIX / "nccl_inconsistent_ranks.txt"
    err = error_of([path], "h100-sxm")
    assert err.field == f"{path}:16"
    assert "16 ranks" in err.message and "8 ranks" in err.message


@needs_ref
def test_nccl_truncated_row_names_file_and_line(tmp_path):
    text = (SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt").read_text().splitlines()
    cut = tmp_path / "cut.txt"
    cut.write_text("\n".join(text[:26]) + "\n" + text[26][:60] + "\n")  # the 3rd row cut mid-line
    err = error_of([cut], "h100-sxm")
    assert err.field == f"{cut}:27" and "truncated row" in err.message
    headers = tmp_path / "headers.txt"
    headers.write_text("\n".join(text[:24]) + "\n")  # the run died before its first row
    err = error_of([headers], "h100-sxm")
    assert err.field == f"{headers}:24" and "without any result row" in err.message


# --------------------------------------------------------------------------- torch.profiler traces


@needs_ref
def test_torch_trace_cpu_sample_median_of_the_layer_ranges():
    notes = []
    p = ingest([SAMPLES / "torch_trace_cpu.json"], "l4", model=TINY, micro_batch_size=4, seq_length=32, notes=notes)
    (point,) = p.layers
    assert (point.kind, point.micro_batch_size, point.seq_length, point.tp) == ("layer", 4, 32, 1)
    assert point.precision == "fp32"  # the aten::mm operands are `float`
    assert point.forward_s == pytest.approx((1135.519 + 750.255) / 2 / 1e6, rel=1e-9)  # layer.0/1.forward
    assert point.backward_s == pytest.approx((1499.42 + 1271.471) / 2 / 1e6, rel=1e-9)  # layer.1/0.backward
    assert p.provenance.host == "vm" and "torch.profiler" in p.provenance.tool
    assert any("embed.forward" in n for n in notes) and any("head.forward" in n for n in notes)


@needs_ref
def test_torch_trace_needs_the_values_it_does_not_record():
    path = SAMPLES / "torch_trace_cpu.json"
    err = error_of([path], "l4", model=TINY, seq_length=32)
    assert err.field.startswith(f"{path}:") and "--micro-batch-size" in err.message
    err = error_of([path], "l4", micro_batch_size=4, seq_length=32)
    assert err.field == "--model"


@needs_ref
def test_layer_pattern_replaces_the_convention():
    path = SAMPLES / "torch_trace_cpu.json"
    kw = dict(model=TINY, micro_batch_size=4, seq_length=32)
    p = ingest([path], "l4", layer_pattern=r"^(?P<kind>layer)\.\d+\.(?P<pass>forward|backward)$", **kw)
    assert p.layers[0].forward_s == pytest.approx(942.887e-6, rel=1e-9)
    assert error_of([path], "l4", layer_pattern=r"layer\.(\d+)", **kw).field == "--layer-pattern"
    assert error_of([path], "l4", layer_pattern=r"(?P<kind>[", **kw).field == "--layer-pattern"
    err = error_of([path], "l4", layer_pattern=r"^(?P<kind>mlp)\.(?P<pass>fwd)$", **kw)
    assert err.field == f"{path}:1" and "no record_function range" in err.message


def test_torch_trace_gpu_spans_metadata_and_gzip(tmp_path):
    packed = tmp_path / "rank0.trace"  # gzip recognised from its bytes, not a .gz name
    packed.write_bytes(gzip.compress((FIX / "trace_gpu_annotations.json").read_bytes()))
    p = ingest([packed], "h100-sxm", model="llama2-7b", micro_batch_size=8)
    attn, mlp = layer(p, "attention", 2), layer(p, "mlp", 2)  # micro-batch 2 from the trace, not the caller's 8
    assert attn.forward_s == pytest.approx(1.25e-3) and attn.backward_s == pytest.approx(2.5e-3)  # GPU spans
    assert mlp.forward_s == pytest.approx(1.5e-3) and mlp.backward_s == pytest.approx(3.05e-3)
    assert (attn.seq_length, attn.tp, attn.precision) == (4096, 1, "bf16")
    assert p.provenance.gpu == "NVIDIA H100 80GB HBM3" and p.provenance.nccl == "2.21.5"
    assert p.provenance.date == "2025-01-01T00:00:00+00:00" and p.provenance.host == "train-node-7"


@needs_ref
def test_truncated_trace_json_names_the_line(tmp_path):
    text = json.dumps(json.loads((SAMPLES / "torch_trace_cpu.json").read_text()), indent=1)
    cut = tmp_path / "trace.json"
    cut.write_text(text[: len(text) // 2])
    err = error_of([cut], "l4", model=TINY, micro_batch_size=4, seq_length=32)
    line = text[: len(text) // 2].count("\n") + 1
    assert err.field == f"{cut}:{line}" and "truncated" in err.message
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(text.encode())[:-40])
    err = error_of([packed], "l4", model=TINY)
    assert err.field.startswith(f"{packed}:") and "gzip" in err.message


# --------------------------------------------------------------------------- other planners' profiles


@needs_ref
def test_sailor_profile_rows_and_units():
    notes = []
    p = ingest([LAYERS / "sailor/profiles/OPT-350/A100-40/profile.json"], "a100-40gb", model=OPT350,
               seq_length=2048, notes=notes)  # fmt: skip
    one = layer(p, "layer", 1)
    assert (one.forward_s, one.backward_s, one.seq_length, one.precision) == (0.002314, 0.005909, 2048, "fp32")
    assert (layer(p, "layer", 8, tp=4).forward_s, layer(p, "layer", 8, tp=4).backward_s) == (0.005634, 0.013383)
    emb, head = layer(p, "embedding", 1), layer(p, "logits", 1)
    assert (emb.forward_s, emb.backward_s) == (0.0004, 3e-06)
    assert (head.forward_s, head.backward_s) == (0.004508, 0.003989)  # row 25, the head + loss
    assert len(p.layers) == 36  # (mbs 1, 2, 4, 8) x (TP 1, 2, 4) x (embedding, layer, logits)
    assert any("precision fp32" in n for n in notes)
    llama = ingest([LAYERS / "sailor/profiles/LLAMA-3-8/GH-96/profile.json"], "h100-sxm", seq_length=8192,
                   model="llama2-7b", precision="bf16")  # fmt: skip
    lg = layer(llama, "logits", 1)  # RMSNorm row + head row
    assert lg.forward_s == pytest.approx(0.000369 + 0.016226) and lg.backward_s == pytest.approx(0.001078 + 0.0357)
    assert layer(llama, "layer", 1).forward_s == 0.048754 and layer(llama, "layer", 1).precision == "bf16"


@needs_ref
def test_aceso_op_csv_forward_sum_and_weight_gradient_backward():
    path = LAYERS / "aceso-in-sailor/A100-40/profiled-data-fp16/OPT-350_mbs1_tp1_algo0.csv"
    p = ingest([path], "a100-40gb", model=OPT350, seq_length=2048)
    whole = layer(p, "layer", 1)
    assert (whole.precision, whole.tp, whole.seq_length) == ("fp16", 1, 2048)  # fp16 folder, _mbs1_tp1 name
    assert whole.forward_s == pytest.approx(1893.051e-6, rel=1e-9)  # the 13 layer ops (README 8.B: 1.893 ms)
    dgrad = 2334.905e-6  # backward-compute of the 13 ops (README: 2.335 ms, input gradients only)
    wgrad = (230.670 + 93.627 + 83.357 + 93.371) * 1e-6  # forward of the qkv, dense, GEMM-1, GEMM-2 ops
    assert whole.backward_s == pytest.approx(dgrad + wgrad, rel=1e-9)
    attn, mlp = layer(p, "attention", 1), layer(p, "mlp", 1)
    assert attn.forward_s + mlp.forward_s == pytest.approx(whole.forward_s)
    assert {q.kind for q in p.layers} == {"layer", "attention", "mlp"}
    neo = ingest([LAYERS / "aceso-in-sailor/A100-40/profiled-data-fp16/GPT-Neo-2.7_mbs8_tp1_algo0.csv"], "a100-40gb",
                 model=OPT350, seq_length=2048)  # fmt: skip
    assert layer(neo, "layer", 8).forward_s == pytest.approx(25.289e-3, abs=1e-6)  # README 8.B


@needs_ref
def test_aceso_oom_sentinel_and_refused_derivatives():
    oom = LAYERS / "aceso-in-sailor/RTX-2080/profiled-data-fp16/GPT-Neo-2.7_mbs8_tp1_algo0.csv"
    err = error_of([oom], "a100-40gb", model=OPT350, seq_length=2048)
    assert "no layer or collective point" in err.message and "sentinel" in err.message
    err = error_of([LAYERS / "aceso-in-sailor/layer_time/A100-40.csv"], "a100-40gb")
    assert err.field.endswith("A100-40.csv:1") and "input-gradient" in err.message
    err = error_of([LAYERS / "aceso-in-sailor/A100-40/profiled-data-fp16/prim_OPT-350_all_reduce_2gpus.csv"], "l4")
    assert "nccl-tests" in err.message


@needs_ref
def test_galvatron_current_and_release_formats_with_memory():
    cfg = LAYERS / "galvatron/cea12ff/galvatron/models/gpt/configs"
    notes = []
    p = ingest([cfg / "computation_profiling_bf16_llama2-7b_all.json", cfg / "memory_profiling_bf16_llama2-7b_all.json"],
               "a100-80gb", model="llama2-7b", notes=notes)  # fmt: skip
    one, eight = layer(p, "layer", 1), layer(p, "layer", 8)
    assert (one.seq_length, one.tp, one.precision) == (2048, 1, "bf16")
    assert one.forward_s == pytest.approx(4.396252679824831e-3, rel=1e-9)  # ms per layer per sample
    assert one.backward_s == pytest.approx(2 * one.forward_s, rel=1e-9)  # forward only: 2 x forward
    assert eight.forward_s == pytest.approx(8 * 3.9369729995727534e-3, rel=1e-9)
    assert one.activation_bytes == pytest.approx(514.5634765625 * 2**20)  # layertype_0_sp, TP 1, per sample
    assert eight.activation_bytes == pytest.approx(8 * 514.5634765625 * 2**20)
    assert len(p.layers) == 12 and any("forward pass only" in n for n in notes)
    old = LAYERS / "galvatron/698e09a/galvatron/models/gpt/configs"
    shape = dict(hidden_size=4096, num_attention_heads=32, ffn_hidden_size=16384, mlp="gelu")
    q = ingest([old / "computation_profiling_bf16_hidden4096_head32_seqlen2048.json",
                old / "memory_profiling_bf16_hidden4096_head32_seqlen2048.json"], "a100-80gb", model=shape)  # fmt: skip
    (two,) = q.layers  # `layertype_0` per sample at the layernum keys' bsz 2; seq from the file name
    assert (two.micro_batch_size, two.seq_length) == (2, 2048)
    assert two.forward_s == pytest.approx(2 * 4.6243487675984705e-3, rel=1e-9)
    assert two.activation_bytes == pytest.approx(2 * 272.28173828125 * 2**20)
    err = error_of([old / "computation_profiling_bf16_hidden4096_head32_seqlen2048.json"], "a100-80gb",
                   model=dict(shape, hidden_size=2560, ffn_hidden_size=10240))  # fmt: skip
    assert "hidden_size 4096" in err.message


def test_galvatron_layertype_that_contradicts_its_layernum_keys(tmp_path):
    path = tmp_path / "computation_profiling_bf16_x.json"
    path.write_text('{\n "layernum[2]_bsz1_seq1024": 10.0,\n "layernum[4]_bsz1_seq1024": 14.0,\n'
                    ' "layertype_0_bsz1_seq1024": 3.0\n}\n')  # fmt: skip
    err = error_of([path], "a100-80gb", model="llama2-7b")
    assert err.field == f"{path}:4" and "(14 - 10) / (4 - 2) / 1 = 2" in err.message


@needs_ref
def test_metis_sample_splits_forward_and_backward():
    path = LAYERS / "sailor/baselines/Metis/profiles/OPT-350/GH-96/mbs1_tmp1.json"
    p = ingest([path], "h100-sxm", model=OPT350, seq_length=2048, precision="fp32")
    whole = layer(p, "layer", 1)  # median of the 24 layer entries: 3.91 ms forward + backward
    assert whole.forward_s == pytest.approx(3.91e-3 / 3) and whole.backward_s == pytest.approx(2 * 3.91e-3 / 3)
    assert layer(p, "embedding", 1).forward_s == pytest.approx(0.222e-3 / 3)
    assert layer(p, "logits", 1).forward_s == pytest.approx(4.177e-3 / 3)
    assert whole.tp == 1  # `mbs1_tmp1` in the file name
    err = error_of([path], "h100-sxm", model=OPT350, seq_length=2048)
    assert "--precision" in err.message


@needs_ref
def test_mist_op_files_make_up_a_layer():
    files = sorted((LAYERS / "mist/mist/node_database/cache_NVIDIA_L4").glob("*.json"))
    notes = []
    p = ingest(files, "l4", notes=notes)
    assert p.model == LayerShape(hidden_size=2048, num_attention_heads=16, ffn_hidden_size=8192, mlp="gelu",
                                 vocab_size=50304)  # fmt: skip
    one, eight = layer(p, "layer", 1), layer(p, "layer", 8)
    assert (one.seq_length, one.tp, one.precision) == (2048, 1, "fp16")
    assert one.forward_s == pytest.approx(5.782e-3, abs=1e-6) and one.backward_s == pytest.approx(10.822e-3, abs=1e-6)
    assert eight.forward_s == pytest.approx(36.993e-3, abs=1e-6)
    assert eight.backward_s == pytest.approx(77.677e-3, abs=1e-6)
    emb = layer(p, "embedding", 1)
    assert emb.forward_s == pytest.approx(0.00011151360049843787)  # the mean, as Mist reads it
    assert p.provenance.gpu == "NVIDIA L4"
    err = error_of(files, "l4", model=dict(hidden_size=4096, num_attention_heads=32, ffn_hidden_size=16384))
    assert "hidden_size 2048" in err.message
    err = error_of([files[0]], "l4")  # one op file is not a layer
    assert "no layer or collective point" in err.message


# --------------------------------------------------------------------------- detection, errors, merging


@needs_ref
def test_formats_are_recognised_by_content_not_name(tmp_path):
    cases = {
        SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt": "nccl-tests output",
        FIX / "nccl_allgather_2x4.json": "nccl-tests JSON",
        SAMPLES / "torch_trace_cpu.json": "torch.profiler trace",
        LAYERS / "sailor/profiles/OPT-350/A100-40/profile.json": "Sailor profile.json",
        LAYERS / "aceso-in-sailor/GH-96/profiled-data-fp32/OPT-30_mbs1_tp1_algo0.csv": "Aceso op profile",
        LAYERS / "galvatron/cea12ff/galvatron/models/gpt/configs/computation_profiling_bf16_llama2-7b_all.json":
            "Galvatron computation profile",
        LAYERS / "galvatron/698e09a/galvatron/models/gpt/configs/memory_profiling_bf16_hidden1600_head32_seqlen1024.json":
            "Galvatron memory profile",
        LAYERS / "sailor/baselines/Metis/profiles/OPT-350/A100-40/mbs1_tmp1.json": "Metis profile",
        LAYERS / "mist/mist/node_database/cache_NVIDIA_L4/torch.bmm.json": "Mist op database",
    }  # fmt: skip
    for i, (path, label) in enumerate(cases.items()):
        renamed = tmp_path / f"input{i}.dat"
        shutil.copyfile(path, renamed)
        assert detect_format(read_source(renamed)) == label, path
    renamed = tmp_path / "looks_like.csv"
    shutil.copyfile(SAMPLES / "nccl_allreduce_a100_1x8_oci.txt", renamed)
    assert coll(ingest([renamed], "a100-40gb"), "all_reduce", 10737418240).ranks == 8


def test_foreign_and_empty_files_name_file_and_line(tmp_path):
    csv = tmp_path / "data.csv"
    csv.write_text("name,value\nfoo,1\n")
    assert error_of([csv], "l4").field == f"{csv}:1"
    assert "unrecognised text" in error_of([csv], "l4").message
    js = tmp_path / "x.json"
    js.write_text('{"hello": [1, 2]}\n')
    assert "unrecognised JSON" in error_of([js], "l4").message
    log = tmp_path / "train.log"
    log.write_text(" iteration 10/100 | elapsed time per iteration (ms): 1234.5 | lm loss: 3.2\n")
    assert "Megatron-LM" in error_of([log], "l4").message
    prof = tmp_path / "profile.yaml"
    prof.write_text("schema_version: 1\ngpu: l4\n")
    assert "already a planner profile" in error_of([prof], "l4").message
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert error_of([empty], "l4").field == f"{empty}:1"
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"line one\n\xff\xfe\x00garbage")
    err = error_of([binary], "l4")
    assert err.field == f"{binary}:2" and "UTF-8" in err.message
    assert error_of([tmp_path / "missing.txt"], "l4").message.startswith("no such file")


def test_gpu_name_is_resolved_through_the_catalog():
    p = ingest([FIX / "nccl_allgather_2x4.json"], "H200")
    assert p.gpu == "h200"
    assert error_of([FIX / "nccl_allgather_2x4.json"], "A100").field == "--gpu"  # ambiguous: 40 or 80 GB


@needs_ref
def test_merging_files_keeps_the_median_of_conflicting_points_and_reports_them():
    notes = []
    p = ingest([SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt", FIX / "nccl_allreduce_h100_2x8_rerun.txt"],
               "h100-sxm", notes=notes)  # fmt: skip
    assert len(p.collectives) == 5  # the two files measured the same 16-rank / 2-node points
    gib = coll(p, "all_reduce", 2**30)
    assert gib.time_s == pytest.approx((4511.2e-6 + 4600e-6) / 2, rel=1e-12)
    assert coll(p, "all_reduce", 2**32).time_s == pytest.approx(0.017437, rel=1e-12)  # measured once: as is
    conflicts = [n for n in notes if "measurements differ" in n]
    assert len(conflicts) == 2 and "nccl_allreduce_h100_2x8_rerun.txt" in conflicts[0]
    assert p.provenance.tool == "nccl-tests; nccl-tests 2.19.6"
    assert p.provenance.files == (
        str(SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt"),
        str(FIX / "nccl_allreduce_h100_2x8_rerun.txt"),
    )
    # layer points of two tools at the same point: Sailor and its Metis-format copy (forward + backward 3.91 ms)
    notes = []
    q = ingest([LAYERS / "sailor/profiles/OPT-350/GH-96/profile.json",
                LAYERS / "sailor/baselines/Metis/profiles/OPT-350/GH-96/mbs1_tmp1.json"],
               "h100-sxm", model=OPT350, seq_length=2048, precision="fp32", notes=notes)  # fmt: skip
    merged = layer(q, "layer", 1)
    assert merged.forward_s == pytest.approx((0.001225 + 3.91e-3 / 3) / 2)
    assert any(n.startswith("layer mbs 1 seq 2048 tp 1 fp32: 2 measurements differ") for n in notes)


@needs_ref
def test_profile_validates_and_round_trips_through_yaml(tmp_path):
    p = ingest(
        [SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt", SAMPLES / "nccl_sendrecv_a100_1x8.txt",
         LAYERS / "sailor/profiles/OPT-350/GH-96/profile.json"],
        "h100-sxm", model=OPT350, seq_length=2048,
    )  # fmt: skip
    assert isinstance(p, Profile) and p.schema_version == 1 and p.model == OPT350
    entries = json.loads((LAYERS / "sailor/profiles/OPT-350/GH-96/profile.json").read_text())
    assert len(p.collectives) == 9 and len(p.layers) == 3 * sum(len(by_tp) for by_tp in entries.values())
    out = tmp_path / "profile.yaml"
    out.write_text(yaml.safe_dump(p.model_dump(mode="json"), sort_keys=False))
    assert load_profile(out) == p
    assert Profile.model_validate(json.loads(p.model_dump_json())) == p


@needs_ref
def test_device_names_that_do_not_fit_the_gpu_are_noted():
    notes = []
    ingest([SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt"], "a100-40gb", notes=notes)
    assert any("NVIDIA H100 80GB HBM3" in n and "check --gpu" in n for n in notes)
    notes = []
    ingest([SAMPLES / "nccl_allreduce_h100_2x8_roce_oci.txt"], "h100-sxm", notes=notes)
    assert not any("check --gpu" in n for n in notes)


def test_cli_ingest_writes_a_profile_a_job_can_name(tmp_path):
    """`planner profile ingest` end to end: the written file loads as a profile and prices the matching group."""
    import subprocess
    import sys

    src = tmp_path / "ar.txt"
    src.write_text((Path(__file__).parent / "fixtures" / "profiles" / "nccl_srun_label_old_layout.txt").read_text())
    out = tmp_path / "gpu.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "profile", "ingest", str(src), "--gpu", "h100-sxm", "-o", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from planner.load import load_profile

    profile = load_profile(out)
    assert profile.collectives and profile.gpu == "h100-sxm"
    bad = subprocess.run(
        [sys.executable, "-m", "planner", "profile", "ingest", str(tmp_path / "gpu.yaml"), "--gpu", "h100-sxm"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: ")
