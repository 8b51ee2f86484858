/**
 * An env that declares one schema (`Env.SCHEMA = pac_env.SCHEMA`) served with another
 * (`{ schema: tetris.SCHEMA }`): refused at start with a `SchemaError` naming both schemas and
 * fingerprints, not served until every reset fails with "returned bad values" (Python:
 * `refuse_other_schema`, tests/test_env_declares_other_schema.py). Real servers.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { EchoEnv } from "../envs/echo";
import { MahjongEnv } from "../envs/mahjong";
import { SchemaError } from "../errors";
import { mahjong_env, pac_env, tetris } from "../generated";
import { connect, serve } from "../index";

class Declared extends EchoEnv {
  static readonly SCHEMA = pac_env.SCHEMA;
}

const socketUrl = (): string => `unix://${join(tmpdir(), `declared-${process.pid}-${randomBytes(4).toString("hex")}.sock`)}`;

function namesBoth(error: unknown): boolean {
  assert.ok(error instanceof SchemaError, String(error));
  for (const schema of [pac_env.SCHEMA, tetris.SCHEMA]) {
    assert.ok(error.message.includes(schema.name), error.message);
    assert.ok(error.message.includes(schema.fingerprint.toString(16).padStart(16, "0")), error.message);
  }
  assert.ok(error.message.includes("Declared.SCHEMA"), error.message);
  return true;
}

test("a class, an instance and a factory's env declaring another schema are refused at start", async () => {
  for (const served of [Declared, new Declared(), () => new Declared()]) {
    const url = socketUrl();
    await assert.rejects(serve(served, url, { schema: tetris.SCHEMA }), namesBoth);
    assert.equal(existsSync(url.slice("unix://".length)), false);
  }
  const shm = `shm://declared-${process.pid}-${randomBytes(4).toString("hex")}`;
  await assert.rejects(serve(Declared, shm, { schema: tetris.SCHEMA }), namesBoth);
});

test("the schema it declares is served", async () => {
  const server = await serve(Declared, socketUrl(), { schema: pac_env.SCHEMA });
  try {
    const client = await connect(server.url);
    try {
      await client.reset();
    } finally {
      await client.close();
    }
  } finally {
    await server.close();
  }
});

class DeclaredMahjong extends MahjongEnv {
  static readonly SCHEMA = mahjong_env.SCHEMA;
}

test("without a schema given, the one the env declares is served (as Python's serve)", async () => {
  // before: serve() tried pac_env and refused the env ("its results do not fit it")
  for (const served of [DeclaredMahjong, new DeclaredMahjong()]) {
    const server = await serve(served, socketUrl());
    try {
      const client = await connect(server.url);
      try {
        assert.equal(client.schema.name, "mahjong_env");
        await client.reset(7);
      } finally {
        await client.close();
      }
    } finally {
      await server.close();
    }
  }
});
