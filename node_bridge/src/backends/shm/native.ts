/**
 * The few libc calls the shm:// backend needs, through koffi (a prebuilt FFI: no compiler at
 * install). The Python side does the same in C (transport/native/tp_native.c); docs/shm.md.
 *
 * koffi 3 passes `void *` as a bigint address, and `koffi.view(address, length)` returns an
 * ArrayBuffer backed directly by that memory (an external backing store, no copy), so the
 * MAP_SHARED mapping is read and written through ordinary typed arrays and `Atomics` (which work
 * on a non-shared buffer; `Atomics.wait` does not, hence FUTEX_WAIT through `syscall`).
 *
 * `syscall` is variadic in C; it is declared here with its six fixed futex arguments, which is
 * ABI-compatible on x86_64 and arm64 Linux (no floating-point arguments) and keeps the call
 * synchronous-capable and cheap (~0.5 us per FUTEX_WAKE including the system call).
 */

import { ConnectError } from "../../errors";

/* eslint-disable @typescript-eslint/no-explicit-any */
type Fn = (...args: any[]) => any;

export const O_RDWR = 0o2;
export const O_CREAT = 0o100;
export const O_EXCL = 0o200;
export const O_CLOEXEC = 0o2000000;
const PROT_READ = 0x1;
const PROT_WRITE = 0x2;
const MAP_SHARED = 0x1;
const MAP_PRIVATE = 0x2;
const MAP_ANONYMOUS = 0x20; // x86_64 and arm64 Linux
const MREMAP_MAYMOVE = 0x1;
const MREMAP_FIXED = 0x2;
const MAP_FAILED = 0xffffffffffffffffn;

export const FUTEX_WAIT = 0;
export const FUTEX_WAKE = 1;
export const EAGAIN = 11;
export const EINTR = 4;
export const ETIMEDOUT = 110;
export const EEXIST = 17;
export const ENOENT = 2;
export const ENOSYS = 38;
export const EINVAL = 22;
/** futex_waitv's per-word flag: a 32-bit futex (shared: no FUTEX_PRIVATE_FLAG). */
export const FUTEX2_SIZE_U32 = 2;
/** The kernel's limit on the words of one futex_waitv (FUTEX_WAITV_MAX). */
export const FUTEX_WAITV_MAX = 128;
/** One `struct futex_waitv` { u64 val; u64 uaddr; u32 flags; u32 __reserved } in u32 units. */
export const FUTEX_WAITV_WORDS = 6;
const CLOCK_MONOTONIC = 1;

/** SYS_futex for the architectures Node ships on Linux. */
const SYS_FUTEX: Readonly<Record<string, number>> = { x64: 202, arm64: 98, ia32: 240, arm: 240 };
/** SYS_futex_waitv (Linux 5.16+): the same number on every architecture (the unified table). */
const SYS_FUTEX_WAITV: Readonly<Record<string, number>> = { x64: 449, arm64: 449 };

export interface Native {
  readonly koffi: any;
  shmOpen(name: string, flags: number, mode: number): number;
  shmUnlink(name: string): number;
  fchmod(fd: number, mode: number): number;
  /** close(2): the fds shm_open returns are not Node's (fs.closeSync warns in a worker). */
  close(fd: number): number;
  /** Returns 0 or an errno value (posix_fallocate does not set errno). */
  posixFallocate(fd: number, offset: number, length: number): number;
  mmap(fd: number, length: number): bigint;
  munmap(address: bigint, length: number): number;
  /**
   * Replace the mapping at [address, address + length) in place, atomically (mremap over it), by
   * a private anonymous copy of its contents: views of it keep their values and stay mapped, and
   * the segment is no longer this process's (docs/shm.md, "Lifetimes"; tp_privatize in C).
   * Only the first `backed` bytes are copied (a truncated segment's pages past its end would be a
   * SIGBUS); the rest of the copy reads zeros. 0, or the errno (the mapping is then untouched).
   */
  privatize(address: bigint, length: number, backed: number): number;
  /** An ArrayBuffer over `length` bytes at `address` (no copy). */
  view(address: bigint, length: number): ArrayBuffer;
  /** raw syscall(SYS_futex, ...): -1 and errno() on failure. */
  futex(address: number, op: number, value: number, timeout: { tv_sec: number; tv_nsec: number } | null): number;
  /**
   * FUTEX_WAIT on a libuv pool thread (koffi's async call): the calling thread's event loop keeps
   * running while it sleeps (a client whose server may share its thread).
   */
  futexWaitAsync(address: number, value: number, timeout: { tv_sec: number; tv_nsec: number }): Promise<number>;
  /**
   * futex_waitv (Linux 5.16+) on a libuv pool thread: sleep until any of `count` words (the
   * `struct futex_waitv` entries in `waiters`, FUTEX_WAITV_WORDS u32 each) is woken or no longer
   * holds its value, at most until `deadline` (an absolute CLOCK_MONOTONIC time). null when the
   * kernel (or a seccomp filter) does not offer the call: the caller waits on one word instead.
   */
  readonly futexWaitvAsync: ((waiters: Uint32Array, count: number, deadline: { tv_sec: number; tv_nsec: number }) => Promise<number>) | null;
  schedYield(): number;
  errno(): number;
  strerror(errno: number): string;
}

let loaded: Native | null = null;

/** The bindings, loaded on first use (a clear ConnectError where koffi or libc is missing). */
export function native(): Native {
  if (loaded !== null) return loaded;
  if (process.platform !== "linux") {
    throw new ConnectError(`shm:// needs Linux (futex, /dev/shm); this is ${process.platform}`);
  }
  const sysFutex = SYS_FUTEX[process.arch];
  if (sysFutex === undefined) throw new ConnectError(`shm:// does not know SYS_futex on ${process.arch}`);
  let koffi: any;
  try {
    koffi = require("koffi");
  } catch (error) {
    throw new ConnectError(`shm:// needs the koffi package (npm install koffi): ${String(error)}`);
  }
  const libc = koffi.load("libc.so.6");
  let rt = libc;
  try {
    libc.func("int shm_open(const char *name, int oflag, uint32_t mode)");
  } catch {
    rt = koffi.load("librt.so.1"); // glibc < 2.34 keeps shm_open in librt
  }
  const timespec = koffi.struct("transport_timespec", { tv_sec: "int64_t", tv_nsec: "int64_t" });
  const fn = (lib: any, decl: string): Fn => lib.func(decl) as Fn;
  const shmOpen = fn(rt, "int shm_open(const char *name, int oflag, uint32_t mode)");
  const shmUnlink = fn(rt, "int shm_unlink(const char *name)");
  const fchmod = fn(libc, "int fchmod(int fd, uint32_t mode)");
  const close = fn(libc, "int close(int fd)");
  const posixFallocate = fn(libc, "int posix_fallocate(int fd, int64_t offset, int64_t len)");
  const mmap = fn(libc, "void *mmap(void *addr, size_t length, int prot, int flags, int fd, int64_t offset)");
  const munmap = fn(libc, "int munmap(void *addr, size_t length)");
  // variadic in C (the new address is the fifth argument only with MREMAP_FIXED): koffi types it
  const mremap = fn(libc, "void *mremap(void *old_address, size_t old_size, size_t new_size, int flags, ...)");
  const syscall = libc.func("syscall", "long", [
    "long",
    "uintptr_t",
    "int",
    "uint32_t",
    koffi.pointer(timespec),
    "uintptr_t",
    "uint32_t",
  ]) as Fn & { async: Fn };
  const schedYield = fn(libc, "int sched_yield()");
  const futexWaitvAsync = waitvOf(koffi, libc, timespec);
  const strerror = fn(libc, "const char *strerror(int errnum)");
  loaded = {
    koffi,
    shmOpen: (name, flags, mode) => shmOpen(name, flags, mode) as number,
    shmUnlink: (name) => shmUnlink(name) as number,
    fchmod: (fd, mode) => fchmod(fd, mode) as number,
    close: (fd) => close(fd) as number,
    posixFallocate: (fd, offset, length) => posixFallocate(fd, offset, length) as number,
    mmap(fd, length) {
      const address = mmap(null, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) as bigint | null;
      if (address === null || BigInt(address) === MAP_FAILED) return -1n;
      return BigInt(address);
    },
    munmap: (address, length) => munmap(address, length) as number,
    privatize(address, length, backed) {
      const copy = mmap(null, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) as bigint | null;
      if (copy === null || BigInt(copy) === MAP_FAILED) return koffi.errno() as number;
      const bytes = Math.max(0, Math.min(length, backed));
      if (bytes > 0) new Uint8Array(koffi.view(copy, bytes) as ArrayBuffer).set(new Uint8Array(koffi.view(address, bytes) as ArrayBuffer));
      const moved = mremap(copy, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, "void *", address) as bigint | null;
      if (moved === null || BigInt(moved) === MAP_FAILED) {
        const errno = koffi.errno() as number;
        munmap(copy, length);
        return errno;
      }
      return 0;
    },
    view: (address, length) => koffi.view(address, length) as ArrayBuffer,
    futex: (address, op, value, timeout) => Number(syscall(sysFutex, address, op, value >>> 0, timeout, 0, 0)),
    futexWaitAsync: (address, value, timeout) =>
      new Promise<number>((resolve, reject) => {
        syscall.async(sysFutex, address, FUTEX_WAIT, value >>> 0, timeout, 0, 0, (error: unknown, rc: unknown) => {
          if (error) reject(error instanceof Error ? error : new Error(String(error)));
          else resolve(Number(rc));
        });
      }),
    futexWaitvAsync,
    schedYield: () => schedYield() as number,
    errno: () => koffi.errno() as number,
    strerror: (errno) => String(strerror(errno)),
  };
  return loaded;
}

/**
 * The async futex_waitv call, or null when the kernel lacks it: probed once with no words, which
 * a kernel that has the call refuses with EINVAL (ENOSYS: too old; EPERM: a seccomp filter).
 */
function waitvOf(koffi: any, libc: any, timespec: any): Native["futexWaitvAsync"] {
  const nr = SYS_FUTEX_WAITV[process.arch];
  if (nr === undefined) return null;
  // syscall(SYS_futex_waitv, waiters, nr_futexes, flags, timeout, clockid): fixed arguments, so
  // koffi can call it on a pool thread (a variadic function cannot be called asynchronously)
  const syscall = libc.func("syscall", "long", ["long", "void *", "uint32_t", "uint32_t", koffi.pointer(timespec), "int32_t"]) as Fn & {
    async: Fn;
  };
  if (Number(syscall(nr, null, 0, 0, null, CLOCK_MONOTONIC)) !== -1 || (koffi.errno() as number) !== EINVAL) return null;
  return (waiters, count, deadline) =>
    new Promise<number>((resolve, reject) => {
      syscall.async(nr, waiters, count, 0, deadline, CLOCK_MONOTONIC, (error: unknown, rc: unknown) => {
        if (error) reject(error instanceof Error ? error : new Error(String(error)));
        else resolve(Number(rc));
      });
    });
}
