"""A lean HTTP/1.1 load client for overload tests: pre-built request bytes over a pool of keep-alive connections,
parsing only the status line and Content-Length. httpx spends about a millisecond of CPU per request, enough on a
2-core machine to make the client, not the gateway, the thing under test."""

from __future__ import annotations

import asyncio
import time


class RawHttpPool:
    def __init__(self, host: str, port: int, max_connections: int = 256) -> None:
        self._host, self._port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(max_connections)

    @staticmethod
    def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        lines = [
            f"POST {path} HTTP/1.1",
            "Host: gateway",
            f"Content-Length: {len(body)}",
            "Content-Type: application/json",
        ]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def send(self, request: bytes) -> tuple[int, float]:
        """The answer's status and the seconds from sending to the whole answer read (waiting for a free
        connection counts: that is the client's queue)."""
        started = time.perf_counter()
        async with self._slots:
            if self._idle:
                reader, writer = self._idle.pop()
            else:
                reader, writer = await asyncio.open_connection(self._host, self._port)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            keep = True
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                lowered = name.strip().lower()
                if lowered == b"content-length":
                    length = int(value)
                elif lowered == b"connection" and value.strip().lower() == b"close":
                    keep = False
            await reader.readexactly(length)
            if keep:
                self._idle.append((reader, writer))
            else:
                writer.close()
        return status, time.perf_counter() - started

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
