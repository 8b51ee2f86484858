/* Futex waits, wake-ups, fences, liveness checks and the C latency floor for the shm backend.
 *
 * Everything here works on plain 32-bit words of a MAP_SHARED mapping, so a peer written in any
 * language (Node through koffi: syscall(SYS_futex, ...) and Atomics on an Int32Array) can speak
 * the same protocol. No FUTEX_PRIVATE_FLAG: the words are shared between processes.
 * Protocol and layout: docs/shm.md.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tp_native.h"

#define TP_SLEEP 0x80000000u
#define TP_MASK 0x7FFFFFFFu
#define TP_YIELD_EVERY 256 /* a power of two */

#if defined(__x86_64__) || defined(__i386__)
#define tp_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define tp_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define tp_relax() __asm__ __volatile__("" ::: "memory")
#endif

/* -- atomics and fences ------------------------------------------------------------------- */

uint32_t tp_load_acquire(uint32_t *word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

void tp_store_release(uint32_t *word, uint32_t value) {
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
}

uint32_t tp_exchange(uint32_t *word, uint32_t value) {
    return __atomic_exchange_n(word, value, __ATOMIC_SEQ_CST);
}

int tp_cas(uint32_t *word, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(word, &expected, desired, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

void tp_fence_acquire(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }

void tp_fence_release(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }

/* -- futex ----------------------------------------------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* 0: woken (or the word no longer held `expected`), TP_TIMEOUT, or TP_ERRNO. */
int tp_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
        tsp = &ts;
    }
    long rc = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, NULL, 0);
    if (rc == 0) return TP_OK;
    if (errno == EAGAIN || errno == EINTR) return TP_OK;
    if (errno == ETIMEDOUT) return TP_TIMEOUT;
    return TP_ERRNO;
}

int tp_futex_wake(uint32_t *word, int count) {
    long rc = syscall(SYS_futex, word, FUTEX_WAKE, count, NULL, NULL, 0);
    return rc < 0 ? TP_ERRNO : (int)rc;
}

/* -- liveness ------------------------------------------------------------------------------ */

/* Field 22 (starttime, clock ticks since boot) of /proc/<pid>/stat; 0 when the process does
 * not exist or is a zombie (state Z or X: dead, only not yet reaped). */
uint64_t tp_proc_start_time(uint32_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) return 0;
    buf[len] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL || p[1] != ' ') return 0;
    p += 2; /* field 3: state */
    if (*p == 'Z' || *p == 'X' || *p == 'x') return 0;
    int field = 3;
    while (*p && field < 22) {
        if (*p == ' ') field++;
        p++;
    }
    if (field != 22) return 0;
    uint64_t value = 0;
    while (*p >= '0' && *p <= '9') value = value * 10 + (uint64_t)(*p++ - '0');
    return value;
}

/* 1 if pid runs (not a zombie) and, when start_time != 0, started at start_time. */
int tp_peer_alive(uint32_t pid, uint64_t start_time) {
    if (pid == 0) return 0;
    uint64_t found = tp_proc_start_time(pid);
    if (found == 0) return 0;
    return start_time == 0 || found == start_time;
}

/* -- waiting --------------------------------------------------------------------------------- */

/* Store `value` (release) and wake the word's sleepers if one announced itself. */
int tp_publish_word(uint32_t *word, uint32_t value) {
    uint32_t old = __atomic_exchange_n(word, value & TP_MASK, __ATOMIC_SEQ_CST);
    if (old & TP_SLEEP) {
        tp_futex_wake(word, INT_MAX);
        return 1;
    }
    return 0;
}

/* The one wait loop. Returns the word's sequence (>= 0) once cond holds, or an error:
 * cond: (value & MASK) == target when `want_equal`, != target otherwise. */
static int64_t wait_loop(tp_ctx *ctx, uint32_t *word, uint32_t target, int want_equal,
                         int64_t timeout_ns) {
    int64_t spins = 0;
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
    int checked = 0;
    for (;;) {
        uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        uint32_t seq = v & TP_MASK;
        if ((seq == target) == (want_equal != 0)) return (int64_t)seq;
        if (spins < ctx->spin) {
            spins++;
            tp_relax();
            /* Every TP_YIELD_EVERY spins, give the CPU away: if the peer shares this core
             * (an oversubscribed machine) it runs now instead of after the whole budget. */
            if ((spins & (TP_YIELD_EVERY - 1)) == 0) {
                sched_yield();
                if ((spins & 0xFFFF) == 0 && now_ns() >= deadline) return TP_TIMEOUT;
            }
            continue;
        }
        if (ctx->state != NULL &&
            __atomic_load_n(ctx->state, __ATOMIC_ACQUIRE) != ctx->ready_state)
            return TP_CLOSED;
        int64_t now = now_ns();
        if (now >= deadline) return TP_TIMEOUT;
        if (checked && ctx->peer_pid != 0 && !tp_peer_alive(ctx->peer_pid, ctx->peer_start))
            return TP_PEER_DEAD;
        checked = 1;
        if (!(v & TP_SLEEP)) {
            if (!__atomic_compare_exchange_n(word, &v, v | TP_SLEEP, 0, __ATOMIC_SEQ_CST,
                                             __ATOMIC_SEQ_CST))
                continue; /* the word changed meanwhile: look again */
            v |= TP_SLEEP;
        }
        int64_t slice = deadline - now;
        if (ctx->slice_ns > 0 && slice > ctx->slice_ns) slice = ctx->slice_ns;
        ctx->sleeps++;
        if (tp_futex_wait(word, v, slice) == TP_ERRNO) return TP_ERRNO;
    }
}

int tp_wait_value(tp_ctx *ctx, uint32_t *word, uint32_t target, int64_t timeout_ns) {
    int64_t rc = wait_loop(ctx, word, target & TP_MASK, 1, timeout_ns);
    return rc >= 0 ? TP_OK : (int)rc;
}

int64_t tp_wait_change(tp_ctx *ctx, uint32_t *word, uint32_t last, int64_t timeout_ns) {
    return wait_loop(ctx, word, last & TP_MASK, 0, timeout_ns);
}

#define SLOT_WORD(ctx, i, off) ((uint32_t *)((ctx)->slots + (uint64_t)(i) * (ctx)->stride + (off)))

/* Client: wait until every slot's response word equals its request sequence. Returns TP_OK,
 * i + 1 when slot i (the first one) carries a non-zero status, or a negative error. */
int tp_client_wait(tp_ctx *ctx, int64_t timeout_ns) {
    int64_t deadline = timeout_ns < 0 ? -1 : now_ns() + timeout_ns;
    for (uint32_t i = 0; i < ctx->n; i++) {
        uint32_t *resp = SLOT_WORD(ctx, i, ctx->resp_off);
        uint32_t target = ctx->seqs[i];
        if ((__atomic_load_n(resp, __ATOMIC_ACQUIRE) & TP_MASK) == target) continue;
        int64_t left = -1;
        if (deadline >= 0) {
            left = deadline - now_ns();
            if (left < 0) left = 0;
        }
        int64_t rc = wait_loop(ctx, resp, target, 1, left);
        if (rc < 0) return (int)rc;
    }
    for (uint32_t i = 0; i < ctx->n; i++) {
        uint16_t status = *(uint16_t *)(ctx->slots + (uint64_t)i * ctx->stride + ctx->status_off);
        if (status != 0) return (int)i + 1;
    }
    return TP_OK;
}

/* Client: publish one request in every slot (the command, action, seed are already written),
 * ring the doorbell once, then wait for every response. */
int tp_client_roundtrip(tp_ctx *ctx, int64_t timeout_ns) {
    for (uint32_t i = 0; i < ctx->n; i++) {
        uint32_t seq = (ctx->seqs[i] + 1) & TP_MASK;
        ctx->seqs[i] = seq;
        __atomic_store_n(SLOT_WORD(ctx, i, ctx->req_off), seq, __ATOMIC_RELEASE);
    }
    ctx->doorbell_seq = (ctx->doorbell_seq + 1) & TP_MASK;
    if (tp_publish_word(ctx->doorbell, ctx->doorbell_seq)) ctx->wakes++;
    return tp_client_wait(ctx, timeout_ns);
}

/* Server: mark the slots whose request word differs from their response word; returns their
 * count. *same_cmd: the command they all carry, or -1 when they differ. */
int tp_server_pending(tp_ctx *ctx, uint8_t *pending, uint32_t cmd_off, int32_t *same_cmd) {
    int count = 0;
    int32_t cmd = -2;
    for (uint32_t i = 0; i < ctx->n; i++) {
        uint32_t req = __atomic_load_n(SLOT_WORD(ctx, i, ctx->req_off), __ATOMIC_ACQUIRE) & TP_MASK;
        uint32_t resp = __atomic_load_n(SLOT_WORD(ctx, i, ctx->resp_off), __ATOMIC_RELAXED) & TP_MASK;
        if (req != resp) {
            pending[i] = 1;
            ctx->seqs[i] = req; /* answer exactly this request, even if a newer one follows */
            count++;
            int32_t c = (int32_t)*SLOT_WORD(ctx, i, cmd_off);
            cmd = cmd == -2 ? c : (cmd == c ? cmd : -1);
        } else {
            pending[i] = 0;
        }
    }
    *same_cmd = cmd == -2 ? -1 : cmd;
    return count;
}

/* Server: write `status` (if >= 0) into every pending slot, then publish its response word
 * (= the request sequence tp_server_pending saw, release) and wake the client if it sleeps. */
int tp_server_publish(tp_ctx *ctx, const uint8_t *pending, int32_t status) {
    int woken = 0;
    for (uint32_t i = 0; i < ctx->n; i++) {
        if (!pending[i]) continue;
        if (status >= 0)
            *(uint16_t *)(ctx->slots + (uint64_t)i * ctx->stride + ctx->status_off) =
                (uint16_t)status;
        woken += tp_publish_word(SLOT_WORD(ctx, i, ctx->resp_off), ctx->seqs[i]);
    }
    ctx->wakes += (uint64_t)woken;
    return woken;
}

/* Wake every sleeper of the doorbell and of every response word (closing: they re-read the
 * state word and see it is no longer READY). */
void tp_wake_all(tp_ctx *ctx) {
    tp_futex_wake(ctx->doorbell, INT_MAX);
    for (uint32_t i = 0; i < ctx->n; i++) tp_futex_wake(SLOT_WORD(ctx, i, ctx->resp_off), INT_MAX);
}

/* -- segments -------------------------------------------------------------------------------- */

/* Create a segment 0600 with O_EXCL and reserve its pages (posix_fallocate: a full /dev/shm is
 * an error here, never a SIGBUS later). Returns the fd or -errno. */
int tp_shm_create(const char *name, uint64_t size) {
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    if (fchmod(fd, 0600) != 0) {
        int err = errno;
        close(fd);
        shm_unlink(name);
        return -err;
    }
    int err = posix_fallocate(fd, 0, (off_t)size);
    if (err != 0) {
        close(fd);
        shm_unlink(name);
        return -err;
    }
    return fd;
}

int tp_shm_open(const char *name, int writable) {
    int fd = shm_open(name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
    return fd < 0 ? -errno : fd;
}

int tp_shm_unlink(const char *name) { return shm_unlink(name) == 0 ? 0 : -errno; }

/* -- the C floor ----------------------------------------------------------------------------- */

/* Round trips between two processes over two words of a shared region: `region` words 0 (ping)
 * and 16 (pong, its own cache line). role 0 pings and records each round trip's nanoseconds in
 * out_ns[k]; role 1 answers. mode: TP_MODE_SPIN (spin only), TP_MODE_FUTEX (sleep at once),
 * TP_MODE_BALANCED (spin `spin` times, then sleep). Both roles must use the same iterations;
 * the words must start at 0. Returns TP_OK, or TP_TIMEOUT when the peer stops answering. */
int tp_floor_pingpong(char *region, int role, int64_t iterations, int mode, int64_t *out_ns,
                      int64_t spin, int64_t timeout_ns) {
    uint32_t *ping = (uint32_t *)region;
    uint32_t *pong = (uint32_t *)(region + 64);
    tp_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.spin = mode == TP_MODE_SPIN ? INT64_MAX : (mode == TP_MODE_FUTEX ? 0 : spin);
    ctx.slice_ns = 0;
    for (int64_t k = 1; k <= iterations; k++) {
        uint32_t seq = (uint32_t)(k & TP_MASK);
        if (role == 0) {
            int64_t t0 = now_ns();
            tp_publish_word(ping, seq);
            int64_t rc = wait_loop(&ctx, pong, seq, 1, timeout_ns);
            if (rc < 0) return (int)rc;
            if (out_ns != NULL) out_ns[k - 1] = now_ns() - t0;
        } else {
            int64_t rc = wait_loop(&ctx, ping, seq, 1, timeout_ns);
            if (rc < 0) return (int)rc;
            tp_publish_word(pong, seq);
        }
    }
    return TP_OK;
}

/* The socket floor: round trips over a connected stream socket (Unix or TCP) with no protocol at
 * all. Role 0 sends `request_bytes` and reads `response_bytes`, recording each round trip's
 * nanoseconds in out_ns[k]; role 1 reads `request_bytes` and answers `response_bytes`. Blocking
 * I/O with SO_RCVTIMEO/SO_SNDTIMEO of `timeout_ns`. Returns TP_OK, TP_TIMEOUT (the peer went
 * silent), TP_PEER_DEAD (it closed) or TP_ERRNO. */
static int floor_io(int fd, char *buf, int64_t n, int sending) {
    int64_t done = 0;
    while (done < n) {
        ssize_t r = sending ? send(fd, buf + done, (size_t)(n - done), MSG_NOSIGNAL)
                            : recv(fd, buf + done, (size_t)(n - done), 0);
        if (r > 0) {
            done += r;
            continue;
        }
        if (r == 0) return TP_PEER_DEAD;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return TP_TIMEOUT;
        return errno == EPIPE || errno == ECONNRESET ? TP_PEER_DEAD : TP_ERRNO;
    }
    return TP_OK;
}

int tp_floor_socket(int fd, int role, int64_t iterations, int64_t request_bytes,
                    int64_t response_bytes, int64_t *out_ns, int64_t timeout_ns) {
    struct timeval tv = {.tv_sec = timeout_ns / 1000000000LL,
                         .tv_usec = (timeout_ns % 1000000000LL) / 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        return TP_ERRNO;
    int64_t size = request_bytes > response_bytes ? request_bytes : response_bytes;
    char *buf = calloc((size_t)(size > 0 ? size : 1), 1);
    if (buf == NULL) return TP_ERRNO;
    int rc = TP_OK;
    for (int64_t k = 0; k < iterations && rc == TP_OK; k++) {
        if (role == 0) {
            int64_t t0 = now_ns();
            rc = floor_io(fd, buf, request_bytes, 1);
            if (rc == TP_OK) rc = floor_io(fd, buf, response_bytes, 0);
            if (rc == TP_OK && out_ns != NULL) out_ns[k] = now_ns() - t0;
        } else {
            rc = floor_io(fd, buf, request_bytes, 0);
            if (rc == TP_OK) rc = floor_io(fd, buf, response_bytes, 1);
        }
    }
    free(buf);
    return rc;
}
