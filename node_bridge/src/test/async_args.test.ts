/**
 * What `send`'s env ids and `recv`'s batch size may be, and what a timed-out `recv` says
 * (Python: tests/test_async_recv_args.py). `send([a], [1.7])` went to the server (BAD_BATCH
 * from it; Python stepped env 1), `recv(-1)` was Node's internal "value out of range"
 * RangeError, `recv(0)` a server round trip; a recv that timed out over a socket backend said
 * "retry", though the envs it waited for are taken off the server and their late results
 * dropped. A Python server with one worker process (its SlowOnOne env steps 1.5 s on action 1),
 * a real Node client over zmq+ipc (whose timeout a test can shorten after connecting).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Client } from "../client";
import { TransportTimeoutError } from "../errors";
import { connect } from "../index";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const SLOW_MS = 1500;
const skip = HAVE_PYTHON ? false : "python cannot import transport";

let proc: ServerProcess | null = null;
let client: Client;
before(async () => {
  if (skip) return;
  const url = `zmq+ipc://${join(tmpdir(), `asyncargs-${process.pid}-${randomBytes(3).toString("hex")}.sock`)}`;
  proc = await ServerProcess.start("python", url, "--env", "tests.test_async_recv_args:SlowOnOne", "--schema", "schema/pac_env.toml", "--num-envs", "2", "--workers", "1");
  client = await connect(proc.url, { timeoutMs: 30_000 }); // the worker starts
  await client.asyncReset(0);
  await client.recv();
});
after(async () => {
  if (skip) return;
  await client.close();
  await proc?.stop();
});

describe("send's env ids and recv's batch size are checked before any bytes move", { skip }, () => {
  for (const ids of [[1.7], [Number.NaN], ["1"], [1n]] as unknown[][]) {
    test(`send([0], ${String(ids[0])})`, async () => {
      await assert.rejects(client.send([0], ids as never), (error: unknown) => {
        assert.ok(error instanceof TypeError, String(error));
        assert.match(error.message, /^send\(\): env ids are integers, not/);
        return true;
      });
    });
  }

  for (const size of [0, -1, 1.5, 2 ** 32]) {
    test(`recv(${size})`, async () => {
      await assert.rejects(client.recv(size), (error: unknown) => {
        assert.ok(error instanceof RangeError, String(error));
        assert.match(error.message, /^recv\(.*\): a batch size is an integer >= 1/);
        return true;
      });
    });
  }

  test("a recv that times out over zmq says its results are lost, not retry", async () => {
    await client.send([0], [1]); // a fast step of env 1: the client still works after the refusals
    assert.deepEqual((await client.recv(1)).envIds, [1]);
    const channel = client.channel as unknown as { timeoutMs: number | null };
    channel.timeoutMs = 300; // a test's shortcut (connect sets the only public one): zmq reads it per request
    await client.send([1], [0]); // env 0 steps for SLOW_MS
    await assert.rejects(client.recv(1), (error: unknown) => {
      assert.ok(error instanceof TransportTimeoutError, String(error));
      assert.match(error.message, /they stepped, but their results are lost/);
      assert.doesNotMatch(error.message, /retry/);
      return true;
    });
    await new Promise((resolve) => setTimeout(resolve, SLOW_MS));
  });
});
