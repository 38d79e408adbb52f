"""The `agentrun` command line: argparse subcommands, each bound to its handler."""

from __future__ import annotations

import argparse
import sys

from agentrun_cli import (
    admin_commands,
    alerts,
    approvals,
    argtypes,
    channels,
    chat,
    commands,
    connections,
    credentials,
    credits,
    crypto_keys,
    durations,
    events,
    forks,
    launch,
    mcp,
    openapi_import,
    output,
    profile_commands,
    profiles,
    releases,
    triggers,
)
from agentrun_cli import tools as tool_commands
from agentrun_client import config

# Commands whose further arguments belong to the process they run.
PASSTHROUGH = frozenset({"server", "executor"})
STATUSES = ["queued", "running", "waiting", "completed", "failed", "cancelled"]
DEFAULT_ADDRESS = config.DEFAULT_ADDRESS
DEFAULT_WORKSPACE = config.DEFAULT_WORKSPACE


def _global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """Options accepted before or after the subcommand (`agentrun --json runs list` or after)."""

    def default(value: object) -> object:
        # On subcommands the defaults are suppressed so they do not overwrite a
        # value given before the subcommand.
        return value if defaults else argparse.SUPPRESS

    # Unset here: `resolve` fills them from the environment, then the profile, then defaults.
    parser.add_argument(
        "--address",
        default=default(None),
        help=f"control plane gRPC address (env AGENTRUN_ADDRESS; default {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--workspace",
        default=default(None),
        help=f"workspace id (env AGENTRUN_WORKSPACE; default {DEFAULT_WORKSPACE!r})",
    )
    parser.add_argument(
        "--profile",
        default=default(None),
        metavar="NAME",
        help="a named profile of the config file (env AGENTRUN_PROFILE, AGENTRUN_CONFIG)",
    )
    output.add_options(parser, defaults)


def _common() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    _global_options(parent, defaults=False)
    return parent


def _data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        help="where embedded Postgres/Redis, logs and port files live "
        "(env AGENTRUN_DATA_DIR; default <repo>/.data)",
    )


def _add_processes(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("server", help="run the control plane (args after it are passed on)")
    p.set_defaults(handler=launch.server)
    p = sub.add_parser("executor", help="run an executor (args after it are passed on)")
    p.set_defaults(handler=launch.executor)
    p = sub.add_parser("migrate", help="apply database migrations", parents=[common])
    _data_dir(p)
    p.add_argument(
        "--citus",
        action="store_true",
        help="then distribute the schema over the Citus cluster whose coordinator "
        "DATABASE_URL names (control_plane/store/citus.py holds the plan)",
    )
    p.set_defaults(handler=launch.migrate)
    p = sub.add_parser(
        "dev", help="the whole local stack as processes, until Ctrl-C", parents=[common]
    )
    _data_dir(p)
    p.add_argument("--demo", action="store_true", help="run the demo agent once, then stop")
    launch.dev_options(p)
    p.set_defaults(handler=launch.dev)
    admin = sub.add_parser("admin", help="deployment administration").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = admin.add_parser(
        "bootstrap",
        help="mint the first platform admin key against DATABASE_URL (printed once)",
        parents=[common],
    )
    _data_dir(p)
    p.add_argument("--principal", default="platform-admin", help="who the key acts as")
    p.set_defaults(handler=launch.admin_bootstrap)


def _add_agents(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    agents = sub.add_parser("agents", help="create, publish and show agents").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = agents.add_parser("create", help="register an agent", parents=[common])
    p.add_argument("agent_id", metavar="ID")
    p.add_argument("--name", default="", help="display name")
    p.set_defaults(handler=commands.agents_create)
    _add_publish(agents, common)
    p = agents.add_parser("show", help="an agent and its latest version", parents=[common])
    p.add_argument("agent_id", metavar="ID")
    p.set_defaults(handler=commands.agents_show)
    p = agents.add_parser("list", help="the workspace's agents", parents=[common])
    _quiet(p, "agent ids")
    p.set_defaults(handler=commands.agents_list)
    p = agents.add_parser(
        "apply",
        help="create the agent of a YAML file if missing, publish its spec if changed",
        parents=[common],
    )
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="agent YAML (- = stdin)")
    p.set_defaults(handler=commands.agents_apply)


def _add_publish(agents: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = agents.add_parser("publish", help="publish the agent's next version", parents=[common])
    p.add_argument("agent_id", metavar="ID")
    p.add_argument("--model", default="", help="model name (optional when the profile names one)")
    p.add_argument(
        "--model-profile",
        default="",
        metavar="NAME",
        help="the executors' model profile: provider API, endpoint, key",
    )
    p.add_argument(
        "--max-output-tokens",
        type=argtypes.int32,
        default=0,
        metavar="N",
        help="most tokens the model may generate per call",
    )
    p.add_argument("--temperature", type=argtypes.finite, metavar="T")
    p.add_argument("--instructions", default="", metavar="TEXT", help="system instructions")
    p.add_argument(
        "--tool",
        dest="tools",
        action="append",
        required=True,
        metavar="T",
        help="a tool the agent may call (repeat for more)",
    )
    p.add_argument(
        "--connection",
        dest="connections",
        action="append",
        metavar="PROVIDER=ID",
        help="the connection a provider's tools act as; ID `trigger`: the run's triggering "
        "account (repeat for more providers)",
    )
    p.add_argument("--max-steps", type=argtypes.int32, default=0, metavar="N")
    p.add_argument(
        "--deadline",
        type=durations.arg,
        metavar="DURATION",
        help="active-time budget (time held by executors; parked time does not count)",
    )
    p.add_argument(
        "--acknowledge-trifecta",
        action="store_true",
        help="publish even though the tools read private data, read untrusted content "
        "and communicate externally (required where the server asks for it)",
    )
    p.set_defaults(handler=commands.agents_publish)


def _quiet(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help=f"print only the {what}")


def _age(text: str) -> str:
    durations.positive_arg(text)  # checked here, converted by the handler
    return text


def _add_runs(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    runs = sub.add_parser("runs", help="start, inspect, watch and cancel runs").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    _add_runs_start(runs, common)
    p = runs.add_parser("show", help="a run's state and step log", parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=commands.runs_show)
    p = runs.add_parser(
        "export",
        help="a run's steps as JSON lines, one step a line (keep it past retention)",
        parents=[common],
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=commands.runs_export)
    p = runs.add_parser("list", help="runs, newest first", parents=[common])
    p.add_argument("--agent", default="", metavar="A")
    p.add_argument("--status", choices=STATUSES)
    p.add_argument("--limit", type=argtypes.int32, metavar="N", help="default: all")
    p.add_argument("--since", type=_age, metavar="AGE", help="created in the last AGE: 1h, 2d")
    p.add_argument("--search", metavar="TEXT", help="text in the id, agent, input, output, error")
    p.add_argument(
        "--waiting-longer-than",
        type=_age,
        metavar="AGE",
        help="only runs waiting (for a person, an event, a time) longer than AGE: 1d",
    )
    _label_filters(p)
    _quiet(p, "run ids")
    p.set_defaults(handler=commands.runs_list)
    p = runs.add_parser("watch", help="stream a run's steps until it ends", parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--from-seq", type=argtypes.int32, default=0, metavar="N")
    p.add_argument(
        "--until",
        action="append",
        choices=STATUSES,
        metavar="STATUS",
        help="stop once the run is in STATUS (repeat for more), e.g. waiting",
    )
    p.set_defaults(handler=commands.runs_watch)
    _add_runs_cancel_and_pause(runs, common)
    _add_runs_resolve(runs, common)
    forks.add_commands(runs, common)
    p = runs.add_parser(
        "signal", help="send a named event to a run (its wait_for_signal)", parents=[common]
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("name", metavar="NAME", help="the signal's name")
    p.add_argument("--event-id", required=True, metavar="ID", help="idempotency: your event's id")
    p.add_argument("--payload", default="", metavar="JSON", help="a JSON value (default: null)")
    p.set_defaults(handler=commands.runs_signal)


def _add_runs_cancel_and_pause(
    runs: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> None:
    p = runs.add_parser(
        "cancel", help="cancel a run, or every run a filter matches (--all)", parents=[common]
    )
    p.add_argument("run_id", metavar="RUN_ID", nargs="?", help="one run (or a filter below)")
    p.add_argument("--reason", default="")
    p.add_argument("--agent", default="", metavar="A")
    p.add_argument("--status", choices=STATUSES[:3])
    _label_filters(p)
    p.add_argument(
        "--all",
        action="store_true",
        help="cancel every unfinished run the filter matches (alone: every unfinished run)",
    )
    p.add_argument("--dry-run", action="store_true", help="only count the runs --all would cancel")
    p.set_defaults(handler=commands.runs_cancel)
    p = runs.add_parser(
        "rerun", help="run again from the start every run a filter matches", parents=[common]
    )
    p.add_argument("--agent", default="", metavar="A")
    p.add_argument("--status", choices=STATUSES)
    _label_filters(p)
    p.add_argument("--all", action="store_true", help="every run the filter matches")
    p.add_argument("--dry-run", action="store_true", help="only count them")
    p.set_defaults(handler=commands.runs_rerun)
    for verb, what in (("pause", "park"), ("resume", "free")):
        p = runs.add_parser(
            verb,
            help=f"{what} a run, an agent's queued runs (--agent) or the workspace queue (--queue)",
            parents=[common],
        )
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("run_id", metavar="RUN_ID", nargs="?")
        which.add_argument("--agent", default="", metavar="A")
        which.add_argument("--queue", action="store_true", help="the workspace's whole queue")
        p.set_defaults(handler=commands.runs_pause, paused=verb == "pause")


def _label_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tag", default="", metavar="T", help="runs carrying this tag")
    p.add_argument("--metadata", default="", metavar="K=V", help="runs whose metadata K is V")


def _add_runs_start(runs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = runs.add_parser("start", help="start a run", parents=[common])
    p.add_argument("agent_id", metavar="AGENT")
    p.add_argument("--input", required=True, metavar="TEXT", help="the user message")
    p.add_argument("--version", type=argtypes.int32, default=0, metavar="N", help="default: latest")
    p.add_argument("--request-id", default="", metavar="K", help="dedupe key for retries")
    triggers.add_priority(p)
    p.add_argument(
        "--tag", action="append", default=[], metavar="T", help="a tag (repeat for more)"
    )
    p.add_argument("--metadata", default="", metavar="JSON", help="a JSON object (<= 4 KiB)")
    p.add_argument(
        "--trigger-connection",
        default="",
        metavar="C",
        help="the connection the run came in through (tools mapped to `trigger` act as it)",
    )
    p.add_argument("--watch", action="store_true", help="then watch it to the end")
    p.set_defaults(handler=commands.runs_start)


def _add_runs_resolve(runs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = runs.add_parser(
        "resolve", help="decide an unknown tool outcome a run waits on", parents=[common]
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("seq", type=argtypes.int32, metavar="SEQ", help="the unknown tool_result step")
    p.add_argument("decision", choices=["happened", "not_happened", "retry", "fail_run"])
    p.add_argument(
        "--by",
        default="",
        help="who decides: recorded from your credential; if given, must match it",
    )
    p.add_argument("--note", default="", help="what you checked")
    p.set_defaults(handler=commands.runs_resolve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun", description="agentrun: durable execution for AI agent runs"
    )
    _global_options(parser, defaults=True)
    parser.add_argument("--version", action="version", version=f"agentrun {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()
    _add_processes(sub, common)
    _add_agents(sub, common)
    _add_runs(sub, common)
    approvals.add_commands(sub, common)
    connections.add_commands(sub, common)
    channels.add_commands(sub, common)
    alerts.add_commands(sub, common)
    credits.add_commands(sub, common)
    events.add_commands(sub, common)
    triggers.add_commands(sub, common)
    releases.add_commands(sub, common)
    tool_actions = tool_commands.add_commands(sub, common)
    openapi_import.add_commands(tool_actions, common)
    chat.add_command(sub, common)
    crypto_keys.add_commands(sub, common)
    admin_commands.add_commands(sub, common)
    profile_commands.add_commands(sub, common)
    mcp.add_commands(sub, common)  # after any `tools` module: it adds add-mcp and sync to it
    _add_completion(sub)
    return parser


COMPLETION_SHELLS = ("bash", "zsh", "fish", "tcsh")


def _add_completion(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script: "
        "`source <(agentrun completion bash)`, or save it where your shell loads completions",
    )
    p.add_argument("shell", choices=COMPLETION_SHELLS)
    p.set_defaults(handler=_completion)


def _completion(args: argparse.Namespace) -> int:
    """The script shtab generates from this very parser: static, so a TAB runs no Python."""
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell), end="")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentrun")
    except PackageNotFoundError:
        return "unknown"


def resolve(args: argparse.Namespace) -> None:
    """Address, workspace and key: flag > environment > profile > dev credentials/defaults,
    by the client package's rules (agentrun_client/config.py), which programs follow too.

    `profile ...` commands edit the file, and `completion` prints a script, so neither
    selects a profile. Only a client command dials the address this checkout's dev stack
    recorded.
    """
    if args.command in ("profile", "completion"):
        output.settle(args)
        credentials.activate(None)
        return
    output.settle(args)
    profile = profiles.select(getattr(args, "profile", None))
    credentials.activate(profile)
    args.workspace = config.resolve_workspace(getattr(args, "workspace", None), profile)
    given = getattr(args, "address", None)
    dev_stack = args.command not in PASSTHROUGH and args.command != "dev"
    data_dir = None
    if dev_stack:
        from agentrun_cli.stack import default_data_dir

        data_dir = default_data_dir()
    args.address, source = config.resolve_address(given, profile, data_dir, dev_stack=dev_stack)
    args.address_from = "--address" if given else source


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `argv`; arguments after `server` / `executor` are kept in `args.args` for them."""
    parser = build_parser()
    for arg in sys.argv[1:] if argv is None else argv:
        # A byte that is not UTF-8 reaches Python as a lone surrogate, which no request can
        # carry (and printing it back would fail too): refused here, before anything runs.
        if any("\ud800" <= ch <= "\udfff" for ch in arg):
            parser.error(f"an argument is not valid UTF-8: {arg.encode(errors='replace')!r}")
    args, extra = parser.parse_known_args(argv)
    if args.command in PASSTHROUGH:
        args.args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        resolve(args)
    except profiles.ProfileError as exc:
        parser.error(str(exc))
    return args
