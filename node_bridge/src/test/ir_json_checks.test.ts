/**
 * A compiled IR loaded at run time (`loadSchema(ir)`, `loadSchemaFile("x.json")`, `--schema
 * x.json` of the CLI, a discovered IR) is refused where Python's loader refuses it
 * (transport/schema/ir.py `ir_from_json`, then the codecs `Schema(ir)` makes): a field whose type
 * is not a scalar, an enum or a struct of the IR (checked before the fingerprint, as Python's
 * KeyError comes first), a field outside its struct (at a negative offset, or ending past the
 * struct's size: NumPy refuses the dtype), an IR that is not a JSON object of tables, and a
 * fingerprint that does not match. Hand-edited IRs get their fingerprint recomputed, so each
 * reaches the rule it tests. What Python loads (a result struct without a reward role,
 * overlapping fields) loads here too.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { loadSchema } from "../codec";
import { ProtocolError, SchemaError } from "../errors";
import { computeFingerprint } from "../fingerprint";
import { pac_env } from "../generated";
import type { FieldJson, SchemaJson, StructJson } from "../ir";
import { schemaFromIrText } from "../protocol";
import { loadSchemaFile } from "../schema_file";

const SERVE = join(__dirname, "..", "cli", "serve.js");
const place = mkdtempSync(join(tmpdir(), "transport-ir-json-checks-"));
after(() => rmSync(place, { recursive: true, force: true }));

type Mutable = { -readonly [K in keyof SchemaJson]: SchemaJson[K] } & {
  structs: Record<string, StructJson & { size: number; fields: (FieldJson & { type: string; offset: number })[] }>;
};

/** pac_env's IR, edited by `edit`, with its fingerprint recomputed (unless `keepFingerprint`). */
function edited(edit: (ir: Mutable) => void, keepFingerprint = false): SchemaJson {
  const ir = JSON.parse(JSON.stringify(pac_env.SCHEMA.ir)) as Mutable;
  edit(ir);
  if (!keepFingerprint) ir.fingerprint = computeFingerprint(ir as SchemaJson).hex;
  return ir as SchemaJson;
}

const field = (ir: Mutable, struct: string, name: string): Mutable["structs"][string]["fields"][number] =>
  ir.structs[struct]!.fields.find((f) => f.name === name)!;

/** `ir` written to a .json file, as `transport-schema inspect --json` writes one. */
function file(name: string, ir: unknown): string {
  const path = join(place, `${name}.json`);
  writeFileSync(path, JSON.stringify(ir, null, 1));
  return path;
}

/** Both loaders (the IR object, the .json file) refuse `ir` with a SchemaError matching `words`
 * (the file's: `PATH: ` then the words, as Python's `load_schema` names the file). */
function refused(name: string, ir: unknown, words: RegExp): void {
  const isRefusal = (prefix: string) => (e: unknown): boolean => {
    assert.ok(e instanceof SchemaError, `${name}: ${String(e)}`);
    const message = (e as Error).message;
    assert.ok(message.startsWith(prefix), message);
    assert.match(message.slice(prefix.length), words);
    assert.ok(!message.includes("\n"));
    return true;
  };
  assert.throws(() => loadSchema(ir as SchemaJson), isRefusal(""));
  const path = file(name, ir);
  assert.throws(() => loadSchemaFile(path), isRefusal(`${path}: `));
}

describe("a compiled IR is checked as Python's loader checks it", () => {
  test("a field of an unknown scalar type", () => {
    const ir = edited((d) => void (field(d, "StepResult", "reward").type = "f33"));
    refused("unknown_type", ir, /^IR of pac_env: field StepResult\.reward has type "f33", not a scalar type, an enum or a struct of this IR$/);
  });

  test("a field of a struct the IR does not have (an array of them too)", () => {
    refused("unknown_struct", edited((d) => void (field(d, "StepResult", "reward").type = "Nope")), /field StepResult\.reward has type "Nope"/);
    refused("unknown_structs", edited((d) => void (field(d, "StepMultiResult", "results").type = "Missing[8]")), /field StepMultiResult\.results has type "Missing\[8\]"/);
  });

  test("an unknown type is named before a stale fingerprint (Python's order)", () => {
    const ir = edited((d) => void (field(d, "StepResult", "reward").type = "f33"), true);
    refused("unknown_type_stale", ir, /has type "f33"/);
  });

  test("a wrong fingerprint", () => {
    const ir = edited((d) => void (d.fingerprint = "0123456789abcdef"), true);
    refused("wrong_fingerprint", ir, /^IR of pac_env has fingerprint 0123456789abcdef but hashes to 7f1be4e3b718a454$/);
  });

  test("a field that ends past its struct's size", () => {
    refused("struct_too_small", edited((d) => void (d.structs["StepResult"]!.size -= 4)), /^IR of pac_env: field StepResult\.\w+ \(u8 at offset 2553\) ends at byte 2554, outside struct StepResult of 2553 bytes$/);
    refused("offset_past_end", edited((d) => void (field(d, "StepResult", "reward").offset = 2556)), /field StepResult\.reward \(f32 at offset 2556\) ends at byte 2560, outside struct StepResult of 2557 bytes/);
    // a nested struct grown: the array of it no longer fits the struct that holds it
    refused("nested_too_big", edited((d) => void (d.structs["StepResult"]!.size += 8)), /field StepMultiResult\.results \(StepResult\[8\] at offset 0\) ends at byte 20520, outside struct StepMultiResult of 20456 bytes/);
  });

  test("a field at a negative offset", () => {
    refused("negative_offset", edited((d) => void (field(d, "StepResult", "reward").offset = -4)), /field StepResult\.reward \(f32 at offset -4\) starts before byte 0/);
  });

  test("an [env] naming a struct the IR lacks", () => {
    const ir = edited((d) => void ((d.env as { result: string }).result = "Missing"));
    refused("env_missing", ir, /^IR of pac_env: \[env\] result names struct Missing, which this IR lacks$/);
  });

  test("what is not an IR: a JSON array, an IR without its enums table", () => {
    refused("array", [], /^not a schema IR: a JSON object/);
    refused("no_enums", edited((d) => void delete (d as Partial<Mutable>).enums, true), /^IR of pac_env has no key "enums"$/);
  });

  test("a discovered IR with an unknown type is a ProtocolError naming the rule", () => {
    const ir = edited((d) => void (field(d, "StepResult", "reward").type = "f33"));
    assert.throws(() => schemaFromIrText(JSON.stringify(ir), BigInt(`0x${ir.fingerprint}`), "the server"), (e: unknown) => {
      assert.ok(e instanceof ProtocolError);
      assert.match((e as Error).message, /^the server sent a schema IR that does not load: IR of pac_env: field StepResult\.reward has type "f33"/);
      return true;
    });
  });

  test("what Python loads loads: a result struct without a reward role, overlapping fields", () => {
    const noReward = edited((d) => void delete (field(d, "StepResult", "reward") as { role?: string }).role);
    assert.equal(loadSchema(noReward).name, "pac_env");
    const overlap = edited((d) => void (field(d, "StepResult", "reward").offset = 2541));
    assert.equal(loadSchemaFile(file("overlap", overlap)).fingerprintHex, overlap.fingerprint);
  });

  test("the CLI refuses such a file in one line, exit 2, before it serves", () => {
    const path = file("cli_nested", edited((d) => void (d.structs["StepResult"]!.size += 8)));
    const sock = join(tmpdir(), `transport-ir-json-checks-${process.pid}.sock`);
    const done = spawnSync(process.execPath, [SERVE, `unix://${sock}`, "--env", "contract", "--schema", path], {
      encoding: "utf8",
      timeout: 15_000,
    });
    rmSync(sock, { force: true });
    assert.equal(done.stdout, "");
    assert.equal(done.status, 2, done.stderr);
    const lines = done.stderr.split("\n").filter((l) => l !== "");
    assert.equal(lines.length, 1, done.stderr);
    assert.match(lines[0]!, /^transport-serve(-node)?: error: \S+cli_nested\.json: IR of pac_env: field StepMultiResult\.results \(StepResult\[8\] at offset 0\) ends at byte 20520, outside struct StepMultiResult of 20456 bytes$/);
  });
});
