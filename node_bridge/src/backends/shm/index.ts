/**
 * shm://name: shared memory + futex (docs/shm.md). Files: native.ts (koffi: shm_open, mmap,
 * futex), region.ts (layout, URLs, liveness, creation, the wait loop), server.ts (the server
 * loop: slots handed to the env runtime), channel.ts (the client channel), side.ts (the side
 * segment: info maps too large for a slot, e.g. rendered frames).
 */

export { ShmListener, listen, resultLayout, utf8Cut } from "./server";
export { openChannel } from "./channel";
