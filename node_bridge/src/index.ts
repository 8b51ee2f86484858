/**
 * Public surface of the Node side of the transport: generated codecs for every schema in
 * `schema/`, the codec runtime types, the error tree and fingerprints, and the network layer:
 * `serve(envOrFactory, url)` and `connect(url)` over unix:// and http://.
 *
 *   import { pac_env, SCHEMAS, CodecError } from "@transport/node-bridge";
 *   const bytes = pac_env.StepResultCodec.encode(values);
 *   const step = pac_env.StepResultCodec.view(bytes, 0); // step.observation: Float32Array
 */

export { type AnyStructCodec, type SchemaModule, type StructCodec, loadSchema } from "./codec";
export { loadSchemaFile } from "./schema_file";
export {
  ActionError,
  ArrayLengthError,
  BadFrameError,
  BufferSizeError,
  CODEC_ERROR_CODES,
  CodecError,
  type CodecErrorCode,
  ConnectError,
  EnvError,
  FingerprintMismatchError,
  InvalidBoolError,
  InvalidEnumError,
  MissingFieldError,
  NoProgressError,
  NonCanonicalError,
  PeerGoneError,
  ProtocolError,
  RegionInUseError,
  RegionMismatchError,
  RemoteError,
  ReplyTooLargeError,
  SchemaError,
  TransportError,
  TransportTimeoutError,
  UnknownFieldError,
  ValueRangeError,
  ValueTypeError,
  VersionMismatchError,
} from "./errors";
export {
  Client,
  type ConnectOptions,
  type Final,
  type ResultOptions,
  connect,
} from "./client";
export { type Server, type ServeOptions, serve } from "./server";
export type { Action, Env, EnvFactory, EnvOrFactory, ResultRow, Spaces } from "./runtime/env";
export type { ConnectionStats, ServerLimits } from "./stream";
export {
  AutoReset,
  type AutoResetName,
  CLOSING_ERRORS,
  DEFAULT_MAX_BODY,
  ErrorCode,
  type Hello,
  type MessageIds,
  PROTOCOL_VERSION,
  messageIds,
} from "./protocol";
export { canonicalJson, computeFingerprint, fingerprintHex, fingerprintOf } from "./fingerprint";
export type { EnumJson, FieldJson, MessageJson, SchemaJson, StructJson } from "./ir";
export { SCHEMAS, gridworld, mahjong_env, pac_env, pac_shm, protocol, tetris } from "./generated";
