/**
 * The side segment of a region: info maps larger than a slot's info area (docs/shm.md "Frames";
 * transport/backends/shm/region.py `SideWriter` / `SideReader`, the same bytes).
 *
 * A slot's info area is small by design (256 bytes). An OBSERVE whose env info map does not fit
 * (a rendered frame) is answered through `/dev/shm/transport-<name>+info`, which the server
 * creates on the first such OBSERVE and replaces by a larger one (generation + 1) when an OBSERVE
 * needs more. The slot then says `info_len = INFO_SIDE` and its info area holds a SIDE_REF
 * (u32 generation, u32 0, u64 offset, u64 length). Nothing of this runs on a STEP.
 *
 * side segment = header (64 bytes: u32 magic "INFO" at 0, u32 version at 4, u32 generation at 8,
 *                u32 owner_pid at 32, u64 owner_start_time at 40: the control block's offsets)
 *                | the maps (each at a 64-byte boundary)
 */

import { fstatSync, statSync } from "node:fs";
import { ProtocolError } from "../../errors";
import { ErrorCode, RequestError } from "../../protocol";
import { EEXIST, ENOENT, O_CLOEXEC, O_CREAT, O_EXCL, O_RDWR, native } from "./native";
import { CB, LAYOUT_VERSION, PREFIX, SHM_DIR, SIDE_MAGIC, freeShmBytes, off, procStartTime, type ShmUrl } from "./region";

/** "+" is not a region-name character: no region is ever called `<name>+info`. */
export const SIDE_SUFFIX = "+info";
export { SIDE_MAGIC } from "./region";
/** A slot's info_len when its info map is in the side segment (a SIDE_REF in its info area). */
export const INFO_SIDE = 0xffff;
export const SIDE_REF_SIZE = 24;
export const SIDE_HEADER = 64;
const SIDE_MIN_SIZE = 1 << 16;

/** The shm_open name of region `name`'s side segment. */
export function sideSegment(name: string): string {
  return `/${PREFIX}${name}${SIDE_SUFFIX}`;
}

interface Mapping {
  readonly address: bigint;
  readonly size: number;
  readonly bytes: Uint8Array;
  readonly dv: DataView;
  readonly inode: number;
}

function mapFd(fd: number, size: number, path: string): Mapping {
  const nat = native();
  const address = nat.mmap(fd, size);
  if (address < 0n) throw new ProtocolError(`cannot map ${path} (${size} bytes): ${nat.strerror(nat.errno())}`);
  const buffer = nat.view(address, size);
  return { address, size, bytes: new Uint8Array(buffer), dv: new DataView(buffer), inode: fstatSync(fd).ino };
}

/** The server's side segment: made on the first info map too large for its slot, grown when an
 * OBSERVE needs more (a new segment, generation + 1), unlinked by `close()`. */
export class SideWriter {
  readonly segment: string;
  readonly path: string;
  #mapping: Mapping | null = null;
  #generation = 0;

  constructor(shm: ShmUrl) {
    this.segment = sideSegment(shm.name);
    this.path = `${SHM_DIR}/${this.segment.slice(1)}`;
  }

  /** Write each env's packed map; returns each env's SIDE_REF for its slot's info area. */
  write(maps: Map<number, Uint8Array>): Map<number, Uint8Array> {
    const spans = new Map<number, number>();
    let at = SIDE_HEADER;
    for (const [index, data] of maps) {
      spans.set(index, at);
      at += Math.ceil(data.byteLength / 64) * 64;
    }
    const mapping = this.#room(at);
    const refs = new Map<number, Uint8Array>();
    for (const [index, data] of maps) {
      const offset = spans.get(index) as number;
      mapping.bytes.set(data, offset);
      const ref = new Uint8Array(SIDE_REF_SIZE);
      const dv = new DataView(ref.buffer);
      dv.setUint32(0, this.#generation, true);
      dv.setBigUint64(8, BigInt(offset), true);
      dv.setBigUint64(16, BigInt(data.byteLength), true);
      refs.set(index, ref);
    }
    return refs;
  }

  #room(need: number): Mapping {
    if (this.#mapping !== null && this.#mapping.size >= need) return this.#mapping;
    let size = SIDE_MIN_SIZE;
    while (size < need) size *= 2; // doubles: few regrowths
    this.close();
    this.#generation += 1;
    const free = freeShmBytes();
    if (free >= 0 && free < size) {
      throw new RequestError(
        ErrorCode.INTERNAL,
        `an env's info map (a rendered frame?) needs ${need} bytes, more than a slot's info area holds, and /dev/shm ` +
          `has ${free} bytes free for ${this.path}: enlarge /dev/shm (docker run --shm-size=1g) or render fewer envs`,
      );
    }
    const nat = native();
    let fd = -1;
    for (let attempt = 0; attempt < 2 && fd < 0; attempt++) {
      fd = nat.shmOpen(this.segment, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600);
      if (fd >= 0) break;
      const errno = nat.errno();
      if (errno !== EEXIST) throw new RequestError(ErrorCode.INTERNAL, `cannot create ${this.path}: ${nat.strerror(errno)}`);
      nat.shmUnlink(this.segment); // a dead server's leftover: the region's name is ours
    }
    if (fd < 0) throw new RequestError(ErrorCode.INTERNAL, `cannot create ${this.path}: it keeps existing`);
    try {
      nat.fchmod(fd, 0o600);
      const err = nat.posixFallocate(fd, 0, size);
      if (err !== 0) {
        nat.shmUnlink(this.segment);
        throw new RequestError(ErrorCode.INTERNAL, `cannot create ${this.path} (${size} bytes): ${nat.strerror(err)}`);
      }
      const mapping = mapFd(fd, size, this.path);
      mapping.dv.setUint32(0, SIDE_MAGIC, true);
      mapping.dv.setUint32(4, LAYOUT_VERSION, true);
      mapping.dv.setUint32(8, this.#generation, true);
      mapping.dv.setUint32(off(CB, "owner_pid"), process.pid, true);
      mapping.dv.setBigUint64(off(CB, "owner_start_time"), procStartTime(process.pid), true);
      this.#mapping = mapping;
      return mapping;
    } finally {
      nat.close(fd);
    }
  }

  /** Unlink the segment (only this server's inode) and unmap it. */
  close(): void {
    const mapping = this.#mapping;
    if (mapping === null) return;
    this.#mapping = null;
    try {
      if (statSync(this.path).ino === mapping.inode) native().shmUnlink(this.segment);
    } catch {
      // gone already
    }
    native().munmap(mapping.address, mapping.size); // nothing outside this object views it
  }
}

/** The client's view of its server's side segment: mapped on the first SIDE_REF, again when the
 * server replaced it (a SIDE_REF of another generation). `read` returns copies. */
export class SideReader {
  readonly name: string;
  readonly segment: string;
  readonly path: string;
  #mapping: Mapping | null = null;
  #generation = -1;

  constructor(name: string) {
    this.name = name;
    this.segment = sideSegment(name);
    this.path = `${SHM_DIR}/${this.segment.slice(1)}`;
  }

  /** The packed map a slot's SIDE_REF points at (a copy; ProtocolError when unreadable). */
  read(ref: Uint8Array): Uint8Array {
    const dv = new DataView(ref.buffer, ref.byteOffset, SIDE_REF_SIZE);
    const generation = dv.getUint32(0, true);
    const offset = Number(dv.getBigUint64(8, true));
    const length = Number(dv.getBigUint64(16, true));
    if (this.#mapping === null || generation !== this.#generation) this.#map(generation);
    const mapping = this.#mapping as Mapping;
    if (offset < SIDE_HEADER || offset + length > mapping.size) {
      throw new ProtocolError(`shm://${this.name}: an info reference (${offset}, ${length}) lies outside ${this.path} (${mapping.size} bytes)`);
    }
    return mapping.bytes.slice(offset, offset + length);
  }

  #map(generation: number): void {
    this.close();
    const nat = native();
    const fd = nat.shmOpen(this.segment, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      const errno = nat.errno();
      const why = errno === ENOENT ? "it does not exist" : nat.strerror(errno);
      throw new ProtocolError(`shm://${this.name}: the server answered an info map through ${this.path}, which cannot be opened (${why})`);
    }
    let mapping: Mapping;
    try {
      const size = fstatSync(fd).size;
      if (size < SIDE_HEADER) throw new ProtocolError(`shm://${this.name}: ${this.path} has no header (${size} bytes)`);
      mapping = mapFd(fd, size, this.path);
    } finally {
      nat.close(fd);
    }
    const magic = mapping.dv.getUint32(0, true);
    const found = mapping.dv.getUint32(8, true);
    if (magic !== SIDE_MAGIC || found !== generation) {
      nat.munmap(mapping.address, mapping.size);
      throw new ProtocolError(
        `shm://${this.name}: ${this.path} is not the side area the server referenced (magic 0x${magic.toString(16)}, generation ${found}, expected ${generation})`,
      );
    }
    this.#mapping = mapping;
    this.#generation = generation;
  }

  close(): void {
    const mapping = this.#mapping;
    if (mapping === null) return;
    this.#mapping = null;
    this.#generation = -1;
    native().munmap(mapping.address, mapping.size);
  }
}
