/*
 * kv_events.c - the --kv-events publisher (kv_events.h): a queue the
 * scheduler's thread appends to, a thread that drains it into KVEventBatch
 * messages, and the small msgpack writer they are encoded with (only the
 * types the format uses: arrays, unsigned integers, nil, strings, float64).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "server/kv_events.h"
#include "server/serve_log.h"

#define KV_EVENT_MAX_BLOCK 64        /* token ids one queued event can hold; the engine's blocks are 32 */
#define KV_EVENT_MAX_QUEUED (1 << 20) /* events waiting for the thread before new ones are dropped (and counted) */
#define KV_REPLAY_BATCHES 4096       /* sent batches kept for replay requests */

/** One queued event with its own copy of the token ids. */
typedef struct {
    kipp_kv_event ev;
    uint32_t ids[KV_EVENT_MAX_BLOCK];
} kv_item;

/** A sent batch kept for replay. */
typedef struct {
    uint64_t seq;
    uint8_t *payload;
    size_t len;
} kv_sent;

struct serve_kv_events {
    void *zctx, *pub;           /* ZeroMQ context and PUB socket (only the thread sends) */
    void *replay;               /* ROUTER socket answering replay requests, or NULL */
    kv_sent *ring;              /* [KV_REPLAY_BATCHES] last batches sent (replay only), by seq % size */
    uint64_t n_sent;            /* batches sent; the ring holds seq max(0, n_sent - size) .. n_sent - 1 */
    int map_form;               /* SERVE_KV_EVENTS_MAP: structs as maps (newer vLLM), else arrays */
    pthread_t th;
    pthread_mutex_t mu;         /* guards the fields below */
    pthread_cond_t cv;
    kv_item *q;                 /* [n_q] queued events, oldest first */
    size_t n_q, cap_q;
    int stop;
    uint64_t dropped;           /* events lost to a full queue */
};

/* ---- msgpack writer ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} mp_buf;

static void mp_raw(mp_buf *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* A type byte followed by the low `bytes` bytes of v, big-endian (msgpack's byte order). */
static void mp_tagged(mp_buf *b, uint8_t tag, uint64_t v, int bytes)
{
    uint8_t t[9] = {tag};
    for (int i = 0; i < bytes; i++) t[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    mp_raw(b, t, 1 + (size_t)bytes);
}

static void mp_uint(mp_buf *b, uint64_t v)
{
    if (v < 128) mp_tagged(b, (uint8_t)v, 0, 0);
    else if (v <= UINT8_MAX) mp_tagged(b, 0xcc, v, 1);
    else if (v <= UINT16_MAX) mp_tagged(b, 0xcd, v, 2);
    else if (v <= UINT32_MAX) mp_tagged(b, 0xce, v, 4);
    else mp_tagged(b, 0xcf, v, 8);
}

static void mp_array(mp_buf *b, uint32_t n)
{
    if (n < 16) mp_tagged(b, (uint8_t)(0x90 | n), 0, 0);
    else if (n <= UINT16_MAX) mp_tagged(b, 0xdc, n, 2);
    else mp_tagged(b, 0xdd, n, 4);
}

static void mp_map(mp_buf *b, uint32_t n) { mp_tagged(b, (uint8_t)(0x80 | n), 0, 0); /* n < 16 here */ }

static void mp_nil(mp_buf *b) { mp_tagged(b, 0xc0, 0, 0); }

static void mp_str(mp_buf *b, const char *s)
{
    size_t n = strlen(s); /* only short literals here */
    mp_tagged(b, (uint8_t)(0xa0 | n), 0, 0);
    mp_raw(b, s, n);
}

static void mp_f64(mp_buf *b, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    mp_tagged(b, 0xcb, u, 8);
}

/* ---- batch encoding ---- */

/* Events [i, j) are one run: consecutive STORED blocks of one medium each
 * naming the one before as parent, or consecutive REMOVED blocks of one medium. */
static size_t run_end(const kipp_kv_event *ev, size_t n, size_t i)
{
    size_t j = i + 1;
    if (ev[i].kind == KIPP_KV_EVENT_STORED)
        while (j < n && ev[j].kind == KIPP_KV_EVENT_STORED && ev[j].has_parent && ev[j].parent_hash == ev[j - 1].hash &&
               ev[j].block_tokens == ev[i].block_tokens && ev[j].medium == ev[i].medium)
            j++;
    else if (ev[i].kind == KIPP_KV_EVENT_REMOVED)
        while (j < n && ev[j].kind == KIPP_KV_EVENT_REMOVED && ev[j].medium == ev[i].medium) j++;
    return j;
}

/* An event struct of n fields: a map (msgspec's "type" tag first) or an
 * array (the tag as its first element). */
static void st_begin(mp_buf *b, int map_form, const char *tag, uint32_t n)
{
    if (map_form) mp_map(b, n + 1), mp_str(b, "type");
    else mp_array(b, n + 1);
    mp_str(b, tag);
}

/* The next field's name (maps only). */
static void st_key(mp_buf *b, int map_form, const char *name)
{
    if (map_form) mp_str(b, name);
}

int serve_kv_events_encode(const kipp_kv_event *ev, size_t n, double ts, int format, uint8_t **out, size_t *out_len)
{
    int mf = format == SERVE_KV_EVENTS_MAP;
    size_t n_runs = 0;
    for (size_t i = 0; i < n; i = run_end(ev, n, i)) n_runs++;
    mp_buf b = {0};
    mp_array(&b, 3); /* the batch is array_like in both shapes */
    mp_f64(&b, ts);
    mp_array(&b, (uint32_t)n_runs);
    for (size_t i = 0, j; i < n; i = j) {
        j = run_end(ev, n, i);
        if (ev[i].kind == KIPP_KV_EVENT_STORED) {
            st_begin(&b, mf, "BlockStored", 7);
            st_key(&b, mf, "block_hashes");
            mp_array(&b, (uint32_t)(j - i));
            for (size_t k = i; k < j; k++) mp_uint(&b, ev[k].hash);
            st_key(&b, mf, "parent_block_hash");
            if (ev[i].has_parent) mp_uint(&b, ev[i].parent_hash);
            else mp_nil(&b);
            st_key(&b, mf, "token_ids");
            mp_array(&b, (uint32_t)((j - i) * ev[i].block_tokens));
            for (size_t k = i; k < j; k++)
                for (uint32_t t = 0; t < ev[k].block_tokens; t++) mp_uint(&b, ev[k].token_ids[t]);
            st_key(&b, mf, "block_size");
            mp_uint(&b, ev[i].block_tokens);
            st_key(&b, mf, "lora_id");
            mp_nil(&b); /* no adapters */
            st_key(&b, mf, "medium");
            mp_str(&b, ev[i].medium == KIPP_KV_MEDIUM_DISK ? "DISK" : "CPU");
            st_key(&b, mf, "lora_name");
            mp_nil(&b); /* newer vLLM decoders want it, older ones ignore trailing fields */
        } else if (ev[i].kind == KIPP_KV_EVENT_REMOVED) {
            st_begin(&b, mf, "BlockRemoved", 2);
            st_key(&b, mf, "block_hashes");
            mp_array(&b, (uint32_t)(j - i));
            for (size_t k = i; k < j; k++) mp_uint(&b, ev[k].hash);
            st_key(&b, mf, "medium");
            mp_str(&b, ev[i].medium == KIPP_KV_MEDIUM_DISK ? "DISK" : "CPU");
        } else {
            st_begin(&b, mf, "AllBlocksCleared", 0);
        }
    }
    mp_uint(&b, 0); /* one engine per replica */
    if (b.oom) {
        free(b.p);
        return -1;
    }
    *out = b.p, *out_len = b.n;
    return 0;
}

/* ---- endpoint ---- */

int serve_kv_events_check(const char *ep, char *err, size_t errlen) { return serve_kv_events_check_flag("--kv-events", ep, err, errlen); }

int serve_kv_events_check_flag(const char *flag, const char *ep, char *err, size_t errlen)
{
    const char *why = NULL, *host = NULL, *colon = NULL;
    if (strncmp(ep, "tcp://", 6)) why = "it does not start with tcp://";
    else host = ep + 6, colon = strrchr(host, ':');
    if (!why && (!colon || colon == host)) why = "it has no HOST:PORT after tcp://";
    if (!why && strpbrk(host, " \t\r\n/")) why = "the host has a space or a slash";
    if (!why) {
        char *end;
        errno = 0;
        long port = strtol(colon + 1, &end, 10);
        if (errno || !colon[1] || *end || port < 1 || port > 65535) why = "the port is not an integer in 1..65535";
    }
    if (!why) return 0;
    snprintf(err, errlen, "%s '%s' is invalid: %s; expected tcp://HOST:PORT, such as tcp://*:5557 (bind here) "
                          "or tcp://indexer.example:5557 (connect to a subscriber that binds)", flag, ep, why);
    return -1;
}

/* ---- publishing thread ---- */

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send_batch(serve_kv_events *k, kv_item *items, size_t n, uint64_t seq)
{
    kipp_kv_event *ev = malloc(n * sizeof *ev);
    uint8_t *payload = NULL;
    size_t len = 0;
    if (ev) {
        for (size_t i = 0; i < n; i++) {
            ev[i] = items[i].ev;
            if (ev[i].kind == KIPP_KV_EVENT_STORED) ev[i].token_ids = items[i].ids;
        }
        if (serve_kv_events_encode(ev, n, wall_seconds(), k->map_form ? SERVE_KV_EVENTS_MAP : SERVE_KV_EVENTS_ARRAY,
                                   &payload, &len))
            payload = NULL;
    }
    free(ev);
    if (!payload) {
        serve_log("kv-events: out of memory encoding %zu events; they are dropped", n);
        return;
    }
    uint8_t seq_be[8];
    for (int i = 0; i < 8; i++) seq_be[i] = (uint8_t)(seq >> (56 - 8 * i));
    /* A PUB socket never blocks: with no subscriber, or one too slow, messages are dropped. */
    if (zmq_send(k->pub, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(k->pub, seq_be, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(k->pub, payload, len, 0) < 0)
        serve_log("kv-events: sending batch %llu failed: %s", (unsigned long long)seq, zmq_strerror(zmq_errno()));
    if (!k->ring) {
        free(payload);
        return;
    }
    kv_sent *slot = &k->ring[seq % KV_REPLAY_BATCHES];
    free(slot->payload);
    *slot = (kv_sent){.seq = seq, .payload = payload, .len = len};
    k->n_sent = seq + 1;
}

/* Answer the replay requests waiting on the ROUTER socket, as vLLM's
 * publisher does: a request is [identity, "", start seq (8 bytes big-endian)];
 * the answer is one [identity, "", seq, payload] per kept batch from start on,
 * then [identity, "", -1 (8 bytes), ""]. Runs on the publishing thread, which
 * alone touches the ring. */
static void serve_replay(serve_kv_events *k)
{
    for (;;) {
        uint8_t id[256], frame[16];
        int idn = zmq_recv(k->replay, id, sizeof id, ZMQ_DONTWAIT), n_frames = 1, last = -1, ok = idn > 0 && idn <= (int)sizeof id;
        if (idn < 0) return;
        int more = 0;
        size_t ml = sizeof more;
        zmq_getsockopt(k->replay, ZMQ_RCVMORE, &more, &ml);
        while (more) { /* the rest of this request; a malformed one is read to its end and ignored */
            last = zmq_recv(k->replay, frame, sizeof frame, 0);
            n_frames++;
            ok &= n_frames != 2 || last == 0;
            zmq_getsockopt(k->replay, ZMQ_RCVMORE, &more, &ml);
        }
        if (!ok || n_frames != 3 || last != 8) {
            serve_log("kv-events: ignoring a replay request of %d frames; expected identity, empty, 8-byte start seq",
                      n_frames);
            continue;
        }
        uint64_t start = 0;
        for (int i = 0; i < 8; i++) start = start << 8 | frame[i];
        uint64_t first = k->n_sent > KV_REPLAY_BATCHES ? k->n_sent - KV_REPLAY_BATCHES : 0;
        uint8_t seq_be[8];
        for (uint64_t q = start > first ? start : first; q < k->n_sent; q++) {
            const kv_sent *b = &k->ring[q % KV_REPLAY_BATCHES];
            for (int i = 0; i < 8; i++) seq_be[i] = (uint8_t)(b->seq >> (56 - 8 * i));
            zmq_send(k->replay, id, (size_t)idn, ZMQ_SNDMORE), zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
            zmq_send(k->replay, seq_be, 8, ZMQ_SNDMORE), zmq_send(k->replay, b->payload, b->len, 0);
        }
        memset(seq_be, 0xff, sizeof seq_be); /* -1: the end of the replay */
        zmq_send(k->replay, id, (size_t)idn, ZMQ_SNDMORE), zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(k->replay, seq_be, 8, ZMQ_SNDMORE), zmq_send(k->replay, "", 0, 0);
    }
}

/* Wait on k->cv (k->mu held) for a signal, or ms milliseconds at most. */
static void wait_ms(serve_kv_events *k, long ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += ms * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&k->cv, &k->mu, &until);
}

static void *publisher_main(void *arg)
{
    serve_kv_events *k = arg;
    uint64_t seq = 0;
    kv_item *mine = NULL;
    size_t cap_mine = 0;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->n_q && !k->stop) {
            /* Calling into the socket while idle lets it take in subscriptions
             * as they arrive; otherwise the first batch after a quiet spell can
             * go out before a new subscriber's subscription is applied, and be
             * dropped. */
            int zev;
            size_t zlen = sizeof zev;
            zmq_getsockopt(k->pub, ZMQ_EVENTS, &zev, &zlen);
            if (k->replay) {
                pthread_mutex_unlock(&k->mu);
                serve_replay(k);
                pthread_mutex_lock(&k->mu);
                if (k->n_q || k->stop) break;
            }
            wait_ms(k, 50);
        }
        if (!k->n_q) break; /* stopping and nothing left */
        /* The engine reports a burst (a finished choice's blocks, a step's
         * evictions) one event at a time: let it end, so the burst goes out
         * as one batch and a chain as one BlockStored, as vLLM sends a step. */
        for (size_t seen = 0; !k->stop && k->n_q != seen;) {
            seen = k->n_q;
            wait_ms(k, 2);
        }
        /* Take the whole queue as one batch; the scheduler keeps appending to the other buffer. */
        kv_item *q = k->q;
        size_t n = k->n_q, cap = k->cap_q;
        k->q = mine, k->cap_q = cap_mine, k->n_q = 0;
        pthread_mutex_unlock(&k->mu);
        send_batch(k, q, n, seq++);
        mine = q, cap_mine = cap;
        pthread_mutex_lock(&k->mu);
    }
    pthread_mutex_unlock(&k->mu);
    free(mine);
    return NULL;
}

void serve_kv_events_on_event(void *ctx, const kipp_kv_event *ev)
{
    serve_kv_events *k = ctx;
    pthread_mutex_lock(&k->mu);
    if (k->n_q == k->cap_q) {
        size_t cap = k->cap_q ? 2 * k->cap_q : 64;
        kv_item *q = cap <= KV_EVENT_MAX_QUEUED ? realloc(k->q, cap * sizeof *q) : NULL;
        if (!q) {
            if (k->dropped++ == 0) serve_log("kv-events: the event queue is full; dropping events (subscribers will miss blocks)");
            pthread_mutex_unlock(&k->mu);
            return;
        }
        k->q = q, k->cap_q = cap;
    }
    kv_item *it = &k->q[k->n_q++];
    it->ev = *ev;
    it->ev.token_ids = NULL;
    if (ev->kind == KIPP_KV_EVENT_STORED) {
        uint32_t nt = ev->block_tokens < KV_EVENT_MAX_BLOCK ? ev->block_tokens : KV_EVENT_MAX_BLOCK;
        it->ev.block_tokens = nt;
        memcpy(it->ids, ev->token_ids, nt * sizeof *it->ids);
    }
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

serve_kv_events *serve_kv_events_start(const serve_kv_events_opts *o, char *err, size_t errlen)
{
    const char *ep = o->endpoint;
    if (serve_kv_events_check(ep, err, errlen)) return NULL;
    if (o->replay && serve_kv_events_check_flag("--kv-events-replay", o->replay, err, errlen)) return NULL;
    serve_kv_events *k = calloc(1, sizeof *k);
    if (!k) return snprintf(err, errlen, "out of memory for the KV event publisher"), NULL;
    k->map_form = o->format == SERVE_KV_EVENTS_MAP;
    k->zctx = zmq_ctx_new();
    k->pub = k->zctx ? zmq_socket(k->zctx, ZMQ_PUB) : NULL;
    int bind = strchr(ep, '*') || strstr(ep, "::"); /* vLLM's rule: wildcards bind, anything else connects */
    if (!k->pub || (bind ? zmq_bind(k->pub, ep) : zmq_connect(k->pub, ep))) {
        snprintf(err, errlen, "--kv-events '%s': cannot %s the ZeroMQ PUB socket: %s", ep, bind ? "bind" : "connect",
                 zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (o->replay) { /* always bound, as vLLM binds its replay endpoint */
        k->ring = calloc(KV_REPLAY_BATCHES, sizeof *k->ring);
        k->replay = k->ring ? zmq_socket(k->zctx, ZMQ_ROUTER) : NULL;
        if (!k->replay || zmq_bind(k->replay, o->replay)) {
            snprintf(err, errlen, "--kv-events-replay '%s': cannot bind the ZeroMQ ROUTER socket: %s", o->replay,
                     k->ring ? zmq_strerror(zmq_errno()) : "out of memory");
            goto fail;
        }
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (pthread_create(&k->th, NULL, publisher_main, k)) {
        snprintf(err, errlen, "cannot start the KV event publisher thread");
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->cv);
        goto fail;
    }
    return k;
fail:
    if (k->replay) zmq_close(k->replay);
    if (k->pub) zmq_close(k->pub);
    if (k->zctx) zmq_ctx_term(k->zctx);
    free(k->ring);
    free(k);
    return NULL;
}

void serve_kv_events_stop(serve_kv_events *k)
{
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->th, NULL);
    if (k->dropped) serve_log("kv-events: %llu events were dropped (queue full)", (unsigned long long)k->dropped);
    int linger_ms = 1000; /* let the last batches (the final AllBlocksCleared) reach connected subscribers */
    zmq_setsockopt(k->pub, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_close(k->pub);
    if (k->replay) zmq_setsockopt(k->replay, ZMQ_LINGER, &linger_ms, sizeof linger_ms), zmq_close(k->replay);
    zmq_ctx_term(k->zctx);
    if (k->ring)
        for (size_t i = 0; i < KV_REPLAY_BATCHES; i++) free(k->ring[i].payload);
    free(k->ring);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k->q);
    free(k);
}
