/**
 * One call, one answer, on every backend (issue 22 item 3), for the Node client: what
 * `client.step(x)` means is decided before any bytes move (`ActionShapes`), so a number, an
 * Array, a nested Array or a typed array gets the same answer over every scheme from a Python
 * and a Node server: one view (one env's action), N views (one action per env, N = 1 included),
 * or ActionError naming the action space, what was given and what to pass. The matrix below is
 * the Node twin of transport/testing/checks_shapes.py, run against real server processes on the
 * reference envs: echo (pac_env: Discrete(92), i32), reach (dictbox: Box(-1.0, 1.0, (2,),
 * float32)) and lock (multidiscrete: MultiDiscrete([3, 4, 5]), u8[3]).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { ActionError, type Client, connect, describeGiven } from "../client";
import { EchoEnv } from "../envs/echo";
import { RegionMismatchError, TransportError } from "../errors";
import { serve } from "../server";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const ONE = "one";
const BATCH = "batch";
const SHAPE = "shape";
const DTYPE = "dtype";
const RANGE = "range";
const NOT_NUMBERS = "not numbers";
const REASONS: Record<string, string> = {
  [SHAPE]: "pass ",
  [DTYPE]: "would be truncated",
  [RANGE]: "does not fit the",
  [NOT_NUMBERS]: "not numbers",
};

const BOX = "Box(-1.0, 1.0, (2,), float32)";
const LOCK = "MultiDiscrete([3, 4, 5])";
const DISCRETE = "Discrete(92)";

interface Space {
  /** One env's action shape: [] Discrete, [d] Box / MultiDiscrete. */
  readonly one: number[];
  readonly integer: boolean;
  readonly n: number;
}

const key = (s: Space): string => (s.one.length === 0 ? "D" : "A") + (s.n === 1 ? "1" : "N");
const rows = (n: number, row: () => unknown): unknown[] => Array.from({ length: n }, row);
const zeros = (d: number): number[] => new Array<number>(d).fill(0);
/** One value per env: a number (Discrete) or a row (array actions) built by `row`. */
const perEnv = (s: Space, value: number, row: (d: number) => unknown = (d) => new Array<number>(d).fill(value)): unknown =>
  s.one.length === 0 ? new Array<number>(s.n).fill(value) : rows(s.n, () => row(s.one[0] as number));

interface Case {
  readonly name: string;
  readonly make: (s: Space) => unknown;
  readonly expect: (s: Space) => string;
}

const byKey =
  (answers: Record<string, string>) =>
  (s: Space): string =>
    answers[key(s)] as string;

const CASES: Case[] = [
  // a number: one Discrete action; never broadcast to a Box (issue 22: step(1) sent [1, 1])
  { name: "number", make: () => 0, expect: byKey({ D1: ONE, DN: SHAPE, A1: SHAPE, AN: SHAPE }) },
  { name: "float number", make: () => 0.5, expect: byKey({ D1: DTYPE, DN: SHAPE, A1: SHAPE, AN: SHAPE }) },
  // issue 22: a batch of one over unix, ProtocolError over shm; now a batch of one everywhere
  { name: "shape (1,)", make: () => [0], expect: byKey({ D1: BATCH, DN: SHAPE, A1: SHAPE, AN: SHAPE }) },
  {
    name: "one action, shape S",
    make: (s) => (s.one.length === 0 ? 0 : zeros(s.one[0] as number)),
    expect: byKey({ D1: ONE, DN: SHAPE, A1: ONE, AN: SHAPE }),
  },
  { name: "one per env (Arrays)", make: (s) => perEnv(s, 0), expect: () => BATCH },
  {
    name: "typed array: Int32Array(N), or N x elements Float32Array (Box) / Int32Array",
    make: (s) =>
      s.one.length === 0 || s.integer ? new Int32Array(s.n * (s.one[0] ?? 1)) : new Float32Array(s.n * (s.one[0] as number)),
    // array actions: one action when N = 1 (shape S), flat one-per-env when N > 1
    expect: byKey({ D1: BATCH, DN: BATCH, A1: ONE, AN: BATCH }),
  },
  { name: "wrong N", make: (s) => perEnv({ ...s, n: s.n + 1 }, 0), expect: () => SHAPE },
  // issue 22: "cannot reshape array of size 3 into shape (2,)"
  {
    name: "wrong action size",
    make: (s) => rows(s.n, () => zeros(s.one.length === 0 ? 2 : (s.one[0] as number) + 1)),
    expect: () => SHAPE,
  },
  {
    name: "float typed arrays for integers",
    make: (s) => (s.one.length === 0 ? new Float64Array(s.n) : rows(s.n, () => new Float64Array(s.one[0] as number))),
    expect: (s) => (s.integer ? DTYPE : BATCH),
  },
  {
    name: "integer typed arrays for floats",
    make: (s) => (s.one.length === 0 ? new Int8Array(s.n) : rows(s.n, () => new Int32Array(s.one[0] as number))),
    expect: () => BATCH,
  },
  { name: "non-integer numbers", make: (s) => perEnv(s, 0.5), expect: (s) => (s.integer ? DTYPE : BATCH) },
  {
    name: "an integer the field cannot hold",
    make: (s) => perEnv(s, s.integer ? 2 ** 40 : 0),
    expect: (s) => (s.integer ? RANGE : BATCH),
  },
  { name: "strings", make: (s) => new Array<string>(s.n).fill("a"), expect: () => NOT_NUMBERS },
  { name: "ragged rows", make: () => [[0, 0], [0]], expect: () => NOT_NUMBERS },
];

function spaceOf(client: Client, one: number[], integer: boolean): Space {
  return { one, integer, n: client.numEnvs };
}

/** Every case on `client`; the answers that differ from the pinned ones (empty: all as pinned). */
async function shapeMatrix(client: Client, spaceText: string, one: number[], integer: boolean): Promise<string[]> {
  const s = spaceOf(client, one, integer);
  const envs = `${s.n} env${s.n === 1 ? "" : "s"}`;
  const problems: string[] = [];
  for (const c of CASES) {
    const value = c.make(s);
    const want = c.expect(s);
    const where = `${c.name} (${describeGiven(value)}) on ${spaceText} x ${s.n}`;
    if (want === ONE || want === BATCH) await client.reset(7n);
    let got: string;
    try {
      const result = await client.step(value as never);
      got = Array.isArray(result) ? (result.length === s.n ? BATCH : `${result.length} views`) : ONE;
    } catch (error) {
      if (!(error instanceof ActionError)) {
        problems.push(`${where}: ${(error as Error).name}: ${(error as Error).message}, expected ${want}`);
        continue;
      }
      const prefix = `step(): ${describeGiven(value)} is not an action for ${spaceText} (${envs}): `;
      if (want === ONE || want === BATCH) problems.push(`${where}: refused (${error.message}), expected ${want}`);
      else if (!error.message.startsWith(prefix)) problems.push(`${where}: message ${error.message} does not start with ${prefix}`);
      else if (!error.message.slice(prefix.length).includes(REASONS[want] as string)) {
        problems.push(`${where}: message ${error.message} does not say ${REASONS[want]}`);
      }
      continue;
    }
    if (got !== want) problems.push(`${where}: answered ${got}, expected ${want}`);
  }
  return problems;
}

function url(scheme: string): string {
  const tag = randomBytes(6).toString("hex");
  if (scheme === "unix") return `unix://${join(tmpdir(), `transport-callshapes-${tag}.sock`)}`;
  if (scheme === "zmq+ipc") return `zmq+ipc://${join(tmpdir(), `transport-callshapes-${tag}.zmq`)}`;
  if (scheme === "zmq+tcp") return "zmq+tcp://127.0.0.1:0";
  if (scheme === "http") return "http://127.0.0.1:0";
  return `shm://callshapes-${tag}`;
}

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop();
});

async function withServer(
  lang: "node" | "python",
  scheme: string,
  env: string,
  numEnvs: number,
  work: (client: Client) => Promise<void>,
): Promise<void> {
  const server = await ServerProcess.start(lang, url(scheme), "--env", env, "--num-envs", String(numEnvs));
  servers.push(server);
  const client = await connect(server.url, { timeoutMs: 20_000 });
  try {
    await work(client);
  } finally {
    await client.close();
    await server.stop();
  }
}

const TARGETS: Array<["node" | "python", string]> = [
  ["node", "unix"],
  ["node", "http"],
  ["node", "zmq+ipc"],
  ["node", "zmq+tcp"],
  ["node", "shm"],
  ["python", "unix"],
  ["python", "shm"],
];

describe("call shapes: one call, one answer, on every backend", () => {
  for (const [lang, scheme] of TARGETS) {
    const skip = lang === "python" && !HAVE_PYTHON ? "python cannot import transport" : false;
    test(`Box, 1 env: ${scheme} ${lang} server`, { skip }, async () => {
      await withServer(lang, scheme, "reach", 1, async (client) => {
        assert.deepEqual(await shapeMatrix(client, BOX, [2], false), []);
      });
    });
  }
  for (const [lang, scheme] of TARGETS.filter(([, s]) => s === "unix" || s === "shm")) {
    const skip = lang === "python" && !HAVE_PYTHON ? "python cannot import transport" : false;
    test(`Discrete, 1 and 2 envs; Box, 2 envs: ${scheme} ${lang} server`, { skip }, async () => {
      await withServer(lang, scheme, "echo", 1, async (client) => {
        assert.deepEqual(await shapeMatrix(client, DISCRETE, [], true), []);
      });
      await withServer(lang, scheme, "echo", 2, async (client) => {
        assert.deepEqual(await shapeMatrix(client, DISCRETE, [], true), []);
      });
      await withServer(lang, scheme, "reach", 2, async (client) => {
        assert.deepEqual(await shapeMatrix(client, BOX, [2], false), []);
      });
    });
  }
  test("MultiDiscrete, 1 env: unix node server", async () => {
    await withServer("node", "unix", "lock", 1, async (client) => {
      assert.deepEqual(await shapeMatrix(client, LOCK, [3], true), []);
    });
  });

  test("the issue's cases, word for word", async () => {
    await withServer("node", "unix", "reach", 1, async (client) => {
      await assert.rejects(client.step(1), (error: unknown) => {
        assert.ok(error instanceof ActionError && error instanceof TransportError);
        assert.equal(
          error.message,
          `step(): number 1 is not an action for ${BOX} (1 env): pass an array of shape (2,) (one action) or (1, 2) (a batch of one)`,
        );
        return true;
      });
      await assert.rejects(client.step([0, 0, 0]), {
        message: `step(): Array of shape (3,) is not an action for ${BOX} (1 env): pass an array of shape (2,) (one action) or (1, 2) (a batch of one)`,
      });
    });
    await withServer("node", "shm", "echo", 1, async (client) => {
      await assert.rejects(client.step(0.5), {
        message: `step(): number 0.5 is not an action for ${DISCRETE} (1 env): its value 0.5 would be truncated to the i32 action field; pass integers`,
      });
      await client.reset(1n);
      const batch = await client.step([7]);
      assert.ok(Array.isArray(batch) && batch.length === 1);
      assert.equal(batch[0]?.observation[0], 7);
    });
  });

  // issue 22 item 8: the num_envs mismatch said "same transport version and schema"
  test("a num_envs mismatch names both counts and the fix", async () => {
    const base = url("shm");
    const server = await ServerProcess.start("node", `${base}?num_envs=2`, "--env", "echo", "--num-envs", "2");
    servers.push(server);
    try {
      await assert.rejects(connect(`${base}?num_envs=3`, { timeoutMs: 5000 }), (error: unknown) => {
        assert.ok(error instanceof RegionMismatchError);
        assert.match(error.message, /control block field num_envs: expected 3, found 2/);
        assert.ok(
          error.message.includes(
            "the client asked for 3 envs (?num_envs=3 in its URL) and the server serves 2: connect without " +
              "?num_envs= to take the server's count, or start the server with num_envs=3",
          ),
          error.message,
        );
        assert.ok(!error.message.includes("same transport version"), error.message);
        return true;
      });
    } finally {
      await server.stop();
    }
  });
});

// issue 22 item 8: serve() without a schema silently served pac_env, and every reset failed
describe("serve() without a schema", () => {
  class Walk {
    spaces() {
      return { obsN: 2, actN: 2 };
    }
    reset() {
      return { position: [0, 0], reward: 0, terminated: false, truncated: false };
    }
    step() {
      return this.reset();
    }
  }

  test("an env whose results do not fit the default pac_env is refused at serve(), naming what to pass", async () => {
    const sock = join(tmpdir(), `tp-noschema-${process.pid}-${randomBytes(4).toString("hex")}.sock`);
    await assert.rejects(serve(Walk, `unix://${sock}`), (error: unknown) => {
      assert.ok(error instanceof TypeError, String(error));
      assert.match(error.message, /no schema was given, so the default schema pac_env was tried/);
      assert.match(error.message, /Pass \{ schema:/);
      return true;
    });
  });

  test("an env whose results fit pac_env is still served without a schema", async () => {
    const sock = join(tmpdir(), `tp-noschema-${process.pid}-${randomBytes(4).toString("hex")}.sock`);
    const server = await serve(EchoEnv, `unix://${sock}`);
    try {
      const client = await connect(`unix://${sock}`, { timeoutMs: 5000 });
      try {
        await client.reset();
      } finally {
        await client.close();
      }
    } finally {
      await server.close();
    }
  });

  for (const scheme of ["unix", "shm"] as const) {
    test(`${scheme}: the default is tried on the first client's env, not on one more made for the try`, async () => {
      // before: a factory of 2 envs was called 3 times for the first client (one env made,
      // reset and closed by the try), also over shm, whose server makes those envs at start
      let made = 0;
      const factory = (): EchoEnv => {
        made++;
        return new EchoEnv();
      };
      const tag = `${process.pid}-${randomBytes(4).toString("hex")}`;
      const url = scheme === "shm" ? `shm://tp-noschema-${tag}?num_envs=2` : `unix://${join(tmpdir(), `tp-noschema-${tag}.sock`)}`;
      const server = await serve(factory, url, { numEnvs: 2 });
      try {
        const client = await connect(server.url, { timeoutMs: 5000 });
        try {
          await client.reset(1n);
          await client.step([0, 0]);
          assert.equal(made, 2); // (after it leaves, an shm server makes the next client's envs)
        } finally {
          await client.close();
        }
      } finally {
        await server.close();
      }
    });
  }

  test("shm: an env whose results do not fit is refused at serve(), its env closed, no region left", async () => {
    let closed = 0;
    class ClosingWalk extends Walk {
      close(): void {
        closed++;
      }
    }
    const name = `tp-noschema-${process.pid}-${randomBytes(4).toString("hex")}`;
    await assert.rejects(serve(ClosingWalk, `shm://${name}`), /no schema was given, so the default schema pac_env was tried/);
    assert.equal(closed, 1);
    assert.ok(!existsSync(`/dev/shm/transport-${name}`));
  });
});
