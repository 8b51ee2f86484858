/**
 * What a /dev/shm/transport-* entry is, told without blocking and without following a link: the
 * one rule (in Node) for every shared-memory segment of the project, the shm:// regions
 * (backends/shm/region.ts) and the channels' segments (channels/segment.ts). Python:
 * transport/shm_segment.py, the same words.
 *
 * A path that is not a regular file (a directory, a FIFO, a link, a socket, a device) is never a
 * segment: it is refused with `notASegment`'s words and never opened blocking (an open of a FIFO
 * for reading would block). Node's fs.openSync adds O_CLOEXEC itself (libuv).
 */

import { type Stats, closeSync, constants as fsConstants, fstatSync, lstatSync, openSync, readSync } from "node:fs";
import { ConnectError } from "./errors";

/**
 * The URL's /dev/shm path is there but is not a segment (a FIFO, a directory, ...): the machine's
 * state, no server to start, so a client adds no "is a server serving this URL?" hint
 * (`localConfig`, as for a bad key file). Python: `NotASegmentError`.
 */
export class NotASegmentError extends ConnectError {
  readonly localConfig = true;
}

/** An error class a check throws (ConnectError unless another is given). */
export type SegmentErrorClass = new (message: string) => Error;

/** What a path that is not a regular file is, in words ("a directory", "a FIFO", ...). */
export function fileKind(st: Stats): string {
  if (st.isDirectory()) return "a directory";
  if (st.isFIFO()) return "a FIFO";
  if (st.isSymbolicLink()) return "a symbolic link";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice()) return "a character device";
  if (st.isBlockDevice()) return "a block device";
  return "not a regular file";
}

/** The one refusal text (clients and servers) for a path that is not a regular file. */
export function notASegment(path: string, st: Stats): string {
  return `${path} is ${fileKind(st)}, not a shared-memory segment: remove it if nothing uses it`;
}

/** An `error` (ConnectError) when `path` (whose shm_open or open failed) is not a regular file;
 * else nothing. */
export function checkSegmentPath(path: string, error: SegmentErrorClass = NotASegmentError): void {
  let st: Stats;
  try {
    st = lstatSync(path);
  } catch {
    return;
  }
  if (!st.isFile()) throw new error(notASegment(path, st));
}

/** fstat of an opened segment; an `error` (ConnectError) when it is not a regular file (a FIFO, ...). */
export function checkSegmentFd(fd: number, path: string, error: SegmentErrorClass = NotASegmentError): Stats {
  const st = fstatSync(fd);
  if (!st.isFile()) throw new error(notASegment(path, st));
  return st;
}

const READ_FLAGS = fsConstants.O_RDONLY | fsConstants.O_NONBLOCK | fsConstants.O_NOFOLLOW;

/** Open a segment for reading without blocking (a FIFO) or following a link; a NotASegmentError
 * when it is not a regular file. ENOENT and the like are thrown as they are. */
export function openSegmentForReading(path: string): number {
  let fd: number;
  try {
    fd = openSync(path, READ_FLAGS);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") checkSegmentPath(path);
    throw error;
  }
  try {
    checkSegmentFd(fd, path);
  } catch (error) {
    closeSync(fd);
    throw error;
  }
  return fd;
}

/** Why a segment cannot be read, for a listing or a refusal: "permission denied; owner uid N". */
export function unreadableNote(why: string, uid: number): string {
  return `${why.toLowerCase()}; owner uid ${uid}`;
}

/** A look at a path: its lstat and, for a regular file this process may read, its first bytes.
 * `what`: "file", "not-a-file" (`note`: "a directory", ...) or "unreadable" (`note`: "permission
 * denied; owner uid N"). Python: shm_segment.py Peek. */
export interface Peek {
  readonly st: Stats;
  readonly what: "file" | "not-a-file" | "unreadable";
  readonly note: string;
  readonly head: Buffer;
}

function errnoWords(error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code;
  return code === "EACCES" || code === "EPERM" ? "permission denied" : (error as Error).message;
}

/** lstat, then open(O_RDONLY|O_NONBLOCK|O_NOFOLLOW) and fstat (the entry may have been replaced
 * since), then up to `size` bytes from offset 0. Nothing is followed, no FIFO blocks. Throws
 * (ENOENT) when the path is gone. */
export function peekSegment(path: string, size: number): Peek {
  const st = lstatSync(path);
  const empty = Buffer.alloc(0);
  if (!st.isFile()) return { st, what: "not-a-file", note: fileKind(st), head: empty };
  let fd: number;
  try {
    fd = openSync(path, READ_FLAGS);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") throw error;
    return { st, what: "unreadable", note: unreadableNote(errnoWords(error), st.uid), head: empty };
  }
  try {
    const fst = fstatSync(fd);
    if (!fst.isFile()) return { st, what: "not-a-file", note: fileKind(fst), head: empty };
    const head = Buffer.alloc(size);
    const got = readSync(fd, head, 0, size, 0);
    return { st: fst, what: "file", note: "", head: head.subarray(0, got) };
  } catch (error) {
    return { st, what: "unreadable", note: unreadableNote(errnoWords(error), st.uid), head: empty };
  } finally {
    closeSync(fd);
  }
}
