/** Fingerprints equal Python's (`load_schema(...).fingerprint_hex`), recomputed from the IR. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { canonicalJson, computeFingerprint } from "../fingerprint";
import { SCHEMAS, mahjong_env, pac_env, pac_shm } from "../generated";

// From Python: transport.schema.load_schema("schema/<name>.toml").fingerprint_hex
const PYTHON_FINGERPRINTS = {
  pac_env: "288192de047032f3",
  pac_shm: "e04bc4ed180e5b41",
  mahjong_env: "d45a3b2ef8889911",
};

test("declared fingerprints equal the Python values", () => {
  assert.equal(pac_env.FINGERPRINT_HEX, PYTHON_FINGERPRINTS.pac_env);
  assert.equal(pac_shm.FINGERPRINT_HEX, PYTHON_FINGERPRINTS.pac_shm);
  assert.equal(mahjong_env.FINGERPRINT_HEX, PYTHON_FINGERPRINTS.mahjong_env);
  assert.equal(pac_env.FINGERPRINT, 0x288192de047032f3n);
});

test("fingerprints recomputed from the embedded IR equal the declared ones", () => {
  for (const [name, expected] of Object.entries(PYTHON_FINGERPRINTS)) {
    const schema = SCHEMAS[name];
    assert.ok(schema, name);
    const computed = computeFingerprint(schema.ir);
    assert.equal(computed.hex, expected, name);
    assert.equal(computed.value, schema.fingerprint, name);
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
