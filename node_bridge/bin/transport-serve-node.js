#!/usr/bin/env node
// The package's bin: a committed, executable shim (issue 26 item 5). It lives outside dist/, so
// a rebuild (which recreates dist/ with the compiler's 0644 files) never drops its execute bit.
require("../dist/cli/serve.js");
