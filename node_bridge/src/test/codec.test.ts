/** Generated codecs: round trips, views, canonical bytes and every error code with its path. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { dataViewOf, loadSchema } from "../codec";
import { ArrayLengthError, CodecError, SchemaError, ValueRangeError } from "../errors";
import { gridworld, mahjong_env, pac_env, pac_shm } from "../generated";
import { codecErrorOf, hex, stepResult } from "../testing/fixtures";

const { StepResultCodec, StepMultiResultCodec, HelloCodec } = pac_env;
const { AgentStepCodec, ActionRequestCodec, ScoreUpdateCodec, MeldCodec } = mahjong_env;

function agentStep(): mahjong_env.AgentStepInput {
  const meld = { kind: mahjong_env.MeldKind.PONG, from_seat: -1, tiles: [1, 2, 3, 255] };
  return {
    agent: mahjong_env.Agent.PLAYER_2,
    terminated: false,
    truncated: true,
    seat_wind: mahjong_env.Wind.WEST,
    reward: -0.25,
    observation: new Float32Array(290).fill(0.5),
    action_mask: Array.from({ length: 104 }, (_, i) => i % 3 === 0),
    prevailing_wind: mahjong_env.Wind.EAST,
    tiles_remaining: 64,
    turn: 4000000000,
    melds: [meld, meld, { ...meld, kind: mahjong_env.MeldKind.NONE }, meld],
    score: -(2n ** 63n),
    episode_id: 2n ** 64n - 1n,
    hand_value: 1e300,
    last_discard: -32768,
    dealer_streak: 2147483647,
  };
}

describe("round trips", () => {
  test("StepResult decode gives typed arrays and the encoded values", () => {
    const bytes = StepResultCodec.encode(stepResult());
    const decoded = StepResultCodec.decode(bytes);
    assert.ok(decoded.observation instanceof Float32Array);
    assert.ok(decoded.action_mask instanceof Uint8Array);
    assert.equal(decoded.observation[9], 9 / 8);
    assert.equal(decoded.money, 65535);
    assert.equal(hex(StepResultCodec.encode(decoded)), hex(bytes));
  });

  test("AgentStep with nested melds, 64-bit bigints and bool arrays", () => {
    const bytes = AgentStepCodec.encode(agentStep());
    const decoded = AgentStepCodec.decode(bytes);
    assert.equal(decoded.score, -(2n ** 63n));
    assert.equal(decoded.episode_id, 2n ** 64n - 1n);
    assert.equal(decoded.melds[2]?.kind, -1);
    assert.deepEqual([...(decoded.melds[0]?.tiles ?? [])], [1, 2, 3, 255]);
    assert.equal(decoded.action_mask[3], true);
    assert.equal(decoded.truncated, true);
    assert.equal(hex(AgentStepCodec.encode(decoded)), hex(bytes));
  });

  test("u64 accepts an integral number as well as a bigint", () => {
    const asNumber = HelloCodec.encode({ protocol_version: 1, flags: 0, fingerprint: 2 ** 53 });
    const asBigInt = HelloCodec.encode({ protocol_version: 1, flags: 0, fingerprint: 2n ** 53n });
    assert.equal(hex(asNumber), hex(asBigInt));
  });

  test("integral floats are accepted for integer fields", () => {
    const value = { ...stepResult(), life: 3.0, done: 1.0 };
    assert.equal(StepResultCodec.decode(StepResultCodec.encode(value)).life, 3);
  });

  test("encodeInto writes at an offset and leaves the rest alone", () => {
    const buf = new Uint8Array(3 + StepResultCodec.size + 2).fill(0xee);
    StepResultCodec.encodeInto(stepResult(), buf, 3);
    assert.equal(buf[2], 0xee);
    assert.equal(buf[3 + StepResultCodec.size], 0xee);
    assert.equal(StepResultCodec.decode(buf, 3).life, 300);
  });

  test("f32 rounds to nearest even; -0, infinities survive", () => {
    const value = { ...stepResult(), reward: 0.1 };
    value.observation = [-0, Infinity, -Infinity, ...new Array<number>(609).fill(1)];
    const decoded = StepResultCodec.decode(StepResultCodec.encode(value));
    assert.equal(decoded.reward, Math.fround(0.1));
    assert.ok(Object.is(decoded.observation[0], -0));
    assert.equal(decoded.observation[1], Infinity);
    assert.equal(decoded.observation[2], -Infinity);
  });
});

describe("views", () => {
  test("aligned arrays are zero-copy typed arrays over the buffer", () => {
    const buf = new Uint8Array(64 + pac_shm.SlotCodec.size);
    const slot = pac_shm.SlotCodec.view(buf, 64);
    const observation = slot.observation;
    assert.ok(observation instanceof Float32Array);
    assert.equal(observation.byteOffset, 64 + 32);
    observation[1] = 2.5;
    assert.equal(dataViewOf(buf).getFloat32(64 + 32 + 4, true), 2.5);
    dataViewOf(buf).setFloat32(64 + 16, 7.5, true);
    assert.equal(slot.reward, 7.5);
  });

  test("unaligned arrays fall back to a copy with the same values", () => {
    const bytes = StepResultCodec.encode(stepResult());
    const shifted = new Uint8Array(bytes.length + 1);
    shifted.set(bytes, 1);
    const view = StepResultCodec.view(shifted, 1);
    assert.equal(view.observation[9], 9 / 8);
    assert.equal(view.observation.buffer === shifted.buffer, false);
    assert.equal(view.life, 300);
  });

  test("nested struct arrays are views too", () => {
    const bytes = AgentStepCodec.encode(agentStep());
    const view = AgentStepCodec.view(bytes);
    assert.equal(view.melds[2]?.kind, -1);
    assert.equal(view.episode_id, 2n ** 64n - 1n);
    assert.equal(view.action_mask[3], 1);
  });
});

describe("canonical bytes", () => {
  test("every NaN is written as the canonical quiet NaN", () => {
    const value = stepResult();
    const observation = new Float32Array(612);
    new Uint32Array(observation.buffer)[7] = 0x7fc00001; // a NaN with a payload
    value.observation = observation;
    value.reward = NaN;
    const dv = dataViewOf(StepResultCodec.encode(value));
    assert.equal(dv.getUint32(7 * 4, true), 0x7fc00000);
    assert.equal(dv.getUint32(2540, true), 0x7fc00000);
    const step = { ...agentStep(), hand_value: -NaN };
    const bits = dataViewOf(AgentStepCodec.encode(step)).getBigUint64(1320, true);
    assert.equal(bits, 0x7ff8000000000000n);
  });

  test("padding is zeroed: ActionRequest byte 1, ScoreUpdate's last two bytes", () => {
    const buf = new Uint8Array(ActionRequestCodec.size).fill(0xff);
    ActionRequestCodec.encodeInto({ agent: 1, action: 0x0203 }, buf, 0);
    assert.equal(hex(buf), "01000302");
    const scores = new Uint8Array(ScoreUpdateCodec.size).fill(0xff);
    const update = {
      scores: [1, 2, 3, 4],
      deltas: [-1, -2, -3, -4],
      winner: 0,
      draw: true,
      fan: [1, 2, 3, 4],
    };
    ScoreUpdateCodec.encodeInto(update, scores, 0);
    assert.equal(hex(scores.subarray(24)), "0001010203040000");
  });
});

describe("encode errors", () => {
  const step = (change: Record<string, unknown>) => () =>
    StepResultCodec.encode({ ...stepResult(), ...change } as never);
  const agent = (change: Record<string, unknown>) => () =>
    AgentStepCodec.encode({ ...agentStep(), ...change } as never);
  const hello = (fingerprint: unknown) => () =>
    HelloCodec.encode({ protocol_version: 1, flags: 0, fingerprint } as never);
  const withoutRank = () => {
    const value: Record<string, unknown> = { ...stepResult() };
    delete value["rank"];
    return StepResultCodec.encode(value as never);
  };
  const badTile = Array.from(agentStep().melds).map((meld, i) =>
    i === 1 ? { ...meld, tiles: [0, 0, 256, 0] } : meld,
  );
  const maskEnding256 = [...new Array<number>(91).fill(0), 256];
  const shortBuffer = () => StepResultCodec.encodeInto(stepResult(), new Uint8Array(10), 0);

  const cases: Array<[string, () => unknown, string, string]> = [
    ["buffer_size", shortBuffer, "buffer_size", ""],
    ["wrong_type struct", () => StepResultCodec.encode(3 as never), "wrong_type", ""],
    ["missing_field", withoutRank, "missing_field", "rank"],
    ["unknown_field, first sorted", step({ zebra: 1, apple: 2 }), "unknown_field", "apple"],
    ["array_length", step({ action_mask: [1] }), "array_length", "action_mask"],
    ["wrong_type array", step({ observation: "x" }), "wrong_type", "observation"],
    ["out_of_range item", step({ action_mask: maskEnding256 }), "out_of_range", "action_mask[91]"],
    ["out_of_range u16", step({ life: -1 }), "out_of_range", "life"],
    ["out_of_range f32", step({ reward: 3.5e38 }), "out_of_range", "reward"],
    ["wrong_type fraction", step({ stage: 1.5 }), "wrong_type", "stage"],
    ["wrong_type NaN for int", step({ stage: NaN }), "wrong_type", "stage"],
    ["wrong_type bool for int", step({ rank: true }), "wrong_type", "rank"],
    ["wrong_type int for bool", agent({ terminated: 1 }), "wrong_type", "terminated"],
    ["invalid_enum", agent({ seat_wind: 4 }), "invalid_enum", "seat_wind"],
    ["out_of_range u64 bigint", hello(2n ** 64n), "out_of_range", "fingerprint"],
    ["out_of_range u64 number", hello(-1), "out_of_range", "fingerprint"],
    ["out_of_range i64 number", agent({ score: 2 ** 63 }), "out_of_range", "score"],
    ["nested element path", agent({ melds: badTile }), "out_of_range", "melds[1].tiles[2]"],
    ["nested not a mapping", agent({ melds: [1, 2, 3, 4] }), "wrong_type", "melds[0]"],
  ];
  for (const [name, work, code, field] of cases) {
    test(name, () => assert.deepEqual(codecErrorOf(work), { code, field }));
  }

  test("first error in byte-offset order, with the struct in the message", () => {
    const results = Array.from({ length: 8 }, () => stepResult());
    const third = results[2] as pac_env.StepResultInput;
    third.observation = Array.from({ length: 612 }, (_, i) => (i === 5 || i === 9 ? 1e39 : 0));
    (results[4] as pac_env.StepResultInput).life = -1;
    let caught: unknown;
    try {
      StepMultiResultCodec.encode({ results });
    } catch (error) {
      caught = error;
    }
    assert.ok(caught instanceof ValueRangeError);
    assert.ok(caught instanceof CodecError);
    assert.equal(caught.field, "results[2].observation[5]");
    assert.equal(caught.struct, "StepMultiResult");
    assert.match(caught.message, /^StepMultiResult\.results\[2\]\.observation\[5\]: /);
  });
});

describe("strict decode errors", () => {
  test("buffer_size on a short buffer or an offset past the room", () => {
    assert.deepEqual(
      codecErrorOf(() => StepResultCodec.decode(new Uint8Array(2556))),
      {
        code: "buffer_size",
        field: "",
      },
    );
    assert.deepEqual(
      codecErrorOf(() => MeldCodec.decode(new Uint8Array(8), 3)),
      {
        code: "buffer_size",
        field: "",
      },
    );
  });

  test("invalid_bool, invalid_enum, non_canonical; non-strict decode accepts them", () => {
    const good = AgentStepCodec.encode(agentStep());
    const corrupt = (at: number, byte: number): Uint8Array => {
      const copy = good.slice();
      copy[at] = byte;
      return copy;
    };
    assert.deepEqual(
      codecErrorOf(() => AgentStepCodec.decode(corrupt(1168 + 5, 2))),
      {
        code: "invalid_bool",
        field: "action_mask[5]",
      },
    );
    assert.deepEqual(
      codecErrorOf(() => AgentStepCodec.decode(corrupt(1280 + 6, 7))),
      {
        code: "invalid_enum",
        field: "melds[1].kind",
      },
    );
    const nan = good.slice();
    dataViewOf(nan).setUint32(8 + 4 * 10, 0x7fc00001, true);
    assert.deepEqual(
      codecErrorOf(() => AgentStepCodec.decode(nan)),
      {
        code: "non_canonical",
        field: "observation[10]",
      },
    );
    const nan64 = good.slice();
    dataViewOf(nan64).setBigUint64(1320, 0xfff8000000000000n, true);
    assert.deepEqual(
      codecErrorOf(() => AgentStepCodec.decode(nan64)),
      {
        code: "non_canonical",
        field: "hand_value",
      },
    );
    assert.ok(Number.isNaN(AgentStepCodec.decode(nan, 0, false).observation[10]));
    assert.equal(AgentStepCodec.decode(corrupt(1, 2), 0, false).terminated, true);
  });

  test("the first strict error in byte order wins", () => {
    const bytes = AgentStepCodec.encode(agentStep());
    bytes[1168 + 50] = 9; // action_mask[50]
    bytes[2] = 9; // truncated, earlier in the buffer
    assert.deepEqual(
      codecErrorOf(() => AgentStepCodec.decode(bytes)),
      {
        code: "invalid_bool",
        field: "truncated",
      },
    );
  });
});

describe("multi-dimensional arrays (gridworld f32[2,5,5])", () => {
  const { StepResultCodec: Grid, StepResultShapes } = gridworld;

  type Observation = gridworld.StepResultInput["observation"];

  function grid(observation: Observation): gridworld.StepResultInput {
    return {
      observation,
      reward: -0.5,
      terminated: false,
      truncated: true,
      action_mask: [true, false, true, true],
      walls: Array.from({ length: 5 }, (_, r) => Array.from({ length: 5 }, (_, c) => r === c)),
      visits: new Uint16Array(25).map((_, i) => i),
      position: [1, 4],
    };
  }

  const flat = new Float32Array(50).map((_, i) => i);
  const nested = Array.from({ length: 2 }, (_, l) =>
    Array.from({ length: 5 }, (_, r) => Array.from({ length: 5 }, (_, c) => l * 25 + r * 5 + c)),
  );

  test("the generated module exposes the shapes; the IR keeps them", () => {
    assert.deepEqual(StepResultShapes.observation, [2, 5, 5]);
    assert.deepEqual(StepResultShapes.visits, [5, 5]);
    const field = gridworld.IR.structs["StepResult"]?.fields.find((f) => f.name === "observation");
    assert.deepEqual(field?.shape, [2, 5, 5]);
    assert.equal(field?.count, 50);
  });

  test("nested and flat (row-major) values encode to the same bytes; views are flat", () => {
    const a = Grid.encode(grid(flat));
    const b = Grid.encode(grid(nested));
    assert.deepEqual(a, b);
    const view = Grid.view(a);
    assert.ok(view.observation instanceof Float32Array);
    assert.equal(view.observation.length, 50);
    assert.equal(view.observation[25 + 2 * 5 + 3], 38);
    const decoded = Grid.decode(a);
    assert.equal(decoded.visits[24], 24);
    assert.equal(decoded.walls[6], true);
  });

  test("a wrong shape or element names the field or the flat element", () => {
    const wrong = [[[0, 0, 0, 0, 0]]];
    assert.throws(() => Grid.encode(grid(wrong)), (e: unknown) => {
      assert.ok(e instanceof ArrayLengthError);
      assert.equal(e.field, "observation");
      return true;
    });
    const visits = Array.from({ length: 5 }, () => [0, 0, 0, 0, 0]);
    (visits[4] as number[])[2] = 70000;
    const big = { ...grid(flat), visits };
    assert.throws(() => Grid.encode(big), (e: unknown) => {
      assert.ok(e instanceof ValueRangeError);
      assert.equal(e.field, "visits[22]");
      return true;
    });
  });
});

describe("loadSchema: codecs from a compiled IR at run time", () => {
  test("the same bytes, values, views and errors as the generated module", () => {
    const runtime = loadSchema(pac_env.IR);
    assert.equal(runtime.fingerprint, pac_env.FINGERPRINT);
    assert.deepEqual(Object.keys(runtime.structs), Object.keys(pac_env.SCHEMA.structs));
    const codec = runtime.structs["StepResult"];
    assert.ok(codec !== undefined);
    const bytes = codec.encode(stepResult());
    assert.deepEqual(bytes, StepResultCodec.encode(stepResult()));
    assert.deepEqual(codec.decode(bytes), StepResultCodec.decode(bytes));
    const view = codec.view(bytes) as { reward: number; observation: Float32Array };
    assert.equal(view.reward, StepResultCodec.view(bytes).reward);
    assert.equal(view.observation.length, 612);
    const bad = { ...stepResult(), life: 70000 };
    assert.throws(() => codec.encode(bad), (e: unknown) => {
      assert.ok(e instanceof ValueRangeError);
      assert.equal(e.field, "life");
      return true;
    });
  });

  test("nested structs, enums and multi-dimensional arrays", () => {
    const runtime = loadSchema(mahjong_env.IR);
    const codec = runtime.structs["AgentStep"];
    assert.ok(codec !== undefined);
    assert.deepEqual(codec.encode(agentStep()), AgentStepCodec.encode(agentStep()));
    const grid = loadSchema(gridworld.IR).structs["StepResult"];
    assert.equal(grid?.size, gridworld.StepResultCodec.size);
  });

  test("an IR that does not hash to its fingerprint is refused", () => {
    const tampered = { ...copyOfPacIr(), fingerprint: "0000000000000000" };
    assert.throws(() => loadSchema(tampered), SchemaError);
  });
});

function copyOfPacIr(): typeof pac_env.IR {
  return JSON.parse(JSON.stringify(pac_env.IR)) as typeof pac_env.IR;
}
