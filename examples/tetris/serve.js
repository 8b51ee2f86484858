#!/usr/bin/env node
// The Tetris env server: `node examples/tetris/serve.js unix:///tmp/tetris.sock [--num-envs N]
// [--seed S] [--max-steps M]` prints `ready URL`. The TypeScript source is
// node_bridge/src/examples/tetris.ts and tetris_server.ts; build node_bridge first
// (cd node_bridge && npm run build).
"use strict";
const path = require("node:path");

require(path.join(__dirname, "..", "..", "node_bridge", "dist", "examples", "tetris_server.js"))
  .run(process.argv.slice(2));
