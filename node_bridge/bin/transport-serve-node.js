#!/usr/bin/env node
// The package's bin: a committed, executable shim (issue 26 item 5). It lives outside dist/, so
// a rebuild (which recreates dist/ with the compiler's 0644 files) never drops its execute bit.
// serve.js knows it was run through this file by its name (require.main): its help and error
// lines then say transport-serve-node, not transport-serve (keep the name).
require("../dist/cli/serve.js");
