/**
 * The Node conformance testee (docs/conformance.md, "The testee protocol").
 *
 * Reads u32-LE length-prefixed msgpack requests on stdin and answers each with one frame on
 * stdout, in order, until stdin closes or `{"op": "exit"}`. Every JavaScript number goes out as a
 * msgpack float64 and every bigint as a 64-bit integer, so -0, infinities and NaN survive.
 *
 *   node node_bridge/dist/conformance/testee.js              generated codecs (+ loaded IRs)
 *   node node_bridge/dist/conformance/testee.js --runtime    every schema built by loadSchema
 *
 * `{"op": "view", "buffers": [...], "at": N}` reads each buffer, placed at byte N of a larger one,
 * through the codec's zero-copy view (the getters a client uses), not through `decode`.
 *
 * `{"op": "load", "ir": "<IR JSON text>"}` adds a schema the testee was not built with: its codecs
 * come from `loadSchema` (codec.ts) at run time, the way a user's plain-JavaScript env would.
 *
 * `{"op": "columns", "schema": S, "slots": k, "requests": [...], "results": [...]}` lays k request
 * and k result wire records out in the schema's shm column layout (backends/shm/columns.ts
 * `columnsArea`): the region size, each column's start by "<struct>.<field>" (integers), and the
 * region's bytes from C0(k) to region_size(k).
 */

import { Decoder, Encoder } from "@msgpack/msgpack";
import fc from "fast-check";

import { columnsArea } from "../backends/shm/columns";
import { type AnyStructCodec, type SchemaModule, loadSchema } from "../codec";
import { CodecError, TransportError } from "../errors";
import { computeFingerprint } from "../fingerprint";
import { COLUMNS, type SchemaJson, resolveField } from "../ir";
import { SCHEMAS } from "../generated";
import { structArbitrary } from "./arbitraries";
import { FrameReader, frame } from "./frames";
import { fromWire, toWire } from "./wire";

type Request = Readonly<Record<string, unknown>>;
type Response = Record<string, unknown>;

/** A request the testee cannot serve: answered with `{"ok": false, "error": message}`. */
class BadRequest extends Error {}

const decoder = new Decoder({ useBigInt64: true });
const encoder = new Encoder({ useBigInt64: true, forceIntegerToFloat: true });

function errorOf(error: CodecError): Response {
  return { code: error.code, field: error.field, message: error.message };
}

/** Run `work`; a CodecError becomes the per-item `{"error": E}` result. */
function attempt(work: () => Response): Response {
  try {
    return work();
  } catch (error) {
    if (error instanceof CodecError) return { error: errorOf(error) };
    throw error;
  }
}

/** `record[key]` for an own key only (never an Object.prototype member). */
function own<T>(record: Readonly<Record<string, T>>, key: unknown): T | undefined {
  return typeof key === "string" && Object.prototype.hasOwnProperty.call(record, key)
    ? record[key]
    : undefined;
}

/** `--runtime`: serve every generated schema through `loadSchema(IR)` instead of its module. */
const RUNTIME_ONLY = process.argv.includes("--runtime");

/** The schemas served: the generated ones (or their run-time twins), then every loaded IR. */
const served: Record<string, SchemaModule> = Object.fromEntries(
  Object.entries(SCHEMAS).map(([name, schema]) => [
    name,
    RUNTIME_ONLY ? loadSchema(schema.ir) : schema,
  ]),
);

function schemaOf(request: Request): SchemaModule {
  const name = request["schema"];
  const schema = own(served, name);
  if (schema === undefined) throw new BadRequest(`unknown schema ${String(name)}`);
  return schema;
}

function structOf(request: Request): { schema: SchemaModule; codec: AnyStructCodec } {
  const schema = schemaOf(request);
  const name = request["struct"];
  const codec = own(schema.structs, name);
  if (codec === undefined) throw new BadRequest(`unknown struct ${String(name)} in ${schema.name}`);
  return { schema, codec };
}

function listOf(request: Request, key: string): unknown[] {
  const items = request[key];
  if (!Array.isArray(items)) throw new BadRequest(`${key} must be an array`);
  return items;
}

function buffersOf(request: Request): Uint8Array[] {
  return listOf(request, "buffers").map((item) => {
    if (!(item instanceof Uint8Array)) throw new BadRequest("buffers must be msgpack bin");
    return item;
  });
}

function countOf(value: unknown, what: string): number {
  const number = typeof value === "bigint" ? Number(value) : value;
  if (typeof number !== "number" || !Number.isInteger(number) || number < 0) {
    throw new BadRequest(`${what} must be a non-negative integer`);
  }
  return number;
}

/** fast-check seeds are 32-bit integers; larger seeds are reduced modulo 2^32. */
function seedOf(value: unknown): number {
  if (value === undefined) return 0;
  if (typeof value === "bigint") return Number(BigInt.asIntN(32, value));
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new BadRequest("seed must be an integer");
  }
  return Number(BigInt.asIntN(32, BigInt(value)));
}

/**
 * A zero-copy view's fields read through its getters, in `decode`'s shape: bool-array views
 * are their raw bytes and become booleans, struct fields recurse. What a client reads (the
 * generated `...View` classes, or the run-time ones of `loadSchema`) is checked, not `decode`.
 */
function valuesOfView(ir: SchemaJson, structName: string, view: unknown): Response {
  const struct = ir.structs[structName];
  if (struct === undefined) throw new BadRequest(`unknown struct ${structName} in ${ir.name}`);
  const record = view as Readonly<Record<string, unknown>>;
  const out: Response = {};
  for (const field of struct.fields) {
    const { element, isArray } = resolveField(ir, field);
    const value = record[field.name];
    if (element.kind === "struct") {
      out[field.name] = isArray
        ? (value as unknown[]).map((item) => valuesOfView(ir, element.name, item))
        : valuesOfView(ir, element.name, value);
    } else if (element.kind === "bool" && isArray) {
      out[field.name] = Array.from(value as Uint8Array, (byte) => byte !== 0);
    } else {
      out[field.name] = value;
    }
  }
  return out;
}

/** `buf` copied to byte `at` of a larger buffer: views are read at an offset, as in a slot. */
function placedAt(buf: Uint8Array, at: number): Uint8Array {
  const out = new Uint8Array(at + buf.length);
  out.set(buf, at);
  return out;
}

function handle(request: Request): Response {
  switch (request["op"]) {
    case "hello":
      return { ok: true, lang: "node", schemas: Object.keys(served).sort(), load: true };
    case "load": {
      const text = request["ir"];
      if (typeof text !== "string") throw new BadRequest("ir must be the IR as JSON text");
      let schema: SchemaModule;
      try {
        schema = loadSchema(JSON.parse(text) as SchemaJson);
      } catch (error) {
        if (error instanceof SyntaxError || error instanceof TransportError) {
          throw new BadRequest(`cannot load the IR: ${error.message}`);
        }
        throw error;
      }
      served[schema.name] = schema;
      return { ok: true, schema: schema.name };
    }
    case "fingerprint": {
      const schema = schemaOf(request);
      return {
        ok: true,
        computed: computeFingerprint(schema.ir).hex,
        declared: schema.fingerprintHex,
      };
    }
    case "encode": {
      const { codec } = structOf(request);
      const results = listOf(request, "values").map((value) =>
        attempt(() => ({ bytes: codec.encode(fromWire(value)) })),
      );
      return { ok: true, results };
    }
    case "decode": {
      const { codec } = structOf(request);
      const strict = request["strict"] !== false;
      const results = buffersOf(request).map((buf) =>
        attempt(() => ({ values: toWire(codec.decode(buf, 0, strict)) })),
      );
      return { ok: true, results };
    }
    case "roundtrip": {
      const { codec } = structOf(request);
      const results = buffersOf(request).map((buf) =>
        attempt(() => {
          const values = codec.decode(buf, 0, true);
          return { values: toWire(values), bytes: codec.encode(values) };
        }),
      );
      return { ok: true, results };
    }
    case "view": {
      const { schema, codec } = structOf(request);
      const at = request["at"] === undefined ? 0 : countOf(request["at"], "at");
      const results = buffersOf(request).map((buf) =>
        attempt(() => ({
          values: toWire(valuesOfView(schema.ir, codec.name, codec.view(placedAt(buf, at), at))),
        })),
      );
      return { ok: true, results };
    }
    case "generate": {
      const { schema, codec } = structOf(request);
      const numRuns = countOf(request["count"], "count");
      const seed = seedOf(request["seed"]);
      const samples =
        numRuns === 0 ? [] : fc.sample(structArbitrary(schema.ir, codec.name), { seed, numRuns });
      const results = samples.map((values) => ({
        values: toWire(values),
        bytes: codec.encode(values),
      }));
      return { ok: true, results };
    }
    case "columns": {
      const schema = schemaOf(request);
      if (schema.ir.shm?.layout !== COLUMNS) throw new BadRequest(`schema ${schema.name} has no column shm layout`);
      const slots = countOf(request["slots"], "slots");
      const records = (key: string): Uint8Array[] =>
        listOf(request, key).map((item) => {
          if (!(item instanceof Uint8Array)) throw new BadRequest(`${key} must be msgpack bin`);
          return item;
        });
      let answer: ReturnType<typeof columnsArea>;
      try {
        answer = columnsArea(schema.ir, slots, records("requests"), records("results"));
      } catch (error) {
        if (error instanceof TransportError) throw new BadRequest(error.message);
        throw error;
      }
      // integers on the wire (every other number of this testee goes out as a float64)
      const offsets = Object.fromEntries(Object.entries(answer.offsets).map(([key, at]) => [key, BigInt(at)]));
      return { ok: true, region_size: BigInt(answer.regionSize), offsets, area: answer.area };
    }
    case "exit":
      return { ok: true };
    default:
      throw new BadRequest(`unknown op ${String(request["op"])}`);
  }
}

function respond(body: Uint8Array): boolean {
  return process.stdout.write(frame(body));
}

function serve(body: Buffer): "continue" | "exit" {
  let response: Response;
  let op: unknown;
  try {
    const request = decoder.decode(body);
    if (request === null || typeof request !== "object" || Array.isArray(request)) {
      throw new BadRequest("a request must be a msgpack map");
    }
    op = (request as Request)["op"];
    response = handle(request as Request);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    response = {
      ok: false,
      error: error instanceof BadRequest ? message : `internal error: ${message}`,
    };
  }
  const writable = respond(encoder.encode(response));
  if (op === "exit") return "exit";
  if (!writable) {
    process.stdin.pause();
    process.stdout.once("drain", () => process.stdin.resume());
  }
  return "continue";
}

function main(): void {
  const reader = new FrameReader();
  process.stdin.on("data", (chunk: Buffer) => {
    for (const body of reader.push(chunk)) {
      if (serve(body) === "exit") {
        process.stdin.pause();
        process.stdout.write(new Uint8Array(0), () => process.exit(0));
        return;
      }
    }
  });
  process.stdin.on("end", () => {
    if (reader.pending > 0)
      process.stderr.write(`testee: ${reader.pending} bytes of a partial frame at end of input\n`);
  });
}

main();
