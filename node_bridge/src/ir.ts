/**
 * The layout IR in its JSON form (`transport-schema inspect --json`, `SchemaIR.to_json()` in
 * Python), as embedded in every generated module, plus the few helpers that read it.
 */

import { SchemaError } from "./errors";

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
