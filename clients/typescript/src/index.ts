/**
 * @agentrun/client: agentrun's HTTP/JSON API from Node (>= 18) or a browser, with the
 * platform's fetch and no runtime dependencies.
 *
 *     const ar = new AgentRun();   // AGENTRUN_HTTP_URL, AGENTRUN_API_KEY, AGENTRUN_WORKSPACE
 *     const { run } = await ar.startRun("triage", "Follow up with ada@example.com");
 *     for await (const ev of ar.watch(run.run_id)) console.log(ev);
 */
import { AgentRunError, errorFrom } from "./errors.js";
import { parseSse } from "./sse.js";
import type {
  Agent,
  AgentVersion,
  Answer,
  Approval,
  ApprovalState,
  Body,
  JsonValue,
  OperationId,
  OutcomeDecision,
  Query,
  Run,
  RunDelta,
  RunStatus,
  Session,
  SessionStrategy,
  Signal,
  Step,
  Turn,
} from "./types.js";

export { AgentRunError } from "./errors.js";
export { parseSse, type SseEvent } from "./sse.js";
export type * from "./types.js";

/** The dev stack's HTTP ingress, where `agentrun dev` listens unless told otherwise. */
export const DEFAULT_ADDRESS = "http://127.0.0.1:8080";
export const DEFAULT_WORKSPACE = "default";
const TERMINAL: ReadonlySet<string> = new Set(["completed", "failed", "cancelled"]);

export interface AgentRunOptions {
  /** The HTTP ingress's base URL (env AGENTRUN_HTTP_URL; default http://127.0.0.1:8080). */
  address?: string;
  /** A workspace API key (env AGENTRUN_API_KEY; `agentrun dev-key` prints the dev stack's). */
  apiKey?: string;
  /** The workspace (env AGENTRUN_WORKSPACE; default "default", the CLI's). */
  workspaceId?: string;
  /** Attempts for a call answered 503 or lost to the network (default 5: 4 retries). */
  maxAttempts?: number;
  /** The first retry's delay in ms, doubling each time, with jitter (default 200). */
  backoffMs?: number;
  /** The fetch to use (default the global one): a test's, or one with a proxy agent. */
  fetch?: typeof fetch;
}

export interface RunFilter {
  agentId?: string;
  status?: RunStatus;
  /** Runs created after this time (a Date or RFC 3339 text). */
  createAfter?: Date | string;
  search?: string;
  forkedFromRunId?: string;
  /** Runs fetched per request (the server caps it). */
  pageSize?: number;
}

export interface Page<T> {
  items: T[];
  nextPageToken: string;
}

export interface StartRunOptions {
  agentVersion?: number;
  priority?: number;
  /** The Idempotency-Key: a retried start with the same key returns the same run. A random
   * UUID when not given, so the client's own retries never start a run twice. */
  idempotencyKey?: string;
}

export interface StartRunResult {
  run: Run;
  /** False when the idempotency key named a run started before (the answer was 200, not 201). */
  created: boolean;
}

export type WatchEvent =
  | { type: "step"; step: Step }
  | { type: "run"; run: Run }
  | { type: "delta"; delta: RunDelta };

export interface WatchOptions {
  /** The first step to send (steps before it are skipped); default 0: every step. */
  fromSeq?: number;
  /** Also the model's answer as it streams, `{type: "delta"}` events (default false). */
  deltas?: boolean;
  /** Stop watching (the iterator ends). */
  signal?: AbortSignal;
  /** How many times in a row a dropped stream is resumed before giving up (default 5). */
  maxReconnects?: number;
}

interface CallOptions<K extends OperationId> {
  query?: Query<K>;
  body?: Body<K>;
  headers?: Record<string, string>;
  /** Safe to send again after a network failure (the server may have acted on the first). */
  idempotent?: boolean;
  signal?: AbortSignal;
}

const env = (name: string): string | undefined => {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[name] || undefined;
};

const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = () => {
      signal?.removeEventListener("abort", abort);
      resolve();
    };
    const abort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", abort, { once: true });
  });

export class AgentRun {
  readonly address: string;
  readonly workspaceId: string;
  readonly #apiKey: string;
  readonly #fetch: typeof fetch;
  readonly #maxAttempts: number;
  readonly #backoffMs: number;

  constructor(options: AgentRunOptions = {}) {
    this.address = (options.address ?? env("AGENTRUN_HTTP_URL") ?? DEFAULT_ADDRESS).replace(
      /\/+$/,
      "",
    );
    this.workspaceId = options.workspaceId ?? env("AGENTRUN_WORKSPACE") ?? DEFAULT_WORKSPACE;
    const key = options.apiKey ?? env("AGENTRUN_API_KEY");
    if (!key) {
      throw new Error(
        "agentrun: no API key: pass apiKey or set AGENTRUN_API_KEY " +
          "(`agentrun dev-key` prints the dev stack's)",
      );
    }
    this.#apiKey = key;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#maxAttempts = Math.max(1, options.maxAttempts ?? 5);
    this.#backoffMs = options.backoffMs ?? 200;
  }

  // ---- runs

  /** Start a run of `agentId` with `input` (text, or any JSON value: the run gets its JSON
   * text). Always carries an Idempotency-Key, so a retry (the client's, or yours with the same
   * key) starts it once. */
  async startRun(
    agentId: string,
    input: JsonValue,
    options: StartRunOptions = {},
  ): Promise<StartRunResult> {
    const key = options.idempotencyKey ?? crypto.randomUUID();
    const body: Body<"StartRun"> = { agent_id: agentId, input };
    if (options.agentVersion !== undefined) body.agent_version = options.agentVersion;
    if (options.priority !== undefined) body.priority = options.priority;
    const { data, status } = await this.#op("StartRun", "POST", "runs", {
      body,
      headers: { "Idempotency-Key": key },
      idempotent: true,
    });
    return { run: data, created: status === 201 };
  }

  async getRun(runId: string): Promise<Run> {
    return (await this.#op("GetRun", "GET", `runs/${enc(runId)}`)).data;
  }

  /** Every run that matches, newest first, fetching pages as the loop asks for them. */
  listRuns(filter: RunFilter = {}): AsyncGenerator<Run> {
    return this.#pages((token) => this.listRunsPage(filter, token));
  }

  /** One page of runs; pass its nextPageToken for the next ("" after the last page). */
  async listRunsPage(filter: RunFilter = {}, pageToken = ""): Promise<Page<Run>> {
    const createAfter =
      filter.createAfter instanceof Date ? filter.createAfter.toISOString() : filter.createAfter;
    const { data } = await this.#op("ListRuns", "GET", "runs", {
      query: {
        agent_id: filter.agentId,
        status: filter.status,
        create_after: createAfter,
        search: filter.search,
        forked_from_run_id: filter.forkedFromRunId,
        page_size: filter.pageSize,
        page_token: pageToken || undefined,
      },
    });
    return { items: data.runs, nextPageToken: data.next_page_token };
  }

  async cancelRun(runId: string, reason = ""): Promise<Run> {
    const path = `runs/${enc(runId)}/cancel`;
    return (await this.#op("CancelRun", "POST", path, { body: { reason }, idempotent: true }))
      .data;
  }

  /** A new run that replays `runId`'s log up to `fromSeq` and goes on from there. */
  async forkRun(
    runId: string,
    options: { fromSeq?: number; agentVersion?: number; priority?: number } = {},
  ): Promise<Run> {
    const body: Body<"ForkRun"> = {};
    if (options.fromSeq !== undefined) body.from_seq = options.fromSeq;
    if (options.agentVersion !== undefined) body.agent_version = options.agentVersion;
    if (options.priority !== undefined) body.priority = options.priority;
    return (await this.#op("ForkRun", "POST", `runs/${enc(runId)}/fork`, { body })).data;
  }

  /** Send a signal; `eventId` (a random UUID when not given) makes a resend a no-op. */
  async signalRun(
    runId: string,
    signalName: string,
    payload: JsonValue = null,
    options: { eventId?: string } = {},
  ): Promise<{ signal: Signal | undefined; created: boolean; run: Run | undefined }> {
    const { data } = await this.#op("SignalRun", "POST", `runs/${enc(runId)}/signals`, {
      body: { signal_name: signalName, event_id: options.eventId ?? crypto.randomUUID(), payload },
      idempotent: true,
    });
    return { signal: data.signal, created: data.created, run: data.run };
  }

  /** A run's steps in order from `fromSeq`, fetching pages as the loop asks for them. */
  async *listSteps(
    runId: string,
    options: { fromSeq?: number; pageSize?: number } = {},
  ): AsyncGenerator<Step> {
    let fromSeq = options.fromSeq ?? 0;
    for (;;) {
      const { data } = await this.#op("ListRunSteps", "GET", `runs/${enc(runId)}/steps`, {
        query: { from_seq: fromSeq || undefined, page_size: options.pageSize },
      });
      yield* data.steps;
      if (!data.next_seq) return;
      fromSeq = data.next_seq;
    }
  }

  /**
   * The run (its state now), its steps from `fromSeq` as they commit, and the run again
   * whenever its state changes, until it ends (server-sent events). A dropped connection is
   * resumed where it stopped (Last-Event-ID), so no step is missed or repeated.
   */
  async *watch(runId: string, options: WatchOptions = {}): AsyncGenerator<WatchEvent> {
    let lastSeq = (options.fromSeq ?? 0) - 1; // the last step seen: resume after it
    let reconnects = 0;
    const maxReconnects = options.maxReconnects ?? 5;
    for (;;) {
      const resume = lastSeq >= 0 ? String(lastSeq) : undefined;
      let response: Response;
      try {
        response = await this.#send("GET", `runs/${enc(runId)}/watch`, {
          query: { after_seq: resume, deltas: options.deltas ? "true" : undefined },
          headers: { Accept: "text/event-stream", ...(resume ? { "Last-Event-ID": resume } : {}) },
          idempotent: true,
          signal: options.signal,
        });
      } catch (err) {
        if (options.signal?.aborted) return;
        throw err;
      }
      let ended = false;
      try {
        for await (const message of parseSse(response.body!)) {
          if (message.event === "end") {
            ended = true;
            break;
          }
          if (message.event === "error") throw problemIn(message.data, response.status);
          const event = watchEvent(message.event, message.data);
          if (!event) continue;
          reconnects = 0;
          if (event.type === "step") lastSeq = Math.max(lastSeq, event.step.seq);
          yield event;
          if (options.signal?.aborted) return; // not another event already read
        }
      } catch (err) {
        if (options.signal?.aborted) return;
        if (err instanceof AgentRunError) throw err;
        // Otherwise the body broke off (a dropped connection, a proxy's timeout): resume.
      }
      if (ended || options.signal?.aborted) return;
      reconnects += 1;
      if (reconnects > maxReconnects) {
        throw new AgentRunError({
          status: 0,
          title: "watch stream dropped",
          detail: `run ${runId}: ${maxReconnects} reconnections in a row without an event`,
        });
      }
      await sleep(this.#delay(reconnects - 1), options.signal).catch(() => undefined);
      if (options.signal?.aborted) return;
    }
  }

  /** Decide an unknown outcome (a tool call that may or may not have happened) at `seq`. */
  async resolveUnknownOutcome(
    runId: string,
    seq: number,
    decision: OutcomeDecision,
    options: { note?: string } = {},
  ): Promise<{ run: Run | undefined; step: Step | undefined }> {
    const path = `runs/${enc(runId)}/unknown-outcomes/${seq}/resolve`;
    const body = { decision, note: options.note ?? "" };
    const { data } = await this.#op("ResolveUnknownOutcome", "POST", path, { body });
    return { run: data.run, step: data.step };
  }

  /** Start a run and wait for it to end (completed, failed or cancelled); the final run.
   * Approvals it asks for must be decided elsewhere meanwhile. */
  async startAndWait(
    agentId: string,
    input: JsonValue,
    options: StartRunOptions & { signal?: AbortSignal } = {},
  ): Promise<Run> {
    const { run } = await this.startRun(agentId, input, options);
    let last = run;
    for await (const event of this.watch(run.run_id, { signal: options.signal })) {
      if (event.type === "run") last = event.run;
    }
    return TERMINAL.has(last.status) ? last : this.getRun(run.run_id);
  }

  // ---- approvals

  /** Every approval that matches, newest first, paging automatically. */
  listApprovals(
    filter: { state?: ApprovalState; approver?: string; pageSize?: number } = {},
  ): AsyncGenerator<Approval> {
    return this.#pages(async (token) => {
      const { data } = await this.#op("ListApprovals", "GET", "approvals", {
        query: {
          state: filter.state,
          approver: filter.approver,
          page_size: filter.pageSize,
          page_token: token || undefined,
        },
      });
      return { items: data.approvals, nextPageToken: data.next_page_token };
    });
  }

  async getApproval(approvalId: string): Promise<Approval> {
    return (await this.#op("GetApproval", "GET", `approvals/${enc(approvalId)}`)).data;
  }

  /** Approve the call as this key's person (an approver key, named on the approval). */
  async approve(approvalId: string): Promise<Approval> {
    return this.#decide(approvalId, { approve: {} });
  }

  /** Reject the call; the run goes on without it, told `reason`. */
  async deny(approvalId: string, reason = ""): Promise<Approval> {
    return this.#decide(approvalId, { reject: { reason } });
  }

  /** Approve the call with other arguments. */
  async approveEdited(
    approvalId: string,
    args: { [key: string]: JsonValue },
    note = "",
  ): Promise<Approval> {
    return this.#decide(approvalId, { edit: { arguments: args, note } });
  }

  async #decide(approvalId: string, body: Body<"DecideApproval">): Promise<Approval> {
    const path = `approvals/${enc(approvalId)}/decision`;
    return (await this.#op("DecideApproval", "POST", path, { body })).data;
  }

  // ---- sessions

  async createSession(
    agentId: string,
    options: { title?: string; strategy?: SessionStrategy } = {},
  ): Promise<Session> {
    const body: Body<"CreateSession"> = { agent_id: agentId };
    if (options.title !== undefined) body.title = options.title;
    if (options.strategy !== undefined) body.strategy = options.strategy;
    return (await this.#op("CreateSession", "POST", "sessions", { body })).data;
  }

  async getSession(sessionId: string): Promise<Session> {
    return (await this.#op("GetSession", "GET", `sessions/${enc(sessionId)}`)).data;
  }

  /** The session's next message: a turn (a run). `requestId` (random when not given) makes a
   * resend return the same turn. */
  async sendMessage(
    sessionId: string,
    text: string,
    options: { requestId?: string; strategy?: SessionStrategy; priority?: number } = {},
  ): Promise<Answer<"SendMessage">> {
    const body: Body<"SendMessage"> = {
      text,
      request_id: options.requestId ?? crypto.randomUUID(),
    };
    if (options.strategy !== undefined) body.strategy = options.strategy;
    if (options.priority !== undefined) body.priority = options.priority;
    const path = `sessions/${enc(sessionId)}/messages`;
    return (await this.#op("SendMessage", "POST", path, { body, idempotent: true })).data;
  }

  /** A session's turns in order from `fromTurn`, paging automatically. */
  async *listTurns(sessionId: string, options: { fromTurn?: number } = {}): AsyncGenerator<Turn> {
    let fromTurn = options.fromTurn ?? 0;
    for (;;) {
      const { data } = await this.#op("ListTurns", "GET", `sessions/${enc(sessionId)}/turns`, {
        query: { from_turn: fromTurn || undefined },
      });
      yield* data.turns;
      if (!data.next_turn) return;
      fromTurn = data.next_turn;
    }
  }

  // ---- agents (read-only)

  listAgents(options: { pageSize?: number } = {}): AsyncGenerator<Agent> {
    return this.#pages(async (token) => {
      const { data } = await this.#op("ListAgents", "GET", "agents", {
        query: { page_size: options.pageSize, page_token: token || undefined },
      });
      return { items: data.agents, nextPageToken: data.next_page_token };
    });
  }

  async getAgent(agentId: string): Promise<Agent> {
    return (await this.#op("GetAgent", "GET", `agents/${enc(agentId)}`)).data;
  }

  /** A published version of an agent (0: the latest). */
  async getAgentVersion(agentId: string, version = 0): Promise<AgentVersion> {
    const path = `agents/${enc(agentId)}/versions/${version}`;
    return (await this.#op("GetAgentVersion", "GET", path)).data;
  }

  // ---- plumbing

  async *#pages<T>(fetchPage: (token: string) => Promise<Page<T>>): AsyncGenerator<T> {
    let token = "";
    do {
      const page = await fetchPage(token);
      yield* page.items;
      token = page.nextPageToken;
    } while (token);
  }

  /** Operation `op` (its types from the OpenAPI document): its answer and status. */
  async #op<K extends OperationId>(
    op: K,
    method: "GET" | "POST",
    path: string,
    options: CallOptions<K> = {},
  ): Promise<{ data: Answer<K>; status: number }> {
    const response = await this.#send(method, path, options as CallOptions<OperationId>);
    return { data: (await response.json()) as Answer<K>, status: response.status };
  }

  /** Send with retries: a 503 always (the server did nothing), a network failure only when
   * `idempotent` (the request may have been applied). Non-2xx answers throw. */
  async #send(
    method: string,
    path: string,
    options: { query?: object; body?: unknown } & Omit<CallOptions<never>, "query" | "body">,
  ): Promise<Response> {
    const url = new URL(`${this.address}/v1/workspaces/${enc(this.workspaceId)}/${path}`);
    for (const [name, value] of Object.entries(options.query ?? {})) {
      if (value !== undefined && value !== "") url.searchParams.set(name, String(value));
    }
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      Accept: "application/json",
      ...options.headers,
    };
    let body: string | undefined;
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    for (let attempt = 0; ; attempt++) {
      const last = attempt + 1 >= this.#maxAttempts;
      let response: Response;
      try {
        response = await this.#fetch(url, { method, headers, body, signal: options.signal });
      } catch (err) {
        if (options.signal?.aborted || !options.idempotent || last) {
          throw new AgentRunError({
            status: 0,
            title: "network error",
            detail: `${method} ${url.pathname}: ${describe(err)}`,
            cause: err,
          });
        }
        await sleep(this.#delay(attempt), options.signal);
        continue;
      }
      if (response.ok) return response;
      if (response.status === 503 && !last) {
        await response.body?.cancel().catch(() => undefined);
        const after = Number(response.headers.get("Retry-After"));
        const wait = after > 0 ? Math.min(after * 1000, 30_000) : this.#delay(attempt);
        await sleep(wait, options.signal);
        continue;
      }
      throw await errorFrom(response);
    }
  }

  #delay(attempt: number): number {
    const base = Math.min(this.#backoffMs * 2 ** attempt, 10_000);
    return base / 2 + Math.random() * (base / 2);
  }
}

function enc(part: string): string {
  return encodeURIComponent(part);
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message} (${cause.message})` : err.message;
  }
  return String(err);
}

/** The AgentRunError an `event: error` of the stream carries (a problem after it began). */
function problemIn(data: string, status: number): AgentRunError {
  let body: Record<string, unknown> = {};
  try {
    body = JSON.parse(data) as Record<string, unknown>;
  } catch {
    body = { detail: data };
  }
  const str = (v: unknown) => (typeof v === "string" && v ? v : undefined);
  return new AgentRunError({
    status: typeof body.status === "number" ? body.status : status,
    title: str(body.title) ?? "watch failed",
    detail: str(body.detail),
    field: str(body.field),
    code: str(body.code),
    type: str(body.type),
  });
}

/** A `step`, `run` or `delta` event of the stream (others, added later, are skipped). */
function watchEvent(name: string, data: string): WatchEvent | undefined {
  if (name !== "step" && name !== "run" && name !== "delta") return undefined;
  return { type: name, [name]: JSON.parse(data) } as unknown as WatchEvent;
}
