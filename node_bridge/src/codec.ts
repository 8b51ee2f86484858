/**
 * The codec runtime that generated modules (`src/generated/*.ts`) call.
 *
 * A generated module describes each struct as a `StructLayout`: four straight-line functions
 * with the IR's offsets written in (validate values, write, strict-check bytes, read) plus a
 * zero-copy view. `defineStruct` turns a layout into the public `StructCodec`. Everything that
 * is the same for every schema lives here: value checks with their error codes and field paths,
 * NaN canonicalisation, array copies, room checks.
 *
 * Semantics (docs/conformance.md, identical to transport/codec.py): little-endian; padding is
 * written as 0; every NaN is written as the canonical quiet NaN (0x7FC00000 / 0x7FF8000000000000);
 * a finite number beyond the f32 maximum is `out_of_range`; integer fields take integral numbers
 * or bigints; u64/i64 decode to bigint; strict decoding rejects bool bytes other than 0/1,
 * undeclared enum values and non-canonical NaNs. Errors carry the path of the first invalid
 * element in byte-offset order (which is depth-first declaration order).
 */

import {
  ArrayLengthError,
  BufferSizeError,
  CodecError,
  SchemaError,
  InvalidBoolError,
  InvalidEnumError,
  MissingFieldError,
  NonCanonicalError,
  UnknownFieldError,
  ValueRangeError,
  ValueTypeError,
} from "./errors";
import { computeFingerprint } from "./fingerprint";
import {
  type FloatType,
  type IntegerType,
  type MessageJson,
  type NumericType,
  type SchemaJson,
  type StructJson,
  checkIrJson,
  checkIrLayout,
  fieldDims,
  resolveField,
} from "./ir";

// -- public types --------------------------------------------------------------------------------

/** Encoder, decoder and zero-copy view of one struct. */
export interface StructCodec<T, TInput = T, TView = unknown> {
  readonly name: string;
  /** Encoded size in bytes. */
  readonly size: number;
  /** Validate `value` and encode it into a new buffer of exactly `size` bytes. */
  encode(value: TInput): Uint8Array;
  /** Validate `value`, then write its canonical bytes at `buf[offset, offset + size)`. */
  encodeInto(value: TInput, buf: Uint8Array, offset?: number): void;
  /**
   * The fast path for values already known to be well-formed (a server's own env output): zero
   * the padding of `buf[offset, offset + size)` and write every field of `value` without
   * validating it. A value of the wrong shape writes wrong bytes (a short array may leave earlier
   * bytes in place) or throws a TypeError, never a `CodecError`. Like `encodeInto`, it
   * allocates nothing when called again with the same buffer.
   */
  writeInto(value: TInput, buf: Uint8Array, offset?: number): void;
  /** Decode owned values (typed arrays are copies). `strict` (default true) checks the bytes. */
  decode(buf: Uint8Array, offset?: number, strict?: boolean): T;
  /**
   * A zero-copy view: scalar getters read the buffer through a DataView on every access, numeric
   * array getters return typed arrays over the buffer itself when the absolute byte offset is
   * aligned for the element type (and the host is little-endian), otherwise a copy.
   */
  view(buf: Uint8Array, offset?: number): TView;
  /** Throw the `CodecError` that `encode` would throw for `value`, if any. */
  validate(value: unknown): void;
  /** Throw the `CodecError` that strict `decode` would throw for these bytes, if any. */
  check(buf: Uint8Array, offset?: number): void;
}

/** A struct codec whose value types are not known statically (dynamic use, the testee). */
export type AnyStructCodec = StructCodec<unknown, unknown, unknown>;

/** Everything a generated module knows about its schema, for dynamic use. */
export interface SchemaModule {
  readonly name: string;
  readonly version: number;
  /** The fingerprint stored in the generated module (see fingerprint.ts to recompute it). */
  readonly fingerprint: bigint;
  readonly fingerprintHex: string;
  /** The layout IR, the same JSON as Python's `SchemaIR.to_json()`. */
  readonly ir: SchemaJson;
  readonly structs: Readonly<Record<string, AnyStructCodec>>;
  readonly messages: Readonly<Record<string, MessageJson>>;
}

/** What a generated module writes for each struct; `defineStruct` makes it a `StructCodec`. */
export interface StructLayout<T, TInput, TView> {
  readonly name: string;
  readonly size: number;
  /** Check plain values; `path` is the field-path prefix ("" or "results[2]."). */
  validateAt(value: unknown, path: string): void;
  /** Write already validated values at `at`, every byte of every field (padding is zeroed first). */
  writeAt(dv: DataView, at: number, value: TInput): void;
  /** Strict checks of encoded bytes, in byte-offset order. */
  checkAt(dv: DataView, at: number, path: string): void;
  readAt(dv: DataView, at: number): T;
  viewAt(dv: DataView, at: number): TView;
}

export function defineStruct<T, TInput, TView>(
  layout: StructLayout<T, TInput, TView>,
): StructCodec<T, TInput, TView> {
  const { name, size } = layout;
  const attach = (error: unknown): unknown =>
    error instanceof CodecError ? error.withStruct(name) : error;
  // The DataView of the last buffer written: encoding into the same buffer again (a server's
  // response buffer) allocates nothing.
  let lastBuf: Uint8Array | null = null;
  let lastView: DataView | null = null;
  const viewOf = (buf: Uint8Array): DataView => {
    if (buf !== lastBuf || lastView === null) {
      lastBuf = buf;
      lastView = dataViewOf(buf);
    }
    return lastView;
  };
  // The byte ranges no field writes ([start, end) pairs), known once `defineSchema` has seen the
  // IR; until then (a layout outside any schema) every byte is zeroed before the fields are
  // written. `writeAt` writes every byte of every field, so zeroing the padding alone gives the
  // same bytes: a packed layout (no padding) zeroes nothing.
  let padding: readonly number[] | null = null;
  const zeroPadding = (buf: Uint8Array, offset: number): void => {
    if (padding === null) {
      buf.fill(0, offset, offset + size);
      return;
    }
    for (let k = 0; k < padding.length; k += 2) {
      buf.fill(0, offset + (padding[k] as number), offset + (padding[k + 1] as number));
    }
  };
  const codec: StructCodec<T, TInput, TView> = {
    name,
    size,
    encode(value: TInput): Uint8Array {
      const buf = new Uint8Array(size);
      this.encodeInto(value, buf, 0);
      return buf;
    },
    encodeInto(value: TInput, buf: Uint8Array, offset = 0): void {
      try {
        requireRoom(buf, offset, size);
        layout.validateAt(value, "");
      } catch (error) {
        throw attach(error);
      }
      zeroPadding(buf, offset);
      layout.writeAt(viewOf(buf), offset, value);
    },
    writeInto(value: TInput, buf: Uint8Array, offset = 0): void {
      try {
        requireRoom(buf, offset, size);
      } catch (error) {
        throw attach(error);
      }
      zeroPadding(buf, offset);
      layout.writeAt(viewOf(buf), offset, value);
    },
    decode(buf: Uint8Array, offset = 0, strict = true): T {
      const dv = dataViewOf(buf);
      try {
        requireRoom(buf, offset, size);
        if (strict) layout.checkAt(dv, offset, "");
      } catch (error) {
        throw attach(error);
      }
      return layout.readAt(dv, offset);
    },
    view(buf: Uint8Array, offset = 0): TView {
      try {
        requireRoom(buf, offset, size);
      } catch (error) {
        throw attach(error);
      }
      return layout.viewAt(dataViewOf(buf), offset);
    },
    validate(value: unknown): void {
      try {
        layout.validateAt(value, "");
      } catch (error) {
        throw attach(error);
      }
    },
    check(buf: Uint8Array, offset = 0): void {
      try {
        requireRoom(buf, offset, size);
        layout.checkAt(dataViewOf(buf), offset, "");
      } catch (error) {
        throw attach(error);
      }
    },
  };
  PADDING_SETTERS.set(codec, (ranges) => {
    padding ??= ranges; // the codec's own module defines its schema first
  });
  return codec;
}

/** Per codec made by `defineStruct`: tells it its padding ranges (see `paddingRanges`). */
const PADDING_SETTERS = new WeakMap<object, (ranges: readonly number[]) => void>();

/**
 * The byte ranges of struct `name` that no leaf field covers, nested structs included, as flat
 * [start, end) pairs in offset order; null when the IR does not add up (a missing struct, a field
 * outside the struct, nesting deeper than any real schema), so the caller zeroes everything.
 */
export function paddingRanges(ir: SchemaJson, name: string): number[] | null {
  const top = ir.structs[name];
  if (top === undefined) return null;
  const covered = new Uint8Array(top.size);
  const mark = (struct: StructJson, base: number, depth: number): boolean => {
    if (depth > 64) return false;
    for (const field of struct.fields) {
      const start = base + field.offset;
      if (field.offset < 0 || field.size < 0 || field.offset + field.size > struct.size) return false;
      const { element } = resolveField(ir, field);
      if (element.kind !== "struct") {
        covered.fill(1, start, start + field.size);
        continue;
      }
      const sub = ir.structs[element.name];
      if (sub === undefined || sub.size * field.count !== field.size) return false;
      for (let i = 0; i < field.count; i++) {
        if (!mark(sub, start + i * sub.size, depth + 1)) return false;
      }
    }
    return true;
  };
  if (!mark(top, 0, 0)) return null;
  const ranges: number[] = [];
  for (let i = 0; i < covered.length; i++) {
    if (covered[i] !== 0) continue;
    const start = i;
    while (i < covered.length && covered[i] === 0) i++;
    ranges.push(start, i);
  }
  return ranges;
}

export function defineSchema(
  ir: SchemaJson,
  fingerprint: bigint,
  structs: Readonly<Record<string, AnyStructCodec>>,
): SchemaModule {
  for (const [name, codec] of Object.entries(structs)) {
    const setPadding = PADDING_SETTERS.get(codec);
    const struct = ir.structs[name];
    if (setPadding === undefined || struct === undefined) continue;
    if (codec.name !== name || struct.size !== codec.size) continue;
    const ranges = paddingRanges(ir, name);
    if (ranges !== null) setPadding(ranges);
  }
  return {
    name: ir.name,
    version: ir.version,
    fingerprint,
    fingerprintHex: ir.fingerprint,
    ir,
    structs,
    messages: ir.messages,
  };
}

// -- buffers -------------------------------------------------------------------------------------

/** True on little-endian hosts, where typed arrays over wire bytes read them correctly. */
export const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export function dataViewOf(buf: Uint8Array): DataView {
  return new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
}

function requireRoom(buf: Uint8Array, offset: number, size: number): void {
  if (!Number.isInteger(offset) || offset < 0 || buf.byteLength - offset < size) {
    throw new BufferSizeError(
      `needs ${size} bytes at offset ${offset}, buffer has ${buf.byteLength}`,
    );
  }
}

// -- sets the generated modules build once ------------------------------------------------------

/** The field names of a struct, for `rejectUnknownFields`. */
export function nameSet(names: readonly string[]): ReadonlySet<string> {
  return new Set(names);
}

/** The declared values of an enum object (`{ NONE: -1, CHI: 0 } as const`). */
export function enumValueSet(values: Readonly<Record<string, number>>): ReadonlySet<number> {
  return new Set(Object.values(values));
}

// -- paths and value kinds -----------------------------------------------------------------------

/** `prefix + name`, with `[index]` when index >= 0: "results[2].observation[5]". */
function pathOf(prefix: string, name: string, index: number): string {
  return index < 0 ? prefix + name : `${prefix}${name}[${index}]`;
}

/** A value as a refusal names it, in JSON's spelling (Python: `describe`, the same words). */
function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "bigint") return value.toString();
  if (value === null || typeof value !== "object") return String(value);
  if (Array.isArray(value)) return "an array";
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) return "an object";
  return `a ${value.constructor?.name ?? "object"}`;
}

function isArrayValue(value: unknown): value is ArrayLike<unknown> {
  return Array.isArray(value) || (ArrayBuffer.isView(value) && !(value instanceof DataView));
}

// The last value `asFields` accepted whose prototype is Object.prototype (or null): own data
// of such an object is all a field name can read, except the names Object.prototype itself has.
let plainFields: object | null = null;

/** A struct value must be a plain mapping (not an array, not a typed array). */
export function asFields(value: unknown, path: string): Readonly<Record<string, unknown>> {
  if (value === null || typeof value !== "object" || isArrayValue(value)) {
    const where = path.endsWith(".") ? path.slice(0, -1) : path;
    throw new ValueTypeError(`expected a mapping of field values, not ${describe(value)}`, where);
  }
  const proto: unknown = Object.getPrototypeOf(value);
  plainFields = proto === Object.prototype || proto === null ? value : null;
  return value as Readonly<Record<string, unknown>>;
}


/** The value of one field; `missing_field` when absent (or undefined). */
export function fieldValue(
  fields: Readonly<Record<string, unknown>>,
  name: string,
  path: string,
): unknown {
  // fast path: one property read, no own-property lookup, for the plain object being validated:
  // what it inherits from Object.prototype is a function ("constructor", "toString", ...) or
  // Object.prototype itself ("__proto__"), never a field value, so any other value is its own
  const value = fields[name];
  if (
    value !== undefined &&
    fields === plainFields &&
    typeof value !== "function" &&
    value !== Object.prototype
  ) {
    return value;
  }
  return ownFieldValue(fields, name, path);
}

function ownFieldValue(fields: Readonly<Record<string, unknown>>, name: string, path: string): unknown {
  const value = Object.prototype.hasOwnProperty.call(fields, name) ? fields[name] : undefined;
  if (value === undefined) throw new MissingFieldError("no value given", path + name);
  return value;
}

/** After every field checked out: `unknown_field` for the first extra name in sorted order. */
export function rejectUnknownFields(
  fields: Readonly<Record<string, unknown>>,
  known: ReadonlySet<string>,
  path: string,
): void {
  let count = 0; // counted without allocating (Object.keys would, on every encode)
  for (const name in fields) if (Object.prototype.hasOwnProperty.call(fields, name)) count++;
  if (count === known.size) return; // every known field is present, so no extras
  const extra = Object.keys(fields).filter((name) => !known.has(name)).sort();
  if (extra.length > 0) {
    throw new UnknownFieldError(`not a field of this struct: ${extra.join(", ")}`, path + extra[0]);
  }
}

/** An array value of exactly `count` elements (`wrong_type` / `array_length` otherwise). */
export function checkArray(
  value: unknown,
  count: number,
  path: string,
  name: string,
): ArrayLike<unknown> {
  if (!isArrayValue(value)) {
    throw new ValueTypeError(`expected an array of ${count}, not ${describe(value)}`, path + name);
  }
  if (value.length !== count) {
    throw new ArrayLengthError(`expected ${count} elements, got ${value.length}`, path + name);
  }
  return value;
}

/** Nested arrays of a multi-dimensional field, row-major (`[[1, 2], [3, 4]]` for a [2,2]). */
export type NestedArray<T> = ArrayLike<T> | ArrayLike<NestedArray<T>>;

/**
 * A multi-dimensional array field's value as its flat row-major elements: nested arrays of
 * exactly `shape` are flattened (a new array); anything else (a flat array or typed array of
 * `count` elements, or a wrong value for `checkArray` to refuse) is returned as it is, so a flat
 * typed array costs nothing. Python accepts the same two forms.
 */
export function flatArray<T>(
  value: NestedArray<T> | unknown,
  shape: readonly number[],
  path: string,
  name: string,
): ArrayLike<T> {
  if (!Array.isArray(value) || value.length !== shape[0] || !isArrayValue(value[0])) {
    return value as ArrayLike<T>;
  }
  const out: T[] = [];
  const walk = (item: unknown, depth: number): void => {
    if (depth === shape.length) {
      out.push(item as T);
      return;
    }
    if (!isArrayValue(item) || item.length !== shape[depth]) {
      throw new ArrayLengthError(
        `expected an array of shape [${shape.join(", ")}] (or its elements, row-major)`,
        path + name,
      );
    }
    for (let i = 0; i < item.length; i++) walk(item[i], depth + 1);
  };
  walk(value, 0);
  return out;
}

// -- scalar value checks -------------------------------------------------------------------------

/** The largest finite f32, as a double. */
export const F32_MAX = 3.4028234663852886e38;

/** Each integer type's range (inclusive), as bigints. */
export const INTEGER_RANGES: Readonly<Record<IntegerType, readonly [bigint, bigint]>> = {
  u8: [0n, 0xffn],
  u16: [0n, 0xffffn],
  u32: [0n, 0xffffffffn],
  u64: [0n, 0xffffffffffffffffn],
  i8: [-0x80n, 0x7fn],
  i16: [-0x8000n, 0x7fffn],
  i32: [-0x80000000n, 0x7fffffffn],
  i64: [-0x8000000000000000n, 0x7fffffffffffffffn],
};

/** The same ranges as numbers, exact for every type narrower than 64 bits. */
const NUMBER_RANGES: Readonly<Record<IntegerType, readonly [number, number]>> = {
  u8: [0, 0xff],
  u16: [0, 0xffff],
  u32: [0, 0xffffffff],
  u64: [0, 2 ** 64],
  i8: [-0x80, 0x7f],
  i16: [-0x8000, 0x7fff],
  i32: [-0x80000000, 0x7fffffff],
  i64: [-(2 ** 63), 2 ** 63],
};

function integerOf(value: unknown, path: string, name: string, index: number): number | bigint {
  if ((typeof value === "number" && Number.isInteger(value)) || typeof value === "bigint") {
    return value;
  }
  throw new ValueTypeError(
    `expected an integer, not ${describe(value)}`,
    pathOf(path, name, index),
  );
}

/** Whether a number fits an integer type narrower than 64 bits (false for u64 / i64). */
function numberFits(value: number, type: IntegerType): boolean {
  switch (type) {
    case "u8":
      return value >= 0 && value <= 0xff;
    case "u16":
      return value >= 0 && value <= 0xffff;
    case "u32":
      return value >= 0 && value <= 0xffffffff;
    case "i8":
      return value >= -0x80 && value <= 0x7f;
    case "i16":
      return value >= -0x8000 && value <= 0x7fff;
    case "i32":
      return value >= -0x80000000 && value <= 0x7fffffff;
    default:
      return false;
  }
}

export function checkInteger(
  value: unknown,
  type: IntegerType,
  path: string,
  name: string,
  index = -1,
): void {
  // the common case first, without the tables: an integral number in range
  if (typeof value === "number" && numberFits(value, type) && Number.isInteger(value)) return;
  const number = integerOf(value, path, name, index);
  let inRange: boolean;
  if (typeof number === "number" && type !== "u64" && type !== "i64") {
    const [lo, hi] = NUMBER_RANGES[type];
    inRange = number >= lo && number <= hi;
  } else {
    const [lo, hi] = INTEGER_RANGES[type];
    const big = BigInt(number);
    inRange = big >= lo && big <= hi;
  }
  if (!inRange) {
    throw new ValueRangeError(`${number} does not fit ${type}`, pathOf(path, name, index));
  }
}

/**
 * An integer field whose role is a flag (done, terminated, truncated, action_mask: Python's
 * `FLAG_ROLES`) also takes `true` / `false`, stored as 1 / 0.
 */
export function checkFlag(value: unknown, type: IntegerType, path: string, name: string, index = -1): void {
  if (typeof value !== "boolean") checkInteger(value, type, path, name, index);
}

export function checkFlagArray(value: unknown, type: IntegerType, count: number, path: string, name: string): void {
  const items = checkArray(value, count, path, name);
  if (items instanceof TYPED_ARRAYS[type]) return; // the element type guarantees the range
  for (let i = 0; i < count; i++) checkFlag(items[i], type, path, name, i);
}

/** The roles whose integer fields hold flags (`checkFlag`). */
export const FLAG_ROLES: ReadonlySet<string> = new Set(["done", "terminated", "truncated", "action_mask"]);

export function checkFloat(
  value: unknown,
  type: FloatType,
  path: string,
  name: string,
  index = -1,
): void {
  let number: number;
  if (typeof value === "number") number = value;
  else if (typeof value === "bigint") number = Number(value);
  else {
    throw new ValueTypeError(
      `expected a number, not ${describe(value)}`,
      pathOf(path, name, index),
    );
  }
  const overflows = typeof value === "bigint" ? !Number.isFinite(number) : false;
  if (type === "f32" && (overflows || (Number.isFinite(number) && Math.abs(number) > F32_MAX))) {
    throw new ValueRangeError(`${describe(value)} does not fit f32`, pathOf(path, name, index));
  }
}

export function checkBool(value: unknown, path: string, name: string, index = -1): void {
  if (typeof value !== "boolean") {
    throw new ValueTypeError(`expected a bool, not ${describe(value)}`, pathOf(path, name, index));
  }
}

export function checkEnum(
  value: unknown,
  declared: ReadonlySet<number>,
  enumName: string,
  path: string,
  name: string,
  index = -1,
): void {
  const number = integerOf(value, path, name, index);
  if (!declared.has(Number(number))) {
    throw new InvalidEnumError(
      `${describe(value)} is not a value of enum ${enumName}`,
      pathOf(path, name, index),
    );
  }
}

// -- array value checks --------------------------------------------------------------------------

interface NumericArrays {
  u8: Uint8Array;
  u16: Uint16Array;
  u32: Uint32Array;
  u64: BigUint64Array;
  i8: Int8Array;
  i16: Int16Array;
  i32: Int32Array;
  i64: BigInt64Array;
  f32: Float32Array;
  f64: Float64Array;
}

type TypedArrayOf<K extends NumericType> = NumericArrays[K];

interface TypedArrayConstructorOf<K extends NumericType> {
  new (length: number): TypedArrayOf<K>;
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): TypedArrayOf<K>;
  readonly BYTES_PER_ELEMENT: number;
}

const TYPED_ARRAYS: { readonly [K in NumericType]: TypedArrayConstructorOf<K> } = {
  u8: Uint8Array,
  u16: Uint16Array,
  u32: Uint32Array,
  u64: BigUint64Array,
  i8: Int8Array,
  i16: Int16Array,
  i32: Int32Array,
  i64: BigInt64Array,
  f32: Float32Array,
  f64: Float64Array,
};

export function checkIntegerArray(
  value: unknown,
  type: IntegerType,
  count: number,
  path: string,
  name: string,
): void {
  const items = checkArray(value, count, path, name);
  if (items instanceof TYPED_ARRAYS[type]) return; // the element type guarantees the range
  for (let i = 0; i < count; i++) checkInteger(items[i], type, path, name, i);
}

export function checkFloatArray(
  value: unknown,
  type: FloatType,
  count: number,
  path: string,
  name: string,
): void {
  const items = checkArray(value, count, path, name);
  if (items instanceof Float32Array || (type === "f64" && items instanceof Float64Array)) return;
  for (let i = 0; i < count; i++) checkFloat(items[i], type, path, name, i);
}

export function checkBoolArray(value: unknown, count: number, path: string, name: string): void {
  const items = checkArray(value, count, path, name);
  for (let i = 0; i < count; i++) checkBool(items[i], path, name, i);
}

export function checkEnumArray(
  value: unknown,
  declared: ReadonlySet<number>,
  enumName: string,
  count: number,
  path: string,
  name: string,
): void {
  const items = checkArray(value, count, path, name);
  for (let i = 0; i < count; i++) checkEnum(items[i], declared, enumName, path, name, i);
}

export function checkStructArray(
  layout: StructLayout<unknown, unknown, unknown>,
  value: unknown,
  count: number,
  path: string,
  name: string,
): void {
  const items = checkArray(value, count, path, name);
  for (let i = 0; i < count; i++) layout.validateAt(items[i], `${path}${name}[${i}].`);
}

// -- writing -------------------------------------------------------------------------------------

/** An integer field's value as a number (values are validated before they are written). */
export function toNumber(value: number | bigint | boolean): number {
  return typeof value === "number" ? value : Number(value); // a flag's boolean is 1 or 0
}

export function toBigInt(value: number | bigint | boolean): bigint {
  return typeof value === "bigint" ? value : BigInt(value);
}

const F32_CANONICAL_NAN = 0x7fc00000;
const F64_CANONICAL_NAN_HIGH = 0x7ff80000;

/** Write an f32, rounding to nearest even; NaN becomes the canonical quiet NaN. */
export function setF32(dv: DataView, at: number, value: number | bigint): void {
  const number = toNumber(value);
  if (Number.isNaN(number)) dv.setUint32(at, F32_CANONICAL_NAN, true);
  else dv.setFloat32(at, number, true);
}

/** Write an f64; NaN becomes the canonical quiet NaN. */
export function setF64(dv: DataView, at: number, value: number | bigint): void {
  const number = toNumber(value);
  if (Number.isNaN(number)) {
    dv.setUint32(at, 0, true);
    dv.setUint32(at + 4, F64_CANONICAL_NAN_HIGH, true);
  } else dv.setFloat64(at, number, true);
}

type ElementWriter = (dv: DataView, at: number, value: number | bigint) => void;

const ELEMENT_WRITERS: Readonly<Record<NumericType, ElementWriter>> = {
  u8: (dv, at, v) => dv.setUint8(at, toNumber(v)),
  u16: (dv, at, v) => dv.setUint16(at, toNumber(v), true),
  u32: (dv, at, v) => dv.setUint32(at, toNumber(v), true),
  u64: (dv, at, v) => dv.setBigUint64(at, toBigInt(v), true),
  i8: (dv, at, v) => dv.setInt8(at, toNumber(v)),
  i16: (dv, at, v) => dv.setInt16(at, toNumber(v), true),
  i32: (dv, at, v) => dv.setInt32(at, toNumber(v), true),
  i64: (dv, at, v) => dv.setBigInt64(at, toBigInt(v), true),
  f32: setF32,
  f64: setF64,
};

// Byte views of source arrays, built once each: an env that returns the same typed arrays every
// step (mutated in place) is copied into the response buffer with no allocation. Weak keys: the
// views go away with their arrays. (A per-field cache would miss on every call: N envs hand the
// same field N different arrays.) A Uint8Array source needs no view at all.
const SOURCE_BYTES = new WeakMap<ArrayBufferView, Uint8Array>();

function bytesOfSource(source: ArrayBufferView): Uint8Array {
  if (source instanceof Uint8Array) return source;
  let bytes = SOURCE_BYTES.get(source);
  if (bytes === undefined) {
    bytes = new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
    SOURCE_BYTES.set(source, bytes);
  }
  return bytes;
}

// Byte views of target DataViews, the last one in front (a codec hands the same DataView for the
// same buffer, so it covers a response buffer written record after record).
let lastTarget: DataView | null = null;
let lastTargetBytes: Uint8Array | null = null;

const TARGET_BYTES = new WeakMap<DataView, Uint8Array>();

function bytesOfTarget(dv: DataView): Uint8Array {
  if (dv === lastTarget && lastTargetBytes !== null) return lastTargetBytes;
  let bytes = TARGET_BYTES.get(dv);
  if (bytes === undefined) {
    bytes = new Uint8Array(dv.buffer, dv.byteOffset, dv.byteLength);
    TARGET_BYTES.set(dv, bytes);
  }
  lastTarget = dv;
  lastTargetBytes = bytes;
  return bytes;
}

/** Copy the first `length` bytes of `source` to `dv` at `at`. */
function copyBytes(dv: DataView, at: number, source: ArrayBufferView, length: number): void {
  const bytes = bytesOfSource(source);
  bytesOfTarget(dv).set(bytes.byteLength === length ? bytes : bytes.subarray(0, length), at);
}

/**
 * Whether any of `count` elements may be NaN: their sum is NaN when one is (NaN propagates
 * through every addition); +inf and -inf together also give NaN, a false alarm the caller's
 * exact pass settles. Four independent sums (no branch per element) in one monomorphic loop per
 * element type, apart from writeArray's many shapes: the cheapest scan V8 compiles.
 */
function mayHaveNaN32(values: Float32Array, count: number): boolean {
  let s0 = 0;
  let s1 = 0;
  let s2 = 0;
  let s3 = 0;
  let i = 0;
  for (; i + 3 < count; i += 4) {
    s0 += values[i] as number;
    s1 += values[i + 1] as number;
    s2 += values[i + 2] as number;
    s3 += values[i + 3] as number;
  }
  for (; i < count; i++) s0 += values[i] as number;
  const sum = s0 + s1 + s2 + s3;
  return sum !== sum;
}

function mayHaveNaN64(values: Float64Array, count: number): boolean {
  let s0 = 0;
  let s1 = 0;
  let s2 = 0;
  let s3 = 0;
  let i = 0;
  for (; i + 3 < count; i += 4) {
    s0 += values[i] as number;
    s1 += values[i + 1] as number;
    s2 += values[i + 2] as number;
    s3 += values[i + 3] as number;
  }
  for (; i < count; i++) s0 += values[i] as number;
  const sum = s0 + s1 + s2 + s3;
  return sum !== sum;
}

/** Write `count` validated numbers; a typed array of the field's own type is copied in bulk. */
export function writeArray(
  dv: DataView,
  at: number,
  type: NumericType,
  values: ArrayLike<number | bigint | boolean>,
  count: number,
): void {
  if (LITTLE_ENDIAN_HOST) {
    // a NaN is written as the canonical one (its payload is not kept): copied, then rewritten
    if (type === "f32") {
      if (values instanceof Float32Array) {
        copyBytes(dv, at, values, count * 4);
        if (mayHaveNaN32(values, count)) {
          for (let i = 0; i < count; i++) {
            const v = values[i] as number;
            if (v !== v) dv.setUint32(at + i * 4, F32_CANONICAL_NAN, true);
          }
        }
        return;
      }
    } else if (type === "f64") {
      if (values instanceof Float64Array) {
        copyBytes(dv, at, values, count * 8);
        if (mayHaveNaN64(values, count)) {
          for (let i = 0; i < count; i++) {
            const v = values[i] as number;
            if (v !== v) setF64(dv, at + i * 8, v);
          }
        }
        return;
      }
    } else {
      const Typed = TYPED_ARRAYS[type];
      if (values instanceof Typed) {
        copyBytes(dv, at, values as ArrayBufferView, count * Typed.BYTES_PER_ELEMENT);
        return;
      }
    }
  }
  const size = TYPED_ARRAYS[type].BYTES_PER_ELEMENT;
  const write = ELEMENT_WRITERS[type];
  for (let i = 0; i < count; i++) write(dv, at + i * size, values[i] as number | bigint);
}

export function writeBoolArray(
  dv: DataView,
  at: number,
  values: ArrayLike<boolean>,
  count: number,
): void {
  for (let i = 0; i < count; i++) dv.setUint8(at + i, values[i] ? 1 : 0);
}

export function writeStructArray<TInput>(
  layout: StructLayout<unknown, TInput, unknown>,
  dv: DataView,
  at: number,
  values: ArrayLike<TInput>,
  count: number,
): void {
  for (let i = 0; i < count; i++) layout.writeAt(dv, at + i * layout.size, values[i] as TInput);
}

// -- strict checks of encoded bytes --------------------------------------------------------------

function hex(value: number, digits: number): string {
  return value.toString(16).padStart(digits, "0");
}

export function checkBoolByte(
  dv: DataView,
  at: number,
  path: string,
  name: string,
  index = -1,
): void {
  const byte = dv.getUint8(at);
  if (byte > 1) {
    throw new InvalidBoolError(`bool byte is ${byte}, not 0 or 1`, pathOf(path, name, index));
  }
}

export function checkBoolBytes(
  dv: DataView,
  at: number,
  count: number,
  path: string,
  name: string,
): void {
  for (let i = 0; i < count; i++) checkBoolByte(dv, at + i, path, name, i);
}

type ElementReader = (dv: DataView, at: number) => number | bigint;

/** One scalar element read at a byte offset (little-endian), by numeric type. */
export const ELEMENT_READERS: Readonly<Record<NumericType, ElementReader>> = {
  u8: (dv, at) => dv.getUint8(at),
  u16: (dv, at) => dv.getUint16(at, true),
  u32: (dv, at) => dv.getUint32(at, true),
  u64: (dv, at) => dv.getBigUint64(at, true),
  i8: (dv, at) => dv.getInt8(at),
  i16: (dv, at) => dv.getInt16(at, true),
  i32: (dv, at) => dv.getInt32(at, true),
  i64: (dv, at) => dv.getBigInt64(at, true),
  f32: (dv, at) => dv.getFloat32(at, true),
  f64: (dv, at) => dv.getFloat64(at, true),
};

export function checkEnumStored(
  dv: DataView,
  at: number,
  type: IntegerType,
  declared: ReadonlySet<number>,
  enumName: string,
  path: string,
  name: string,
  index = -1,
): void {
  const stored = Number(ELEMENT_READERS[type](dv, at));
  if (!declared.has(stored)) {
    throw new InvalidEnumError(
      `${stored} is not a value of enum ${enumName}`,
      pathOf(path, name, index),
    );
  }
}

export function checkEnumsStored(
  dv: DataView,
  at: number,
  type: IntegerType,
  declared: ReadonlySet<number>,
  enumName: string,
  count: number,
  path: string,
  name: string,
): void {
  const size = TYPED_ARRAYS[type].BYTES_PER_ELEMENT;
  for (let i = 0; i < count; i++) {
    checkEnumStored(dv, at + i * size, type, declared, enumName, path, name, i);
  }
}

/** Strict check of one stored float: a NaN must be the canonical quiet NaN. */
export function checkFloatBits(
  dv: DataView,
  at: number,
  type: FloatType,
  path: string,
  name: string,
  index = -1,
): void {
  if (type === "f32") {
    const bits = dv.getUint32(at, true);
    const isNaN = (bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0;
    if (isNaN && bits !== F32_CANONICAL_NAN) throw nonCanonical(hex(bits, 8), path, name, index);
    return;
  }
  const low = dv.getUint32(at, true);
  const high = dv.getUint32(at + 4, true);
  const isNaN = (high & 0x7ff00000) === 0x7ff00000 && ((high & 0x000fffff) !== 0 || low !== 0);
  if (isNaN && (high !== F64_CANONICAL_NAN_HIGH || low !== 0)) {
    throw nonCanonical(hex(high, 8) + hex(low, 8), path, name, index);
  }
}

function nonCanonical(bits: string, path: string, name: string, index: number): CodecError {
  return new NonCanonicalError(
    `NaN bits ${bits} are not the canonical quiet NaN`,
    pathOf(path, name, index),
  );
}

export function checkFloatsBits(
  dv: DataView,
  at: number,
  type: FloatType,
  count: number,
  path: string,
  name: string,
): void {
  const size = type === "f32" ? 4 : 8;
  for (let i = 0; i < count; i++) checkFloatBits(dv, at + i * size, type, path, name, i);
}

export function checkStructsStored(
  layout: StructLayout<unknown, unknown, unknown>,
  dv: DataView,
  at: number,
  count: number,
  path: string,
  name: string,
): void {
  for (let i = 0; i < count; i++) {
    layout.checkAt(dv, at + i * layout.size, `${path}${name}[${i}].`);
  }
}

// -- reading -------------------------------------------------------------------------------------

/** An owned copy of `count` stored numbers as the matching typed array. */
export function readArray<K extends NumericType>(
  dv: DataView,
  at: number,
  type: K,
  count: number,
): TypedArrayOf<K> {
  const Typed = TYPED_ARRAYS[type];
  const out = new Typed(count);
  if (LITTLE_ENDIAN_HOST) {
    const bytes = count * Typed.BYTES_PER_ELEMENT;
    new Uint8Array(out.buffer, 0, bytes).set(new Uint8Array(dv.buffer, dv.byteOffset + at, bytes));
    return out;
  }
  const read = ELEMENT_READERS[type];
  const items = out as unknown as Array<number | bigint>;
  for (let i = 0; i < count; i++) items[i] = read(dv, at + i * Typed.BYTES_PER_ELEMENT);
  return out;
}

/** Non-zero bytes read as true (strict decoding has already rejected bytes other than 0/1). */
export function readBoolArray(dv: DataView, at: number, count: number): boolean[] {
  const out = new Array<boolean>(count);
  for (let i = 0; i < count; i++) out[i] = dv.getUint8(at + i) !== 0;
  return out;
}

export function readStructArray<T>(
  layout: StructLayout<T, unknown, unknown>,
  dv: DataView,
  at: number,
  count: number,
): T[] {
  const out = new Array<T>(count);
  for (let i = 0; i < count; i++) out[i] = layout.readAt(dv, at + i * layout.size);
  return out;
}

// -- zero-copy views -----------------------------------------------------------------------------

/**
 * A typed array over the stored numbers themselves when their absolute byte offset is aligned
 * for the element type and the host is little-endian; otherwise (packed layouts at odd offsets,
 * big-endian hosts) an owned copy, which does not see later writes to the buffer.
 */
export function viewArray<K extends NumericType>(
  dv: DataView,
  at: number,
  type: K,
  count: number,
): TypedArrayOf<K> {
  const Typed = TYPED_ARRAYS[type];
  const start = dv.byteOffset + at;
  if (LITTLE_ENDIAN_HOST && start % Typed.BYTES_PER_ELEMENT === 0) {
    return new Typed(dv.buffer, start, count);
  }
  return readArray(dv, at, type, count);
}

/** The raw bytes of a bool array (0 or 1 each in canonical data), without a copy. */
export function viewBoolBytes(dv: DataView, at: number, count: number): Uint8Array {
  return new Uint8Array(dv.buffer, dv.byteOffset + at, count);
}

export function viewStructArray<TView>(
  layout: StructLayout<unknown, unknown, TView>,
  dv: DataView,
  at: number,
  count: number,
): TView[] {
  const out = new Array<TView>(count);
  for (let i = 0; i < count; i++) out[i] = layout.viewAt(dv, at + i * layout.size);
  return out;
}

// -- run-time schemas: codecs built from a compiled IR, no build step -----------------------------

type AnyLayout = StructLayout<unknown, unknown, unknown>;
type Fields = Readonly<Record<string, unknown>>;

/** One field of a run-time layout: what the generated code writes out, as data. */
interface FieldPlan {
  readonly name: string;
  readonly offset: number;
  readonly count: number;
  readonly isArray: boolean;
  readonly shape: readonly number[] | null;
  readonly kind: "int" | "float" | "bool" | "enum" | "struct";
  /** An int field with a flag role: booleans accepted (`checkFlag`). */
  readonly flag: boolean;
  /** The stored scalar type (int, float, enum); "u8" for bool and struct. */
  readonly scalar: NumericType;
  readonly enumName: string;
  readonly enumValues: ReadonlySet<number>;
  readonly sub: () => AnyLayout;
}

/**
 * Codecs for a schema from its compiled IR (`transport-schema inspect --json`, or `IR` of a
 * generated module) at run time: the same `SchemaModule` as a generated module, with the same
 * checks, errors, canonical bytes and views, for plain JavaScript without a build step. The IR is
 * refused with a one-line `SchemaError` by Python's rules and words (ir.ts: `checkIrJson`, then
 * the fingerprint recomputed, then `checkIrLayout`); give the text to `parseIrText` first (or use
 * `loadSchemaFile`) so a float where an integer belongs is told apart as Python tells it.
 * Generated modules stay the fast path (straight-line code, typed values).
 */
export function loadSchema(ir: SchemaJson): SchemaModule {
  checkIrJson(ir);
  const computed = computeFingerprint(ir);
  if (computed.hex !== ir.fingerprint) {
    throw new SchemaError(
      `IR of ${ir.name} has fingerprint ${ir.fingerprint} but hashes to ${computed.hex}`,
    );
  }
  checkIrLayout(ir);
  const layouts = new Map<string, AnyLayout>();
  const layoutOf = (name: string): AnyLayout => {
    const layout = layouts.get(name);
    if (layout === undefined) throw new SchemaError(`schema ${ir.name} has no struct ${name}`);
    return layout;
  };
  for (const [name, struct] of Object.entries(ir.structs)) {
    layouts.set(name, runtimeLayout(ir, name, struct, layoutOf));
  }
  const structs: Record<string, AnyStructCodec> = {};
  for (const [name, layout] of layouts) structs[name] = defineStruct(layout);
  return defineSchema(ir, computed.value, structs);
}

function fieldPlans(
  ir: SchemaJson,
  struct: StructJson,
  layoutOf: (name: string) => AnyLayout,
): FieldPlan[] {
  return struct.fields.map((field) => {
    const { element, isArray } = resolveField(ir, field);
    const dims = fieldDims(field);
    const base = {
      name: field.name,
      offset: field.offset,
      count: field.count,
      isArray,
      shape: dims.length > 1 ? dims : null,
      flag: FLAG_ROLES.has(field.role ?? ""),
      enumName: "",
      enumValues: new Set<number>(),
      sub: (): AnyLayout => {
        throw new SchemaError(`${field.name} is not a struct field`);
      },
    };
    switch (element.kind) {
      case "int":
      case "float":
        return { ...base, kind: element.kind, scalar: element.type };
      case "bool":
        return { ...base, kind: "bool", scalar: "u8" };
      case "enum":
        return {
          ...base,
          kind: "enum",
          scalar: element.type,
          enumName: element.name,
          enumValues: new Set(element.values),
        };
      case "struct":
        return { ...base, kind: "struct", scalar: "u8", sub: () => layoutOf(element.name) };
    }
  });
}

function runtimeLayout(
  ir: SchemaJson,
  name: string,
  struct: StructJson,
  layoutOf: (name: string) => AnyLayout,
): AnyLayout {
  const plans = fieldPlans(ir, struct, layoutOf);
  const byOffset = [...plans].sort((a, b) => a.offset - b.offset);
  const names = nameSet(plans.map((f) => f.name));
  const flat = (f: FieldPlan, value: unknown, path: string): unknown =>
    f.shape === null ? value : flatArray(value, f.shape, path, f.name);

  const validateField = (f: FieldPlan, value: unknown, path: string): void => {
    const v = flat(f, value, path);
    switch (f.kind) {
      case "struct":
        if (f.isArray) checkStructArray(f.sub(), v, f.count, path, f.name);
        else f.sub().validateAt(v, `${path}${f.name}.`);
        return;
      case "bool":
        if (f.isArray) checkBoolArray(v, f.count, path, f.name);
        else checkBool(v, path, f.name);
        return;
      case "enum":
        if (f.isArray) checkEnumArray(v, f.enumValues, f.enumName, f.count, path, f.name);
        else checkEnum(v, f.enumValues, f.enumName, path, f.name);
        return;
      case "float":
        if (f.isArray) checkFloatArray(v, f.scalar as FloatType, f.count, path, f.name);
        else checkFloat(v, f.scalar as FloatType, path, f.name);
        return;
      case "int":
        if (f.flag) {
          if (f.isArray) checkFlagArray(v, f.scalar as IntegerType, f.count, path, f.name);
          else checkFlag(v, f.scalar as IntegerType, path, f.name);
        } else if (f.isArray) checkIntegerArray(v, f.scalar as IntegerType, f.count, path, f.name);
        else checkInteger(v, f.scalar as IntegerType, path, f.name);
    }
  };

  const writeField = (f: FieldPlan, dv: DataView, at: number, value: unknown): void => {
    const v = flat(f, value, "");
    if (f.kind === "struct") {
      if (f.isArray) writeStructArray(f.sub(), dv, at, v as ArrayLike<unknown>, f.count);
      else f.sub().writeAt(dv, at, v);
    } else if (f.kind === "bool") {
      if (f.isArray) writeBoolArray(dv, at, v as ArrayLike<boolean>, f.count);
      else dv.setUint8(at, v ? 1 : 0);
    } else if (f.isArray) {
      writeArray(dv, at, f.scalar, v as ArrayLike<number | bigint>, f.count);
    } else {
      ELEMENT_WRITERS[f.scalar](dv, at, v as number | bigint);
    }
  };

  const checkField = (f: FieldPlan, dv: DataView, at: number, path: string): void => {
    if (f.kind === "struct") {
      if (f.isArray) checkStructsStored(f.sub(), dv, at, f.count, path, f.name);
      else f.sub().checkAt(dv, at, `${path}${f.name}.`);
    } else if (f.kind === "bool") {
      if (f.isArray) checkBoolBytes(dv, at, f.count, path, f.name);
      else checkBoolByte(dv, at, path, f.name);
    } else if (f.kind === "enum") {
      const type = f.scalar as IntegerType;
      if (f.isArray) {
        checkEnumsStored(dv, at, type, f.enumValues, f.enumName, f.count, path, f.name);
      } else checkEnumStored(dv, at, type, f.enumValues, f.enumName, path, f.name);
    } else if (f.kind === "float") {
      if (f.isArray) checkFloatsBits(dv, at, f.scalar as FloatType, f.count, path, f.name);
      else checkFloatBits(dv, at, f.scalar as FloatType, path, f.name);
    }
  };

  const readField = (f: FieldPlan, dv: DataView, at: number, view: boolean): unknown => {
    if (f.kind === "struct") {
      if (f.isArray) {
        return view
          ? viewStructArray(f.sub(), dv, at, f.count)
          : readStructArray(f.sub(), dv, at, f.count);
      }
      return view ? f.sub().viewAt(dv, at) : f.sub().readAt(dv, at);
    }
    if (f.kind === "bool") {
      if (f.isArray) return view ? viewBoolBytes(dv, at, f.count) : readBoolArray(dv, at, f.count);
      return dv.getUint8(at) !== 0;
    }
    if (f.isArray) {
      return view ? viewArray(dv, at, f.scalar, f.count) : readArray(dv, at, f.scalar, f.count);
    }
    return ELEMENT_READERS[f.scalar](dv, at);
  };

  /** The zero-copy view: one getter per field on the prototype, as the generated classes. */
  class RuntimeView {
    readonly dv: DataView;
    readonly at: number;

    constructor(dv: DataView, at: number) {
      this.dv = dv;
      this.at = at;
    }
  }
  for (const f of plans) {
    Object.defineProperty(RuntimeView.prototype, f.name, {
      get(this: RuntimeView): unknown {
        return readField(f, this.dv, this.at + f.offset, true);
      },
      enumerable: true,
    });
  }

  return {
    name,
    size: struct.size,
    validateAt(value: unknown, path: string): void {
      const fields: Fields = asFields(value, path);
      for (const f of plans) validateField(f, fieldValue(fields, f.name, path), path);
      rejectUnknownFields(fields, names, path);
    },
    writeAt(dv: DataView, at: number, value: unknown): void {
      const fields = value as Fields;
      for (const f of plans) writeField(f, dv, at + f.offset, fields[f.name]);
    },
    checkAt(dv: DataView, at: number, path: string): void {
      for (const f of byOffset) checkField(f, dv, at + f.offset, path);
    },
    readAt(dv: DataView, at: number): unknown {
      const out: Record<string, unknown> = {};
      for (const f of plans) out[f.name] = readField(f, dv, at + f.offset, false);
      return out;
    },
    viewAt(dv: DataView, at: number): unknown {
      return new RuntimeView(dv, at);
    },
  };
}
