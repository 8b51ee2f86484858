// A bare Node `http` server for the raw http baseline: answers every POST with N zero bytes.
// Usage: node bare_http_server.js PORT SIZE   (prints "ready" once listening)
"use strict";
const http = require("http");
const port = Number(process.argv[2]);
const reply = Buffer.alloc(Number(process.argv[3] || 2557));
const server = http.createServer((req, res) => {
  req.on("data", () => {});
  req.on("end", () => {
    res.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": reply.length });
    res.end(reply);
  });
});
server.keepAliveTimeout = 60000;
server.on("connection", (socket) => socket.setNoDelay(true));
server.listen(port, "127.0.0.1", () => console.log("ready"));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
