/** Values on the testee's msgpack wire: plain arrays instead of typed arrays. */

/**
 * Typed arrays become plain arrays (msgpack would send them as `bin`); objects and arrays are
 * converted recursively; numbers, bigints and booleans pass through.
 */
export function toWire(value: unknown): unknown {
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    return Array.from(value as unknown as ArrayLike<unknown>);
  }
  if (Array.isArray(value)) return value.map(toWire);
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[key] = toWire(item);
    return out;
  }
  return value;
}

/** What a msgpack `bin` inside values becomes: a value no field accepts (`wrong_type`). */
export const WIRE_BYTES = Symbol("msgpack bin");

/**
 * Incoming values as the codec should see them. A msgpack `bin` is a Python `bytes`, which the
 * Python codec rejects for every field (`wrong_type`); as a Uint8Array the TypeScript codec
 * would take it for a u8 array, so it becomes the opaque `WIRE_BYTES` marker instead.
 */
export function fromWire(value: unknown): unknown {
  if (value instanceof Uint8Array) return WIRE_BYTES;
  if (Array.isArray(value)) return value.map(fromWire);
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[key] = fromWire(item);
    return out;
  }
  return value;
}
