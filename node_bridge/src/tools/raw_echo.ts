/**
 * A bare echo server for transport-probe's raw floors (transport/probe/raw.py): no protocol, no
 * env, the same bytes as a probe row over the same Node socket stack.
 *
 *   node dist/tools/raw_echo.js unix PATH REQUEST_BYTES RESPONSE_BYTES
 *   node dist/tools/raw_echo.js zmq  ipc://PATH|tcp://HOST:PORT REQUEST_BYTES RESPONSE_BYTES
 *   node dist/tools/raw_echo.js http PORT REQUEST_BYTES RESPONSE_BYTES
 *
 * Prints `ready ADDRESS` once it listens; serves until SIGTERM, then removes its socket file.
 */

import { createServer as createHttpServer } from "node:http";
import { type Socket, createServer } from "node:net";
import { unlinkSync } from "node:fs";
import { Router } from "zeromq";

function removeFile(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // already gone
  }
}

function serveUnix(path: string, requestBytes: number, response: Buffer): void {
  const server = createServer((socket: Socket) => {
    let pending = 0;
    socket.on("data", (chunk: Buffer) => {
      pending += chunk.length;
      while (pending >= requestBytes) {
        pending -= requestBytes;
        socket.write(response);
      }
    });
    socket.on("error", () => socket.destroy());
  });
  server.listen(path, () => console.log(`ready ${path}`));
  process.on("SIGTERM", () => {
    server.close();
    removeFile(path);
    process.exit(0);
  });
}

async function serveZmq(address: string, response: Buffer): Promise<void> {
  const router = new Router({ linger: 0 });
  // the handler first: a SIGTERM right after "ready" must not find the default action (which
  // ends the process without removing the socket file)
  process.on("SIGTERM", () => {
    router.close();
    if (address.startsWith("ipc://")) removeFile(address.slice("ipc://".length));
    process.exit(0);
  });
  await router.bind(address);
  console.log(`ready ${address}`);
  for await (const [identity] of router) {
    await router.send([identity as Buffer, response]);
  }
}

function serveHttp(port: number, response: Buffer): void {
  const server = createHttpServer((request, reply) => {
    request.on("data", () => undefined);
    request.on("end", () => {
      reply.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": response.length });
      reply.end(response);
    });
  });
  server.keepAliveTimeout = 60_000;
  server.on("connection", (socket: Socket) => socket.setNoDelay(true));
  server.listen(port, "127.0.0.1", () => console.log(`ready http://127.0.0.1:${port}`));
  process.on("SIGTERM", () => server.close(() => process.exit(0)));
}

function main(argv: readonly string[]): void {
  const [kind, address, requestText, responseText] = argv;
  const requestBytes = Number(requestText);
  const responseBytes = Number(responseText);
  if (address === undefined || !Number.isInteger(requestBytes) || !Number.isInteger(responseBytes)) {
    process.stderr.write("usage: raw_echo.js unix|zmq|http ADDRESS REQUEST_BYTES RESPONSE_BYTES\n");
    process.exit(2);
  }
  const response = Buffer.alloc(responseBytes);
  if (kind === "unix") serveUnix(address, requestBytes, response);
  else if (kind === "zmq") void serveZmq(address, response);
  else if (kind === "http") serveHttp(Number(address), response);
  else {
    process.stderr.write(`unknown kind ${String(kind)}\n`);
    process.exit(2);
  }
}

main(process.argv.slice(2));
