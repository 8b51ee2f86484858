/**
 * A stream server whose session throws while answering (a bug: `Session.handle` is documented
 * never to throw) answers that request with INTERNAL and closes the connection: the client gets
 * an error at once, never a request left unanswered (it hung without a timeout).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { EchoEnv } from "../envs";
import { connect, serve } from "../index";
import { Session } from "../runtime/session";

test("a session that throws answers INTERNAL and the connection closes", async () => {
  const url = `unix://${join(tmpdir(), `tp-throws-${process.pid}-${randomBytes(4).toString("hex")}.sock`)}`;
  const server = await serve(() => new EchoEnv(), url, { envName: "echo", numEnvs: 2 });
  const handle = Session.prototype.handle;
  try {
    const client = await connect(url, { timeoutMs: 20_000 });
    try {
      await client.reset(1n);
      Session.prototype.handle = function (): number {
        throw new RangeError("offset is out of bounds");
      };
      const started = Date.now();
      await assert.rejects(client.step([1, 2]), (error: Error) => {
        assert.match(String(error), /INTERNAL/);
        assert.match(String(error), /RangeError: offset is out of bounds/);
        return true;
      });
      assert.ok(Date.now() - started < 10_000, "answered at once, not after the client's timeout");
    } finally {
      Session.prototype.handle = handle;
      await client.close();
    }
  } finally {
    Session.prototype.handle = handle;
    await server.close();
  }
});
