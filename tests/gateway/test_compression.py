"""The content codings of the inference routes, without a server: which coding an ``Accept-Encoding`` picks, and the
inflater's limit, framings and refusals, fed piece by piece as a body arrives."""

from __future__ import annotations

import gzip
import zlib

import pytest

from services.gateway.errors import GatewayError
from services.gateway.rest import compression
from services.gateway.rest.compression import answer_coding, encode_answer, inflater_for


def _gzip(data: bytes) -> bytes:
    """gzip with a fixed mtime: parameters built from these bytes name the tests, and every xdist worker must
    collect the same names (the header's default mtime is the current second)."""
    return gzip.compress(data, mtime=0)


BODY = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}' * 40


def _inflate(coding: str, data: bytes, limit: int, piece: int) -> bytes:
    inflater = inflater_for(coding.encode(), limit)
    assert inflater is not None
    for start in range(0, len(data), piece):
        inflater.feed(data[start : start + piece])
    return inflater.finish()


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
@pytest.mark.parametrize(
    ("coding", "data"),
    [("gzip", _gzip(BODY)), ("x-gzip", _gzip(BODY)), ("deflate", zlib.compress(BODY)),
     ("deflate", _raw_deflate(BODY)), ("gzip", _gzip(BODY[:10]) + _gzip(BODY[10:]))],
    ids=["gzip", "x-gzip", "zlib", "raw-deflate", "gzip-members"],
)  # fmt: skip
def test_inflater_gives_the_body_back_when_it_arrives_in_any_pieces(coding: str, data: bytes, piece: int) -> None:
    assert _inflate(coding, data, len(BODY), piece) == BODY


@pytest.mark.parametrize("piece", [1, 1 << 20])
def test_inflater_answers_413_when_the_inflated_body_passes_the_limit_by_one_byte(piece: int) -> None:
    with pytest.raises(GatewayError) as refused:
        _inflate("gzip", _gzip(BODY), len(BODY) - 1, piece)
    assert refused.value.status == 413
    limit = len(BODY) - 1
    assert str(refused.value) == f"decompressed request body exceeds the {limit} byte limit (Content-Encoding: gzip)"


@pytest.mark.parametrize(
    ("coding", "data", "expected"),
    [("gzip", b"", "ends before its gzip data does"), ("deflate", b"x", "ends before its deflate data does"),
     ("gzip", _gzip(BODY)[:-1], "ends before its gzip data does"),
     ("gzip", _gzip(BODY) + b"junk", "not valid gzip data"),
     ("deflate", zlib.compress(BODY) + b"junk", "bytes after the end of its deflate data"),
     ("deflate", b"\x78\x9c\xff\xff\xff", "not valid deflate data")],
)  # fmt: skip
def test_inflater_answers_400_naming_the_coding_when_the_data_is_not_whole(
    coding: str, data: bytes, expected: str
) -> None:
    with pytest.raises(GatewayError) as refused:
        _inflate(coding, data, 1 << 20, 3)
    assert refused.value.status == 400
    assert expected in str(refused.value)


@pytest.mark.parametrize("header", [b"br", b"gzip, br", b"compress", b"gzip, gzip"])
def test_content_encoding_answers_415_naming_it_when_the_gateway_does_not_read_it(header: bytes) -> None:
    with pytest.raises(GatewayError) as refused:
        inflater_for(header, 100)
    assert refused.value.status == 415
    assert repr(header.decode()) in str(refused.value)
    assert refused.value.headers == {"Accept-Encoding": "gzip, deflate"}


@pytest.mark.parametrize("header", [b"identity", b"", b" Identity "])
def test_content_encoding_reads_the_body_as_it_is_when_it_names_identity(header: bytes) -> None:
    assert inflater_for(header, 100) is None


@pytest.mark.parametrize(
    ("accept", "coding"),
    [("gzip, deflate", "gzip"), ("deflate, gzip", "gzip"), ("deflate", "deflate"), ("GZip ; Q=1.0", "gzip"),
     ("x-gzip", "gzip"), ("*", "gzip"), ("gzip;q=0, *", "deflate"), ("deflate;q=0.9, gzip;q=0.8", "deflate"),
     ("gzip;q=0.5, identity", None), ("identity", None), ("*;q=0", None), ("gzip;q=0, deflate;q=0", None),
     ("br, zstd", None), ("gzip;q=abc", None), ("gzip;q=2", None), ("", None)],
)  # fmt: skip
def test_answer_coding_takes_the_highest_q_value_when_accept_encoding_names_several(
    accept: str, coding: str | None
) -> None:
    assert answer_coding(accept.encode()) == coding


def test_answer_coding_remembers_a_bounded_number_of_values_when_clients_invent_them() -> None:
    for n in range(3 * compression.ACCEPT_CACHED):
        assert answer_coding(f"gzip;q=0.{n % 9 + 1}, x-{n}".encode()) == "gzip"
        assert len(compression._ANSWER_CODINGS) <= compression.ACCEPT_CACHED
    long = b"gzip, " + b"x" * compression.ACCEPT_CACHED_LENGTH
    assert answer_coding(long) == "gzip"
    assert long not in compression._ANSWER_CODINGS


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_encode_answer_compresses_and_says_so_when_the_answer_is_large_enough(coding: str) -> None:
    content, headers = encode_answer(BODY, coding.encode())
    assert (gzip.decompress(content) if coding == "gzip" else zlib.decompress(content)) == BODY
    assert headers == ((b"content-encoding", coding.encode()), (b"vary", b"accept-encoding"))


def test_encode_answer_leaves_small_answers_as_they_are_when_compression_would_not_pay() -> None:
    small = BODY[: compression.MIN_COMPRESSED_BYTES - 1]
    assert encode_answer(small, b"gzip") == (small, ((b"vary", b"accept-encoding"),))
    assert encode_answer(BODY, b"identity") == (BODY, ((b"vary", b"accept-encoding"),))


@pytest.mark.parametrize("piece", [20, 1 << 20])
def test_inflater_answers_400_when_a_gzip_body_holds_more_members_than_any_client_sends(piece: int) -> None:
    """Thousands of empty members inflate to nothing yet cost a fresh inflater each: refused at the bound, before the
    CPU is spent on them all."""
    empty = _gzip(b"")
    members = compression.MAX_GZIP_MEMBERS
    assert _inflate("gzip", empty * (members - 1) + _gzip(BODY), len(BODY), piece) == BODY  # at the bound: served
    with pytest.raises(GatewayError) as refused:
        _inflate("gzip", empty * 100_000, 1 << 20, piece)
    assert refused.value.status == 400
    assert str(refused.value) == (
        f"request body has more than {members} gzip members (Content-Encoding: gzip): send it as one gzip stream"
    )
