/** protocol.ts takes every constant from the generated protocol envelope (schema/protocol.toml). */

import assert from "node:assert/strict";
import { test } from "node:test";

import { FingerprintMismatchError, RemoteError, VersionMismatchError } from "../errors";
import { mahjong_env, pac_env, tetris } from "../generated";
import * as envelope from "../generated/protocol";
import {
  CLOSING_ERRORS,
  ERROR_HEAD_SIZE,
  ErrorCode,
  HEADER_SIZE,
  HELLO_SIZE,
  HTTP_ROUTES,
  HTTP_STATUS,
  MESSAGE_IDS,
  decodeError,
  encodeError,
  errorFromCode,
  messageIds,
} from "../protocol";

test("error codes, closing set and HTTP tables come from the envelope", () => {
  assert.equal(ErrorCode, envelope.ErrorCode);
  assert.deepEqual(
    [...CLOSING_ERRORS].sort((a, b) => a - b),
    [
      ErrorCode.BAD_FRAME,
      ErrorCode.UNKNOWN_MESSAGE,
      ErrorCode.BODY_TOO_LARGE,
      ErrorCode.VERSION_MISMATCH,
      ErrorCode.FINGERPRINT_MISMATCH,
    ],
  );
  assert.equal(HTTP_STATUS[ErrorCode.BODY_TOO_LARGE], 413);
  assert.equal(HTTP_STATUS[ErrorCode.MASKED_ACTION], 422);
  assert.equal(HTTP_STATUS[ErrorCode.ENV_ERROR], 500);
  assert.equal(Object.keys(HTTP_STATUS).length, Object.keys(ErrorCode).length);
  assert.equal(HTTP_ROUTES["step_multi"], "STEP_MULTI_REQ");
  assert.equal(HTTP_ROUTES["observe"], "OBSERVE_REQ");
  assert.deepEqual([HEADER_SIZE, HELLO_SIZE, ERROR_HEAD_SIZE], [9, 12, 4]);
});

test("every env schema carries the envelope's message ids", () => {
  assert.equal(MESSAGE_IDS.OBSERVE_REQ, 0x07);
  assert.equal(MESSAGE_IDS.STEP_BATCH_RESP, 0x12);
  for (const schema of [pac_env.SCHEMA, tetris.SCHEMA, mahjong_env.SCHEMA]) {
    assert.deepEqual(messageIds(schema), MESSAGE_IDS);
    assert.equal(schema.messages["STEP_RESP"]?.body, schema.ir.env?.result);
  }
  assert.equal(mahjong_env.ResetRequestCodec.size, 8);
});

test("errorFromCode is the one code -> error mapping", () => {
  assert.ok(errorFromCode(ErrorCode.VERSION_MISMATCH, "v") instanceof VersionMismatchError);
  assert.ok(errorFromCode(ErrorCode.FINGERPRINT_MISMATCH, "f") instanceof FingerprintMismatchError);
  const masked = decodeError(encodeError(ErrorCode.MASKED_ACTION, "no"));
  assert.ok(masked instanceof RemoteError);
  assert.equal(masked.codeName, "MASKED_ACTION");
  assert.equal(masked.text, "no");
});
