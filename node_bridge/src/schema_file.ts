/**
 * A schema loaded at run time, no build step (issue 12 item 9): a compiled IR file
 * (`transport-schema inspect my.toml --json > my.schema.json`), a schema source `.toml` (compiled
 * by the Python tool `transport-schema`, which must be on PATH, or named by TRANSPORT_SCHEMA_CLI),
 * or a generated module's path. Plain JavaScript envs use it instead of generated TypeScript.
 */

import { execFileSync } from "node:child_process";
import { resolve } from "node:path";
import { type SchemaModule, loadSchema } from "./codec";
import { SchemaError } from "./errors";
import type { SchemaJson } from "./ir";
import { schemaFromPath } from "./runtime/pool";

/** The schema at `path` (`.json` IR, `.toml` source, or a generated module), fingerprint-checked. */
export function loadSchemaFile(path: string): SchemaModule {
  const full = resolve(path);
  if (!full.endsWith(".toml")) return schemaFromPath(full);
  const cli = process.env["TRANSPORT_SCHEMA_CLI"] ?? "transport-schema";
  let text: string;
  try {
    text = execFileSync(cli, ["inspect", full, "--json"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (error) {
    const detail = (error as { stderr?: string }).stderr?.trim() || (error as Error).message;
    throw new SchemaError(`${path}: ${cli} inspect --json failed (compile it to JSON first, or install the Python package): ${detail}`);
  }
  return loadSchema(JSON.parse(text) as SchemaJson);
}
