"""One call of a registry HTTP tool as one request, from its template (tool.proto HttpTemplate).

* the URL's `{name}` is the argument `name`, percent-escaped as one path segment (a '/', '#'
  or '?' in a value stays inside its segment);
* header values and query values are literals or `{name}` templates; one naming an argument
  the call lacks is left out;
* the JSON body is none, "arguments" (every argument the URL, headers and query did not use),
  or an object template whose string leaves `{name}` become the argument's value (a leaf that
  is exactly `{name}` keeps the value's JSON type; one whose argument is absent is left out);
* the answer is cut to `response_pointer` (RFC 6901, by the `jsonpointer` package); an answer
  with nothing there is not the answer the tool was defined for, and is refused naming the
  pointer, never passed on whole.

A call whose URL needs an argument it lacks is refused before anything is sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import jsonpointer

from executor.tools.rejection import ToolCallRejected

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MISSING = object()
_NOTHING = object()


@dataclass(frozen=True)
class HttpTemplate:
    """How one call of a registry tool becomes one HTTP request (tool.proto HttpTemplate)."""

    method: str
    url: str
    headers: Mapping[str, str]
    query: Mapping[str, str]
    body: str = ""
    response_pointer: str = ""
    max_response_bytes: int = 0
    timeout_seconds: float = 0.0
    auth: str = ""


@dataclass(frozen=True)
class Rendered:
    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, str]
    body: Any  # None: no body


def text(value: Any) -> str:
    """An argument as text: strings as they are, anything else as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def render(template: HttpTemplate, arguments: Mapping[str, Any]) -> Rendered:
    """The request for these (already schema-checked) arguments."""
    used: set[str] = set()

    def segment(match: re.Match[str]) -> str:
        name = match.group(1)
        if arguments.get(name) is None:
            raise ToolCallRejected(f"argument {name!r} is needed for the request URL")
        used.add(name)
        return quote(text(arguments[name]), safe="")

    url = PLACEHOLDER.sub(segment, template.url)
    headers = _filled(template.headers, arguments, used)
    for value in headers.values():
        if not value.isascii() or not value.isprintable():
            raise ToolCallRejected("a header value must be printable ASCII (no line breaks)")
    params = _filled(template.query, arguments, used)
    return Rendered(template.method, url, headers, params, _body(template.body, arguments, used))


def _filled(
    templates: Mapping[str, str], arguments: Mapping[str, Any], used: set[str]
) -> dict[str, str]:
    filled: dict[str, str] = {}
    for name, value in templates.items():
        wanted = PLACEHOLDER.findall(value)
        if any(arguments.get(w) is None for w in wanted):
            continue
        used.update(wanted)
        filled[name] = PLACEHOLDER.sub(lambda m: text(arguments[m.group(1)]), value)
    return filled


def _body(body: str, arguments: Mapping[str, Any], used: set[str]) -> Any:
    if not body:
        return None
    if body == "arguments":
        return {k: v for k, v in arguments.items() if k not in used}
    filled = _leaf(json.loads(body), arguments)
    return {} if filled is _MISSING else filled


def _leaf(value: Any, arguments: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        items = ((k, _leaf(v, arguments)) for k, v in value.items())
        return {k: v for k, v in items if v is not _MISSING}
    if isinstance(value, list):
        return [v for v in (_leaf(item, arguments) for item in value) if v is not _MISSING]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return arguments.get(whole.group(1), _MISSING)
    wanted = PLACEHOLDER.findall(value)
    if any(arguments.get(w) is None for w in wanted):
        return _MISSING
    return PLACEHOLDER.sub(lambda m: text(arguments[m.group(1)]), value)


class NothingAtPointer(ValueError):
    """The answer has nothing at the tool's `response_pointer`; the message names the pointer
    and how far it got, never the answer itself."""


def pointed(document: Any, pointer: str) -> Any:
    """The part of `document` at the JSON Pointer (RFC 6901): the whole for the empty pointer,
    NothingAtPointer when the answer has nothing there."""
    if not pointer:
        return document
    try:
        parsed = jsonpointer.JsonPointer(pointer)
    except jsonpointer.JsonPointerException as exc:  # saved tools are checked: not expected
        raise NothingAtPointer(
            f"response_pointer {pointer!r} is not a JSON Pointer: {exc}"
        ) from None
    found = document
    for depth, part in enumerate(parsed.parts):
        try:
            found = parsed.walk(found, part)
        except (jsonpointer.JsonPointerException, TypeError):
            found = _NOTHING
        # "-" names the place past a list's end: no member of the answer.
        if found is _NOTHING or isinstance(found, jsonpointer.EndOfList):
            reached = jsonpointer.JsonPointer.from_parts(parsed.parts[:depth]).path
            raise NothingAtPointer(
                f"the answer has nothing at response_pointer {pointer!r} "
                f"(no {part!r} in {reached or 'its top level'})"
            )
    return found
