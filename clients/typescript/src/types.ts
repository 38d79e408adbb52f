/**
 * The API's objects. Temporary hand-written shapes, following the protos' JSON mapping, until
 * docs/openapi.json lands and `npm run gen` writes src/schema.d.ts from it.
 */
export type JsonValue =
  | string
  | number
  | boolean
  | null
  | JsonValue[]
  | { [key: string]: JsonValue };

export type RunStatus = "queued" | "running" | "waiting" | "completed" | "failed" | "cancelled";

export interface Run {
  workspace_id: string;
  run_id: string;
  agent_id: string;
  agent_version: number;
  status: RunStatus;
  wait_reason?: string;
  input?: JsonValue;
  output?: JsonValue;
  error?: string;
  create_time?: string;
  update_time?: string;
  finish_time?: string;
  [more: string]: unknown;
}

export interface Step {
  run_id: string;
  seq: number;
  kind: string;
  epoch?: number;
  ref_seq?: number;
  payload?: JsonValue;
  create_time?: string;
  [more: string]: unknown;
}

export interface RunDelta {
  epoch?: number;
  seq?: number;
  index?: number;
  text?: string;
}

export interface Approval {
  workspace_id: string;
  approval_id: string;
  run_id: string;
  tool: string;
  arguments?: JsonValue;
  state: string;
  approvers?: string[];
  decided_by?: string;
  [more: string]: unknown;
}

export interface Signal {
  run_id: string;
  event_id: string;
  signal_name: string;
  payload?: JsonValue;
  [more: string]: unknown;
}

export interface Turn {
  turn: number;
  run_id: string;
  status: RunStatus;
  input?: string;
  output?: string;
  error?: string;
  [more: string]: unknown;
}

export interface Session {
  workspace_id: string;
  session_id: string;
  agent_id: string;
  title?: string;
  turn_count?: number;
  last_turn?: Turn;
  [more: string]: unknown;
}

export interface Agent {
  agent_id: string;
  [more: string]: unknown;
}

export interface AgentVersion {
  agent_id: string;
  version: number;
  [more: string]: unknown;
}

export type ApprovalState = "pending" | "approved" | "rejected" | "edited" | "expired";
export type OutcomeDecision = "happened" | "not_happened" | "retry" | "fail_run";
export type SessionStrategy = "reject" | "enqueue" | "interrupt" | "rollback";
