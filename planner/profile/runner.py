"""Measuring one transformer layer of a job's model with PyTorch: the `planner profile run` back end.

``run_profile(job)`` builds ONE layer of the job's model as one tensor-parallel rank holds it (1/tp of the
attention heads and of the FFN width; kv-heads split, or replicated when tp is a multiple of them), in the job's
precision, on CUDA or (for tests and dry runs) the CPU, and times a training forward and backward pass of one
micro-batch at each measured point (micro-batch size x sequence length x TP degree): ``warmup`` passes, then the
median of ``repeats``. The result is a ``Profile`` (planner/profile/schema.py) whose points the cost model reads
in place of its analytic layer time (planner/profile/measured.py).

What is built (plain PyTorch, no fused kernels beyond what torch itself picks):
  - attention block: norm -> QKV projection -> rotary (SwiGLU models) -> causal ``scaled_dot_product_attention``
    with grouped kv-heads (or the materialised softmax when the job asks for eager attention) -> output
    projection -> residual add;
  - MLP block: norm -> GeLU MLP (h -> f/tp -> h) or SwiGLU (h -> 2f/tp -> f/tp -> h) -> residual add;
  - MoE block: norm -> router (replicated, softmax, top-k) -> tokens sorted by expert -> one GEMM pair per expert
    holding tokens (all experts on this GPU: measured points apply only without expert parallelism) -> weighted
    combine (index_add) -> shared experts as one dense MLP -> residual add.
The norm is RMSNorm for SwiGLU models and LayerNorm (with biased linears) for GeLU ones, the usual pairing
(Llama / GPT); dropout (p=0.1) only where the model says ``dropout: true``.

Not measured: the TP collectives (the cost model prices them from the links, as it does analytically), and
sequence parallelism (points are per TP degree; SP only moves where the norms run). A dense model gets whole-layer
points (kind ``layer``); an MoE model gets ``attention`` and ``moe`` points, plus ``mlp`` when some of its layers
are dense. On CUDA the peak memory of the pass above what was allocated before it (weights, gradients, input) is
recorded as ``activation_bytes``.

Timing: CUDA events around the forward and the backward (one synchronize per pass pair); ``time.perf_counter`` on
the CPU. Parameter gradients accumulate across passes, as in gradient accumulation. A point that runs out of GPU
memory is skipped (with the larger micro-batches of its sequence length and TP degree) and reported through
``warn``.
"""

from __future__ import annotations

import math
import platform
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from planner.errors import SpecError
from planner.spec import Job, ModelSpec

TOOL = "planner profile run"
INSTALL_HINT = "`planner profile run` needs PyTorch: pip install 'planner[profile]' (or the torch build for your GPU)"
PRECISIONS = ("bf16", "fp16", "fp32")
KIND_ORDER = ("layer", "attention", "mlp", "moe")
DROPOUT_P = 0.1

Progress = Callable[[int, int], None]


def import_torch():
    """torch, or a SpecError (one `error: torch: ...` line, exit 2) telling how to install it."""
    try:
        import torch
    except ImportError:
        raise SpecError("torch", INSTALL_HINT)
    return torch


def parse_ints(text: str, field: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4): positive integers, for the CLI's list options (``--micro-batches``)."""
    values = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise SpecError(field, f"expected comma-separated positive integers like 1,2,4; got {text!r}")
        if value < 1:
            raise SpecError(field, f"expected positive integers; got {value}")
        values.append(value)
    if not values:
        raise SpecError(field, f"expected comma-separated positive integers like 1,2,4; got {text!r}")
    return tuple(sorted(set(values)))


def default_tps(job: Job, group: int = 0) -> tuple[int, ...]:
    """The TP degrees the group's GPUs can use within a node that shard the model (heads, kv-heads, FFN widths)."""
    from planner.parallel import node_group_tp_options

    model = job.model
    options = node_group_tp_options(model, [job.cluster[group].gpus_per_node])
    return tuple(tp for tp in options if _tp_error(model, tp) is None)


def _tp_error(model: ModelSpec, tp: int) -> str | None:
    from planner.parallel import tp_ffn_error, tp_heads_error

    return tp_heads_error(model, tp) or tp_ffn_error(model, tp)


def measured_kinds(model: ModelSpec) -> tuple[str, ...]:
    """The layer kinds a profile of ``model`` needs (planner/profile/measured.py reads them)."""
    if model.moe is None:
        return ("layer",)
    kinds = ["attention", "moe"]
    if model.num_moe_layers < model.num_layers:
        kinds.insert(1, "mlp")
    return tuple(kinds)


def run_profile(
    job: Job,
    *,
    micro_batches: Iterable[int] = (1, 2, 4),
    seq_lengths: Iterable[int] | None = None,
    tps: Iterable[int] | None = None,
    device: str = "auto",
    warmup: int = 3,
    repeats: int = 10,
    progress: Progress | None = None,
    precision: str | None = None,
    group: int = 0,
    command: str | None = None,
    warn: Callable[[str], None] | None = None,
    threads: int | None = None,
):
    """Measure one layer of ``job.model`` at every (micro-batch, sequence length, TP degree) and return the Profile
    for the GPU type of node group ``group`` (module docstring).

    ``seq_lengths`` defaults to the job's, ``tps`` to ``default_tps(job, group)``; ``precision`` to the job's
    (bf16 or fp16; fp32 only when asked for: no job trains in it, so its points are never used). ``progress(done,
    total)`` is called after each point, ``warn(message)`` for each skipped point and for a CPU measurement.
    ``threads``: CPU threads torch may use while measuring (restored after; 1 keeps CPU timings steady on a
    shared machine)."""
    from planner.profile.measured import shape_of
    from planner.profile.schema import SCHEMA_VERSION, Profile, Provenance

    model = job.model
    if not 0 <= group < len(job.cluster):
        raise SpecError("--group", f"no node group {group}; the cluster has {len(job.cluster)}")
    if model.mlp not in ("gelu", "swiglu"):
        raise SpecError("model.mlp", f"a profile's layer shape is gelu or swiglu; got {model.mlp!r}")
    if model.mla is not None:
        raise SpecError("model.mla", "the layer runner builds multi-head attention; latent attention is not profiled")
    mbs = _positive(micro_batches, "--micro-batches")
    seqs = _positive(seq_lengths if seq_lengths is not None else (job.training.seq_length,), "--seq-lengths")
    tp_list = _positive(tps, "--tp") if tps is not None else default_tps(job, group)
    for tp in tp_list:
        why = _tp_error(model, tp)
        if why:
            raise SpecError("--tp", why)
    if not tp_list:
        raise SpecError("--tp", "no TP degree shards this model's heads and FFN within a node")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise SpecError("--warmup", f"expected an integer >= 0; got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SpecError("--repeats", f"expected an integer >= 1; got {repeats!r}")
    prec = precision or job.training.precision
    if prec not in PRECISIONS:
        raise SpecError(
            "--precision" if precision else "training.precision",
            f"{prec} layers cannot be measured with plain PyTorch (no fp8 training GEMMs); measure a bf16 copy "
            "of the job, whose points apply to bf16 jobs"
            if prec == "fp8"
            else f"expected one of {', '.join(PRECISIONS)}; got {prec!r}",
        )
    shape = shape_of(model)

    torch = import_torch()
    dev = _device(torch, device)
    cuda = dev.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[prec]
    gpu_name = job.cluster[group].gpu.name
    reported = torch.cuda.get_device_name(dev) if cuda else f"cpu ({platform.processor() or platform.machine()})"
    say = warn or (lambda _msg: None)
    if not cuda:
        say(f"measured on the CPU, not on {gpu_name}: these times are for tests and dry runs only")
    elif not _looks_like(gpu_name, reported):
        say(f"measuring on {reported}, but the profile is for {gpu_name} (the job's GPU)")

    grid = (mbs, seqs, tp_list)
    passes = (warmup, repeats)
    before = torch.get_num_threads()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise SpecError("--threads", f"expected a positive integer; got {threads!r}")
        torch.set_num_threads(threads)
    try:
        points = _measure_all(torch, job, grid, dev, dtype, prec, passes, progress, say)
    finally:
        torch.set_num_threads(before)
    if not points:
        raise SpecError("--micro-batches", f"no point could be measured on {reported} (out of memory everywhere)")
    provenance = Provenance(
        tool=TOOL,
        gpu=reported,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        command=command or _command(mbs, seqs, tp_list, device, prec, warmup, repeats),
        host=platform.node() or None,
        driver=_driver_version() if cuda else None,
        cuda=_cuda_version(torch) if cuda else None,
        torch=str(torch.__version__),
        nccl=_nccl_version(torch) if cuda else None,
    )
    return Profile(
        schema_version=SCHEMA_VERSION, gpu=gpu_name, provenance=provenance, model=shape, layers=tuple(points)
    )


def _measure_all(torch, job, grid, dev, dtype, prec, passes, progress, say) -> list:
    """Every point, sorted (kind, tp, seq, micro-batch); out-of-memory points skipped with a warning."""
    from planner.profile.schema import LayerPoint

    model = job.model
    mbs, seqs, tp_list = grid
    cuda = dev.type == "cuda"
    reported = torch.cuda.get_device_name(dev) if cuda else "the CPU"
    kinds = measured_kinds(model)
    flash = job.training.fused_attention
    total = len(tp_list) * len(seqs) * len(mbs) * len(kinds)
    done = 0
    points: list[LayerPoint] = []
    for tp in tp_list:
        try:
            blocks = _blocks(torch, model, tp, kinds, flash, dev, dtype)
        except torch.cuda.OutOfMemoryError:
            _free(torch, cuda)
            say(f"tp {tp}: the layer's weights do not fit on {reported}; skipped")
            done += len(seqs) * len(mbs) * len(kinds)
            _tick(progress, done, total)
            continue
        for seq in seqs:
            for block in blocks.values():
                block.prepare(seq)
            out_of_memory = False
            for mb in mbs:
                for kind in kinds:
                    done += 1
                    if out_of_memory:
                        _tick(progress, done, total)
                        continue
                    try:
                        fwd, bwd, act = _measure(torch, blocks, kind, (mb, seq, model.hidden_size), dev, dtype, passes)
                    except torch.cuda.OutOfMemoryError:
                        _free(torch, cuda)
                        out_of_memory = True
                        say(f"tp {tp}, seq {seq}: micro-batch {mb} and larger ran out of memory; skipped")
                        continue
                    finally:
                        _tick(progress, done, total)
                    points.append(
                        LayerPoint(
                            kind=kind,
                            micro_batch_size=mb,
                            seq_length=seq,
                            tp=tp,
                            precision=prec,
                            forward_s=max(fwd, 1e-9),
                            backward_s=max(bwd, 0.0),
                            activation_bytes=act,
                        )
                    )
        del blocks
        _free(torch, cuda)
    points.sort(key=lambda p: (KIND_ORDER.index(p.kind), p.tp, p.seq_length, p.micro_batch_size))
    return points


def profile_yaml(profile) -> str:
    """The profile as the YAML file `load_profile` reads back (planner/load.py)."""
    import yaml

    data = profile.model_dump(mode="json", exclude_none=True)
    header = "# Measured by `planner profile run` (docs/profiles.md); seconds per micro-batch, one layer, one GPU.\n"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_profile(profile, path: str | Path) -> Path:
    from planner.io import write_atomic

    write_atomic(path, profile_yaml(profile))
    return Path(path)


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _positive(values: Iterable[int], field: str) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(field, f"expected positive integers; got {v!r}")
        out.append(v)
    if not out:
        raise SpecError(field, "expected at least one value")
    return tuple(sorted(set(out)))


def _tick(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def _device(torch, device: str):
    name = (device or "auto").strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not name.startswith("cuda"):
        raise SpecError("--device", f"expected cpu, cuda or cuda:N; got {device!r}")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SpecError("--device", f"expected cpu, cuda or cuda:N; got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecError("--device", "CUDA is not available to this PyTorch build or machine (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SpecError("--device", f"no {name}: {torch.cuda.device_count()} CUDA device(s) visible")
    return dev


def _looks_like(catalog_name: str, reported: str) -> bool:
    """The device's reported name mentions the catalog GPU's family (``h100`` of h100-sxm in NVIDIA H100 ...)."""
    family = catalog_name.lower().split("-")[0]
    return family in reported.lower().replace(" ", "")


def _free(torch, cuda: bool) -> None:
    if cuda:
        torch.cuda.empty_cache()


def _command(mbs, seqs, tps, device, prec, warmup, repeats) -> str:
    args = ["planner", "profile", "run", "--micro-batches", ",".join(map(str, mbs))]
    args += ["--seq-lengths", ",".join(map(str, seqs)), "--tp", ",".join(map(str, tps)), "--device", device]
    args += ["--precision", prec, "--warmup", str(warmup), "--repeats", str(repeats)]
    return shlex.join(args)


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()
    return first[0].strip() if first else None


def _cuda_version(torch) -> str | None:
    if torch.version.cuda:
        return str(torch.version.cuda)
    hip = getattr(torch.version, "hip", None)  # ROCm builds answer to torch.cuda too
    return f"hip {hip}" if hip else None


def _nccl_version(torch) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # no NCCL in this build
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _measure(torch, blocks, kind, size, dev, dtype, passes):
    """(forward s, backward s, peak activation bytes or None) of ``kind`` at one micro-batch: medians of
    ``repeats`` passes after ``warmup``. A whole layer is the attention block followed by the MLP block."""
    mb, seq, hidden = size
    warmup, repeats = passes
    parts = [blocks["attention"], blocks["mlp"]] if kind == "layer" else [blocks[kind]]
    cuda = dev.type == "cuda"
    x = torch.randn(mb, seq, hidden, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn(mb, seq, hidden, device=dev, dtype=dtype)
    fwd, bwd = [], []
    peak = None
    label = f"planner.{kind}.mb{mb}.seq{seq}"
    for i in range(warmup + repeats):
        if cuda and i == warmup:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        if cuda:
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
        else:
            t0 = time.perf_counter()
        with torch.profiler.record_function(label + ".forward"):
            y = x
            for part in parts:
                y = part(y)
        if cuda:
            mid.record()
        else:
            t1 = time.perf_counter()
        with torch.profiler.record_function(label + ".backward"):
            y.backward(grad)
        if cuda:
            end.record()
            torch.cuda.synchronize(dev)
            f, b = start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3
        else:
            t2 = time.perf_counter()
            f, b = t1 - t0, t2 - t1
        del y
        x.grad = None
        if i >= warmup:
            fwd.append(f)
            bwd.append(b)
    if cuda:
        peak = float(max(0, torch.cuda.max_memory_allocated(dev) - base))
    return statistics.median(fwd), statistics.median(bwd), peak


def _blocks(torch, model: ModelSpec, tp: int, kinds, flash: bool, dev, dtype) -> dict:
    """The blocks the kinds need, as one TP rank of ``tp`` holds them, on ``dev`` in ``dtype``."""
    nn, F = torch.nn, torch.nn.functional
    h, d = model.hidden_size, model.dim_head
    heads = model.num_attention_heads // tp
    kv = model.kv_heads // tp if model.kv_heads % tp == 0 else 1  # replicated when tp is a multiple of kv-heads
    swiglu = model.mlp == "swiglu"
    bias = not swiglu  # GPT-style GeLU layers carry biases, Llama-style SwiGLU ones do not
    drop = DROPOUT_P if model.dropout else 0.0
    kw = {"device": dev, "dtype": dtype}

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h, **kw))
            self.bias = None if swiglu else nn.Parameter(torch.zeros(h, **kw))

        def forward(self, x):
            if swiglu:
                if hasattr(F, "rms_norm"):
                    return F.rms_norm(x, (h,), self.weight, 1e-5)
                return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * self.weight
            return F.layer_norm(x, (h,), self.weight, self.bias, 1e-5)

    class Block(nn.Module):
        def prepare(self, seq: int) -> None:
            pass

    class Attention(Block):
        def __init__(self):
            super().__init__()
            self.norm = Norm()
            self.qkv = nn.Linear(h, (heads + 2 * kv) * d, bias=bias, **kw)
            self.out = nn.Linear(heads * d, h, bias=bias, **kw)
            self.rope = None

        def prepare(self, seq: int) -> None:
            if not swiglu or d % 2:
                return
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
            ang = torch.outer(torch.arange(seq, device=dev, dtype=torch.float32), inv)
            ang = torch.cat([ang, ang], dim=-1)
            self.rope = (ang.cos().to(dtype), ang.sin().to(dtype))

        def _rotate(self, t):
            cos, sin = self.rope
            half = t.shape[-1] // 2
            rot = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
            return t * cos + rot * sin

        def forward(self, x):
            b, s, _ = x.shape
            qkv = self.qkv(self.norm(x))
            q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
            q = q.view(b, s, heads, d).transpose(1, 2)
            k = k.view(b, s, kv, d).transpose(1, 2)
            v = v.view(b, s, kv, d).transpose(1, 2)
            if self.rope is not None:
                q, k = self._rotate(q), self._rotate(k)
            o = _attend(torch, q, k, v, flash, drop)
            o = self.out(o.transpose(1, 2).reshape(b, s, heads * d))
            return x + (F.dropout(o, drop) if drop else o)

    def act(a):
        if swiglu:
            gate, up = a.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(a)

    class Mlp(Block):
        def __init__(self, width: int):
            super().__init__()
            self.norm = Norm()
            self.fc1 = nn.Linear(h, (2 if swiglu else 1) * width, bias=bias, **kw)
            self.fc2 = nn.Linear(width, h, bias=bias, **kw)

        def ffn(self, x):
            return self.fc2(act(self.fc1(x)))

        def forward(self, x):
            o = self.ffn(self.norm(x))
            return x + (F.dropout(o, drop) if drop else o)

    class Moe(Block):
        def __init__(self):
            super().__init__()
            m = model.moe
            self.experts, self.top_k = m.num_experts, m.top_k
            width = m.expert_ffn_hidden_size // tp
            self.norm = Norm()
            self.router = nn.Linear(h, m.num_experts, bias=False, **kw)  # replicated on every TP rank
            # one weight pair per expert (Megatron's SequentialMLP): indexing one stacked tensor would make every
            # expert's backward allocate a gradient the size of all experts
            self.w1 = nn.ParameterList(
                nn.Parameter(torch.randn(h, (2 if swiglu else 1) * width, **kw) / math.sqrt(h))
                for _ in range(m.num_experts)
            )
            self.w2 = nn.ParameterList(
                nn.Parameter(torch.randn(width, h, **kw) / math.sqrt(width)) for _ in range(m.num_experts)
            )
            self.shared = Mlp(width * m.shared_experts) if m.shared_experts else None

        def forward(self, x):
            b, s, _ = x.shape
            t = self.norm(x).reshape(b * s, h)
            probs = torch.softmax(self.router(t).float(), dim=-1)
            weight, chosen = probs.topk(self.top_k, dim=-1)
            weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
            flat = chosen.reshape(-1)
            order = flat.argsort()
            token = order // self.top_k
            counts = torch.bincount(flat, minlength=self.experts).tolist()
            routed = t[token]
            outs, start = [], 0
            for e, n in enumerate(counts):
                if n:
                    outs.append(act(routed[start : start + n] @ self.w1[e]) @ self.w2[e])
                start += n
            y = torch.cat(outs) * weight.reshape(-1)[order].unsqueeze(-1)
            o = torch.zeros_like(t).index_add(0, token, y)
            if self.shared is not None:
                o = o + self.shared.ffn(t)
            o = o.view(b, s, h)
            return x + (F.dropout(o, drop) if drop else o)

    blocks = {"attention": Attention()}
    if "layer" in kinds or "mlp" in kinds:
        blocks["mlp"] = Mlp(model.ffn_hidden_size // tp)
    if "moe" in kinds:
        blocks["moe"] = Moe()
    for block in blocks.values():
        block.train()
    return blocks


_GQA: dict[str, bool] = {}


def _attend(torch, q, k, v, flash: bool, drop: float):
    """Causal attention of q (b, heads, s, d) over k, v (b, kv, s, d): SDPA (flash/memory-efficient kernels where
    torch has them), or the materialised softmax for eager attention."""
    F = torch.nn.functional
    heads, kv = q.shape[1], k.shape[1]
    if not flash:
        if heads != kv:
            k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        s = q.shape[2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return (F.dropout(p, drop) if drop else p) @ v
    if heads != kv:
        if _GQA.get("ok", True):
            try:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True, enable_gqa=True)
            except TypeError:  # torch < 2.5: no grouped kv-heads in SDPA
                _GQA["ok"] = False
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
