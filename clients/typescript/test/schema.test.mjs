// src/schema.d.ts is what `npm run gen` writes from docs/openapi.json (itself generated from the
// protos): a proto change that reaches the HTTP API and not these types fails here.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL("..", import.meta.url));

test("src/schema.d.ts is current with docs/openapi.json (else: npm run gen)", () => {
  const dir = mkdtempSync(join(tmpdir(), "agentrun-schema-"));
  try {
    const fresh = join(dir, "schema.d.ts");
    const cli = join(here, "node_modules", "openapi-typescript", "bin", "cli.js");
    execFileSync(process.execPath, [cli, "../../docs/openapi.json", "-o", fresh], {
      cwd: here,
      stdio: "pipe",
    });
    const committed = readFileSync(join(here, "src", "schema.d.ts"), "utf8");
    assert.ok(
      committed === readFileSync(fresh, "utf8"),
      "src/schema.d.ts is stale: run `npm run gen` in clients/typescript and commit it",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
