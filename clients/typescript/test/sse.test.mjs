// The event-stream parser on its own: the HTML standard's rules, whatever the chunking.
import assert from "node:assert/strict";
import { test } from "node:test";

import { parseSse } from "../dist/index.js";

function streamOf(...chunks) {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
      controller.close();
    },
  });
}

async function parse(...chunks) {
  const out = [];
  for await (const event of parseSse(streamOf(...chunks))) out.push(event);
  return out;
}

const WIRE =
  ': keep-alive\n\nid: 3\nevent: step\ndata: {"seq":3}\n\n' +
  'event: run\ndata: {"status":\ndata:  "done"}\r\n\r\nid: 4\ndata: plain\r\rdata: cut';

const WANT = [
  { event: "step", data: '{"seq":3}', id: "3" },
  { event: "run", data: '{"status":\n "done"}', id: undefined },
  { event: "message", data: "plain", id: "4" },
];

test("events, comments, multi-line data, CRLF and CR; an unfinished event is dropped", async () => {
  assert.deepEqual(await parse(WIRE), WANT);
});

test("the same events whatever the chunk boundaries (one byte at a time, \\r\\n split)", async () => {
  assert.deepEqual(await parse(...WIRE.split("")), WANT);
  for (let cut = 1; cut < WIRE.length; cut += 7) {
    assert.deepEqual(await parse(WIRE.slice(0, cut), WIRE.slice(cut)), WANT, `cut at ${cut}`);
  }
});
