/**
 * connect()'s arguments and what a client says about a mistake (real servers: the Node CLI, a
 * web server that is not a transport server).
 *
 * Before: `timeoutMs: Infinity` or 1e12 overflowed Node's timer (every request timed out at
 * once), "5000" was concatenated to a deadline, 0 / -1 / NaN were taken; `schema: {foo: 1}` was
 * a raw "Cannot use 'in' operator" (unix), on http a misleading ConnectError; a url that is not
 * a string "Cannot read properties of undefined (reading 'indexOf')"; `http://h:notaport` said
 * "takes no path", `shm://x?num_envs=abc` "must be >= 1", `ftp://x` named no URL; a web server
 * on http:// was a RemoteError INTERNAL the peer never sent, a zmq socket file on unix:// a
 * PeerGoneError; stepMulti's count error named neither the method nor the URL; an shm view
 * showed the slot's own fields (command, sem_action_ready, ...) next to the result's.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { ActionError, ConnectError, RegionInUseError, SchemaError } from "../errors";
import * as pac_env from "../generated/pac_env";
import { connect } from "../index";
import { ServerProcess } from "../testing/servers";

const tag = (): string => `${process.pid}-${randomBytes(3).toString("hex")}`;

let unixServer: ServerProcess;
let httpServer: ServerProcess;
before(async () => {
  unixServer = await ServerProcess.start("node", `unix://${join(tmpdir(), `cmis-${tag()}.sock`)}`, "--env", "echo", "--num-envs", "2");
  httpServer = await ServerProcess.start("node", "http://127.0.0.1:0", "--env", "echo", "--num-envs", "2");
});
after(async () => {
  await unixServer.stop();
  await httpServer.stop();
});

describe("timeoutMs", () => {
  for (const bad of [0, -1, NaN, -Infinity]) {
    test(`${bad} is a RangeError naming timeoutMs`, async () => {
      await assert.rejects(connect(unixServer.url, { timeoutMs: bad }), (error: unknown) => {
        assert.ok(error instanceof RangeError, String(error));
        assert.match(error.message, new RegExp(`timeoutMs .*not ${String(bad)}`));
        return true;
      });
    });
  }

  for (const bad of ["5000", 5000n, true, {}] as unknown[]) {
    test(`${typeof bad} ${String(bad)} is a TypeError naming timeoutMs`, async () => {
      await assert.rejects(connect(unixServer.url, { timeoutMs: bad as number }), (error: unknown) => {
        assert.ok(error instanceof TypeError, String(error));
        assert.match(error.message, /timeoutMs must be a number of milliseconds > 0/);
        return true;
      });
    });
  }

  for (const none of [Infinity, 1e12, 2 ** 31, null]) {
    test(`${String(none)} means no deadline: requests are answered (no timer overflow)`, async () => {
      for (const url of [unixServer.url, httpServer.url]) {
        const client = await connect(url, { timeoutMs: none });
        try {
          await client.reset(1n);
          await client.step([0, 0]);
          assert.ok(await client.health());
        } finally {
          await client.close();
        }
      }
    });
  }
});

describe("schema", () => {
  for (const [name, bad] of [
    ["an object that is no schema", { foo: 1 }],
    ["a number", 42],
    ["an array", [pac_env.SCHEMA]],
  ] as Array<[string, unknown]>) {
    test(`${name} is a TypeError naming schema, on unix and http`, async () => {
      for (const url of [unixServer.url, httpServer.url]) {
        await assert.rejects(connect(url, { schema: bad as typeof pac_env.SCHEMA }), (error: unknown) => {
          assert.ok(error instanceof TypeError, `${url}: ${String(error)}`);
          assert.match(error.message, /schema is a schema module .* or the path of a schema file, not /);
          return true;
        });
      }
    });
  }

  test("the generated module itself and a schema file's path are taken", async () => {
    for (const schema of [pac_env, pac_env.SCHEMA, join(__dirname, "..", "generated", "pac_env.js")]) {
      const client = await connect(unixServer.url, { schema });
      assert.equal(client.schema.fingerprint, pac_env.SCHEMA.fingerprint);
      await client.close();
    }
    await assert.rejects(connect(unixServer.url, { schema: join(tmpdir(), `no-such-schema-${tag()}.json`) }), SchemaError);
  });
});

describe("the URL", () => {
  for (const bad of [undefined, null, 42, {}]) {
    test(`${JSON.stringify(bad) ?? "undefined"} is a TypeError naming the url with an example`, async () => {
      await assert.rejects(connect(bad as unknown as string), (error: unknown) => {
        assert.ok(error instanceof TypeError, String(error));
        assert.match(error.message, /^connect\(url\): the url is a string such as "unix:\/\/\/tmp\/pac\.sock", not /);
        return true;
      });
    });
  }

  const cases: Array<[string, RegExp]> = [
    ["http://127.0.0.1:notaport", /^"http:\/\/127\.0\.0\.1:notaport" is not a valid http URL: port "notaport" is not a number/],
    ["shm://x?num_envs=abc", /^"shm:\/\/x\?num_envs=abc": bad parameter value \(num_envs "abc" is not an integer\)/],
    ["shm://x?num_envs=0", /num_envs must be >= 1/],
    ["ftp://x", /^ftp:\/\/x: no backend for ftp:\/\/ \(known: http:\/\/, shm:\/\/, unix:\/\/, zmq\+ipc:\/\/, zmq\+tcp:\/\/\)/],
    ["auto://x", /^auto:\/\/x: no backend for auto:\/\/ .*auto:\/\/ is Python-only: the Node client does not support it/],
  ];
  for (const [url, words] of cases) {
    test(`${url}: a ConnectError naming the cause`, async () => {
      await assert.rejects(connect(url, { timeoutMs: 300 }), (error: unknown) => {
        assert.ok(error instanceof ConnectError, String(error));
        assert.match(error.message, words);
        return true;
      });
    });
  }
});

describe("a peer that is not a transport server", () => {
  test("http: a web server's 501 page is a ConnectError saying so (with Content-Length, and chunked)", async () => {
    // python -m http.server's answer to a POST: 501 with an HTML page and its Content-Length
    const page = "<!DOCTYPE HTML><html><title>Error response</title></html>";
    const web = spawn(
      process.execPath,
      [
        "-e",
        `const http = require("node:http"); const page = ${JSON.stringify(page)};
         const a = http.createServer((q, s) => { q.resume(); s.writeHead(501, { "content-type": "text/html", "content-length": page.length }); s.end(page); });
         const b = http.createServer((q, s) => { q.resume(); s.writeHead(501, { "content-type": "text/html" }); s.end(page); });
         a.listen(0, "127.0.0.1", () => b.listen(0, "127.0.0.1", () =>
           console.log("ready http://127.0.0.1:" + a.address().port + " http://127.0.0.1:" + b.address().port)));`,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    try {
      const line = await new Promise<string>((ok) => web.stdout.once("data", (chunk: Buffer) => ok(chunk.toString().trim())));
      for (const url of line.split(" ").slice(1)) {
        await assert.rejects(connect(url, { timeoutMs: 5000 }), (error: unknown) => {
          assert.ok(error instanceof ConnectError, String(error));
          assert.match(error.message, new RegExp(`^${url}: the peer answered HTTP 501 without a transport ERROR body: not a transport server\\?`));
          return true;
        });
      }
    } finally {
      web.kill();
    }
  });

  test("unix:// on a zmq server's socket file is a ConnectError hinting at the backend", async () => {
    const path = join(tmpdir(), `cmis-${tag()}.zmq`);
    const zmqServer = await ServerProcess.start("node", `zmq+ipc://${path}`, "--env", "echo");
    try {
      await assert.rejects(connect(`unix://${path}`, { timeoutMs: 5000 }), (error: unknown) => {
        assert.ok(error instanceof ConnectError, String(error));
        assert.match(error.message, /during the HELLO handshake \(not a transport server on this backend\?\)/);
        return true;
      });
    } finally {
      await zmqServer.stop();
    }
  });
});

test("stepMulti with the wrong count names the method, the URL and the seats", async () => {
  const client = await connect(unixServer.url);
  try {
    await assert.rejects(client.stepMulti([0, 1]), (error: unknown) => {
      assert.ok(error instanceof ActionError, String(error));
      assert.match(error.message, new RegExp(`^${unixServer.url}: stepMulti\\(\\) takes one action per seat: 8 .*got 2$`));
      return true;
    });
  } finally {
    await client.close();
  }
});

test("shm: a result view shows the result's fields only, as on every other backend", async () => {
  const server = await ServerProcess.start("node", `shm://cmis-${tag()}`, "--env", "echo", "--num-envs", "2");
  const client = await connect(server.url);
  try {
    const view = ((await client.reset(7n)) as unknown[])[0] as Record<string, unknown>;
    const shown = new Set<string>();
    for (let proto = Object.getPrototypeOf(view); proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
      for (const name of Object.getOwnPropertyNames(proto)) if (name !== "constructor") shown.add(name);
    }
    const fields = pac_env.SCHEMA.ir.structs["StepResult"]?.fields.map((f) => f.name) ?? [];
    assert.deepEqual([...shown].sort(), [...fields].sort());
    assert.equal(view["command"], undefined);
    assert.ok(view["observation"] instanceof Float32Array);
  } finally {
    await client.close();
    await server.stop();
  }
});

test("shm: a second client of a leased region is told the region is in use, not to start a server", async () => {
  const server = await ServerProcess.start("node", `shm://cmis-${tag()}`, "--env", "echo", "--num-envs", "2");
  const first = await connect(server.url);
  try {
    await assert.rejects(connect(server.url, { timeoutMs: 5000 }), (error: unknown) => {
      assert.ok(error instanceof RegionInUseError, String(error));
      assert.equal(error.holder, process.pid);
      assert.match(error.message, /in use by this process: a region serves one client at a time/);
      assert.match(error.message, /close that client first/);
      assert.doesNotMatch(error.message, /is a server serving this URL/);
      return true;
    });
  } finally {
    await first.close();
    await server.stop();
  }
});
