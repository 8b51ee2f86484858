/**
 * ContractEnv: a deterministic env for any env schema, the server side of the contract suite
 * (transport/testing/contract_env.py is its Python twin: the same rules, identical bytes; the
 * rules are written out in that module's docstring).
 *
 * Results are a pure function of (seed, episode counter, step count, last action): every scalar
 * element of the result struct (nested structs and arrays included, depth first in declaration
 * order) is filled from a 32-bit hash; the action_mask, done, terminated and truncated role
 * fields follow the episode's rules. `step(POISON_ACTION)` throws (ENV_ERROR tests).
 * The bytes are written into a scratch record and decoded into the values the server encodes.
 */

import type { AnyStructCodec, SchemaModule } from "../codec";
import { type FieldJson, type SchemaJson, resolveField, SCALAR_SIZES } from "../ir";

/**
 * Observation length and number of discrete actions: the env interface's `Spaces`, declared
 * here by shape so that this file does not depend on where the env interface lives.
 */
export interface Spaces {
  readonly obsN: number;
  readonly actN: number;
}

/** The 32-bit golden-ratio constant that spreads consecutive inputs before hashing. */
export const GOLDEN = 0x9e3779b9;
/** A step with this action throws (always allowed by the mask). */
export const POISON_ACTION = 1;
/** Episodes longer than this many steps end by truncation at this step. */
export const TRUNCATE_AT = 5;
/** The action count of a schema whose result has no action_mask role field. */
export const DEFAULT_ACT_N = 16;
/** The `lastAction` a reset result is computed with. */
export const RESET_ACTION = 0xffffffff;

const ROLE_OVERRIDES = new Set(["action_mask", "done", "terminated", "truncated"]);

/** lowbias32: a 32-bit integer hash (Python: contract_env.mix32). */
export function mix32(input: number): number {
  let x = input >>> 0;
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d) >>> 0;
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b) >>> 0;
  x ^= x >>> 16;
  return x >>> 0;
}

interface Leaf {
  readonly offset: number;
  readonly count: number;
  readonly size: number;
  readonly kind: "int" | "float" | "bool" | "enum";
  readonly signed: boolean;
  readonly first: number;
  readonly role: string | null;
  readonly enumValues: readonly number[];
}

function leavesOf(ir: SchemaJson, structName: string): Leaf[] {
  const leaves: Leaf[] = [];
  let counter = 0;
  const walk = (name: string, base: number, top: boolean): void => {
    for (const field of ir.structs[name]?.fields ?? []) {
      const { element } = resolveField(ir, field);
      if (element.kind === "struct") {
        const inner = ir.structs[element.name];
        if (inner === undefined) throw new Error(`schema ${ir.name} has no struct ${element.name}`);
        for (let k = 0; k < field.count; k++) walk(element.name, base + field.offset + k * inner.size, false);
        continue;
      }
      const type = element.kind === "bool" ? "u8" : element.type;
      const role = top && field.role !== undefined && ROLE_OVERRIDES.has(field.role) ? field.role : null;
      leaves.push({
        offset: base + field.offset,
        count: field.count,
        size: SCALAR_SIZES[type],
        kind: element.kind,
        signed: type.startsWith("i"),
        first: counter,
        role,
        enumValues: element.kind === "enum" ? [...element.values].sort((a, b) => a - b) : [],
      });
      counter += field.count;
    }
  };
  walk(structName, 0, true);
  return leaves;
}

/** The codec of the schema's STEP_RESP body (the result struct). */
export function resultCodec(schema: SchemaModule): AnyStructCodec {
  const body = schema.messages.STEP_RESP?.body;
  const codec = body ? schema.structs[body] : undefined;
  if (codec === undefined) throw new Error(`schema ${schema.name}: STEP_RESP has no body struct`);
  return codec;
}

function roleField(schema: SchemaModule, struct: string, role: string): FieldJson | undefined {
  return schema.ir.structs[struct]?.fields.find((f) => f.role === role);
}

/** What `new ContractEnv(schema).spaces()` answers. */
export function contractSpaces(schema: SchemaModule): Spaces {
  const name = resultCodec(schema).name;
  const obs = roleField(schema, name, "observation");
  const mask = roleField(schema, name, "action_mask");
  return { obsN: obs?.count ?? 0, actN: mask?.count ?? DEFAULT_ACT_N };
}

/** The deterministic contract env for `schema` (an `Env<unknown>` by shape). */
export class ContractEnv {
  readonly schema: SchemaModule;
  readonly codec: AnyStructCodec;
  seed = 0n;
  episode = -1;
  stepCount = 0;
  lastAction = RESET_ACTION;
  episodeKey = 0;
  readonly #leaves: Leaf[];
  readonly #spaces: Spaces;
  readonly #scratch: Uint8Array;
  readonly #view: DataView;

  constructor(schema: SchemaModule) {
    this.schema = schema;
    this.codec = resultCodec(schema);
    this.#leaves = leavesOf(schema.ir, this.codec.name);
    this.#spaces = contractSpaces(schema);
    this.#scratch = new Uint8Array(this.codec.size);
    this.#view = new DataView(this.#scratch.buffer);
  }

  spaces(): Spaces {
    return this.#spaces;
  }

  reset(seed?: bigint): unknown {
    if (seed === undefined || seed === null) {
      this.episode += 1;
    } else {
      this.seed = BigInt.asUintN(64, BigInt(seed));
      this.episode = 0;
    }
    const lo = Number(this.seed & 0xffffffffn);
    const hi = Number(this.seed >> 32n);
    this.episodeKey = mix32(lo ^ mix32(hi ^ mix32(this.episode + GOLDEN)));
    this.stepCount = 0;
    this.lastAction = RESET_ACTION;
    return this.#result();
  }

  /** An array action (Box, MultiDiscrete) counts as its first element, as in Python's twin. */
  step(action: number | ArrayLike<number>): unknown {
    const value = typeof action === "number" ? action : Number(action[0]);
    if (value === POISON_ACTION) throw new Error(`poison action ${POISON_ACTION} (the contract env raises)`);
    this.stepCount += 1;
    this.lastAction = value >>> 0;
    return this.#result();
  }

  /** [terminated, truncated] of the current step. */
  episodeEnd(): [boolean, boolean] {
    const length = 2 + (this.episodeKey % 6);
    if (length > TRUNCATE_AT) return [false, this.stepCount >= TRUNCATE_AT];
    return [this.stepCount >= length, false];
  }

  /** The result bytes of the current state (a scratch buffer, overwritten by the next call). */
  resultBytes(): Uint8Array {
    const stepKey = mix32(this.episodeKey ^ mix32(this.stepCount ^ mix32(this.lastAction)));
    const [terminated, truncated] = this.episodeEnd();
    const ends: Record<string, number> = {
      done: terminated || truncated ? 1 : 0,
      terminated: terminated ? 1 : 0,
      truncated: truncated ? 1 : 0,
    };
    const actN = this.#spaces.actN;
    this.#scratch.fill(0);
    for (const leaf of this.#leaves) {
      for (let k = 0; k < leaf.count; k++) {
        const h = mix32(stepKey + Math.imul(leaf.first + k + 1, GOLDEN));
        const at = leaf.offset + k * leaf.size;
        if (leaf.role === "action_mask") {
          const allowed = k === 0 || k === POISON_ACTION ? 1 : k === actN - 1 ? 0 : h % 4 !== 0 ? 1 : 0;
          this.#writeInt(leaf, at, allowed);
        } else if (leaf.role !== null) {
          this.#writeNumber(leaf, at, ends[leaf.role] ?? 0);
        } else if (leaf.kind === "float") {
          this.#writeNumber(leaf, at, ((h % 2048) - 1024) / 8);
        } else if (leaf.kind === "bool") {
          this.#writeInt(leaf, at, h & 1);
        } else if (leaf.kind === "enum") {
          this.#writeInt(leaf, at, leaf.enumValues[h % leaf.enumValues.length] ?? 0);
        } else {
          this.#writeInt(leaf, at, h); // the low bytes of h; 8-byte integers zero-extended
        }
      }
    }
    return this.#scratch;
  }

  #result(): unknown {
    return this.codec.decode(this.resultBytes());
  }

  #writeNumber(leaf: Leaf, at: number, value: number): void {
    if (leaf.kind !== "float") this.#writeInt(leaf, at, value);
    else if (leaf.size === 4) this.#view.setFloat32(at, value, true);
    else this.#view.setFloat64(at, value, true);
  }

  /**
   * Two's-complement low bytes of the integer `value` (a safe integer: an enum's declared value,
   * a 32-bit hash, 0/1), as Python's twin writes it: 8-byte fields all 64 bits (through BigInt past
   * 0..2**32-1)
   * (an i64/u64 enum value past 32 bits, e.g. 2**32 or -(2**53 - 1), keeps its high word).
   */
  #writeInt(leaf: Leaf, at: number, value: number): void {
    const view = this.#view;
    switch (leaf.size) {
      case 1:
        view.setUint8(at, value & 0xff);
        break;
      case 2:
        view.setUint16(at, value & 0xffff, true);
        break;
      case 4:
        view.setUint32(at, value >>> 0, true);
        break;
      default:
        if (value >= 0 && value <= 0xffffffff) {
          // the common case (a hash, a role's 0/1): no BigInt
          view.setUint32(at, value, true);
          view.setUint32(at + 4, 0, true);
        } else {
          view.setBigUint64(at, BigInt.asUintN(64, BigInt(value)), true);
        }
    }
  }
}
