/**
 * The IR loader's rules and words, the Python loader's (transport/schema/ir.py `check_ir_json`,
 * `check_ir_layout`; tests/test_ir_loader_rules.py runs both on the same files): unknown keys
 * (an IR written by a newer transport), exact JSON types (an integer is a JSON integer: not a
 * bool, a float such as `32.0`, or a string), the shm offset maps checked against the slot, the
 * file named in every refusal of `loadSchemaFile`, a missing or non-text fingerprint worded as
 * Python words it. Hand-edited IRs get their fingerprint recomputed, so each reaches its rule.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { loadSchema } from "../codec";
import { ProtocolError, SchemaError } from "../errors";
import { computeFingerprint } from "../fingerprint";
import { pac_env } from "../generated";
import { JsonFloat, type SchemaJson, checkIrJson, parseIrText } from "../ir";
import { schemaFromIrText } from "../protocol";
import { loadSchemaFile } from "../schema_file";

const place = mkdtempSync(join(tmpdir(), "transport-ir-loader-rules-"));
after(() => rmSync(place, { recursive: true, force: true }));

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

/** pac_env's IR edited by `edit`, fingerprint recomputed unless `keep`. */
function edited(edit: (ir: Json) => void, keep = false): Json {
  const ir = JSON.parse(JSON.stringify(pac_env.SCHEMA.ir)) as Json;
  edit(ir);
  if (!keep) ir["fingerprint"] = computeFingerprint(ir as unknown as SchemaJson).hex;
  return ir;
}

const reward = (ir: Json): Json => (ir["structs"]["StepResult"]["fields"] as Json[]).find((f) => f["name"] === "reward") as Json;

/** `text` as a .json file: what loadSchemaFile says of it (the message of its SchemaError). */
function refusalOf(name: string, text: string): string {
  const path = join(place, `${name}.json`);
  writeFileSync(path, text);
  let message = "";
  assert.throws(
    () => loadSchemaFile(path),
    (e: unknown) => {
      assert.ok(e instanceof SchemaError, String(e));
      message = (e as Error).message;
      return true;
    },
  );
  assert.ok(message.startsWith(`${path}: `), message);
  assert.ok(!message.includes("\n"));
  return message.slice(path.length + 2);
}

const P = "IR of pac_env: ";
const F = "structs.StepResult.fields[2]";

describe("an IR file is refused by Python's rules, in its words, naming the file", () => {
  test("an unknown key: an IR written by a newer transport, with or without its fingerprint", () => {
    const words =
      `${P}unknown key "color" at ${F} (an IR written by a newer transport? this one knows ` +
      "name, type, offset, size, count, role, shape, low, high, allow_nonfinite)";
    assert.equal(refusalOf("color", JSON.stringify(edited((d) => void (reward(d)["color"] = "red")))), words);
    assert.equal(refusalOf("color_stale", JSON.stringify(edited((d) => void (reward(d)["color"] = "red"), true))), words);
  });

  test("a float where an integer belongs: 32.0 is not 32 (the text is read as Python reads it)", () => {
    // a value found once in the text, written back as a float
    const asFloat = (key: string, text: string): string => {
      const ir = edited((d) => void (reward(d)[key] = 777777));
      const json = JSON.stringify(ir);
      assert.equal(json.split(`"${key}":777777`).length, 2);
      return json.replace(`"${key}":777777`, `"${key}":${text}`);
    };
    assert.equal(refusalOf("offset_float", asFloat("offset", "777777.0")), `${P}${F}.offset is a float, not an integer`);
    assert.equal(refusalOf("count_exp", asFloat("count", "7.77777e5")), `${P}${F}.count is a float, not an integer`);
  });

  test("a bool, a string: not an integer", () => {
    assert.equal(refusalOf("count_true", JSON.stringify(edited((d) => void (reward(d)["count"] = true)))), `${P}${F}.count is true, not an integer`);
    assert.equal(refusalOf("size_string", JSON.stringify(edited((d) => void (reward(d)["size"] = "4")))), `${P}${F}.size is a string, not an integer`);
    assert.equal(refusalOf("offset_string", JSON.stringify(edited((d) => void (reward(d)["offset"] = "16")))), `${P}${F}.offset is a string, not an integer`);
  });

  test("a missing fingerprint, an integer fingerprint (not rounded, not 'undefined')", () => {
    assert.equal(refusalOf("no_fp", JSON.stringify(edited((d) => void delete d["fingerprint"], true))), "IR of pac_env names no fingerprint");
    const text = JSON.stringify(edited((d) => void (d["fingerprint"] = 0), true)).replace('"fingerprint":0', '"fingerprint":14614476047352059999');
    assert.equal(refusalOf("int_fp", text), `${P}fingerprint is an integer, not 16 lowercase hex digits`);
  });

  test("an shm offset map that puts a field before its slot, far past it, or over a control word", () => {
    const at = (key: string, value: number): string => JSON.stringify(edited((d) => void (d["shm"]["result_offsets"][key] = value)));
    assert.equal(
      refusalOf("shm_negative", at("observation", -64)),
      `${P}[shm] result_offsets.observation is -64: StepResult.observation (2448 bytes) would start before slot ShmSlot (5120 bytes), in the control block or another env's area`,
    );
    assert.equal(
      refusalOf("shm_far", at("observation", 10 ** 9)),
      `${P}[shm] result_offsets.observation is 1000000000: StepResult.observation (2448 bytes) would end at byte 1000002448, past slot ShmSlot (5120 bytes), in another env's area or past the region`,
    );
    assert.equal(
      refusalOf("shm_word", at("reward", 4)),
      `${P}[shm] result_offsets.reward is 4: StepResult.reward (4 bytes) would overlap the control word sem_result_ready of slot ShmSlot (bytes 4..7)`,
    );
  });

  test("bad JSON in Python's words", () => {
    assert.equal(refusalOf("trailing_comma", "[1,]"), "not JSON: Expecting value: line 1 column 4 (char 3)");
    assert.equal(refusalOf("empty", ""), "not JSON: Expecting value: line 1 column 1 (char 0)");
    assert.equal(refusalOf("extra", "{}\n{}"), "not JSON: Extra data: line 2 column 1 (char 3)");
  });
});

describe("parseIrText reads numbers as Python's json.loads does", () => {
  test("integers stay numbers; fractions, exponents, NaN and Infinity are floats", () => {
    const value = parseIrText('{"a": 32, "b": 32.0, "c": 1e2, "d": -0, "e": NaN, "f": -Infinity, "__proto__": 1}') as Record<string, unknown>;
    assert.equal(value["a"], 32);
    assert.ok(value["b"] instanceof JsonFloat && value["b"].value === 32);
    assert.ok(value["c"] instanceof JsonFloat && value["c"].value === 100);
    assert.ok(value["e"] instanceof JsonFloat && Number.isNaN(value["e"].value));
    assert.ok(value["f"] instanceof JsonFloat);
    assert.deepEqual(Object.keys(value), ["a", "b", "c", "d", "e", "f", "__proto__"]);
    assert.equal(Object.getPrototypeOf(value), Object.prototype);
  });
});

describe("the same rules for an IR object and a discovered IR", () => {
  test("loadSchema(object) refuses what the file is refused for (a fraction is a float there too)", () => {
    const isRefusal = (words: string) => (e: unknown): boolean => {
      assert.ok(e instanceof SchemaError);
      assert.equal((e as Error).message, words);
      return true;
    };
    assert.throws(() => loadSchema(edited((d) => void (reward(d)["offset"] = 16.5), true) as unknown as SchemaJson), isRefusal(`${P}${F}.offset is a float, not an integer`));
    assert.throws(() => checkIrJson(edited((d) => void (d["features"] = 1), true)), /unknown key "features" at the top level/);
  });

  test("a discovered IR with a float offset is a ProtocolError naming the path", () => {
    const ir = edited((d) => void (reward(d)["offset"] = 777777));
    const text = JSON.stringify(ir).replace('"offset":777777', '"offset":777777.0');
    assert.throws(
      () => schemaFromIrText(text, BigInt(`0x${ir["fingerprint"]}`), "the server"),
      (e: unknown) => {
        assert.ok(e instanceof ProtocolError);
        assert.equal((e as Error).message, `the server sent a schema IR that does not load: ${P}${F}.offset is a float, not an integer`);
        return true;
      },
    );
  });
});
