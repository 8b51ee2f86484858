/**
 * A client error names its URL once: a channel's text naming the URL without its query
 * (`shm://name`) is not prefixed again with `shm://name?num_envs=4` (Python:
 * tests/test_explain_url.py).
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { explain } from "../client";
import { PeerGoneError } from "../errors";

test("a URL named without its query is not repeated", () => {
  const error = explain(new PeerGoneError("shm://run7: the server (pid 12) died"), "shm://run7?num_envs=4") as Error;
  assert.ok(error.message.startsWith("shm://run7: the server (pid 12) died ("), error.message);
  assert.equal(error.message.split("shm://run7").length, 2);
});

test("a text without the URL gets it", () => {
  const error = explain(new PeerGoneError("the connection was closed"), "unix:///tmp/a.sock") as Error;
  assert.ok(error.message.startsWith("unix:///tmp/a.sock: the connection was closed ("), error.message);
});
