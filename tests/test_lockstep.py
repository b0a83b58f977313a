"""planner/search/lockstep.py: two shares trade plans at fixed points of their own work, so what each sees, and so
everything it does, is the same whether they run one after the other in this process or side by side in two.

The toy shares below do random amounts of work per step and find random plans, and what they do depends on the
plans they are sent (a share stops once the best plan it knows is good enough, and its finds depend on that best),
so any difference in what they are sent shows in their logs."""

import random

import pytest

from planner.search import lockstep
from planner.search.lockstep import EPOCH, LAG, Lockstep, Snapshot, processes_available


class Toy:
    """A share: ``steps`` steps of random work; a step finds a plan below the best it knows with some chance; it
    stops early once its best is below ``good``."""

    def __init__(self, seed: int, steps: int, good: float = 0.02, fail_at: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.steps, self.good, self.fail_at = steps, good, fail_at
        self.best: list[float] = []
        self.found: list[float] = []
        self.work = self.pos = 0
        self.log: list = []  # (epoch, plans sent to it) at every epoch
        self.published: list = []  # (tag, plans) of every snapshot
        self.others_settled = 0
        self.progress = None

    def explore(self, until: float):
        start, tag = self.work, 0
        while self.pos < self.steps and not (self.best and min(self.best) < self.good):
            self.pos += 1
            if self.pos == self.fail_at:
                raise ValueError("toy failure")
            self.work += self.rng.randint(1, 2 * EPOCH)
            known = min(self.best, default=1.0)
            if self.rng.random() < 0.3:
                plan = round(known * self.rng.uniform(0.5, 1.0), 9)
                self.best.append(plan)
                self.found.append(plan)
            if (self.work - start) // EPOCH > tag:
                tag = (self.work - start) // EPOCH
                snap = Snapshot(tag, self.found, self.pos)
                self.published.append((tag, list(self.found)))
                self.found = []
                theirs = yield snap
                self.log.append((tag, list(theirs)))
                self.best += theirs

    def final(self) -> Snapshot:
        snap = Snapshot(self.work // EPOCH + 1, self.found, self.pos, done=True)
        self.published.append((snap.tag, list(self.found)))
        self.found = []
        return snap

    def result(self) -> dict:
        return {"log": self.log, "best": sorted(self.best), "pos": self.pos, "published": self.published}


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
def test_a_share_sees_the_others_plans_up_to_its_epoch_less_the_lag(seeds, steps):
    """At its epoch e a share is sent exactly the plans the other published at epochs e - LAG or before that it
    had not been sent yet: no fewer (it waited for them), no more (which would depend on timing)."""
    mine, theirs = run(seeds, steps, processes=1)
    for log, published in ((mine["log"], theirs["published"]), (theirs["log"], mine["published"])):
        given = 0
        for epoch, plans in log:
            due = [p for tag, ps in published if tag <= epoch - LAG for p in ps]
            assert plans == due[given:]
            given = len(due)


def test_a_failure_in_the_child_is_raised_here():
    if processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    shares = [Toy(1, 100), Toy(2, 100, fail_at=30)]
    with pytest.raises(RuntimeError, match="toy failure"):
        with Lockstep(shares, 2) as ls:
            ls.explore(float("inf"))


def test_inbox_gives_out_snapshots_in_order_up_to_an_epoch():
    inbox = lockstep.Inbox()
    assert not inbox.known(0)
    inbox.add(Snapshot(1, ["a"]))
    inbox.add(Snapshot(3, ["b", "c"]))
    assert inbox.known(3) and not inbox.known(4)
    assert inbox.take(0) == [] and inbox.take(2) == ["a"] and inbox.take(5) == ["b", "c"]
    inbox.add(Snapshot(4, ["d"], done=True))
    assert inbox.known(10**9) and inbox.take(3) == [] and inbox.take(4) == ["d"]
