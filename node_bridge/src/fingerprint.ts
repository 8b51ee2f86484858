/**
 * Schema fingerprints, computed exactly like `transport/schema/ir.py`.
 *
 * canonicalJson(v) equals Python's
 * `json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=True)` for JSON values
 * whose numbers are integers (the layout IR has no other numbers). The fingerprint is the first
 * 8 bytes of the SHA-256 of that text, read as a big-endian u64, shown as 16 hex digits.
 */

import { createHash } from "node:crypto";

import { SchemaError } from "./errors";

export type JsonValue =
  null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** Canonical JSON text: sorted keys, no whitespace, every character outside ' '..'~' escaped. */
export function canonicalJson(value: unknown): string {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "string") return jsonString(value);
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) {
      throw new SchemaError(`canonical JSON holds integers only, not ${value}`);
    }
    return String(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object") {
    const record = value as Record<string, unknown>;
    const keys = Object.keys(record)
      .filter((key) => record[key] !== undefined)
      .sort(compareCodePoints);
    return `{${keys.map((key) => `${jsonString(key)}:${canonicalJson(record[key])}`).join(",")}}`;
  }
  throw new SchemaError(`cannot write a ${typeof value} as canonical JSON`);
}

const SHORT_ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
  "\b": "\\b",
  "\f": "\\f",
};

/** A JSON string literal with Python's `ensure_ascii=True` escaping (lowercase hex). */
export function jsonString(text: string): string {
  let out = '"';
  for (let i = 0; i < text.length; i++) {
    const char = text[i] as string;
    const unit = text.charCodeAt(i);
    const short = SHORT_ESCAPES[char];
    if (short !== undefined) out += short;
    else if (unit >= 0x20 && unit <= 0x7e) out += char;
    else out += `\\u${unit.toString(16).padStart(4, "0")}`;
  }
  return `${out}"`;
}

/** Python sorts str keys by code point; UTF-16 order differs only above U+FFFF. */
export function compareCodePoints(a: string, b: string): number {
  const left = Array.from(a, (c) => c.codePointAt(0) as number);
  const right = Array.from(b, (c) => c.codePointAt(0) as number);
  for (let i = 0; i < Math.min(left.length, right.length); i++) {
    const diff = (left[i] as number) - (right[i] as number);
    if (diff !== 0) return diff;
  }
  return left.length - right.length;
}

/**
 * The IR parts a fingerprint covers; `env` and `shm` exist for env schemas only, `errors` and
 * `http` for the protocol envelope only.
 */
export interface LayoutParts {
  structs: unknown;
  enums: unknown;
  messages: unknown;
  env?: unknown;
  shm?: unknown;
  errors?: unknown;
  http?: unknown;
}

/**
 * The part of a schema IR that the fingerprint covers: structs, enums and messages, plus `env`,
 * `shm`, `errors` and `http` when present (absent keys are left out, as Python's
 * `SchemaIR.layout_json`).
 */
export function layoutOf(ir: LayoutParts): JsonValue {
  const { structs, enums, messages, env, shm, errors, http } = ir;
  return { structs, enums, messages, env, shm, errors, http } as JsonValue;
}

/** The 64-bit fingerprint of a layout: SHA-256 of its canonical JSON, first 8 bytes, big-endian. */
export function fingerprintOf(layout: unknown): bigint {
  const digest = createHash("sha256").update(canonicalJson(layout), "ascii").digest();
  return digest.readBigUInt64BE(0);
}

/** A fingerprint as Python prints it: 16 lowercase hex digits. */
export function fingerprintHex(fingerprint: bigint): string {
  return fingerprint.toString(16).padStart(16, "0");
}

/** Recompute a schema's fingerprint from its embedded IR (never trust a copied constant). */
export function computeFingerprint(ir: LayoutParts): {
  value: bigint;
  hex: string;
} {
  const value = fingerprintOf(layoutOf(ir));
  return { value, hex: fingerprintHex(value) };
}
