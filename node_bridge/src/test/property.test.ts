/** Property: for every struct of every schema, encode -> decode -> encode gives the same bytes. */

import assert from "node:assert/strict";
import { test } from "node:test";

import fc from "fast-check";

import { structArbitrary } from "../conformance/arbitraries";
import { SCHEMAS } from "../generated";

for (const schema of Object.values(SCHEMAS)) {
  for (const codec of Object.values(schema.structs)) {
    test(`${schema.name}.${codec.name}: encode(decode(encode(v))) === encode(v)`, () => {
      fc.assert(
        fc.property(structArbitrary(schema.ir, codec.name), (value) => {
          const bytes = codec.encode(value);
          assert.equal(bytes.length, codec.size);
          const again = codec.encode(codec.decode(bytes));
          assert.deepEqual(Buffer.from(again), Buffer.from(bytes));
        }),
        { numRuns: 50, seed: 42 },
      );
    });
  }
}
