/**
 * The Node Session's auto-reset modes and env-error recovery, mirroring the Python Session
 * (tests/test_autoreset.py, tests/test_env_errors.py): in process through `Session.handle`, and
 * over a real unix:// server with the Node client.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { decode as msgpackDecode } from "@msgpack/msgpack";

import type { Env, Spaces } from "../runtime/env";
import { RemoteError, connect, serve, type Server } from "../index";
import { REMOTE_TRACEBACK_MARKER } from "../errors";
import * as pac_env from "../generated/pac_env";
import {
  AutoReset,
  BODY_OFFSET,
  ErrorCode,
  MESSAGE_IDS as IDS,
  encodeHello,
  parseError,
  readU32,
} from "../protocol";
import { Session, sessionFactory } from "../runtime/session";

const OBS_N = 612;
const ACT_N = 92;
const POISON = 7; // the action that makes an env throw
const END = 9; // the action that ends the episode
const RESULT = pac_env.StepResultCodec.size;

let created = 0;
const closed: FlakyEnv[] = [];

/** Counts its steps in observation[1]; throws on POISON; END ends the episode. */
class FlakyEnv implements Env<pac_env.StepResultInput> {
  static brokenResets = 0; // the next N resets (of any instance) throw
  steps = 0;
  readonly #out = {
    observation: new Float32Array(OBS_N),
    action_mask: new Uint8Array(ACT_N).fill(1),
    reward: 0,
    done: 0,
    rank: 0,
    life: 0,
    money: 0,
    stage: 0,
    board_size: 0,
    level: 0,
    synergy_count: 0,
    items_held: 0,
    actions_this_turn: 0,
  };

  constructor() {
    created++;
  }

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  close(): void {
    closed.push(this);
  }

  #result(action: number): pac_env.StepResultInput {
    const out = this.#out;
    out.observation[0] = action;
    out.observation[1] = this.steps;
    out.done = action === END ? 1 : 0;
    out.reward = action === END ? 1 : 0;
    return out;
  }

  reset(): pac_env.StepResultInput {
    if (FlakyEnv.brokenResets > 0) {
      FlakyEnv.brokenResets--;
      throw new RangeError("the simulator crashed during reset");
    }
    this.steps = 0;
    return this.#result(0);
  }

  step(action: number): pac_env.StepResultInput {
    if (action === POISON) throw new TypeError("poisoned action");
    this.steps++;
    return this.#result(action);
  }
}

/** A session of `n` FlakyEnvs driven through `handle`, as a backend would. */
class Driver {
  readonly session: Session;

  constructor(n: number, autoreset: AutoReset = AutoReset.DISABLED) {
    this.session = sessionFactory(FlakyEnv, { numEnvs: n, envName: "flaky" })();
    const hello = encodeHello(pac_env.SCHEMA.fingerprint, undefined, autoreset);
    assert.equal(this.session.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength), IDS.HELLO_RESP);
  }

  reset(): number {
    return this.session.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0);
  }

  step(actions: readonly number[]): number {
    const body = Buffer.alloc(4 * actions.length);
    actions.forEach((a, i) => body.writeInt32LE(a, 4 * i));
    const type = actions.length === 1 && this.session.numEnvs === 1 ? IDS.STEP_REQ : IDS.STEP_BATCH_REQ;
    return this.session.handle(type, body, 0, body.byteLength);
  }

  /** observation[1] (the step count) of each env in the current response. */
  counts(): number[] {
    const out: number[] = [];
    for (let i = 0; i < this.session.numEnvs; i++) {
      out.push(this.session.buffer.readFloatLE(BODY_OFFSET + i * RESULT + 4));
    }
    return out;
  }

  /** The ERROR's code and message (the env's last frames that may follow are left out). */
  error(): { code: number; text: string } {
    const parsed = parseError(this.session.body());
    assert.ok(parsed);
    return { code: parsed.code, text: parsed.text.split(REMOTE_TRACEBACK_MARKER)[0] as string };
  }
}

describe("HELLO", () => {
  for (const mode of [AutoReset.DISABLED, AutoReset.NEXT_STEP, AutoReset.SAME_STEP]) {
    test(`echoes auto-reset mode ${mode} in flags and info (Python's keys and order)`, () => {
      const driver = new Driver(2, mode);
      const body = driver.session.body();
      assert.equal(body.readUInt16LE(2), mode);
      const info = msgpackDecode(body.subarray(12)) as Record<string, unknown>;
      assert.deepEqual(Object.keys(info), ["num_envs", "env", "server", "masked_actions", "autoreset", "schema_name"]);
      assert.deepEqual(info, {
        num_envs: 2,
        env: "flaky",
        server: "node",
        masked_actions: "reject",
        autoreset: ["disabled", "next_step", "same_step"][mode],
        schema_name: "pac_env",
      });
    });
  }

  test("an unknown auto-reset mode is refused", () => {
    const session = sessionFactory(FlakyEnv)();
    const hello = encodeHello(pac_env.SCHEMA.fingerprint, undefined, 3);
    assert.equal(session.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength), IDS.ERROR);
    assert.equal(parseError(session.body())?.code, ErrorCode.BAD_FRAME);
  });
});

describe("auto-reset", () => {
  test("disabled: a step after done is NOT_RESET", () => {
    const driver = new Driver(2);
    driver.reset();
    assert.equal(driver.step([1, END]), IDS.STEP_BATCH_RESP);
    assert.equal(driver.step([1, 1]), IDS.ERROR);
    assert.deepEqual(driver.error(), { code: ErrorCode.NOT_RESET, text: "env 1: episode is done; reset first" });
  });

  test("next_step: the action of a done env is ignored and the env reset", () => {
    const driver = new Driver(2, AutoReset.NEXT_STEP);
    driver.reset();
    driver.step([1, 1]);
    assert.equal(driver.step([1, END]), IDS.STEP_BATCH_RESP);
    assert.deepEqual(driver.counts(), [2, 2]);
    // env 1 is done: its action (even an invalid one) is not checked, it is reset
    assert.equal(driver.step([1, 1000]), IDS.STEP_BATCH_RESP);
    assert.equal(driver.session.bodyLength, 2 * RESULT);
    assert.deepEqual(driver.counts(), [3, 0]);
    assert.equal(driver.step([1, 1]), IDS.STEP_BATCH_RESP);
    assert.deepEqual(driver.counts(), [4, 1]);
  });

  test("same_step: the reset result in place, the final result in the tail", () => {
    const driver = new Driver(3, AutoReset.SAME_STEP);
    driver.reset();
    assert.equal(driver.step([1, 1, 1]), IDS.STEP_BATCH_RESP);
    assert.equal(driver.session.bodyLength, 3 * RESULT + 4); // k = 0
    assert.equal(readU32(driver.session.buffer, BODY_OFFSET + 3 * RESULT), 0);
    assert.equal(driver.step([END, 1, END]), IDS.STEP_BATCH_RESP);
    const buffer = driver.session.buffer;
    assert.equal(driver.session.bodyLength, 3 * RESULT + 4 + 2 * (4 + RESULT));
    assert.deepEqual(driver.counts(), [0, 2, 0]); // envs 0 and 2 already reset
    const tail = BODY_OFFSET + 3 * RESULT;
    assert.equal(readU32(buffer, tail), 2);
    for (const [k, index] of [0, 2].entries()) {
      const at = tail + 4 + k * (4 + RESULT);
      assert.equal(readU32(buffer, at), index);
      const final = pac_env.StepResultCodec.decode(buffer, at + 4);
      assert.equal(final.done, 1);
      assert.equal(final.observation[1], 2);
    }
  });

  test("same_step over unix:// with the Node client: finals", async () => {
    const url = `unix://${join(tmpdir(), `transport-session-${randomBytes(6).toString("hex")}.sock`)}`;
    const server = await serve(FlakyEnv, url, { numEnvs: 2 });
    servers.add(server);
    const client = await connect(server.url, { autoreset: "same_step" });
    try {
      assert.equal(client.autoreset, AutoReset.SAME_STEP);
      assert.equal(client.serverInfo.autoreset, "same_step");
      await client.reset();
      await client.step([1, 1]);
      assert.equal(client.finals.length, 0);
      const results = await client.step([1, END]);
      assert.ok(Array.isArray(results));
      assert.equal(results[1]!.done, 0);
      assert.equal(results[1]!.observation[1], 0);
      assert.equal(client.finals.length, 1);
      assert.equal(client.finals[0]!.index, 1);
      assert.equal(client.finals[0]!.result.done, 1);
      assert.equal(client.finals[0]!.result.observation[1], 2);
      await client.step([1, 1]);
      assert.equal(client.finals.length, 0);
    } finally {
      await client.close();
    }
  });
});

const servers = new Set<Server>();
after(async () => {
  for (const server of servers) await server.close();
});

describe("env errors", () => {
  test("the error names the env and the others continue", () => {
    FlakyEnv.brokenResets = 0;
    const driver = new Driver(4);
    driver.reset();
    driver.step([1, 1, 1, 1]);
    assert.equal(driver.step([1, 1, POISON, 1]), IDS.ERROR);
    const { code, text } = driver.error();
    assert.equal(code, ErrorCode.ENV_ERROR);
    assert.equal(text, "env 2: TypeError: poisoned action (the env was reset)");
    assert.equal(driver.step([1, 1, 1, 1]), IDS.STEP_BATCH_RESP);
    assert.deepEqual(driver.counts(), [3, 3, 1, 3]);
  });

  test("a failed reset recreates the env from the factory", () => {
    FlakyEnv.brokenResets = 0;
    const driver = new Driver(4);
    driver.reset();
    driver.step([1, 1, 1, 1]);
    const before = created;
    closed.length = 0;
    FlakyEnv.brokenResets = 1;
    assert.equal(driver.step([1, POISON, 1, 1]), IDS.ERROR);
    assert.equal(driver.error().text, "env 1: TypeError: poisoned action (the env was recreated)");
    assert.equal(created, before + 1);
    assert.deepEqual(closed.map((env) => env.steps), [1]); // the broken env: closed when replaced
    driver.step([2, 2, 2, 2]);
    assert.deepEqual(driver.counts(), [3, 1, 3, 3]);
  });

  test("an env whose reset keeps failing needs a reset", () => {
    FlakyEnv.brokenResets = 0;
    const driver = new Driver(4);
    driver.reset();
    FlakyEnv.brokenResets = 2;
    closed.length = 0;
    const before = created;
    assert.equal(driver.step([POISON, 1, 1, 1]), IDS.ERROR);
    assert.equal(created, before + 1);
    assert.equal(closed.length, 1); // the made env whose reset failed is closed, not dropped
    assert.match(driver.error().text, /^env 0: TypeError: poisoned action \(.*send a reset\)$/);
    assert.equal(driver.step([1, 1, 1, 1]), IDS.ERROR);
    assert.equal(driver.error().code, ErrorCode.NOT_RESET);
    assert.equal(driver.reset(), IDS.RESET_RESP);
    driver.step([1, 1, 1, 1]);
    assert.deepEqual(driver.counts(), [1, 1, 1, 1]);
  });

  test("a failing reset: the others reset, the failed one is reset again", () => {
    FlakyEnv.brokenResets = 0;
    const driver = new Driver(3);
    FlakyEnv.brokenResets = 1; // env 0's reset throws, then its retry succeeds
    assert.equal(driver.reset(), IDS.ERROR);
    assert.equal(
      driver.error().text,
      "env 0: RangeError: the simulator crashed during reset (the env was reset)",
    );
    assert.equal(driver.step([1, 1, 1]), IDS.STEP_BATCH_RESP);
    assert.deepEqual(driver.counts(), [1, 1, 1]);
  });

  test("bad values: ENV_ERROR naming the env and the field", () => {
    const bad: Env<unknown> = {
      spaces: () => ({ obsN: OBS_N, actN: ACT_N }),
      reset: () => ({ observation: new Float32Array(3) }),
      step: () => ({}),
    };
    const session = sessionFactory(bad)();
    const hello = encodeHello(pac_env.SCHEMA.fingerprint);
    session.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength);
    assert.equal(session.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0), IDS.ERROR);
    const parsed = parseError(session.body());
    assert.equal(parsed?.code, ErrorCode.ENV_ERROR);
    assert.match(parsed?.text ?? "", /^env 0: returned bad values: .*could not be reset: send a reset\)$/);
  });

  test("a single-env server over unix:// with the Node client", async () => {
    FlakyEnv.brokenResets = 0;
    const url = `unix://${join(tmpdir(), `transport-session-${randomBytes(6).toString("hex")}.sock`)}`;
    const server = await serve(FlakyEnv, url);
    servers.add(server);
    const client = await connect(server.url);
    try {
      await client.reset();
      await assert.rejects(client.step(POISON), (error: unknown) => {
        assert.ok(error instanceof RemoteError);
        assert.equal(error.code, ErrorCode.ENV_ERROR);
        assert.match(error.text, /^env 0: TypeError: poisoned action/);
        return true;
      });
      const result = await client.step(1);
      assert.ok(!Array.isArray(result));
      assert.equal(result.observation[1], 1);
    } finally {
      await client.close();
    }
  });
});
