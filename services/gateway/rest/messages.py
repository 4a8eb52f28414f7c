"""Protobuf messages as JSON the way Triton's HTTP front end writes them: every field present, zeros included, and
64-bit integers as JSON numbers (protobuf's own JSON mapping leaves zeros out and writes those as strings, which
clients reading ``stats["inference_stats"]["fail"]["count"]`` as a number would trip on)."""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def message_json(message: Message) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            values = entry.fields_by_name["value"]
            found[field.name] = {str(key): _value(values, item) for key, item in value.items()}
        elif field.is_repeated:
            found[field.name] = [_value(field, item) for item in value]
        else:
            found[field.name] = _value(field, value)
    return found


def _value(field: Any, value: Any) -> Any:
    """``field``: a ``FieldDescriptor`` (the C implementation's type is not the Python class mypy knows)."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")  # as the proto3 JSON mapping spells bytes
    return value
