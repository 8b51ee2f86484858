/**
 * The lifetime of a shared mapping that typed arrays view (docs/shm.md, "Lifetimes"), written
 * once for every owner of such a mapping: the shm:// region and the channel segments.
 *
 * The ArrayBuffer over the mapping (koffi.view: no copy) owns it: every typed array made of it
 * holds the buffer, and the mapping is unmapped only once the buffer is collected, so no view
 * ever points at unmapped memory. Ending this process's use of the segment (close) swaps a
 * private copy of the pages in place (mremap over them: `privatize`), which the views that are
 * still held keep reading, with their values at that moment, writing to no other process.
 */

import { statSync } from "node:fs";

import { native } from "./backends/shm/native";

/** The mappings whose ArrayBuffer is gone: nothing can read them any more, so they are unmapped. */
const unmapCollected = new FinalizationRegistry<{ readonly address: bigint; readonly size: number }>(({ address, size }) => {
  native().munmap(address, size);
});

/**
 * An ArrayBuffer over the `size` bytes mapped at `address` (no copy) that owns the mapping: it is
 * unmapped when the buffer is collected (after the last typed array over it), never before.
 */
export function ownedMappingBuffer(address: bigint, size: number, token?: object): ArrayBuffer {
  const buffer = native().view(address, size);
  unmapCollected.register(buffer, { address, size }, token);
  return buffer;
}

/**
 * Unmap now a mapping made by `ownedMappingBuffer(address, size, token)` whose buffer never
 * left its owner (a segment that failed to open: no caller holds a view of it), instead of
 * copying it; the collection of the buffer then unmaps nothing. Only for that case: a view
 * still held would point at unmapped memory.
 */
export function unmapUnviewed(token: object, address: bigint, size: number): void {
  unmapCollected.unregister(token);
  native().munmap(address, size);
}

/**
 * The bytes of a mapping of `size` bytes that the segment at `path` still backs: `size`, unless
 * another process truncated it (reading past its end, page-rounded, would be a SIGBUS). Known
 * while the name still names the segment (`inode`); otherwise the whole mapping is assumed backed.
 */
export function backedBytes(path: string, inode: number, size: number): number {
  try {
    const st = statSync(path);
    if (st.ino !== inode || st.size >= size) return size;
    const page = 4096;
    return Math.ceil(st.size / page) * page;
  } catch {
    return size;
  }
}

/**
 * End this process's use of a mapping made by `ownedMappingBuffer`: its shared pages are replaced
 * in place by a private copy of their contents (the first `backedBytes(path, inode, size)` of
 * them), which the typed arrays still held keep reading until the buffer is collected and the
 * copy unmapped. 0, or the errno when the copy failed (no memory: the shared mapping then stays
 * until the buffer is collected).
 */
export function releaseMapping(address: bigint, size: number, path: string, inode: number): number {
  return native().privatize(address, size, backedBytes(path, inode, size));
}
