/** One server-sent event, as the HTML standard's parser dispatches it. */
export interface SseEvent {
  event: string;
  data: string;
  /** The `id:` field of this event, or undefined when it had none. */
  id: string | undefined;
}

/**
 * Parse a text/event-stream body into events (the HTML standard's rules: `field: value`
 * lines, a blank line dispatches, `:` lines are comments, `data` lines join with "\n").
 */
export async function* parseSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id: string | undefined;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      // A lone "\r" at the end may be the first half of "\r\n": keep it for the next chunk.
      const cut = done || !buffer.endsWith("\r") ? buffer.length : buffer.length - 1;
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop()! + buffer.slice(cut);
      for (const line of lines) {
        if (line === "") {
          if (data.length > 0) yield { event: event || "message", data: data.join("\n"), id };
          event = "";
          data = [];
          id = undefined;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") data.push(value);
        else if (field === "event") event = value;
        else if (field === "id" && !value.includes("\0")) id = value;
      }
      if (done) return; // an event without its blank line is dropped, as the standard says
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}
