/**
 * Asynchronous batches over shm wake the Node client once per RECV, not once per finished env
 * (issue 23 item 5; docs/shm.md "One wake per RECV"; the Python client's twin:
 * tests/test_shm_async_wakes.py). Envs that finish one after the other (the staggered env:
 * a step sleeps `action` x 12 ms) in worker processes (Python server) or worker threads (Node
 * server): a RECV of 3 of them used to wake at the first publish and then spin (its SLEEP
 * pass gave up at any answered word) until the last one came; now it sleeps once, woken when
 * the RECV can end (the RECV wake hint), twice at most when a publish lands between its look
 * and its sleep. Real server processes, real shm; the client's sleeps and looks (turns of its
 * sleeping loop) are asserted, never a time.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdirSync } from "node:fs";
import { resolve } from "node:path";
import { after, describe, test } from "node:test";

import { ShmChannel } from "../backends/shm/channel";
import { native } from "../backends/shm/native";
import { PREFIX, SHM_DIR, parseShmUrl } from "../backends/shm/region";
import { type Client, connect } from "../index";
import { HAVE_PYTHON, ROOT, ServerProcess } from "../testing/servers";

const TAG = `node-wakes-${randomBytes(3).toString("hex")}`;
const ENV_JS = resolve(__dirname, "shm_async_wakes_env.js");
const NUM_ENVS = 6;
const SENT = [0, 2, 4]; // 3 workers of 2 envs each: one env in each
const ACTIONS = [1, 3, 5]; // they finish ~24 ms apart
const ROUNDS = 5;

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop("SIGKILL");
  for (const server of servers) native().shmUnlink(parseShmUrl(server.url).segment);
  const left = readdirSync(SHM_DIR).filter((name) => name.startsWith(`${PREFIX}${TAG}`));
  assert.deepEqual(left, [], "no segment of these tests is left in /dev/shm");
});

for (const lang of ["node", "python"] as const) {
  describe(`Node client, ${lang} server with 3 workers`, { skip: lang === "python" && !HAVE_PYTHON }, () => {
    let server: ServerProcess | null = null;
    const url = async (): Promise<string> => {
      if (server === null) {
        const at = `shm://${TAG}-${randomBytes(4).toString("hex")}?num_envs=${NUM_ENVS}`;
        const env = lang === "node" ? `${ENV_JS}:makeStaggeredEnv` : "tests.test_shm_async_wakes:StaggeredEnv";
        server = await ServerProcess.start(lang, at, "--env", env, "--schema", resolve(ROOT, "schema", "pac_env.toml"), "--num-envs", String(NUM_ENVS), "--workers", "3");
        servers.push(server);
      }
      // slices longer than a round: every wake-up counted is a publish's, none a timeout's
      return `${server.url}&slice_ms=2000`;
    };

    /** A fresh client reset with `seed` runs `round` ROUNDS times: its channel's sleeps and
     * looks meanwhile. */
    const counted = async (seed: number, round: (client: Client) => Promise<void>): Promise<{ sleeps: number; looks: number }> => {
      const client = await connect(await url(), { timeoutMs: 30_000 });
      try {
        const channel = client.channel;
        assert.ok(channel instanceof ShmChannel);
        await client.reset(seed);
        const before = channel.sleeps;
        const looked = channel.looks;
        for (let r = 0; r < ROUNDS; r++) await round(client);
        return { sleeps: channel.sleeps - before, looks: channel.looks - looked };
      } finally {
        await client.close();
      }
    };

    test("a RECV of 3 envs that finish one after the other sleeps once", async () => {
      const { sleeps, looks } = await counted(1, async (client) => {
        await client.send(ACTIONS, SENT);
        const got = await client.recv(SENT.length);
        assert.deepEqual([...got.envIds].sort(), SENT);
      });
      assert.ok(sleeps <= 2 * ROUNDS, `${sleeps} sleeps for ${ROUNDS} RECVs of ${SENT.length} envs`);
      // and no spinning instead of sleeping: a look before each sleep, one more at most
      assert.ok(looks <= 2 * ROUNDS + 2, `${looks} looks for ${ROUNDS} RECVs of ${SENT.length} envs`);
    });

    test("RECV(2) then RECV(1) of 3 in flight: one sleep each", async () => {
      const { sleeps, looks } = await counted(2, async (client) => {
        await client.send(ACTIONS, SENT);
        const first = (await client.recv(2)).envIds;
        const last = (await client.recv(1)).envIds;
        assert.equal(first.length, 2);
        assert.deepEqual([...first, ...last].sort(), SENT);
      });
      assert.ok(sleeps <= 2 * ROUNDS + 2, `${sleeps} sleeps for ${2 * ROUNDS} RECVs`);
      assert.ok(looks <= 2 * ROUNDS + 4, `${looks} looks for ${2 * ROUNDS} RECVs`);
    });
  });
}
