/**
 * fast-check arbitraries derived from a schema's layout IR: every value a struct can hold,
 * edge cases included (integer bounds, NaN, +-0, +-infinity, subnormals, every enum value).
 */

import fc from "fast-check";

import type { FloatType, IntegerType, SchemaJson } from "../ir";
import { resolveField } from "../ir";

type NumberIntegerType = Exclude<IntegerType, "u64" | "i64">;

const INTEGER_BOUNDS: Readonly<Record<NumberIntegerType, readonly [number, number]>> = {
  u8: [0, 0xff],
  u16: [0, 0xffff],
  u32: [0, 0xffffffff],
  i8: [-0x80, 0x7f],
  i16: [-0x8000, 0x7fff],
  i32: [-0x80000000, 0x7fffffff],
};

function integerArbitrary(type: IntegerType): fc.Arbitrary<number | bigint> {
  if (type === "u64") return fc.bigInt({ min: 0n, max: 2n ** 64n - 1n });
  if (type === "i64") return fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n });
  const [min, max] = INTEGER_BOUNDS[type];
  return fc.integer({ min, max });
}

function floatArbitrary(type: FloatType): fc.Arbitrary<number> {
  // Both include NaN, -0, +-infinity and subnormals by default; fc.float() yields f32 values.
  return type === "f32" ? fc.float() : fc.double();
}

/** Plain values for one struct: objects, arrays, numbers, bigints (u64/i64) and booleans. */
export function structArbitrary(
  schema: SchemaJson,
  structName: string,
): fc.Arbitrary<Record<string, unknown>> {
  const struct = schema.structs[structName];
  if (struct === undefined) throw new Error(`no struct ${structName} in schema ${schema.name}`);
  const shape: Record<string, fc.Arbitrary<unknown>> = {};
  for (const field of struct.fields) {
    const { element, isArray } = resolveField(schema, field);
    let item: fc.Arbitrary<unknown>;
    switch (element.kind) {
      case "int":
        item = integerArbitrary(element.type);
        break;
      case "float":
        item = floatArbitrary(element.type);
        break;
      case "bool":
        item = fc.boolean();
        break;
      case "enum":
        item = fc.constantFrom(...element.values);
        break;
      case "struct":
        item = structArbitrary(schema, element.name);
        break;
    }
    shape[field.name] = isArray
      ? fc.array(item, { minLength: field.count, maxLength: field.count })
      : item;
  }
  return fc.record(shape);
}
