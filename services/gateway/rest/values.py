"""JSON tensor data <-> numpy for the REST codec: the rules for an input's ``data`` and an output's.

JSON has no literals for NaN and the infinities. As in the proto3 JSON mapping, float tensors accept the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` as values and responses spell non-finite outputs the same way
(``numpy.array(["NaN", 1.0], dtype=np.float32)`` reads them, so ``tritonclient.http``'s ``as_numpy`` does).
Every other check is strict where numpy would coerce silently: no bools outside BOOL tensors and no numbers in
them, no floats in integer tensors (not even 1.0: the rule is the JSON type, as numpy would truncate 1.5), no number
outside its datatype's range (FP32 1e39 is refused, not made inf), no strings besides the three above. BYTES data
are strings and nothing else (their UTF-8 bytes are the elements)."""

from __future__ import annotations

import math
import struct
from itertools import chain
from typing import Any

import numpy as np
import orjson

from services.gateway.errors import InvalidInput
from services.gateway.tensors.bytes_codec import OBJECT, from_strings, text
from services.gateway.tensors.datatypes import BF16_DTYPE, check_range, narrow, shaped
from services.gateway.tensors.types import Array

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
SHOWN = 40
"""How much of a client's JSON value an error message repeats."""
_NUMBERS = frozenset({float, int})
_INTEGERS = frozenset({int})
_BOOLS = frozenset({bool})
_STRINGS = frozenset({str})
_FP32 = np.dtype(np.float32)
_FP32_MAX = float(np.finfo(np.float32).max)
_FP32_EDGES = (struct.pack("=f", _FP32_MAX), struct.pack("=f", -_FP32_MAX))
PACKED_MAX = 4096
"""Most values packed with ``struct`` (an argument each); longer data goes through numpy."""
_PACKERS: dict[int, struct.Struct] = {}
_FLOAT_WORDS = 'numbers (or "NaN", "Infinity", "-Infinity")'
_FLOAT_KINDS = "fV"
"""The floats' kind and bfloat16's (``BF16_DTYPE``; no other dtype of kind V reaches the codecs): one test for both."""


def from_json(data: object, shape: tuple[int, ...], dtype: np.dtype[Any], datatype: str, tensor: str) -> Array:
    """An input's ``data`` as an array of ``dtype`` and ``shape``; the nesting may follow the shape or not (Triton
    reads the values in order either way)."""
    values, kinds = _flat(data, tensor)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(f"input '{tensor}': shape {list(shape)} needs {count} values, got {len(values)}")
    return shaped(_converted(values, kinds, dtype, datatype, tensor), shape, tensor)


_NATIVE = frozenset(
    np.dtype(t)
    for t in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.bool_)  # fmt: skip
)
"""What orjson writes natively (native byte order: a dtype in another order is not equal to these)."""


def native_json(array: Array) -> Array | None:
    """The array flat, as orjson writes it natively (C speed), when its type allows: numbers (not float16 or
    bfloat16) and booleans; ``None`` for the rest (``to_json``). Non-finite floats come out as ``null`` that way: the
    caller checks the encoded answer for ``null`` and writes float outputs again with ``to_json`` when it finds one,
    which is cheaper than looking for non-finite values in every output of every answer."""
    if array.dtype in _NATIVE:
        return array.ravel()  # a view when the array is C-contiguous (a row of a batch's output is)
    return None


def to_json(array: Array) -> Array | list[Any]:
    """orjson writes C-contiguous numeric arrays natively (fast); it does not know float16 or bfloat16 (written as
    the float32 numbers they are), and writes non-finite floats as null, so those go through lists. BYTES become
    strings: the caller sends those that are not UTF-8 as binary data instead (``bytes_tensors.text`` says which)."""
    if array.dtype == OBJECT:
        strings = text(array)
        if strings is None:
            raise ValueError("BYTES that are not UTF-8 have no JSON form")
        return strings
    flat = array.ravel()  # a view when the array is C-contiguous (a row of a batch's output is)
    if flat.dtype == BF16_DTYPE:  # orjson does not know it; float32 holds every bfloat16 value exactly
        flat = flat.astype(np.float32)
    kind = flat.dtype.kind
    if kind == "f" and np.count_nonzero(np.isfinite(flat)) != flat.size:
        values: list[Any] = flat.tolist()
        for index in np.flatnonzero(~np.isfinite(flat)).tolist():
            value = values[index]
            values[index] = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        return values
    if kind in "fiub" and flat.dtype != np.float16:
        return flat
    return flat.tolist()


def described(value: object) -> str:
    """A client's JSON value as it wrote it, trimmed, for messages that say what came: ``the string "128"``,
    ``128.0``, ``null``."""
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # orjson reads nesting 1024 deep but writes only 254
        return f"a JSON {'array' if isinstance(value, list) else 'object'} nested too deep to show"
    if len(text) > SHOWN:
        text = f"{text[:SHOWN]}..."
    return f"the string {text}" if isinstance(value, str) else text


def _flat(data: object, tensor: str) -> tuple[list[Any], set[type]]:
    """The scalars of a nested list in order, and their types (one C-speed pass per level: numpy's own conversion
    would take True as 1 and "1.5" as 1.5, so the types are checked before it runs)."""
    if not isinstance(data, list):
        raise InvalidInput(f"input '{tensor}': 'data' must be a (nested) list of values, got {described(data)}")
    values = data
    kinds = set(map(type, values))
    while list in kinds:  # a loop, not recursion: orjson allows nesting deeper than Python's recursion limit
        if len(kinds) > 1:
            raise InvalidInput(f"input '{tensor}': 'data' mixes lists and values at the same depth")
        values = list(chain.from_iterable(values))
        kinds = set(map(type, values))
    return values, kinds


def _converted(values: list[Any], kinds: set[type], dtype: np.dtype[Any], datatype: str, tensor: str) -> Array:
    if dtype == OBJECT:  # BYTES: strings only (Triton reads nothing else); bytes that are not text go binary
        _check_kinds(values, kinds, _STRINGS, "strings", datatype, tensor)
        return from_strings(values)
    if dtype.kind in _FLOAT_KINDS:
        if not kinds <= _NUMBERS:
            values = [NON_FINITE.get(v, v) if type(v) is str else v for v in values]
            _check_kinds(values, set(map(type, values)), _NUMBERS, _FLOAT_WORDS, datatype, tensor)
        elif dtype == _FP32:  # the common case, in one conversion: values far inside the range pass as they are
            fast = _fp32(values)
            if fast is not None:
                return fast
        return narrow(np.asarray(values, dtype=np.float64), dtype, datatype, tensor)
    if dtype.kind == "b":
        _check_kinds(values, kinds, _BOOLS, "true or false", datatype, tensor)
        return np.asarray(values, dtype=np.bool_)
    _check_kinds(values, kinds, _INTEGERS, "integers", datatype, tensor)
    try:
        wide = np.asarray(values, dtype=np.int64)
    except OverflowError:  # past int64, which only UINT64 can hold: Python ints compare exactly
        check_range(min(values), max(values), dtype, datatype, tensor)
        return np.asarray(values, dtype=dtype)
    return narrow(wide, dtype, datatype, tensor)


def _fp32(numbers: list[Any]) -> Array | None:
    """The numbers as FP32 in one conversion when all lie within its range (JSON numbers are finite), else ``None``:
    the exact path then names the value that does not fit. Up to ``PACKED_MAX`` values, ``struct`` packs them as C
    floats, refusing any past the range as it goes: one pass, twice as fast as a range check and a numpy conversion.
    A value that rounded to the largest float may have been just past it: the exact path decides those."""
    count = len(numbers)
    if count > PACKED_MAX:
        if numbers and not (min(numbers) >= -_FP32_MAX and max(numbers) <= _FP32_MAX):
            return None
        return np.asarray(numbers, dtype=np.float32)
    packer = _PACKERS.get(count)
    if packer is None:
        packer = _PACKERS[count] = struct.Struct(f"={count}f")  # at most PACKED_MAX of them
    try:
        packed = packer.pack(*numbers)
    except OverflowError:
        return None
    if _FP32_EDGES[0] in packed or _FP32_EDGES[1] in packed:  # (a match across two values only costs time)
        return None
    return np.frombuffer(packed, dtype=np.float32)



def _check_kinds(
    values: list[Any], kinds: set[type], allowed: frozenset[type], wanted: str, datatype: str, tensor: str
) -> None:
    """Raise naming the first value whose type is not ``allowed``."""
    if kinds <= allowed:
        return
    index, value = next((i, v) for i, v in enumerate(values) if type(v) not in allowed)
    if type(value) is float and allowed is _INTEGERS and value.is_integer() and abs(value) >= 2**64:
        # orjson reads integers past 64 bits as floats: say what is wrong with them rather than "not an integer"
        raise InvalidInput(f"input '{tensor}': {described(value)} is outside the {datatype} range")
    raise InvalidInput(f"input '{tensor}': {datatype} data must be {wanted}, got {described(value)} at index {index}")
