"""Echo provider (read): answers with the text it was sent."""

from starlette.responses import JSONResponse, Response

from sandbox.providers.base import Endpoint, ProviderRequest, error, missing_string_field


class EchoProvider:
    name = "echo"

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("POST", "/echo", self.echo)]

    def reset(self) -> None:
        pass  # stateless

    def echo(self, request: ProviderRequest) -> Response:
        if problem := missing_string_field(request.body, ("text",)):
            return error(400, problem)
        return JSONResponse({"echo": request.body["text"]})
