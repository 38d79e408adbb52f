"""Proto messages as the HTTP API's JSON, both ways, and their JSON Schemas: one walk of each
message's descriptor, so the answers, the parsing and the OpenAPI document cannot differ.

The mapping is proto3's JSON mapping with these choices (docs/api.md):

* field names as in the .proto (snake_case);
* every field without presence is always there (0, "", false, [], {}); a message field, a
  oneof member or an `optional` scalar only when set;
* enums as their lower-case short names: RUN_STATUS_COMPLETED is "completed";
* 64-bit integers as JSON numbers (every such value agentrun writes is below 2^53);
* Timestamps as RFC 3339 strings, Durations as "1.5s";
* a string field `X_json` holding JSON is `X` holding the parsed value (an empty one: null):
  JSON values are JSON, never JSON in a string.

Parsing is strict: an unknown field, a value of the wrong type, an int32 out of range or an
enum name that is not one is INVALID_ARGUMENT naming the field (dotted: `reject.reason`).
"""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument

F = FieldDescriptor
# Descriptors as protobuf's C implementation hands them out (typed loosely by its stubs).
Field = Any
Desc = Any
Enum = Any
_INT32 = (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32)
_UINT32 = (F.TYPE_UINT32, F.TYPE_FIXED32)
_INT64 = (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64)
_UINT64 = (F.TYPE_UINT64, F.TYPE_FIXED64)
_RANGES = {
    **dict.fromkeys(_INT32, (-(2**31), 2**31 - 1)),
    **dict.fromkeys(_UINT32, (0, 2**32 - 1)),
    **dict.fromkeys(_INT64, (-(2**63), 2**63 - 1)),
    **dict.fromkeys(_UINT64, (0, 2**64 - 1)),
}
_FLOATS = (F.TYPE_FLOAT, F.TYPE_DOUBLE)
TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"
_DURATION = re.compile(r"^-?[0-9]+(\.[0-9]{1,9})?s$")
UNSPECIFIED = "unspecified"


# --- names ------------------------------------------------------------------------------------


def is_json_text(field: Field) -> bool:
    """A string field that holds a JSON document (`payload_json`): JSON in the HTTP API."""
    return field.type == F.TYPE_STRING and field.name.endswith("_json")


def json_name(field: Field) -> str:
    """The field's name in the HTTP API: its proto name, `_json` dropped for JSON fields."""
    return field.name[: -len("_json")] if is_json_text(field) else field.name


def http_field(proto_field: str) -> str:
    """A field named in a domain error (`payload_json`) as the HTTP API names it (`payload`)."""
    parts = proto_field.split(".")
    return ".".join(p[: -len("_json")] if p.endswith("_json") else p for p in parts)


def _enum_prefix(enum: Enum) -> str:
    """RunStatus → RUN_STATUS_ (buf's ENUM_VALUE_PREFIX rule holds for every enum)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def enum_names(enum: Enum, *, request: bool) -> list[str]:
    """The enum's short names; a request may not name the zero value (leave the field out)."""
    prefix = _enum_prefix(enum)
    names = [v.name.removeprefix(prefix).lower() for v in enum.values]
    return [n for n in names if n != UNSPECIFIED] if request else names


def enum_name(enum: Enum, number: int) -> str:
    value = enum.values_by_number.get(number)
    if value is None:  # a value newer than this server's descriptors: cannot happen here
        return str(number)
    return value.name.removeprefix(_enum_prefix(enum)).lower()


def _enum_number(enum: Enum, name: str, path: str) -> int:
    if name in enum_names(enum, request=True):
        return enum.values_by_name[_enum_prefix(enum) + name.upper()].number
    allowed = ", ".join(enum_names(enum, request=True))
    raise InvalidArgument(path, f"must be one of {allowed}")


# --- message → JSON ---------------------------------------------------------------------------


def _present(msg: Message, field: Field) -> bool:
    if field.is_repeated:
        return True
    return not field.has_presence or msg.HasField(field.name)


def to_json(msg: Message) -> dict[str, Any]:
    """A message as the HTTP API's JSON object."""
    out: dict[str, Any] = {}
    fields: list[Field] = list(msg.DESCRIPTOR.fields)
    for field in fields:
        if not _present(msg, field):
            continue
        value = getattr(msg, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _value(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[json_name(field)] = [_value(field, v) for v in value]
        else:
            out[json_name(field)] = _value(field, value)
    return out


def _is_map(field: Field) -> bool:
    return (
        field.type == F.TYPE_MESSAGE
        and field.is_repeated
        and field.message_type.GetOptions().map_entry
    )


def _value(field: Field, value: Any) -> Any:
    if field.type == F.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name in (TIMESTAMP, DURATION):
            return value.ToJsonString()
        return to_json(value)
    if field.type == F.TYPE_ENUM:
        return enum_name(field.enum_type, value)
    if is_json_text(field):
        return json.loads(value) if value else None
    if field.type == F.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


# --- JSON → message ---------------------------------------------------------------------------


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _refuse_text(path: str, value: str) -> str:
    if "\x00" in value:
        raise InvalidArgument(path, "contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(path, "is not valid text (a lone surrogate)") from None
    return value


def fill(
    msg: Message,
    data: Any,
    path: str = "",
    *,
    skip: frozenset[str] = frozenset(),
) -> Message:
    """Set `msg`'s fields from a JSON object (strict). `skip`: proto field names the HTTP
    request may not set here (they come from the path)."""
    where = path or "body"
    if not isinstance(data, dict):
        raise InvalidArgument(where, "must be a JSON object")
    by_name = {json_name(f): f for f in msg.DESCRIPTOR.fields if f.name not in skip}
    oneofs: dict[str, str] = {}
    for key, item in data.items():
        field = by_name.get(key)
        if field is None or field.GetOptions().deprecated:
            raise InvalidArgument(_join(path, key), "is not a field of this request")
        here = _join(path, key)
        group = field.containing_oneof
        if group is not None and not _synthetic(field):
            if group.name in oneofs:
                raise InvalidArgument(
                    here, f"only one of {oneofs[group.name]} and {key} may be set"
                )
            oneofs[group.name] = key
        _set(msg, field, item, here)
    return msg


def _synthetic(field: Field) -> bool:
    """The oneof of an `optional` scalar: not a choice the caller makes."""
    group = field.containing_oneof
    return group is not None and len(group.fields) == 1 and group.name == f"_{field.name}"


def _set(msg: Message, field: Field, item: Any, path: str) -> None:
    if _is_map(field):
        _set_map(msg, field, item, path)
    elif field.is_repeated:
        _set_list(msg, field, item, path)
    elif field.type == F.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == TIMESTAMP:
            getattr(msg, field.name).CopyFrom(_timestamp(item, path))
        elif name == DURATION:
            getattr(msg, field.name).CopyFrom(_duration(item, path))
        else:
            sub = getattr(msg, field.name)
            sub.SetInParent()
            fill(sub, item, path)
    else:
        setattr(msg, field.name, _scalar(field, item, path))


def _set_map(msg: Message, field: Field, item: Any, path: str) -> None:
    if not isinstance(item, dict):
        raise InvalidArgument(path, "must be a JSON object")
    target = getattr(msg, field.name)
    value_field = field.message_type.fields_by_name["value"]
    for k, v in item.items():
        if value_field.type == F.TYPE_MESSAGE:
            fill(target[k], v, _join(path, k))
        else:
            target[k] = _scalar(value_field, v, _join(path, k))


def _set_list(msg: Message, field: Field, item: Any, path: str) -> None:
    if not isinstance(item, list):
        raise InvalidArgument(path, "must be an array")
    target = getattr(msg, field.name)
    for i, v in enumerate(item):
        if field.type == F.TYPE_MESSAGE:
            fill(target.add(), v, f"{path}[{i}]")
        else:
            target.append(_scalar(field, v, f"{path}[{i}]"))


def _scalar(field: Field, item: Any, path: str) -> Any:
    if is_json_text(field):
        return json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    if field.type in _RANGES:
        return _integer(field, item, path)
    parse = _SCALARS.get(field.type)
    if parse is None:
        raise InvalidArgument(path, "cannot be set over HTTP")
    return parse(field, item, path)


def _string(field: Field, item: Any, path: str) -> str:
    if not isinstance(item, str):
        raise InvalidArgument(path, "must be a string")
    return _refuse_text(path, item)


def _bool(field: Field, item: Any, path: str) -> bool:
    if not isinstance(item, bool):
        raise InvalidArgument(path, "must be true or false")
    return item


def _enum(field: Field, item: Any, path: str) -> int:
    if not isinstance(item, str):
        raise InvalidArgument(path, "must be a string")
    return _enum_number(field.enum_type, item, path)


def _integer(field: Field, item: Any, path: str) -> int:
    if isinstance(item, bool) or not isinstance(item, int):
        raise InvalidArgument(path, "must be an integer")
    low, high = _RANGES[field.type]
    if not low <= item <= high:
        raise InvalidArgument(path, f"must be between {low} and {high}")
    return item


def _float(field: Field, item: Any, path: str) -> float:
    if isinstance(item, bool) or not isinstance(item, int | float):
        raise InvalidArgument(path, "must be a number")
    return float(item)


_SCALARS: dict[int, Any] = {
    F.TYPE_STRING: _string,
    F.TYPE_BOOL: _bool,
    F.TYPE_ENUM: _enum,
    F.TYPE_FLOAT: _float,
    F.TYPE_DOUBLE: _float,
}


def _timestamp(item: Any, path: str) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp

    if not isinstance(item, str):
        raise InvalidArgument(path, "must be an RFC 3339 timestamp string")
    try:
        when = datetime.fromisoformat(item.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidArgument(path, "is not an RFC 3339 timestamp") from None
    if when.tzinfo is None or "t" not in item.lower():
        raise InvalidArgument(path, "is not an RFC 3339 timestamp (date, time and offset)")
    ts = Timestamp()
    ts.FromDatetime(when.astimezone(UTC))
    return ts


def _duration(item: Any, path: str) -> Any:
    from google.protobuf.duration_pb2 import Duration

    if not isinstance(item, str) or not _DURATION.match(item):
        raise InvalidArgument(path, 'must be a duration like "1.5s"')
    d = Duration()
    try:
        d.FromJsonString(item)
    except ValueError:  # past protobuf's range (about 10,000 years)
        raise InvalidArgument(path, "is out of range for a duration") from None
    return d


def query_value(field: Field, raw: str, path: str) -> Any:
    """A query parameter's text as the JSON value `fill` takes for `field`."""
    if field.type in _RANGES:
        text = raw.strip()
        if not re.fullmatch(r"-?[0-9]{1,20}", text):
            raise InvalidArgument(path, "must be an integer")
        return int(text)
    if field.type == F.TYPE_BOOL:
        if raw not in ("true", "false"):
            raise InvalidArgument(path, "must be true or false")
        return raw == "true"
    if field.type in _FLOATS:
        try:
            return float(raw)
        except ValueError:
            raise InvalidArgument(path, "must be a number") from None
    if is_json_text(field):
        return validate.json_value(path, raw)
    return raw


# --- JSON Schema ------------------------------------------------------------------------------


def component_name(desc: Desc) -> str:
    return desc.name


def field_schema(
    field: Field, ref: Any, *, request: bool, ranges: dict[str, tuple[int, int]] | None
) -> dict[str, Any]:
    """The JSON Schema of one field's value (`ref(desc)` names a message's schema)."""
    if _is_map(field):
        value_field = field.message_type.fields_by_name["value"]
        return {
            "type": "object",
            "additionalProperties": _one(value_field, ref, request=request, ranges=None),
        }
    one = _one(field, ref, request=request, ranges=ranges)
    if field.is_repeated:
        return {"type": "array", "items": one}
    return one


def _one(
    field: Field, ref: Any, *, request: bool, ranges: dict[str, tuple[int, int]] | None
) -> dict[str, Any]:
    if field.type == F.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == TIMESTAMP:
            return {"type": "string", "format": "date-time"}
        if name == DURATION:
            return {"type": "string", "pattern": _DURATION.pattern}
        return dict(ref(field.message_type))
    if is_json_text(field):
        return {"description": "Any JSON value."}
    if field.type == F.TYPE_STRING:
        return {"type": "string"}
    if field.type == F.TYPE_BOOL:
        return {"type": "boolean"}
    if field.type == F.TYPE_ENUM:
        return {"type": "string", "enum": enum_names(field.enum_type, request=request)}
    if field.type in _RANGES:
        low, high = (ranges or {}).get(field.name, _RANGES[field.type])
        fmt = "int64" if field.type in _INT64 + _UINT64 else "int32"
        return {"type": "integer", "format": fmt, "minimum": low, "maximum": high}
    if field.type in _FLOATS:
        return {"type": "number"}
    return {"type": "string", "format": "byte"}


def response_schema(desc: Desc, ref: Any) -> dict[str, Any]:
    """A message as the API answers it: fields without presence are always there."""
    props = {json_name(f): field_schema(f, ref, request=False, ranges=None) for f in desc.fields}
    required = [json_name(f) for f in desc.fields if f.is_repeated or not f.has_presence]
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


def request_schema(
    desc: Desc,
    *,
    skip: frozenset[str] = frozenset(),
    required: tuple[str, ...] = (),
    ranges: dict[str, tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """A request body: what `fill` accepts (nested messages inline, no unknown fields)."""

    def inline(sub: Desc) -> dict[str, Any]:
        return request_schema(sub)

    fields = [f for f in desc.fields if f.name not in skip and not f.GetOptions().deprecated]
    props = {json_name(f): field_schema(f, inline, request=True, ranges=ranges) for f in fields}
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    choices = _oneof_choices(fields)
    if choices:
        # Only a body that is one oneof (DecideApproval's approve | reject | edit) is served:
        # exactly one of its members.
        assert len(choices) == len(props), f"{desc.name}: a oneof beside other fields"
        schema["minProperties"] = schema["maxProperties"] = 1
    return schema


def _oneof_choices(fields: list[Field]) -> list[str]:
    return [json_name(f) for f in fields if f.containing_oneof is not None and not _synthetic(f)]
