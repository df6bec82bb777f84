"""The per-name locks the cloud providers make their creates idempotent with: one caller of a
name at a time, names independent of each other, and nothing kept for a name nobody uses."""

from __future__ import annotations

import asyncio

import pytest

from services.providers.cloud.names import NameLocks


async def hold(locks: NameLocks, name: str, entered: asyncio.Event, release: asyncio.Event) -> None:
    async with locks.held(name):
        entered.set()
        await release.wait()


async def holding(locks: NameLocks, name: str) -> tuple[asyncio.Task[None], asyncio.Event]:
    """A task inside ``locks.held(name)`` until the event returned with it is set."""
    entered, release = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(hold(locks, name, entered, release))
    await entered.wait()
    return task, release


async def test_one_name_is_held_by_one_caller_at_a_time() -> None:
    locks = NameLocks()
    inside: list[int] = []
    most = 0

    async def caller(n: int) -> None:
        nonlocal most
        async with locks.held("px-a"):
            inside.append(n)
            most = max(most, len(inside))
            for _ in range(3):
                await asyncio.sleep(0)  # give every other caller the chance to enter
            inside.remove(n)

    await asyncio.gather(*(caller(n) for n in range(5)))
    assert most == 1
    assert dict(locks) == {}


async def test_two_names_are_held_at_once() -> None:
    locks = NameLocks()
    a_inside, b_inside = asyncio.Event(), asyncio.Event()

    async def caller(mine: asyncio.Event, other: asyncio.Event, name: str) -> None:
        async with locks.held(name):
            mine.set()
            await other.wait()  # a lock shared by both names would never get here

    await asyncio.wait_for(
        asyncio.gather(caller(a_inside, b_inside, "px-a"), caller(b_inside, a_inside, "px-b")),
        timeout=10,
    )
    assert len(locks) == 0


async def test_a_name_is_counted_while_held_or_awaited_and_forgotten_after() -> None:
    locks = NameLocks()
    first, release = await holding(locks, "px-a")
    entered, release_second = asyncio.Event(), asyncio.Event()
    second = asyncio.create_task(hold(locks, "px-a", entered, release_second))
    await asyncio.sleep(0)  # the new task runs up to its wait for the lock
    assert dict(locks) == {"px-a": 2}
    assert "px-b" not in locks
    assert not entered.is_set()
    release.set()
    await first
    await entered.wait()  # the second caller enters once the first has left
    assert dict(locks) == {"px-a": 1}
    release_second.set()
    await second
    assert dict(locks) == {}
    assert "px-a" not in locks
    assert repr(locks) == "NameLocks({})"


async def test_many_names_leave_nothing_behind() -> None:
    locks = NameLocks()

    async def caller(name: str) -> None:
        async with locks.held(name):
            await asyncio.sleep(0)

    await asyncio.gather(*(caller(f"px-{n % 7}") for n in range(100)))
    assert len(locks) == 0


async def test_a_cancelled_waiter_neither_blocks_the_name_nor_stays_counted() -> None:
    locks = NameLocks()

    async def waiter() -> None:
        async with locks.held("px-a"):
            pytest.fail("a cancelled waiter ran its block")

    first, release = await holding(locks, "px-a")
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the new task runs up to its wait for the lock
    assert dict(locks) == {"px-a": 2}
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert dict(locks) == {"px-a": 1}
    release.set()
    await first
    assert dict(locks) == {}
    async with locks.held("px-a"):  # the name is free again
        assert dict(locks) == {"px-a": 1}
    assert dict(locks) == {}


async def test_a_waiter_cancelled_as_the_lock_frees_is_still_forgotten() -> None:
    locks = NameLocks()

    async def waiter() -> None:
        async with locks.held("px-a"):
            await asyncio.sleep(0)

    first, release = await holding(locks, "px-a")
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the new task runs up to its wait for the lock
    assert dict(locks) == {"px-a": 2}
    release.set()
    await first
    waiting.cancel()  # woken to take the lock, cancelled before it runs
    await asyncio.gather(waiting, return_exceptions=True)
    assert dict(locks) == {}
    async with locks.held("px-a"):
        pass
    assert dict(locks) == {}


async def test_an_exception_in_the_block_releases_and_forgets_the_name() -> None:
    locks = NameLocks()

    async def failing() -> None:
        async with locks.held("px-a"):
            assert dict(locks) == {"px-a": 1}
            raise RuntimeError("create failed")

    with pytest.raises(RuntimeError, match="create failed"):
        await failing()
    assert dict(locks) == {}
    async with locks.held("px-a"):  # not left locked
        assert locks["px-a"] == 1
    with pytest.raises(KeyError):
        locks["px-a"]
