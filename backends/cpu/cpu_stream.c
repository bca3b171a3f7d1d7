/*
 * cpu_stream.c - models larger than RAM (seed 002 "Layer streaming"): the
 * cpu backend's path when the engine sets kipp_model_view.stream.
 *
 * No packed copy is made. Each projection (and the output head) stays in the
 * file's row-major layout inside the read-only mapping; a linear call packs
 * its worker's rows slice by slice (16 rows for decode, 64 for prefill) into
 * a per-worker buffer of L2 size and runs the format's own matvec or matmul
 * on that slice. A row's arithmetic is the resident path's (each row lane is
 * one chain in column order whatever the row range: kernels.h "Row
 * invariance"), so streamed logits equal resident logits bit for bit, and
 * every format with a packer streams (bf16 through k_pack_bf16_pairs, q8_0 and
 * q4_1 through their table packers).
 *
 * Prefetch: one thread, woken by worker 0 as segment s starts (segments: the
 * layers, then the head), issues madvise(MADV_WILLNEED) over the byte ranges
 * of segment s+1 (after the last layer the head, after the head layer 0),
 * computed from the tensor table at create. madvise of a file range starts
 * readahead and may block while it submits the reads, hence the thread.
 *
 * Residency: a cyclic read of more bytes than the page cache holds is LRU's
 * worst case (each page is evicted just before its next use, so every byte
 * would come from the disk). So at create the segments are split by the
 * engine's budget (kipp_model_view.stream_budget, 0.75 x available RAM): the
 * head, then layers from 0, are kept while they fit (the planner's rule,
 * engine/plan.c resident_bytes); the others are dropped from
 * the page cache right behind their use (MADV_PAGEOUT, on the same thread),
 * so the kept ones are never under pressure and stay resident: per token
 * only the dropped segments come from the disk, as `kipp plan` predicts
 * (resident vs streamed layers). KIPP_STREAM_DROP=0 turns the dropping off.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backends/cpu/cpu_internal.h"
#include "base/errbuf.h"
#include "kernels/cpu/pack_pairs.h"

#define STREAM_MV_ROWS 16u  /* rows packed per slice for one activation row (decode) */
#define STREAM_MM_ROWS 64u  /* rows per slice for a prefill round: 64 x 256 tokens of output per pack */
#define STREAM_MAX_RANGES 16 /* byte ranges per segment: 11 layer tensors, merged where adjacent */

/** A fused projection as the file has it: up to 3 row-major parts stacked by rows. */
typedef struct {
    int n;
    const void *src[3];   /* part p: [part_rows[p]][cols] in the format's file layout */
    size_t part_rows[3];
} cpu_file_weight;

typedef struct {
    uintptr_t a, e; /* page-aligned [a, e) */
} byte_range;

struct cpu_stream {
    cpu_file_weight *fw;     /* [n_layer*4 + 1]: per layer Q|K|V, O, Gate|Up, Down; then the head */
    char **buf;              /* [nth] packed slice buffers */
    float **tmp;             /* [nth][R][STREAM_MM_ROWS] f32 matmul output before the scatter */
    size_t buf_bytes;        /* bytes of each buf */
    int nth;                 /* workers (entries of buf and tmp) */
    uint32_t n_seg;          /* n_layer + 1 */
    byte_range *ranges;      /* [n_seg][STREAM_MAX_RANGES] */
    uint32_t *n_ranges;      /* [n_seg] */
    uint64_t *seg_bytes;     /* [n_seg] file bytes of each segment */
    uint8_t *keep;           /* [n_seg] 1: kept in the page cache, 0: dropped behind use */
    uint64_t kept_bytes;     /* file bytes of the kept segments */
    int thread, prefetch, drop; /* helper thread running; WILLNEED ahead; PAGEOUT behind */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int want, quit;          /* next segment to prefetch (-1 none), stop */
    uint8_t *drop_pending;   /* [n_seg] 1: drop behind use requested, not yet done */
    uint32_t n_pending;      /* entries of drop_pending set: a slow madvise never loses a request */
    unsigned long hints;     /* prefetches issued */
};

static k_pack_fn packer(const cpu_model *m, k_fmt f)
{
    return f == K_FMT_BF16 || f == K_FMT_BF16DOT ? k_pack_bf16_pairs : m->k->fmt[f].pack;
}

void kipp_cpu_stream_linear(const cpu_model *m, const k_weight *w, size_t rb, size_t re, const void *in, float *y,
                            size_t ldy, uint32_t n, int ith, int nth, int wk)
{
    const cpu_file_weight *fw = w->data;
    const k_fmt_kernels *k = &m->k->fmt[w->fmt];
    const k_fmt_info *fi = k_fmt_get(w->fmt);
    k_pack_fn pack = packer(m, w->fmt);
    KIPP_ASSERT(wk >= 0 && wk < m->st->nth);
    char *buf = m->st->buf[wk]; /* the calling worker's own slices (not ith: the head's scattered path splits itself) */
    float *tmp = m->st->tmp[wk];
    size_t s0, s1, cap = n == 1 ? STREAM_MV_ROWS : STREAM_MM_ROWS, cols = w->cols;
    k_split_rows(re - rb, ith, nth, 16, &s0, &s1);
    for (size_t r = rb + s0; r < rb + s1;) {
        size_t base = 0;
        int p = 0;
        while (r >= base + fw->part_rows[p]) base += fw->part_rows[p++];
        size_t ch = rb + s1 - r, left = base + fw->part_rows[p] - r; /* a slice never crosses a part */
        ch = ch < cap ? ch : cap;
        ch = ch < left ? ch : left;
        pack((const char *)fw->src[p] + k_fmt_file_bytes(fi, r - base, cols), buf, ch, cols, 0, 1);
        if (n == 1) {
            k->matvec(buf, in, y + (r - rb), ch, cols, 0, 1);
            if (fi->outlier_fix) fi->outlier_fix(buf, in, y + (r - rb), ch, cols, 1, 0, 1);
        } else {
            k->matmul(buf, in, tmp, ch, cols, n, 0, 0, 1);
            if (fi->outlier_fix) fi->outlier_fix(buf, in, tmp, ch, cols, n, 0, 1);
            for (uint32_t t = 0; t < n; t++) memcpy(y + t * ldy + (r - rb), tmp + (size_t)t * ch, ch * sizeof(float));
        }
        r += ch;
    }
}

/* ---- prefetch ---- */

static void advise_seg(struct cpu_stream *st, uint32_t s, int advice)
{
    for (uint32_t i = 0; i < st->n_ranges[s]; i++) {
        const byte_range *b = &st->ranges[(size_t)s * STREAM_MAX_RANGES + i];
        (void)madvise((void *)b->a, b->e - b->a, advice); /* advisory: a refusal costs only speed */
    }
}

static void *prefetch_main(void *arg)
{
    struct cpu_stream *st = arg;
    /* Lowest priority for this thread only (Linux: a thread id is a PRIO_PROCESS target): its
     * madvise calls allocate and submit, and must not take a core from the pool's workers,
     * whose barriers wait on the slowest (make bench-stream, 2 cores: see README). */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->quit && st->want < 0 && st->n_pending == 0) pthread_cond_wait(&st->cv, &st->mu);
        if (st->quit) break;
        int want = st->want, behind = -1;
        st->want = -1;
        for (uint32_t s = 0; st->n_pending && s < st->n_seg; s++) /* one drop per pass, oldest index first */
            if (st->drop_pending[s]) {
                st->drop_pending[s] = 0;
                st->n_pending--;
                behind = (int)s;
                break;
            }
        pthread_mutex_unlock(&st->mu);
#ifdef MADV_PAGEOUT
        if (behind >= 0) advise_seg(st, (uint32_t)behind, MADV_PAGEOUT); /* first: room for what comes */
#else
        (void)behind;
#endif
        if (want >= 0) advise_seg(st, (uint32_t)want, MADV_WILLNEED), st->hints++;
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

void kipp_cpu_stream_begin(const cpu_model *m, uint32_t seg, uint32_t next)
{
    struct cpu_stream *st = m->st;
    uint32_t prev = (seg + st->n_seg - 1) % st->n_seg;
    int drop = st->drop && !st->keep[prev];
    if (!st->thread || (!st->prefetch && !drop)) return;
    pthread_mutex_lock(&st->mu);
    if (st->prefetch) st->want = (int)next;
    if (drop && !st->drop_pending[prev]) st->drop_pending[prev] = 1, st->n_pending++;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

/* Add tensor view t to segment s's ranges: page-aligned, merged with a range it touches. Only
 * views into the file mapping v: a LoRA-merged tensor lives in anonymous memory, which
 * MADV_PAGEOUT would push to swap. */
static void add_range(struct cpu_stream *st, uint32_t s, const kipp_tensor_view *t, const kipp_model_view *v)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), m0 = (uintptr_t)v->map, m1 = m0 + v->map_size;
    if ((uintptr_t)t->data < m0 || (uintptr_t)t->data + t->nbytes > m1) return;
    uintptr_t a = (uintptr_t)t->data / pg * pg, e = ((uintptr_t)t->data + t->nbytes + pg - 1) / pg * pg;
    byte_range *r = &st->ranges[(size_t)s * STREAM_MAX_RANGES];
    st->seg_bytes[s] += t->nbytes;
    for (uint32_t i = 0; i < st->n_ranges[s]; i++)
        if (a <= r[i].e && e >= r[i].a) {
            r[i].a = a < r[i].a ? a : r[i].a;
            r[i].e = e > r[i].e ? e : r[i].e;
            return;
        }
    KIPP_ASSERT(st->n_ranges[s] < STREAM_MAX_RANGES);
    r[st->n_ranges[s]++] = (byte_range){a, e};
}

/* ---- create / destroy ---- */

static void set_weight(k_weight *w, cpu_file_weight *fw, k_fmt f, const kipp_tensor_view *const *parts, int n)
{
    *fw = (cpu_file_weight){.n = n};
    *w = (k_weight){f, fw, 0, parts[0]->cols};
    for (int i = 0; i < n; i++) {
        fw->src[i] = parts[i]->data;
        fw->part_rows[i] = parts[i]->rows;
        w->rows += parts[i]->rows;
    }
}

int kipp_cpu_stream_create(cpu_model *m, const kipp_model_view *v, char *err, size_t errlen)
{
    const kipp_dims *d = &m->d;
    struct cpu_stream *st = calloc(1, sizeof *st);
    if (!st) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the streaming state");
    m->st = st;
    st->n_seg = d->n_layer + 1;
    st->want = -1;
    st->drop_pending = calloc(st->n_seg, sizeof *st->drop_pending);
    st->fw = calloc((size_t)d->n_layer * 4 + 1, sizeof *st->fw);
    st->ranges = calloc((size_t)st->n_seg * STREAM_MAX_RANGES, sizeof *st->ranges);
    st->n_ranges = calloc(st->n_seg, sizeof *st->n_ranges);
    st->seg_bytes = calloc(st->n_seg, sizeof *st->seg_bytes);
    m->lw = calloc(d->n_layer, sizeof *m->lw);
    st->buf = calloc((size_t)m->nth, sizeof *st->buf);
    st->tmp = calloc((size_t)m->nth, sizeof *st->tmp);
    st->nth = m->nth;
    if (!st->fw || !st->ranges || !st->n_ranges || !st->seg_bytes || !st->drop_pending || !m->lw || !st->buf || !st->tmp)
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the streaming tables");
    size_t need = 0;
    for (uint32_t l = 0; l < d->n_layer; l++) {
        const kipp_qwen3_layer *L = &v->w.layers[l];
        const kipp_tensor_view *qkv[3] = {&L->wq, &L->wk, &L->wv}, *o[1] = {&L->wo}, *gu[2] = {&L->w_gate, &L->w_up},
                               *dn[1] = {&L->w_down};
        const kipp_tensor_view *const *parts[4] = {qkv, o, gu, dn};
        static const int np[4] = {3, 1, 2, 1};
        k_weight *dst[4] = {&m->lw[l].qkv, &m->lw[l].o, &m->lw[l].gu, &m->lw[l].down};
        for (int w = 0; w < 4; w++) {
            k_fmt f = (k_fmt)k_fmt_from_gguf(parts[w][0]->dtype);
            if (f == K_FMT_BF16) f = m->bf16_read[w]; /* as plan_layer: same layout, the mode's activations */
            set_weight(dst[w], &st->fw[(size_t)l * 4 + (size_t)w], f, parts[w], np[w]);
            size_t b = k_fmt_get(f)->packed_bytes(STREAM_MM_ROWS, dst[w]->cols);
            need = b > need ? b : need;
        }
        const kipp_tensor_view *all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->q_norm, &L->k_norm,
                                         &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) add_range(st, l, all[i], v);
    }
    const kipp_tensor_view *head[1] = {&v->w.output};
    k_fmt hf = kipp_cpu_head_fmt(m, &v->w); /* as pack_weights */
    set_weight(&m->head, &st->fw[(size_t)d->n_layer * 4], hf, head, 1);
    size_t hb = k_fmt_get(hf)->packed_bytes(STREAM_MM_ROWS, m->head.cols);
    need = hb > need ? hb : need;
    add_range(st, d->n_layer, &v->w.output, v);
    add_range(st, d->n_layer, &v->w.output_norm, v);
    st->buf_bytes = need;
    for (int i = 0; i < m->nth; i++) {
        st->buf[i] = kipp_aligned_alloc(need);
        st->tmp[i] = kipp_aligned_alloc((size_t)KIPP_CPU_ROUND_TOKENS * STREAM_MM_ROWS * sizeof(float));
        if (!st->buf[i] || !st->tmp[i]) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %d x %zu bytes of streaming slices", m->nth, need);
    }
    /* what the page cache keeps: the head, then layers from 0, while they fit the budget (engine/plan.c
     * resident_bytes, the rule `kipp plan` predicts with); the running and the prefetched segment live
     * in the other quarter of the available RAM */
    st->keep = calloc(st->n_seg, 1);
    if (!st->keep) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the streaming tables");
    for (uint32_t i = 0; i < st->n_seg; i++) {
        uint32_t s = i == 0 ? d->n_layer : i - 1;
        if (st->kept_bytes + st->seg_bytes[s] > v->stream_budget) break;
        st->keep[s] = 1, st->kept_bytes += st->seg_bytes[s];
    }
    const char *dr = getenv("KIPP_STREAM_DROP");
    st->drop = !(dr && !strcmp(dr, "0"));
    st->prefetch = v->prefetch;
    if (st->prefetch || st->drop) {
        pthread_mutex_init(&st->mu, NULL);
        pthread_cond_init(&st->cv, NULL);
        if (pthread_create(&st->th, NULL, prefetch_main, st) != 0) {
            pthread_mutex_destroy(&st->mu);
            pthread_cond_destroy(&st->cv);
            return kipp_err(err, errlen, KIPP_ENOMEM, "cannot start the streaming helper thread");
        }
        st->thread = 1;
        if (st->prefetch) kipp_cpu_stream_begin(m, d->n_layer, 0); /* layer 0 for the first token */
    }
    return 0;
}

void kipp_cpu_stream_destroy(struct cpu_stream *st)
{
    if (!st) return;
    if (st->thread) {
        pthread_mutex_lock(&st->mu);
        st->quit = 1;
        pthread_cond_signal(&st->cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->th, NULL);
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
    }
    for (int i = 0; st->buf && st->tmp && i < st->nth; i++) {
        kipp_aligned_free(st->buf[i]);
        kipp_aligned_free(st->tmp[i]);
    }
    free(st->buf);
    free(st->tmp);
    free(st->fw);
    free(st->ranges);
    free(st->n_ranges);
    free(st->seg_bytes);
    free(st->drop_pending);
    free(st->keep);
    free(st);
}

void kipp_cpu_stream_describe(const cpu_model *m, char *out, size_t outlen)
{
    const struct cpu_stream *st = m->st;
    uint64_t total = 0;
    uint32_t kept_layers = 0;
    for (uint32_t s = 0; s < st->n_seg; s++) total += st->seg_bytes[s], kept_layers += s < m->d.n_layer && st->keep[s];
    snprintf(out, outlen,
             "prepared weights: none (streamed: the weights exceed the RAM budget or KIPP_STREAM/--stream asked; "
             "every projection and the head are read through the file mapping per token, %.3g GB in %u segments "
             "(layers, head), packed %u rows (decode) or %u rows (prefill) at a time into %d x %zu-byte worker slices; "
             "page cache keeps %.3g GB (%s%u of %u layers), %s; prefetch: %s)\n",
             (double)total * 1e-9, st->n_seg, STREAM_MV_ROWS, STREAM_MM_ROWS, m->nth, st->buf_bytes,
             (double)st->kept_bytes * 1e-9, st->keep[m->d.n_layer] ? "head, " : "", kept_layers, m->d.n_layer,
             st->drop ? "the rest dropped behind use (MADV_PAGEOUT)" : "nothing dropped (KIPP_STREAM_DROP=0)",
             st->prefetch ? "madvise(MADV_WILLNEED) one segment ahead on a helper thread" : "off");
}
