/**
 * The package's exported surface, pinned against the modules themselves: a name added to or
 * dropped from `@transport/node-bridge` or `@transport/node-bridge/runtime` fails here until this
 * list says so (Python: tests/test_public_api.py).
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import * as api from "../index";
import * as runtime from "../runtime";
import { TransportError } from "../errors";

const API = [
  "ActionError", "ArrayLengthError", "AutoReset", "BadFrameError", "BufferSizeError", "CLOSING_ERRORS", "CODEC_ERROR_CODES", "Client",
  "CodecError", "ConnectError", "DEFAULT_MAX_BODY", "EnvError", "ErrorCode", "FingerprintMismatchError", "InvalidBoolError",
  "InvalidEnumError", "MissingFieldError", "NoProgressError", "NonCanonicalError", "PROTOCOL_VERSION", "PeerGoneError", "ProtocolError",
  "RegionInUseError", "RegionMismatchError", "RemoteError", "ReplyTooLargeError", "SCHEMAS", "SchemaError", "TransportError", "TransportTimeoutError",
  "UnknownFieldError", "ValueRangeError", "ValueTypeError", "VersionMismatchError", "canonicalJson",
  "computeFingerprint", "connect", "fingerprintHex", "fingerprintOf", "gridworld", "loadSchema", "loadSchemaFile", "mahjong_env",
  "messageIds", "pac_env", "pac_shm", "protocol", "serve", "tetris",
];

const RUNTIME = [
  "EnvHost", "EnvRuntime", "EnvTable", "FATE_FAILED", "FATE_RECREATED", "FATE_RESET", "LocalRunner", "Op",
  "PoolRunner", "Session", "WorkerPool", "isEnv", "sessionFactory", "sessionsOf",
];

test("@transport/node-bridge exports exactly the pinned names", () => {
  assert.deepEqual(Object.keys(api).sort(), [...API].sort());
});

test("@transport/node-bridge/runtime exports exactly the pinned names", () => {
  assert.deepEqual(Object.keys(runtime).sort(), [...RUNTIME].sort());
});

test("every exported error class derives from TransportError", () => {
  for (const [name, value] of Object.entries(api)) {
    if (typeof value === "function" && name.endsWith("Error") && value !== TransportError) {
      assert.ok(value.prototype instanceof TransportError, `${name} is not a TransportError`);
    }
  }
});
