"""Two best-first searches over halves of one space, in lock step: the same answer and counts in one process or two.

A branch and bound splits cleanly by its roots, but a half alone does not know the plans the other half finds, and
without them it explores every node below its own best (measured on the mixed suite: the half without the optimum
took as long as the whole search). So the two halves ("shares") trade the plans they find, at fixed points of
their own work, never at points in time. Each share counts its work in units of its own (the mixed search: about a
tenth of a millisecond each, mixed_pipelines.WORK) and at every EPOCH units publishes a snapshot: the plans it found
since the last one. At its epoch e a share takes in the other's snapshots up to epoch e - LAG, waiting for them if
the other is not there yet. What a share sees is thus fixed by the two shares' work counts alone, so its cuts,
solves and prune counts are the same whether the shares run side by side in two processes (fork, on Linux with two
or more cores) or one after the other in this process (elsewhere, and in tests). The lag lets the faster share run
up to LAG epochs ahead before it waits, so a step that takes longer than its units say costs a wait only where it
is longer than LAG epochs of the other's work.

Roots split the work unevenly (on the suite one share often had half again the other's), so a share that runs out of
work, or low on it, is given some: at an epoch where a share sees the other out of work or running low (its snapshot
says so: fewer than LOW nodes in line, and fewer than half of this share's; and it has taken in the last gift), it
gives part of its line in its snapshot (the mixed search: every other one of its best nodes,
mixed_pipelines.GIFT). A share out of work does not stop: it goes on from epoch to epoch taking in the other's
snapshots, until a gift comes or both are out of work for good (each out of work, and every gift taken in).

A share is any object with ``explore(until)``: a generator that, at each epoch e it reaches, yields ("need", e) and
is sent the other's snapshots up to e - LAG, then (through ``boundary``, which takes them in and decides the gift)
yields ("publish", snapshot); it returns when it is done. It also has ``load()`` (nodes in its line), ``give()``
(part of its line as bytes, or None), ``take_gift(bytes)``, ``take_plans(plans)``, ``flush()`` (the plans found
since its last snapshot), ``settled`` and ``others_settled`` (progress: its own, and the other's as last heard),
``final()`` (its last snapshot, done), ``result()`` (a picklable summary for the caller) and
``prepare(forked=False)`` (work that needs nothing from the other: run by the child as soon as it is forked, with
``forked`` True, and by explore where it has not run yet); optionally ``prepare_for(first, front, back)`` (in the
child, after prepare: work for the first share from one end while the first share works from the other, ``front``
and ``back`` shared counters of how far each has come; sent to the first share, which reads it in its first explore
through its ``meet`` (Meet); it must not change what that share does, only how soon). The caller owns the shares;
this module only runs them.
Between explores the caller may also hand the second share's side a call of its own (start_call, finish_call), which
runs in the child while this process does other work; or help (start_help, helped, end_help): a generator run in the
child that sends what it works out as it goes, while this process reads it in as it likes, reading a few numbers it
publishes on ``board`` (shared memory) to steer it, until ended. Help must not change what this process does, only
how soon (what it sends is what this process would work out itself), and is given only where there is a child.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

EPOCH = 256  # work units between snapshots (the caller's units: a few tens of milliseconds of the mixed search)
LAG = 8  # epochs a share may run ahead of what it knows of the other
# A share whose line held fewer nodes than this at its last snapshot (and fewer than half the other's) is given some
# before it runs out: a gift comes 2 LAG epochs after the need it answers (LAG for the other to see it, LAG to take
# it in), in which a share given work only once out of it sat idle. Seed-5 suite job 10: the child, out of work for
# 1.64 s of its 4.1 s second explore, 0.29 s with gifts below 512 nodes.
LOW = 512
# A help's board (Board): its numbers, of which STOP and PARCEL are the board's own, and the most bytes of a parcel
BOARD, STOP, PARCEL = 4, 0, 1
PARCEL_BYTES = 8 << 20  # (shared memory, touched only as far as a parcel fills it)


@dataclass
class Snapshot:
    """The plans a share found since its last snapshot, published at epoch ``tag`` of its work (a final one: one
    past the epoch it ended in, ``done``); ``settled`` counts what it settled so far (progress only)."""

    tag: int
    plans: list = field(default_factory=list)
    settled: int = 0
    done: bool = False
    load: int = 0  # nodes in its line after this snapshot (0: out of work)
    gift: bytes | None = None  # nodes given to the other share


class Inbox:
    """The other share's snapshots, given out in order up to the epoch a share has reached less LAG. The state of
    the other at epoch x is known once a snapshot of a later or equal epoch has come (tags only grow), or its final
    one."""

    def __init__(self) -> None:
        self.queue: deque[Snapshot] = deque()
        self.latest = -1
        self.done = False
        self.settled = 0

    def add(self, snap: Snapshot) -> None:
        self.queue.append(snap)
        self.latest = snap.tag
        self.done = self.done or snap.done
        self.settled = snap.settled

    def known(self, epoch: int) -> bool:
        return self.done or self.latest >= epoch

    def take(self, epoch: int) -> list[Snapshot]:
        """Every snapshot up to ``epoch`` not given out yet, in order."""
        out = []
        while self.queue and self.queue[0].tag <= epoch:
            out.append(self.queue.popleft())
        return out


class Peer:
    """What a share knows of the other from the snapshots it has taken in: its last epoch, whether it is out of
    work or done; and the epoch of this share's last gift to it."""

    def __init__(self) -> None:
        self.tag = -1
        self.load = -1  # unknown until its first snapshot
        self.done = False
        self.gave = None  # epoch of this share's last gift

    def seen(self, snap: Snapshot) -> None:
        self.tag, self.load, self.done = snap.tag, snap.load, self.done or snap.done

    def took_last_gift(self) -> bool:
        """The other had taken in this share's last gift when it published what this share knows of it (a gift of
        epoch g is taken in at the other's epoch g + LAG, before it publishes that epoch)."""
        return self.gave is None or self.gave + LAG <= self.tag

    def wants(self, own: int) -> bool:
        """Whether the other is to be given part of this share's line, ``own`` nodes: it is out of work, or running
        low (fewer than LOW nodes, and fewer than half of ``own``), and has taken in the last gift."""
        low = self.load == 0 or (0 < self.load < LOW and 2 * self.load < own)
        return not self.done and low and self.took_last_gift()

    def idle_for_good(self) -> bool:
        """Both out of work for good: the other done, or out of work with every gift of this share taken in (only a
        gift from this share, itself out of work, could give it more)."""
        return self.done or (self.load == 0 and self.took_last_gift())


def boundary(share, peer: Peer, epoch: int):
    """A share's epoch (``yield from`` in its explore): the other's snapshots up to epoch - LAG taken in (their
    plans and gifts), a gift made where the other is out of work, this share's snapshot published. Returns whether
    both shares are out of work for good (only asked of a share out of work)."""
    theirs = yield ("need", epoch)
    for snap in theirs:
        peer.seen(snap)
        share.take_plans(snap.plans)
        if snap.gift is not None:
            share.take_gift(snap.gift)
    gift = share.give() if peer.wants(share.load()) else None
    if gift is not None:
        peer.gave = epoch
    yield ("publish", Snapshot(epoch, share.flush(), share.settled, False, share.load(), gift))
    return share.load() == 0 and peer.idle_for_good()


def processes_available() -> int:
    """Two where the shares can run side by side (fork, Linux, two or more cores for this process, and not itself
    a daemonic worker, which may not start processes), else one."""
    if not sys.platform.startswith("linux") or multiprocessing.current_process().daemon:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return 2 if cores >= 2 else 1


class Board:
    """Shared memory between this process and the child's help (Lockstep.start_help): a few numbers this process
    publishes (board[i]; board[STOP] set where the help is to stop) and one parcel, an object this process hands
    the help once it has it (send, receive). Written by this process's main thread as it goes, not through a queue
    (whose feeder thread writes it): a 360 kB list of replica shapes put on the child's queue while this process
    went on with its first look reached the child 1.6-1.7 s later in 2 of 5 runs of seed-5 suite job 13."""

    def __init__(self, ctx) -> None:
        # (the numbers are read and written as they are; the parcel's size behind the array's lock, whose taking and
        # giving order the parcel's bytes before it on any processor)
        self.shared = ctx.Array("d", BOARD)
        self.numbers = self.shared.get_obj()
        self.parcel = mmap.mmap(-1, PARCEL_BYTES)  # (anonymous and shared: the forked child sees what is written)

    def __getitem__(self, i: int) -> float:
        return self.numbers[i]

    def __setitem__(self, i: int, value: float) -> None:
        self.numbers[i] = value

    def stopped(self) -> bool:
        return bool(self.numbers[STOP])

    def reset(self) -> None:
        self.numbers[:] = [0.0] * BOARD

    def send(self, obj) -> bool:
        """Hands ``obj`` to the help; False where it is too large to (the help never gets it)."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > PARCEL_BYTES:
            return False
        self.parcel[: len(data)] = data
        with self.shared.get_lock():
            self.numbers[PARCEL] = len(data)
        return True

    def receive(self):
        """(In the help.) The parcel, once this process has sent it; None where it is told to stop first."""
        while True:
            with self.shared.get_lock():
                size = int(self.numbers[PARCEL])
            if size:
                return pickle.loads(self.parcel[:size])
            if self.numbers[STOP]:
                return None
            time.sleep(0.0005)


class Meet(NamedTuple):
    """Where the parent and the child work from either end for the first share (prepare_for): ``front`` and
    ``back``, counters in shared memory of how far each side has come, and ``theirs``, which waits for what the
    child sent."""

    front: Any
    back: Any
    theirs: Callable[[], Any]


class Lockstep:
    """Runs two shares in lock step, in this process or (``processes`` 2) the second in a forked child that keeps
    it between calls of explore. Use as a context manager: the child is ended on leaving it."""

    def __init__(self, shares: list, processes: int = 1) -> None:
        assert len(shares) == 2
        self.shares = shares
        self.child = None
        self._call = None
        self._helping = False
        if processes >= 2:
            ctx = multiprocessing.get_context("fork")
            self.to_child, self.from_child = ctx.Queue(), ctx.Queue()
            # where the parent and the child work out the first share's roots from either end (prepare_for)
            self.front, self.back = ctx.Value("q", 0, lock=False), ctx.Value("q", 2**62, lock=False)
            self.board = Board(ctx)  # what this process publishes to the child's help
            # what the help sends: a pipe of its own, written as it goes by the child's main thread (as Board)
            self.help_in, help_out = ctx.Pipe(duplex=False)
            args = (shares, self.to_child, self.from_child, self.front, self.back, self.board, help_out)
            self.child = ctx.Process(target=_child_main, args=args, daemon=True)
            self.child.start()
            help_out.close()  # (the child's end)
            if hasattr(shares[1], "prepare_for"):  # (read by the first share in its first explore)
                shares[0].meet = Meet(self.front, self.back, self._prepared)

    def __enter__(self) -> Lockstep:
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(abort=kind is not None)

    def close(self, abort: bool = False) -> None:
        """Ends the child: asked to stop, or (``abort``, after an error or Ctrl-C here) at once."""
        if self.child is None:
            return
        if not abort and self.child.is_alive():
            self.to_child.put(("close",))
            self.child.join(timeout=5)
        if self.child.is_alive():
            self.child.terminate()
        self.child.join()
        self.to_child.close()
        self.from_child.close()
        self.help_in.close()
        self.board.parcel.close()
        self.child = None

    def start_call(self, fn, *args) -> None:
        """``fn(share, *args)`` on the second share's side (its process, with its share: a module-level function and
        picklable arguments), while this process goes on with other work; its result comes from finish_call. In
        one process it runs at finish_call."""
        self._call = (fn, args)
        if self.child is not None:
            self.to_child.put(("call", fn, args))

    def finish_call(self):
        """The result of the call start_call began (waiting for it)."""
        fn, args = self._call
        self._call = None
        if self.child is None:
            return fn(self.shares[1], *args)
        msg = self._message()
        assert msg[0] == "called"
        return msg[1]

    def explore(self, until: float, best=()):
        """Both shares' explore(until), to the end, each starting from the plans ``best``; the second share's
        result()."""
        self.shares[0].best = list(best)
        if self.child is None:
            self.shares[1].best = list(best)
            _alternate(self.shares, until)
            return self.shares[1].result()
        self.to_child.put(("explore", until, best))
        inbox = Inbox()
        _run(self.shares[0], until, self.to_child.put, lambda: self._receive(inbox), inbox)
        msg = self._message()  # (the child's result: _run has taken in its snapshots up to its final one)
        assert msg[0] == "result"
        return msg[1]

    def start_help(self, fn, *args) -> None:
        """``fn(share, board, *args)``, a generator, on the second share's side (a module-level function and
        picklable arguments; ``board``: self.board, for what this process hands it later): what it yields comes to
        helped and end_help, in order, while this process goes on. Only where there is a child (``self.child``); at
        most one at a time, ended by end_help before the next explore or call."""
        assert self.child is not None and not self._helping
        self.board.reset()
        self._helping = True
        self.to_child.put(("help", fn, args))

    def helped(self) -> list:
        """What the help sent since it was last read, without waiting."""
        out = []
        while self._helping and self.help_in.poll():
            self._take_help(out)
        return out

    def end_help(self) -> list:
        """Tells the help to stop (board[STOP]) and waits for it to end: what it sent that was not read yet."""
        self.board[STOP] = 1.0
        out = []
        while self._helping:
            while not self.help_in.poll(1.0):
                if not self.child.is_alive():
                    raise RuntimeError("mixed-pipeline search process ended unexpectedly")
            self._take_help(out)
        return out

    def _take_help(self, out: list) -> None:
        part = self.help_in.recv()
        if isinstance(part, str):  # (the child's error: its traceback; the parent reports it)
            raise RuntimeError(f"mixed-pipeline search process failed:\n{part}")
        if part is None:
            self._helping = False
        else:
            out.append(part)

    def _prepared(self):
        """The child's prepare_for (its first message), waiting for it."""
        msg = self._message(prepared=True)
        assert msg[0] == "prepared"
        return msg[1]

    def _message(self, prepared: bool = False):
        while True:
            try:
                msg = self.from_child.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.child.is_alive():
                    raise RuntimeError("mixed-pipeline search process ended unexpectedly") from None
        if msg[0] == "error":
            raise RuntimeError(f"mixed-pipeline search process failed:\n{msg[1]}")
        if msg[0] == "prepared" and not prepared:  # (not asked for: the first share had no roots left to it)
            return self._message()
        return msg

    def _receive(self, inbox: Inbox) -> None:
        msg = self._message()
        assert msg[0] == "snapshot"
        inbox.add(msg[1])
        self.shares[0].others_settled = inbox.settled


def _run(share, until: float, send, receive, inbox: Inbox) -> None:
    """One share's explore in this process, trading snapshots through ``send`` and ``receive`` (which adds the
    other's next snapshot to ``inbox``, waiting for it); once it ends, the other's snapshots up to its final one
    taken in (_take_late)."""
    gen = share.explore(until)
    value = None
    while True:
        try:
            kind, x = gen.send(value)
        except StopIteration:
            send(("snapshot", share.final()))
            while not inbox.done:
                receive()
            _take_late(share, inbox)
            return
        value = None
        if kind == "need":
            while not inbox.known(x - LAG):
                receive()
            value = inbox.take(x - LAG)
        else:
            send(("snapshot", x))


def _take_late(share, inbox: Inbox) -> None:
    """The other share's snapshots a share had not taken in when its explore ended (it stopped at the deadline):
    their plans, and their gifts, which would be lost otherwise (the giver took the nodes out of its line): the share
    keeps them in line for a later explore. (A share that ended out of work for good has taken in every gift.
    Seed-5 suite job 10 without this: 2 of 11 CLI runs, both slow ones past the first deadline, gave a plan 0.4%
    slower as proven, its best candidate in a gift not taken in.)"""
    for snap in inbox.take(float("inf")):
        share.take_plans(snap.plans)
        if snap.gift is not None:
            share.take_gift(snap.gift)


def _alternate(shares: list, until: float) -> None:
    """Both shares in this process: each runs until it needs a snapshot of the other that the other has not
    published yet, then the other runs. (A share waits at epoch e for the other's e - LAG, having published e - 1;
    the other, waiting too, would wait at its next epoch, at most e - LAG, for this one's e - 2 LAG at most: so both
    never wait at once. Epochs are passed one by one, also where a step's work spans several.)"""
    gens = [s.explore(until) for s in shares]
    inboxes = [Inbox(), Inbox()]  # inboxes[i]: the other share's snapshots, for share i
    need: list[int | None] = [None, None]  # the other's epoch a share waits for
    finished = [False, False]
    i = 0
    while not all(finished):
        if finished[i] or (need[i] is not None and not inboxes[i].known(need[i])):
            i = 1 - i
            continue
        value = inboxes[i].take(need[i]) if need[i] is not None else None
        need[i] = None
        try:
            kind, x = gens[i].send(value)
        except StopIteration:
            finished[i] = True
            inboxes[1 - i].add(shares[i].final())
            continue
        if kind == "need":
            need[i] = x - LAG
        else:
            inboxes[1 - i].add(x)
            shares[1 - i].others_settled = x.settled
    for share, inbox in zip(shares, inboxes):  # (as _run: what a share ended without)
        _take_late(share, inbox)


def _child_main(shares, inbox_queue, outbox_queue, front, back, board, help_out) -> None:
    """The forked child: explores its share (the second) whenever asked, trading snapshots with the parent, until
    closed; first it prepares its share and, where the share can, works for the first one until the parent asks for
    more (prepare_for). Ctrl-C is the parent's to handle (it ends the child)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    share = shares[1]
    try:
        share.prepare(forked=True)  # (while the parent goes on with what comes before the first explore)
        if hasattr(share, "prepare_for"):
            outbox_queue.put(("prepared", share.prepare_for(shares[0], front, back)))
        while True:
            msg = inbox_queue.get()
            if msg[0] == "close":
                break
            if msg[0] == "call":
                _, fn, args = msg
                outbox_queue.put(("called", fn(share, *args)))
                continue
            if msg[0] == "help":
                _, fn, args = msg
                try:
                    for part in fn(share, board, *args):
                        help_out.send(part)
                except Exception:
                    help_out.send(traceback.format_exc())
                    raise
                help_out.send(None)  # (its end)
                continue
            _, until, best = msg
            share.best = list(best)
            inbox = Inbox()

            def receive(inbox=inbox):
                inbox.add(inbox_queue.get()[1])

            _run(share, until, outbox_queue.put, receive, inbox)
            outbox_queue.put(("result", share.result()))
    except Exception:  # the parent reports it
        outbox_queue.put(("error", traceback.format_exc()))
    finally:
        outbox_queue.close()
        outbox_queue.join_thread()
        os._exit(0)
