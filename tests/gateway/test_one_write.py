"""OneWrite: an answer's head and body leave in one write; a head whose body comes later still leaves this turn."""

from __future__ import annotations

import asyncio

from services.gateway.rest.one_write import COPY_BELOW, OneWrite


class Wire:
    """Records what reaches the transport (the thing under test only wraps one)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: tuple[bytes, ...]) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_one_write_sends_head_and_body_together_when_both_come_in_one_turn() -> None:
    wire = Wire()
    writer = OneWrite(wire, asyncio.get_running_loop())  # type: ignore[arg-type]
    writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
    writer.write(b"body")
    writer.write(b"more")
    await asyncio.sleep(0)
    assert wire.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]


async def test_one_write_flushes_the_head_at_the_end_of_the_turn_when_the_body_comes_later() -> None:
    wire = Wire()
    writer = OneWrite(wire, asyncio.get_running_loop())  # type: ignore[arg-type]
    writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
    await asyncio.sleep(0)
    assert wire.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    writer.write(b"event: 1\n\n")
    assert wire.writes[-1] == b"event: 1\n\n"


async def test_one_write_sends_big_bodies_without_joining_when_over_the_copy_bound() -> None:
    wire = Wire()
    writer = OneWrite(wire, asyncio.get_running_loop())  # type: ignore[arg-type]
    writer.write(b"head")
    writer.write(b"x" * (COPY_BELOW + 1))
    assert wire.writes == [b"head" + b"x" * (COPY_BELOW + 1)]


async def test_one_write_flushes_the_head_before_closing_when_the_app_gives_up() -> None:
    wire = Wire()
    writer = OneWrite(wire, asyncio.get_running_loop())  # type: ignore[arg-type]
    writer.write(b"head")
    writer.close()
    assert (wire.writes, wire.closed) == ([b"head"], True)
