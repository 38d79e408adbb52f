// The client against a running stack (`agentrun dev`): AGENTRUN_HTTP_URL, AGENTRUN_API_KEY
// (an admin key), AGENTRUN_APPROVER_KEY (the dev stack's approver key, manager@example.com),
// AGENTRUN_WORKSPACE, and the agents of test/agents/*.yaml plus examples/triage.yaml applied.
// tests/integration/test_typescript_client.py sets all that up and runs this file.
import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentRun, AgentRunError } from "../dist/index.js";

const client = (options = {}) => new AgentRun({ backoffMs: 10, ...options });
const tag = () => `ts-${crypto.randomUUID()}`;

async function collect(iterable) {
  const out = [];
  for await (const item of iterable) out.push(item);
  return out;
}

/** A fetch that records requests; `mangle(send, n)` may answer the nth without the server,
 * or send it and lose or cut the answer. */
function recording(mangle = (send) => send()) {
  const requests = [];
  const wrapped = async (url, init) => {
    requests.push({ url: new URL(url), method: init?.method ?? "GET", headers: init?.headers });
    return mangle(() => fetch(url, init), requests.length);
  };
  return { fetch: wrapped, requests };
}

test("start: a retried start with the same key returns the same run", async () => {
  const key = crypto.randomUUID();
  const input = tag();
  const first = await client().startRun("ts-echo", input, { idempotencyKey: key });
  assert.equal(first.created, true);
  assert.equal(first.run.agent_id, "ts-echo");
  assert.match(first.run.run_id, /^[0-9a-f-]{36}$/);
  const again = await client().startRun("ts-echo", input, { idempotencyKey: key });
  assert.equal(again.created, false);
  assert.equal(again.run.run_id, first.run.run_id);
  assert.deepEqual(await collect(client().listRuns({ search: input })).then((r) => r.length), 1);
});

test("start: an answer lost to the network is retried with the same key, one run", async () => {
  const input = tag();
  // The server starts the run; its answer never reaches the caller (the connection drops).
  const losing = recording(async (send, n) => {
    const response = await send();
    if (n > 1) return response;
    await response.body?.cancel();
    throw new TypeError("fetch failed", { cause: new Error("other side closed") });
  });
  const { run, created } = await client({ fetch: losing.fetch }).startRun("ts-echo", input);
  assert.equal(losing.requests.length, 2);
  const keys = losing.requests.map((r) => r.headers["Idempotency-Key"]);
  assert.ok(keys[0] && keys[0] === keys[1], "both attempts carry the one generated key");
  assert.equal(created, false, "the retry found the run the lost attempt started");
  const found = await collect(client().listRuns({ search: input }));
  assert.deepEqual(
    found.map((r) => r.run_id),
    [run.run_id],
  );
});

test("start: a 503 is retried with backoff; a 400 is not, and names the field", async () => {
  const busy = recording(async (send, n) => {
    if (n > 2) return send();
    return new Response('{"title":"Service Unavailable","status":503}', { status: 503 });
  });
  const { created } = await client({ fetch: busy.fetch }).startRun("ts-echo", tag());
  assert.equal(busy.requests.length, 3);
  assert.equal(created, true);

  const refused = recording();
  const err = await client({ fetch: refused.fetch })
    .startRun("ts-echo", "x", { priority: 500 })
    .then(() => assert.fail("a negative priority was accepted"))
    .catch((e) => e);
  assert.ok(err instanceof AgentRunError, String(err));
  assert.equal(err.status, 400);
  assert.equal(err.field, "priority");
  assert.equal(refused.requests.length, 1, "a 400 is never retried");
});

test("errors: problem details as AgentRunError with status, title and field", async () => {
  const missing = await client()
    .getRun("00000000-0000-4000-8000-000000000000")
    .catch((e) => e);
  assert.ok(missing instanceof AgentRunError);
  assert.equal(missing.status, 404);
  assert.ok(missing.title);

  const bad = await client()
    .getRun("not-a-run-id")
    .catch((e) => e);
  assert.equal(bad.status, 400);
  assert.equal(bad.field, "run_id");

  const stranger = await client({ apiKey: "agr_ws_0000000000000000_nope" })
    .getRun("00000000-0000-4000-8000-000000000000")
    .catch((e) => e);
  assert.equal(stranger.status, 401);
  assert.ok(!stranger.message.includes("agr_ws_0000000000000000_nope"), "no key in errors");
});

test("watch from an offset: the steps from that seq on, then the finished run", async () => {
  const ar = client();
  const input = tag();
  const done = await ar.startAndWait("ts-echo", input);
  assert.equal(done.status, "completed");
  assert.ok(JSON.stringify(done.output).includes(input), JSON.stringify(done.output));
  const all = await collect(ar.listSteps(done.run_id));
  assert.ok(all.length >= 4, `${all.length} steps`);
  assert.deepEqual(
    all.map((s) => s.seq),
    all.map((_, i) => all[0].seq + i),
  );

  const from = all[2].seq;
  const events = await collect(ar.watch(done.run_id, { fromSeq: from }));
  // The run as it is now first, then its steps from `from` on; the stream ends with the run.
  assert.equal(events[0].type, "run");
  assert.equal(events[0].run.status, "completed");
  const steps = events.filter((e) => e.type === "step").map((e) => e.step);
  assert.deepEqual(
    steps.map((s) => s.seq),
    all.filter((s) => s.seq >= from).map((s) => s.seq),
  );
  assert.deepEqual(steps.at(-1), all.at(-1));
});

test("watch: a dropped stream resumes with Last-Event-ID, no step missed or repeated", async () => {
  const ar = client();
  const done = await ar.startAndWait("ts-echo", tag());
  const all = await collect(ar.listSteps(done.run_id));
  // The first connection dies after its second event (the run, then the first step), as
  // behind a proxy that cuts streams.
  const cutting = recording(async (send, n) => (n === 1 ? cutAfter(await send(), 2) : send()));
  const events = await collect(client({ fetch: cutting.fetch }).watch(done.run_id));
  const seqs = events.filter((e) => e.type === "step").map((e) => e.step.seq);
  assert.deepEqual(
    seqs,
    all.map((s) => s.seq),
  );
  assert.equal(cutting.requests.length, 2);
  const resumed = cutting.requests[1].headers["Last-Event-ID"];
  assert.equal(resumed, String(all[0].seq));
  const runs = events.filter((e) => e.type === "run");
  assert.equal(runs.length, 2, "each connection opens with the run");
});

test("approve: the run waits for the approver, who approves; it completes", async () => {
  const ar = client();
  const approver = client({ apiKey: process.env.AGENTRUN_APPROVER_KEY });
  const { run } = await ar.startRun("triage", `Follow up with ada@example.com (${tag()})`);
  let approval;
  const kinds = [];
  for await (const event of ar.watch(run.run_id)) {
    if (event.type === "step") kinds.push(event.step.kind);
    if (event.type === "run" && event.run.status === "waiting" && !approval) {
      const pending = await collect(ar.listApprovals({ state: "pending" }));
      approval = pending.find((a) => a.run_id === run.run_id);
      assert.ok(approval, `no pending approval for ${run.run_id}`);
      assert.equal(approval.tool, "send_email");
      assert.equal(approval.arguments.to, "ada@example.com");
      const refused = await ar.approve(approval.approval_id).catch((e) => e);
      assert.equal(refused.status, 403, "the admin key may not decide");
      const decided = await approver.approve(approval.approval_id);
      assert.equal(decided.state, "approved");
      assert.ok(decided.decided_by);
    }
  }
  assert.ok(approval, "the run never waited for approval");
  assert.ok(kinds.includes("approval_requested") && kinds.includes("approval_decided"), kinds);
  const final = await ar.getRun(run.run_id);
  assert.equal(final.status, "completed");
  assert.equal((await ar.getApproval(approval.approval_id)).state, "approved");
});

test("deny: the approver rejects with a reason, the run goes on; a second decision loses", async () => {
  const ar = client();
  const approver = client({ apiKey: process.env.AGENTRUN_APPROVER_KEY });
  const { run } = await ar.startRun("triage", `Follow up with ada@example.com (${tag()})`);
  let approval;
  let last;
  for await (const event of ar.watch(run.run_id)) {
    if (event.type !== "run") continue;
    last = event.run;
    if (event.run.status === "waiting" && !approval) {
      const pending = await collect(ar.listApprovals({ state: "pending" }));
      approval = pending.find((a) => a.run_id === run.run_id);
      const decided = await approver.deny(approval.approval_id, "not today");
      assert.equal(decided.state, "rejected");
      assert.equal(decided.reason, "not today");
    }
  }
  assert.ok(approval, "the run never waited for approval");
  assert.equal(last.status, "completed", "the run went on without the call");
  const again = await approver.approve(approval.approval_id).catch((e) => e);
  assert.ok(again instanceof AgentRunError, String(again));
  assert.equal(again.status, 409, "a second decision loses");
});

test("the rest: agents, forks, sessions, signals, unknown outcomes", async () => {
  const ar = client();
  const agents = await collect(ar.listAgents({ pageSize: 2 }));
  for (const id of ["triage", "ts-echo", "ts-slow", "ts-bulk"]) {
    assert.ok(agents.some((a) => a.agent_id === id), `${id} not listed`);
  }
  assert.equal((await ar.getAgent("ts-echo")).latest_version, 1);
  assert.equal((await ar.getAgentVersion("ts-echo")).spec.model, "echo_input");

  const done = await ar.startAndWait("ts-echo", tag());
  const steps = await collect(ar.listSteps(done.run_id));
  const closed = steps.find((s) => s.kind === "tool_result");
  const fork = await ar.forkRun(done.run_id, { fromSeq: closed.seq });
  assert.equal(fork.forked_from_run_id, done.run_id);
  assert.equal(fork.forked_from_seq, closed.seq);
  assert.notEqual(fork.run_id, done.run_id);

  const session = await ar.createSession("ts-echo", { title: "from TypeScript" });
  assert.equal(session.title, "from TypeScript");
  const requestId = crypto.randomUUID();
  const first = await ar.sendMessage(session.session_id, "hello", { requestId });
  const again = await ar.sendMessage(session.session_id, "hello", { requestId });
  assert.equal(first.created, true);
  assert.equal(again.created, false);
  assert.equal(again.run_id, first.run_id);
  assert.deepEqual(
    (await collect(ar.listTurns(session.session_id))).map((t) => t.run_id),
    [first.run_id],
  );
  assert.equal((await ar.getSession(session.session_id)).turn_count, 1);

  const { run } = await ar.startRun("ts-slow", tag());
  const eventId = crypto.randomUUID();
  const sent = await ar.signalRun(run.run_id, "nudge", { n: 1 }, { eventId });
  assert.equal(sent.created, true);
  assert.deepEqual(sent.signal.payload, { n: 1 });
  const resent = await ar.signalRun(run.run_id, "nudge", { n: 1 }, { eventId });
  assert.equal(resent.created, false);
  // A watch stopped by its AbortSignal ends quietly.
  const stop = new AbortController();
  const seen = [];
  for await (const event of ar.watch(run.run_id, { signal: stop.signal })) {
    seen.push(event);
    stop.abort();
  }
  assert.deepEqual(
    seen.map((e) => e.type),
    ["run"],
  );
  await ar.cancelRun(run.run_id, "done with it");

  const unknown = await ar.resolveUnknownOutcome(done.run_id, 1, "happened").catch((e) => e);
  assert.ok(unknown instanceof AgentRunError, String(unknown));
  assert.ok(unknown.status >= 400 && unknown.status < 500, unknown.message);
  const bad = await ar.resolveUnknownOutcome(done.run_id, 1, "perhaps").catch((e) => e);
  assert.equal(bad.status, 400);
  assert.equal(bad.field, "decision");
});

test("cancel: a working run is cancelled and its watch ends", async () => {
  const ar = client();
  const { run } = await ar.startRun("ts-slow", tag());
  const events = [];
  for await (const event of ar.watch(run.run_id)) {
    events.push(event);
    if (event.type === "step" && event.step.kind === "tool_result") {
      const cancelled = await ar.cancelRun(run.run_id, "not needed");
      assert.equal(cancelled.run_id, run.run_id);
    }
  }
  const last = events.filter((e) => e.type === "run").at(-1);
  assert.equal(last.run.status, "cancelled");
  assert.equal((await ar.getRun(run.run_id)).status, "cancelled");
});

test("list: paging past 200 runs, every run once, in pages", async () => {
  const ar = client();
  const batch = tag();
  const started = new Set();
  const total = 205;
  for (let i = 0; i < total; i += 15) {
    const n = Math.min(15, total - i);
    const got = await Promise.all(
      Array.from({ length: n }, (_, j) => ar.startRun("ts-bulk", `${batch} #${i + j}`)),
    );
    for (const { run } of got) started.add(run.run_id);
  }
  assert.equal(started.size, total);

  const counting = recording();
  const listed = await collect(
    client({ fetch: counting.fetch }).listRuns({ agentId: "ts-bulk", search: batch, pageSize: 50 }),
  );
  assert.equal(listed.length, total);
  assert.deepEqual(new Set(listed.map((r) => r.run_id)), started);
  assert.equal(counting.requests.length, 5, "205 runs are 5 pages of 50");
  const tokens = counting.requests.map((r) => r.url.searchParams.get("page_token"));
  assert.equal(tokens[0], null);
  assert.ok(tokens.slice(1).every(Boolean));

  // The default page size (50) pages too, without being told a size.
  const again = await collect(ar.listRuns({ search: batch }));
  assert.equal(again.length, total);

  // Filters: the cap of one keeps most of them queued; all were created in the last hour.
  const queued = await collect(
    ar.listRuns({ search: batch, status: "queued", createAfter: new Date(Date.now() - 3600e3) }),
  );
  assert.ok(queued.length >= total - 2, `${queued.length} queued`);
  assert.ok(queued.every((r) => r.status === "queued" && r.agent_id === "ts-bulk"));
  const future = await ar.listRunsPage({ search: batch, createAfter: "2999-01-01T00:00:00Z" });
  assert.deepEqual(future.items, []);

  const first = await ar.listRunsPage({ search: batch, pageSize: 200 });
  assert.equal(first.items.length, 200);
  assert.ok(first.nextPageToken);
  const rest = await ar.listRunsPage({ search: batch, pageSize: 200 }, first.nextPageToken);
  assert.equal(rest.items.length, 5);
  assert.equal(rest.nextPageToken, "");
});

/** A response whose body fails (as a dropped connection does) after `events` whole events. */
function cutAfter(response, events) {
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let text = "";
  let sent = false;
  const body = response.body.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        if (sent) return;
        text += decoder.decode(chunk, { stream: true });
        let end = -1;
        for (let i = 0; i < events; i++) {
          end = text.indexOf("\n\n", end + 1);
          if (end < 0) return;
        }
        controller.enqueue(encoder.encode(text.slice(0, end + 2)));
        sent = true;
        controller.error(new TypeError("terminated"));
      },
    }),
  );
  return new Response(body, { status: response.status, headers: response.headers });
}
