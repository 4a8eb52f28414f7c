"""Content codings on the inference routes (docs/protocol.md, "Compressed bodies"): a request body sent with
``Content-Encoding: gzip`` or ``deflate`` is inflated as it arrives and never past ``max_body_bytes``, and an answer
is compressed when ``Accept-Encoding`` asks for one of them. The lane calls in only when a request carries one of
those headers: an uncompressed exchange never reaches this module."""

from __future__ import annotations

import zlib

from services.gateway.errors import InvalidInput, PayloadTooLarge

GZIP, DEFLATE = "gzip", "deflate"
SUPPORTED = "gzip, deflate"
"""What the gateway inflates and compresses, as the ``Accept-Encoding`` of a 415 names it."""
LEVEL = 1
"""zlib's fastest level: tensor data (floats, mostly) shrinks little more at higher levels, for several times the
CPU; a client that asks for compression wants fewer bytes, not a slower answer."""
MIN_COMPRESSED_BYTES = 1024
"""Answers shorter than this go out as they are: the coding's framing and zlib's set-up cost more than they save
(Starlette's GZipMiddleware and nginx skip small bodies alike). httpx and requests ask for gzip on every call."""
_GZIP_WBITS, _ZLIB_WBITS, _RAW_WBITS = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS
_REQUEST_CODINGS = {"gzip": GZIP, "x-gzip": GZIP, "deflate": DEFLATE}
"""``Content-Encoding`` names (RFC 9110 section 8.4.1; ``x-gzip`` is gzip's old alias) to the coding."""


def unsupported(name: str) -> InvalidInput:
    # 415, as Triton answers and as RFC 7694 prescribes, with the supported codings in Accept-Encoding: the body is
    # well formed HTTP in a coding this server does not read (not 501, which says the method is not implemented).
    return InvalidInput(
        f"unsupported Content-Encoding {name[:40]!r}; expected one of: {SUPPORTED} (or identity)",
        415,
        headers={"Accept-Encoding": SUPPORTED},
    )


def inflater_for(content_encoding: bytes, limit: int) -> Inflater | None:
    """The inflater for a request's ``Content-Encoding`` (``None``: identity, the body is read as it is); 415 for a
    coding the gateway does not read, or a list of several."""
    name = content_encoding.decode("latin-1").strip().lower()
    if name in ("", "identity"):
        return None
    coding = _REQUEST_CODINGS.get(name)
    if coding is None:
        raise unsupported(name)
    return Inflater(coding, limit)


MAX_GZIP_MEMBERS = 1024
"""Gzip members one body may hold: a client compresses a body as one, or joins a few compressed parts."""


class Inflater:
    """Inflates a compressed body piece by piece, never holding more than ``limit + 1`` inflated bytes: a few
    compressed kilobytes that would inflate to gigabytes are refused (413) as soon as they pass the limit.

    ``deflate`` is RFC 9110's zlib stream (RFC 1950; what tritonclient and curl send); a raw deflate stream (RFC
    1951, what some clients send under the same name) is told apart by its first two bytes: a zlib header's first
    byte has method 8 in its low bits, which a raw stream's first block header (a compressed block type, or a stored
    block padded with zero bits) does not have. ``gzip`` may hold several members one after the other (RFC 1952), up
    to ``MAX_GZIP_MEMBERS``: each costs a fresh inflater and a copy of what follows it, so a body of thousands of
    empty members would cost seconds of CPU while inflating to nothing."""

    __slots__ = ("coding", "_limit", "_inflate", "_lead", "_body", "_members")

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self._limit = limit
        self._inflate = zlib.decompressobj(_GZIP_WBITS) if coding == GZIP else None  # deflate: on the first bytes
        self._lead = b""
        """A deflate body's first byte while the second is awaited (its framing needs both)."""
        self._body = bytearray()
        self._members = 1

    def feed(self, data: bytes) -> None:
        inflate = self._inflate
        if inflate is None:
            data = self._lead + data
            if len(data) < 2:
                self._lead = data
                return
            self._lead = b""
            inflate = self._inflate = zlib.decompressobj(_ZLIB_WBITS if _zlib_header(data) else _RAW_WBITS)
        try:
            while data:
                if inflate.eof:
                    if self.coding != GZIP:
                        raise InvalidInput(f"request body has bytes after the end of its {self.coding} data")
                    self._members += 1
                    if self._members > MAX_GZIP_MEMBERS:
                        raise InvalidInput(
                            f"request body has more than {MAX_GZIP_MEMBERS} gzip members (Content-Encoding: gzip): "
                            "send it as one gzip stream"
                        )
                    inflate = self._inflate = zlib.decompressobj(_GZIP_WBITS)  # the next member
                room = self._limit + 1 - len(self._body)  # never 0 (max_length 0 would mean unbounded)
                self._body += inflate.decompress(data, room)
                if len(self._body) > self._limit:
                    raise PayloadTooLarge(
                        f"decompressed request body exceeds the {self._limit} byte limit "
                        f"(Content-Encoding: {self.coding})"
                    )
                data = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
        except zlib.error as exc:
            message = f"request body is not valid {self.coding} data (Content-Encoding: {self.coding}): {exc}"
            raise InvalidInput(message) from exc

    def finish(self) -> bytes:
        """The inflated body; 400 when the compressed data stopped before its end."""
        if self._inflate is None or not self._inflate.eof:
            raise InvalidInput(
                f"request body ends before its {self.coding} data does (Content-Encoding: {self.coding}): "
                "the compressed body is cut off"
            )
        return bytes(self._body)


def _zlib_header(data: bytes) -> bool:
    """RFC 1950's two header bytes: method 8 (deflate), a window of at most 32 KiB, and the check bits."""
    return data[0] & 0x0F == 8 and data[0] >> 4 <= 7 and (data[0] << 8 | data[1]) % 31 == 0


def answer_coding(accept_encoding: bytes) -> str | None:
    """The coding to compress an answer with for this ``Accept-Encoding``, ``None`` for none. The highest q-value
    wins, gzip before deflate on a tie; ``*`` stands for a coding not named; ``identity`` named with a higher q
    than both, or q=0 for both, leaves the answer as it is. Clients send few distinct values: each is parsed once."""
    coding = _ANSWER_CODINGS.get(accept_encoding, _UNPARSED)
    if coding is _UNPARSED:
        coding = _parse_accept(accept_encoding.decode("latin-1"))
        if len(accept_encoding) <= ACCEPT_CACHED_LENGTH:
            if len(_ANSWER_CODINGS) >= ACCEPT_CACHED:  # a client may invent values without end: bounded memory
                _ANSWER_CODINGS.clear()
            _ANSWER_CODINGS[accept_encoding] = coding
    return coding


ACCEPT_CACHED = 64
ACCEPT_CACHED_LENGTH = 128
_UNPARSED = "?"
_ANSWER_CODINGS: dict[bytes, str | None] = {}


def _parse_accept(value: str) -> str | None:
    weights: dict[str, float] = {}
    for item in value.split(","):
        name, _, params = item.partition(";")
        name = name.strip().lower()
        if name:
            weights[name] = _weight(params)
    star = weights.get("*", 0.0)
    gzip = weights.get("gzip", weights.get("x-gzip", star))
    deflate = weights.get("deflate", star)
    coding, weight = (GZIP, gzip) if gzip >= deflate else (DEFLATE, deflate)
    if weight <= 0 or weights.get("identity", 0.0) > weight:
        return None
    return coding


def _weight(params: str) -> float:
    """The q-value among ``params`` (1 when absent); a malformed one counts as 0: not acceptable."""
    for param in params.split(";"):
        key, _, text = param.partition("=")
        if key.strip().lower() == "q":
            try:
                weight = float(text.strip())
            except ValueError:
                return 0.0
            return weight if 0.0 <= weight <= 1.0 else 0.0
        # Other parameters of a coding mean nothing for gzip and deflate.
    return 1.0


def compress(content: bytes, coding: str) -> bytes:
    """``content`` in ``coding``; ``deflate`` is the zlib stream, as tritonclient inflates it."""
    return zlib.compress(content, LEVEL, wbits=_GZIP_WBITS if coding == GZIP else _ZLIB_WBITS)


_VARY = (b"vary", b"accept-encoding")
_AS_IS = (_VARY,)
"""An answer's extra headers when the client sent ``Accept-Encoding``: the answer depends on it, compressed or not."""
_CODED = {coding: ((b"content-encoding", coding.encode()), _VARY) for coding in (GZIP, DEFLATE)}


def encode_answer(content: bytes, accept_encoding: bytes) -> tuple[bytes, tuple[tuple[bytes, bytes], ...]]:
    """The answer's body for a client that sent ``Accept-Encoding``, and the headers that say how it is coded."""
    coding = answer_coding(accept_encoding)
    if coding is None or len(content) < MIN_COMPRESSED_BYTES:
        return content, _AS_IS
    return compress(content, coding), _CODED[coding]
