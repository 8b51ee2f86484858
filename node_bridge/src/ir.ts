/**
 * The layout IR in its JSON form (`transport-schema inspect --json`, `SchemaIR.to_json()` in
 * Python), as embedded in every generated module, plus the few helpers that read it.
 */

import { SchemaError } from "./errors";
import { compareCodePoints, jsonString } from "./fingerprint";

export type IntegerType = "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64";
export type FloatType = "f32" | "f64";
export type NumericType = IntegerType | FloatType;
export type ScalarType = NumericType | "bool";

/** Scalar type name -> size in bytes (natural alignment equals the size). */
export const SCALAR_SIZES: Readonly<Record<ScalarType, number>> = {
  u8: 1,
  u16: 2,
  u32: 4,
  u64: 8,
  i8: 1,
  i16: 2,
  i32: 4,
  i64: 8,
  f32: 4,
  f64: 8,
  bool: 1,
};

export interface FieldJson {
  readonly name: string;
  /** As written, normalised: "f32", "f32[612]", "f32[2,5,5]", "StepResult[8]", "Command". */
  readonly type: string;
  readonly offset: number;
  /** Total bytes of the field (element size * count). */
  readonly size: number;
  /** Element count (the product of a multi-dimensional shape); 1 for a non-array field. */
  readonly count: number;
  readonly role?: string;
  /** Dimensions of a multi-dimensional array ("f32[2,5,5]": [2, 5, 5]), row-major. */
  readonly shape?: readonly number[];
  /** Declared bounds (observation and action fields): one text per element or one for all. */
  readonly low?: string | readonly string[];
  readonly high?: string | readonly string[];
  /** A float action field that may carry NaN / inf (else the runtime refuses them). */
  readonly allow_nonfinite?: boolean;
}

/** A field's dimensions: its `shape`, `[count]` for a 1-D array, `[]` for a scalar. */
export function fieldDims(field: FieldJson): readonly number[] {
  if (field.shape !== undefined) return field.shape;
  return field.type.includes("[") ? [field.count] : [];
}

export interface StructJson {
  readonly size: number;
  readonly align: number;
  readonly layout: string;
  readonly fields: readonly FieldJson[];
}

/**
 * The fields whose truth ends an episode: `done` (terminated or truncated) when the struct has
 * one, else `terminated` and `truncated` (whichever it has). Python: `StructIR.episode_end_fields`.
 */
export function episodeEndFields(struct: StructJson | undefined): FieldJson[] {
  const fields = struct?.fields ?? [];
  const done = fields.find((f) => f.role === "done");
  if (done !== undefined) return [done];
  return fields.filter((f) => f.role === "terminated" || f.role === "truncated");
}

/**
 * The shm control block's obs_size / act_size for a result struct (seed 000 Appendix B): the
 * element counts of its observation and action_mask fields (0: none).
 */
export function controlSizes(struct: StructJson | undefined): readonly [number, number] {
  const fields = struct?.fields ?? [];
  return [fields.find((f) => f.role === "observation")?.count ?? 0, fields.find((f) => f.role === "action_mask")?.count ?? 0];
}

export interface EnumJson {
  readonly type: string;
  readonly values: Readonly<Record<string, number>>;
}

export interface MessageJson {
  readonly id: number;
  /** Struct name of the body, or null for an empty body. */
  readonly body: string | null;
  /** A variable-length tail after the body: "msgpack" or "utf8". */
  readonly tail?: string;
  /** The body is one or more bodies back to back (one per env). */
  readonly batch?: boolean;
}

/** The env protocol of a schema (its `[env]` table). Python: `EnvIR`. */
export interface EnvJson {
  /** The STEP_RESP / RESET_RESP body struct. */
  readonly result: string;
  /** The STEP_REQ body struct (its "action" role field). */
  readonly request: string;
  /** The STEP_MULTI_REQ body struct (declared, or derived: the action type [seats]). */
  readonly multi_request: string;
  /** The STEP_MULTI_RESP body struct (declared, or derived: the result [seats]). */
  readonly multi_result: string;
  /** Seats of a STEP_MULTI. */
  readonly seats: number;
  /** Decision-boundary runs: at most this many frames a request (only when declared). */
  readonly max_frames?: number;
  /** The no-progress watchdog: frames == 0 this many requests in a row (only when declared). */
  readonly stall_requests?: number;
}

/**
 * The shared-memory layout of an env schema. Python: `ShmIR`. Region = control struct, then k
 * slot structs, then k final structs; the flat maps give each request / result field's byte
 * offset in a slot and each result field's offset in a final area.
 */
export interface ShmJson {
  /** "derived", or the name of an explicit layout profile schema ("pac_shm"). */
  readonly profile: string;
  /** Struct names in `structs`: ShmControl, ShmSlot, ShmFinal. */
  readonly control: string;
  readonly slot: string;
  readonly final: string;
  readonly request_offsets: Readonly<Record<string, number>>;
  readonly result_offsets: Readonly<Record<string, number>>;
  readonly final_result_offsets: Readonly<Record<string, number>>;
  /**
   * "columns" for the column (struct-of-arrays) layout (`[env] shm = "columns"`: each request /
   * result field of all envs contiguous after the final areas, `shmColumns`); absent: "slots"
   * (the fields in each env's slot), so every slot layout's IR and fingerprint is unchanged.
   */
  readonly layout?: string;
}

/** The reserved `[env] shm` value (IR `shm.layout`) of the column layout. Python: `COLUMNS`. */
export const COLUMNS = "columns";
/** Every column starts at a multiple of this (a cache line). Python: `COLUMN_ALIGN`. */
export const COLUMN_ALIGN = 64;

/** One column of a column-layout region: `field` of `struct` for every env, from `start`. */
export interface ShmColumn {
  readonly part: "request" | "result";
  readonly struct: string;
  readonly field: FieldJson;
  /** Byte offset of env 0's value in the region; env i's is at `start + i * field.size`. */
  readonly start: number;
  /** `"<struct>.<field>"`: the column's name in the conformance answer. */
  readonly key: string;
}

function roundUp(value: number, align: number): number {
  return Math.ceil(value / align) * align;
}

/**
 * The columns of a column-layout region of `slots` slots and its size (without the schema area):
 * after the control block, k slots and k final areas, every request field then every result
 * field in declaration order, each at the previous one's end rounded up to 64 bytes; the size is
 * the last column's end rounded up to 64. Python: `transport.schema.ir.shm_columns`.
 */
export function shmColumns(ir: SchemaJson, slots: number): { readonly columns: readonly ShmColumn[]; readonly size: number } {
  const shm = ir.shm;
  const env = ir.env;
  if (shm === undefined || env === undefined || shm.layout !== COLUMNS) {
    throw new SchemaError(`schema ${ir.name} has no column shm layout`);
  }
  const sizeOf = (name: string): number => {
    const struct = ir.structs[name];
    if (struct === undefined) throw new SchemaError(`schema ${ir.name} has no struct ${name}`);
    return struct.size;
  };
  let at = sizeOf(shm.control) + slots * (sizeOf(shm.slot) + sizeOf(shm.final));
  const columns: ShmColumn[] = [];
  for (const [part, name] of [["request", env.request], ["result", env.result]] as const) {
    sizeOf(name);
    for (const field of (ir.structs[name] as StructJson).fields) {
      at = roundUp(at, COLUMN_ALIGN);
      columns.push({ part, struct: name, field, start: at, key: `${name}.${field.name}` });
      at += slots * field.size;
    }
  }
  return { columns, size: roundUp(at, COLUMN_ALIGN) };
}

export interface SchemaJson {
  readonly name: string;
  readonly version: number;
  readonly fingerprint: string;
  readonly structs: Readonly<Record<string, StructJson>>;
  readonly enums: Readonly<Record<string, EnumJson>>;
  readonly messages: Readonly<Record<string, MessageJson>>;
  /** Present when the schema has an `[env]` table. */
  readonly env?: EnvJson;
  /** Present for env schemas: the shm region's layout. */
  readonly shm?: ShmJson;
  /** The protocol envelope only: per ErrorCode name, its HTTP status and whether it closes. */
  readonly errors?: Readonly<Record<string, ErrorSpecJson>>;
  /** The protocol envelope only: `POST /v1/<method>` -> the request message name. */
  readonly http?: Readonly<Record<string, string>>;
}

/** How one ErrorCode travels (the envelope's `[errors]`). Python: `ErrorSpecIR`. */
export interface ErrorSpecJson {
  readonly http: number;
  readonly closes: boolean;
}

/** What a field's element is, resolved against the schema (mirrors Python's FieldIR.kind). */
export type ElementKind =
  | { readonly kind: "int"; readonly type: IntegerType }
  | { readonly kind: "float"; readonly type: FloatType }
  | { readonly kind: "bool" }
  | {
      readonly kind: "enum";
      readonly name: string;
      readonly type: IntegerType;
      readonly values: readonly number[];
    }
  | { readonly kind: "struct"; readonly name: string };

export interface ResolvedField {
  readonly field: FieldJson;
  readonly element: ElementKind;
  readonly isArray: boolean;
}

export function isScalarType(name: string): name is ScalarType {
  return Object.prototype.hasOwnProperty.call(SCALAR_SIZES, name);
}

/** Resolve a field's type string ("f32[612]", "Meld[4]", "Agent") against its schema. */
export function resolveField(schema: SchemaJson, field: FieldJson): ResolvedField {
  const bracket = field.type.indexOf("[");
  const elem = bracket < 0 ? field.type : field.type.slice(0, bracket);
  const isArray = bracket >= 0;
  let element: ElementKind;
  if (elem === "bool") element = { kind: "bool" };
  else if (elem === "f32" || elem === "f64") element = { kind: "float", type: elem };
  else if (isScalarType(elem)) element = { kind: "int", type: elem as IntegerType };
  else if (Object.prototype.hasOwnProperty.call(schema.enums, elem)) {
    const declared = schema.enums[elem] as EnumJson;
    element = {
      kind: "enum",
      name: elem,
      type: declared.type as IntegerType,
      values: Object.values(declared.values),
    };
  } else element = { kind: "struct", name: elem };
  return { field, element, isArray };
}

// -- loading an IR ---------------------------------------------------------------------------------
//
// One set of rules for every IR read at run time (a .json file, a discovered IR, `loadSchema(ir)`),
// in the same order and words as Python's loader (transport/schema/ir.py `check_ir_json`,
// `check_ir_layout`): first the shape (every key known, every value of its JSON type, every name a
// name, every type resolved), then the fingerprint (codec.ts `loadSchema`), then the layout
// (counts, sizes and extents, enums, message ids, [env] and the shm offset maps). Each refusal is
// one `SchemaError` line naming the IR and the path of what is wrong.

/** Largest count, offset or size (Python: `MAX_NUMBER`). */
export const MAX_NUMBER = 2 ** 31 - 1;
/** Largest struct, 256 MiB (Python: `MAX_STRUCT_SIZE`). */
export const MAX_STRUCT_SIZE = 2 ** 28;
/** Field roles (Python: `ROLES`). */
export const ROLES = ["observation", "action", "action_mask", "reward", "terminated", "truncated", "done", "frames", "events"] as const;
/** The control words of every shm slot (Python: `SLOT_WORDS`). */
export const SLOT_WORDS: readonly (readonly [string, string])[] = [
  ["sem_action_ready", "u32"],
  ["sem_result_ready", "u32"],
  ["command", "SlotCommand"],
  ["status", "u16"],
  ["has_seed", "u8"],
  ["seed", "u64"],
  ["error_len", "u16"],
  ["info_len", "u16"],
  ["checksum", "u32"],
];
/** The u8 text areas of every shm slot (Python: `SLOT_TEXTS`). */
export const SLOT_TEXTS: readonly string[] = ["error_text", "info"];
const INTEGER_TYPES: readonly IntegerType[] = ["u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"];
const INTEGER_RANGES: Readonly<Record<IntegerType, readonly [number, number]>> = {
  u8: [0, 2 ** 8 - 1],
  u16: [0, 2 ** 16 - 1],
  u32: [0, 2 ** 32 - 1],
  u64: [0, 2 ** 64 - 1],
  i8: [-(2 ** 7), 2 ** 7 - 1],
  i16: [-(2 ** 15), 2 ** 15 - 1],
  i32: [-(2 ** 31), 2 ** 31 - 1],
  i64: [-(2 ** 63), 2 ** 63 - 1],
};

const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** A normalised type: `f32`, `f32[612]`, `f32[2,5,5]` (ASCII, no spaces; the compiler's output). */
const TYPE_TEXT = /^([A-Za-z_][A-Za-z0-9_]*)(?:\[([1-9][0-9]{0,9}(?:,[1-9][0-9]{0,9}){0,62})\])?$/;
const HEX16 = /^[0-9a-f]{16}$/;
/** A bound as the compiler writes it: Python's `repr` of an int or a finite float. */
const BOUND_TEXT = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?$/;

type Keys = readonly [readonly string[], readonly string[]];
const TOP: Keys = [["name", "version", "fingerprint", "structs", "enums", "messages"], ["env", "shm", "errors", "http"]];
const STRUCT: Keys = [["size", "align", "layout", "fields"], []];
const FIELD: Keys = [["name", "type", "offset", "size", "count"], ["role", "shape", "low", "high", "allow_nonfinite"]];
const ENUM: Keys = [["type", "values"], []];
const MESSAGE: Keys = [["id", "body"], ["tail", "batch"]];
const ENV: Keys = [["result", "request", "multi_request", "multi_result", "seats"], ["max_frames", "stall_requests"]];
const SHM: Keys = [["profile", "control", "slot", "final", "request_offsets", "result_offsets", "final_result_offsets"], ["layout"]];
const ERROR: Keys = [["http", "closes"], []];
/** The refusal of what is not an IR at all (Python: `NOT_AN_IR`). */
export const NOT_AN_IR = "not a schema IR: a JSON object (transport-schema inspect --json) was expected";

/**
 * A JSON number written with a fraction or an exponent (`32.0`, `1e2`, `NaN`): `parseIrText` keeps
 * it apart from an integer, as Python's `json.loads` does (a float), so `offset: 32.0` is refused
 * as a float in both languages. An IR holds no floats (bounds are text).
 */
export class JsonFloat {
  constructor(readonly value: number) {}
}

type Path = readonly (string | number)[];
type Table = Record<string, unknown>;

const isTable = (value: unknown): value is Table =>
  typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof JsonFloat);
const has = (table: Table, key: string): boolean =>
  Object.prototype.hasOwnProperty.call(table, key) && table[key] !== undefined;
/** A table's keys (with a value), in code point order (Python: `sorted(table)`). */
const keysOf = (table: Table): string[] => Object.keys(table).filter((k) => table[k] !== undefined).sort(compareCodePoints);

/** `structs.StepResult.fields[2].offset`; a key that is not a name is quoted in brackets. */
function where(path: Path): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else if (IDENT.test(part)) out += out === "" ? part : `.${part}`;
    else out += `[${jsonString(part)}]`;
  }
  return out;
}

/** What a JSON value is, in the words of a refusal (Python: `_kind`). */
function kindOf(value: unknown): string {
  if (value === null) return "null";
  if (value === true || value === false) return String(value);
  if (value instanceof JsonFloat) return "a float";
  if (typeof value === "number") return Number.isInteger(value) ? "an integer" : "a float";
  if (typeof value === "string") return "a string";
  if (Array.isArray(value)) return "a list";
  if (typeof value === "object") return "a table";
  return `a ${typeof value}`;
}

const shown = (value: unknown): string => (typeof value === "string" ? jsonString(value) : kindOf(value));

/** The shape rules of a raw IR, before the fingerprint (Python: `_IRShape`). */
class IrShape {
  readonly label: string;

  constructor(data: Table) {
    const name = data["name"];
    this.label = typeof name === "string" && IDENT.test(name) ? `IR of ${name}` : "IR";
  }

  fail(text: string): SchemaError {
    return new SchemaError(`${this.label}: ${text}`);
  }

  table(value: unknown, path: Path, keys: Keys, mayLack: readonly string[] = []): Table {
    if (!isTable(value)) throw this.fail(`${where(path)} is ${kindOf(value)}, not a table`);
    const [required, optional] = keys;
    for (const key of keysOf(value)) {
      if (!required.includes(key) && !optional.includes(key)) {
        const at = path.length > 0 ? where(path) : "the top level";
        throw this.fail(
          `unknown key ${jsonString(key)} at ${at} (an IR written by a newer transport? this one knows ${[...required, ...optional].join(", ")})`,
        );
      }
    }
    for (const key of required) {
      if (!has(value, key) && !mayLack.includes(key)) {
        if (key === "fingerprint" && path.length === 0) throw new SchemaError(`${this.label} names no fingerprint`);
        if (path.length === 0) throw new SchemaError(`${this.label} has no key ${jsonString(key)}`);
        throw this.fail(`${where(path)} has no key ${jsonString(key)}`);
      }
    }
    return value;
  }

  named(value: unknown, path: Path): [string, unknown][] {
    if (!isTable(value)) throw this.fail(`${where(path)} is ${kindOf(value)}, not a table`);
    const keys = keysOf(value);
    for (const key of keys) {
      if (!IDENT.test(key)) {
        throw this.fail(`${where(path)} has a key ${jsonString(key)} that is not a name ([A-Za-z_][A-Za-z0-9_]*)`);
      }
    }
    return keys.map((key) => [key, value[key]]);
  }

  integer(value: unknown, path: Path): void {
    if (typeof value !== "number" || !Number.isInteger(value)) throw this.fail(`${where(path)} is ${kindOf(value)}, not an integer`);
    if (!Number.isSafeInteger(value)) {
      throw this.fail(`${where(path)} is an integer beyond 2**53-1 in magnitude (JavaScript holds integers exactly only up to it)`);
    }
  }

  string(value: unknown, path: Path): asserts value is string {
    if (typeof value !== "string") throw this.fail(`${where(path)} is ${kindOf(value)}, not a string`);
  }

  name(value: unknown, path: Path): void {
    this.string(value, path);
    if (!IDENT.test(value)) throw this.fail(`${where(path)} is ${jsonString(value)}, not a name ([A-Za-z_][A-Za-z0-9_]*)`);
  }

  oneOf(value: unknown, path: Path, choices: readonly string[]): void {
    if (typeof value !== "string" || !choices.includes(value)) {
      throw this.fail(`${where(path)} is ${shown(value)}, not ${choices.join(" or ")}`);
    }
  }

  true(value: unknown, path: Path): void {
    if (value !== true) throw this.fail(`${where(path)} is ${kindOf(value)}, not true (the key is written only when true)`);
  }

  bound(value: unknown, path: Path): void {
    if (Array.isArray(value)) {
      if (value.length === 0) throw this.fail(`${where(path)} is an empty list, not a bound`);
      value.forEach((item, i) => this.boundText(item, [...path, i]));
    } else this.boundText(value, path);
  }

  boundText(value: unknown, path: Path): void {
    if (typeof value !== "string" || !BOUND_TEXT.test(value)) {
      throw this.fail(`${where(path)} is ${shown(value)}, not a number written as text ("-1.0")`);
    }
    if (!Number.isFinite(Number(value))) throw this.fail(`${where(path)} is ${jsonString(value)}, not a finite number`);
  }

  check(data: Table, fingerprint: boolean): void {
    this.table(data, [], TOP, fingerprint ? [] : ["fingerprint"]);
    this.name(data["name"], ["name"]);
    this.integer(data["version"], ["version"]);
    if (has(data, "fingerprint")) {
      const value = data["fingerprint"];
      if (typeof value !== "string" || !HEX16.test(value)) throw this.fail(`fingerprint is ${shown(value)}, not 16 lowercase hex digits`);
    }
    for (const [name, body] of this.named(data["structs"], ["structs"])) this.struct(body, ["structs", name]);
    for (const [name, raw] of this.named(data["enums"], ["enums"])) {
      const path = ["enums", name];
      const body = this.table(raw, path, ENUM);
      this.oneOf(body["type"], [...path, "type"], INTEGER_TYPES);
      for (const [member, value] of this.named(body["values"], [...path, "values"])) this.integer(value, [...path, "values", member]);
    }
    for (const [name, raw] of this.named(data["messages"], ["messages"])) {
      const path = ["messages", name];
      const body = this.table(raw, path, MESSAGE);
      this.integer(body["id"], [...path, "id"]);
      if (body["body"] !== null) this.string(body["body"], [...path, "body"]);
      if (has(body, "tail")) this.oneOf(body["tail"], [...path, "tail"], ["msgpack", "utf8"]);
      if (has(body, "batch")) this.true(body["batch"], [...path, "batch"]);
    }
    if (has(data, "env")) this.env(data["env"]);
    if (has(data, "shm")) this.shm(data["shm"]);
    if (has(data, "errors")) {
      for (const [name, raw] of this.named(data["errors"], ["errors"])) {
        const body = this.table(raw, ["errors", name], ERROR);
        this.integer(body["http"], ["errors", name, "http"]);
        if (typeof body["closes"] !== "boolean") {
          throw this.fail(`${where(["errors", name, "closes"])} is ${kindOf(body["closes"])}, not true or false`);
        }
      }
    }
    if (has(data, "http")) {
      for (const [method, message] of this.named(data["http"], ["http"])) this.name(message, ["http", method]);
    }
    this.types(data);
  }

  struct(raw: unknown, path: Path): void {
    const body = this.table(raw, path, STRUCT);
    this.integer(body["size"], [...path, "size"]);
    this.integer(body["align"], [...path, "align"]);
    this.oneOf(body["layout"], [...path, "layout"], ["packed", "natural"]);
    const fields = body["fields"];
    if (!Array.isArray(fields) || fields.length === 0) {
      const was = Array.isArray(fields) ? "an empty list" : kindOf(fields);
      throw this.fail(`${where([...path, "fields"])} is ${was}, not a list of fields`);
    }
    const names = new Set<string>();
    fields.forEach((rawField, i) => {
      const at = [...path, "fields", i];
      const f = this.table(rawField, at, FIELD);
      this.name(f["name"], [...at, "name"]);
      const name = f["name"] as string;
      if (names.has(name)) throw this.fail(`${where(path)} has two fields named ${name}`);
      names.add(name);
      this.string(f["type"], [...at, "type"]);
      if (!TYPE_TEXT.test(f["type"])) {
        throw this.fail(
          `${where([...at, "type"])} is ${jsonString(f["type"])}, not a type such as "f32", "f32[612]" or "f32[2,5,5]" (ASCII digits, no spaces)`,
        );
      }
      for (const key of ["offset", "size", "count"]) this.integer(f[key], [...at, key]);
      if (has(f, "role")) this.oneOf(f["role"], [...at, "role"], ROLES);
      if (has(f, "shape")) {
        const shape = f["shape"];
        if (!Array.isArray(shape)) throw this.fail(`${where([...at, "shape"])} is ${kindOf(shape)}, not a list`);
        shape.forEach((dim, d) => this.integer(dim, [...at, "shape", d]));
      }
      for (const key of ["low", "high"]) if (has(f, key)) this.bound(f[key], [...at, key]);
      if (has(f, "allow_nonfinite")) this.true(f["allow_nonfinite"], [...at, "allow_nonfinite"]);
    });
  }

  env(raw: unknown): void {
    const body = this.table(raw, ["env"], ENV);
    for (const key of ["result", "request", "multi_request", "multi_result"]) this.name(body[key], ["env", key]);
    for (const key of ["seats", "max_frames", "stall_requests"]) if (has(body, key)) this.integer(body[key], ["env", key]);
  }

  shm(raw: unknown): void {
    const body = this.table(raw, ["shm"], SHM);
    for (const key of ["profile", "control", "slot", "final"]) this.name(body[key], ["shm", key]);
    for (const key of ["request_offsets", "result_offsets", "final_result_offsets"]) {
      for (const [name, offset] of this.named(body[key], ["shm", key])) this.integer(offset, ["shm", key, name]);
    }
    if (has(body, "layout")) this.oneOf(body["layout"], ["shm", "layout"], [COLUMNS]);
  }

  /** Every field's element is a scalar, an enum of the IR or a struct of the IR. */
  types(data: Table): void {
    const structs = data["structs"] as Record<string, StructJson>;
    const enums = data["enums"] as Table;
    for (const name of keysOf(structs)) {
      for (const f of (structs[name] as StructJson).fields) {
        const match = TYPE_TEXT.exec(f.type) as RegExpExecArray;
        const elem = match[1] as string;
        const dims = match[2];
        if (!isScalarType(elem) && !has(enums, elem) && !has(structs, elem)) {
          throw this.fail(`field ${name}.${f.name} has type ${jsonString(f.type)}, not a scalar type, an enum or a struct of this IR`);
        }
        if (has(structs, elem) && !isScalarType(elem) && dims !== undefined && dims.includes(",")) {
          throw this.fail(`field ${name}.${f.name} has type ${jsonString(f.type)}: an array of structs has one dimension`);
        }
      }
    }
  }
}

/**
 * Refuse a raw IR (parsed JSON: `parseIrText`, or an object) whose shape is not an IR's: an
 * unknown key (an IR written by a newer transport), a missing one, a value of the wrong JSON type
 * (an integer must be a JSON integer: not a bool, a float or a string), a name that is not one, a
 * type that is not normalised or does not resolve. `fingerprint`: the IR must name one. Python:
 * `check_ir_json`, the same order and words.
 */
export function checkIrJson(data: unknown, fingerprint = true): asserts data is SchemaJson {
  if (!isTable(data) || !has(data, "structs")) throw new SchemaError(NOT_AN_IR);
  new IrShape(data).check(data, fingerprint);
}

/** A struct's `align`: a power of two up to a page (the compiler's are at most 8). */
const ALIGNS: readonly number[] = Array.from({ length: 13 }, (_, i) => 2 ** i);

function dimsOf(type: string): number[] {
  const bracket = type.indexOf("[");
  return bracket < 0 ? [] : type.slice(bracket + 1, -1).split(",").map(Number);
}

/** A field's element size and natural alignment (a struct's: its size and `align`). */
function elementOf(ir: SchemaJson, type: string): { readonly name: string; readonly size: number; readonly align: number } {
  const name = type.split("[", 1)[0] as string;
  if (isScalarType(name)) return { name, size: SCALAR_SIZES[name], align: SCALAR_SIZES[name] };
  const declared = Object.prototype.hasOwnProperty.call(ir.enums, name) ? ir.enums[name] : undefined;
  if (declared !== undefined) {
    const size = SCALAR_SIZES[declared.type as ScalarType];
    return { name, size, align: size };
  }
  const struct = ir.structs[name] as StructJson;
  return { name, size: struct.size, align: struct.align };
}

/**
 * Refuse an IR whose numbers do not add up (after its fingerprint is checked): a count, shape or
 * size that is not its type's, a field outside its struct, an enum value that does not fit, a
 * message id used twice, an [env] naming a struct the IR lacks, an shm offset map that puts a
 * field outside its slot, over a control word or misaligned. Python: `check_ir_layout`, the same
 * order and words.
 */
export function checkIrLayout(ir: SchemaJson): void {
  const fail = (text: string): SchemaError => new SchemaError(`IR of ${ir.name}: ${text}`);
  const structs = ir.structs as Record<string, StructJson>;
  for (const name of keysOf(structs)) {
    const struct = structs[name] as StructJson;
    if (!(struct.size >= 0 && struct.size <= MAX_STRUCT_SIZE)) throw fail(`struct ${name} has size ${struct.size}, not 0..${MAX_STRUCT_SIZE}`);
    if (!ALIGNS.includes(struct.align)) throw fail(`struct ${name} has align ${struct.align}, not a power of two 1..4096`);
    for (const f of struct.fields) {
      const at = `field ${name}.${f.name}`;
      const dims = dimsOf(f.type);
      const elements = dims.reduce((a, b) => a * b, 1);
      if (elements > MAX_NUMBER) throw fail(`${at}: its type ${f.type} has more than ${MAX_NUMBER} elements`);
      if (f.count !== elements) throw fail(`${at} has count ${f.count}, but its type ${f.type} has ${elements}`);
      const shape = f.shape;
      if (dims.length > 1 && (shape === undefined || shape.length !== dims.length || shape.some((d, i) => d !== dims[i]))) {
        const was = shape === undefined ? "no shape" : `shape [${shape.join(", ")}]`;
        throw fail(`${at} has ${was}, but its type ${f.type} has dims [${dims.join(", ")}]`);
      }
      if (dims.length <= 1 && shape !== undefined) throw fail(`${at} has a shape, but its type ${f.type} has one dimension or none`);
      const element = elementOf(ir, f.type);
      const end = f.offset + element.size * f.count;
      if (f.offset < 0 || end > struct.size) {
        const place = f.offset < 0 ? "starts before byte 0" : `ends at byte ${end}`;
        throw fail(`field ${name}.${f.name} (${f.type} at offset ${f.offset}) ${place}, outside struct ${name} of ${struct.size} bytes`);
      }
    }
  }
  // then what each field says of itself (a second pass: a struct grown or shrunk is named where
  // it no longer fits)
  for (const name of keysOf(structs)) {
    for (const f of (structs[name] as StructJson).fields) {
      const at = `field ${name}.${f.name}`;
      const element = elementOf(ir, f.type);
      if (f.size !== element.size * f.count) {
        throw fail(`${at} has size ${f.size}, but ${f.count} x ${element.name} take ${element.size * f.count} bytes`);
      }
      for (const which of ["low", "high"] as const) {
        const bound = f[which];
        if (Array.isArray(bound) && bound.length !== f.count) {
          throw fail(`${at}: ${which} has ${bound.length} values; the field has ${f.count} elements`);
        }
      }
    }
  }
  for (const name of keysOf(ir.enums as Table)) {
    const declared = ir.enums[name] as EnumJson;
    const [lo, hi] = INTEGER_RANGES[declared.type as IntegerType];
    const seen = new Map<number, string>();
    for (const member of keysOf(declared.values as Table)) {
      const value = declared.values[member] as number;
      if (!(value >= lo && value <= hi)) throw fail(`enum ${name}: value ${member} = ${value} does not fit ${declared.type}`);
      const other = seen.get(value);
      if (other !== undefined) throw fail(`enum ${name}: values ${other} and ${member} are both ${value}`);
      seen.set(value, member);
    }
  }
  const ids = new Map<number, string>();
  for (const name of keysOf(ir.messages as Table)) {
    const id = (ir.messages[name] as MessageJson).id;
    if (!(id >= 0 && id <= 255)) throw fail(`message ${name}: id ${id} is not 0..255 (the u8 msg_type)`);
    const other = ids.get(id);
    if (other !== undefined) throw fail(`message ${name}: id 0x${id.toString(16).padStart(2, "0")} is already used by ${other}`);
    ids.set(id, name);
  }
  if (ir.env !== undefined) checkEnv(ir, ir.env, fail);
  if (ir.shm !== undefined) checkShm(ir, ir.shm, fail);
}

function checkEnv(ir: SchemaJson, env: EnvJson, fail: (text: string) => SchemaError): void {
  for (const role of ["result", "request", "multi_request", "multi_result"] as const) {
    if (!Object.prototype.hasOwnProperty.call(ir.structs, env[role])) throw fail(`[env] ${role} names struct ${env[role]}, which this IR lacks`);
  }
  if (!(env.seats >= 1 && env.seats <= 1024)) throw fail(`[env] seats is ${env.seats}, not 1..1024`);
  for (const key of ["max_frames", "stall_requests"] as const) {
    const value = env[key];
    if (value !== undefined && !(value >= 1 && value < 2 ** 32)) throw fail(`[env] ${key} is ${value}, not 1..2**32-1`);
  }
}

/** The shm section: its structs exist, and every offset map puts each field inside its slot (final
 * area), clear of the control words it has (`SLOT_WORDS`, `SLOT_TEXTS`, `final_seq`), and aligned
 * where both its struct and the slot (final area) are natural (a packed one takes any offset). */
function checkShm(ir: SchemaJson, shm: ShmJson, fail: (text: string) => SchemaError): void {
  const env = ir.env;
  if (env === undefined) throw fail("[shm] needs an [env] section, which this IR lacks");
  for (const role of ["control", "slot", "final"] as const) {
    if (!Object.prototype.hasOwnProperty.call(ir.structs, shm[role])) throw fail(`[shm] ${role} names struct ${shm[role]}, which this IR lacks`);
  }
  const structs = ir.structs as Record<string, StructJson>;
  const slot = structs[shm.slot] as StructJson;
  const final = structs[shm.final] as StructJson;
  const guardedWords = new Set([...SLOT_WORDS.map(([w]) => w), ...SLOT_TEXTS]);
  const request = structs[env.request] as StructJson;
  const result = structs[env.result] as StructJson;
  const inSlots = shm.layout !== COLUMNS;
  const maps = [
    ["request_offsets", shm.request_offsets, request, env.request, slot, shm.slot, inSlots],
    ["result_offsets", shm.result_offsets, result, env.result, slot, shm.slot, inSlots],
    ["final_result_offsets", shm.final_result_offsets, result, env.result, final, shm.final, true],
  ] as const;
  for (const [key, offsets, struct, structName, host, hostName, guarded] of maps) {
    const fields = guarded ? struct.fields : [];
    const names = new Set(fields.map((f) => f.name));
    for (const f of fields) {
      if (!Object.prototype.hasOwnProperty.call(offsets, f.name)) throw fail(`[shm] ${key} has no offset for field ${structName}.${f.name}`);
    }
    for (const name of keysOf(offsets as Table)) {
      if (!names.has(name)) {
        const why = guarded ? `not a field of ${structName}` : "the column layout keeps no field in the slots";
        throw fail(`[shm] ${key} names ${name}: ${why}`);
      }
    }
    const what = host === slot ? "slot" : "final area";
    const words = host === slot ? guardedWords : new Set(["final_seq"]);
    const controls = host.fields.filter((g) => words.has(g.name));
    for (const f of fields) {
      const at = offsets[f.name] as number;
      const ref = `[shm] ${key}.${f.name} is ${at}: ${structName}.${f.name} (${f.size} bytes)`;
      if (at < 0) throw fail(`${ref} would start before ${what} ${hostName} (${host.size} bytes), in the control block or another env's area`);
      if (at + f.size > host.size) {
        throw fail(`${ref} would end at byte ${at + f.size}, past ${what} ${hostName} (${host.size} bytes), in another env's area or past the region`);
      }
      for (const guard of controls) {
        if (at < guard.offset + guard.size && guard.offset < at + f.size) {
          throw fail(`${ref} would overlap the control word ${guard.name} of ${what} ${hostName} (bytes ${guard.offset}..${guard.offset + guard.size - 1})`);
        }
      }
      const element = elementOf(ir, f.type);
      const align = host.layout === "natural" && struct.layout === "natural" ? element.align : 1; // packed: any byte will do
      if (at % align !== 0) {
        throw fail(`${ref} is not at a multiple of ${align}, the alignment of ${element.name} in the natural layouts of ${structName} and ${what} ${hostName}`);
      }
    }
  }
}

/** JSON nested deeper than this is refused ("nested too deeply", as Python's json recursion). */
const MAX_JSON_DEPTH = 900;
const JSON_NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
const JSON_ESCAPES: Readonly<Record<string, string>> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

/**
 * Parse an IR's JSON text as Python's `json.loads` does: the same values as `JSON.parse`, except
 * that a number with a fraction or an exponent (and `NaN`, `Infinity`, `-Infinity`, which Python
 * reads) is a `JsonFloat`, never an integer, so `checkIrJson` refuses `offset: 32.0` as Python
 * does. Bad JSON is a `SchemaError` "not JSON: ..." in Python's words (`Expecting value: line 1
 * column 1 (char 0)`).
 */
export function parseIrText(text: string): unknown {
  let pos = 0;
  const fail = (message: string, at: number): SchemaError => {
    const before = text.slice(0, at);
    const line = before.split("\n").length;
    const column = at - before.lastIndexOf("\n");
    return new SchemaError(`not JSON: ${message}: line ${line} column ${column} (char ${at})`);
  };
  const space = (): void => {
    while (pos < text.length && " \t\n\r".includes(text[pos] as string)) pos++;
  };
  const string = (): string => {
    const start = pos;
    pos++;
    let out = "";
    for (;;) {
      if (pos >= text.length) throw fail("Unterminated string starting at", start);
      const char = text[pos] as string;
      if (char === '"') {
        pos++;
        return out;
      }
      if (char === "\\") {
        const next = text[pos + 1];
        if (next === undefined) throw fail("Unterminated string starting at", start);
        if (next === "u") {
          const hex = text.slice(pos + 2, pos + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) throw fail("Invalid \\uXXXX escape", pos + 1);
          out += String.fromCharCode(parseInt(hex, 16));
          pos += 6;
        } else {
          const escaped = JSON_ESCAPES[next];
          if (escaped === undefined) throw fail("Invalid \\escape", pos);
          out += escaped;
          pos += 2;
        }
      } else if (char.charCodeAt(0) < 0x20) {
        throw fail("Invalid control character at", pos);
      } else {
        out += char;
        pos++;
      }
    }
  };
  const value = (depth: number): unknown => {
    if (depth > MAX_JSON_DEPTH) throw new SchemaError("not JSON: nested too deeply");
    const char = text[pos];
    if (char === '"') return string();
    if (char === "{") {
      pos++;
      const out: Record<string, unknown> = {};
      space();
      if (text[pos] === "}") {
        pos++;
        return out;
      }
      for (;;) {
        if (text[pos] !== '"') throw fail("Expecting property name enclosed in double quotes", pos);
        const key = string();
        space();
        if (text[pos] !== ":") throw fail("Expecting ':' delimiter", pos);
        pos++;
        space();
        // a data property, "__proto__" too (JSON.parse and Python keep it as a key)
        Object.defineProperty(out, key, { value: value(depth + 1), enumerable: true, writable: true, configurable: true });
        space();
        if (text[pos] === "}") {
          pos++;
          return out;
        }
        if (text[pos] !== ",") throw fail("Expecting ',' delimiter", pos);
        pos++;
        space();
      }
    }
    if (char === "[") {
      pos++;
      const out: unknown[] = [];
      space();
      if (text[pos] === "]") {
        pos++;
        return out;
      }
      for (;;) {
        space();
        out.push(value(depth + 1));
        space();
        if (text[pos] === "]") {
          pos++;
          return out;
        }
        if (text[pos] !== ",") throw fail("Expecting ',' delimiter", pos);
        pos++;
      }
    }
    for (const [word, literal] of [["true", true], ["false", false], ["null", null], ["NaN", new JsonFloat(NaN)], ["Infinity", new JsonFloat(Infinity)], ["-Infinity", new JsonFloat(-Infinity)]] as const) {
      if (text.startsWith(word, pos)) {
        pos += word.length;
        return literal;
      }
    }
    JSON_NUMBER.lastIndex = pos;
    const number = JSON_NUMBER.exec(text);
    if (number === null) throw fail("Expecting value", pos);
    pos += number[0].length;
    const parsed = Number(number[0]);
    return number[1] !== undefined || number[2] !== undefined ? new JsonFloat(parsed) : parsed;
  };
  space();
  const out = value(0);
  space();
  if (pos < text.length) throw fail("Extra data", pos);
  return out;
}
