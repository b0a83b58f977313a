"""What every format reader shares: the file being read, the rows a reader hands back, and error helpers.

A reader turns one file into a ``Parsed``: collective points (complete: nccl-tests states everything a
CollectivePoint needs) and layer rows whose micro-batch size, sequence length, TP degree or precision may be
missing where the file does not state them (planner/profile/ingest/__init__.py fills them from the caller's values
or refuses). Every row keeps the file and line it came from, so that a bad value is reported there.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import SpecError

# nccl-tests binary -> CollectivePoint.op (schema COLLECTIVES); other tests have no place in a profile
NCCL_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
}
NCCL_TEST = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")

# busbw = algbw x factor(n) (nccl-tests doc/PERFORMANCE.md): used to check a file's rank count
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}

PRECISIONS = ("bf16", "fp16", "fp8", "fp32")


@dataclass
class Source:
    """One input file: its name as given (for messages), its decoded text and, for JSON, the parsed document."""

    name: str
    path: Path
    text: str
    data: Any = None  # the JSON document, when the text is JSON

    def where(self, line: int | None = 1) -> str:
        return f"{self.name}:{line or 1}"

    def fail(self, line: int | None, message: str) -> SpecError:
        return SpecError(self.where(line), message)

    def line_of(self, needle: str, start_line: int = 1) -> int:
        """The 1-based line of the first ``needle`` at or after ``start_line`` (1 when absent): where a JSON value
        sits, for messages about it."""
        offset = 0
        for _ in range(start_line - 1):
            nxt = self.text.find("\n", offset)
            if nxt < 0:
                break
            offset = nxt + 1
        at = self.text.find(needle, offset)
        return 1 if at < 0 else self.text.count("\n", 0, at) + 1

    def lines_of(self, pattern: str, after: str | None = None) -> list[int]:
        """The 1-based lines of every match of the regex ``pattern`` (after the first ``after``, when given): the
        lines of a JSON list's entries, in order."""
        start = 0
        if after is not None:
            found = self.text.find(after)
            start = found if found >= 0 else 0
        out, line, pos = [], self.text.count("\n", 0, start) + 1, start
        for m in re.finditer(pattern, self.text[start:]):
            line += self.text.count("\n", pos, start + m.start())
            pos = start + m.start()
            out.append(line)
        return out


@dataclass
class LayerRow:
    """A layer measurement before the caller's values fill what the file does not state (None)."""

    kind: str
    forward_s: float
    backward_s: float
    source: Source
    line: int
    micro_batch_size: int | None = None
    seq_length: int | None = None
    tp: int | None = None
    precision: str | None = None
    precision_default: str | None = None  # what the format implies when neither the file nor the caller says
    per_sample: bool = False  # the times are per sample: multiplied by the micro-batch size once it is known
    activation_bytes: float | None = None
    shape: dict[str, Any] = field(default_factory=dict)  # model dims the file states (checked against the model)


@dataclass
class CollectiveRow:
    op: str
    bytes: float
    ranks: int
    nodes: int
    time_s: float
    busbw_gbps: float | None
    source: Source
    line: int


@dataclass
class ActivationHint:
    """Activation memory per sample of one layer at (seq, tp) (Galvatron memory profiles): attached to the layer
    points measured at the same sequence length, TP degree and precision."""

    per_sample_bytes: float
    seq_length: int | None
    tp: int
    precision: str | None
    source: Source
    line: int


@dataclass
class Parsed:
    tool: str
    layers: list[LayerRow] = field(default_factory=list)
    collectives: list[CollectiveRow] = field(default_factory=list)
    activations: list[ActivationHint] = field(default_factory=list)
    ops: list[Any] = field(default_factory=list)  # per-op records combined across files (Mist)
    provenance: dict[str, list[str]] = field(default_factory=dict)  # Provenance field -> values stated
    notes: list[str] = field(default_factory=list)

    def state(self, key: str, value: Any) -> None:
        """Record a provenance value the file states (kept once, in order)."""
        if value is None:
            return
        text = " ".join(str(value).split())
        if text and text not in self.provenance.setdefault(key, []):
            self.provenance[key].append(text)


@dataclass(frozen=True)
class Given:
    """What the caller supplies for the values a file may not state."""

    micro_batch_size: int | None = None
    seq_length: int | None = None
    tp: int | None = None
    precision: str | None = None
    backward_ratio: float = 2.0
    layer_pattern: re.Pattern | None = None


def number(text: str) -> float | None:
    """A float from a table cell (nccl-tests prints 69338, 1.2e+05, N/A); None when it is not a finite number."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def integer(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[+-]?\d+", text or "") else None


def clean(seconds: float) -> float:
    """Seconds rounded to 12 significant digits: 4511.2 us / 1e6 is 0.0045112, not 0.004511199999999999."""
    return float(f"{seconds:.12g}")


def median(values) -> float:
    return float(statistics.median(values))


def nccl_version(code: int | str | None) -> str | None:
    """NCCL_VERSION_CODE (22605, or 2603 before 2.9) as 2.26.5."""
    value = integer(str(code)) if code is not None else None
    if value is None or value <= 0:
        return None
    if value >= 10000:
        return f"{value // 10000}.{value // 100 % 100}.{value % 100}"
    return f"{value // 1000}.{value // 100 % 10}.{value % 100}"


def precision_token(text: str) -> str | None:
    """bf16/fp16/fp32/fp8 named as a word in a file name or path (Aceso `profiled-data-fp16`, Galvatron
    `computation_profiling_bf16_...`)."""
    found = {m.group(1).lower() for m in re.finditer(r"(?<![a-z0-9])(bf16|fp16|fp32|fp8)(?![a-z0-9])", text.lower())}
    return found.pop() if len(found) == 1 else None


def check_bandwidth(source: Source, line: int, op: str, size: float, time_us: float, algbw, busbw, ranks) -> None:
    """Refuse a row whose numbers contradict each other: algbw = size / time, busbw = algbw x factor(ranks).
    Printed values are rounded (2 decimals, or 3-4 significant digits), so rows under 1 GB/s are not checked."""
    if algbw is None or algbw < 1.0 or time_us <= 0:
        return
    expect = size / time_us / 1e3
    if abs(algbw - expect) > 0.02 * expect + 0.01:
        raise source.fail(
            line, f"algbw {algbw:g} GB/s does not match size / time = {size:g} B / {time_us:g} us = {expect:.4g} GB/s"
        )
    if busbw is None or ranks is None or ranks < 2:
        return
    factor = BUSBW_FACTOR[op](ranks)
    if abs(busbw - algbw * factor) > 0.02 * algbw * factor + 0.01:
        implied = ranks_from_factor(op, busbw / algbw)
        said = f" (that ratio means {implied} ranks)" if implied else ""
        raise source.fail(
            line,
            f"busbw/algbw = {busbw / algbw:.4f}{said}, but {ranks} ranks give {factor:.4f} for {op}: the rank count "
            "does not fit this table",
        )


def ranks_from_factor(op: str, ratio: float) -> int | None:
    """The rank count whose busbw factor is ``ratio`` (None when the factor does not depend on it, or fits none)."""
    if op == "send_recv":
        return None
    scale = 2.0 if op == "all_reduce" else 1.0  # factor = scale * (n - 1) / n
    if ratio >= scale - 1e-9 or ratio <= 0:
        return None
    n = scale / (scale - ratio)
    best = round(n)
    return best if best >= 2 and abs(BUSBW_FACTOR[op](best) - ratio) <= 0.005 * ratio else None
