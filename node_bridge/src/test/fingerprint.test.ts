/** Fingerprints recomputed from the embedded IR (canonical JSON + SHA-256). */

import assert from "node:assert/strict";
import { test } from "node:test";

import { canonicalJson, computeFingerprint } from "../fingerprint";
import { SCHEMAS, mahjong_env, pac_env, pac_shm } from "../generated";

// Parity with Python's fingerprints is checked by `transport-conformance` (the fingerprint
// check of every schema); here the TypeScript side must agree with itself.

test("fingerprints recomputed from the embedded IR equal the declared ones", () => {
  for (const module of [pac_env, pac_shm, mahjong_env]) {
    const schema = SCHEMAS[module.IR.name];
    assert.ok(schema, module.IR.name);
    const computed = computeFingerprint(schema.ir);
    assert.equal(computed.hex, module.FINGERPRINT_HEX, module.IR.name);
    assert.equal(computed.value, module.FINGERPRINT, module.IR.name);
    assert.equal(computed.value, schema.fingerprint, module.IR.name);
  }
});

test("canonical JSON matches Python's json.dumps(sort_keys, compact, ensure_ascii)", () => {
  // json.dumps({"b": [1, None, True], "a": "x\"\\\n\u00e9\u007f\U0001f600"}, sort_keys=True,
  //            separators=(",", ":"), ensure_ascii=True)
  const value = { b: [1, null, true], a: 'x"\\\n\u00e9\u007f\u{1f600}' };
  assert.equal(
    canonicalJson(value),
    '{"a":"x\\"\\\\\\n\\u00e9\\u007f\\ud83d\\ude00","b":[1,null,true]}',
  );
});

test("a changed layout changes the fingerprint", () => {
  const ir = structuredClone(pac_env.IR) as { structs: Record<string, { size: number }> };
  (ir.structs["StepRequest"] as { size: number }).size = 5;
  const changed = computeFingerprint({ ...pac_env.IR, structs: ir.structs });
  assert.notEqual(changed.hex, pac_env.FINGERPRINT_HEX);
});
