/**
 * The byte rules behind the codec's cheap encode (issue 24 item 2): only padding is zeroed
 * (every field writes all its bytes), the NaN scan of a float typed array (a sum, settled by an
 * exact pass) still writes every NaN as the canonical one and leaves infinities alone, and the
 * one-read field lookup still treats inherited values as missing.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { type StructLayout, defineStruct, loadSchema, paddingRanges } from "../codec";
import { computeFingerprint } from "../fingerprint";
import { channels, pac_env } from "../generated";
import type { SchemaJson } from "../ir";
import { codecErrorOf } from "../testing/fixtures";

const { StepResultCodec } = pac_env;

function result(observation: Float32Array): pac_env.StepResultInput {
  return {
    observation,
    action_mask: new Uint8Array(92).fill(1),
    reward: 0.5,
    done: 0,
    rank: 1,
    life: 100,
    money: 7,
    stage: 3,
    board_size: 2,
    level: 4,
    synergy_count: 0,
    items_held: 1,
    actions_this_turn: 2,
  };
}

function f32Bits(bits: readonly number[]): Float32Array {
  return new Float32Array(new Uint32Array(bits).buffer);
}

function storedWords(bytes: Uint8Array, count: number): number[] {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return Array.from({ length: count }, (_, i) => dv.getUint32(i * 4, true));
}

describe("padding", () => {
  test("a packed layout has none; a natural one lists its gaps, nested structs included", () => {
    assert.deepEqual(paddingRanges(pac_env.IR, "StepResult"), []);
    assert.deepEqual(paddingRanges(pac_env.IR, "StepMultiResult"), []);
    assert.deepEqual(paddingRanges(channels.IR, "SegmentHeader"), [56, 64]);
    assert.equal(paddingRanges(channels.IR, "NoSuchStruct"), null);
  });

  test("encodeInto and writeInto over dirty bytes give encode's bytes (padding zeroed)", () => {
    let padded = 0;
    for (const [name, codec] of Object.entries(channels.SCHEMA.structs)) {
      const ranges = paddingRanges(channels.IR, name) ?? [];
      const raw = new Uint8Array(codec.size).fill(1); // bools 1, ints 1: valid unless an enum
      let value: unknown;
      try {
        value = codec.decode(raw, 0, false);
        codec.encode(value);
      } catch {
        continue;
      }
      const want = codec.encode(value);
      if (ranges.length > 0) padded++;
      for (const mode of ["encodeInto", "writeInto"] as const) {
        const buf = new Uint8Array(codec.size + 9).fill(0xaa);
        codec[mode](value, buf, 5);
        assert.deepEqual(buf.subarray(5, 5 + codec.size), want, `${name} ${mode}`);
        for (let k = 0; k < ranges.length; k += 2) {
          const gap = buf.subarray(5 + (ranges[k] as number), 5 + (ranges[k + 1] as number));
          assert.ok(gap.every((b) => b === 0), `${name} padding`);
        }
        assert.equal(buf[4], 0xaa);
        assert.equal(buf[5 + codec.size], 0xaa);
      }
    }
    assert.ok(padded > 0, "no struct with padding was checked");
  });

  test("a layout outside any schema has every byte zeroed first", () => {
    const layout: StructLayout<number, number, number> = {
      name: "Loose",
      size: 4,
      validateAt: () => undefined,
      writeAt: (dv, at, value) => dv.setUint8(at, value),
      checkAt: () => undefined,
      readAt: (dv, at) => dv.getUint8(at),
      viewAt: (dv, at) => dv.getUint8(at),
    };
    const codec = defineStruct(layout);
    const buf = new Uint8Array(6).fill(0xaa);
    codec.encodeInto(7, buf, 1);
    assert.deepEqual([...buf], [0xaa, 7, 0, 0, 0, 0xaa]);
  });
});

describe("NaN", () => {
  const NAN = 0x7fc00000;
  test("every f32 NaN is the canonical one; infinities and -0 keep their bits", () => {
    const bits = [0x7f800001, 0xffc00001, 0x7f800000, 0xff800000, 0x3fc00000, 0x80000000, 0x7fffffff];
    const observation = new Float32Array(612);
    observation.set(f32Bits(bits), 600);
    const buf = new Uint8Array(StepResultCodec.size + 3).fill(0xee);
    for (const mode of ["encodeInto", "writeInto"] as const) {
      StepResultCodec[mode](result(observation), buf, 3);
      const words = storedWords(buf.subarray(3 + 600 * 4), bits.length);
      assert.deepEqual(words, [NAN, NAN, 0x7f800000, 0xff800000, 0x3fc00000, 0x80000000, NAN]);
      assert.deepEqual(storedWords(buf.subarray(3), 600), new Array(600).fill(0));
    }
  });

  test("+inf and -inf without a NaN (the scan's false alarm) are stored as they are", () => {
    const observation = new Float32Array(612);
    observation[0] = Infinity;
    observation[611] = -Infinity;
    observation[5] = 2.5;
    const bytes = StepResultCodec.encode(result(observation));
    assert.deepEqual(new Float32Array(bytes.slice(0, 2448).buffer), observation);
  });

  test("every f64 NaN is the canonical one (a run-time schema with an f64 array)", () => {
    const ir = JSON.parse(JSON.stringify(pac_env.IR)) as { structs: Record<string, { fields: { name: string; type: string; count: number }[] }> };
    const field = ir.structs["StepResult"]?.fields.find((f) => f.name === "observation");
    assert.ok(field !== undefined);
    field.type = "f64[306]";
    field.count = 306;
    const schemaIr = ir as unknown as SchemaJson & { fingerprint: string };
    schemaIr.fingerprint = computeFingerprint(schemaIr).hex;
    const codec = loadSchema(schemaIr).structs["StepResult"];
    assert.ok(codec !== undefined);
    const observation = new Float64Array(306);
    const words = new Uint32Array(observation.buffer);
    words.set([1, 0x7ff00000], 0); // NaN, payload in the low word
    words.set([0, 0xfff80000], 2); // negative quiet NaN
    observation[2] = Infinity;
    observation[3] = -Infinity;
    observation[4] = -0;
    const bytes = codec.encode({ ...result(new Float32Array(0)), observation });
    const stored = new Float64Array(bytes.slice(0, 306 * 8).buffer);
    const storedWords32 = new Uint32Array(stored.buffer);
    assert.deepEqual([...storedWords32.subarray(0, 4)], [0, 0x7ff80000, 0, 0x7ff80000]);
    assert.deepEqual([...stored.subarray(2, 5)], [Infinity, -Infinity, -0]);
    assert.ok(Object.is(stored[4], -0));
  });
});

describe("field lookup", () => {
  test("values inherited from a prototype are missing; null-prototype objects are fine", () => {
    const base = result(new Float32Array(612));
    const inherited = Object.create(base) as pac_env.StepResultInput;
    assert.equal(codecErrorOf(() => StepResultCodec.encode(inherited)).code, "missing_field");
    const bare = Object.assign(Object.create(null) as object, base) as pac_env.StepResultInput;
    assert.deepEqual(StepResultCodec.encode(bare), StepResultCodec.encode(base));
    class Result {
      constructor() {
        Object.assign(this, base);
      }
    }
    const instance = new Result() as unknown as pac_env.StepResultInput;
    assert.deepEqual(StepResultCodec.encode(instance), StepResultCodec.encode(base));
    const { reward: _reward, ...rest } = base;
    const partial = Object.assign(Object.create({ reward: 1 }) as object, rest);
    const error = codecErrorOf(() => StepResultCodec.encode(partial as pac_env.StepResultInput));
    assert.equal(error.code, "missing_field");
    assert.equal(error.field, "reward");
  });
});
