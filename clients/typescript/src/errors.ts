/**
 * What a failed call throws: the API's problem details (RFC 9457), or a network failure
 * that outlasted the retries (status 0).
 */
export class AgentRunError extends Error {
  /** The HTTP status (400 bad input, 401, 403, 404, 409 a lost race or illegal transition,
   * 429, 503), or 0 when no answer came. */
  readonly status: number;
  /** The problem's short summary ("Invalid argument", "Not found"). */
  readonly title: string;
  /** The input at fault for a 400 (`input`, `page_size`, `spec.tools[0]`), else undefined. */
  readonly field: string | undefined;
  /** The explanation, naming what is wrong. */
  readonly detail: string;
  /** The gRPC code name the API maps to (`INVALID_ARGUMENT`, `NOT_FOUND`), when given. */
  readonly code: string | undefined;
  /** The problem type URI, when given. */
  readonly type: string | undefined;

  constructor(init: {
    status: number;
    title: string;
    detail?: string;
    field?: string;
    code?: string;
    type?: string;
    cause?: unknown;
  }) {
    const where = init.field ? ` (${init.field})` : "";
    const what = init.detail ? `: ${init.detail}` : "";
    super(`${init.status || "network"} ${init.title}${where}${what}`, { cause: init.cause });
    this.name = "AgentRunError";
    this.status = init.status;
    this.title = init.title;
    this.detail = init.detail ?? "";
    this.field = init.field;
    this.code = init.code;
    this.type = init.type;
  }
}

/** Build an AgentRunError from a non-2xx response (problem+json, or whatever text came). */
export async function errorFrom(response: Response): Promise<AgentRunError> {
  const text = await response.text().catch(() => "");
  let body: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) {
      body = parsed as Record<string, unknown>;
    }
  } catch {
    body = {};
  }
  const str = (v: unknown): string | undefined => (typeof v === "string" && v ? v : undefined);
  return new AgentRunError({
    status: response.status,
    title: str(body.title) ?? (response.statusText || `HTTP ${response.status}`),
    detail: str(body.detail) ?? str(body.error) ?? (str(body.title) ? "" : text.slice(0, 500)),
    field: str(body.field),
    code: str(body.code),
    type: str(body.type),
  });
}
