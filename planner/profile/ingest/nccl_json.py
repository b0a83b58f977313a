"""nccl-tests ``-J file.json`` output (src/util.cu, JSON_FILE_VERSION 1-3; shared/reference/profiling.md 2.2).

Top level ``version``, ``start_time``, ``args`` (argv), ``nccl_version`` (NCCL_VERSION_CODE, 22605 = 2.26.5),
``config`` {``nthreads``, ``ngpus``, ..., ``devices``: [{``rank``, ``group``, ``hostname``, ``device_info``...}]},
``results``: [{``size``, ``count``, ``type``, ``redop``, ``root`` (a string), ``out_of_place``: {``time`` or
``cpu_time`` (us), ``alg_bw``, ``bus_bw``, ``nwrong``}, ``in_place``: {...}}]. One CollectivePoint per result, as
for the text output: ``bytes`` = ``size``, ``time_s`` = out-of-place time / 1e6, ``busbw_gbps`` = its ``bus_bw``.
The operation is the ``<name>_perf`` binary in ``args``.

Ranks: with MPI the writer keeps one ``devices`` entry per process (the first GPU line of each), so a collective
has (entries) x ``nthreads`` x ``ngpus`` ranks; a list whose ranks run 0, 1, 2, ... already names every rank.
Entries are grouped by ``group`` (NCCL_TESTS_SPLIT); ``nodes`` = distinct host names in a group.
"""

from __future__ import annotations

from planner.profile.ingest._common import (
    NCCL_OPS,
    NCCL_TEST,
    CollectiveRow,
    Parsed,
    Source,
    check_bandwidth,
    clean,
    nccl_version,
)


def detect(data) -> bool:
    return isinstance(data, dict) and isinstance(data.get("results"), list) and isinstance(data.get("config"), dict)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def parse(src: Source, given) -> Parsed:
    data = src.data
    out = Parsed(tool="nccl-tests")
    args = data.get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise src.fail(src.line_of('"args"'), "`args` must be the list of the command's arguments")
    command = " ".join(args)
    binary = next((NCCL_TEST.search(a) for a in args if NCCL_TEST.search(a)), None)
    if binary is None:
        raise src.fail(src.line_of('"args"'), "no *_perf binary in `args`: cannot tell which collective was measured")
    op = NCCL_OPS.get(binary.group(1))
    out.state("command", command)
    start = data.get("start_time")
    out.state("date", start.replace(" ", "T", 1) if isinstance(start, str) else None)  # "%Y-%m-%d %H:%M:%S"
    out.state("nccl", nccl_version(data.get("nccl_version")))
    if op is None:
        out.notes.append(f"{src.name}: {binary.group(0)} skipped (not a collective a profile holds)")
        return out
    ranks, nodes = _placement(src, data["config"], out)
    lines = src.lines_of(r'"size"\s*:', after='"results"')
    for i, row in enumerate(data["results"]):
        line = lines[i] if i < len(lines) else src.line_of('"results"')
        if not isinstance(row, dict):
            raise src.fail(line, f"results[{i}] is not an object")
        size = _int(row.get("size"))
        if size is None or size < 0:
            raise src.fail(line, f"results[{i}].size must be a byte count, got {row.get('size')!r}")
        oop = row.get("out_of_place")
        if oop is None:
            out.notes.append(f"{src.name}: results[{i}] has no out-of-place measurement; skipped")
            continue
        if not isinstance(oop, dict):
            raise src.fail(line, f"results[{i}].out_of_place is not an object")
        time_us = _num(oop.get("time", oop.get("cpu_time")))
        if time_us is None or time_us <= 0:
            raise src.fail(line, f"results[{i}].out_of_place.time must be a positive number of microseconds")
        if size == 0:
            continue
        algbw, busbw = _num(oop.get("alg_bw")), _num(oop.get("bus_bw"))
        check_bandwidth(src, line, op, size, time_us, algbw, busbw, ranks)
        out.collectives.append(CollectiveRow(op, size, ranks, nodes, clean(time_us / 1e6), busbw, src, line))
    if not out.collectives:
        raise src.fail(src.line_of('"results"'), "no result rows (truncated or interrupted run?)")
    return out


def _placement(src: Source, config: dict, out: Parsed) -> tuple[int, int]:
    line = src.line_of('"devices"')
    devices = config.get("devices")
    per_proc = (_int(config.get("nthreads")) or 1) * (_int(config.get("ngpus")) or 1)
    if not isinstance(devices, list) or not devices or not all(isinstance(d, dict) for d in devices):
        raise src.fail(line, "config.devices must list the ranks' devices")
    ranks_listed = [_int(d.get("rank")) for d in devices]
    if any(r is None for r in ranks_listed):
        raise src.fail(line, "a config.devices entry has no integer `rank`")
    every = ranks_listed == list(range(len(devices))) and len(devices) > 1
    groups: dict[int, list[dict]] = {}
    for dev in devices:
        groups.setdefault(_int(dev.get("group")) or 0, []).append(dev)
        out.state("host", dev.get("hostname"))
        out.state("gpu", dev.get("device_info"))
    sizes = {len(g) for g in groups.values()}
    if len(sizes) > 1:
        raise src.fail(line, f"the device groups differ in size ({sorted(sizes)}): one rank count per run")
    ranks = sizes.pop() * (1 if every else per_proc)
    nodes = max(len({d.get("hostname") for d in g}) for g in groups.values())
    if ranks < 2:
        raise src.fail(line, f"{ranks} rank: a collective over one GPU measures no communication")
    if len(groups) > 1:
        out.notes.append(f"{src.name}: {len(groups)} groups of {ranks} ranks (NCCL_TESTS_SPLIT); one group's time")
    return ranks, min(nodes, ranks)
