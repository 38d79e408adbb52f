"""Echo provider (read): answers with the text it was sent, or a block of generated text."""

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error, missing_string_field


class EchoProvider:
    name = "echo"

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("POST", "/echo", self.echo), Endpoint("POST", "/echo/blob", self.blob)]

    def reset(self) -> None:
        pass  # stateless

    def echo(self, request: ProviderRequest) -> Response:
        if problem := missing_string_field(request.body, ("text",)):
            return error(400, problem)
        return JSONResponse({"echo": request.body["text"]})

    def blob(self, request: ProviderRequest) -> Response:
        size = request.body.get("size_bytes") if isinstance(request.body, dict) else None
        if not isinstance(size, int) or not 0 < size <= MAX_BLOB_BYTES:
            return error(400, f"size_bytes must be an integer from 1 to {MAX_BLOB_BYTES}")
        return JSONResponse({"blob": blob_text(size)})


MAX_BLOB_BYTES = 32 * 1024 * 1024


def blob_text(size: int) -> str:
    """`size` bytes of ASCII text, the same every time: numbered lines, so a slice shows where
    it came from ("000123 abcdefghijklmnopqrstuvwxyz0123456789\\n" ...)."""
    line_count = size // 44 + 1
    text = "".join(f"{i:06d} abcdefghijklmnopqrstuvwxyz0123456789ABCD\n" for i in range(line_count))
    return text[:size]
