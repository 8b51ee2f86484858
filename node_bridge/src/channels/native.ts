/**
 * The system calls of the channels: the koffi bindings and liveness checks of the shm:// backend,
 * imported here and only here (the one line to change when that module moves).
 */

export { native, EEXIST, ENOENT, O_CLOEXEC, O_CREAT, O_EXCL, O_RDWR } from "../backends/shm/native";
export { peerAlive, procStartTime } from "../backends/shm/region";

/** errno of an open this user may not make (another user's 0600 segment). */
export const EACCES = 13;

/** CLOCK_MONOTONIC in nanoseconds (libuv's hrtime is CLOCK_MONOTONIC on Linux): the clock of
 * heartbeats and record send times, the same as Python's `native.monotonic_ns()`. */
export function monotonicNs(): bigint {
  return process.hrtime.bigint();
}
