/**
 * Frames and spaces over shm:// for the Node client (issue 23; docs/shm.md "Frames"): a
 * Discrete(2) env without an action mask says actN 2 (not the control block's act_size 0), and
 * an OBSERVE whose info map carries a 210x160x3 frame (too large for a slot's 256-byte info area)
 * comes back whole through the region's side segment, from a Node and from a Python server
 * (separate processes), as over unix://. The side segment is removed with the region.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { INFO_SIDE, SIDE_SUFFIX } from "../backends/shm/side";
import { connect } from "../index";
import { HAVE_PYTHON, ROOT, ServerProcess } from "../testing/servers";

const SCHEMA = `
[schema]
name = "cartpole_frames"
version = 1
layout = "natural"

[env]

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[4]", role = "observation" },
  { name = "reward",      type = "f32",    role = "reward" },
  { name = "terminated",  type = "bool",   role = "terminated" },
  { name = "truncated",   type = "bool",   role = "truncated" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "u8", role = "action" }]
`;

const PAINTER_JS = `
"use strict";
class Painter {
  constructor() { this.t = 0; this.obs = new Float32Array(4); }
  spaces() { return { obsN: 4, actN: 2 }; }
  result() { return { observation: this.obs, reward: 1, terminated: false, truncated: false }; }
  reset(seed) { this.t = 0; this.obs.fill(0); return this.result(); }
  step(action) { this.t += 1; this.obs[0] = this.t; this.obs[1] = action; return this.result(); }
  info() {
    const frame = new Uint8Array(210 * 160 * 3);
    for (let i = 0; i < frame.length; i++) frame[i] = (i * 7 + this.t) & 255;
    return { frame, frame_shape: [210, 160, 3] };
  }
}
class Counter extends Painter {
  info() { return { count: this.t }; }
}
module.exports = { Painter, Counter };
`;

const PAINTER_PY = `
import numpy as np
from transport.runtime.env import Spaces


class Painter:
    def __init__(self):
        self.t = 0

    def spaces(self):
        return Spaces(4, 2)

    def _result(self, action):
        obs = np.array([self.t, action, 0, 0], dtype=np.float32)
        return {"observation": obs, "reward": 1.0, "terminated": False, "truncated": False}

    def reset(self, seed=None):
        self.t = 0
        return self._result(0)

    def step(self, action):
        self.t += 1
        return self._result(action)

    def info(self):
        index = np.arange(210 * 160 * 3, dtype=np.int64)
        frame = ((index * 7 + self.t) & 255).astype(np.uint8)
        return {"frame": frame.tobytes(), "frame_shape": [210, 160, 3]}
`;

const dir = mkdtempSync(join(tmpdir(), "transport-render-frames-"));
const schemaPath = join(dir, "cartpole_frames.toml");
const moduleJs = join(dir, "painter.js");
writeFileSync(schemaPath, SCHEMA);
writeFileSync(moduleJs, PAINTER_JS);
writeFileSync(join(dir, "render_frames_painter.py"), PAINTER_PY);
// the Node CLI compiles a .toml schema with transport-schema (the project's venv)
const SCHEMA_CLI = join(ROOT, ".venv", "bin", "transport-schema");
if (existsSync(SCHEMA_CLI)) process.env["TRANSPORT_SCHEMA_CLI"] ??= SCHEMA_CLI;
process.env["PYTHONPATH"] = dir + (process.env["PYTHONPATH"] ? `:${process.env["PYTHONPATH"]}` : "");

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

function painted(t: number): Uint8Array {
  const frame = new Uint8Array(210 * 160 * 3);
  for (let i = 0; i < frame.length; i++) frame[i] = (i * 7 + t) & 255;
  return frame;
}

async function start(lang: "node" | "python", url: string, env: string): Promise<ServerProcess> {
  const args = ["--env", env, "--schema", schemaPath, "--num-envs", "2"];
  const server = await ServerProcess.start(lang, url, ...args);
  servers.push(server);
  return server;
}

const LANGS: Array<{ lang: "node" | "python"; env: string }> = [
  { lang: "node", env: `${moduleJs}:Painter` },
  ...(HAVE_PYTHON ? [{ lang: "python" as const, env: "render_frames_painter:Painter" }] : []),
];

describe("frames over shm:// (Node client)", () => {
  for (const { lang, env } of LANGS) {
    for (const backend of ["shm", "unix"]) {
      test(`${lang} server, ${backend}: actN 2 without a mask, a 210x160x3 frame from observe()`, async () => {
        const id = randomBytes(5).toString("hex");
        const url = backend === "shm" ? `shm://render-frames-${id}` : `unix://${join(dir, `s-${id}.sock`)}`;
        const server = await start(lang, url, env);
        const client = await connect(server.url);
        try {
          const spaces = await client.spaces();
          assert.equal(spaces.obsN, 4);
          assert.equal(spaces.actN, 2);
          assert.equal("spaces" in client.serverInfo, false);
          await client.reset(7n);
          for (const action of [0, 1, 1]) await client.step([action, action]);
          const { infos } = await client.observe();
          assert.equal(infos.length, 2);
          for (const info of infos) {
            assert.deepEqual(info["frame_shape"], [210, 160, 3]);
            const frame = info["frame"] as Uint8Array;
            assert.equal(frame.byteLength, 210 * 160 * 3);
            assert.deepEqual(Buffer.from(frame).equals(Buffer.from(painted(3))), true);
          }
          await client.step([0, 0]); // steps go on after a render
          const again = await client.observe();
          assert.equal(Buffer.from(again.infos[1]?.["frame"] as Uint8Array).equals(Buffer.from(painted(4))), true);
          if (backend === "shm") assert.ok(existsSync(`/dev/shm/transport-${url.slice(6)}${SIDE_SUFFIX}`));
        } finally {
          await client.close();
          await server.stop();
        }
        if (backend === "shm") assert.equal(existsSync(`/dev/shm/transport-${url.slice(6)}${SIDE_SUFFIX}`), false);
      });
    }
  }

  test("a small info map stays in its slot (no side segment)", async () => {
    const url = `shm://render-frames-${randomBytes(5).toString("hex")}`;
    const server = await start("node", url, `${moduleJs}:Counter`);
    const client = await connect(server.url);
    try {
      await client.reset();
      await client.step([1, 1]);
      const { infos } = await client.observe();
      assert.deepEqual(infos, [{ count: 1 }, { count: 1 }]);
      assert.equal(existsSync(`/dev/shm/transport-${url.slice(6)}${SIDE_SUFFIX}`), false);
    } finally {
      await client.close();
      await server.stop();
    }
  });

  test("INFO_SIDE is no real info length", () => {
    assert.ok(INFO_SIDE > 256);
  });
});
