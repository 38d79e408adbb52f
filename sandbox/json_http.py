"""The sandboxes' JSON over HTTP: the one reader of a request's JSON, and the response.

`read_json`: the body as JSON, or None when it is not JSON (undecodable, not JSON, or
nested past Python's reader, whose RecursionError is no ValueError).

`JSONResponse`: Starlette's, except for text no UTF-8 can hold. A client's JSON may escape
half a surrogate pair (`"\\ud83d"`); Python reads it as a string holding a lone surrogate,
and a sandbox that echoes or records what it was sent would then fail writing its answer
(Starlette writes UTF-8), a 500 for that request and for every later listing of the
requests recorded. Such an answer is written with every non-ASCII character escaped
instead, the lone surrogate as the escape it came as.
"""

from __future__ import annotations

import json
from typing import Any

from starlette import responses
from starlette.requests import Request


async def read_json(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, RecursionError):
        return None


class JSONResponse(responses.JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
