"""Request decoding for every method: undecodable bytes and NUL characters never reach a handler.

grpc.aio calls a method's request deserializer before any handler code runs; when it
raises (random bytes, invalid UTF-8 in a string field, nesting past protobuf's limit)
the call ends UNKNOWN with a traceback in the log, once per request. `guard_decoder`
wraps the deserializer so that it never raises: it returns the message, or a `Refused`
naming what is wrong, and the error interceptor answers INVALID_ARGUMENT with one log
line. A decoded message is then walked once for NUL characters in its strings, which
Postgres refuses in text columns: `edit.note` rather than an INTERNAL from the driver.

A method behind the credential check (control_plane/auth/interceptor.py) is handed its
Refused request, marked `credential_first`: the caller's credential is checked before the
request's content is judged, so a bad key is UNAUTHENTICATED whatever the bytes it sent.

The walk is cheap enough for the commit stream: protobuf writes a NUL character as a
0x00 byte, so a message whose wire bytes hold no 0x00 (the common case) is not walked
at all; otherwise each string is tested with one C-level `in`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

# What a field can hold that may carry a NUL: one string, strings, a message, messages, a map.
_STR, _STRS, _MSG, _MSGS, _MAP = range(5)
_plans: dict[str, dict[str, tuple[int, Descriptor | None]]] = {}


class Refused:
    """What a guarded deserializer returns instead of raising: the request is refused."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def __repr__(self) -> str:
        return f"Refused({self.problem!r})"


def credential_first(behavior: Any) -> Any:
    """Marks a method behavior that is handed a Refused request itself, to check the caller's
    credential before refusing it (the error interceptor refuses it first otherwise)."""
    behavior.credential_first = True
    return behavior


def takes_refused(behavior: Any) -> bool:
    return getattr(behavior, "credential_first", False) is True


def _kind(field: FieldDescriptor) -> tuple[int, Descriptor | None] | None:
    if field.type == FieldDescriptor.TYPE_STRING:
        return (_STRS if field.is_repeated else _STR), None
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return None
    message = field.message_type
    assert message is not None
    if message.GetOptions().map_entry:
        return _MAP, message
    return (_MSGS if field.is_repeated else _MSG), message


def _plan(descriptor: Any) -> dict[str, tuple[int, Descriptor | None]]:
    """The fields of a message type that can hold strings, by name (computed once per type)."""
    plan = _plans.get(descriptor.full_name)
    if plan is None:
        plan = {f.name: kind for f in descriptor.fields if (kind := _kind(f)) is not None}
        _plans[descriptor.full_name] = plan
    return plan


def _key(key: Any) -> str:
    """A map key as an error names it: the caller's own key, cut short (a key may be huge)."""
    return repr(key[:40]) if isinstance(key, str) else repr(key)


def _map_path(path: str, entries: Any, entry: Descriptor) -> str | None:
    value_kind = _kind(entry.fields_by_name["value"])
    for key, value in entries.items():
        if isinstance(key, str) and "\x00" in key:
            return f"{path}[{_key(key)}]"
        if value_kind is not None and value_kind[0] == _STR and "\x00" in value:
            return f"{path}[{_key(key)}]"
        if (
            value_kind is not None
            and value_kind[0] == _MSG
            and (found := nul_path(value, f"{path}[{_key(key)}]."))
        ):
            return found
    return None


def _value_path(path: str, kind: int, entry: Descriptor | None, value: Any) -> str | None:
    if kind == _STR:
        return path if "\x00" in value else None
    if kind == _STRS:
        return next((f"{path}[{i}]" for i, s in enumerate(value) if "\x00" in s), None)
    if kind == _MSG:
        return nul_path(value, f"{path}.")
    if kind == _MSGS:
        for i, item in enumerate(value):
            if found := nul_path(item, f"{path}[{i}]."):
                return found
        return None
    assert entry is not None
    return _map_path(path, value, entry)


def nul_path(message: Message, prefix: str = "", skip: Collection[str] = ()) -> str | None:
    """The path of the first string in `message` holding a NUL (`edit.note`, `steps[2].text`).

    Nested messages, repeated fields and maps are walked; fields named in `skip` (top
    level only) are left to the handler.
    """
    plan = _plan(message.DESCRIPTOR)
    for field, value in message.ListFields():
        kind = plan.get(field.name)
        if kind is None or field.name in skip:
            continue
        if found := _value_path(f"{prefix}{field.name}", kind[0], kind[1], value):
            return found
    return None


def nul_path_of_decoded(message: Message, prefix: str = "") -> str | None:
    """`nul_path` for a message already decoded (its wire bytes gone): serialized once in C,
    walked in Python only when a 0x00 byte shows up (the hot commit path stays cheap)."""
    if b"\x00" not in message.SerializeToString():
        return None
    return nul_path(message, prefix)


def guard_decoder(
    deserialize: Callable[[bytes], Any] | None, skip: Collection[str] = ()
) -> Callable[[bytes], Any] | None:
    """`deserialize`, made total: the message, or a Refused saying why it is refused.

    `skip` names top-level fields whose NUL check the handler does itself (the items of a
    stream that it answers one by one).
    """
    if deserialize is None:
        return None
    message_type = getattr(deserialize, "__self__", None)
    descriptor = getattr(message_type, "DESCRIPTOR", None)
    name = descriptor.name if descriptor is not None else "message"

    def decode(data: bytes) -> Any:
        try:
            message = deserialize(data)
        except Exception:  # noqa: BLE001 - DecodeError, RecursionError: all just "not valid"
            return Refused(f"request is not a valid {name}")
        if (
            b"\x00" in data
            and isinstance(message, Message)
            and (path := nul_path(message, skip=skip))
        ):
            return Refused(f"{path}: contains a NUL character")
        return message

    return decode
