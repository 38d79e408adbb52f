"""Entry point of the `agentrun` command: parse, dispatch, turn errors into one line and exit 1."""

from __future__ import annotations

import os
import sys

import grpc

from agentrun_cli import errors
from agentrun_cli.demo import DemoError
from agentrun_cli.parser import parse
from agentrun_cli.profiles import ProfileError
from agentrun_cli.spec_files import SpecFileError
from agentrun_cli.supervisor import StackError


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return args.handler(args) or 0
    except grpc.RpcError as err:
        print("\n".join(errors.lines(err, args)), file=sys.stderr)
    except (
        StackError,
        DemoError,
        ProfileError,
        SpecFileError,
    ) as err:  # already readable: what failed and its log tail
        print(f"error: {err}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    except RecursionError:  # a file or argument read past Python's recursion limit
        print("error: the input is nested too deeply to read", file=sys.stderr)
    except BrokenPipeError:
        # `agentrun runs list | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as err:  # a file named on the command line: missing, unreadable, a folder
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
