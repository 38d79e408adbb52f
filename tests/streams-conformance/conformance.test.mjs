// The Durable Streams conformance suite against agentrun's stream namespace
// (tests/integration/test_durable_streams_conformance.py starts the stack and runs this).
// The suite calls the global fetch with no credential and has no hook for one: every
// request it makes (its own and @durable-streams/client's) gets the workspace key here.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
const key = process.env.AGENTRUN_STREAMS_KEY
if (!baseUrl || !key) {
  throw new Error("CONFORMANCE_TEST_URL and AGENTRUN_STREAMS_KEY must be set")
}

const plainFetch = globalThis.fetch
globalThis.fetch = (input, init = {}) => {
  const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined))
  if (!headers.has("authorization")) headers.set("authorization", `Bearer ${key}`)
  return plainFetch(input, { ...init, headers })
}

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_MS ?? 20000),
})
