/**
 * The Node shm server's wait between requests when worker threads run the envs (issue 24 item
 * 5): a lock-step step then takes the workers' time, and a server spinning for the next request
 * meanwhile takes a core from them (2 cores: one of two). Such a server sleeps at once (spin 0)
 * unless its URL names a wait policy. Real POSIX shm regions and real worker threads; no timing
 * is asserted (the Python client's side: tests/test_shm_pool_wait.py).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdirSync } from "node:fs";
import { describe, test } from "node:test";

import { PREFIX, SHM_DIR, WAIT_PRESETS, namesWaitPolicy } from "../backends/shm/region";
import { ShmListener } from "../backends/shm/server";
import { connect } from "../client";
import { ENVS } from "../envs";
import { VectorEchoEnv } from "../envs/vector_echo";
import { EnvHost } from "../runtime/host";

const TAG = `node-poolwait-${randomBytes(3).toString("hex")}`;

describe("shm server wait when a pool serves", () => {
  const cases: [string, number, number][] = [
    ["", 1, 0], // worker threads: sleep at once
    ["", 0, WAIT_PRESETS["balanced"]!.spin], // envs in the server: the URL's (default) policy
    ["&wait=spin", 1, WAIT_PRESETS["spin"]!.spin], // named in the URL: kept, pool or not
    ["&spin=500", 1, 500],
    ["&wait=futex", 0, 0],
  ];
  for (const [query, workers, spin] of cases) {
    test(`query "${query}", ${workers} worker(s): spin ${spin}`, async () => {
      const url = `shm://${TAG}-${randomBytes(4).toString("hex")}?num_envs=2${query}`;
      const host = new EnvHost(ENVS["echo"]!, { numEnvs: 2, envName: "echo", ...(workers ? { workers } : {}) });
      const listener = new ShmListener(url, host);
      try {
        assert.equal(listener.requestSpin, spin);
      } finally {
        await listener.close();
      }
    });
  }

  /** A vector env that says it steps on threads of its own (as EnvPool does). */
  class ThreadedVectorEcho extends VectorEchoEnv {
    readonly stepsOnOwnThreads = true;
  }
  const vectorCases: [string, typeof VectorEchoEnv, number][] = [
    ["", ThreadedVectorEcho, 0], // on its own threads: sleep at once, as for a pool
    ["", VectorEchoEnv, WAIT_PRESETS["balanced"]!.spin], // in the server: the default
    ["&wait=spin", ThreadedVectorEcho, WAIT_PRESETS["spin"]!.spin], // named in the URL: kept
  ];
  for (const [query, env, spin] of vectorCases) {
    test(`vector env ${env.name}, query "${query}": spin ${spin}`, async () => {
      const url = `shm://${TAG}-${randomBytes(4).toString("hex")}?num_envs=4${query}`;
      const listener = new ShmListener(url, new EnvHost(env, { numEnvs: 4, envName: "vector" }));
      try {
        assert.equal(listener.requestSpin, spin);
      } finally {
        await listener.close();
      }
    });
  }

  test("the Node client takes the pool server's advice and keeps it out of serverInfo", async () => {
    const url = `shm://${TAG}-${randomBytes(4).toString("hex")}?num_envs=2`;
    const host = new EnvHost(ENVS["echo"]!, { numEnvs: 2, envName: "echo", workers: 1 });
    const listener = new ShmListener(url, host);
    try {
      const client = await connect(url, { timeoutMs: 10_000 });
      try {
        assert.equal("client_wait" in client.serverInfo, false);
        await client.reset();
        const batch = await client.step([1, 2]);
        assert.ok(Array.isArray(batch) && batch.length === 2);
      } finally {
        await client.close();
      }
    } finally {
      await listener.close();
    }
  });

  test("namesWaitPolicy reads the query's wait and spin keys only", () => {
    assert.equal(namesWaitPolicy("shm://a?num_envs=2"), false);
    assert.equal(namesWaitPolicy("shm://a?num_envs=2&slice_ms=5"), false);
    assert.equal(namesWaitPolicy("shm://a?wait=balanced"), true);
    assert.equal(namesWaitPolicy("shm://a?num_envs=2&spin=0"), true);
  });

  test("no segment is left in /dev/shm", () => {
    const left = readdirSync(SHM_DIR).filter((name) => name.startsWith(`${PREFIX}${TAG}`));
    assert.deepEqual(left, []);
  });
});
