/**
 * A schema loaded at run time, no build step (issue 12 item 9): a compiled IR file
 * (`transport-schema inspect my.toml --json > my.schema.json`), a schema source `.toml` (compiled
 * by the Python tool `transport-schema`, which must be on PATH, or named by TRANSPORT_SCHEMA_CLI),
 * or a generated module's path. Plain JavaScript envs use it instead of generated TypeScript.
 *
 * A path that is not a regular file (a directory, a FIFO, a device) or is larger than
 * `MAX_SCHEMA_FILE_BYTES` is refused before anything reads it, with the words of the Python
 * loader (transport/schema/compiler.py): a FIFO cannot hang the caller, `/dev/zero` cannot
 * exhaust its memory.
 */

import { execFileSync } from "node:child_process";
import { type Stats, existsSync, readFileSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { type SchemaModule, loadSchema } from "./codec";
import { SchemaError } from "./errors";
import { type SchemaJson, parseIrText } from "./ir";
import { schemaFromPath } from "./runtime/pool";

/** The largest schema file read (4 MiB), the Python loader's `MAX_SCHEMA_FILE_BYTES`. */
export const MAX_SCHEMA_FILE_BYTES = 4 << 20;

/** What a non-regular file is, in the words of the refusal. */
function kindOf(info: Stats): string {
  if (info.isDirectory()) return "not a regular file (a directory)";
  if (info.isFIFO()) return "not a regular file (a FIFO)";
  if (info.isSocket()) return "not a regular file (a socket)";
  if (info.isCharacterDevice() || info.isBlockDevice()) return "not a regular file (a device)";
  return "not a regular file";
}

/** The C library's text of an errno code, as Python's `strerror` words it. */
const STRERROR: Readonly<Record<string, string>> = {
  ENOENT: "No such file or directory",
  EACCES: "Permission denied",
  ENOTDIR: "Not a directory",
  ELOOP: "Too many levels of symbolic links",
  ENAMETOOLONG: "File name too long",
};

/**
 * Refuse, without opening it, what is not a readable schema file: a missing path, a directory,
 * a FIFO, a device, a socket or a file over `MAX_SCHEMA_FILE_BYTES` (a `SchemaError`
 * `PATH: cannot read schema: ...`, the Python loader's message).
 */
export function checkSchemaFile(path: string): void {
  let info: Stats;
  try {
    info = statSync(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? "";
    const reason = STRERROR[code] ?? (error as Error).message.split("\n", 1)[0];
    throw new SchemaError(`${path}: cannot read schema: ${reason}`);
  }
  if (!info.isFile()) throw new SchemaError(`${path}: cannot read schema: ${kindOf(info)}`);
  if (info.size > MAX_SCHEMA_FILE_BYTES) {
    throw new SchemaError(
      `${path}: cannot read schema: ${info.size} bytes, over the ${MAX_SCHEMA_FILE_BYTES}-byte limit of a schema file`,
    );
  }
}

/**
 * A compiled IR file (`transport-schema inspect FILE.toml --json`), refused with a `SchemaError`
 * `PATH: ...` by the rules and words of Python's `load_schema` (ir.ts `parseIrText`,
 * `checkIrJson`, the fingerprint, `checkIrLayout`).
 */
function loadIrFile(path: string): SchemaModule {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? "";
    throw new SchemaError(`${path}: cannot read schema: ${STRERROR[code] ?? (error as Error).message.split("\n", 1)[0]}`);
  }
  try {
    return loadSchema(parseIrText(text.replace(/\r\n?/g, "\n")) as SchemaJson);
  } catch (error) {
    if (error instanceof SchemaError) throw new SchemaError(`${path}: ${error.message}`);
    throw error;
  }
}

/** The schema at `path` (`.json` IR, `.toml` source, or a generated module), fingerprint-checked. */
export function loadSchemaFile(path: string): SchemaModule {
  const full = resolve(path);
  // a file there (any name: require() would read /dev/zero forever), or a .json/.toml path
  if (existsSync(full) || full.endsWith(".json") || full.endsWith(".toml")) checkSchemaFile(path);
  if (full.endsWith(".json")) return loadIrFile(path);
  if (!full.endsWith(".toml")) return schemaFromPath(full);
  const cli = process.env["TRANSPORT_SCHEMA_CLI"] ?? "transport-schema";
  let text: string;
  try {
    // the path as given (the tool's messages then name it as the caller did); never an option
    const arg = path.startsWith("-") ? `./${path}` : path;
    text = execFileSync(cli, ["inspect", arg, "--json"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
      maxBuffer: 16 * MAX_SCHEMA_FILE_BYTES,
    });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      throw new SchemaError(
        `${path}: cannot compile a .toml schema: ${cli} is not on PATH (install the Python package, set ` +
          "TRANSPORT_SCHEMA_CLI, or pass the IR: transport-schema inspect FILE.toml --json > FILE.json)",
      );
    }
    const stderr = (error as { stderr?: string }).stderr?.trim() ?? "";
    // the tool's own one-line refusal names the file already: pass it on without its prefix
    const refusal = /^transport-schema(?: inspect)?: error: (.*)$/m.exec(stderr);
    if (refusal !== null) throw new SchemaError(refusal[1] as string);
    const detail = (stderr || (error as Error).message).split("\n", 1)[0];
    throw new SchemaError(`${path}: ${cli} inspect --json failed (compile it to JSON first, or install the Python package): ${detail}`);
  }
  return loadSchema(JSON.parse(text) as SchemaJson);
}
