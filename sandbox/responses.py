"""The sandboxes' JSON response: Starlette's, except for text no UTF-8 can hold.

A client's JSON may escape half a surrogate pair (`"\\ud83d"`); Python reads it as a string
holding a lone surrogate, and a sandbox that echoes or records what it was sent would then
fail writing its answer (Starlette writes UTF-8), a 500 for that request and for every
later listing of the requests recorded. Such an answer is written with every non-ASCII
character escaped instead, the lone surrogate as the escape it came as.
"""

from __future__ import annotations

import json
from typing import Any

from starlette import responses


class JSONResponse(responses.JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
