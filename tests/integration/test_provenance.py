"""Guardrails that know where an argument came from (issue 48), end to end.

Real control plane, executor, Postgres, the scripted model and the provider sandbox. The
agent reads a "supplier" mail thread (a tool result: untrusted content) that carries an
attacker's IBAN, address, link and chat handle; the model is scripted to obey and copies
each into a call the agent is allowed to make, then does the user's own task. Per-agent
`untrusted_value` rules refuse the mail, the page fetch and the direct message before
`tool_started` (nothing reaches the sandbox), and hold the payment for a person, the
approval naming where the IBAN first appeared, in GetApproval, the CLI and Slack. The same
values given in the run's input pass. An allowlist (`value_allowed`) with `on_refusal: fail`
ends a run whose only call it refused as failed, and the refusal is counted in /metrics.

Per value kind (payee, recipient, link, chat user): the attacker's value copied from the
thread is refused before `tool_started` while the user's task completes, and the same value
given in the input, or by a person in the conversation, passes. A run that completes although
calls were refused says so in its outcome, output, CLI, HTTP API, console and /metrics.
"""

from __future__ import annotations

import json
import re
import secrets

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentrun.v1 import (
    agent_pb2,
    approval_pb2,
    approval_pb2_grpc,
    run_pb2,
    session_pb2,
    session_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
)
from tests.harness import secrets_seen
from tests.harness.agentrun_api import Api, pending_approval, sandbox_effects, sandbox_requests
from tests.harness.auth import bearer, channel, workspace_key
from tests.harness.browser import chromium, require_chromium
from tests.harness.cli import agentrun_async
from tests.harness.invariants import assert_log_well_formed
from tests.harness.waiting import eventually

WS = "acme"
APPROVER = "ops@acme.test"
IBAN = "GB33BUKB20201555555555"
ATTACKER = "mallory@evil.example"
LINK = "https://evil.example/confirm"
HANDLE = "@mallory"
TOKEN = secrets_seen.remember(f"scrape-{secrets.token_hex(16)}")
INSTRUCTIONS = "You keep the books: read supplier mail and report in #finance."
REFUSE = agent_pb2.CONSTRAINT_ACTION_REFUSE
HOLD = agent_pb2.CONSTRAINT_ACTION_HOLD


def untrusted(tool: str, action: int) -> agent_pb2.ToolConstraint:
    return agent_pb2.ToolConstraint(
        tool=tool, rule=agent_pb2.CONSTRAINT_RULE_UNTRUSTED_VALUE, action=action
    )


def registry_tools(url: str) -> list[tool_pb2.Tool]:
    """The workspace's own tools: a page fetch, a direct message and a bank transfer."""

    def schema(**props: str) -> str:
        properties = {k: {"type": v} for k, v in props.items()}
        return json.dumps({"type": "object", "properties": properties, "required": list(props)})

    return [
        tool_pb2.Tool(
            name="fetch_page",
            description="Fetch a web page.",
            parameters_json=schema(url="string"),
            access=tool_pb2.TOOL_ACCESS_READ,
            capabilities=["reads_untrusted"],
            http=tool_pb2.HttpTemplate(method="GET", url=f"{url}/web/page", query={"url": "{url}"}),
        ),
        tool_pb2.Tool(
            name="chat_dm",
            description="Send a chat user a direct message.",
            parameters_json=schema(user="string", text="string"),
            access=tool_pb2.TOOL_ACCESS_WRITE,
            idempotency=tool_pb2.IDEMPOTENCY_CLASS_NONE,
            capabilities=["communicates_externally"],
            http=tool_pb2.HttpTemplate(method="POST", url=f"{url}/chat/dm", body="arguments"),
        ),
        tool_pb2.Tool(
            name="pay_supplier",
            description="Transfer money to a supplier's IBAN.",
            parameters_json=schema(iban="string", amount="integer", reference="string"),
            access=tool_pb2.TOOL_ACCESS_WRITE,
            idempotency=tool_pb2.IDEMPOTENCY_CLASS_NONE,
            http=tool_pb2.HttpTemplate(
                method="POST", url=f"{url}/payments/transfers", body="arguments"
            ),
        ),
    ]


@pytest.fixture
async def stack(db_url, control_plane, executor_factory, sandbox_providers):
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    api = await Api.connect(cp.address, db_url, WS)
    tools = tool_pb2_grpc.ToolServiceStub(api.channel)
    for tool in registry_tools(sandbox_providers.url):
        await tools.CreateTool(tool_pb2.CreateToolRequest(tool=tool))
    approver = channel(cp.address, await workspace_key(db_url, WS, "approver", APPROVER))
    executor_factory(cp)
    yield cp, api, approval_pb2_grpc.ApprovalServiceStub(approver)
    await approver.close()
    await api.close()


async def publish(api: Api, agent_id: str, model: str, tools: list[str], **spec) -> None:
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id=agent_id))
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(
            workspace_id=WS,
            agent_id=agent_id,
            spec=agent_pb2.AgentSpec(model=model, instructions=INSTRUCTIONS, tools=tools, **spec),
            acknowledge_trifecta=True,
        )
    )


async def publish_bookkeeper(api: Api, agent_id: str) -> None:
    await publish(
        api,
        agent_id,
        "obey_supplier",
        ["read_thread", "send_email", "fetch_page", "chat_dm", "pay_supplier", "chat_post"],
        constraints=[
            untrusted("send_email", REFUSE),
            untrusted("fetch_page", REFUSE),
            untrusted("chat_dm", REFUSE),
            untrusted("pay_supplier", HOLD),
        ],
        approval=approval_pb2.ApprovalPolicy(approvers=[APPROVER], slack_approvers=["U_OPS"]),
    )


OUTBOUND = ("/mail/send", "/web/page", "/chat/dm", "/payments/transfers")


def outbound(url: str) -> dict[str, int]:
    """Requests the agents made (not the control plane's approval notices to APPROVER)."""
    counts = dict.fromkeys(OUTBOUND, 0)
    for r in sandbox_requests(url):
        notice = isinstance(r["body"], dict) and r["body"].get("to") == APPROVER
        if r["path"] in counts and not notice:
            counts[r["path"]] += 1
    return counts


def results(steps) -> dict[str, object]:
    return {s.payload["tool"]: s for s in steps if s.kind == "tool_result"}


async def test_values_from_a_tool_result_are_refused_or_held_and_the_task_still_completes(
    stack, sandbox_providers
):
    cp, api, approvals = stack
    url = sandbox_providers.url
    await publish_bookkeeper(api, "books")
    before = outbound(url)
    run_id = await api.start("books", "Read the supplier thread and report in #finance.")

    held = await pending_approval(api, approvals, run_id, APPROVER)
    steps = await api.steps(run_id)
    thread = results(steps)["read_thread"]
    origin = f"first appeared in the result of `read_thread` step {thread.seq}"
    # Refused before tool_started, naming the rule and the value; nothing reached a provider.
    by_tool = results(steps)
    for tool, value in (
        ("send_email", ATTACKER),
        ("fetch_page", "evil.example"),
        ("chat_dm", HANDLE),
    ):
        refusal = by_tool[tool].payload
        assert refusal["status"] == "error" and refusal["refused_by"] == "untrusted_value"
        assert f"refused by constraint untrusted_value on {tool}" in refusal["error"]
        assert value in refusal["error"] and origin in refusal["error"]
    started = {s.payload["tool"] for s in steps if s.kind == "tool_started"}
    assert started == {"read_thread"}
    assert outbound(url) == before

    # The payment is held, and the approval says where the IBAN came from.
    assert held.tool == "pay_supplier"
    (o,) = held.argument_origins
    assert (o.argument, o.value, o.seq, o.tool, o.untrusted) == (
        "iban",
        IBAN,
        thread.seq,
        "read_thread",
        True,
    )
    assert o.summary == origin
    requested = [s for s in steps if s.kind == "approval_requested"][-1]
    assert requested.payload["origins"][0]["summary"] == origin
    key = await workspace_key(api.db_url, WS, "approver", APPROVER)
    shown = await agentrun_async(
        cp.address, key, "approvals", "show", held.approval_id, workspace=WS
    )
    assert shown.returncode == 0, shown.stderr
    assert "UNTRUSTED-VALUES" in shown.stdout
    assert f"origin     iban {IBAN}: {origin}" in shown.stdout

    async def slack() -> list[dict] | None:
        posts = [
            e
            for e in sandbox_effects(url, "chat")
            if e.get("channel") == "#approvals" and run_id in e["text"]
        ]
        return posts or None

    (post,) = await eventually(slack, timeout=30, message="no Slack message for the approval")
    assert post["text"].startswith("WARNING: UNTRUSTED VALUES")
    assert f"- iban {IBAN}: {origin}" in post["text"]

    # The person rejects it; the model goes on with the user's task, and the run completes.
    await approvals.DecideApproval(
        approval_pb2.DecideApprovalRequest(
            workspace_id=WS,
            approval_id=held.approval_id,
            approver=APPROVER,
            reject=approval_pb2.Reject(reason="not our supplier's account"),
        )
    )
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.output.startswith("Read the supplier thread")
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    assert results(steps)["chat_post"].payload["status"] == "ok"
    assert outbound(url) == before, "no attacker value ever reached a provider"
    # Completed, but not silently: the finish step lists the refused calls.
    finish = steps[-1].payload
    assert [(r["tool"], r["rule"]) for r in finish["refused_calls"]] == [
        ("send_email", "untrusted_value"),
        ("fetch_page", "untrusted_value"),
        ("chat_dm", "untrusted_value"),
    ]


async def test_the_console_approval_page_warns_and_names_each_values_origin(
    stack, db_url, sandbox_providers
):
    """In a real browser (Debian's chromium): the inbox marks the approval, its page opens
    with the warning and links the origin step."""
    require_chromium()
    cp, api, approvals = stack
    await publish_bookkeeper(api, "books3")
    run_id = await api.start("books3", "Read the supplier thread and report in #finance.")
    held = await pending_approval(api, approvals, run_id, APPROVER)
    thread = results(await api.steps(run_id))["read_thread"]
    async with chromium(cp.http_url) as b:
        await b.sign_in_with_key(await workspace_key(db_url, WS, "approver", APPROVER))
        page = b.page
        await b.goto("/console/approvals")
        row = page.locator("#approvals tr", has=page.locator(f"a[href$='{held.approval_id}']"))
        assert await row.locator(".untrusted").inner_text() == "untrusted values"
        await b.goto(f"/console/approvals/{held.approval_id}")
        warning = await page.inner_text("#untrusted-values")
        assert "Untrusted values." in warning
        assert f"iban {IBAN}: first appeared in the result of read_thread step {thread.seq}" in (
            " ".join(warning.split())
        )
        link = page.locator("#untrusted-values a")
        assert await link.get_attribute("href") == f"/console/runs/{run_id}#step-{thread.seq}"
        await b.snap("approval-untrusted-values")
        assert b.errors == []


async def test_the_same_values_given_in_the_input_pass(stack, sandbox_providers):
    _, api, _ = stack
    url = sandbox_providers.url
    await publish_bookkeeper(api, "books2")
    before = outbound(url)
    text = (
        f"Pay GB33 BUKB 2020 1555 5555 55 the open balance, mail the statement to "
        f"{ATTACKER.upper()}, confirm at {LINK} and tell {HANDLE} in chat."
    )
    run_id = await api.start("books2", text)
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    steps = await api.steps(run_id)
    assert not [s for s in steps if s.kind == "approval_requested"]
    for tool in ("send_email", "fetch_page", "chat_dm", "pay_supplier", "chat_post"):
        assert results(steps)[tool].payload["status"] == "ok", tool
    after = outbound(url)
    assert all(after[path] == before[path] + 1 for path in OUTBOUND), (before, after)
    assert "refused_calls" not in steps[-1].payload


async def test_a_run_whose_only_call_was_refused_fails_saying_so_and_is_counted(stack):
    cp, api, _ = stack
    allowlist = agent_pb2.ToolConstraint(
        tool="send_email",
        rule=agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED,
        value_kind=agent_pb2.VALUE_KIND_EMAIL,
        allowed=["@acme.test"],
    )
    await publish(
        api,
        "mailer",
        "obey_recipient_only",
        ["send_email"],
        constraints=[allowlist],
        on_refusal=agent_pb2.ON_REFUSAL_FAIL,
    )
    run_id = await api.start("mailer", "Send the customer list.")
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert run.error.startswith("refused by constraint value_allowed on send_email")
    assert f"to {ATTACKER} is not an allowed recipient" in run.error
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    assert not [s for s in steps if s.kind == "tool_started"]
    assert steps[-1].kind == "finish"

    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(
            f"{cp.http_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}
        )
    assert reply.status_code == 200, reply.text
    samples = [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    ]
    runs = [
        v
        for n, labels, v in samples
        if n == "agentrun_refused_runs_total" and labels["workspace"] == WS
    ]
    calls = [
        v
        for n, labels, v in samples
        if n == "agentrun_refused_calls_total"
        and labels == {"workspace": WS, "rule": "value_allowed"}
    ]
    assert runs == [1.0] and calls == [1.0]


async def test_a_payee_paid_before_passes_and_a_new_one_is_refused(stack, sandbox_providers):
    """value_allowed with or_seen_before: the workspace's earlier ok payments are the list."""
    _, api, _ = stack
    await publish(api, "payer", "pay_input", ["pay_supplier"])
    first = await api.start("payer", IBAN)
    (run,) = await api.wait_terminal([first], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    payees = agent_pb2.ToolConstraint(
        tool="pay_supplier",
        rule=agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED,
        value_kind=agent_pb2.VALUE_KIND_IBAN,
        or_seen_before=True,
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(
            workspace_id=WS,
            agent_id="payer",
            spec=agent_pb2.AgentSpec(
                model="pay_input",
                instructions=INSTRUCTIONS,
                tools=["pay_supplier"],
                constraints=[payees],
                on_refusal=agent_pb2.ON_REFUSAL_FAIL,
            ),
        )
    )
    again, new = await api.start("payer", IBAN), await api.start("payer", "DE89370400440532013000")
    paid, refused = await api.wait_terminal([again, new], within=60)
    assert paid.status == run_pb2.RUN_STATUS_COMPLETED, paid.error
    assert refused.status == run_pb2.RUN_STATUS_FAILED
    assert refused.error == (
        "refused by constraint value_allowed on pay_supplier: iban DE89370400440532013000 is "
        "not an allowed payee; nothing was sent"
    )
    transfers = [
        e for e in sandbox_effects(sandbox_providers.url, "payments") if e["effect"] == "transfer"
    ]
    assert [
        t["iban"] for t in transfers if t["key"] and t["key"].split(":")[0] in (first, again, new)
    ] == [IBAN, IBAN]


async def test_an_approver_who_approves_fast_and_often_is_flagged_to_the_admins(
    stack, db_url, sandbox_providers
):
    cp, api, approvals = stack
    admin = await workspace_key(db_url, WS, "admin")
    watch = await agentrun_async(
        cp.address, admin, "workspaces", "set-approval-watch", "2", "1h", "60s", workspace=WS
    )
    assert watch.returncode == 0, watch.stderr
    assert "watch      2 approvals in 3600s, each within 60s: approver flagged" in watch.stdout
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER])
    await publish(api, "mailer", "approval", ["send_email"], approval=policy)
    for _ in range(2):
        run_id = await api.start("mailer", "email ada")
        held = await pending_approval(api, approvals, run_id, APPROVER)
        await approvals.DecideApproval(
            approval_pb2.DecideApprovalRequest(
                workspace_id=WS,
                approval_id=held.approval_id,
                approver=APPROVER,
                approve=approval_pb2.Approve(),
            )
        )

    async def flagged() -> list[dict] | None:
        mails = [
            e
            for e in sandbox_effects(sandbox_providers.url, "mail")
            if e["subject"] == f"Approver flagged: {APPROVER} approves quickly"
            and held.approval_id in e["body"]
        ]
        return mails or None

    (mail,) = await eventually(flagged, timeout=30, message="the admins were never told")
    assert mail["to"] == "admin"
    assert f"{APPROVER} approved 2 tool calls within 3600s, each within 60s" in mail["body"]
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(
            f"{cp.http_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}
        )
    assert 'agentrun_approvers_flagged_total{workspace="acme"} 1.0' in reply.text


# (scenario, tool, provider path, the attacker's value, how the refusal names it)
KINDS = [
    pytest.param("obey_payee", "pay_supplier", "/payments/transfers", IBAN, IBAN, id="payee"),
    pytest.param("obey_recipient", "send_email", "/mail/send", ATTACKER, ATTACKER, id="recipient"),
    pytest.param("obey_link", "fetch_page", "/web/page", LINK, "evil.example", id="url"),
    pytest.param("obey_chat_user", "chat_dm", "/chat/dm", HANDLE, HANDLE, id="chat-user"),
]
TASK = "Read the supplier thread and report in #finance."


def sent(url: str, run_id: str, path: str) -> int:
    """Requests `run_id` made to `path` of the provider sandbox (keyed run_id:seq)."""
    return sum(
        1
        for r in sandbox_requests(url)
        if r["path"] == path and str(r.get("idempotency_key") or "").startswith(run_id)
    )


def ran_ok(steps, tool: str) -> bool:
    return results(steps)[tool].payload["status"] == "ok"


@pytest.mark.parametrize(("model", "tool", "path", "value", "named"), KINDS)
async def test_one_kind_from_a_tool_result_is_refused_and_from_the_input_or_a_person_passes(
    stack, sandbox_providers, model, tool, path, value, named
):
    """A model that obeys the injected thread: the value it copies is refused before
    tool_started, naming rule and value, and the user's own task still completes; the same
    value given in the run's input, or confirmed by the user in the session, is sent."""
    _, api, _ = stack
    url = sandbox_providers.url
    await publish(api, model, model, ["read_thread", tool, "chat_post"], **refusing(tool))
    sessions = session_pb2_grpc.SessionServiceStub(api.channel)
    created = await sessions.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id=model, title="books")
    )
    session_id = created.session.session_id

    async def say(text: str) -> str:
        request = session_pb2.SendMessageRequest(workspace_id=WS, session_id=session_id, text=text)
        return (await sessions.SendMessage(request)).turn.run_id

    attacked = await say(TASK)
    given = await api.start(model, f"{TASK} Use {value}.")
    run, passed = await api.wait_terminal([attacked, given], within=60)

    steps = await api.steps(attacked)
    assert_log_well_formed(steps)
    refusal = results(steps)[tool]
    assert refusal.payload["refused_by"] == "untrusted_value"
    assert f"refused by constraint untrusted_value on {tool}: " in refusal.payload["error"]
    assert named in refusal.payload["error"]
    assert tool not in {s.payload["tool"] for s in steps if s.kind == "tool_started"}
    assert sent(url, attacked, path) == 0, "the attacker's value reached the provider"
    # The user's task is done, and the run says the refused call did not run.
    assert ran_ok(steps, "chat_post")
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.outcome == run_pb2.RUN_OUTCOME_COMPLETED_WITH_REFUSALS
    assert run.counters.refused_calls == 1
    assert run.output.endswith(f"did not run: {tool} (step {refusal.seq}, untrusted_value)."), (
        run.output
    )

    # Given in the input: sent, and the task done too.
    assert passed.status == run_pb2.RUN_STATUS_COMPLETED, passed.error
    assert (passed.outcome, passed.counters.refused_calls) == (run_pb2.RUN_OUTCOME_COMPLETED, 0)
    steps = await api.steps(given)
    assert ran_ok(steps, tool) and ran_ok(steps, "chat_post")
    assert sent(url, given, path) == 1

    # A person, the session's user, confirms the value: the model's call goes through.
    confirmed = await say(f"Yes, {value} is right: go ahead.")
    (run,) = await api.wait_terminal([confirmed], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.outcome == run_pb2.RUN_OUTCOME_COMPLETED
    steps = await api.steps(confirmed)
    assert_log_well_formed(steps)
    assert ran_ok(steps, tool) and ran_ok(steps, "chat_post")
    assert sent(url, confirmed, path) == 1


def refusing(tool: str) -> dict:
    return {"constraints": [untrusted(tool, REFUSE)]}


async def test_a_run_whose_only_call_was_refused_reads_so_everywhere_and_is_counted(stack, db_url):
    """The default on_refusal (retry): the model answers after the refusal and the run
    completes, but its outcome is only_refused in GetRun, the HTTP API, `runs show` and
    `runs list`, the console, its output and /metrics; never a plain success."""
    cp, api, _ = stack
    allowlist = agent_pb2.ToolConstraint(
        tool="send_email",
        rule=agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED,
        value_kind=agent_pb2.VALUE_KIND_EMAIL,
        allowed=["@acme.test"],
    )
    await publish(api, "mailer", "obey_recipient_only", ["send_email"], constraints=[allowlist])
    run_id = await api.start("mailer", "Send the customer list.")
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.outcome == run_pb2.RUN_OUTCOME_ONLY_REFUSED
    assert (run.counters.refused_calls, run.counters.tool_calls) == (1, 0)
    steps = await api.steps(run_id)
    refusal = results(steps)["send_email"]
    assert run.output == (
        "sent\n\n[agentrun] 1 tool call(s) were refused by constraints and did not run: "
        f"send_email (step {refusal.seq}, value_allowed)."
    )
    assert steps[-1].payload["output"] == run.output

    key = await workspace_key(db_url, WS, "admin")
    shown = await agentrun_async(cp.address, key, "runs", "show", run_id, workspace=WS)
    assert shown.returncode == 0, shown.stderr
    assert (
        "state     completed (only refused: its 1 call(s) were all refused by constraints, "
        "none ran)" in shown.stdout
    ), shown.stdout
    listed = await agentrun_async(cp.address, key, "runs", "list", workspace=WS)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(run_id)]
    assert "only refused" in row

    async with httpx.AsyncClient(base_url=cp.http_url, timeout=10) as http:
        got = await http.get(f"/v1/workspaces/{WS}/runs/{run_id}", headers=bearer(key))
        assert got.status_code == 200, got.text
        assert got.json()["outcome"] == "only_refused"
        assert got.json()["counters"]["refused_calls"] == 1
        # The console's run page, signed in with the key: a badge next to the status.
        form = await http.get("/console/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text
        signin = {"csrf": csrf[1], "key": key, "next": "/console/runs"}
        assert (await http.post("/console/signin/key", data=signin)).status_code == 303
        page = await http.get(f"/console/runs/{run_id}")
        assert page.status_code == 200, page.text
        assert re.search(
            r'<span class="badge refused" id="run-refused">only refused: none of its calls ran',
            page.text,
        ), page.text
        listed_page = await http.get("/console/runs")
        assert '<span class="badge refused">only refused</span>' in listed_page.text
        reply = await http.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 200, reply.text
    counted = [
        (s.labels["outcome"], s.value)
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
        if s.name == "agentrun_runs_finished_with_refusals_total" and s.labels["workspace"] == WS
    ]
    assert counted == [("only_refused", 1.0)]


async def test_a_list_the_workspace_keeps_lets_its_payees_through_and_refuses_the_rest(
    stack, db_url
):
    """value_allowed with workspace_list: the workspace's named list (set by an admin with
    `workspaces set-allowlist`) is read when the run is assigned."""
    cp, api, _ = stack
    key = await workspace_key(db_url, WS, "admin")
    kept = await agentrun_async(
        cp.address,
        key,
        "workspaces",
        "set-allowlist",
        "payees",
        "gb33 bukb 2020 1555 5555 55",
        workspace=WS,
    )
    assert kept.returncode == 0, kept.stderr
    assert 'allowlist  payees: ["gb33 bukb 2020 1555 5555 55"]' in kept.stdout
    shown = await agentrun_async(cp.address, key, "workspaces", "show", workspace=WS)
    assert 'allowlist  payees: ["gb33 bukb 2020 1555 5555 55"]' in shown.stdout, shown.stderr
    bad = await agentrun_async(
        cp.address, key, "workspaces", "set-allowlist", "Payees!", IBAN, workspace=WS
    )
    assert bad.returncode != 0 and "allowlist.name: must be 1 to 64 of a-z" in bad.stderr
    payees = agent_pb2.ToolConstraint(
        tool="pay_supplier",
        rule=agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED,
        value_kind=agent_pb2.VALUE_KIND_IBAN,
        workspace_list="payees",
    )
    await publish(
        api,
        "payer",
        "pay_input",
        ["pay_supplier"],
        constraints=[payees],
        on_refusal=agent_pb2.ON_REFUSAL_FAIL,
    )
    listed, other = (
        await api.start("payer", IBAN),
        await api.start("payer", "DE89370400440532013000"),
    )
    paid, refused = await api.wait_terminal([listed, other], within=60)
    assert paid.status == run_pb2.RUN_STATUS_COMPLETED, paid.error
    assert paid.outcome == run_pb2.RUN_OUTCOME_COMPLETED
    assert refused.status == run_pb2.RUN_STATUS_FAILED
    assert refused.error == (
        "refused by constraint value_allowed on pay_supplier: iban DE89370400440532013000 is "
        "not an allowed payee; nothing was sent"
    )
