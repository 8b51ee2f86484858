/**
 * The layout IR in its JSON form (`transport-schema inspect --json`, `SchemaIR.to_json()` in
 * Python), as embedded in every generated module, plus the few helpers that read it.
 */

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
