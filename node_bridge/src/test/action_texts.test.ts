/**
 * The INVALID_ACTION texts of a Box action (tester 2026-11-28): a NaN or +-inf that the bounds
 * alone let through (none declared, or -inf under a high only) is "not finite", not "not inside
 * -inf..inf and finite"; a value outside declared bounds keeps "not inside LOW..HIGH and
 * finite". The same texts as Python's `ActionRule.describe` (tests/test_gym_third_party.py).
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { ErrorCode, RequestError } from "../protocol";
import { type ActionRule, checkActionValue } from "../runtime/core";

function rule(low: number | null, high: number | null): ActionRule {
  const bound = (v: number | null): Float64Array | null => (v === null ? null : new Float64Array(2).fill(v));
  return { kind: "box", elements: 2, low: bound(low), high: bound(high), finite: true };
}

function textOf(r: ActionRule, action: number[]): string {
  try {
    checkActionValue(r, Float64Array.from(action), 0, 0);
  } catch (error) {
    assert.ok(error instanceof RequestError && error.code === ErrorCode.INVALID_ACTION);
    return error.text;
  }
  throw new Error(`action [${action.join(", ")}] was accepted`);
}

test("a non-finite action in an unbounded Box is not finite", () => {
  assert.equal(textOf(rule(null, null), [Infinity, 0.5]), "env 0: action [Infinity, 0.5] is not finite");
  assert.equal(textOf(rule(null, null), [NaN, 0.5]), "env 0: action [NaN, 0.5] is not finite");
  assert.equal(textOf(rule(null, 2), [-Infinity, 0]), "env 0: action [-Infinity, 0] is not finite");
});

test("an action outside declared bounds is not inside them", () => {
  assert.equal(textOf(rule(null, 2), [5, 0]), "env 0: action [5, 0] is not inside -inf..[2, 2] and finite");
  assert.equal(textOf(rule(-1, 1), [NaN, 0]), "env 0: action [NaN, 0] is not inside [-1, -1]..[1, 1] and finite");
  assert.equal(textOf(rule(-1, 1), [Infinity, 0]), "env 0: action [Infinity, 0] is not inside [-1, -1]..[1, 1] and finite");
  assert.equal(textOf(rule(-1, 1), [1.5, 0]), "env 0: action [1.5, 0] is not inside [-1, -1]..[1, 1] and finite");
});
