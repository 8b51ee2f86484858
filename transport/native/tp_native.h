/* The C API of transport.native._native (declarations parsed by cffi's cdef, too).
 * Shared-memory words are 32-bit little-endian futex words: bits 0..30 a sequence number,
 * bit 31 (TP_SLEEP) "a waiter may sleep in FUTEX_WAIT on this word: wake it after changing it".
 * Region layout and protocol: docs/shm.md.
 */
#define TP_OK 0
#define TP_TIMEOUT -1
#define TP_PEER_DEAD -2
#define TP_CLOSED -3
#define TP_ERRNO -4
/* A client wait (tp_client_wait, tp_client_roundtrip's wait, tp_client_wait_any) came back
 * early so that its caller runs its signal handlers (Python: Ctrl-C's KeyboardInterrupt): a
 * signal interrupted its sleep, or TP_CHECK_MS passed asleep. Nothing failed: call the wait
 * again with ctx->resumed = 1 (it goes on to ctx->deadline, with no new spin). */
#define TP_INTERRUPTED -5
#define TP_CHECK_MS 50

#define TP_MODE_SPIN 0
#define TP_MODE_FUTEX 1
#define TP_MODE_BALANCED 2

typedef struct {
    char *slots;               /* address of slot 0 */
    uint64_t stride;           /* slot size in bytes */
    uint32_t n;                /* number of slots */
    uint32_t req_off;          /* offset of the request word in a slot */
    uint32_t resp_off;         /* offset of the response word in a slot */
    uint32_t status_off;       /* offset of the u16 status in a slot */
    uint32_t *seqs;            /* n per-slot sequence numbers (client: last request sent) */
    uint32_t *doorbell;        /* the control block's doorbell word */
    uint32_t doorbell_seq;     /* client: last doorbell value rung */
    uint32_t *state;           /* the control block's state word (READY = 1) */
    uint32_t ready_state;      /* the value of *state while the region serves */
    uint32_t peer_pid;         /* the process whose death ends a wait (0: none) */
    uint64_t peer_start;       /* its start time (/proc/<pid>/stat field 22); 0: pid only */
    int64_t spin;              /* spin iterations before sleeping */
    int64_t slice_ns;          /* one FUTEX_WAIT's length: the liveness re-check period */
    uint64_t wakes;            /* statistics: FUTEX_WAKE calls made */
    uint64_t sleeps;           /* statistics: FUTEX_WAIT calls made */
    uint32_t *recv_hint;       /* the RECV wake hint word (final area 0, byte 4), NULL: none */
    int64_t deadline;          /* a wait that returned TP_INTERRUPTED: its deadline (monotonic ns) */
    uint32_t resumed;          /* caller: 1 to resume that wait (cleared when the wait returns) */
} tp_ctx;

uint32_t tp_load_acquire(uint32_t *word);
void tp_store_release(uint32_t *word, uint32_t value);
uint32_t tp_exchange(uint32_t *word, uint32_t value);
int tp_cas(uint32_t *word, uint32_t expected, uint32_t desired);
void tp_fence_acquire(void);
void tp_fence_release(void);

int tp_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns);
int tp_futex_wake(uint32_t *word, int count);

uint64_t tp_proc_start_time(uint32_t pid);
int tp_peer_alive(uint32_t pid, uint64_t start_time);

int tp_publish_word(uint32_t *word, uint32_t value);
int tp_wait_value(tp_ctx *ctx, uint32_t *word, uint32_t target, int64_t timeout_ns);
int64_t tp_wait_change(tp_ctx *ctx, uint32_t *word, uint32_t last, int64_t timeout_ns);

int tp_client_roundtrip(tp_ctx *ctx, int64_t timeout_ns);
int tp_client_wait(tp_ctx *ctx, int64_t timeout_ns);
int tp_server_pending(tp_ctx *ctx, uint8_t *pending, uint32_t cmd_off, int32_t *same_cmd);
/* Asynchronous batches (docs/shm.md): publish the requests of some slots without waiting, and
 * wait for any `want` of the slots in flight. */
void tp_client_send(tp_ctx *ctx, const uint32_t *ids, uint32_t count);
int tp_client_wait_any(tp_ctx *ctx, const uint8_t *in_flight, uint32_t want, uint32_t start,
                       uint32_t *out, int64_t timeout_ns);
int tp_wait_either(tp_ctx *ctx, uint32_t *a, uint32_t a_last, uint32_t *b, uint32_t b_last,
                   int64_t timeout_ns);
int tp_server_publish(tp_ctx *ctx, const uint8_t *pending, int32_t status);
/* Publish answered in-flight slots; wake the client only when the RECV wake hint allows it
 * (`remaining` envs are still unanswered): docs/shm.md "One wake per RECV". */
int tp_server_publish_async(tp_ctx *ctx, const uint8_t *pending, uint32_t remaining);
void tp_wake_all(tp_ctx *ctx);
/* The env runtime's whole-batch screens over strided columns (transport/runtime/core.py). */
int tp_screen_actions(const char *actions, int64_t stride, uint32_t itemsize, int32_t is_signed,
                      uint32_t n, int64_t act_n, const uint8_t *mask, int64_t mask_stride);
int tp_screen_floats(const char *rows, int64_t stride, uint32_t n, uint32_t count,
                     uint32_t itemsize, double low, double high, int32_t strict_low,
                     int32_t strict_high);
int tp_strided_any(const char *base, int64_t stride, uint32_t itemsize, uint32_t n);

int tp_floor_pingpong(char *region, int role, int64_t iterations, int mode,
                      int64_t *out_ns, int64_t spin, int64_t timeout_ns);
int tp_floor_shm(char *region, int role, int64_t iterations, int mode, int64_t request_bytes,
                 int64_t response_bytes, int64_t *out_ns, int64_t spin, int64_t timeout_ns);
int tp_floor_socket(int fd, int role, int64_t iterations, int64_t request_bytes,
                    int64_t response_bytes, int64_t *out_ns, int64_t timeout_ns);

/* Guarded mappings: a SIGBUS inside one (its file was truncated by another process) puts
 * private zero pages in its place instead of killing the process; the mapping is then "lost". */
int tp_guard_add(char *base, uint64_t length);
void tp_guard_remove(int guard);
int tp_guard_lost(int guard);

/* Mapping lifetimes: map a segment shared; unmap; replace a mapping in place by a private copy
 * of its contents (close() with views still alive: docs/shm.md, "Lifetimes"). */
char *tp_map_shared(int fd, uint64_t length);
int tp_unmap(char *base, uint64_t length);
int tp_privatize(char *base, uint64_t length);

int tp_shm_create(const char *name, uint64_t size);
int tp_shm_open(const char *name, int writable);
int tp_shm_unlink(const char *name);

/* -- channels (docs/channels.md, schema/channels.toml) --------------------------------------- */
uint64_t tp_load64_acquire(uint64_t *word);
void tp_store64_release(uint64_t *word, uint64_t value);
int tp_cas64(uint64_t *word, uint64_t expected, uint64_t desired);
uint64_t tp_fetch_add64(uint64_t *word, uint64_t delta);
void tp_fence_seq_cst(void);
int64_t tp_monotonic_ns(void);
int tp_wake_if_sleeping(uint32_t *word);

/* One side of an experience ring: pointers into the mapping (RingHeader of channels.toml). */
typedef struct {
    uint32_t *state;           /* SegmentHeader.state (READY while the ring serves) */
    uint64_t *head;            /* next record to reserve */
    uint64_t *cursor;          /* tail (low 32 bits) | held << 32 */
    uint32_t *data_word;       /* futex: the consumer sleeps here */
    uint32_t *space_word;      /* futex: producers sleep here */
    uint64_t *overwritten;
    uint64_t *lost;
    uint64_t *seqs;            /* capacity words: record k committed when seqs[k & mask] == k + 1 */
    char *producers;           /* ProducerEntry[max_producers], 64 bytes each */
    uint32_t *consumer_pid;
    uint64_t *consumer_start;
    uint32_t *consumer_state;
    uint32_t capacity;         /* a power of two */
    uint32_t policy;           /* 0 BLOCK, 1 OVERWRITE */
    uint32_t multi;            /* several producers reserve with CAS */
    uint32_t max_producers;
    uint32_t me;               /* producer: its entry index */
    int64_t spin;
    int64_t slice_ns;
    uint64_t sleeps;
    uint64_t wakes;
} tp_ring;

int64_t tp_ring_reserve(tp_ring *r, uint32_t want, uint32_t *got, int64_t timeout_ns);
void tp_ring_commit(tp_ring *r, uint64_t first, uint32_t count);
int64_t tp_ring_take(tp_ring *r, uint32_t max, uint32_t *got, int64_t timeout_ns);
void tp_ring_release(tp_ring *r, uint32_t count);
