/**
 * One typed error tree, mirroring `transport/errors.py`.
 *
 * Every error the library throws derives from `TransportError`. Codec errors carry a stable
 * `code` (the same strings as the Python side) and the `field` path of the first invalid element
 * (`results[2].observation[5]`, `""` for the struct itself), so the conformance suite can check
 * that both languages refuse the same input for the same reason.
 */

/** Base class of every error thrown by the transport library. */
export class TransportError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A schema file or an embedded IR is invalid. */
/** A second call on a client whose request is still in flight: each channel makes one request
 * at a time (the words every backend uses; Python's client says the same of another thread). */
export function requestInFlight(): TransportError {
  return new TransportError("a request is already in flight on this client (await it first)");
}

export class SchemaError extends TransportError {}

/**
 * An action argument that fits neither one env's action nor one action per env, or whose values
 * the action field cannot hold: thrown by the client before any bytes move, the same on every
 * backend. The message names the action space, what was given and what to pass.
 */
export class ActionError extends TransportError {}

export const CODEC_ERROR_CODES = [
  "buffer_size",
  "out_of_range",
  "wrong_type",
  "array_length",
  "missing_field",
  "unknown_field",
  "invalid_bool",
  "invalid_enum",
  "non_canonical",
] as const;

export type CodecErrorCode = (typeof CODEC_ERROR_CODES)[number];

/** A value or a buffer cannot be encoded or decoded under a struct's layout. */
export abstract class CodecError extends TransportError {
  abstract readonly code: CodecErrorCode;
  /** Field path of the offending element; `""` for the struct itself. */
  readonly field: string;
  /** Name of the top-level struct being encoded or decoded; `""` until known. */
  struct: string;
  /** The message without its location prefix. */
  readonly reason: string;

  constructor(reason: string, field = "", struct = "") {
    super(formatMessage(reason, field, struct));
    this.reason = reason;
    this.field = field;
    this.struct = struct;
  }

  /** Record which top-level struct the error belongs to (first caller wins). */
  withStruct(struct: string): this {
    if (this.struct === "") {
      this.struct = struct;
      this.message = formatMessage(this.reason, this.field, struct);
    }
    return this;
  }
}

function formatMessage(reason: string, field: string, struct: string): string {
  const location = struct && field ? `${struct}.${field}` : struct || field;
  return location ? `${location}: ${reason}` : reason;
}

/** The buffer is shorter than the struct at the given offset. */
export class BufferSizeError extends CodecError {
  readonly code = "buffer_size";
}

/** A number does not fit the field's type (integer range, or a finite value beyond f32). */
export class ValueRangeError extends CodecError {
  readonly code = "out_of_range";
}

/** A value has the wrong kind for its field (a string for a number, a number for a bool). */
export class ValueTypeError extends CodecError {
  readonly code = "wrong_type";
}

/** An array value does not have the field's fixed element count. */
export class ArrayLengthError extends CodecError {
  readonly code = "array_length";
}

/** A bool byte other than 0 or 1 was found in strict decoding. */
export class InvalidBoolError extends CodecError {
  readonly code = "invalid_bool";
}

/** An enum value is not declared by the enum (encoding, or strict decoding). */
export class InvalidEnumError extends CodecError {
  readonly code = "invalid_enum";
}

/** A NaN other than the canonical quiet NaN was found in strict decoding. */
export class NonCanonicalError extends CodecError {
  readonly code = "non_canonical";
}

/** No value was given for a field of the struct. */
export class MissingFieldError extends CodecError {
  readonly code = "missing_field";
}

/** A value was given for a name that is not a field of the struct. */
export class UnknownFieldError extends CodecError {
  readonly code = "unknown_field";
}

// -- transport errors (the protocol, client and server layers) ----------------------------------

/** The peer could not be reached before the deadline (nothing listens, refused, bad URL). */
export class ConnectError extends TransportError {}

/** An shm:// region leased by another live client (one client per region): `holder` is its pid
 * (this process's own when another client of this process holds it). */
export class RegionInUseError extends ConnectError {
  readonly holder: number;

  constructor(message: string, holder: number) {
    super(message);
    this.holder = holder;
  }
}

/** A wait for the peer passed its deadline; the peer may be alive but silent. */
export class TransportTimeoutError extends TransportError {}

/** The peer closed the connection or died while a request was outstanding. */
export class PeerGoneError extends TransportError {}

/** The peer sent something the protocol does not allow (bad frame, wrong msg_id, ...). */
export class ProtocolError extends TransportError {}

/** A frame header or body that cannot be valid (unknown type, wrong size, too large). */
export class BadFrameError extends ProtocolError {
  /** The msg_id of the offending frame's header, when it was read (0 otherwise). */
  msgId = 0;
}

/**
 * A reply larger than this client's `maxBody` (`bodyLen` bytes over `maxBody`): the client's own
 * limit, not a disagreement between the peers, so its hint (`REPLY_TOO_LARGE_HINT`) says how to
 * raise it. Every socket client drops the reply and keeps the connection. Python: the same class.
 */
export class ReplyTooLargeError extends BadFrameError {
  readonly bodyLen: number;
  readonly maxBody: number;

  constructor(bodyLen: number, maxBody: number, msgId = 0) {
    super(`the server's reply is ${bodyLen} bytes, over this client's max_body of ${maxBody} bytes`);
    this.bodyLen = bodyLen;
    this.maxBody = maxBody;
    this.msgId = msgId;
  }
}

/** The error of a reply of `bodyLen` bytes over the client's `maxBody` (one text for every
 * client backend; Python: `reply_too_large`). */
export function replyTooLarge(bodyLen: number, maxBody: number, msgId = 0): ReplyTooLargeError {
  return new ReplyTooLargeError(bodyLen, maxBody, msgId);
}

/** What to do about a `ReplyTooLargeError`, said after its message (Python's hint, in Node's
 * words): the client's `HINTS` list it before `ProtocolError`'s. */
export const REPLY_TOO_LARGE_HINT =
  "the reply was dropped: connect with a maxBody at least that large, connect(url, { maxBody }); " +
  "render frames of many envs can pass the default 64 MiB";

/** The peers speak different major protocol versions. */
export class VersionMismatchError extends ProtocolError {}

/** The peers compiled different schemas; the message names both fingerprints (16 hex digits). */
export class FingerprintMismatchError extends ProtocolError {
  readonly local: bigint;
  readonly remote: bigint;

  constructor(message: string, local = 0n, remote = 0n) {
    super(message);
    this.local = local;
    this.remote = remote;
  }
}

/** A control-block field of an shm:// region differs from what this side expects. */
export class RegionMismatchError extends ProtocolError {
  readonly field: string;
  readonly expected: string;
  readonly found: string;

  constructor(url: string, field: string, expected: string, found: string) {
    super(`${url}: control block field ${field}: expected ${expected}, found ${found}`);
    this.field = field;
    this.expected = expected;
    this.found = found;
  }
}

/**
 * The peer answered ERROR: `code` is the protocol error code, `codeName` its name
 * (`INVALID_ACTION`; Python's `RemoteError.name`; `name` stays the class name as for every
 * JavaScript error) and `text` the peer's message.
 */
export class RemoteError extends TransportError {
  readonly code: number;
  readonly codeName: string;
  readonly text: string;

  constructor(code: number, codeName: string, text: string) {
    super(`${codeName} (${code}): ${text}`);
    this.code = code;
    this.codeName = codeName;
    this.text = text;
  }
}

/**
 * Separates an ENV_ERROR text's message from the env's trimmed stack (or Python traceback) that
 * follows it: the server's runtime writes it, `EnvError` splits it off (Python: the same marker).
 */
export const REMOTE_TRACEBACK_MARKER = "\n--- server traceback (last frames) ---\n";

/**
 * The server's env threw (ERROR code 10, ENV_ERROR). `envId` is the index of the env that failed
 * (the text starts with `env {i}:`), or null when the server did not say; `remoteTraceback` the
 * last frames of its stack as the server formatted them ("" when it sent none), shown after the
 * message. The server reset (or recreated) that env: the next request works. Python: `EnvError`.
 */
export class EnvError extends RemoteError {
  readonly envId: number | null;
  readonly remoteTraceback: string;

  constructor(code: number, codeName: string, text: string) {
    const at = text.indexOf(REMOTE_TRACEBACK_MARKER);
    const message = at < 0 ? text : text.slice(0, at);
    super(code, codeName, message);
    const match = /^env (\d+):/.exec(message);
    this.envId = match === null ? null : Number(match[1]);
    this.remoteTraceback = at < 0 ? "" : text.slice(at + REMOTE_TRACEBACK_MARKER.length);
    if (this.remoteTraceback !== "") this.message += REMOTE_TRACEBACK_MARKER + this.remoteTraceback;
  }
}

/**
 * An env of a decision-boundary run stopped advancing (the server's no-progress watchdog: frames
 * 0 for `stall_requests` requests in a row, or no decision within `max_frames`). `requests`: the
 * env's request numbers since its reset that made no progress [first, last]; `lastState`: its
 * last result (scalar and counter fields). The server reset the env. Python: `NoProgressError`.
 */
export class NoProgressError extends EnvError {
  readonly requests: readonly [number, number];
  readonly lastState: Readonly<Record<string, unknown>>;

  constructor(code: number, codeName: string, text: string, requests: readonly [number, number], lastState: Record<string, unknown>) {
    super(code, codeName, text);
    this.requests = requests;
    this.lastState = lastState;
  }
}

/** The watchdog's structured ENV_ERROR text (both server languages write it alike). */
export const NO_PROGRESS_TEXT = /NoProgressError: no progress: .*?\(requests (\d+)\.\.(\d+) since reset\); last state: (\{[^{}]*\})/;
