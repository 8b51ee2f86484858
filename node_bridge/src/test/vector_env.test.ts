/**
 * Vector envs (issue 24 item 1, runtime/vector.ts): one object steps all N envs in one call and
 * writes result columns. Every response of a vector env's session equals, byte for byte, that of
 * the same envs as N one-env objects (`EpisodicEchoEnv`), in every auto-reset mode, across
 * seeded resets, per-env seeds, masked and invalid actions, OBSERVE and asynchronous batches;
 * env errors are named per env and recovered; the host serves a vector env over a real socket.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import { encode as msgpackEncode } from "@msgpack/msgpack";

import { EpisodicEchoEnv, EpisodicVectorEchoEnv, MASKED_ACTION, VectorEchoEnv } from "../envs/vector_echo";
import { EchoEnv } from "../envs/echo";
import { ConnectError, TransportError } from "../errors";
import * as pac_env from "../generated/pac_env";
import { connect, serve } from "../index";
import { AutoReset, ErrorCode, MESSAGE_IDS as IDS, encodeHello, parseError } from "../protocol";
import type { Spaces, VectorEnv, VectorResults } from "../runtime/env";
import { EnvHost } from "../runtime/host";
import { Session } from "../runtime/session";
import { VectorRunner } from "../runtime/vector";

const RESULT = pac_env.StepResultCodec.size;
const MODES = [AutoReset.DISABLED, AutoReset.NEXT_STEP, AutoReset.SAME_STEP] as const;

/** A small deterministic PRNG (xorshift32). */
function rng(seed: number): (below: number) => number {
  let x = seed | 0 || 1;
  return (below) => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) % below;
  };
}

function helloed(session: Session, mode: AutoReset): Session {
  const hello = encodeHello(pac_env.SCHEMA.fingerprint, undefined, mode);
  assert.equal(session.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength), IDS.HELLO_RESP);
  return session;
}

/** A request: msg_type and body. */
type Request = readonly [number, Uint8Array];

function stepBatch(actions: readonly number[]): Request {
  const body = Buffer.alloc(4 * actions.length);
  actions.forEach((a, i) => body.writeInt32LE(a, 4 * i));
  return [IDS.STEP_BATCH_REQ, body];
}

function resetSeed(seed: bigint): Request {
  const body = Buffer.alloc(8);
  body.writeBigUInt64LE(seed);
  return [IDS.RESET_SEED_REQ, body];
}

/** RESET_SEEDS_REQ: env i with `seeds[i]` (null: unseeded); entries of u64 seed + u8 has_seed. */
function resetSeeds(seeds: ReadonlyArray<bigint | null>): Request {
  const size = pac_env.SCHEMA.structs[pac_env.SCHEMA.messages["RESET_SEEDS_REQ"]?.body as string]?.size as number;
  const body = Buffer.alloc(seeds.length * size);
  seeds.forEach((seed, i) => {
    if (seed === null) return;
    body.writeBigUInt64LE(seed, i * size);
    body[i * size + 8] = 1;
  });
  return [IDS.RESET_SEEDS_REQ, body];
}

function send(ids: readonly number[], actions: readonly number[]): Request {
  const tail = msgpackEncode(ids);
  const body = Buffer.alloc(4 * ids.length + tail.byteLength);
  actions.forEach((a, k) => body.writeInt32LE(a, 4 * k));
  body.set(tail, 4 * ids.length);
  return [IDS.SEND_REQ, body];
}

function recv(batch: number): Request {
  const body = Buffer.alloc(4);
  body.writeUInt32LE(batch);
  return [IDS.RECV_REQ, body];
}

/** The response to `request`: its msg_type and a copy of its body. */
function answer(session: Session, [type, body]: Request): [number, string] {
  const got = session.handle(type, body, 0, body.byteLength);
  assert.notEqual(got, -1, "an in-thread session answers at once");
  return [got, Buffer.from(session.body()).toString("hex")];
}

/** Requests a client might send: mostly steps (some masked, some invalid), resets, OBSERVE, async. */
function script(n: number, mode: AutoReset, seed: number, length: number, async = true): Request[] {
  const pick = rng(seed);
  const requests: Request[] = [resetSeed(BigInt(seed))];
  for (let k = 0; k < length; k++) {
    const roll = pick(100);
    if (roll < 70) {
      const actions = Array.from({ length: n }, () => pick(MASKED_ACTION)); // 0..90: allowed
      if (pick(20) === 0) actions[pick(n)] = MASKED_ACTION; // MASKED_ACTION for both
      if (pick(40) === 0) actions[pick(n)] = 92 + pick(5); // INVALID_ACTION for both
      requests.push(stepBatch(actions));
    } else if (roll < 78) {
      requests.push(mode === AutoReset.DISABLED ? resetSeed(BigInt(pick(1 << 30))) : [IDS.RESET_REQ, new Uint8Array(0)]);
    } else if (roll < 84) {
      requests.push(resetSeeds(Array.from({ length: n }, () => (pick(2) ? BigInt(pick(1 << 30)) : null))));
    } else if (roll < 88) {
      requests.push([IDS.OBSERVE_REQ, new Uint8Array(0)]);
    } else if (mode !== AutoReset.DISABLED && async) {
      // an asynchronous round over some envs (the vector env steps a subset): SEND, then RECV
      const ids = Array.from({ length: n }, (_, i) => i).filter(() => pick(2) === 1);
      if (ids.length === 0) ids.push(0);
      requests.push(send(ids, ids.map(() => pick(MASKED_ACTION))));
      requests.push(recv(n));
    } else {
      requests.push(resetSeed(BigInt(pick(1 << 30))));
    }
  }
  return requests;
}

describe("a vector env answers as the same envs one object each", () => {
  for (const mode of MODES) {
    test(`auto-reset ${["disabled", "next_step", "same_step"][mode]}: every response byte for byte`, () => {
      const n = 5;
      const vector = helloed(new Session(new EnvHost(EpisodicVectorEchoEnv, { numEnvs: n, envName: "v" }).runtime()), mode);
      const single = helloed(new Session(new EnvHost(() => new EpisodicEchoEnv(), { numEnvs: n, envName: "v" }).runtime()), mode);
      assert.ok(vector.runtime.runner instanceof VectorRunner);
      const types = new Set<number>();
      let ended = 0;
      for (const request of script(n, mode, 17 + mode, 400)) {
        const expected = answer(single, request);
        const got = answer(vector, request);
        assert.deepEqual(got, expected, `request 0x${request[0].toString(16)} in mode ${mode}`);
        types.add(got[0]);
        if (got[0] === IDS.STEP_BATCH_RESP) {
          const body = Buffer.from(got[1], "hex");
          for (let i = 0; i < n; i++) ended += body[i * RESULT + 2544] ?? 0;
          if (mode === AutoReset.SAME_STEP) ended += body.readUInt32LE(n * RESULT);
        }
      }
      assert.ok(ended > 0, "episodes ended");
      assert.ok(types.has(IDS.ERROR), "refusals were compared too");
      assert.ok(types.has(IDS.OBSERVE_RESP));
      if (mode !== AutoReset.DISABLED) assert.ok(types.has(IDS.RECV_RESP));
    });
  }

  for (const mode of MODES) {
    test(`stepsSubsets false, autoresetNextStep: one stepEnvs(null) per step, ${["disabled", "next_step", "same_step"][mode]}`, () => {
      const n = 4;
      const vector = helloed(new Session(new EnvHost(AllTogetherEchoEnv, { numEnvs: n }).runtime()), mode);
      const single = helloed(new Session(new EnvHost(() => new EpisodicEchoEnv(), { numEnvs: n }).runtime()), mode);
      for (const request of script(n, mode, 29 + mode, 200, false)) {
        assert.deepEqual(answer(vector, request), answer(single, request));
      }
      if (mode === AutoReset.DISABLED) return;
      // a subset (an asynchronous SEND) is refused: this env steps all its envs or none
      const [type, hex] = answer(vector, send([1], [0]));
      assert.equal(type, IDS.ERROR);
      assert.deepEqual(parseError(Buffer.from(hex, "hex")), {
        code: ErrorCode.BAD_BATCH,
        text: "env 1: this vector env steps all its 4 envs together (stepsSubsets is false)",
      });
    });
  }

  test("stepsSubsets false needs autoresetNextStep, and refuses noop masked actions", () => {
    class Half extends EpisodicVectorEchoEnv {
      readonly stepsSubsets = false;
    }
    assert.throws(() => new EnvHost(Half, { numEnvs: 2 }).runtime(), /must reset ended envs itself/);
    assert.throws(() => new EnvHost(AllTogetherEchoEnv, { numEnvs: 2, maskedActions: "noop" }).runtime(), /use "reject" or "pass"/);
  });

  test("the plain VectorEchoEnv is the echo env's bytes", () => {
    const n = 3;
    const vector = helloed(new Session(new EnvHost(VectorEchoEnv, { numEnvs: n }).runtime()), AutoReset.NEXT_STEP);
    const single = helloed(new Session(new EnvHost(() => new EchoEnv(), { numEnvs: n }).runtime()), AutoReset.NEXT_STEP);
    for (const request of [resetSeed(5n), stepBatch([1, 2, 3]), stepBatch([90, 0, 45]), [IDS.RESET_REQ, new Uint8Array(0)] as Request, stepBatch([7, 7, 7])]) {
      assert.deepEqual(answer(vector, request), answer(single, request));
    }
  });

  test("seeds: env i gets seed + i, and the server's first seed on the first unseeded reset", () => {
    const session = helloed(new Session(new EnvHost(EpisodicVectorEchoEnv, { numEnvs: 3, seed: 40 }).runtime()), AutoReset.DISABLED);
    const marks = (): number[] => [0, 1, 2].map((i) => session.body().readFloatLE(i * RESULT + 8));
    answer(session, [IDS.RESET_REQ, new Uint8Array(0)]);
    assert.deepEqual(marks(), [40, 41, 42]);
    answer(session, resetSeed(1000n));
    assert.deepEqual(marks(), [1000, 1001, 1002]);
    answer(session, resetSeeds([7n, null, 9n]));
    assert.deepEqual(marks(), [7, -1, 9]);
  });
});

/** The episodic echo envs stepped only all together: an ended env is reset by its own step. */
class AllTogetherEchoEnv extends EpisodicVectorEchoEnv {
  readonly stepsSubsets = false;
  readonly autoresetNextStep = true;

  override stepEnvs(actions: Float64Array, ids: Int32Array | null, out: VectorResults): void {
    assert.equal(ids, null, "stepEnvs gets every env");
    const done = out.columns["done"] as Uint8Array;
    const ended: number[] = [];
    const others: number[] = [];
    for (let i = 0; i < this.numEnvs; i++) (done[i] ? ended : others).push(i);
    if (ended.length) super.resetEnvs(Int32Array.from(ended), ended.map(() => null), out);
    if (others.length) super.stepEnvs(actions, Int32Array.from(others), out);
  }
}

/** Steps like the echo env; env `failing` fails through `out.fail` on action 7, every env throws on 8. */
class FailingVectorEnv implements VectorEnv {
  readonly steps: Uint32Array;
  resetsFail = 0;

  constructor(
    readonly numEnvs: number,
    public failing = 1,
  ) {
    this.steps = new Uint32Array(numEnvs);
  }

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  resetEnvs(ids: Int32Array, _seeds: ReadonlyArray<bigint | null>, out: VectorResults): void {
    if (this.resetsFail > 0) {
      this.resetsFail--;
      throw new RangeError("the simulator crashed during reset");
    }
    const obs = out.columns["observation"] as Float32Array;
    const mask = out.columns["action_mask"] as Uint8Array;
    for (const i of ids) {
      this.steps[i] = 0;
      obs[i * 612 + 1] = 0;
      mask.fill(1, i * 92, (i + 1) * 92);
    }
  }

  stepEnvs(actions: Float64Array, ids: Int32Array | null, out: VectorResults): void {
    const obs = out.columns["observation"] as Float32Array;
    if (actions[0] === 8) throw new TypeError("the batch simulator failed");
    for (const i of ids ?? Array.from({ length: this.numEnvs }, (_, k) => k)) {
      if (i === this.failing && actions[i] === 7) {
        out.fail(i, new Error("env-level failure"));
        continue;
      }
      this.steps[i] = (this.steps[i] as number) + 1;
      obs[i * 612 + 1] = this.steps[i] as number;
    }
  }
}

describe("vector env errors", () => {
  const counts = (session: Session): number[] =>
    Array.from({ length: session.numEnvs }, (_, i) => session.body().readFloatLE(i * RESULT + 4));

  test("out.fail names the env, which is reset; the others did their step", () => {
    const env = new FailingVectorEnv(3);
    const session = helloed(new Session(new EnvHost(env).runtime()), AutoReset.DISABLED);
    answer(session, resetSeed(1n));
    answer(session, stepBatch([0, 0, 0]));
    const [type, hex] = answer(session, stepBatch([0, 7, 0]));
    assert.equal(type, IDS.ERROR);
    const error = parseError(Buffer.from(hex, "hex"));
    assert.equal(error?.code, ErrorCode.ENV_ERROR);
    assert.match(error?.text ?? "", /^env 1: Error: env-level failure \(the env was reset\)/);
    assert.deepEqual(Array.from(env.steps), [2, 0, 2]);
    assert.equal(answer(session, stepBatch([0, 0, 0]))[0], IDS.STEP_BATCH_RESP);
    assert.deepEqual(counts(session), [3, 1, 3]);
  });

  test("a throw from stepEnvs fails every env of the call; a failing reset leaves them needing one", () => {
    const env = new FailingVectorEnv(2);
    const session = helloed(new Session(new EnvHost(env).runtime()), AutoReset.DISABLED);
    answer(session, resetSeed(1n));
    const [type, hex] = answer(session, stepBatch([8, 0]));
    assert.equal(type, IDS.ERROR);
    const text = parseError(Buffer.from(hex, "hex"))?.text ?? "";
    assert.match(text, /^env 0: TypeError: the batch simulator failed \(the env was reset\); env 1: TypeError: the batch simulator failed \(the env was reset\)/);
    env.resetsFail = 10;
    const [, again] = answer(session, stepBatch([8, 0]));
    assert.match(parseError(Buffer.from(again, "hex"))?.text ?? "", /the env could not be reset: send a reset/);
    env.resetsFail = 0;
    const [refused, notReset] = answer(session, stepBatch([0, 0]));
    assert.equal(refused, IDS.ERROR);
    assert.equal(parseError(Buffer.from(notReset, "hex"))?.code, ErrorCode.NOT_RESET);
    assert.equal(answer(session, [IDS.RESET_REQ, new Uint8Array(0)])[0], IDS.RESET_RESP);
  });

  test("fail() with an env outside the call is the env's error, not a crash", () => {
    const env = new FailingVectorEnv(2, 5); // env 5 does not exist
    env.failing = 5;
    const original = env.stepEnvs.bind(env);
    env.stepEnvs = (actions, ids, out) => {
      out.fail(5, new Error("no such env"));
      original(actions, ids, out);
    };
    const session = helloed(new Session(new EnvHost(env).runtime()), AutoReset.DISABLED);
    answer(session, resetSeed(1n));
    const [type, hex] = answer(session, stepBatch([0, 0]));
    assert.equal(type, IDS.ERROR);
    assert.match(parseError(Buffer.from(hex, "hex"))?.text ?? "", /^env 0: TransportError: fail\(5\): env index outside 0\.\.1/);
  });
});

describe("hosting a vector env", () => {
  test("an instance serves its own numEnvs; another numEnvs or workers are refused", () => {
    const env = new VectorEchoEnv(4);
    assert.equal(new EnvHost(env).numEnvs, 4);
    assert.throws(() => new EnvHost(env, { numEnvs: 3 }), (e: unknown) => e instanceof TransportError && /numEnvs=3.*numEnvs=4/.test(e.message));
    assert.throws(() => new EnvHost(VectorEchoEnv, { numEnvs: 4, workers: 2 }), /serve it without workers/);
    assert.throws(() => new EnvHost(() => new VectorEchoEnv(4), { numEnvs: 4, workers: 2 }).runtime(), /serve it without workers/);
  });

  test("a class is made with the numEnvs a client asks for; a factory's vector env must hold it", () => {
    const host = new EnvHost(VectorEchoEnv, { numEnvs: 4 });
    assert.equal(host.runtime(6).numEnvs, 6);
    const fixed = new EnvHost(() => new VectorEchoEnv(4), { numEnvs: 4 });
    assert.equal(fixed.runtime().numEnvs, 4);
    assert.throws(() => fixed.runtime(6, "shm://x"), (e: unknown) => e instanceof ConnectError && /asks for 6 envs.*vector env of 4/.test(e.message));
  });

  test("serve(instance, url) without numEnvs serves the instance's own numEnvs", async () => {
    const url = `unix://${join(tmpdir(), `transport-vector-${randomBytes(6).toString("hex")}.sock`)}`;
    const server = await serve(new EpisodicVectorEchoEnv(3), url);
    try {
      const client = await connect(server.url, { timeoutMs: 10_000 });
      const reset = (await client.reset(7n, { copy: true })) as pac_env.StepResult[];
      assert.deepEqual(reset.map((r) => r.observation[2]), [7, 8, 9]);
      await client.close();
    } finally {
      await server.close();
    }
  });

  test("served over unix:// to the Node client: the echo results, seeds + i", async () => {
    const url = `unix://${join(tmpdir(), `transport-vector-${randomBytes(6).toString("hex")}.sock`)}`;
    const server = await serve(EpisodicVectorEchoEnv, url, { numEnvs: 3, envName: "vector_echo" });
    try {
      const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "same_step" });
      const reset = (await client.reset(100n, { copy: true })) as pac_env.StepResult[];
      assert.deepEqual(reset.map((r) => r.observation[2]), [100, 101, 102]);
      const stepped = (await client.step([4, 5, 6], { copy: true })) as pac_env.StepResult[];
      assert.deepEqual(stepped.map((r) => [r.observation[0], r.observation[1], r.reward]), [[4, 1, 1], [5, 1, 1.25], [6, 1, 1.5]]);
      await client.close();
    } finally {
      await server.close();
    }
  });

  test("over shm:// slots (results copied from the env's columns) as over unix://: noop, finals, seeds", async () => {
    // the shm server copies each env's result from the vector env's columns straight into its
    // slot (no scratch record between); a "noop" masked action writes its penalty into the
    // reward column, and SAME_STEP finals are taken from the slots
    const traces: string[] = [];
    for (const url of [
      `unix://${join(tmpdir(), `transport-vector-${randomBytes(6).toString("hex")}.sock`)}`,
      `shm://transport-vector-${randomBytes(6).toString("hex")}?num_envs=3`,
    ]) {
      const server = await serve(EpisodicVectorEchoEnv, url, { numEnvs: 3, maskedActions: "noop" });
      const out: unknown[] = [];
      try {
        const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "same_step" });
        out.push(await client.reset(40n, { copy: true }));
        for (let k = 0; k < 30; k++) {
          const actions = [k % 7, k === 3 || k === 11 ? MASKED_ACTION : (k * 3) % 5, 2];
          out.push(await client.step(actions, { copy: true }), client.finals);
        }
        await client.close();
      } finally {
        await server.close();
      }
      traces.push(JSON.stringify(out, (_key, value: unknown) => (ArrayBuffer.isView(value) ? Array.from(value as Float32Array) : value)));
    }
    assert.ok((traces[0] as string).includes('"index"'), "some episodes ended (finals)");
    assert.equal(traces[1], traces[0]);
  });
});
