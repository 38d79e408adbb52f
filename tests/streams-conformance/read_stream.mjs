// Reads a Durable Stream with @durable-streams/client from offset -1 until it closes
// (live, SSE), printing each JSON value on a line of its own: the Node reader of
// tests/integration/test_platform_streams.py. Usage: node read_stream.mjs URL KEY
import { stream } from "@durable-streams/client"

const [url, key] = process.argv.slice(2)
const res = await stream({
  url,
  offset: "-1",
  live: "sse",
  headers: { Authorization: `Bearer ${key}` },
})
for await (const item of res.jsonStream()) {
  process.stdout.write(JSON.stringify(item) + "\n")
}
process.stdout.write(`#closed ${res.streamClosed} ${res.offset}\n`)
