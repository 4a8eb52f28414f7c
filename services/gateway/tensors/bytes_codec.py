"""BYTES tensors: the gateway holds them as numpy object arrays of ``bytes`` (what tritonclient's ``as_numpy``
returns for them); this module reads and writes their wire forms.

Triton's serialized form, used by the binary tensor extension, ``raw_input_contents`` / ``raw_output_contents`` and
``model_warmup`` data files, is each element in row-major order as a 4-byte little-endian length and then its
bytes. In JSON an element is a string (its UTF-8 bytes); an output whose bytes are not all UTF-8 cannot be a JSON
string, so the REST codec sends it as binary data. Elements are bytes, not text: whether they must be UTF-8 is the
model's business (onnxruntime's string tensors, TorchScript's ``str``), checked where the model runs.

No element bound beyond the protocol's own: a request's elements are bounded by ``max_body_bytes`` (HTTP) and the
gRPC message limit, and any tighter limit would be arbitrary for text models; an output element must fit its 4-byte
length (``MAX_ELEMENT_BYTES``)."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from services.gateway.errors import InferenceFailed, InvalidInput

BYTES = "BYTES"
OBJECT = np.dtype(np.object_)
MAX_ELEMENT_BYTES = 2**32 - 1
"""The most a 4-byte length prefix can say."""
_LENGTH = struct.Struct("<I")
_PREFIX = _LENGTH.size
_NO_BUFFER_FORMAT = "OV"
"""The kinds a memoryview cannot take as they are: BYTES' objects, and bfloat16's (``datatypes.BF16_DTYPE``)."""

Array = npt.NDArray[Any]


def is_bytes(array: Array) -> bool:
    return array.dtype == OBJECT


def deserialize(raw: bytes | memoryview, shape: tuple[int, ...], tensor: str, *, kind: str = "input") -> Array:
    """The elements of a serialized tensor, which must hold exactly ``prod(shape)`` of them; a length prefix cut
    off, one that runs past the data or bytes left over are the sender's error, named with their byte offset
    (counted from the start of this tensor's data). ``kind``: ``input`` or ``output``, for the messages."""
    view = memoryview(raw).cast("B")
    size = len(view)
    count = math.prod(shape)
    values: list[bytes] = []
    offset = 0
    unpack = _LENGTH.unpack_from
    for index in range(count):  # ends early when the data does: a huge shape costs nothing
        if offset + _PREFIX > size:
            if offset == size:
                raise InvalidInput(
                    f"{kind} '{tensor}': shape {list(shape)} needs {count} strings, the data ends after {index} "
                    f"(at byte {offset})"
                )
            raise InvalidInput(
                f"{kind} '{tensor}': string {index}'s 4-byte length prefix at byte {offset} is cut off: only "
                f"{size - offset} byte(s) remain"
            )
        (length,) = unpack(view, offset)
        start = offset + _PREFIX
        if start + length > size:
            raise InvalidInput(
                f"{kind} '{tensor}': string {index}'s length prefix at byte {offset} says {length} bytes, only "
                f"{size - start} remain"
            )
        values.append(bytes(view[start : start + length]))
        offset = start + length
    if offset != size:
        raise InvalidInput(
            f"{kind} '{tensor}': shape {list(shape)} needs {count} strings, {size - offset} byte(s) remain after the "
            f"last one (at byte {offset})"
        )
    return _reshaped(from_list(values), shape, f"{kind} '{tensor}'")


def from_binary(body: bytes, offset: int, size: int, shape: tuple[int, ...], tensor: str) -> Array:
    """An input sent as binary tensor data: ``size`` (its ``binary_data_size``) bytes of ``body`` from ``offset``."""
    if size < 0:
        raise InvalidInput(f"input '{tensor}': binary_data_size must be a non-negative integer, got {size}")
    if offset + size > len(body):
        raise InvalidInput(f"input '{tensor}': binary_data_size {size} runs past the end of the body")
    return deserialize(memoryview(body)[offset : offset + size], shape, tensor)


def from_list(values: Sequence[bytes]) -> Array:
    """A 1-D object array holding ``values`` (numpy never splits ``bytes`` into items)."""
    return np.asarray(values, dtype=OBJECT).reshape(len(values))


def from_strings(values: Sequence[str]) -> Array:
    """JSON strings as their UTF-8 bytes (orjson refuses lone surrogates, so every string encodes)."""
    return from_list([value.encode() for value in values])


def filled(shape: Sequence[int]) -> Array:
    """Empty strings: the BYTES counterpart of zeros (Triton's ``zero_data`` warm-up reads the same way)."""
    return np.full(tuple(shape), b"", dtype=OBJECT)


def serialize(array: Array) -> bytes:
    """Triton's serialized form of a BYTES array, elements in row-major order."""
    pack = _LENGTH.pack
    parts: list[bytes] = []
    for index, value in enumerate(np.asarray(array, dtype=OBJECT).reshape(-1).tolist()):
        if type(value) is not bytes:  # the backends hand over bytes; anything else would be written wrong
            raise InferenceFailed(f"BYTES element {index} is a {type(value).__name__}, not bytes")
        if len(value) > MAX_ELEMENT_BYTES:
            raise InferenceFailed(f"BYTES element {index} has {len(value)} bytes; a 4-byte length allows at most 4 GiB")
        parts.append(pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def text(array: Array) -> list[str] | None:
    """The elements decoded as UTF-8 in row-major order (how JSON carries them), or None when one is not UTF-8."""
    try:
        return [value.decode() for value in array.reshape(-1).tolist()]
    except UnicodeDecodeError:
        return None


def has_json_form(array: Array) -> bool:
    """False for a BYTES array with an element that is not UTF-8: JSON strings cannot carry it."""
    return not is_bytes(array) or text(array) is not None


def decoded(array: Array, tensor: str, reason: str) -> Array:
    """The elements as ``str`` (same shape) for a runtime that takes text; an element that is not UTF-8 is the
    client's error, named by its row-major index. ``reason`` says which runtime needs text."""
    flat = array.reshape(-1).tolist()
    strings: list[str] = []
    for index, value in enumerate(flat):
        try:
            strings.append(value.decode())
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"input '{tensor}': string {index} is not valid UTF-8 ({exc.reason} at byte {exc.start}); {reason}"
            ) from None
    result = np.empty(len(strings), dtype=OBJECT)
    result[:] = strings
    return result.reshape(array.shape)


def encoded(array: Array, output: str) -> Array:
    """A runtime's string output (``str`` elements, or ``bytes``) as the gateway's object array of bytes."""
    flat = np.asarray(array, dtype=OBJECT).reshape(-1).tolist()
    try:
        values = [value if type(value) is bytes else value.encode() for value in flat]
    except (AttributeError, UnicodeEncodeError) as exc:
        raise InferenceFailed(f"output '{output}' is declared BYTES but holds something else: {exc}") from None
    return from_list(values).reshape(np.shape(array))


def differing(new: Array, old: Array) -> int:
    """How many elements of two BYTES arrays of one shape differ (strings have no numeric distance)."""
    return int(np.count_nonzero(new.reshape(-1) != old.reshape(-1)))


def _reshaped(data: Array, shape: tuple[int, ...], what: str) -> Array:
    try:
        return data.reshape(shape)
    except ValueError:  # a 0 dim beside dims that multiply past what numpy can index
        raise InvalidInput(f"{what}: shape {list(shape)} is too large") from None


def as_bytes(array: Array) -> memoryview:
    """The array's bytes without a copy when it is already C-contiguous; a BYTES array's serialized form."""
    if array.dtype.kind in _NO_BUFFER_FORMAT:
        if is_bytes(array):
            return memoryview(serialize(array))
        # bfloat16: numpy's buffer protocol has no format code for it, its bit patterns as uint16 are the same bytes
        return np.ascontiguousarray(array).view(np.uint16).data.cast("B")
    return np.ascontiguousarray(array).data.cast("B")


def raw_bytes(array: Array) -> bytes:
    """The array's bytes as a new ``bytes`` (what protobuf's bytes fields take); a BYTES array's serialized form."""
    return serialize(array) if is_bytes(array) else np.ascontiguousarray(array).tobytes()
