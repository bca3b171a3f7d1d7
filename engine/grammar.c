/*
 * grammar.c - constrained output (kipp.h "constrained output"): the byte-level
 * pushdown automaton over compiled schema nodes (grammar_impl.h) and the
 * per-state token masks.
 *
 * A state is a set of stacks, serialized compactly: [n stacks] then per
 * stack [depth] and its frames. One byte steps every stack; a stack may fork
 * (alternatives) or die. A token is allowed when its bytes leave at least one
 * stack alive. Masks are computed by walking the vocabulary's byte trie in
 * preorder with one state per depth, skipping a subtree at the first byte
 * refused, and are cached per serialized state in the grammar (a mutex guards
 * the cache: one grammar serves every choice of a request). Inside a string
 * the "plain" tokens (grammar_vocab.c) need no walk: they leave the state as
 * it is, or only add code points.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engine/grammar_impl.h"

#define KG_BUCKETS 1024u
#define KG_CACHE_MAX 1024u /* masks per grammar (each vocab/8 bytes); past this they are computed per step */
#define KG_HOPS 64         /* alternatives followed at most when starting one value (a $ref cycle ends here) */

/* ---- the automaton ---- */

typedef struct {
    uint8_t depth;
    kg_frame f[KG_MAX_DEPTH];
} kg_stack;

/* Where a step writes its stacks, deduplicated. */
typedef struct {
    uint8_t *out;
    size_t len;
    uint32_t n;
    uint32_t at[KG_MAX_STACKS];
} kg_emit;

static void put(kg_emit *e, const kg_stack *s)
{
    size_t sz = 1 + s->depth * sizeof(kg_frame);
    for (uint32_t i = 0; i < e->n; i++)
        if (e->out[e->at[i]] == s->depth && !memcmp(e->out + e->at[i] + 1, s->f, sz - 1)) return;
    if (e->n == KG_MAX_STACKS) return; /* more live alternatives than the cap: the rest are not generated */
    e->at[e->n++] = (uint32_t)e->len;
    e->out[e->len] = s->depth;
    memcpy(e->out + e->len + 1, s->f, sz - 1);
    e->len += sz;
}

static void feed(const kipp_grammar *g, kg_stack *s, uint8_t c, kg_emit *e);

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t'; }
static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Push node on s and feed it c (the value's first byte). */
static void start(const kipp_grammar *g, kg_stack *s, uint32_t node, uint8_t c, kg_emit *e, int hops)
{
    const kg_node *nd = &g->nodes[node];
    if (hops > KG_HOPS) return;
    if (nd->kind == KN_ANYOF) {
        for (uint32_t i = 0; i < nd->n; i++) {
            kg_stack t = *s;
            start(g, &t, g->alts[nd->first + i], c, e, hops + 1);
        }
        return;
    }
    if (nd->kind == KN_ANY) { /* the first byte picks the kind */
        uint32_t k = c == '"' ? g->n_str_any : c == '-' || is_digit(c) ? g->n_num_any
                   : c == 't' || c == 'f' || c == 'n' ? g->n_tfn : KG_NONE;
        if (s->depth <= KG_ANY_DEPTH && (c == '{' || c == '[')) k = c == '{' ? g->n_obj_any : g->n_arr_any;
        if (k != KG_NONE) start(g, s, k, c, e, hops + 1);
        return;
    }
    if (s->depth + nd->need > KG_MAX_DEPTH) return; /* its shortest completion would pass the bound: closing comes first */
    s->f[s->depth++] = (kg_frame){.node = (uint16_t)node, .n = nd->kind == KN_LIT ? nd->first : 0};
    feed(g, s, c, e);
}

static void pop_emit(kg_stack *s, kg_emit *e)
{
    s->depth--;
    put(e, s);
}

/* Whitespace in a gap: 1 when c was taken (or refused) as whitespace. It is bounded, so the structure the
 * grammar adds never runs away: a gap is nothing, one space (or tab), or, except after ':', one newline and
 * at most KG_INDENT bytes of indentation per nesting level (pretty-printed JSON fits). */
static int gap_ws(kg_frame *f, kg_stack *s, uint8_t c, int colon, kg_emit *e)
{
    if (!is_ws(c)) {
        f->ws = 0;
        return 0;
    }
    uint32_t indent = KG_INDENT * (uint32_t)(s->depth - 1);
    if (f->ws == 0 && c != '\n') f->ws = KG_WS_DONE;
    else if (f->ws == 0 && !colon) f->ws = 1;
    else if (f->ws != 0 && f->ws != KG_WS_DONE && c != '\n' && f->ws - 1u < indent) f->ws++;
    else return 1;
    put(e, s);
    return 1;
}

static void feed_root(const kipp_grammar *g, kg_stack *s, kg_frame *f, uint8_t c, kg_emit *e)
{
    switch (f->st) {
    case 0:
        if (g->prefix == KG_NONE && f->n == 0 && is_ws(c)) { /* e.g. "\n\n" after </think> */
            if (f->ws < KG_WS_MAX) f->ws++, put(e, s);
            return;
        }
        f->ws = 0;
        if (g->prefix != KG_NONE) f->st = 1, start(g, s, g->prefix, c, e, 0);
        else f->st = 2, f->n++, start(g, s, g->nodes[g->root].child, c, e, 0);
        return;
    case 1: f->st = 2, f->n++, start(g, s, g->nodes[g->root].child, c, e, 0); return;
    case 2:
        if (g->suffix != KG_NONE) {
            f->st = 3, start(g, s, g->suffix, c, e, 0);
            return;
        }
        /* no suffix: the document is complete */
        /* fall through */
    case 3:
        if (f->n >= g->max_count) return;
        if (g->separator != KG_NONE) f->st = 4, start(g, s, g->separator, c, e, 0);
        else f->st = 0, feed_root(g, s, f, c, e);
        return;
    default: f->st = 0, feed_root(g, s, f, c, e); return;
    }
}

/* First property index >= from that is required, or n. */
static uint32_t next_required(const kipp_grammar *g, const kg_node *nd, uint32_t from)
{
    while (from < nd->n && !g->props[nd->first + from].required) from++;
    return from;
}

static void feed_obj(const kipp_grammar *g, kg_stack *s, kg_frame *f, const kg_node *nd, uint8_t c, kg_emit *e)
{
    if (f->st == 0) {
        if (c == '{') f->st = 1, f->n = 0, put(e, s);
        return;
    }
    if (f->st != 2 && gap_ws(f, s, c, f->st == 3, e)) return;
    uint32_t req;
    switch (f->st) {
    case 1:
    case 5:
        if (c == '"') { /* any property up to and including the next required one */
            req = next_required(g, nd, f->n);
            uint32_t from = f->n;
            for (uint32_t j = from; j < nd->n && j <= req; j++) {
                kg_stack t = *s;
                t.f[t.depth - 1].st = 2, t.f[t.depth - 1].n = j;
                start(g, &t, g->props[nd->first + j].key, c, e, 0);
            }
        } else if (c == '}' && f->st == 1 && next_required(g, nd, f->n) == nd->n) {
            pop_emit(s, e);
        }
        return;
    case 2:
        if (c == ':') f->st = 3, put(e, s);
        return;
    case 3: f->st = 4, start(g, s, g->props[nd->first + f->n].value, c, e, 0); return;
    default:
        if (c == ',' && f->n + 1 < nd->n) f->st = 5, f->n++, put(e, s);
        else if (c == '}' && next_required(g, nd, f->n + 1) == nd->n) pop_emit(s, e);
        return;
    }
}

static void feed_obj_any(const kipp_grammar *g, kg_stack *s, kg_frame *f, uint8_t c, kg_emit *e)
{
    if (f->st == 0) {
        if (c == '{') f->st = 1, put(e, s);
        return;
    }
    if (f->st != 2 && gap_ws(f, s, c, f->st == 3, e)) return;
    switch (f->st) {
    case 1:
    case 5:
        if (c == '"') f->st = 2, start(g, s, g->n_str_any, c, e, 0);
        else if (c == '}' && f->st == 1) pop_emit(s, e);
        return;
    case 2:
        if (c == ':') f->st = 3, put(e, s);
        return;
    case 3: f->st = 4, start(g, s, g->n_any, c, e, 0); return;
    default:
        if (c == ',') f->st = 5, put(e, s);
        else if (c == '}') pop_emit(s, e);
        return;
    }
}

/* Items so far, saturated where more cannot change a check. */
static uint32_t sat_items(const kg_node *nd, uint32_t n)
{
    uint32_t top = nd->max != KG_UNBOUNDED ? nd->max : nd->min;
    return n < top ? n : top;
}

static void feed_arr(const kipp_grammar *g, kg_stack *s, kg_frame *f, const kg_node *nd, uint8_t c, kg_emit *e)
{
    if (f->st == 0) {
        if (c == '[') f->st = 1, f->n = 0, put(e, s);
        return;
    }
    if (gap_ws(f, s, c, 0, e)) return;
    switch (f->st) {
    case 1:
        if (c == ']') {
            if (nd->min == 0) pop_emit(s, e);
        } else if (nd->max > 0) {
            f->st = 3, f->n = sat_items(nd, 1), start(g, s, nd->child, c, e, 0);
        }
        return;
    case 2: f->st = 3, f->n = sat_items(nd, f->n + 1), start(g, s, nd->child, c, e, 0); return;
    default:
        if (c == ',' && f->n < nd->max) f->st = 2, put(e, s);
        else if (c == ']' && f->n >= nd->min) pop_emit(s, e);
        return;
    }
}

static void feed_str(kg_stack *s, kg_frame *f, const kg_node *nd, uint8_t c, kg_emit *e)
{
    int track = nd->min > 0 || nd->max != KG_UNBOUNDED, room = !track || f->n < nd->max;
    uint32_t cap = nd->max != KG_UNBOUNDED ? nd->max : nd->min;
    switch (f->st) {
    case 0:
        if (c == '"') f->st = 1, put(e, s);
        return;
    case 1:
        if (c == '"') {
            if (!track || f->n >= nd->min) pop_emit(s, e);
            return;
        }
        if (c < 0x20 || !room || (c >= 0x80 && c < 0xC2) || c > 0xF4) return;
        f->st = c == '\\' ? 2 : c < 0x80 ? 1 : c < 0xE0 ? 3 : c == 0xE0 ? 5 : c == 0xED ? 6 : c < 0xF0 ? 4
              : c == 0xF0 ? 8 : c == 0xF4 ? 9 : 7;
        if (track && f->n < cap) f->n++;
        put(e, s);
        return;
    case 2:
        if (c == 'u') f->st = 11, put(e, s);
        else if (c && strchr("\"\\/bfnrt", c)) f->st = 1, put(e, s);
        return;
    case 11: /* no lone surrogates: they are no character, and would break code point counts */
        if (c == 'd' || c == 'D') f->st = 16, put(e, s);
        else if (is_hex(c)) f->st = 12, put(e, s);
        return;
    case 16:
        if (c >= '0' && c <= '7') f->st = 13, put(e, s);
        return;
    case 12:
    case 13:
        if (is_hex(c)) f->st++, put(e, s);
        return;
    case 14:
        if (is_hex(c)) f->st = 1, put(e, s);
        return;
    default: { /* UTF-8 continuation bytes */
        uint8_t lo = f->st == 5 ? 0xA0 : f->st == 8 ? 0x90 : 0x80, hi = f->st == 6 ? 0x9F : f->st == 9 ? 0x8F : 0xBF;
        if (c < lo || c > hi) return;
        f->st = f->st == 3 ? 1 : f->st <= 6 ? 3 : 4;
        put(e, s);
        return;
    }
    }
}

/* Number phases: 1 after '-', 2 integer digits, 3 after a leading 0, 4 after '.', 5 fraction, 6 after e,
 * 7 after the exponent's sign, 8 exponent digits. */
static int num_can_end(uint8_t st) { return st == 2 || st == 3 || st == 5 || st == 8; }

static void feed_num(const kipp_grammar *g, kg_stack *s, kg_frame *f, int integer, uint8_t c, kg_emit *e)
{
    uint8_t st = f->st;
    int d = is_digit(c);
    if ((st == 0 || st == 1) && d) f->st = c == '0' ? 3 : 2, f->n = 1;
    else if (st == 0 && c == '-') f->st = 1;
    else if (st == 2 && d && f->n < KG_INT_DIGITS) f->n++;
    else if ((st == 2 || st == 3) && c == '.' && !integer) f->st = 4, f->n = 0;
    else if ((st == 2 || st == 3 || st == 5) && (c == 'e' || c == 'E') && !integer) f->st = 6, f->n = 0;
    else if (st == 4 && d) f->st = 5, f->n = 1;
    else if (st == 5 && d && f->n < KG_FRAC_DIGITS) f->n++;
    else if (st == 6 && (c == '+' || c == '-')) f->st = 7;
    else if ((st == 6 || st == 7) && d) f->st = 8, f->n = 1;
    else if (st == 8 && d && f->n < KG_EXP_DIGITS) f->n++;
    else {
        if (num_can_end(st) && !d) s->depth--, feed(g, s, c, e); /* the number ended: c is the parent's */
        return;
    }
    put(e, s);
}

static void feed_lit(const kipp_grammar *g, kg_stack *s, kg_frame *f, uint8_t c, kg_emit *e)
{
    const kg_lit_node *ln = &g->lits[f->n];
    for (uint32_t k = 0; k < ln->n_kids; k++) {
        const kg_lit_node *kid = &g->lits[ln->first_kid + k];
        if (kid->byte != c) continue;
        f->n = ln->first_kid + k;
        if (kid->terminal && !kid->n_kids) pop_emit(s, e);
        else put(e, s);
        return;
    }
    if (ln->terminal) s->depth--, feed(g, s, c, e); /* a literal that is a prefix of another ended */
}

static void feed(const kipp_grammar *g, kg_stack *s, uint8_t c, kg_emit *e)
{
    if (!s->depth) return;
    kg_frame *f = &s->f[s->depth - 1];
    const kg_node *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case KN_ROOT: feed_root(g, s, f, c, e); return;
    case KN_OBJ: feed_obj(g, s, f, nd, c, e); return;
    case KN_OBJ_ANY: feed_obj_any(g, s, f, c, e); return;
    case KN_ARR: feed_arr(g, s, f, nd, c, e); return;
    case KN_STR: feed_str(s, f, nd, c, e); return;
    case KN_NUM: feed_num(g, s, f, 0, c, e); return;
    case KN_INT: feed_num(g, s, f, 1, c, e); return;
    case KN_LIT: feed_lit(g, s, f, c, e); return;
    default: return;
    }
}

size_t kg_step(const kipp_grammar *g, const uint8_t *in, uint8_t c, uint8_t *out)
{
    kg_emit e = {.out = out, .len = 1};
    const uint8_t *p = in + 1;
    kg_stack s;
    for (uint8_t i = 0; i < in[0]; i++) {
        s.depth = p[0];
        memcpy(s.f, p + 1, s.depth * sizeof(kg_frame));
        p += 1 + s.depth * sizeof(kg_frame);
        feed(g, &s, c, &e);
    }
    out[0] = (uint8_t)e.n;
    return e.n ? e.len : 0;
}

size_t kg_state_len(const uint8_t *st)
{
    const uint8_t *p = st + 1;
    for (uint8_t i = 0; i < st[0]; i++) p += 1 + p[0] * sizeof(kg_frame);
    return (size_t)(p - st);
}

/* Some stack can end here: only lazily ending values (numbers, prefix literals) above a finished root. */
int kg_state_complete(const kipp_grammar *g, const uint8_t *st)
{
    const uint8_t *p = st + 1;
    for (uint8_t i = 0; i < st[0]; i++) {
        uint8_t depth = p[0];
        kg_frame f[KG_MAX_DEPTH];
        memcpy(f, p + 1, depth * sizeof(kg_frame));
        p += 1 + depth * sizeof(kg_frame);
        while (depth > 1) {
            const kg_node *nd = &g->nodes[f[depth - 1].node];
            int lazy = ((nd->kind == KN_NUM || nd->kind == KN_INT) && num_can_end(f[depth - 1].st)) ||
                       (nd->kind == KN_LIT && g->lits[f[depth - 1].n].terminal);
            if (!lazy) break;
            depth--;
        }
        if (depth == 1 && f[0].n >= 1 && (f[0].st == 3 || (f[0].st == 2 && g->suffix == KG_NONE))) return 1;
    }
    return 0;
}

/* Every stack is outside the documents: at the root or in framing text. */
int kg_state_framing(const kipp_grammar *g, const uint8_t *st)
{
    const uint8_t *p = st + 1;
    for (uint8_t i = 0; i < st[0]; i++) {
        const kg_frame *top = (const kg_frame *)(p + 1 + (p[0] - 1) * sizeof(kg_frame));
        kg_frame f;
        memcpy(&f, top, sizeof f);
        const kg_node *nd = &g->nodes[f.node];
        if (nd->kind != KN_ROOT && !(nd->kind == KN_LIT && nd->framing)) return 0;
        if (nd->kind == KN_ROOT && f.st == (g->prefix == KG_NONE ? 0 : 1)) return 0; /* next is the document */
        p += 1 + p[0] * sizeof(kg_frame);
    }
    return 1;
}

/* ---- masks ---- */

static size_t mask_words(const kipp_grammar *g) { return (g->vi->vocab + 63) / 64; }
static void bit_set(uint64_t *b, uint32_t id) { b[id >> 6] |= 1ull << (id & 63); }

/* Allow every token of trie t whose bytes st can take (and, with fit, whose state after them fits). */
static void walk(const kipp_grammar *g, const kg_trie *t, const uint8_t *st, uint8_t *scratch, uint64_t *bits,
                 kg_fit_fn fit, void *ctx)
{
    memcpy(scratch, st, kg_state_len(st));
    for (uint32_t i = 0; i < t->n_nodes;) {
        const kg_trie_node *nd = &t->nodes[i];
        if (!kg_step(g, scratch + (size_t)(nd->depth - 1) * KG_STATE_MAX, nd->byte,
                     scratch + (size_t)nd->depth * KG_STATE_MAX)) {
            i = nd->end;
            continue;
        }
        if (nd->ntok && (!fit || fit(ctx, scratch + (size_t)nd->depth * KG_STATE_MAX)))
            for (uint32_t k = 0; k < nd->ntok; k++) bit_set(bits, t->ids[nd->tok + k]);
        i++;
    }
}

/* With fit: whether the state after a plain token of cp code points fits (the top frame gains them, up to its
 * cap), remembered per cp in seen[257] (0 unknown, 1 no, 2 yes). */
static int plain_fits(const kipp_grammar *g, const uint8_t *st, uint32_t cp, uint8_t *buf, int8_t *seen,
                      kg_fit_fn fit, void *ctx)
{
    if (cp <= 256 && seen[cp]) return seen[cp] == 2;
    size_t len = kg_state_len(st), at = 2 + (st[1] - 1) * sizeof(kg_frame);
    kg_frame f;
    memcpy(buf, st, len);
    memcpy(&f, buf + at, sizeof f);
    const kg_node *nd = &g->nodes[f.node];
    uint32_t cap = nd->max != KG_UNBOUNDED ? nd->max : nd->min;
    if (nd->min > 0 || nd->max != KG_UNBOUNDED) f.n = f.n + cp < cap ? f.n + cp : cap; /* as feed_str counts */
    memcpy(buf + at, &f, sizeof f);
    int ok = fit(ctx, buf);
    if (cp <= 256) seen[cp] = (int8_t)(ok ? 2 : 1);
    return ok;
}

/* Inside a string with one stack: plain tokens keep the state (or add code points), so only the others walk. */
static int plain_fast(const kipp_grammar *g, const uint8_t *st, uint64_t *bits, uint8_t *buf, kg_fit_fn fit,
                      void *ctx)
{
    if (st[0] != 1) return 0;
    kg_frame f;
    memcpy(&f, st + 2 + (st[1] - 1) * sizeof(kg_frame), sizeof f);
    const kg_node *nd = &g->nodes[f.node];
    if (nd->kind != KN_STR || f.st != 1) return 0;
    const kipp_vocab_index *vi = g->vi;
    uint32_t room = nd->max == KG_UNBOUNDED ? UINT32_MAX : nd->max - f.n;
    int8_t seen[257] = {0};
    for (uint32_t i = 0; i < vi->n_plain; i++)
        if (vi->plain_cp[i] <= room && (!fit || plain_fits(g, st, vi->plain_cp[i], buf, seen, fit, ctx)))
            bit_set(bits, vi->plain[i]);
    return 1;
}

void kg_compute_mask(kipp_grammar_matcher *m, uint64_t *bits, kg_fit_fn fit, void *ctx)
{
    const kipp_grammar *g = m->g;
    const kipp_vocab_index *vi = g->vi;
    memset(bits, 0, mask_words(g) * sizeof *bits);
    if (m->ended) return;
    if (kg_state_complete(g, m->cur))
        for (uint32_t i = 0; i < vi->n_stop; i++) bit_set(bits, vi->stop_ids[i]);
    int plain = plain_fast(g, m->cur, bits, m->scratch, fit, ctx);
    walk(g, plain ? &vi->odd : &vi->all, m->cur, m->scratch, bits, fit, ctx);
    for (uint32_t i = 0; i < vi->n_framing; i++) { /* added tokens spell framing text only */
        uint32_t id = vi->framing[i];
        uint8_t *a = m->scratch, *b = m->scratch + KG_STATE_MAX;
        memcpy(a, m->cur, kg_state_len(m->cur));
        uint32_t k = vi->off[id];
        for (; k < vi->off[id + 1] && kg_state_framing(g, a); k++) {
            if (!kg_step(g, a, (uint8_t)vi->blob[k], b)) break;
            uint8_t *t = a;
            a = b, b = t;
        }
        if (k == vi->off[id + 1] && (!fit || fit(ctx, a))) bit_set(bits, id);
    }
}

static uint64_t popcount_bits(const uint64_t *b, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++) c += (uint64_t)__builtin_popcountll(b[i]);
    return c;
}

const uint64_t *kipp_grammar_matcher_mask(kipp_grammar_matcher *m, uint32_t *n_allowed)
{
    kipp_grammar *g = (kipp_grammar *)m->g; /* the cache is the only mutable part, under g->mu */
    size_t klen = kg_state_len(m->cur), words = mask_words(g);
    uint64_t h = XXH3_64bits(m->cur, klen) ^ (uint64_t)m->ended;
    kg_cache_entry *hit = NULL;
    pthread_mutex_lock(&g->mu);
    for (kg_cache_entry *c = g->buckets[h % KG_BUCKETS]; c && !hit; c = c->next)
        if (c->hash == h && c->klen == klen && !memcmp(c->key, m->cur, klen)) hit = c;
    pthread_mutex_unlock(&g->mu);
    uint64_t *bits = hit ? hit->bits : NULL;
    if (!bits) {
        kg_cache_entry *c = g->n_cached < KG_CACHE_MAX ? calloc(1, sizeof *c) : NULL;
        if (c) c->key = malloc(klen), c->bits = malloc(words * sizeof *c->bits);
        bits = c && c->key && c->bits ? c->bits : m->own;
        kg_compute_mask(m, bits, NULL, NULL);
        if (c && bits == c->bits) {
            memcpy(c->key, m->cur, klen);
            c->hash = h, c->klen = (uint32_t)klen;
            pthread_mutex_lock(&g->mu);
            c->next = g->buckets[h % KG_BUCKETS], g->buckets[h % KG_BUCKETS] = c, g->n_cached++;
            pthread_mutex_unlock(&g->mu);
        } else if (c) {
            free(c->key), free(c->bits), free(c);
        }
    }
    if (n_allowed) *n_allowed = (uint32_t)popcount_bits(bits, words);
    return bits;
}

/* ---- the matcher ---- */

kipp_grammar_matcher *kipp_grammar_matcher_create(const kipp_grammar *g)
{
    kipp_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->cur = malloc(KG_STATE_MAX), m->tmp = malloc(KG_STATE_MAX);
    m->scratch = malloc(((size_t)g->vi->all.max_depth + 2) * KG_STATE_MAX);
    m->own = malloc(mask_words(g) * sizeof *m->own);
    if (!m->cur || !m->tmp || !m->scratch || !m->own) {
        kipp_grammar_matcher_destroy(m);
        return NULL;
    }
    kg_frame root = {.node = (uint16_t)g->root};
    m->cur[0] = 1, m->cur[1] = 1;
    memcpy(m->cur + 2, &root, sizeof root);
    return m;
}

void kipp_grammar_matcher_destroy(kipp_grammar_matcher *m)
{
    if (!m) return;
    free(m->cur), free(m->tmp), free(m->scratch), free(m->own);
    free(m->bud);
    kg_need_memo_free(m->memo);
    free(m);
}

/* Step bytes[n] from the state; commit: keep the new state. 0 or KIPP_EINVAL. */
static int run_bytes(kipp_grammar_matcher *m, const char *bytes, size_t n, int commit)
{
    if (m->ended && n) return KIPP_EINVAL;
    uint8_t *a = m->tmp, *b = m->scratch;
    memcpy(a, m->cur, kg_state_len(m->cur));
    for (size_t i = 0; i < n; i++) {
        if (!kg_step(m->g, a, (uint8_t)bytes[i], b)) return KIPP_EINVAL;
        uint8_t *t = a;
        a = b, b = t;
    }
    if (commit) memcpy(m->cur, a, kg_state_len(a));
    return 0;
}

int kipp_grammar_matcher_feed(kipp_grammar_matcher *m, const char *bytes, size_t n)
{
    return run_bytes(m, bytes, n, 1);
}

int kipp_grammar_matcher_can(kipp_grammar_matcher *m, const char *bytes, size_t n)
{
    return !run_bytes(m, bytes, n, 0);
}

int kipp_grammar_matcher_accept(kipp_grammar_matcher *m, uint32_t id)
{
    const kipp_vocab_index *vi = m->g->vi;
    for (uint32_t i = 0; i < vi->n_stop; i++)
        if (vi->stop_ids[i] == id) {
            if (m->ended || !kg_state_complete(m->g, m->cur)) return KIPP_EINVAL;
            m->ended = 1;
            return 0;
        }
    if (id >= vi->n_tokens || vi->added[id] == 2 || vi->off[id + 1] == vi->off[id]) return KIPP_EINVAL;
    return kipp_grammar_matcher_feed(m, vi->blob + vi->off[id], vi->off[id + 1] - vi->off[id]);
}

int kipp_grammar_matcher_complete(const kipp_grammar_matcher *m) { return m->ended || kg_state_complete(m->g, m->cur); }

/* ---- create / destroy ---- */

static int add_framing(kipp_grammar *g, const char *text, uint32_t *id)
{
    *id = KG_NONE;
    if (!text || !*text) return 0;
    size_t len = strlen(text);
    return kg_add_lit(g, &text, &len, 1, 1, id);
}

/* The free-form nodes every grammar has (json_object mode, values without a schema). */
static int add_free_nodes(kipp_grammar *g)
{
    static const char *const tfn[] = {"true", "false", "null"};
    static const size_t tfn_len[] = {4, 5, 4};
    int rc = kg_add_node(g, (kg_node){.kind = KN_ANY}, &g->n_any);
    if (!rc) rc = kg_add_node(g, (kg_node){.kind = KN_STR, .max = KG_UNBOUNDED}, &g->n_str_any);
    if (!rc) rc = kg_add_node(g, (kg_node){.kind = KN_NUM}, &g->n_num_any);
    if (!rc) rc = kg_add_lit(g, tfn, tfn_len, 3, 0, &g->n_tfn);
    if (!rc) rc = kg_add_node(g, (kg_node){.kind = KN_OBJ_ANY}, &g->n_obj_any);
    if (!rc) rc = kg_add_node(g, (kg_node){.kind = KN_ARR, .max = KG_UNBOUNDED, .child = g->n_any}, &g->n_arr_any);
    return rc;
}

int kipp_grammar_create_vi(kipp_vocab_index *vi, int own, const kipp_grammar_spec *spec, kipp_grammar **out,
                           char *err, size_t errlen)
{
    *out = NULL;
    kipp_grammar *g = calloc(1, sizeof *g);
    if (g) g->buckets = calloc(KG_BUCKETS, sizeof *g->buckets);
    if (!g || !g->buckets) {
        if (own) kipp_vocab_index_free(vi);
        if (g) free(g);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a grammar");
    }
    pthread_mutex_init(&g->mu, NULL);
    g->vi = vi, g->own_vi = own ? vi : NULL;
    g->max_count = spec->max_count ? spec->max_count : 1;
    uint32_t doc = 0;
    int rc = add_free_nodes(g);
    if (!rc) rc = add_framing(g, spec->prefix, &g->prefix);
    if (!rc) rc = add_framing(g, spec->suffix, &g->suffix);
    if (!rc) rc = add_framing(g, spec->separator, &g->separator);
    if (rc) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a grammar");
    if (!rc) rc = spec->schema ? kg_compile_schema(g, spec->schema, &doc, err, errlen) : (doc = g->n_obj_any, 0);
    if (!rc && kg_add_node(g, (kg_node){.kind = KN_ROOT, .child = doc}, &g->root))
        rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a grammar");
    if (!rc) kg_set_needs(g);
    if (!rc && kg_set_shortest(g)) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a grammar");
    if (rc) {
        kipp_grammar_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

int kipp_grammar_create(kipp_model *model, const kipp_grammar_spec *spec, kipp_grammar **out, char *err,
                        size_t errlen)
{
    if (out) *out = NULL;
    if (!model || !spec || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_grammar_create: NULL model, spec or out");
    const kipp_vocab_index *vi = kipp_vocab_index_of(model, err, errlen);
    if (!vi) return KIPP_ENOMEM;
    return kipp_grammar_create_vi((kipp_vocab_index *)vi, 0, spec, out, err, errlen);
}

void kipp_grammar_destroy(kipp_grammar *g)
{
    if (!g) return;
    for (uint32_t b = 0; b < KG_BUCKETS; b++)
        for (kg_cache_entry *c = g->buckets[b], *n; c; c = n) {
            n = c->next;
            free(c->key), free(c->bits), free(c);
        }
    free(g->buckets);
    pthread_mutex_destroy(&g->mu);
    free(g->nodes), free(g->props), free(g->alts), free(g->lits);
    kipp_vocab_index_free(g->own_vi);
    free(g);
}
