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
#include <signal.h>
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

/* 0: woken (or the word no longer held `expected`), TP_INTERRUPTED (a signal came: its
 * handler ran), TP_TIMEOUT, or TP_ERRNO. */
static int futex_wait_raw(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
        tsp = &ts;
    }
    long rc = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, NULL, 0);
    if (rc == 0) return TP_OK;
    if (errno == EAGAIN) return TP_OK;
    if (errno == EINTR) return TP_INTERRUPTED;
    if (errno == ETIMEDOUT) return TP_TIMEOUT;
    return TP_ERRNO;
}

/* 0: woken (or the word no longer held `expected`, or a signal came), TP_TIMEOUT, or TP_ERRNO. */
int tp_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    int rc = futex_wait_raw(word, expected, timeout_ns);
    return rc == TP_INTERRUPTED ? TP_OK : rc;
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

/* A channel lease word's holder runs (transport/channels/lease.py): while bit 31 is set the
 * lease is being taken and its start time is not written yet, so the pid alone decides. */
#define TP_LEASE_CLAIMING 0x80000000u
static int lease_holder_alive(uint32_t word, uint64_t start_time) {
    if (word & TP_LEASE_CLAIMING) return tp_peer_alive(word & ~TP_LEASE_CLAIMING, 0);
    return tp_peer_alive(word, start_time);
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

/* Before a waiter sleeps: TP_CLOSED once the region's state left READY, TP_TIMEOUT past the
 * deadline, TP_PEER_DEAD when the peer died (from the second look on: `*checked`), else TP_OK;
 * `*now` is the time it read. */
static int sleep_checks(tp_ctx *ctx, int64_t deadline, int *checked, int64_t *now) {
    if (ctx->state != NULL && __atomic_load_n(ctx->state, __ATOMIC_ACQUIRE) != ctx->ready_state)
        return TP_CLOSED;
    *now = now_ns();
    if (*now >= deadline) return TP_TIMEOUT;
    if (*checked && ctx->peer_pid != 0 && !tp_peer_alive(ctx->peer_pid, ctx->peer_start))
        return TP_PEER_DEAD;
    *checked = 1;
    return TP_OK;
}

#define TP_CHECK_NS ((int64_t)TP_CHECK_MS * 1000000LL)

/* A client wait's deadline: the one it had when it returned TP_INTERRUPTED (resumed), else
 * now + timeout_ns (INT64_MAX: none). */
static int64_t client_deadline(tp_ctx *ctx, int64_t timeout_ns) {
    if (ctx->resumed) return ctx->deadline;
    return timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
}

/* A client wait stops early (TP_INTERRUPTED) so that Python runs its signal handlers: a handler
 * runs in C at once, but Python's part of it (KeyboardInterrupt) only once the call returns.
 * Its sleep ends with EINTR when the signal comes to this thread while it sleeps; a signal that
 * came while it spun, or to another thread, is seen TP_CHECK_MS later at most. */
static int interrupted(tp_ctx *ctx, int64_t deadline) {
    ctx->deadline = deadline;
    return TP_INTERRUPTED;
}

/* The one wait loop. Returns the word's sequence (>= 0) once cond holds, or an error:
 * cond: (value & MASK) == target when `want_equal`, != target otherwise. `interruptible`
 * (client waits): TP_INTERRUPTED on a signal or after TP_CHECK_MS asleep; a resumed wait
 * (ctx->resumed, cleared here) does not spin again and checks the peer at once. */
static int64_t wait_loop(tp_ctx *ctx, uint32_t *word, uint32_t target, int want_equal,
                         int64_t deadline, int interruptible) {
    int64_t spins = 0;
    int checked = 0;
    int64_t asleep_since = -1;
    if (interruptible && ctx->resumed) {
        ctx->resumed = 0;
        spins = ctx->spin;
        checked = 1;
    }
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
        int64_t now;
        int rc = sleep_checks(ctx, deadline, &checked, &now);
        if (rc != TP_OK) return rc;
        if (interruptible) {
            if (asleep_since < 0)
                asleep_since = now;
            else if (now - asleep_since >= TP_CHECK_NS)
                return interrupted(ctx, deadline);
        }
        if (!(v & TP_SLEEP)) {
            if (!__atomic_compare_exchange_n(word, &v, v | TP_SLEEP, 0, __ATOMIC_SEQ_CST,
                                             __ATOMIC_SEQ_CST))
                continue; /* the word changed meanwhile: look again */
            v |= TP_SLEEP;
        }
        int64_t slice = deadline - now;
        if (ctx->slice_ns > 0 && slice > ctx->slice_ns) slice = ctx->slice_ns;
        if (interruptible && slice > TP_CHECK_NS) slice = TP_CHECK_NS;
        ctx->sleeps++;
        rc = futex_wait_raw(word, v, slice);
        if (rc == TP_ERRNO) return TP_ERRNO;
        if (rc == TP_INTERRUPTED && interruptible) return interrupted(ctx, deadline);
    }
}

static int64_t deadline_of(int64_t timeout_ns) {
    return timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
}

int tp_wait_value(tp_ctx *ctx, uint32_t *word, uint32_t target, int64_t timeout_ns) {
    int64_t rc = wait_loop(ctx, word, target & TP_MASK, 1, deadline_of(timeout_ns), 0);
    return rc >= 0 ? TP_OK : (int)rc;
}

int64_t tp_wait_change(tp_ctx *ctx, uint32_t *word, uint32_t last, int64_t timeout_ns) {
    return wait_loop(ctx, word, last & TP_MASK, 0, deadline_of(timeout_ns), 0);
}

#define SLOT_WORD(ctx, i, off) ((uint32_t *)((ctx)->slots + (uint64_t)(i) * (ctx)->stride + (off)))
/* How many slots ahead the scans over every slot prefetch a slot's first cache line (its
 * control words, on a line of its own per Appendix B): each slot's line comes from the other
 * core, and with the loads of the next slots already issued those transfers overlap instead of
 * queueing one after another. */
#define TP_PREFETCH_AHEAD 8

/* Client: wait (ctx's policy) until slot i's response word equals its request sequence. */
static int wait_slot(tp_ctx *ctx, uint32_t i, int64_t deadline) {
    uint32_t *resp = SLOT_WORD(ctx, i, ctx->resp_off);
    uint32_t target = ctx->seqs[i];
    if ((__atomic_load_n(resp, __ATOMIC_ACQUIRE) & TP_MASK) == target) return TP_OK;
    int64_t rc = wait_loop(ctx, resp, target, 1, deadline, 1);
    return rc < 0 ? (int)rc : TP_OK;
}

/* Client: wait until every slot's response word equals its request sequence. Returns TP_OK,
 * i + 1 when slot i (the first one) carries a non-zero status, or a negative error.
 *
 * The last slot is waited for first, then the others in order: servers publish in slot order
 * (tp_server_publish, the Node server), so once the last slot is answered the others are, and
 * the client spins (or sleeps: one wake-up a batch) on that one slot while the server publishes
 * the others, instead of reading each slot's line just as the server's next exchange needs it
 * back (each exchange then waits for a transfer between cores: ~10 us a batch of 256). */
static int client_wait(tp_ctx *ctx, int64_t deadline);

int tp_client_wait(tp_ctx *ctx, int64_t timeout_ns) {
    int rc = client_wait(ctx, client_deadline(ctx, timeout_ns));
    ctx->resumed = 0;
    return rc;
}

static int client_wait(tp_ctx *ctx, int64_t deadline) {
    uint32_t n = ctx->n;
    if (n > 1) {
        int rc = wait_slot(ctx, n - 1, deadline);
        if (rc < 0) return rc;
    }
    for (uint32_t i = 0; i + (n > 1) < n; i++) {
        if (i + TP_PREFETCH_AHEAD < n) /* the next slots' lines, from the server's core */
            __builtin_prefetch(SLOT_WORD(ctx, i + TP_PREFETCH_AHEAD, ctx->resp_off), 0, 3);
        int rc = wait_slot(ctx, i, deadline);
        if (rc < 0) return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
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
    ctx->resumed = 0; /* a new request: its own deadline (its wait is resumed with tp_client_wait) */
    return tp_client_wait(ctx, timeout_ns);
}

/* -- asynchronous batches ------------------------------------------------------------------ */

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449 /* the same number on every architecture (Linux 5.16+) */
#endif
#define TP_FUTEX_32 2
#define TP_WAITV_MAX 128        /* the kernel's limit per call */
#define TP_WAITV_FALLBACK_NS 200000 /* without futex_waitv: one word, slices of 200 us */

struct tp_waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};

static int waitv_missing = 0;

/* Sleep until one of `count` words no longer holds its value in `vals`, a wake-up, or
 * `timeout_ns`: FUTEX_WAITV (shared futexes). An older kernel: FUTEX_WAIT on the first word
 * in short slices (the others are seen at the next look). 0, TP_INTERRUPTED (a signal came)
 * or TP_ERRNO. */
static int wait_words(uint32_t **words, const uint32_t *vals, uint32_t count, int64_t timeout_ns) {
    if (count > TP_WAITV_MAX) count = TP_WAITV_MAX;
    if (!waitv_missing) {
        struct tp_waitv w[TP_WAITV_MAX];
        for (uint32_t j = 0; j < count; j++) {
            w[j].val = vals[j];
            w[j].uaddr = (uint64_t)(uintptr_t)words[j];
            w[j].flags = TP_FUTEX_32;
            w[j].reserved = 0;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t at = (int64_t)ts.tv_nsec + timeout_ns;
        ts.tv_sec += at / 1000000000LL;
        ts.tv_nsec = at % 1000000000LL;
        long rc = syscall(SYS_futex_waitv, w, count, 0, &ts, CLOCK_MONOTONIC);
        if (rc >= 0 || errno == EAGAIN || errno == ETIMEDOUT) return TP_OK;
        if (errno == EINTR) return TP_INTERRUPTED;
        if (errno != ENOSYS) return TP_ERRNO;
        waitv_missing = 1;
    }
    int64_t slice = timeout_ns < TP_WAITV_FALLBACK_NS ? timeout_ns : TP_WAITV_FALLBACK_NS;
    int rc = futex_wait_raw(words[0], vals[0], slice);
    return rc == TP_TIMEOUT ? TP_OK : rc;
}

/* Client: publish one request in each slot of `ids` (command and request fields are written)
 * and ring the doorbell once; no wait (the slots are in flight). */
void tp_client_send(tp_ctx *ctx, const uint32_t *ids, uint32_t count) {
    for (uint32_t k = 0; k < count; k++) {
        uint32_t i = ids[k];
        uint32_t seq = (ctx->seqs[i] + 1) & TP_MASK;
        ctx->seqs[i] = seq;
        __atomic_store_n(SLOT_WORD(ctx, i, ctx->req_off), seq, __ATOMIC_RELEASE);
    }
    ctx->doorbell_seq = (ctx->doorbell_seq + 1) & TP_MASK;
    if (tp_publish_word(ctx->doorbell, ctx->doorbell_seq)) ctx->wakes++;
}

/* Client: wait until `want` of the slots flagged in `in_flight` (ctx->n of them) are answered
 * (response word == seqs[i]); their indexes go to `out` in scan order, from slot `start`
 * round. Spin, then per slice: CLOSED, TIMEOUT, PEER_DEAD checks as in wait_loop, SLEEP set on
 * every unanswered word (CAS) and one FUTEX_WAITV on them. Returns the count found (== want,
 * or fewer when fewer are in flight) or a negative error. */
static int client_wait_any(tp_ctx *ctx, const uint8_t *in_flight, uint32_t want, uint32_t start,
                           uint32_t *out, int64_t deadline, int *hinted);

/* The RECV wake hint is this wait's only: cleared (seq_cst, before any later load of a
 * response word) when it returns, so that no other wait of the client (a RECV of every env,
 * which sleeps on one word; settle; SHUTDOWN) meets a server that holds back its wake-ups. */
int tp_client_wait_any(tp_ctx *ctx, const uint8_t *in_flight, uint32_t want, uint32_t start,
                       uint32_t *out, int64_t timeout_ns) {
    int hinted = 0;
    int rc = client_wait_any(ctx, in_flight, want, start, out, client_deadline(ctx, timeout_ns),
                             &hinted);
    ctx->resumed = 0;
    if (hinted) __atomic_store_n(ctx->recv_hint, 0, __ATOMIC_SEQ_CST);
    return rc;
}

static int client_wait_any(tp_ctx *ctx, const uint8_t *in_flight, uint32_t want, uint32_t start,
                           uint32_t *out, int64_t deadline, int *hinted) {
    uint32_t *words[TP_WAITV_MAX];
    uint32_t vals[TP_WAITV_MAX];
    int64_t spins = 0;
    int checked = 0;
    int64_t asleep_since = -1;
    uint32_t n = ctx->n;
    if (ctx->resumed) { /* after TP_INTERRUPTED: no new spin, the peer checked at once */
        ctx->resumed = 0;
        spins = ctx->spin;
        checked = 1;
    }
    for (;;) {
        uint32_t found = 0, answered = 0, waiting = 0, unanswered = 0;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = (start + k) % n;
            if (!in_flight[i]) continue;
            uint32_t *resp = SLOT_WORD(ctx, i, ctx->resp_off);
            uint32_t v = __atomic_load_n(resp, __ATOMIC_ACQUIRE);
            if ((v & TP_MASK) == ctx->seqs[i]) {
                answered++;
                if (found < want) out[found++] = i;
            } else {
                unanswered++;
                if (waiting < TP_WAITV_MAX) {
                    words[waiting] = resp;
                    vals[waiting] = v;
                    waiting++;
                }
            }
        }
        if (found >= want || unanswered == 0) return (int)found;
        /* a look at each word counts, and the budget is an eighth of a round trip's: results
         * that come "whenever an env is done" rarely come within a spin, and a spinning client
         * takes a core from the envs (measured: benchmarks/RESULTS.md, shm async) */
        if (spins * 8 < ctx->spin) {
            spins += 1 + unanswered;
            tp_relax();
            if ((spins & (TP_YIELD_EVERY - 1)) == 0) sched_yield();
            continue;
        }
        int64_t now;
        int rc = sleep_checks(ctx, deadline, &checked, &now);
        if (rc != TP_OK) return rc;
        if (asleep_since < 0)
            asleep_since = now;
        else if (now - asleep_since >= TP_CHECK_NS)
            return interrupted(ctx, deadline);
        if (!*hinted && ctx->recv_hint != NULL) {
            /* The wake hint (docs/shm.md "One wake per RECV"): wake me once fewer than
             * hint envs are unanswered, i.e. once `want` of the in-flight ones are answered.
             * 0 (no hint: a wake per publish) when this sleep cannot watch every unanswered
             * word (more than one futex_waitv takes, or no futex_waitv: one word at a time).
             * Stored seq_cst before any SLEEP bit is set and before the sleep: a server that
             * publishes after it and then loads the hint sees it (or the sleep sees the word
             * moved). */
            uint32_t inflight = answered + unanswered;
            uint32_t hint = (!waitv_missing && inflight <= TP_WAITV_MAX && want <= inflight)
                                ? inflight - want + 1
                                : 0;
            if (hint != 0) {
                __atomic_store_n(ctx->recv_hint, hint, __ATOMIC_SEQ_CST);
                *hinted = 1;
            }
        }
        int moved = 0;
        for (uint32_t j = 0; j < waiting && !moved; j++) {
            uint32_t v = vals[j];
            if (v & TP_SLEEP) continue;
            if (!__atomic_compare_exchange_n(words[j], &v, v | TP_SLEEP, 0, __ATOMIC_SEQ_CST,
                                             __ATOMIC_SEQ_CST))
                moved = 1; /* answered meanwhile: look again */
            else
                vals[j] = v | TP_SLEEP;
        }
        if (moved) continue;
        int64_t slice = deadline - now;
        if (ctx->slice_ns > 0 && slice > ctx->slice_ns) slice = ctx->slice_ns;
        if (slice > TP_CHECK_NS) slice = TP_CHECK_NS;
        ctx->sleeps++;
        rc = wait_words(words, vals, waiting, slice);
        if (rc == TP_ERRNO) return TP_ERRNO;
        if (rc == TP_INTERRUPTED) return interrupted(ctx, deadline);
        if (*hinted && waitv_missing) { /* found out just now: one word at a time, no hint */
            __atomic_store_n(ctx->recv_hint, 0, __ATOMIC_SEQ_CST);
            *hinted = 0;
        }
    }
}

/* Server with envs in worker processes: wait until word `a` (the doorbell, SLEEP protocol)
 * moves from `a_last` or word `b` (the pool's completion counter, woken by its workers) moves
 * from `b_last`. 1: a moved, 2: b moved (a first), 0: neither within timeout_ns, or an error
 * (CLOSED when the region's state left READY). */
int tp_wait_either(tp_ctx *ctx, uint32_t *a, uint32_t a_last, uint32_t *b, uint32_t b_last,
                   int64_t timeout_ns) {
    int64_t deadline = now_ns() + timeout_ns;
    for (int64_t spins = 0;; spins++) {
        uint32_t va = __atomic_load_n(a, __ATOMIC_ACQUIRE);
        if ((va & TP_MASK) != (a_last & TP_MASK)) return 1;
        uint32_t vb = __atomic_load_n(b, __ATOMIC_ACQUIRE);
        if (vb != b_last) return 2;
        (void)spins; /* no spin: the workers need the cores more than this wait does */
        if (ctx->state != NULL &&
            __atomic_load_n(ctx->state, __ATOMIC_ACQUIRE) != ctx->ready_state)
            return TP_CLOSED;
        int64_t now = now_ns();
        if (now >= deadline) return 0;
        if (!(va & TP_SLEEP)) {
            if (!__atomic_compare_exchange_n(a, &va, va | TP_SLEEP, 0, __ATOMIC_SEQ_CST,
                                             __ATOMIC_SEQ_CST))
                continue;
            va |= TP_SLEEP;
        }
        uint32_t *words[2] = {a, b};
        uint32_t vals[2] = {va, vb};
        ctx->sleeps++; /* a signal (TP_INTERRUPTED) only ends this sleep: the server goes on */
        if (wait_words(words, vals, 2, deadline - now) == TP_ERRNO) return TP_ERRNO;
    }
}

/* Server: mark the slots whose request word differs from their response word; returns their
 * count. *same_cmd: the command they all carry, or -1 when they differ. */
int tp_server_pending(tp_ctx *ctx, uint8_t *pending, uint32_t cmd_off, int32_t *same_cmd) {
    int count = 0;
    int32_t cmd = -2;
    uint32_t n = ctx->n;
    for (uint32_t i = 0; i < n; i++) {
        if (i + TP_PREFETCH_AHEAD < n)
            __builtin_prefetch(SLOT_WORD(ctx, i + TP_PREFETCH_AHEAD, ctx->req_off), 1, 3);
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
 * (= the request sequence tp_server_pending saw, release) and wake the client if it sleeps.
 *
 * Two passes: the statuses first, each stored only when it changes (a slot's status shares a
 * cache line the client reads after every response: storing the same 0 again would take that
 * line from the client's core, and the next publish's exchange, a full fence, would wait for
 * that transfer, slot after slot); then the response words in slot order, whose exchanges
 * order the status stores before them (a client waits on the last slot meanwhile:
 * tp_client_wait). */
int tp_server_publish(tp_ctx *ctx, const uint8_t *pending, int32_t status) {
    int woken = 0;
    uint32_t n = ctx->n;
    if (status >= 0) {
        uint16_t value = (uint16_t)status;
        for (uint32_t i = 0; i < n; i++) {
            if (!pending[i]) continue;
            uint16_t *word = (uint16_t *)(ctx->slots + (uint64_t)i * ctx->stride + ctx->status_off);
            if (*word != value) *word = value;
        }
    }
    for (uint32_t i = 0; i < n; i++) { /* in slot order: the last slot last (tp_client_wait) */
        if (!pending[i]) continue;
        if (i + TP_PREFETCH_AHEAD < n)
            __builtin_prefetch(SLOT_WORD(ctx, i + TP_PREFETCH_AHEAD, ctx->resp_off), 1, 3);
        woken += tp_publish_word(SLOT_WORD(ctx, i, ctx->resp_off), ctx->seqs[i]);
    }
    ctx->wakes += (uint64_t)woken;
    return woken;
}

/* Server, asynchronous batches: publish the response word of every pending slot (statuses and
 * results are written), like tp_server_publish, but wake the client only when its RECV can
 * complete: the RECV wake hint h (final area 0, byte 4, written by the client before it sleeps)
 * says "wake me once fewer than h of my in-flight envs are unanswered"; `remaining` is how many
 * envs this server still has in flight (never more than the client counts unanswered: requests
 * the server has not seen yet are unanswered for the client only). h == 0 (an older client, or
 * one that cannot watch every word) or no hint word: every sleeping word is woken, as before.
 *
 * No lost wake-up: the client stores the hint (seq_cst), sets SLEEP on each unanswered word
 * (CAS) and sleeps on all of them (futex_waitv); the server exchanges each word (seq_cst), then
 * loads the hint. A publish that reads the previous hint came before the client's store, so
 * the client's CAS or its futex_waitv sees the word moved. A publish withheld here leaves the
 * client asleep on the other words, which the publish that completes its RECV wakes (each of
 * them was unanswered, so watched, when the client went to sleep); a slice timeout, CLOSED
 * (tp_wake_all) or a dead server end its sleep as before. */
int tp_server_publish_async(tp_ctx *ctx, const uint8_t *pending, uint32_t remaining) {
    uint32_t n = ctx->n;
    uint32_t sleepers[TP_WAITV_MAX];
    uint32_t asleep = 0, overflow = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!pending[i]) continue;
        uint32_t *word = SLOT_WORD(ctx, i, ctx->resp_off);
        uint32_t old = __atomic_exchange_n(word, ctx->seqs[i] & TP_MASK, __ATOMIC_SEQ_CST);
        if (old & TP_SLEEP) {
            if (asleep < TP_WAITV_MAX)
                sleepers[asleep++] = i;
            else
                overflow = 1;
        }
    }
    if (asleep == 0) return 0;
    uint32_t hint = ctx->recv_hint == NULL ? 0 : __atomic_load_n(ctx->recv_hint, __ATOMIC_SEQ_CST);
    if (hint != 0 && remaining >= hint && !overflow) return 0; /* the RECV cannot end yet */
    int woken = 0;
    if (overflow) { /* more sleeping words than listed: wake every pending one */
        for (uint32_t i = 0; i < n; i++)
            if (pending[i]) {
                tp_futex_wake(SLOT_WORD(ctx, i, ctx->resp_off), INT_MAX);
                woken++;
            }
    } else if (hint != 0) { /* a hinting client sleeps on every word at once: one wake ends it */
        tp_futex_wake(SLOT_WORD(ctx, sleepers[0], ctx->resp_off), INT_MAX);
        woken = 1;
    } else {
        for (uint32_t j = 0; j < asleep; j++) {
            tp_futex_wake(SLOT_WORD(ctx, sleepers[j], ctx->resp_off), INT_MAX);
            woken++;
        }
    }
    ctx->wakes += (uint64_t)woken;
    return woken;
}

/* -- the env runtime's screens (transport/runtime/core.py) ------------------------------------
 * Whole-batch checks over strided columns (any row stride: shm slots, packed rows), each one
 * pass instead of several NumPy whole-array operations (~1 us each at 256 rows). */

static inline int64_t tp_item(const char *p, uint32_t itemsize, int is_signed) {
    switch (itemsize) {
    case 1: return is_signed ? (int64_t)*(const int8_t *)p : (int64_t)*(const uint8_t *)p;
    case 2: return is_signed ? (int64_t)*(const int16_t *)p : (int64_t)*(const uint16_t *)p;
    case 4: return is_signed ? (int64_t)*(const int32_t *)p : (int64_t)*(const uint32_t *)p;
    default: {
        uint64_t v = *(const uint64_t *)p;
        if (!is_signed && v > (uint64_t)INT64_MAX) return -1; /* out of any range */
        return (int64_t)v;
    }
    }
}

/* 1 when each of the n actions (integers of `itemsize` bytes, `stride` bytes apart) is in
 * [0, act_n) and, with a mask (n rows `mask_stride` bytes apart, at least act_n bytes each),
 * its row's entry for it is not 0; else 0 (the caller's full check says which env and why). */
int tp_screen_actions(const char *actions, int64_t stride, uint32_t itemsize, int32_t is_signed,
                      uint32_t n, int64_t act_n, const uint8_t *mask, int64_t mask_stride) {
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) return 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t a = tp_item(actions + (int64_t)i * stride, itemsize, is_signed);
        if (a < 0 || a >= act_n) return 0;
        if (mask != NULL && mask[(int64_t)i * mask_stride + a] == 0) return 0;
    }
    return 1;
}

/* 1 when each of the `count` floats (f32 or f64: `itemsize` 4 or 8, contiguous) of each of
 * the n rows (`stride` bytes apart) is in [low, high] (`strict_low` / `strict_high`: the open
 * side, for an infinite bound that refuses +-inf) and not NaN; else 0. An f32 is compared as the
 * double it widens to, as NumPy compares an f32 batch with f64 bounds. */
int tp_screen_floats(const char *rows, int64_t stride, uint32_t n, uint32_t count,
                     uint32_t itemsize, double low, double high, int32_t strict_low,
                     int32_t strict_high) {
    if (itemsize != 4 && itemsize != 8) return 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *row = rows + (int64_t)i * stride;
        for (uint32_t k = 0; k < count; k++) {
            double x = itemsize == 4 ? (double)((const float *)row)[k] : ((const double *)row)[k];
            if (!(strict_low ? x > low : x >= low)) return 0; /* NaN fails every comparison */
            if (!(strict_high ? x < high : x <= high)) return 0;
        }
    }
    return 1;
}

/* 1 when any of the n items (`itemsize` bytes each, `stride` bytes apart) has a byte that is
 * not 0 (integer and bool columns: the item is not 0). */
int tp_strided_any(const char *base, int64_t stride, uint32_t itemsize, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const char *p = base + (int64_t)i * stride;
        for (uint32_t b = 0; b < itemsize; b++)
            if (p[b]) return 1;
    }
    return 0;
}

/* Wake every sleeper of the doorbell and of every response word (closing: they re-read the
 * state word and see it is no longer READY). */
void tp_wake_all(tp_ctx *ctx) {
    tp_futex_wake(ctx->doorbell, INT_MAX);
    for (uint32_t i = 0; i < ctx->n; i++) tp_futex_wake(SLOT_WORD(ctx, i, ctx->resp_off), INT_MAX);
}

/* -- guarded mappings --------------------------------------------------------------------------
 * A same-uid process can ftruncate a segment under its users; touching a page past the new end
 * raises SIGBUS, which kills a process by default. For a guarded mapping the handler instead
 * maps private zero pages over the whole mapping (the faulting access then completes) and marks
 * it lost: the shared state word now reads 0, so the next wait returns TP_CLOSED and the caller
 * asks tp_guard_lost why. A SIGBUS elsewhere goes to the previous handler (Python's
 * faulthandler, or the default action). */
#define TP_GUARDS 256 /* a handle is (generation << 8) | entry */

static struct {
    char *volatile base;
    volatile uint64_t length;
    volatile sig_atomic_t lost;
    int generation;
} guards[TP_GUARDS];
static struct sigaction previous_sigbus;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    (void)context;
    if (info->si_code > 0) { /* a fault (a signal sent with kill or raise has si_code <= 0) */
        char *addr = (char *)info->si_addr;
        for (int i = 0; i < TP_GUARDS; i++) {
            char *base = guards[i].base;
            if (base == NULL || addr < base || addr >= base + guards[i].length) continue;
            if (mmap(base, guards[i].length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
                guards[i].lost = 1;
                return; /* the access is retried on the zero pages */
            }
            break;
        }
    }
    /* Not ours: hand SIGBUS back to the previous disposition (Python's faulthandler, the
     * default action). A fault repeats when this returns and goes there; a sent signal is
     * sent again. Calling the previous handler from here instead could loop with handlers
     * that restore their own predecessor (faulthandler does). */
    sigaction(SIGBUS, &previous_sigbus, NULL);
    if (info->si_code <= 0) raise(sig);
}

static int guard_entry(int handle) {
    int i = handle & (TP_GUARDS - 1);
    return handle >= 0 && guards[i].base != NULL && guards[i].generation == handle >> 8 ? i : -1;
}

/* Guard [base, base + length); returns its handle (>= 0) or -1 when every entry is taken. An
 * entry overlapping the new range belonged to a mapping that is gone: it is dropped. */
int tp_guard_add(char *base, uint64_t length) {
    /* (Re)install the handler when it is not the current one: a library may have taken
     * SIGBUS since (faulthandler.enable(), Ray); it becomes the previous disposition. */
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) return -1;
    if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_sigbus;
        action.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGBUS, &action, NULL) != 0) return -1;
        previous_sigbus = current;
    }
    int free_entry = -1;
    for (int i = 0; i < TP_GUARDS; i++) {
        char *other = guards[i].base;
        if (other != NULL && other < base + length && base < other + guards[i].length)
            __atomic_store_n(&guards[i].base, NULL, __ATOMIC_RELEASE);
        if (free_entry < 0 && guards[i].base == NULL) free_entry = i;
    }
    if (free_entry < 0) return -1;
    guards[free_entry].lost = 0;
    guards[free_entry].length = length;
    guards[free_entry].generation = (guards[free_entry].generation + 1) & 0x3FFFFF;
    __atomic_store_n(&guards[free_entry].base, base, __ATOMIC_RELEASE);
    return (guards[free_entry].generation << 8) | free_entry;
}

/* Stop guarding (the mapping is unmapped); a handle whose entry was reused is ignored. */
void tp_guard_remove(int handle) {
    int i = guard_entry(handle);
    if (i >= 0) __atomic_store_n(&guards[i].base, NULL, __ATOMIC_RELEASE);
}

/* 1 when a SIGBUS replaced the guarded mapping with private zero pages. */
int tp_guard_lost(int handle) {
    int i = guard_entry(handle);
    return i >= 0 && guards[i].lost;
}

/* -- mapping lifetimes (docs/shm.md, "Lifetimes") -------------------------------------------
 * A region's results are views straight into its mapping, and a caller may keep them past
 * close(). So close() never leaves a hole under a view: when views may remain, the shared pages
 * are replaced in place, at the same address and atomically (mremap over them), by a private
 * copy of their current contents. The views keep reading the values they had at close, writes
 * through them reach no other process, the segment's pages are no longer held by this process,
 * and the private copy is unmapped with tp_unmap once the last view is gone. */

/* mmap(MAP_SHARED, read-write) of `length` bytes of `fd`; NULL (errno set) on failure. */
char *tp_map_shared(int fd, uint64_t length) {
    void *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return base == MAP_FAILED ? NULL : (char *)base;
}

/* munmap; 0 or -errno. */
int tp_unmap(char *base, uint64_t length) {
    return munmap(base, length) == 0 ? 0 : -errno;
}

/* Replace [base, base + length) by a private anonymous copy of its contents (see above); 0 or
 * -errno (the original mapping is then untouched). A guarded mapping should stay guarded
 * while this copies: a truncated segment faults here, and the guard turns that into zeros. */
int tp_privatize(char *base, uint64_t length) {
    void *copy = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) return -errno;
    memcpy(copy, base, length);
    if (mremap(copy, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, base) == MAP_FAILED) {
        int err = errno;
        munmap(copy, length);
        return -err;
    }
    return 0;
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
            int64_t rc = wait_loop(&ctx, pong, seq, 1, deadline_of(timeout_ns), 0);
            if (rc < 0) return (int)rc;
            if (out_ns != NULL) out_ns[k - 1] = now_ns() - t0;
        } else {
            int64_t rc = wait_loop(&ctx, ping, seq, 1, deadline_of(timeout_ns), 0);
            if (rc < 0) return (int)rc;
            tp_publish_word(pong, seq);
        }
    }
    return TP_OK;
}

/* The shared-memory floor of a batch: round trips that move a row's bytes through a shared
 * mapping with no protocol. Role 0 copies `request_bytes` from its own memory into the region
 * and pings; role 1 waits, copies `response_bytes` from its own memory into the region (as an
 * env writes its results into its slot) and pongs; role 0 takes the response in place (an shm
 * client's views copy nothing). The words are tp_floor_pingpong's (0 and 64); the request at
 * byte 128 of `region`, the response after it at a multiple of 64 (`FLOOR_SHM_DATA`). Returns
 * TP_OK, TP_TIMEOUT when the peer stops answering, or TP_ERRNO when no memory is left. */
int tp_floor_shm(char *region, int role, int64_t iterations, int mode, int64_t request_bytes,
                 int64_t response_bytes, int64_t *out_ns, int64_t spin, int64_t timeout_ns) {
    uint32_t *ping = (uint32_t *)region;
    uint32_t *pong = (uint32_t *)(region + 64);
    char *request = region + 128;
    char *response = request + ((request_bytes + 63) / 64) * 64;
    int64_t own_bytes = role == 0 ? request_bytes : response_bytes;
    char *own = malloc(own_bytes > 0 ? (size_t)own_bytes : 1);
    if (own == NULL) return TP_ERRNO;
    memset(own, role + 1, own_bytes > 0 ? (size_t)own_bytes : 1);
    tp_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.spin = mode == TP_MODE_SPIN ? INT64_MAX : (mode == TP_MODE_FUTEX ? 0 : spin);
    ctx.slice_ns = 0;
    int result = TP_OK;
    for (int64_t k = 1; k <= iterations; k++) {
        uint32_t seq = (uint32_t)(k & TP_MASK);
        if (role == 0) {
            int64_t t0 = now_ns();
            memcpy(request, own, (size_t)request_bytes);
            tp_publish_word(ping, seq);
            int64_t rc = wait_loop(&ctx, pong, seq, 1, deadline_of(timeout_ns), 0);
            if (rc < 0) {
                result = (int)rc;
                break;
            }
            if (out_ns != NULL) out_ns[k - 1] = now_ns() - t0;
        } else {
            int64_t rc = wait_loop(&ctx, ping, seq, 1, deadline_of(timeout_ns), 0);
            if (rc < 0) {
                result = (int)rc;
                break;
            }
            memcpy(response, own, (size_t)response_bytes);
            tp_publish_word(pong, seq);
        }
    }
    free(own);
    return result;
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

/* -- channels: experience rings (docs/channels.md, schema/channels.toml) ---------------------- */

uint64_t tp_load64_acquire(uint64_t *word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

void tp_store64_release(uint64_t *word, uint64_t value) {
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
}

int tp_cas64(uint64_t *word, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(word, &expected, desired, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

uint64_t tp_fetch_add64(uint64_t *word, uint64_t delta) {
    return __atomic_fetch_add(word, delta, __ATOMIC_SEQ_CST);
}

void tp_fence_seq_cst(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

int64_t tp_monotonic_ns(void) { return now_ns(); }

/* After a seq_cst change of what a sleeper waits for: if the word says a waiter sleeps, bump its
 * sequence and FUTEX_WAKE. A waker whose peer is awake writes nothing (no line bouncing). */
int tp_wake_if_sleeping(uint32_t *word) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint32_t v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (!(v & TP_SLEEP)) return 0;
    __atomic_exchange_n(word, ((v & TP_MASK) + 1) & TP_MASK, __ATOMIC_SEQ_CST);
    tp_futex_wake(word, INT_MAX);
    return 1;
}

/* ProducerEntry fields (schema/channels.toml). */
#define PE_SIZE 64
#define PE_PID(r, i) ((uint32_t *)((r)->producers + (uint64_t)(i) * PE_SIZE))
#define PE_STATE(r, i) ((uint32_t *)((r)->producers + (uint64_t)(i) * PE_SIZE + 4))
#define PE_START(r, i) ((uint64_t *)((r)->producers + (uint64_t)(i) * PE_SIZE + 8))
#define PE_INTENT(r, i) ((uint64_t *)((r)->producers + (uint64_t)(i) * PE_SIZE + 16))
#define PE_COMMITTED(r, i) ((uint64_t *)((r)->producers + (uint64_t)(i) * PE_SIZE + 24))
#define PE_COUNT(r, i) ((uint32_t *)((r)->producers + (uint64_t)(i) * PE_SIZE + 32))
#define PS_ACTIVE 1u
#define PS_CLOSED 2u
#define PS_DEAD 3u
#define RING_OVERWRITE 1u

/* The cursor word: the consumer's tail (its low 32 bits) and the records it holds. The full
 * tail is recovered from head: head - tail <= capacity < 2^31. */
static inline uint64_t ring_tail(uint64_t head, uint64_t cursor) {
    return head - (uint64_t)(uint32_t)((uint32_t)head - (uint32_t)cursor);
}

static inline uint64_t ring_cursor(uint64_t tail, uint64_t held) {
    return (held << 32) | (tail & 0xFFFFFFFFull);
}

/* Sleep on `word` (which held `v` when the caller last found nothing to do) for one slice:
 * announce the sleep with CAS, let the caller re-check, then FUTEX_WAIT. Returns 1 if the caller
 * must re-check before sleeping (the CAS just succeeded or the word moved), 0 after a sleep. */
static int ring_sleep(tp_ring *r, uint32_t *word, uint32_t v, int announced, int64_t deadline) {
    if (!announced) {
        if (!(v & TP_SLEEP)) {
            if (!__atomic_compare_exchange_n(word, &v, v | TP_SLEEP, 0, __ATOMIC_SEQ_CST,
                                             __ATOMIC_SEQ_CST))
                return 1;
        }
        return 1; /* re-check the condition after the announcement: no lost wake-up */
    }
    int64_t slice = deadline - now_ns();
    if (slice <= 0) return 0;
    if (r->slice_ns > 0 && slice > r->slice_ns) slice = r->slice_ns;
    r->sleeps++;
    tp_futex_wait(word, v | TP_SLEEP, slice);
    return 0;
}

/* Consumer gone? 1 dead (or its lease lapsed), 2 closed cleanly, 0 alive or not attached yet. */
static int ring_consumer_gone(tp_ring *r) {
    uint32_t st = __atomic_load_n(r->consumer_state, __ATOMIC_ACQUIRE);
    if (st == PS_CLOSED) return 2;
    uint32_t pid = __atomic_load_n(r->consumer_pid, __ATOMIC_ACQUIRE);
    if (pid == 0) return st == PS_DEAD ? 1 : 0;
    return lease_holder_alive(pid, __atomic_load_n(r->consumer_start, __ATOMIC_ACQUIRE)) ? 0 : 1;
}

/* Producer: reserve up to `want` contiguous records (at least one). Returns the first record's
 * index and *got, or TP_TIMEOUT, TP_CLOSED (segment closed or the consumer closed its side),
 * TP_PEER_DEAD (BLOCK: the consumer died). OVERWRITE: a full ring drops its oldest committed
 * record that the consumer does not hold (counted in `overwritten`); it waits only while the
 * consumer holds the slot it needs, or while its writer still writes it. */
int64_t tp_ring_reserve(tp_ring *r, uint32_t want, uint32_t *got, int64_t timeout_ns) {
    const uint64_t cap = r->capacity, mask = cap - 1;
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
    int64_t spins = 0;
    int announced = 0, checked = 0;
    if (want == 0) want = 1;
    for (;;) {
        uint32_t v = __atomic_load_n(r->space_word, __ATOMIC_SEQ_CST);
        uint64_t h = __atomic_load_n(r->head, __ATOMIC_SEQ_CST);
        uint64_t c = __atomic_load_n(r->cursor, __ATOMIC_SEQ_CST);
        uint64_t tail = ring_tail(h, c), held = c >> 32;
        uint64_t used = h - (tail - held);
        if (used < cap) {
            uint64_t n = cap - used;
            if (n > want) n = want;
            if (n > cap - (h & mask)) n = cap - (h & mask); /* contiguous: stop at the wrap */
            __atomic_store_n(PE_COUNT(r, r->me), (uint32_t)n, __ATOMIC_RELAXED);
            __atomic_store_n(PE_INTENT(r, r->me), h + 1, __ATOMIC_SEQ_CST);
            if (r->multi) {
                if (!__atomic_compare_exchange_n(r->head, &h, h + n, 0, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST))
                    continue;
            } else {
                __atomic_store_n(r->head, h + n, __ATOMIC_SEQ_CST);
            }
            *got = (uint32_t)n;
            return (int64_t)h;
        }
        if (r->policy == RING_OVERWRITE && held == 0 &&
            __atomic_load_n(&r->seqs[tail & mask], __ATOMIC_ACQUIRE) == tail + 1) {
            if (__atomic_compare_exchange_n(r->cursor, &c, ring_cursor(tail + 1, 0), 0,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                __atomic_fetch_add(r->overwritten, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (__atomic_load_n(r->state, __ATOMIC_ACQUIRE) != 1) return TP_CLOSED;
        if (spins < r->spin) {
            spins++;
            tp_relax();
            if ((spins & (TP_YIELD_EVERY - 1)) == 0) sched_yield();
            continue;
        }
        if (now_ns() >= deadline) return TP_TIMEOUT;
        if (announced) {
            int gone = checked ? ring_consumer_gone(r) : 0;
            checked = 1;
            if (gone == 2) return TP_CLOSED;
            if (gone == 1) {
                if (r->policy != RING_OVERWRITE) return TP_PEER_DEAD;
                if (held != 0) /* a dead consumer's held records are free again */
                    __atomic_compare_exchange_n(r->cursor, &c, ring_cursor(tail, 0), 0,
                                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
                continue;
            }
        }
        announced = ring_sleep(r, r->space_word, v, announced, deadline);
    }
}

/* Producer: publish records [first, first + count) (written in place), then wake the consumer
 * if it sleeps. */
void tp_ring_commit(tp_ring *r, uint64_t first, uint32_t count) {
    const uint64_t mask = (uint64_t)r->capacity - 1;
    for (uint32_t i = 0; i < count; i++)
        __atomic_store_n(&r->seqs[(first + i) & mask], first + i + 1, __ATOMIC_RELEASE);
    __atomic_store_n(PE_INTENT(r, r->me), 0, __ATOMIC_RELEASE);
    __atomic_fetch_add(PE_COMMITTED(r, r->me), count, __ATOMIC_RELAXED);
    if (tp_wake_if_sleeping(r->data_word)) r->wakes++;
}

/* Does producer entry i's current reservation cover record `k`? */
static int ring_entry_covers(tp_ring *r, uint32_t i, uint64_t k) {
    uint64_t intent = __atomic_load_n(PE_INTENT(r, i), __ATOMIC_ACQUIRE);
    uint64_t count = __atomic_load_n(PE_COUNT(r, i), __ATOMIC_ACQUIRE);
    return intent != 0 && intent - 1 <= k && k < intent - 1 + count;
}

/* Consumer, while nothing is committed at `tail`: look at the producers. Marks dead ones DEAD,
 * skips a dead producer's uncommitted record at `tail` (counted in `lost`; returns 1: look
 * again) unless a live producer's reservation covers it. Returns TP_PEER_DEAD / TP_CLOSED when
 * the ring is empty and every producer that ever attached is gone (one died: PEER_DEAD; all
 * closed: CLOSED), else 0. */
static int ring_check_producers(tp_ring *r, uint64_t h, uint64_t c) {
    const uint64_t mask = (uint64_t)r->capacity - 1;
    uint64_t tail = ring_tail(h, c);
    int stuck = tail < h &&
                __atomic_load_n(&r->seqs[tail & mask], __ATOMIC_ACQUIRE) != tail + 1;
    int seen = 0, live = 0, dead = 0, live_covers = 0;
    int64_t dead_owner = -1;
    for (uint32_t i = 0; i < r->max_producers; i++) {
        uint32_t pid = __atomic_load_n(PE_PID(r, i), __ATOMIC_ACQUIRE);
        uint32_t st = __atomic_load_n(PE_STATE(r, i), __ATOMIC_ACQUIRE);
        if (pid == 0 && st == 0) continue;
        seen++;
        if (pid & TP_LEASE_CLAIMING) { /* being taken: its state is still the last holder's */
            if (lease_holder_alive(pid, 0)) live++;
            else dead++;
            continue;
        }
        if (st == PS_ACTIVE) {
            if (tp_peer_alive(pid, __atomic_load_n(PE_START(r, i), __ATOMIC_ACQUIRE))) {
                live++;
                if (stuck && ring_entry_covers(r, i, tail)) live_covers = 1;
                continue;
            }
            __atomic_compare_exchange_n(PE_STATE(r, i), &st, PS_DEAD, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
            st = PS_DEAD;
        }
        if (st == PS_DEAD) {
            dead++;
            if (stuck && ring_entry_covers(r, i, tail)) dead_owner = i;
        }
    }
    if (dead_owner >= 0 && !live_covers) {
        /* the dead producer reserved this record and never committed it: skip it */
        if (__atomic_compare_exchange_n(r->cursor, &c, ring_cursor(tail + 1, c >> 32), 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            __atomic_fetch_add(r->lost, 1, __ATOMIC_RELAXED);
            if (!ring_entry_covers(r, (uint32_t)dead_owner, tail + 1))
                __atomic_store_n(PE_INTENT(r, (uint32_t)dead_owner), 0, __ATOMIC_RELEASE);
            if (tp_wake_if_sleeping(r->space_word)) r->wakes++;
        }
        return 1;
    }
    if (seen > 0 && live == 0 && tail == h) return dead > 0 ? TP_PEER_DEAD : TP_CLOSED;
    return 0;
}

/* Consumer: claim up to `max` committed records from the tail (contiguous: at most up to the
 * wrap). Returns the first index and *got, or TP_TIMEOUT, TP_CLOSED (the segment closed, or
 * every producer closed and the ring is drained), TP_PEER_DEAD (every producer gone, one died).
 * timeout_ns 0: do not wait. */
int64_t tp_ring_take(tp_ring *r, uint32_t max, uint32_t *got, int64_t timeout_ns) {
    const uint64_t cap = r->capacity, mask = cap - 1;
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
    int64_t spins = 0;
    int announced = 0, checked = 0;
    if (max == 0) max = 1;
    for (;;) {
        uint32_t v = __atomic_load_n(r->data_word, __ATOMIC_SEQ_CST);
        uint64_t c = __atomic_load_n(r->cursor, __ATOMIC_SEQ_CST);
        uint64_t h = __atomic_load_n(r->head, __ATOMIC_SEQ_CST);
        uint64_t tail = ring_tail(h, c), held = c >> 32;
        uint64_t lim = h - tail;
        if (lim > max) lim = max;
        if (lim > cap - (tail & mask)) lim = cap - (tail & mask);
        uint64_t n = 0;
        while (n < lim &&
               __atomic_load_n(&r->seqs[(tail + n) & mask], __ATOMIC_SEQ_CST) == tail + n + 1)
            n++;
        if (n > 0) {
            if (!__atomic_compare_exchange_n(r->cursor, &c, ring_cursor(tail + n, held + n), 0,
                                             __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                continue; /* a producer overwrote the oldest record meanwhile */
            *got = (uint32_t)n;
            return (int64_t)tail;
        }
        if (timeout_ns == 0) return TP_TIMEOUT;
        if (spins < r->spin) {
            spins++;
            tp_relax();
            if ((spins & (TP_YIELD_EVERY - 1)) == 0) sched_yield();
            continue;
        }
        if (__atomic_load_n(r->state, __ATOMIC_ACQUIRE) != 1) return TP_CLOSED;
        if (now_ns() >= deadline) return TP_TIMEOUT;
        if (announced) {
            int rc = checked || tail < h ? ring_check_producers(r, h, c) : 0;
            checked = 1;
            if (rc == 1) continue;
            if (rc < 0) return rc;
        }
        announced = ring_sleep(r, r->data_word, v, announced, deadline);
    }
}

/* Consumer: give back the `count` oldest records it holds; wake producers that wait for room. */
void tp_ring_release(tp_ring *r, uint32_t count) {
    uint64_t c = __atomic_load_n(r->cursor, __ATOMIC_SEQ_CST);
    for (;;) {
        uint64_t held = c >> 32;
        uint64_t n = count > held ? held : count;
        if (__atomic_compare_exchange_n(r->cursor, &c, ring_cursor(c, held - n), 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            break;
    }
    if (tp_wake_if_sleeping(r->space_word)) r->wakes++;
}
