/**
 * A unix:// path whose directory is missing (or is a file): `serve()` rejects with a
 * `ConnectError` in Python's words ("No such file or directory", "Not a directory"), not libuv's
 * EACCES (tests/test_unix_bind_errors.py checks both servers' CLIs say the same).
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { EchoEnv } from "../envs/echo";
import { ConnectError } from "../errors";
import { serve } from "../index";

const place = mkdtempSync(join(tmpdir(), "transport-unix-bind-"));
after(() => rmSync(place, { recursive: true, force: true }));

function refusal(path: string, words: string): (error: unknown) => boolean {
  return (error) => {
    assert.ok(error instanceof ConnectError, String(error));
    assert.equal(error.message, `cannot bind ${path}: ${words}`);
    return true;
  };
}

test("a missing directory is said so", async () => {
  const path = join(place, "missing", "env.sock");
  await assert.rejects(serve(() => new EchoEnv(), `unix://${path}`), refusal(path, "No such file or directory"));
});

test("a file in the way is not a directory", async () => {
  writeFileSync(join(place, "file"), "");
  const path = join(place, "file", "env.sock");
  await assert.rejects(serve(() => new EchoEnv(), `unix://${path}`), refusal(path, "Not a directory"));
});
