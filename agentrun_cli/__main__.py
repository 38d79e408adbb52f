"""`python -m agentrun_cli`: the same as the `agentrun` command."""

import sys

from agentrun_cli.main import main

sys.exit(main())
