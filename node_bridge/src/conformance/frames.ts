/**
 * Length-prefixed frames: a u32 little-endian byte count, then that many bytes.
 *
 * `FrameReader` appends received chunks to one growing buffer (amortised doubling, compacted
 * when it would grow), so a frame split into many small chunks costs linear time: every byte is
 * copied in once and out once.
 */

export class FrameReader {
  #buffer = Buffer.alloc(0);
  #start = 0;
  #end = 0;

  /** Add bytes from the stream; returns every frame body completed by them, in order. */
  push(chunk: Buffer): Buffer[] {
    this.#reserve(chunk.length);
    chunk.copy(this.#buffer, this.#end);
    this.#end += chunk.length;
    const frames: Buffer[] = [];
    while (this.#end - this.#start >= 4) {
      const length = this.#buffer.readUInt32LE(this.#start);
      const begin = this.#start + 4;
      if (this.#end < begin + length) break;
      frames.push(Buffer.from(this.#buffer.subarray(begin, begin + length)));
      this.#start = begin + length;
    }
    if (this.#start === this.#end) this.#start = this.#end = 0;
    return frames;
  }

  /** Bytes of an incomplete frame still waiting for the rest. */
  get pending(): number {
    return this.#end - this.#start;
  }

  /** Room for `count` more bytes after `#end`: compact first, grow only when that is not enough. */
  #reserve(count: number): void {
    if (this.#end + count <= this.#buffer.length) return;
    const pending = this.#end - this.#start;
    const target =
      pending + count <= this.#buffer.length
        ? this.#buffer
        : Buffer.alloc(Math.max(2 * this.#buffer.length, pending + count, 4096));
    this.#buffer.copy(target, 0, this.#start, this.#end);
    this.#buffer = target;
    this.#start = 0;
    this.#end = pending;
  }
}

/** One frame: the u32 LE length of `body`, then `body`. */
export function frame(body: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(4 + body.length);
  out.writeUInt32LE(body.length, 0);
  out.set(body, 4);
  return out;
}
