/**
 * Length-prefixed frames: a u32 little-endian byte count, then that many bytes.
 *
 * `FrameReader` buffers partial frames from a byte stream without quadratic copying: chunks are
 * kept in a list and joined once per complete frame.
 */

export class FrameReader {
  #chunks: Buffer[] = [];
  #buffered = 0;

  /** Add bytes from the stream; returns every frame body completed by them, in order. */
  push(chunk: Buffer): Buffer[] {
    this.#chunks.push(chunk);
    this.#buffered += chunk.length;
    const frames: Buffer[] = [];
    for (;;) {
      if (this.#buffered < 4) break;
      const length = this.#peekLength();
      if (this.#buffered < 4 + length) break;
      frames.push(this.#take(4 + length).subarray(4));
    }
    return frames;
  }

  /** Bytes of an incomplete frame still waiting for the rest. */
  get pending(): number {
    return this.#buffered;
  }

  #peekLength(): number {
    const first = this.#chunks[0] as Buffer;
    const head = first.length >= 4 ? first : Buffer.concat(this.#chunks, 4);
    return head.readUInt32LE(0);
  }

  #take(count: number): Buffer {
    const all =
      this.#chunks.length === 1 ? (this.#chunks[0] as Buffer) : Buffer.concat(this.#chunks);
    const frame = all.subarray(0, count);
    const rest = all.subarray(count);
    this.#chunks = rest.length > 0 ? [rest] : [];
    this.#buffered = rest.length;
    return frame;
  }
}

/** One frame: the u32 LE length of `body`, then `body`. */
export function frame(body: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(4 + body.length);
  out.writeUInt32LE(body.length, 0);
  out.set(body, 4);
  return out;
}
