/**
 * Closing an shm client while envs are in flight on a worker-pool server (the Python twin is
 * tests/test_shm_close_in_flight.py): the Node client against real server processes of both
 * languages (`transport-serve ... --workers 2`) running a gated echo env
 * (shm_close_in_flight_env.ts, tests/shm_close_in_flight_env.py) whose SLOW action waits for a
 * file these tests never create (the envs stay in flight as long as a test looks).
 *
 * The servers used to leave the close's SHUTDOWN unanswered while the slots' envs were in their
 * pool: the close gave up after 1 s and the next connect of this process waited for that answer
 * (which only a finished env could give) and failed with "the server did not answer the previous
 * client's last request". Now SHUTDOWN is answered at once, the in-flight envs are dropped, and
 * the next client connects and steps.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { after, test } from "node:test";

import { native } from "../backends/shm/native";
import { parseShmUrl } from "../backends/shm/region";
import { connect } from "../index";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";
import { GATE_ENV, SLOW } from "./shm_close_in_flight_env";

const N = 4;
const LANGS: Array<"node" | "python"> = HAVE_PYTHON ? ["node", "python"] : ["node"];

// the servers and their workers inherit it; the file is never created
const GATE = join(tmpdir(), `transport-gate-${process.pid}-${randomBytes(6).toString("hex")}`);
process.env[GATE_ENV] = GATE;

/** The marker files of the SLOW steps that began (the gated envs write one each). */
function started(): string[] {
  const prefix = `${basename(GATE)}.in-`;
  return readdirSync(dirname(GATE)).filter((name) => name.startsWith(prefix));
}

/** Wait (10 s at most) until `count` SLOW steps began: the server read those SENDs (a close
 * right after a SEND can overwrite a command the server has not read yet: then none is in flight). */
async function awaitStarted(count: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (started().length < count) {
    assert.ok(Date.now() < deadline, `${count} SLOW step(s) did not start within 10 s`);
    await new Promise((ok) => setTimeout(ok, 5));
  }
}

/** Shut the gate (SLOW steps wait) and forget the markers. */
function shutGate(): void {
  rmSync(GATE, { force: true });
  for (const name of started()) rmSync(join(dirname(GATE), name), { force: true });
}

/** Open the gate: the dropped envs' SLOW steps end, and the server's pool closes at once. */
function openGate(): void {
  writeFileSync(GATE, "");
}

const servers: ServerProcess[] = [];
after(async () => {
  shutGate();
  for (const server of servers) {
    await server.stop("SIGKILL");
    native().shmUnlink(parseShmUrl(server.url).segment);
  }
});

async function start(lang: "node" | "python"): Promise<string> {
  const url = `shm://node-closefly-${process.pid}-${randomBytes(5).toString("hex")}?num_envs=${N}`;
  const env =
    lang === "node" ? `${join(__dirname, "shm_close_in_flight_env.js")}:makeGated` : "tests.shm_close_in_flight_env:GatedEcho";
  const extra = lang === "python" ? ["--schema", "schema/pac_env.toml"] : [];
  const server = await ServerProcess.start(lang, url, "--env", env, "--num-envs", String(N), "--workers", "2", ...extra);
  servers.push(server);
  return server.url;
}

/** Connect, SEND the SLOW action to each id list of `sends` (no RECV), close. */
async function closeInFlight(url: string, sends: number[][]): Promise<void> {
  const client = await connect(url, { timeoutMs: 20_000 });
  await client.reset(0n);
  shutGate();
  let k = 0;
  for (const ids of sends) {
    await client.send(
      ids.map(() => SLOW),
      ids,
    );
    await awaitStarted(++k); // envs 0, 1 on one worker thread, envs 2, 3 on the other
  }
  await client.close();
}

/** The next client connects at once (its connect waits 5 s at most for the previous close's
 * answer: the gate is still shut, so no env's end can answer it) and its session works,
 * lock-step and async (the gate opened: the server closes the old pool without waiting). */
async function stepsFine(url: string): Promise<void> {
  const client = await connect(url, { timeoutMs: 5_000 });
  openGate();
  try {
    await client.reset(1n);
    const results = (await client.step([1, 2, 3, 4])) as Array<{ observation: Float32Array }>;
    assert.deepEqual(
      results.map((r) => r.observation[0]),
      [1, 2, 3, 4],
    );
    await client.send([3], [2]);
    assert.deepEqual((await client.recv()).envIds, [2]);
  } finally {
    await client.close();
  }
}

for (const lang of LANGS) {
  test(`${lang} server: close with envs in flight is answered; the next client works`, async () => {
    const url = await start(lang);
    await closeInFlight(url, [[0, 1]]); // two of four in the pool, the other slots idle
    await stepsFine(url); // before the fix: "the server did not answer the previous client's last request"
    await closeInFlight(url, [[0], [1, 2, 3]]); // every env in flight (two SENDs of subsets)
    await stepsFine(url);
    await closeInFlight(url, [[1, 3]]); // a trainer that restarts twice mid-rollout
    await closeInFlight(url, [[0, 2]]);
    await stepsFine(url);
  });
}
