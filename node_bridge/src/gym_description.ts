/**
 * The gymnasium spaces' description a schema derived from them packs in its `GymSpaces` enum
 * (Python: `transport.spaces.gym_description_of`): the client names the action space by it, the
 * runtime checks an env's `actN` against its Discrete action.
 */

import type { SchemaModule } from "./codec";

/** The enum of a gymnasium-derived schema that packs the spaces' description (Python: `transport.spaces.GYM_SPACES_ENUM`). */
export const GYM_SPACES_ENUM = "GymSpaces";

/**
 * The gymnasium spaces' description a derived schema packs in its `GymSpaces` enum (two bytes
 * of its JSON text per value, value i's high half i; Python: `transport.spaces.gym_description_of`),
 * or null (none, or unreadable).
 */
export function gymDescription(schema: SchemaModule): Record<string, unknown> | null {
  const values = schema.ir.enums[GYM_SPACES_ENUM]?.values;
  if (values === undefined) return null;
  const packed = Object.values(values)
    .map(Number)
    .sort((a, b) => a - b);
  const bytes: number[] = [];
  for (let i = 0; i < packed.length; i++) {
    const value = packed[i] as number;
    if (Math.floor(value / 65536) !== i) return null;
    bytes.push((value >> 8) & 0xff, value & 0xff);
  }
  try {
    const found: unknown = JSON.parse(Buffer.from(bytes).toString("ascii"));
    if (typeof found !== "object" || found === null || (found as Record<string, unknown>)["version"] !== 1) return null;
    return found as Record<string, unknown>;
  } catch {
    return null;
  }
}
