/**
 * Schema edges of the contract env and of the client's action check.
 *
 * 1. The contract env promises identical bytes from its Python and its Node twin for any
 *    schema. An 8-byte enum value past 32 bits (an i64 enum with A = 2**32, a u64 enum with
 *    2**53-1, an i64 enum with -(2**53-1)) was written by the Node env as its low 32 bits only:
 *    the Node server failed every reset (`0 is not a value of enum Big`). A Python and a Node
 *    contract server (real processes, `--schema FILE`) now answer the same seeds and actions
 *    with the same result bytes, for enums and integers of every width and signedness.
 * 2. A Box action value beyond the f32 range became -Infinity/Infinity silently on its way
 *    into an f32 action field; the client now refuses it (ActionError naming the value and the
 *    field's range) before any bytes move, and the client stays usable.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { ActionError } from "../errors";
import { type Client, connect } from "../index";
import { BODY_OFFSET } from "../protocol";
import { HAVE_PYTHON, ROOT, ServerProcess } from "../testing/servers";

const DIR = mkdtempSync(join(tmpdir(), "schema-edges-"));
after(() => rmSync(DIR, { recursive: true, force: true }));

/** The Node CLI compiles a `--schema FILE.toml` with transport-schema (the Python package). */
const SCHEMA_CLI = join(ROOT, ".venv", "bin", "transport-schema");
const HAVE_SCHEMA_CLI = existsSync(SCHEMA_CLI) || process.env.TRANSPORT_SCHEMA_CLI !== undefined;
process.env.TRANSPORT_SCHEMA_CLI ??= SCHEMA_CLI; // the servers started here inherit it

const INTS = ["u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"];

/** Enums of every integer type, with the extreme values each allows (64-bit: past 32 bits). */
const ENUMS: Record<string, string> = {
  E_u8: "{ A = 0, B = 255, C = 7 }",
  E_u16: "{ A = 0, B = 65535 }",
  E_u32: "{ A = 0, B = 4294967295, C = 65536 }",
  E_u64: "{ A = 0, B = 9007199254740991, C = 4294967296 }",
  E_i8: "{ A = -128, B = 127, C = -1 }",
  E_i16: "{ NEG = -32768, ZERO = 0, BIG = 32767 }",
  E_i32: "{ A = -2147483648, B = 2147483647, C = -1 }",
  E_i64: "{ LO = -9007199254740991, HI = 9007199254740991, M = -1, BIG = 4294967296, NEG = -4294967297 }",
};

const WIDE = [
  "[schema]",
  'name = "edges64"',
  "[env]",
  ...INTS.flatMap((t) => [`[enums.E_${t}]`, `type = "${t}"`, `values = ${ENUMS[`E_${t}`]}`]),
  "[enums.Big]",
  'type = "i64"',
  "values = { A = 4294967296 }",
  "[structs.StepResult]",
  "fields = [",
  '  { name = "observation", type = "f32[2]", role = "observation" },',
  '  { name = "reward", type = "f64", role = "reward" },',
  '  { name = "done", type = "bool", role = "done" },',
  '  { name = "tag", type = "Big" },',
  ...INTS.map((t) => `  { name = "e_${t}", type = "E_${t}[3]" },`),
  ...INTS.map((t) => `  { name = "v_${t}", type = "${t}[2]" },`),
  "]",
  "[structs.StepRequest]",
  'fields = [{ name = "action", type = "u8", role = "action" }]',
  "",
].join("\n");

const BOX = [
  "[schema]",
  'name = "boxf32"',
  "[env]",
  "[structs.StepResult]",
  "fields = [",
  '  { name = "observation", type = "f32[2]", role = "observation" },',
  '  { name = "reward", type = "f32", role = "reward" },',
  '  { name = "done", type = "bool", role = "done" },',
  "]",
  "[structs.StepRequest]",
  'fields = [{ name = "action", type = "f32[2]", role = "action" }]',
  "",
].join("\n");

function schemaFile(name: string, text: string): string {
  const path = join(DIR, name);
  writeFileSync(path, text);
  return path;
}

function sock(tag: string): string {
  return `unix://${join(tmpdir(), `edges-${tag}-${process.pid}-${randomBytes(3).toString("hex")}.sock`)}`;
}

/** The raw result bytes of the last answer (a unix channel keeps them in its buffer). */
function resultBytes(client: Client): string {
  const channel = client.channel as unknown as { buffer: Buffer; bodyLength: number };
  return Buffer.from(channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength)).toString("hex");
}

/** Every answer's result bytes for a fixed run of seeded resets, steps and plain resets. */
async function trace(lang: "python" | "node", schema: string): Promise<string[]> {
  const server = await ServerProcess.start(lang, sock(lang), "--env", "contract", "--schema", schema, "--num-envs", "2");
  try {
    const client = await connect(server.url, { timeoutMs: 20_000 });
    try {
      const out: string[] = [];
      for (const seed of [12345, 0, 2 ** 40 + 7]) {
        await client.reset(seed);
        out.push(resultBytes(client));
        for (let k = 0; k < 6; k++) {
          const results = (await client.step([2 + (k % 3), 3 + (k % 5)], { copy: true })) as unknown as Array<{ done: number }>;
          out.push(resultBytes(client));
          if (results.some((r) => Boolean(r.done))) {
            await client.reset(); // an ended episode needs one (both servers: the same answer)
            out.push(resultBytes(client));
          }
        }
        await client.reset();
        out.push(resultBytes(client));
      }
      return out;
    } finally {
      await client.close();
    }
  } finally {
    await server.stop("SIGINT");
  }
}

describe("a Python and a Node contract server give identical result bytes", { skip: !(HAVE_PYTHON && HAVE_SCHEMA_CLI) && "no Python" }, () => {
  test("enums and integers of every width and signedness, 64-bit enum values past 32 bits", async () => {
    const schema = schemaFile("edges64.toml", WIDE);
    const python = await trace("python", schema);
    const node = await trace("node", schema);
    assert.equal(node.length, python.length);
    for (let i = 0; i < python.length; i++) assert.equal(node[i], python[i], `answer ${i} differs`);
  });
});

describe("a Box action value beyond the f32 range is refused, not sent as Infinity", { skip: !HAVE_SCHEMA_CLI && "no transport-schema" }, () => {
  let server: ServerProcess;
  let client: Client<unknown, unknown>;
  before(async () => {
    server = await ServerProcess.start("node", sock("box"), "--env", "contract", "--schema", schemaFile("boxf32.toml", BOX));
    client = await connect(server.url, { timeoutMs: 20_000 });
    await client.reset(1);
  });
  after(async () => {
    await client.close();
    await server.stop("SIGINT");
  });

  const RANGE = "-3.4028234663852886e\\+38\\.\\.3\\.4028234663852886e\\+38";
  for (const [what, actions, value] of [
    ["an Array", [-3.5e38, 0], "-3\\.5e\\+38"],
    ["a Float64Array", Float64Array.from([0, 1e39]), "1e\\+39"],
    ["a batch of one", [[0, Number.MAX_VALUE]], "1\\.7976931348623157e\\+308"],
  ] as const) {
    test(`${what}: an ActionError names the value and the field's range`, async () => {
      await assert.rejects(
        client.step(actions as never),
        (error: unknown) => {
          assert.ok(error instanceof ActionError, String(error));
          assert.match(error.message, new RegExp(`${value} is outside ${RANGE}: the f32 action field cannot hold it \\(it would become -?inf\\)`));
          return true;
        },
      );
      // nothing was sent: the client and the server go on
      await client.reset();
      await client.step([2, 0]);
    });
  }

  test("values f32 holds (rounding to its largest) and any Float32Array still go; -Infinity as given", async () => {
    const steps: unknown[] = [
      [3.4028235e38, -3.4028235e38],
      Float32Array.from([3.4e38, -3.4e38]),
      [[2, 1e-50]],
    ];
    for (const actions of steps) {
      await client.reset();
      await client.step(actions as never);
    }
    // an infinite value goes as given: the server's refusal names what the caller sent
    await client.reset();
    await assert.rejects(client.step([2, -Infinity]), /INVALID_ACTION.*action \[2, -Infinity\]/);
  });
});
