"""Command line: `python -m sandbox model|providers|idp|mcp` runs one sandbox server until SIGTERM."""

import argparse
from pathlib import Path

from starlette.types import ASGIApp

from sandbox import idp, model_server, providers, serve
from sandbox.scenario import DEFAULT_DIR


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    servers = parser.add_subparsers(dest="server", required=True)
    model = servers.add_parser("model", help="OpenAI-compatible model server playing scenarios")
    _add_listen_args(model)
    model.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    model.add_argument(
        "--scenarios",
        type=Path,
        action="append",
        help="scenario directory; again for more, the first holding a name serves it "
        "(default: the built-in ones)",
    )
    _add_listen_args(
        servers.add_parser(
            "providers", help="fake tool providers (payments, mail, chat, CRM, echo)"
        )
    )
    oidc = servers.add_parser("idp", help="OpenID Connect provider: discovery, JWKS, ID tokens")
    _add_listen_args(oidc)
    oidc.add_argument("--issuer", help="the iss claim and discovery issuer (default: the URL used)")
    mcp = servers.add_parser("mcp", help="remote MCP server (streamable HTTP): a ticket desk")
    _add_listen_args(mcp)
    mcp.add_argument("--token", help="require 'Authorization: Bearer TOKEN'")
    return parser.parse_args(argv)


def _add_listen_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--port-file", type=Path, help="write the port here once the server accepts connections"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    app: ASGIApp
    if args.server == "model":
        app = model_server.create_app(
            scenarios_dir=args.scenarios or [DEFAULT_DIR], api_key=args.api_key
        )
    elif args.server == "idp":
        app = idp.create_app(issuer=args.issuer)
    elif args.server == "mcp":
        from sandbox import mcp_server  # the mcp SDK loads slowly: only for this server

        app = mcp_server.create_app(token=args.token)
    else:
        app = providers.create_app()
    serve.run(app, args.host, args.port, args.port_file)


if __name__ == "__main__":
    main()
