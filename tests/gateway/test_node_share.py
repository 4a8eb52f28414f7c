"""The node's share (``switchyard serve --workers N``): named slots, node-wide token buckets and concurrency caps,
a dead worker's slots freed by ``reset_worker``, a file of another format refused. Two attachments in one process
cover the sharing; real processes cover the file lock and a worker killed while it holds a slot."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.gateway.shaping.concurrency import ModelGate
from services.gateway.shaping.limits import LimitTable
from services.gateway.shaping.node_buckets import NodeRateLimiter
from services.gateway.shaping.node_share import NodeShare, NodeShareError, NodeSlots
from services.gateway.shaping.ratelimit import LocalRateLimiter
from tests.waiting import wait_until_async

ROOT = Path(__file__).resolve().parents[2]

# A worker process: attaches as argv[2], then answers commands read from stdin, one line each.
_WORKER = """
import sys
from pathlib import Path
from services.gateway.shaping.limits import Limit, LimitTable
from services.gateway.shaping.node_buckets import NodeRateLimiter
from services.gateway.shaping.node_share import NodeShare, NodeSlots

share = NodeShare.attach(Path(sys.argv[1]), int(sys.argv[2]))
slots = NodeSlots(share, "m")
limit = Limit(0.001, int(sys.argv[3]))
limiter = NodeRateLimiter(LimitTable(rps=limit.rps, burst=limit.burst), share, clock=lambda: 0.0)  # no refill
print("ready", flush=True)
for line in sys.stdin:
    command = line.split()
    if command[0] == "take":
        print(slots.try_take(int(command[1])), flush=True)
    elif command[0] == "leave":
        slots.give_back(int(command[1]), idle=True)
        print("ok", flush=True)
    elif command[0] == "tokens":
        decisions = [limiter.take("tenant:acme", limit) for _ in range(int(command[1]))]
        print(sum(d.allowed for d in decisions), flush=True)
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    private = tmp_path / "node"
    private.mkdir(mode=0o700)
    return private


@pytest.fixture
def share(folder: Path) -> Iterator[NodeShare]:
    made = NodeShare.create(folder / "share", workers=2, slots=8)
    yield made
    made.close()


@pytest.fixture
def other(share: NodeShare) -> Iterator[NodeShare]:
    """Worker 1's attachment to the same file."""
    attached = NodeShare.attach(share.path, 1)
    yield attached
    attached.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_node_limiter_decides_as_one_local_limiter_when_two_workers_share_it(
    share: NodeShare, other: NodeShare
) -> None:
    table = LimitTable(rps=2, burst=3)
    clock = _Clock()
    workers = [NodeRateLimiter(table, share, clock=clock), NodeRateLimiter(table, other, clock=clock)]
    local = LocalRateLimiter(table, clock=clock)
    allowed = []
    for step, now in enumerate([100.0, 100.0, 100.0, 100.0, 100.2, 100.5, 101.0, 101.0, 101.0, 103.0, 103.0]):
        clock.now = now
        decision = await workers[step % 2].check("acme", "m")
        assert decision is not None
        assert decision == await local.check("acme", "m")
        allowed.append(decision.allowed)
    # The burst of 3 at once, then 2 per second for the node as a whole, refilled at most to the burst.
    assert allowed == [True, True, True, False, False, True, True, False, False, True, True]


def test_slot_names_are_shared_between_workers_and_a_full_table_is_refused(
    share: NodeShare, other: NodeShare
) -> None:
    long_a, long_b = "a" * 300 + "1", "a" * 300 + "2"
    names = ["m", "tenant:acme", long_a, long_b, "ü-model"]
    taken = [share.slot(name) for name in names]
    assert taken == [0, 1, 2, 3, 4]
    assert [other.slot(name) for name in reversed(names)] == list(reversed(taken))
    assert [other.slot(f"new{i}") for i in range(3)] == [5, 6, 7]
    assert share.slot("new2") == 7  # not in this process's cache yet: found in the file
    with pytest.raises(NodeShareError, match=r"no slot left for 'full': all 8 slots are taken"):
        share.slot("full")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda path: _write_at(path, 8, struct.pack("<I", 2)), r"has format 2, this gateway reads format 1"),
        (lambda path: _write_at(path, 0, b"NOTSHARE"), r"is not a Switchyard node share"),
        (lambda path: _write_at(path, path.stat().st_size, b"\0" * 8), r"expected \d+ for 2 workers and 8 slots"),
    ],
    ids=["format", "magic", "size"],
)
def test_attach_refuses_a_file_that_is_not_this_format(
    share: NodeShare, damage: Callable[[Path], None], message: str
) -> None:
    damage(share.path)
    with pytest.raises(NodeShareError, match=message):
        NodeShare.attach(share.path, 1)


def test_attach_and_create_refuse_what_does_not_fit(share: NodeShare, tmp_path: Path) -> None:
    with pytest.raises(NodeShareError, match=r"worker 2 cannot attach .* workers 0 to 1"):
        NodeShare.attach(share.path, 2)
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    os.chmod(open_folder, 0o755)  # the umask may have taken bits away
    with pytest.raises(NodeShareError, match=r"has mode 755 .* expected mode 700"):
        NodeShare.create(open_folder / "share", workers=2)


async def test_node_gate_admits_limit_across_workers_and_wakes_a_waiter_when_the_other_leaves(
    share: NodeShare, other: NodeShare
) -> None:
    gates = [ModelGate("m", 2, 4, node=NodeSlots(share, "m")), ModelGate("m", 2, 4, node=NodeSlots(other, "m"))]
    node = NodeSlots(share, "m")
    await gates[1].enter(1, None)
    await gates[1].enter(1, None)
    waiting = asyncio.create_task(gates[0].enter(1, None))
    await asyncio.sleep(0.02)  # a few polls: the node is full, so it must still wait
    assert (waiting.done(), gates[0].waiting, node.executing) == (False, 1, 2)

    gates[1].leave(None)  # another worker's leave: worker 0 hears of it by polling
    assert await wait_until_async(waiting.done)
    await waiting
    assert (gates[0].inflight, gates[1].inflight, node.executing, gates[0].waiting) == (1, 1, 2, 0)

    back = asyncio.create_task(gates[1].enter(1, None))
    await asyncio.sleep(0.02)
    assert not back.done()
    gates[0].leave(None)
    await asyncio.wait_for(back, 10)
    assert (gates[0].inflight, gates[1].inflight, node.executing) == (0, 2, 2)


def test_reset_worker_frees_the_slots_a_dead_worker_held_and_only_its_own(share: NodeShare, other: NodeShare) -> None:
    mine, theirs = NodeSlots(share, "m"), NodeSlots(other, "m")
    assert [mine.try_take(3), theirs.try_take(3), theirs.try_take(3), mine.try_take(3)] == [True, True, True, False]
    share.reset_worker(1)  # worker 1 died without leaving
    assert mine.executing == 1
    assert [mine.try_take(3), mine.try_take(3), theirs.try_take(3)] == [True, True, False]
    with pytest.raises(NodeShareError, match=r"cannot reset worker 5 .* workers are 0 to 1"):
        share.reset_worker(5)


@contextmanager
def _worker(share: NodeShare, worker: int, burst: int = 1) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(share.path), str(worker), str(burst)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert _ask(child, None) == "ready"
        yield child
    finally:
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def _ask(child: subprocess.Popen[str], command: str | None) -> str:
    assert child.stdin is not None
    assert child.stdout is not None
    if command is not None:
        child.stdin.write(command + "\n")
        child.stdin.flush()
    return child.stdout.readline().strip()


@pytest.mark.slow
def test_two_processes_draining_one_bucket_get_exactly_its_burst(folder: Path) -> None:
    share = NodeShare.create(folder / "share", workers=2)
    try:
        with _worker(share, 0, burst=30000) as first, _worker(share, 1, burst=30000) as second:
            for child in (first, second):  # both start before either answers: they take at the same time
                assert child.stdin is not None
                child.stdin.write("tokens 30000\n")
                child.stdin.flush()
            counts = [int(_ask(child, None)) for child in (first, second)]
        assert sum(counts) == 30000  # the clock stands still: no refill, so any lost update would show
    finally:
        share.close()


@pytest.mark.slow
async def test_waiter_enters_when_another_process_leaves_and_when_a_killed_ones_slots_are_reset(
    share: NodeShare,
) -> None:
    gate = ModelGate("m", 1, 4, node=NodeSlots(share, "m"))
    with _worker(share, 1) as child:
        assert _ask(child, "take 1") == "True"
        waiting = asyncio.create_task(gate.enter(1, None))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        assert _ask(child, "leave 1") == "ok"
        await asyncio.wait_for(waiting, 10)
        assert _ask(child, "take 1") == "False"  # worker 0 holds the node's only slot now

        gate.leave(None)
        assert _ask(child, "take 1") == "True"
        waiting = asyncio.create_task(gate.enter(1, None))
        os.kill(child.pid, signal.SIGKILL)  # dies holding the slot
        child.wait()
        await asyncio.sleep(0.02)
        assert not waiting.done()  # nobody frees it...
        share.reset_worker(1)  # ...until the supervisor resets the dead worker
        await asyncio.wait_for(waiting, 10)
        assert gate.inflight == 1


def _write_at(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(data)


def test_far_from_the_limit_a_worker_takes_slots_from_a_small_reserve_and_the_node_never_passes_the_limit(
    share: NodeShare, other: NodeShare
) -> None:
    """A worker claims a few slots under the lock and serves the next takes from them; the node's cells never pass
    the limit, what the workers run together falls short of it by one reserve at most, and a worker with nothing
    left executing gives its reserve back whole."""
    mine, theirs = NodeSlots(share, "m"), NodeSlots(other, "m")
    index = share.slot("gate:m")
    assert mine.try_take(64)
    assert (share.executing(index), mine.executing) == (NodeSlots.BLOCK, 1)  # a block claimed, one slot used
    assert all(mine.try_take(64) for _ in range(NodeSlots.BLOCK - 1))
    assert share.executing(index) == NodeSlots.BLOCK  # served from the reserve: nothing more claimed

    in_use = [NodeSlots.BLOCK, 0]
    while mine.try_take(64) if in_use[0] < 40 else False:
        in_use[0] += 1
    while theirs.try_take(64):
        in_use[1] += 1
    assert share.executing(index) <= 64
    assert 64 - NodeSlots.BLOCK <= sum(in_use) <= 64
    theirs.give_back(64, idle=False)  # the node is near its limit: what they do not use goes back at once
    assert theirs.executing == share.executing(index)  # no reserve of theirs counted any more
    for left in range(in_use[1] - 2, -1, -1):
        theirs.give_back(64, idle=left == 0)
    for left in range(in_use[0] - 1, -1, -1):
        mine.give_back(64, idle=left == 0)
    assert share.executing(index) == 0
