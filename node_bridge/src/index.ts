/**
 * Public surface of the Node side of the transport: generated codecs for every schema in
 * `schema/`, the codec runtime types, the error tree and fingerprints.
 *
 *   import { pac_env, SCHEMAS, CodecError } from "@transport/node-bridge";
 *   const bytes = pac_env.StepResultCodec.encode(values);
 *   const step = pac_env.StepResultCodec.view(bytes, 0); // step.observation: Float32Array
 */

export type { AnyStructCodec, SchemaModule, StructCodec } from "./codec";
export {
  ArrayLengthError,
  BufferSizeError,
  CODEC_ERROR_CODES,
  CodecError,
  type CodecErrorCode,
  InvalidBoolError,
  InvalidEnumError,
  MissingFieldError,
  NonCanonicalError,
  SchemaError,
  TransportError,
  UnknownFieldError,
  ValueRangeError,
  ValueTypeError,
} from "./errors";
export { canonicalJson, computeFingerprint, fingerprintHex, fingerprintOf } from "./fingerprint";
export type { EnumJson, FieldJson, MessageJson, SchemaJson, StructJson } from "./ir";
export { SCHEMAS, mahjong_env, pac_env, pac_shm } from "./generated";
