"""nccl-tests / rccl-tests text output (shared/reference/profiling.md section 2.1): one CollectivePoint per row.

Read per row (never the ``# Avg bus bandwidth`` line, a mean over all sizes): ``bytes`` = the size column (the
total buffer for all_gather, reduce_scatter and alltoall, as nccl-tests counts it), ``time_s`` = the out-of-place
time (us) / 1e6, ``busbw_gbps`` = the out-of-place busbw. The operation comes from the
``# Collective test starting: <name>_perf`` line (nccl-tests >= 2.17) or from the ``<name>_perf`` command line
before the table; ``ranks`` = the ``#  Rank ...`` device lines (per ``Group`` when NCCL_TESTS_SPLIT made several),
``nodes`` = their distinct host names. Without device lines (a table pasted alone) the ranks are
threads x GPUs per thread x processes from the ``# nThread`` line and the command line (``-t``, ``-g``,
``mpirun -n`` / ``srun -n``; no launcher = 1 process on 1 node), else from the busbw/algbw ratio.

Layouts accepted: the new header (``# nccl-tests version``, ``# Collective test starting/concluded``), the older
one (no ``root`` column, a float ``error`` column), the oldest (``bytes N type op time algbw busbw res``); columns
are found by the header's names, so ``-I 1`` and ``-S 1`` extras do not shift them. Prefixes of ``srun --label``
(``0: ``) and Open MPI ``--tag-output`` (``[1,0]<stdout>:``) are stripped (each label is read as its own stream);
NCCL INFO lines and shell prompts around the output are skipped; several test blocks may follow each other.
Each row is checked: algbw = size / time, and busbw / algbw = the operation's factor at that many ranks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from planner.profile.ingest._common import (
    NCCL_OPS,
    NCCL_TEST,
    CollectiveRow,
    Parsed,
    Source,
    check_bandwidth,
    clean,
    integer,
    nccl_version,
    number,
    ranks_from_factor,
)

LABEL = re.compile(r"^(\s*\d+:\s?|\[\d+,\d+\]<\w+>:\s?)")
DEVICE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
VERSION = re.compile(r"^#\s*(nccl|rccl)-tests\s+version\s+(\S+)(?:.*?nccl-library=(\d+))?", re.I)
STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
CONCLUDED = re.compile(r"^#\s*Collective test concluded")
NTHREAD = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
NCCL_INFO_VERSION = re.compile(r"NCCL INFO (?:NCCL|RCCL) version\s+(\d+\.\d+\.\d+)")
LAUNCHER = re.compile(r"(?:^|[\s/])(mpirun|mpiexec|orterun|srun|prun|aprun|jsrun)\b")
MARKER = re.compile(
    r"^(?:\s*\d+:\s?|\[\d+,\d+\]<\w+>:\s?)?\s*#\s*(?:Collective test starting:|nThread\s+\d+\s+nGpus\s+\d+|"
    r"(?:nccl|rccl)-tests\s+version|Using devices|size\s+count\s+type\b|.*\balgbw\b.*\bbusbw\b)",
    re.M | re.I,
)


def detect(text: str) -> bool:
    """nccl-tests output: one of its header lines, after any launcher label (anywhere: NCCL_DEBUG=INFO may print
    thousands of lines first)."""
    return MARKER.search(text) is not None


@dataclass
class _Block:
    command: str | None = None
    command_line: int | None = None
    test: str | None = None
    version: str | None = None
    nthreads: int | None = None
    ngpus: int | None = None
    devices: list[tuple[int, int, str, str, int]] = field(default_factory=list)  # rank, group, host, name, line
    columns: list[str] | None = None
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    concluded: bool = False
    first_line: int | None = None

    def started(self) -> bool:
        return bool(self.rows or self.nthreads is not None or self.devices or self.test or self.concluded)


def parse(src: Source, given) -> Parsed:
    streams: dict[str, list[tuple[int, str]]] = {}
    for number_, raw in enumerate(src.text.splitlines(), start=1):
        m = LABEL.match(raw)
        label = m.group(1).strip() if m else ""
        streams.setdefault(label, []).append((number_, raw[m.end() :] if m else raw))
    out = Parsed(tool="nccl-tests")
    rccl = "rccl" in src.text.lower()
    blocks: list[_Block] = []
    for lines in streams.values():
        blocks.extend(_blocks(lines, out))
    # a shell command before labelled output (`$ srun --label ... all_reduce_perf`) is not labelled itself
    commands = [(b.command_line, b.command) for b in blocks if b.command and not b.rows and not b.test]
    blocks = [b for b in blocks if b.rows or b.test]
    versions = []
    for block in blocks:
        if block.command is None:
            before = [c for at, c in commands if at < (block.first_line or 0)]
            block.command = before[-1] if before else None
        if block.version:
            versions.append(block.version)
        _read_block(src, block, out)
    tool = "rccl-tests" if rccl else "nccl-tests"
    out.tool = f"{tool} {versions[0]}" if versions else tool
    if not out.collectives and not any(b.rows for b in blocks):
        raise src.fail(len(src.text.splitlines()) or 1, "nccl-tests output without any result row (truncated?)")
    return out


def _blocks(lines: list[tuple[int, str]], out: Parsed) -> list[_Block]:
    blocks = [_Block()]
    for at, raw in lines:
        line = raw.strip()
        block = blocks[-1]
        if not line:
            continue
        if block.first_line is None:
            block.first_line = at
        if "NCCL INFO" in line or "NCCL WARN" in line or "RCCL INFO" in line:
            m = NCCL_INFO_VERSION.search(line)
            if m:
                out.state("nccl", m.group(1))
            continue
        if line.startswith("#"):
            m = VERSION.match(line)
            if m:
                if block.started() or block.version:
                    blocks.append(block := _Block(first_line=at))
                block.version = m.group(2)
                out.state("nccl", nccl_version(m.group(3)))
                continue
            m = STARTING.match(line)
            if m:
                if block.started():
                    blocks.append(block := _Block(first_line=at))
                block.test = m.group(1)
                continue
            if CONCLUDED.match(line):
                block.concluded = True
                blocks.append(_Block())
                continue
            m = NTHREAD.match(line)
            if m:
                if block.rows or block.nthreads is not None:
                    blocks.append(block := _Block(first_line=at))
                block.nthreads, block.ngpus = int(m.group(1)), int(m.group(2))
                continue
            m = DEVICE.match(line)
            if m:
                if block.rows:
                    blocks.append(block := _Block(first_line=at))
                rank, group, host, name = int(m.group(1)), int(m.group(2) or 0), m.group(4), m.group(7)
                block.devices.append((rank, group, host, name, at))
                continue
            tokens = line[1:].split()
            if ("size" in tokens or "bytes" in tokens) and "busbw" in tokens and "algbw" in tokens:
                if block.rows:
                    blocks.append(block := _Block(first_line=at))
                block.columns = tokens
            continue
        tokens = line.split()
        if len(tokens) >= 2 and integer(tokens[0]) is not None and integer(tokens[1]) is not None:
            block.rows.append((at, tokens))
            continue
        m = NCCL_TEST.search(line)
        if m and m.group(1) != "nccl":
            if block.started() or block.command:
                blocks.append(block := _Block(first_line=at))
            block.command = _command(line, m.start())
            block.command_line = at
    return [b for b in blocks if b.rows or b.test or b.command]


def _command(line: str, binary_at: int) -> str:
    """The command line without a shell prompt (``$ ``, ``user@host:~$ ``) before it."""
    prompt = max(line.rfind("$ ", 0, binary_at), line.rfind("# ", 0, binary_at), line.rfind("> ", 0, binary_at))
    launcher = LAUNCHER.search(line)
    start = launcher.start(1) if launcher and launcher.start(1) < binary_at else binary_at
    if prompt >= 0 and prompt + 2 <= start:
        return line[prompt + 2 :].strip()
    return line.strip()


def _read_block(src: Source, block: _Block, out: Parsed) -> None:
    if not block.rows:
        if block.test:
            out.notes.append(f"{src.name}: the {block.test} test has no result rows")
        return
    first = block.rows[0][0]
    name = block.test or (NCCL_TEST.search(block.command).group(0) if block.command else None)
    if name is None:
        raise src.fail(
            first,
            "cannot tell which collective this table measures: no `# Collective test starting` line and no "
            "*_perf command line before it",
        )
    base = NCCL_TEST.search(name)
    op = NCCL_OPS.get(base.group(1)) if base else None
    if op is None:
        out.notes.append(
            f"{src.name}:{first}: {name} skipped (a profile holds all_reduce, all_gather, reduce_scatter, alltoall "
            "and sendrecv)"
        )
        return
    if block.command:
        out.state("command", block.command)
    ranks, nodes = _placement(src, block, op, out)
    size_i, time_i, alg_i, bus_i, wrong_i, width = _columns(src, block)
    wrong_rows = []
    for at, tokens in block.rows:
        if len(tokens) < width:
            raise src.fail(at, f"truncated row: {len(tokens)} of {width} columns")
        size, time_us = number(tokens[size_i]), number(tokens[time_i])
        algbw, busbw = number(tokens[alg_i]), number(tokens[bus_i])
        for label, value, text in (("size", size, tokens[size_i]), ("time", time_us, tokens[time_i])):
            if value is None:
                raise src.fail(at, f"{label} '{text}' is not a number")
        if size <= 0:
            continue  # a 0-byte row measures launch overhead only
        if time_us <= 0:
            raise src.fail(at, f"time {tokens[time_i]} us: expected a positive time")
        check_bandwidth(src, at, op, size, time_us, algbw, busbw, ranks)
        if wrong_i is not None and wrong_i < len(tokens) and (integer(tokens[wrong_i]) or 0) > 0:
            wrong_rows.append(at)
        out.collectives.append(CollectiveRow(op, size, ranks, nodes, clean(time_us / 1e6), busbw, src, at))
    if wrong_rows:
        out.notes.append(
            f"{src.name}: {len(wrong_rows)} {op} row(s) report wrong results (#wrong > 0, lines "
            f"{', '.join(map(str, wrong_rows[:5]))}); their times are kept"
        )


def _columns(src: Source, block: _Block) -> tuple[int, int, int, int, int | None, int]:
    """Indexes of size, out-of-place time/algbw/busbw and #wrong, and the columns a complete row has."""
    cols = block.columns
    if cols:
        size_i = cols.index("size") if "size" in cols else cols.index("bytes")
        times = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
        algs = [i for i, c in enumerate(cols) if c == "algbw"]
        buses = [i for i, c in enumerate(cols) if c == "busbw"]
        if not times or not algs or not buses:
            raise src.fail(block.rows[0][0], "the table header has no time/algbw/busbw columns")
        wrong = buses[0] + 1 if buses[0] + 1 < len(cols) and cols[buses[0] + 1] == "#wrong" else None
        width = max(i for i, c in enumerate(cols) if c not in ("timestamp",)) + 1
        return size_i, times[0], algs[0], buses[0], wrong, width
    tokens = block.rows[0][1]  # no header: `size count type redop [root] time algbw busbw ...`
    time_i = 5 if len(tokens) >= 13 and integer(tokens[4]) is not None else 4
    return 0, time_i, time_i + 1, time_i + 2, None, time_i + 3


def _placement(src: Source, block: _Block, op: str, out: Parsed) -> tuple[int, int]:
    """(ranks in one collective, nodes they span) of a block."""
    first = block.rows[0][0]
    if block.devices:
        groups: dict[int, list[tuple[int, int, str, str, int]]] = {}
        for dev in block.devices:
            groups.setdefault(dev[1], []).append(dev)
        sizes = {len(g) for g in groups.values()}
        if len(sizes) > 1:
            raise src.fail(
                block.devices[0][4], f"the device groups differ in size ({sorted(sizes)}): one rank count per table"
            )
        ranks = sizes.pop()
        spans = {len({d[2] for d in g}) for g in groups.values()}
        nodes = max(spans)
        if len(spans) > 1:
            out.notes.append(f"{src.name}: the device groups span {sorted(spans)} nodes; {nodes} recorded")
        seen = [d[0] for d in block.devices]
        if len(set(seen)) != len(seen):
            raise src.fail(block.devices[0][4], "a rank is listed twice in the device lines")
        for dev in block.devices:
            out.state("host", dev[2])
            out.state("gpu", dev[3])
        if len(groups) > 1:
            out.notes.append(f"{src.name}: {len(groups)} groups of {ranks} ranks (NCCL_TESTS_SPLIT); one group's time")
        return _at_least_two(src, first, ranks), nodes
    ranks, nodes = _from_command(block)
    if ranks is None:
        ranks = _from_ratio(block, op)
        if ranks is None:
            raise src.fail(
                first,
                "cannot tell how many ranks ran this table: no `#  Rank` device lines, and no `# nThread` line or "
                "command line with the process count",
            )
        out.notes.append(f"{src.name}:{first}: {ranks} ranks read from the busbw/algbw ratio (no device lines)")
    if nodes is None:
        raise src.fail(
            first,
            "cannot tell how many nodes ran this table: no `#  Rank ... on <host>` device lines, and the command "
            "line does not say (mpirun -N/--npernode, -H host:n,..., srun -N)",
        )
    return _at_least_two(src, first, ranks), min(nodes, ranks)


def _at_least_two(src: Source, line: int, ranks: int) -> int:
    if ranks < 2:
        raise src.fail(line, f"{ranks} rank: a collective over one GPU measures no communication")
    return ranks


def _flag(command: str, *names: str) -> int | None:
    for name in names:
        m = re.search(rf"(?:^|\s){re.escape(name)}(?:\s+|=)(\d+)\b", command)
        if m:
            return int(m.group(1))
    return None


def _from_command(block: _Block) -> tuple[int | None, int | None]:
    """(ranks, nodes) from `# nThread t nGpus g` and the command line; None where they do not say."""
    command = block.command or ""
    binary = NCCL_TEST.search(command)
    tail = command[binary.end() :] if binary else ""
    if not binary:  # a table pasted without its command line: the process count is unknown
        return None, None
    threads = block.nthreads if block.nthreads is not None else (_flag(tail, "-t", "--nthreads") or 1)
    gpus = block.ngpus if block.ngpus is not None else (_flag(tail, "-g", "--ngpus") or 1)
    launch = LAUNCHER.search(command[: binary.start()] if binary else command)
    if launch is None:
        return threads * gpus, 1
    head = command[: binary.start()] if binary else command
    if launch.group(1) == "srun":
        procs = _flag(head, "-n", "--ntasks")
        nodes = _flag(head, "-N", "--nodes")
        if procs is None and nodes is not None:
            per = _flag(head, "--ntasks-per-node")
            procs = nodes * per if per else None
    else:
        procs = _flag(head, "-n", "-np", "--np", "-c")
        per = _flag(head, "-N", "--npernode", "-npernode")
        m = re.search(r"--map-by\s+ppr:(\d+):node", head)
        per = per or (int(m.group(1)) if m else None)
        hosts = re.search(r"(?:^|\s)(?:-H|--host|-host)\s+(\S+)", head)
        nodes = None
        if hosts:
            nodes = len([h for h in hosts.group(1).split(",") if h])
        elif per and procs:
            nodes = math.ceil(procs / per)
    return (threads * gpus * procs if procs else None), nodes


def _from_ratio(block: _Block, op: str) -> int | None:
    """Ranks from busbw/algbw of the rows with enough printed digits (None when they disagree or do not say)."""
    found = set()
    for _, tokens in block.rows:
        cols = block.columns
        if cols and "algbw" in cols and "busbw" in cols and len(tokens) > cols.index("busbw"):
            alg, bus = number(tokens[cols.index("algbw")]), number(tokens[cols.index("busbw")])
        else:
            continue
        if alg and bus and alg >= 10:
            n = ranks_from_factor(op, bus / alg)
            if n:
                found.add(n)
    return found.pop() if len(found) == 1 else None
