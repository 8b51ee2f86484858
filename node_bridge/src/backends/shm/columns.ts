/**
 * The shm column layout's views (docs/shm.md "Column layout"; the layout math is ir.ts
 * `shmColumns`, the region's columns `Region.requestColumns` / `resultColumns`).
 *
 * A column region keeps each request / result field of all envs contiguous, so a client reads a
 * batch's field as ONE typed array over the mapping (`columnArrays`: no copy, env i's value at
 * elements [i * count, (i + 1) * count)), and the per-env result views the Client hands out read
 * env i's value in each column (`ColumnEnvView`: the getters of a generated view, over columns).
 * `columnsArea` lays records out in columns in a plain buffer: the conformance testee's "columns"
 * op, which both languages answer byte for byte.
 */

import { type AnyStructCodec, ELEMENT_READERS, type SchemaModule, dataViewOf, viewArray, viewBoolBytes } from "../../codec";
import { ProtocolError } from "../../errors";
import { type FieldJson, type NumericType, type SchemaJson, type ShmColumn, resolveField, shmColumns } from "../../ir";

/** Reads one field's value at a byte offset, as a generated view's getter does (zero copy). */
type FieldReader = (dv: DataView, at: number) => unknown;

/** The getter of `field` of a view: numeric arrays are typed arrays over the buffer, bool arrays
 * their raw bytes, nested structs their codec's views, scalars read on every access. */
export function fieldReader(schema: SchemaModule, field: FieldJson): FieldReader {
  const { element, isArray } = resolveField(schema.ir, field);
  const count = field.count;
  switch (element.kind) {
    case "struct": {
      const sub = schema.structs[element.name] as AnyStructCodec | undefined;
      if (sub === undefined) throw new ProtocolError(`schema ${schema.name} has no struct ${element.name}`);
      const bytesOf = (dv: DataView): Uint8Array => new Uint8Array(dv.buffer, dv.byteOffset, dv.byteLength);
      if (!isArray) return (dv, at) => sub.view(bytesOf(dv), at);
      return (dv, at) => {
        const bytes = bytesOf(dv);
        return Array.from({ length: count }, (_, j) => sub.view(bytes, at + j * sub.size));
      };
    }
    case "bool":
      return isArray ? (dv, at) => viewBoolBytes(dv, at, count) : (dv, at) => dv.getUint8(at) !== 0;
    default: {
      const type: NumericType = element.type;
      return isArray ? (dv, at) => viewArray(dv, at, type, count) : ELEMENT_READERS[type];
    }
  }
}

/**
 * Env `index`'s result over the region's result columns: one enumerable getter per field (in
 * declaration order), each reading env `index`'s value in that field's column.
 */
export function columnEnvView(schema: SchemaModule, dv: DataView, columns: Readonly<Record<string, ShmColumn>>, struct: string, index: number): Record<string, unknown> {
  const view: Record<string, unknown> = {};
  for (const field of schema.ir.structs[struct]?.fields ?? []) {
    const column = columns[field.name];
    if (column === undefined) throw new ProtocolError(`the column layout has no column for ${struct}.${field.name}`);
    const read = fieldReader(schema, field);
    const at = column.start + index * field.size;
    Object.defineProperty(view, field.name, { get: () => read(dv, at), enumerable: true });
  }
  return view;
}

/**
 * Each column of `columns` for envs 0..count-1 as ONE zero-copy array over `bytes`' buffer:
 * a typed array of count x field.count elements for a numeric (or enum) field, the raw bytes for
 * a bool or struct field. Env i's value is at elements [i * field.count, (i + 1) * field.count).
 */
export function columnArrays(schema: SchemaModule, bytes: Uint8Array, columns: Readonly<Record<string, ShmColumn>>, count: number): Record<string, ArrayBufferView> {
  const dv = dataViewOf(bytes);
  const out: Record<string, ArrayBufferView> = {};
  for (const [name, column] of Object.entries(columns)) {
    const { element } = resolveField(schema.ir, column.field);
    if (element.kind === "int" || element.kind === "float" || element.kind === "enum") {
      out[name] = viewArray(dv, column.start, element.type, count * column.field.count);
    } else {
      out[name] = bytes.subarray(column.start, column.start + count * column.field.size);
    }
  }
  return out;
}

/** Gather env `index`'s result from the columns into a packed record at `out[at]` (zeroed padding). */
export function gatherRow(bytes: Uint8Array, columns: readonly ShmColumn[], index: number, out: Uint8Array, at: number, size: number): void {
  out.fill(0, at, at + size);
  for (const c of columns) {
    const from = c.start + index * c.field.size;
    out.set(bytes.subarray(from, from + c.field.size), at + c.field.offset);
  }
}

/**
 * The conformance answer of a column layout (docs/conformance.md, the "columns" op): for `slots`
 * slots, the region size, each column's start by `"<struct>.<field>"`, and the bytes of the
 * region from C0(k) to region_size(k) with `requests[i]` / `results[i]` (k wire records each)
 * laid out in the columns (everything else zero).
 */
export function columnsArea(
  ir: SchemaJson,
  slots: number,
  requests: readonly Uint8Array[],
  results: readonly Uint8Array[],
): { regionSize: number; offsets: Record<string, number>; area: Uint8Array } {
  for (const [part, records] of [["request", requests], ["result", results]] as const) {
    if (records.length !== slots) throw new ProtocolError(`${part}s: ${records.length} records for ${slots} slots`);
  }
  const { columns, size } = shmColumns(ir, slots); // a SchemaError when ir has no column layout
  const shm = ir.shm as NonNullable<SchemaJson["shm"]>;
  const sizeOf = (name: string): number => ir.structs[name]?.size ?? 0;
  const start = sizeOf(shm.control) + slots * (sizeOf(shm.slot) + sizeOf(shm.final)); // C0(k)
  const area = new Uint8Array(size - start);
  const offsets: Record<string, number> = {};
  for (const column of columns) {
    offsets[column.key] = column.start;
    const records = column.part === "request" ? requests : results;
    const recordSize = ir.structs[column.struct]?.size ?? 0;
    records.forEach((record, i) => {
      if (record.byteLength !== recordSize) {
        throw new ProtocolError(`${column.part} record ${i} is ${record.byteLength} bytes, ${column.struct} is ${recordSize}`);
      }
      const f = column.field;
      area.set(record.subarray(f.offset, f.offset + f.size), column.start - start + i * f.size);
    });
  }
  return { regionSize: size, offsets, area };
}
