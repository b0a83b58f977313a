"""planner/search/lockstep.py: two shares trade plans at fixed points of their own work, so what each sees, and so
everything it does, is the same whether they run one after the other in this process or side by side in two.

The toy shares below do random amounts of work per step and find random plans, and what they do depends on the
plans they are sent (a share stops once the best plan it knows is good enough, and its finds depend on that best),
so any difference in what they are sent shows in their logs."""

import os
import pickle
import random
import time

import pytest

from planner.search import lockstep
from planner.search.lockstep import EPOCH, LAG, Lockstep, Snapshot, boundary, processes_available


class RecordingPeer(lockstep.Peer):
    """Records (the share's epoch, the tag) of every snapshot of the other share taken in."""

    def __init__(self, share) -> None:
        super().__init__()
        self.share = share

    def seen(self, snap: Snapshot) -> None:
        self.share.seen.append((self.share.epoch, snap.tag))
        super().seen(snap)


class Toy:
    """A share: a line of work items, each of random work; an item finds a plan below the best the share knows
    with some chance and may add items of its own; once its best is below ``good`` the rest of its line is cut."""

    def __init__(
        self, seed: int, items: int, good: float = 0.02, fail_at: int | None = None, stop_at: int | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.line = [self.rng.randint(1, 2 * EPOCH) for _ in range(items)]
        self.good, self.fail_at = good, fail_at
        self.stop_at = stop_at  # items done at which it stops with its line left (as at a deadline)
        self.best: list[float] = []
        self.found: list[float] = []
        self.work = self.done = self.added = 0
        self.settled = 0
        self.log: list = []  # (epoch, plans and gifts taken in) at every epoch
        self.published: list = []  # (tag, plans) of every snapshot
        self.others_settled = 0
        self.progress = None
        self.epoch = 0
        self.seen: list = []  # (epoch, tag) of the other's snapshots taken in

    def prepare(self, forked: bool = False) -> None:
        pass

    def explore(self, until: float):
        start, tag = self.work, 0
        peer = RecordingPeer(self)
        while True:
            if not self.line:
                tag += 1
                self.work = max(self.work, start + tag * EPOCH)
                self.epoch = tag
                if (yield from boundary(self, peer, tag)):
                    break
                continue
            if self.done == self.stop_at:
                break
            amount = self.line.pop(0)
            self.done += 1
            if self.done == self.fail_at:
                raise ValueError("toy failure")
            self.work += amount
            if self.rng.random() < 0.3:
                plan = round(min(self.best, default=1.0) * self.rng.uniform(0.5, 1.0), 9)
                self.best.append(plan)
                self.found.append(plan)
            if self.rng.random() < 0.2:
                new = [self.rng.randint(1, 2 * EPOCH) for _ in range(self.rng.randint(1, 3))]
                self.line += new
                self.added += len(new)
            if min(self.best, default=1.0) < self.good:
                self.line.clear()
            while (self.work - start) // EPOCH > tag:
                tag += 1
                self.epoch = tag
                yield from boundary(self, peer, tag)

    def take_plans(self, plans) -> None:
        self.log.append(("plans", list(plans)))
        self.best += plans

    def flush(self) -> list:
        found, self.found = self.found, []
        return found

    def load(self) -> int:
        return len(self.line)

    def give(self):
        if len(self.line) < 2:
            return None
        gift, self.line = self.line[1::2], self.line[0::2]
        self.log.append(("gave", list(gift)))
        return pickle.dumps(gift)

    def take_gift(self, payload: bytes) -> None:
        gift = pickle.loads(payload)
        self.log.append(("took", gift))
        self.line += gift

    def final(self) -> Snapshot:
        return Snapshot(self.work // EPOCH + 1, self.flush(), self.settled, True, self.load())

    def result(self) -> dict:
        return {
            "log": self.log,
            "best": sorted(self.best),
            "done": self.done,
            "work": self.work,
            "seen": self.seen,
            "line": list(self.line),
            "added": self.added,
        }


def run(seeds, steps, processes: int, **kw):
    shares = [Toy(seed, n, **kw) for seed, n in zip(seeds, steps)]
    with Lockstep(shares, processes) as ls:
        other = ls.explore(float("inf"))
    return shares[0].result(), other


CASES = [((1, 2), (200, 200)), ((3, 4), (40, 400)), ((5, 6), (400, 15)), ((7, 8), (0, 100)), ((9, 10), (300, 300))]


@pytest.mark.parametrize("seeds,steps", CASES)
def test_same_in_one_process_and_two(seeds, steps):
    one = run(seeds, steps, processes=1)
    assert one[0]["log"] or one[1]["log"] or sum(steps) < 20  # the shares traded at epochs
    if processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    assert run(seeds, steps, processes=2) == one


@pytest.mark.parametrize("seeds,steps", CASES)
def test_a_share_takes_in_the_others_snapshots_lag_epochs_late(seeds, steps):
    """At its epoch e a share takes in the other's snapshots of epochs e - LAG or before, each once, in order (so
    what it has taken in by then does not depend on how fast the other went)."""
    shares = [Toy(seed, n) for seed, n in zip(seeds, steps)]
    with Lockstep(shares, 1) as ls:
        ls.explore(float("inf"))
    for share in shares:
        assert all(tag <= epoch - LAG for epoch, tag in share.seen)
        tags = [tag for _, tag in share.seen]
        assert tags == sorted(set(tags))
    assert any(share.seen for share in shares)


def test_a_share_out_of_work_is_given_some():
    """One share with 300 items, the other with none: the other is given half of what is left, again and again, so
    it does a fair part of the work; every item is done once."""
    shares = [Toy(1, 300, good=0.0), Toy(2, 0, good=0.0)]
    with Lockstep(shares, 1) as ls:
        ls.explore(float("inf"))
    gave = [g for kind, g in shares[0].log if kind == "gave"]
    took = [g for kind, g in shares[1].log if kind == "took"]
    assert gave and took == gave  # every gift taken in, in order
    assert shares[1].done > 60
    assert shares[0].done + shares[1].done == 300 + shares[0].added + shares[1].added


class Counting(Toy):
    """A toy share that records how many items it still had in line whenever it took in a gift."""

    def take_gift(self, payload: bytes) -> None:
        self.log.append(("had", len(self.line)))
        super().take_gift(payload)


def test_a_share_running_low_is_given_some_before_it_runs_out():
    """A share with fewer than LOW items in line (and fewer than half the other's) is given some while it still
    has work, so it does not sit idle for the 2 LAG epochs a gift takes to arrive; a share with as many items as
    the other is given none."""
    few = lockstep.LOW // 4
    shares = [Toy(1, 4 * lockstep.LOW, good=0.0), Counting(2, few, good=0.0)]
    with Lockstep(shares, 1) as ls:
        ls.explore(float("inf"))
    had = [n for kind, n in shares[1].log if kind == "had"]
    assert had and had[0] > 0  # the first gift came before its line ran out
    assert shares[0].done + shares[1].done == 4 * lockstep.LOW + few + shares[0].added + shares[1].added
    even = [Toy(3, 2 * lockstep.LOW, good=0.0), Counting(4, 2 * lockstep.LOW, good=0.0)]
    with Lockstep(even, 1) as ls:
        ls.explore(float("inf"))
    assert not [n for kind, n in even[1].log if kind == "had" and n >= lockstep.LOW]


def test_a_gift_to_a_share_that_stopped_at_its_deadline_stays_in_its_line():
    """A share with few items is given some (running low) but stops (its deadline) before the gift reaches it in
    lock step: it still takes the gift in once it has stopped (lockstep._take_late), keeping it in line for a later
    explore, so every item is done or left in a line, none lost in flight; the same in one process and two."""
    late = 0
    for stop in range(2, 40, 3):
        runs = []
        for processes in (1, 2) if processes_available() >= 2 else (1,):
            shares = [Toy(1, 300, good=0.0), Toy(2, 30, good=0.0, stop_at=stop)]
            with Lockstep(shares, processes) as ls:
                other = ls.explore(float("inf"))
            runs.append((shares[0].result(), other))
        assert all(r == runs[0] for r in runs)
        mine, other = runs[0]
        done = mine["done"] + other["done"]
        left = len(mine["line"]) + len(other["line"])
        assert done + left == 330 + mine["added"] + other["added"]
        took = any(kind == "took" for kind, _ in other["log"])
        late += took and other["done"] == stop and stop < 20
    assert late


def test_a_failure_in_the_child_is_raised_here():
    if processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    shares = [Toy(1, 100, good=0.0), Toy(2, 100, good=0.0, fail_at=30)]
    with pytest.raises(RuntimeError, match="toy failure"):
        with Lockstep(shares, 2) as ls:
            ls.explore(float("inf"))


def test_inbox_gives_out_snapshots_in_order_up_to_an_epoch():
    inbox = lockstep.Inbox()
    assert not inbox.known(0)
    inbox.add(Snapshot(1, ["a"]))
    inbox.add(Snapshot(3, ["b", "c"]))
    assert inbox.known(3) and not inbox.known(4)
    assert inbox.take(0) == [] and [s.plans for s in inbox.take(2)] == [["a"]]
    assert [s.plans for s in inbox.take(5)] == [["b", "c"]]
    inbox.add(Snapshot(4, ["d"], done=True))
    assert inbox.known(10**9) and inbox.take(3) == [] and [s.plans for s in inbox.take(4)] == [["d"]]


def _toy_call(share, x: int) -> tuple:
    """A call on the second share's side: what that share knows (its state after explore), and the argument."""
    return share.done, x * 2, os.getpid()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_call_runs_on_the_second_shares_side_between_explores(processes):
    """start_call hands a function to the second share's side (the child's process with two processes), this one
    goes on meanwhile; finish_call returns its result, which sees that share as its explore left it, and the
    shares explore again afterwards."""
    if processes == 2 and processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    shares = [Toy(1, 100), Toy(2, 100)]
    with Lockstep(shares, processes) as ls:
        other = ls.explore(float("inf"))
        ls.start_call(_toy_call, 21)
        done, doubled, pid = ls.finish_call()
        assert ls.explore(float("inf"))["done"] == other["done"]  # (nothing left: the same share again)
    assert (done, doubled) == (other["done"], 42)
    assert (pid == os.getpid()) == (processes == 1)


def _toy_help(share, board):
    """A help: the square of each number of the parcel, in batches of two, from board[2] on (how far this side
    has come), until told to stop; with the process it ran in."""
    numbers = board.receive()
    if numbers is None:
        return
    for x in numbers:
        if board.stopped():
            return
        if x >= board[2]:
            yield [(x, x * x, os.getpid())]


def _failing_help(share, board):
    yield [1]
    raise ValueError("toy help failure")


def test_a_help_works_ahead_on_the_second_shares_side_until_told_to_stop():
    """start_help runs a generator on the child's side; the parcel and the numbers on the board reach it as this
    process sets them; helped takes in what it sent so far without waiting, end_help stops it and returns the rest;
    the shares explore as before afterwards."""
    if processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    shares = [Toy(1, 100), Toy(2, 100)]
    with Lockstep(shares, 2) as ls:
        ls.start_help(_toy_help)
        ls.board[2] = 500  # (set before the parcel: the help skips what lies behind it)
        assert ls.board.send(list(range(10**6)))
        got, waited = [], 0
        while len(got) < 10 and waited < 600:  # (it sends as it goes: some before it is told to stop)
            got += [x for batch in ls.helped() for x in batch]
            time.sleep(0.1)
            waited += 1
        assert got
        got += [x for batch in ls.end_help() for x in batch]
        assert ls.helped() == []
        numbers = [x for x, _, _ in got]
        assert numbers == list(range(500, 500 + len(numbers)))
        assert all(y == x * x and pid != os.getpid() for x, y, pid in got)
        assert len(numbers) < 10**6 - 500  # (it stopped when told)
        ls.start_help(_toy_help)
        assert ls.end_help() == []  # (stopped before its parcel came: it sends nothing)
        other = ls.explore(float("inf"))
    one = [Toy(1, 100), Toy(2, 100)]
    with Lockstep(one, 1) as ls:
        assert ls.explore(float("inf")) == other


def test_a_failure_in_a_help_is_raised_here():
    if processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    with pytest.raises(RuntimeError, match="toy help failure"):
        with Lockstep([Toy(1, 10), Toy(2, 10)], 2) as ls:
            ls.start_help(_failing_help)
            ls.end_help()
