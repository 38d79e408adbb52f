"""Start a run that asks for an approval, stream its steps, approve the call, print the result.

Against `agentrun dev`, with examples/triage.yaml applied (README.md, "A walk-through"):
    .venv/bin/python examples/python_quickstart.py
"""

import json

from agentrun_client import Client, StepKind

# The address and keys as the CLI finds them (AGENTRUN_*, a profile, or the dev stack's).
with Client() as client, Client(role="approver") as approver:
    run = client.start_run("triage", "Follow up with ada@example.com")
    print(f"started {run.run_id}")
    for step in client.watch(run.run_id):  # ends when the run is over
        print(f"{step.seq:>3} {step.kind:<20} {json.dumps(step.payload)[:70]}")
        if step.kind == StepKind.APPROVAL_REQUESTED:
            approval = approver.approve(step.payload["approval_id"])
            print(f"    {approval.tool} to {approval.arguments['to']}: {approval.state}")
    run = client.get_run(run.run_id)
    print(f"{run.status}: {run.output}")
