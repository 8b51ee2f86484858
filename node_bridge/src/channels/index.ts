/** Actor-learner channels (docs/channels.md): experience rings, the policy board, run control. */

export { ChannelCorruptError, MAX_VERSION, PolicyBoard, tableFingerprint, tableOf } from "./board";
export type { ArraySpec, ArrayTemplate } from "./board";
export { Member, RunControl } from "./control";
export type { MemberState, MemberStatus, RunControlOptions } from "./control";
export { BALANCED, Consumer, FUTEX, Producer, Ring, recordFingerprint } from "./ring";
export type { Batch, Reservation, RingOptions, RingPolicy, WaitPolicy } from "./ring";
export {
  ChannelClosedError,
  ChannelError,
  ChannelInUseError,
  ChannelMismatchError,
  ChannelNotFoundError,
  ChannelTimeoutError,
  PeerDiedError,
  Segment,
  TornReadError,
} from "./segment";
