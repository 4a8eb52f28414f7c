"""The head of an inference answer, built from constants and integers: the direct answer (``direct``) writes it as
bytes in one go, any other server iterates its ``(name, value)`` pairs. The lane builds it; ``direct`` writes it."""

from __future__ import annotations

from collections.abc import Iterator


class AnswerHeaders:
    """An inference answer's own headers, from constants and integers, with a ``content-length`` that is its body's:
    the direct answer writes ``rendered()`` as it is; any other server iterates the ``(name, value)`` pairs."""

    __slots__ = ("length", "version", "header_length", "extra")

    def __init__(
        self, length: int, version: int, header_length: int | None, extra: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        self.length = length
        self.version = version
        self.header_length = header_length
        """The JSON part's length when binary outputs follow it (``None``: the body is all JSON); in a compressed
        answer, the length before compression (what tritonclient splits the inflated body at, as with Triton)."""
        self.extra = extra
        """Constant headers beyond these, when the client sent ``Accept-Encoding``: the answer's coding, ``Vary``."""

    def rendered(self) -> bytes:
        if self.header_length is None:
            head = _JSON_HEAD % (self.length, self.version)
        else:
            head = _BINARY_HEAD % (self.length, self.version, self.header_length)
        if self.extra:
            return head + b"".join([name + b": " + value + b"\r\n" for name, value in self.extra])
        return head

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        header_length = self.header_length
        yield b"content-type", b"application/json" if header_length is None else b"application/octet-stream"
        yield b"content-length", b"%d" % self.length
        yield b"x-model-version", b"%d" % self.version
        if header_length is not None:
            yield b"inference-header-content-length", b"%d" % header_length
        yield from self.extra


_JSON_HEAD = b"content-type: application/json\r\ncontent-length: %d\r\nx-model-version: %d\r\n"
_BINARY_HEAD = (
    b"content-type: application/octet-stream\r\ncontent-length: %d\r\nx-model-version: %d\r\n"
    b"inference-header-content-length: %d\r\n"
)
