/**
 * The vector runner: one `VectorEnv` steps all N envs of a client in one call (env.ts). The
 * runtime (core.ts) keeps every per-env rule as for N one-env objects (checks, auto-reset,
 * finals, seeds, recovery); this runner turns its per-env ops into at most one `resetEnvs` and
 * one `stepEnvs` call, each with the envs that do it (`ids`), and copies the result rows
 * of those envs from the columns into the records at once: field by field, an array field as one
 * byte copy per env, a scalar through one DataView write per env; nothing is allocated per env.
 * Python: the vector runner of transport/runtime.
 */

import type { SchemaModule } from "../codec";
import { TransportError } from "../errors";
import { ErrorCode, RequestError } from "../protocol";
import type { FieldJson } from "../ir";
import { type Failure, Op, type Records, type Runner, bodyCodec, elementType } from "./core";
import { type Column, type RunnerColumns, type Spaces, type VectorEnv, asyncMethodText, isThenable } from "./env";

/** How a scalar field's column is written into a row (one monomorphic loop per kind). */
const enum Kind {
  /** Copied as bytes: array and struct fields (`rows[i]`). */
  BYTES = 0,
  /** One byte (u8, i8, bool). */
  BYTE = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  F64 = 7,
  U64 = 8,
  I64 = 9,
}

const SCALAR_KINDS: Readonly<Record<string, Kind>> = {
  u8: Kind.BYTE,
  i8: Kind.BYTE,
  bool: Kind.BYTE,
  u16: Kind.U16,
  i16: Kind.I16,
  u32: Kind.U32,
  i32: Kind.I32,
  f32: Kind.F32,
  f64: Kind.F64,
  u64: Kind.U64,
  i64: Kind.I64,
};

const COLUMN_TYPES: Readonly<Record<string, new (length: number) => Column>> = {
  f32: Float32Array,
  f64: Float64Array,
  u8: Uint8Array,
  bool: Uint8Array,
  i8: Int8Array,
  u16: Uint16Array,
  i16: Int16Array,
  u32: Uint32Array,
  i32: Int32Array,
  u64: BigUint64Array,
  i64: BigInt64Array,
};

const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** One result field: its column, and how a row gets it. */
interface ColumnPlan {
  readonly name: string;
  /** Offset in the result record. */
  readonly at: number;
  /** Elements per env. */
  readonly count: number;
  readonly column: Column;
  /** How a row gets it. */
  readonly kind: Kind;
  /** Env i's bytes of the column (array and struct fields). */
  readonly rows: readonly Uint8Array[] | null;
}

/** The columns of N results of a schema's result struct (the `VectorResults` a vector env writes). */
export class ResultColumns implements RunnerColumns {
  readonly numEnvs: number;
  /** The result record's size (bytes per row). */
  readonly size: number;
  #columns: Readonly<Record<string, Column>>;
  #plans: readonly ColumnPlan[];
  /** The columns live in a backend's memory (`adopt`): nothing is copied into its records. */
  #adopted = false;
  /** Failures reported with `fail` during the current call (null: none). */
  #failures: Failure[] | null = null;
  /** The `which` of the current call (null: every env), for `fail`'s check. */
  #which: Uint8Array | null = null;
  #dv: DataView | null = null;
  #dvBytes: Uint8Array | null = null;

  constructor(schema: SchemaModule, numEnvs: number) {
    const result = bodyCodec(schema, "STEP_RESP");
    this.numEnvs = numEnvs;
    this.size = result.size;
    const columns: Record<string, Column> = {};
    const plans: ColumnPlan[] = [];
    for (const field of schema.ir.structs[result.name]?.fields ?? []) {
      const plan = planOf(schema, field, numEnvs);
      columns[field.name] = plan.column;
      plans.push(plan);
    }
    this.#columns = columns;
    this.#plans = plans;
  }

  /** One typed array per result field, by name (env i's elements at [i * count, (i + 1) * count)). */
  get columns(): Readonly<Record<string, Column>> {
    return this.#columns;
  }

  /** The columns were re-pointed at a backend's memory (`adopt`). */
  get adopted(): boolean {
    return this.#adopted;
  }

  /**
   * Re-point every column at `bytes`: field `name`'s column becomes the typed array of its type
   * over `bytes[starts[name], + numEnvs x field size)` (an shm column region's result columns,
   * 64-byte aligned), with what the columns hold now copied there first. From then on the env
   * writes that memory itself and a backend copies nothing (docs/shm.md "Column layout"). Only
   * for an env that looks the columns up in every call (`VectorEnv.writesColumns`).
   */
  adopt(bytes: Uint8Array, starts: Readonly<Record<string, number>>): void {
    const columns: Record<string, Column> = {};
    const plans: ColumnPlan[] = [];
    for (const plan of this.#plans) {
      const start = starts[plan.name];
      const old = plan.column;
      const make = old.constructor as new (buffer: ArrayBufferLike, byteOffset: number, length: number) => Column;
      const byteOffset = bytes.byteOffset + (start ?? -1);
      if (start === undefined || start < 0 || start + old.byteLength > bytes.byteLength || byteOffset % old.BYTES_PER_ELEMENT !== 0) {
        throw new TransportError(`result column ${plan.name}: no aligned room for ${old.byteLength} bytes at ${String(start)}`);
      }
      const column = new make(bytes.buffer, byteOffset, old.length);
      (column as Uint8Array).set(old as Uint8Array); // same element type: a plain copy
      columns[plan.name] = column;
      const rows = plan.rows === null ? null : rowViews(column, plan.rows[0]?.byteLength ?? 0, this.numEnvs);
      plans.push({ ...plan, column, rows });
    }
    this.#columns = columns;
    this.#plans = plans;
    this.#adopted = true;
  }

  fail(index: number, error: unknown): void {
    if (!Number.isInteger(index) || index < 0 || index >= this.numEnvs) {
      throw new TransportError(`fail(${String(index)}): env index outside 0..${this.numEnvs - 1}`);
    }
    if (this.#which !== null && !this.#which[index]) {
      throw new TransportError(`fail(${index}): env ${index} is not one of this call's envs`);
    }
    (this.#failures ??= []).push([index, error]);
  }

  /** Start a call over `which`: forget earlier failures. */
  begin(which: Uint8Array | null): void {
    this.#which = which;
    this.#failures = null;
  }

  /** The failures `fail` reported since `begin` (null: none). */
  takeFailures(): Failure[] | null {
    const failures = this.#failures;
    this.#failures = null;
    this.#which = null;
    return failures;
  }

  /**
   * Copy the rows of the envs with `rows[i]` set (null: every env) from the columns into
   * `out`'s records, field by field: one pass per field over the envs. `ats` is scratch of N.
   */
  scatter(rows: Uint8Array | null, out: Records, ats: Float64Array): void {
    const n = this.numEnvs;
    const bytes = out.bytes;
    if (bytes !== this.#dvBytes) {
      this.#dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      this.#dvBytes = bytes;
    }
    const dv = this.#dv as DataView;
    let any = false;
    for (let i = 0; i < n; i++) {
      if (rows !== null && !rows[i]) continue;
      ats[i] = out.at(i);
      any = true;
    }
    if (!any) return;
    const plans = this.#plans;
    for (let f = 0; f < plans.length; f++) {
      const plan = plans[f] as ColumnPlan;
      const at = plan.at;
      switch (plan.kind) {
        case Kind.BYTES: {
          const views = plan.rows as readonly Uint8Array[];
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) bytes.set(views[i] as Uint8Array, (ats[i] as number) + at);
          break;
        }
        case Kind.BYTE: {
          const c = plan.column as Uint8Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) bytes[(ats[i] as number) + at] = c[i] as number;
          break;
        }
        case Kind.U16: {
          const c = plan.column as Uint16Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setUint16((ats[i] as number) + at, c[i] as number, true);
          break;
        }
        case Kind.I16: {
          const c = plan.column as Int16Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setInt16((ats[i] as number) + at, c[i] as number, true);
          break;
        }
        case Kind.U32: {
          const c = plan.column as Uint32Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setUint32((ats[i] as number) + at, c[i] as number, true);
          break;
        }
        case Kind.I32: {
          const c = plan.column as Int32Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setInt32((ats[i] as number) + at, c[i] as number, true);
          break;
        }
        case Kind.F32: {
          const c = plan.column as Float32Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setFloat32((ats[i] as number) + at, c[i] as number, true);
          break;
        }
        case Kind.F64: {
          const c = plan.column as Float64Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setFloat64((ats[i] as number) + at, c[i] as number, true);
          break;
        }
        case Kind.U64: {
          const c = plan.column as BigUint64Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setBigUint64((ats[i] as number) + at, c[i] as bigint, true);
          break;
        }
        case Kind.I64: {
          const c = plan.column as BigInt64Array;
          for (let i = 0; i < n; i++) if (rows === null || rows[i]) dv.setBigInt64((ats[i] as number) + at, c[i] as bigint, true);
          break;
        }
      }
    }
  }
}

function planOf(schema: SchemaModule, field: FieldJson, numEnvs: number): ColumnPlan {
  const type = elementType(schema, field);
  const make = COLUMN_TYPES[type];
  if (make === undefined) {
    // a struct (or array of structs): its encoded bytes
    const column = new Uint8Array(numEnvs * field.size);
    return { name: field.name, at: field.offset, count: field.size, column, kind: Kind.BYTES, rows: rowViews(column, field.size, numEnvs) };
  }
  const count = field.count;
  const column = new make(numEnvs * count);
  if (count === 1 && !field.type.includes("[")) {
    return { name: field.name, at: field.offset, count, column, kind: SCALAR_KINDS[type] as Kind, rows: null };
  }
  if (!LITTLE_ENDIAN_HOST) throw new TransportError("vector envs need a little-endian host (array columns are copied as bytes)");
  return { name: field.name, at: field.offset, count, column, kind: Kind.BYTES, rows: rowViews(column, field.size, numEnvs) };
}

/** Env i's `size` bytes of `column`, for each env (made once: a scatter allocates nothing). */
function rowViews(column: Column, size: number, numEnvs: number): Uint8Array[] {
  const views: Uint8Array[] = [];
  for (let i = 0; i < numEnvs; i++) views.push(new Uint8Array(column.buffer, column.byteOffset + i * size, size));
  return views;
}

/** A client's N envs in one `VectorEnv`, stepped in this thread. */
export class VectorRunner implements Runner {
  readonly numEnvs: number;
  /** One env of a vector env cannot be made alone: recovery resets it, never recreates. */
  readonly canRecreate = false;
  readonly wholeBatchOnly = false;
  readonly stepSeats = null;
  readonly env: VectorEnv;
  /** The env resets its ended envs itself when stepped under NEXT_STEP (`autoresetNextStep`). */
  readonly autoresetNextStep: boolean;
  /** The env steps subsets of its envs (false: every env at once or none). */
  readonly stepsSubsets: boolean;
  /** The columns the env writes (the runtime reads masks and episode ends from them). */
  readonly columns: ResultColumns;
  /** The env looks its columns up in every call (`VectorEnv.writesColumns`): they may be adopted. */
  readonly writesColumns: boolean;
  /** The env steps on threads of its own (`VectorEnv.stepsOnOwnThreads`). */
  readonly stepsOnOwnThreads: boolean;
  readonly #owned: boolean;
  /** Scratch: the ids of a call, and its 0/1 mask (for `fail`'s check). */
  readonly #ids: Int32Array;
  readonly #which: Uint8Array;
  /** The envs whose rows are copied out (their op done, not failed). */
  readonly #rows: Uint8Array;
  readonly #ats: Float64Array;
  /** The last `infos()` (OBSERVE asks every env's in turn). */
  #infos: ReadonlyArray<Record<string, unknown>> | null = null;

  /** `owned`: the runner made the env (its `close()` is called with the runner's). */
  constructor(env: VectorEnv, schema: SchemaModule, owned: boolean) {
    const n = env.numEnvs;
    if (!Number.isInteger(n) || n < 1) throw new TransportError(`a vector env's numEnvs must be an integer of at least 1, not ${String(n)}`);
    this.env = env;
    this.numEnvs = n;
    this.autoresetNextStep = env.autoresetNextStep === true;
    this.stepsSubsets = env.stepsSubsets !== false;
    if (!this.stepsSubsets && !this.autoresetNextStep) {
      throw new TransportError(
        "a vector env that steps only all its envs together (stepsSubsets false) must reset ended envs itself " +
          "(autoresetNextStep true): NEXT_STEP steps the others",
      );
    }
    this.columns = new ResultColumns(schema, n);
    this.writesColumns = env.writesColumns === true;
    this.stepsOnOwnThreads = env.stepsOnOwnThreads === true;
    this.#owned = owned;
    this.#ids = new Int32Array(n);
    this.#which = new Uint8Array(n);
    this.#rows = new Uint8Array(n);
    this.#ats = new Float64Array(n);
  }

  spaces(): Spaces {
    return this.env.spaces();
  }

  run(ops: Uint8Array, actions: Float64Array, seeds: ReadonlyArray<bigint | null>, out: Records): Failure[] | null {
    const n = this.numEnvs;
    const env = this.env;
    const columns = this.columns;
    this.#infos = null;
    let steps = 0;
    for (let i = 0; i < n; i++) if (ops[i] === Op.STEP) steps++;
    if (steps > 0 && steps < n && !this.stepsSubsets) {
      const first = ops.findIndex((op) => op === Op.STEP);
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `env ${first}: this vector env steps all its ${n} envs together (stepsSubsets is false)`,
      );
    }
    if (steps === n) {
      // the common request: every env steps (no ids to gather)
      const failures = this.#call(null, null, "stepEnvs", () => env.stepEnvs(actions, null, columns));
      if (failures === null) {
        if (!this.#inPlace(out)) columns.scatter(null, out, this.#ats);
        return null;
      }
      return this.#finish(failures, ops, out);
    }
    let failures: Failure[] | null = null;
    const resets = this.#gather(ops, Op.RESET, Op.RECREATE);
    if (resets !== null) {
      const resetSeeds = Array.from(resets, (i) => seeds[i] ?? null);
      failures = this.#call(resets, failures, "resetEnvs", () => env.resetEnvs(resets, resetSeeds, columns));
    }
    const stepped = steps ? this.#gather(ops, Op.STEP, Op.STEP) : null;
    if (stepped !== null) failures = this.#call(stepped, failures, "stepEnvs", () => env.stepEnvs(actions, stepped, columns));
    return this.#finish(failures, ops, out);
  }

  /** `out` takes its results from this runner's columns (adopted: the env wrote them in the
   * region; else the records copy env i's as it is `written`): nothing to scatter. */
  #inPlace(out: Records): boolean {
    return out.resultColumns === this.columns;
  }

  /** The sorted ids of the envs whose op is `a` or `b` (a view of scratch; null: none). */
  #gather(ops: Uint8Array, a: number, b: number): Int32Array | null {
    const ids = this.#ids;
    let count = 0;
    for (let i = 0; i < this.numEnvs; i++) {
      const op = ops[i];
      if (op === a || op === b) ids[count++] = i;
    }
    return count === 0 ? null : ids.slice(0, count);
  }

  /** Scatter the rows of the envs that did an op and did not fail; the failures, one per env, in index order. */
  #finish(failures: Failure[] | null, ops: Uint8Array, out: Records): Failure[] | null {
    const rows = this.#rows;
    for (let i = 0; i < this.numEnvs; i++) rows[i] = ops[i] === Op.NONE ? 0 : 1;
    if (failures !== null) for (const [i] of failures) rows[i] = 0;
    if (!this.#inPlace(out)) this.columns.scatter(rows, out, this.#ats);
    if (failures === null) return null;
    const seen = new Uint8Array(this.numEnvs);
    const unique: Failure[] = [];
    for (const failure of failures) {
      if (seen[failure[0]]) continue;
      seen[failure[0]] = 1;
      unique.push(failure);
    }
    return unique.sort((x, y) => x[0] - y[0]);
  }

  /**
   * One env call over `ids` (null: every env); its failures added to `failures`. A call that
   * returns a Promise (an `async stepEnvs`) fails every env of it: the runtime reads the
   * columns as the call returns and never awaits one (`asyncMethodText`).
   */
  #call(ids: Int32Array | null, failures: Failure[] | null, method: string, call: () => unknown): Failure[] | null {
    const columns = this.columns;
    const which = this.#which;
    if (ids !== null) {
      which.fill(0);
      for (let k = 0; k < ids.length; k++) which[ids[k] as number] = 1;
    }
    columns.begin(ids === null ? null : which);
    try {
      const returned = call();
      if (isThenable(returned)) throw new RequestError(ErrorCode.ENV_ERROR, asyncMethodText(method, returned));
    } catch (error) {
      columns.takeFailures();
      const every: Failure[] = failures ?? [];
      if (ids === null) for (let i = 0; i < this.numEnvs; i++) every.push([i, error]);
      else for (let k = 0; k < ids.length; k++) every.push([ids[k] as number, error]);
      return every;
    }
    const reported = columns.takeFailures();
    if (reported === null) return failures;
    return failures === null ? reported : [...failures, ...reported];
  }

  takeReplaced(): string | null {
    return null;
  }

  /** Env `index`'s map of the env's `infos()` (asked once per OBSERVE), `{}` without it. */
  info(index: number): Record<string, unknown> {
    const infos = this.env.infos;
    if (infos === undefined) return {};
    if (this.#infos === null) this.#infos = infos.call(this.env);
    return this.#infos[index] ?? {};
  }

  close(): void {
    if (!this.#owned) return; // a shared vector env belongs to the server
    const close = this.env.close;
    if (typeof close === "function") {
      try {
        close.call(this.env);
      } catch {
        // closing is best effort
      }
    }
  }
}
