/*
 * grammar_budget.c - constrained output that ends within max_tokens
 * (grammar_impl.h "the token budget"; docs/STRUCTURED_OUTPUT.md).
 *
 * Every state has a canonical completion: the shortest bytes that finish
 * every open value, container, document and framing text (a forced tool
 * call's "\n</tool_call>" included), the least in byte order among the
 * shortest. Per frame it is the frame's remainder (close the string after the
 * code points minLength still asks for, write the required properties and
 * minItems items left, each fresh value's own shortest text), top frame
 * first; across stacks the shortest, then the least. Because it is the least
 * shortest text of the state's whole language, stepping a prefix of it leaves
 * exactly the rest as the next state's canonical completion. Its cost in
 * tokens is the fewest tokens that spell it (a dynamic program over the
 * vocabulary trie; added tokens only over framing text), plus one for the
 * end of turn: the state's need, an upper bound on the true least.
 *
 * The rule: with budget tokens left, a token is allowed only when the need of
 * the state after it is at most budget - 1. When the need fits now, the first
 * token of the canonical spelling keeps it fitting (the need falls by one),
 * so the reply always ends, with the end of turn, within the budget. When no
 * token can pass the budget (it is at least the grammar's worst shortest
 * completion in bytes + 2; a byte-level vocabulary spells n bytes in at most
 * n tokens) the mask is the plain one, bit for bit; when the need is already
 * past the budget nothing can help and the mask is the plain one too.
 * The automaton's own bounds can break the argument (alternatives past
 * KG_MAX_STACKS are dropped; a value whose shortest completion would pass
 * the depth bound does not start): a canonical text it refuses counts as no
 * known completion, and where no token fits, those of least need are kept.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engine/grammar_impl.h"

#define KG_MEMO_SLOTS 8192u      /* states whose need a matcher remembers (a power of two) */
#define KG_MEMO_BYTES (1u << 20) /* bytes of their keys; both full: forget them all */

static uint32_t sat(uint64_t v) { return v >= KG_FAR ? KG_FAR : (uint32_t)v; }

/* ---- shortest fresh values (minb, pick) and literal distances ---- */

static void set_lit_dist(kipp_grammar *g)
{
    for (uint32_t i = g->n_lits; i-- > 0;) { /* kids are laid out after their parent */
        kg_lit_node *ln = &g->lits[i];
        uint32_t d = KG_FAR;
        for (uint32_t k = 0; !ln->terminal && k < ln->n_kids; k++)
            if (g->lits[ln->first_kid + k].dist + 1 < d) d = g->lits[ln->first_kid + k].dist + 1;
        ln->dist = ln->terminal ? 0 : d;
    }
}

static uint32_t node_minb(const kipp_grammar *g, const kg_node *nd)
{
    uint64_t b = 2;
    uint32_t nreq = 0;
    switch (nd->kind) {
    case KN_ANYOF:
        b = KG_FAR;
        for (uint32_t i = 0; i < nd->n; i++)
            if (g->nodes[g->alts[nd->first + i]].minb < b) b = g->nodes[g->alts[nd->first + i]].minb;
        return (uint32_t)b;
    case KN_OBJ:
        for (uint32_t i = 0; i < nd->n; i++) {
            const kg_prop *p = &g->props[nd->first + i];
            if (p->required) b += (uint64_t)g->nodes[p->key].minb + 1 + g->nodes[p->value].minb + (nreq++ > 0);
        }
        break;
    case KN_ARR:
        if (nd->min) b += (uint64_t)nd->min * g->nodes[nd->child].minb + nd->min - 1;
        break;
    case KN_STR: b += nd->min; break;
    case KN_LIT: b = g->lits[nd->first].dist; break;
    case KN_OBJ_ANY: break;
    case KN_ROOT: return KG_FAR;
    default: return 1; /* ANY, NUM, INT: "0" */
    }
    return b > KG_CANON_MAX ? KG_FAR : (uint32_t)b;
}

/* An output that counts what passes its capacity (p NULL: count only). */
typedef struct {
    char *p;
    size_t n, cap;
} kg_out;

static void put(kg_out *o, const char *s, size_t n)
{
    if (o->p && o->n + n <= o->cap) memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void put_rep(kg_out *o, char c, size_t k)
{
    if (o->p && o->n + k <= o->cap) memset(o->p + o->n, c, k);
    o->n += k;
}

static void lit_rest(const kipp_grammar *g, uint32_t li, kg_out *o)
{
    while (!g->lits[li].terminal) { /* kids are in byte order: the first one on a shortest path is the least */
        const kg_lit_node *ln = &g->lits[li];
        uint32_t k = 0;
        while (g->lits[ln->first_kid + k].dist + 1 != ln->dist) k++;
        li = ln->first_kid + k;
        put(o, (const char *)&g->lits[li].byte, 1);
    }
}

static void gen_node(const kipp_grammar *g, uint32_t n, kg_out *o);

/* The required properties from index from on, each "key":value, comma-separated (first: no leading comma). */
static void obj_rest(const kipp_grammar *g, const kg_node *nd, uint32_t from, int first, kg_out *o)
{
    for (uint32_t j = from; j < nd->n; j++) {
        const kg_prop *p = &g->props[nd->first + j];
        if (!p->required) continue;
        if (!first) put(o, ",", 1);
        gen_node(g, p->key, o);
        put(o, ":", 1);
        gen_node(g, p->value, o);
        first = 0;
    }
}

/* The shortest text of a fresh value of node n (the least among the shortest). */
static void gen_node(const kipp_grammar *g, uint32_t n, kg_out *o)
{
    const kg_node *nd = &g->nodes[n];
    if (nd->minb >= KG_FAR) {
        o->n += KG_FAR;
        return;
    }
    if (!o->p) { /* counting: the length is known */
        o->n += nd->minb;
        return;
    }
    switch (nd->kind) {
    case KN_ANYOF: gen_node(g, g->alts[nd->first + nd->pick], o); return;
    case KN_OBJ:
        put(o, "{", 1);
        obj_rest(g, nd, 0, 1, o);
        put(o, "}", 1);
        return;
    case KN_OBJ_ANY: put(o, "{}", 2); return;
    case KN_ARR:
        put(o, "[", 1);
        for (uint32_t i = 0; i < nd->min; i++) {
            if (i) put(o, ",", 1);
            gen_node(g, nd->child, o);
        }
        put(o, "]", 1);
        return;
    case KN_STR:
        put(o, "\"", 1);
        put_rep(o, ' ', nd->min); /* the least byte a string takes as itself */
        put(o, "\"", 1);
        return;
    case KN_LIT: lit_rest(g, nd->first, o); return;
    default: put(o, "0", 1); return;
    }
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* ANYOF picks: among the alternatives of least minb, the least text. The ANYOFs inside an alternative's text
 * are picked first: those of shorter values by the caller's order, those of equal length (alternatives
 * through $ref; never the ANYOF itself, kg_compile_schema refuses that) here. */
static void set_pick(kipp_grammar *g, uint32_t n, uint8_t *done, char *a, char *b)
{
    kg_node *nd = &g->nodes[n];
    if (done[n] || nd->kind != KN_ANYOF || nd->minb >= KG_FAR) return;
    done[n] = 1;
    uint32_t best = KG_NONE;
    for (uint32_t i = 0; i < nd->n; i++) {
        uint32_t alt = g->alts[nd->first + i];
        if (g->nodes[alt].minb != nd->minb) continue;
        set_pick(g, alt, done, a, b); /* its ANYOFs that tie at this length are direct alternatives */
        kg_out oa = {.p = a, .cap = KG_CANON_MAX};
        gen_node(g, alt, &oa);
        if (best != KG_NONE) {
            kg_out ob = {.p = b, .cap = KG_CANON_MAX};
            gen_node(g, g->alts[nd->first + best], &ob);
            if (memcmp(a, b, oa.n) >= 0) continue;
        }
        best = i;
    }
    nd->pick = best == KG_NONE ? 0 : best;
}

/* ---- the worst completion: a bound over every state, by stack depth ---- */

static uint32_t lit_maxdist(const kipp_grammar *g, uint32_t li)
{
    const kg_lit_node *ln = &g->lits[li];
    uint32_t m = ln->dist;
    for (uint32_t k = 0; k < ln->n_kids; k++) {
        uint32_t d = lit_maxdist(g, ln->first_kid + k);
        if (d > m) m = d;
    }
    return m;
}

/* What a value of nd at depth d can leave at most, given w1[] at depth d + 1 (and free, a free value's there). */
static uint32_t worst_node(const kipp_grammar *g, const kg_node *nd, const uint32_t *w1, const uint32_t *wd,
                           uint32_t free1, uint32_t freed)
{
    uint64_t m = 0, rest = 0;
    switch (nd->kind) {
    case KN_STR: return sat((uint64_t)nd->min + 6); /* '"' after a \u escape: "0000", the fill, '"' */
    case KN_LIT: return nd->minb; /* replaced by lit_maxdist in set_worst */
    case KN_OBJ_ANY: return sat(free1 + 1 > 9 ? free1 + 1 : 9); /* ":0}" after a key's \u escape */
    case KN_ANY: return freed;
    case KN_ANYOF:
        for (uint32_t i = 0; i < nd->n; i++) m = wd[g->alts[nd->first + i]] > m ? wd[g->alts[nd->first + i]] : m;
        return (uint32_t)m;
    case KN_ARR: {
        const kg_node *c = &g->nodes[nd->child];
        uint64_t cw = c->minb > w1[nd->child] ? c->minb : w1[nd->child];
        m = cw + (nd->min > 1 ? (uint64_t)(nd->min - 1) * (1 + (uint64_t)c->minb) : 0) + 1;
        return sat(m > nd->minb ? m : nd->minb);
    }
    case KN_OBJ:
        for (uint32_t j = nd->n; j-- > 0;) { /* rest: the required properties after j */
            const kg_prop *p = &g->props[nd->first + j];
            const kg_node *v = &g->nodes[p->value];
            uint64_t vw = v->minb > w1[p->value] ? v->minb : w1[p->value];
            uint64_t here = (uint64_t)g->nodes[p->key].minb + 1 + vw + rest + 1;
            m = here > m ? here : m;
            if (p->required) rest += 1 + (uint64_t)g->nodes[p->key].minb + 1 + v->minb;
        }
        return sat(m > rest + 1 ? m : rest + 1);
    case KN_ROOT: return 0;
    default: return 1; /* numbers: "0" after '-', '.' or 'e' */
    }
}

/* The free value's worst at a depth: the most of its kinds. */
static uint32_t worst_free(const kipp_grammar *g, const uint32_t *wd)
{
    uint32_t m = 6;
    const uint32_t kinds[] = {g->n_obj_any, g->n_arr_any, g->n_tfn};
    for (int i = 0; i < 3; i++) m = wd[kinds[i]] > m ? wd[kinds[i]] : m;
    return m;
}

static int set_worst(kipp_grammar *g)
{
    uint32_t n = g->n_nodes, *w1 = calloc(n, sizeof *w1), *wd = calloc(n, sizeof *wd), *litw = calloc(n, sizeof *litw);
    if (!w1 || !wd || !litw) {
        free(w1), free(wd), free(litw);
        return KIPP_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++)
        if (g->nodes[i].kind == KN_LIT) litw[i] = lit_maxdist(g, g->nodes[i].first);
    uint32_t free1 = 0;
    for (uint32_t d = KG_MAX_DEPTH; d >= 2; d--) { /* frames at depth d; their values' frames at d + 1 */
        memset(wd, 0, n * sizeof *wd);
        uint32_t freed = 0;
        for (int changed = 1; changed;) { /* ANYOF chains and the free value at one depth settle in a few rounds */
            changed = 0;
            for (uint32_t i = 0; i < n; i++) {
                uint32_t v = g->nodes[i].kind == KN_LIT ? litw[i] : worst_node(g, &g->nodes[i], w1, wd, free1, freed);
                if (v != wd[i]) wd[i] = v, changed = 1;
            }
            uint32_t f = worst_free(g, wd);
            if (f != freed) freed = f, changed = 1;
        }
        memcpy(w1, wd, n * sizeof *wd);
        free1 = freed;
    }
    const kg_node *doc = &g->nodes[g->nodes[g->root].child];
    uint64_t pre = g->prefix != KG_NONE ? g->nodes[g->prefix].minb : 0;
    uint64_t suf = g->suffix != KG_NONE ? g->nodes[g->suffix].minb : 0;
    uint64_t sep = g->separator != KG_NONE ? g->nodes[g->separator].minb : 0;
    uint64_t dw = doc->minb > w1[g->nodes[g->root].child] ? doc->minb : w1[g->nodes[g->root].child];
    g->worst = sat(sep + pre + dw + suf);
    free(w1), free(wd), free(litw);
    return 0;
}

int kg_set_shortest(kipp_grammar *g)
{
    set_lit_dist(g);
    for (uint32_t i = 0; i < g->n_nodes; i++) g->nodes[i].minb = KG_FAR, g->nodes[i].pick = 0;
    for (int changed = 1; changed;) { /* minb only falls from KG_FAR: the least fixpoint, cycles included */
        changed = 0;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
            uint32_t b = node_minb(g, &g->nodes[i]);
            if (b < g->nodes[i].minb) g->nodes[i].minb = b, changed = 1;
        }
    }
    uint8_t *done = calloc(g->n_nodes, 1);
    uint64_t *order = malloc(g->n_nodes * sizeof *order);
    char *a = malloc(KG_CANON_MAX), *b = malloc(KG_CANON_MAX);
    int rc = done && order && a && b ? 0 : KIPP_ENOMEM;
    uint32_t n = 0;
    for (uint32_t i = 0; !rc && i < g->n_nodes; i++) /* shorter first: a value's inner ANYOFs are shorter */
        if (g->nodes[i].kind == KN_ANYOF) order[n++] = (uint64_t)g->nodes[i].minb << 32 | i;
    if (!rc) qsort(order, n, sizeof *order, cmp_u64);
    for (uint32_t i = 0; !rc && i < n; i++) set_pick(g, (uint32_t)order[i], done, a, b);
    free(done), free(order), free(a), free(b);
    return rc ? rc : set_worst(g);
}

/* ---- a state's canonical completion ---- */

/* An object frame after ',' with no required property left: the shortest optional one (the least text). */
static void obj_optional(const kipp_grammar *g, const kg_node *nd, uint32_t from, kg_out *o)
{
    uint32_t best = KG_NONE, bl = KG_FAR;
    for (uint32_t j = from; j < nd->n; j++) {
        const kg_prop *p = &g->props[nd->first + j];
        uint32_t l = sat((uint64_t)g->nodes[p->key].minb + 1 + g->nodes[p->value].minb);
        if (l >= bl) continue; /* keys differ in their text, so among equal lengths the first byte that differs is
                                * in the key; declared order breaks no tie the text would not */
        best = j, bl = l;
    }
    for (uint32_t j = from; o->p && best != KG_NONE && j < nd->n; j++) { /* equal lengths: the least key text */
        const kg_prop *p = &g->props[nd->first + j], *q = &g->props[nd->first + best];
        uint32_t l = sat((uint64_t)g->nodes[p->key].minb + 1 + g->nodes[p->value].minb);
        char a[256], b[256];
        kg_out oa = {.p = a, .cap = sizeof a}, ob = {.p = b, .cap = sizeof b};
        if (j == best || l != bl) continue;
        gen_node(g, p->key, &oa), gen_node(g, q->key, &ob);
        size_t m = oa.n < ob.n ? oa.n : ob.n;
        if (m <= sizeof a && memcmp(a, b, m) < 0) best = j;
    }
    if (best == KG_NONE) {
        o->n += KG_FAR;
        return;
    }
    gen_node(g, g->props[nd->first + best].key, o);
    put(o, ":", 1);
    gen_node(g, g->props[nd->first + best].value, o);
}

static void obj_rem(const kipp_grammar *g, const kg_frame *f, const kg_node *nd, kg_out *o)
{
    uint32_t j = f->n;
    const kg_prop *p = &g->props[nd->first + (j < nd->n ? j : 0)];
    switch (f->st) {
    case 1: obj_rest(g, nd, j, 1, o); break;
    case 2: put(o, ":", 1); /* fall through */
    case 3: gen_node(g, p->value, o); /* fall through */
    case 4: obj_rest(g, nd, j + 1, 0, o); break;
    default: { /* 5: after ',' a property must come */
        uint32_t r = j;
        while (r < nd->n && !g->props[nd->first + r].required) r++;
        if (r < nd->n) obj_rest(g, nd, j, 1, o);
        else obj_optional(g, nd, j, o);
    }
    }
    put(o, "}", 1);
}

static void arr_rem(const kipp_grammar *g, const kg_frame *f, const kg_node *nd, kg_out *o)
{
    uint32_t more = 0;
    if (f->st == 1) more = nd->min;
    else if (f->st == 2) gen_node(g, nd->child, o), more = nd->min > f->n + 1 ? nd->min - (f->n + 1) : 0;
    else more = nd->min > f->n ? nd->min - f->n : 0;
    uint32_t i = 0;
    for (; i < more && o->n <= KG_CANON_MAX; i++) {
        if (i || f->st != 1) put(o, ",", 1);
        gen_node(g, nd->child, o);
    }
    if (i < more) o->n += KG_FAR; /* too long to keep */
    put(o, "]", 1);
}

static void str_rem(const kg_frame *f, const kg_node *nd, kg_out *o)
{
    /* what an escape or a UTF-8 sequence still takes, by phase (feed_str): its least bytes */
    static const char *const part[17] = {
        [2] = "\"", [3] = "\x80", [4] = "\x80\x80", [5] = "\xA0\x80", [6] = "\x80\x80", [7] = "\x80\x80\x80",
        [8] = "\x90\x80\x80", [9] = "\x80\x80\x80", [11] = "0000", [12] = "000", [13] = "00", [14] = "0",
        [16] = "000",
    };
    if (f->st < 17 && part[f->st]) put(o, part[f->st], strlen(part[f->st]));
    put_rep(o, ' ', f->n < nd->min ? nd->min - f->n : 0); /* untracked strings have min 0 */
    put(o, "\"", 1);
}

static void root_rem(const kipp_grammar *g, const kg_frame *f, const kg_node *nd, kg_out *o)
{
    if ((f->st == 0 || f->st == 4) && g->prefix != KG_NONE) gen_node(g, g->prefix, o);
    if (f->st <= 1 || f->st == 4) gen_node(g, nd->child, o);
    if (f->st <= 2 || f->st == 4) {
        if (g->suffix != KG_NONE) gen_node(g, g->suffix, o);
    }
}

/* Append what frame f still takes to close (its phases as grammar.c's feed_* leave them). */
static void frame_rem(const kipp_grammar *g, const kg_frame *f, kg_out *o)
{
    static const char *const obj_any[6] = {"", "}", ":0}", "0}", "}", "\"\":0}"};
    const kg_node *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case KN_ROOT: root_rem(g, f, nd, o); return;
    case KN_LIT: lit_rest(g, f->n, o); return;
    case KN_OBJ: obj_rem(g, f, nd, o); return;
    case KN_OBJ_ANY: put(o, obj_any[f->st < 6 ? f->st : 0], strlen(obj_any[f->st < 6 ? f->st : 0])); return;
    case KN_ARR: arr_rem(g, f, nd, o); return;
    case KN_STR: str_rem(f, nd, o); return;
    case KN_NUM:
    case KN_INT:
        if (f->st == 1 || f->st == 4 || f->st == 6 || f->st == 7) put(o, "0", 1); /* a digit must come */
        return;
    default: return;
    }
}

size_t kg_shortest_text(const kipp_grammar *g, const uint8_t *st, char *out, char *tmp, size_t cap)
{
    const uint8_t *p = st + 1;
    size_t best = KG_FAR;
    for (uint8_t i = 0; i < st[0]; i++) {
        uint8_t depth = p[0];
        kg_frame f[KG_MAX_DEPTH];
        memcpy(f, p + 1, depth * sizeof(kg_frame));
        p += 1 + depth * sizeof(kg_frame);
        kg_out o = {.p = tmp, .cap = cap};
        for (uint8_t d = depth; d-- > 0 && o.n < KG_FAR;) frame_rem(g, &f[d], &o);
        if (o.n > cap || o.n >= KG_FAR || o.n > best) continue;
        if (out && (o.n < best || memcmp(tmp, out, o.n) < 0)) memcpy(out, tmp, o.n);
        best = o.n;
    }
    return best;
}

/* ---- tokens: the fewest that spell it, and each state's need, remembered ---- */

struct kg_need_memo {
    uint64_t *hash;      /* [KG_MEMO_SLOTS] 0 = empty */
    uint32_t *off, *len, *need;
    uint8_t *keys;       /* [KG_MEMO_BYTES] */
    size_t used;
    uint32_t n;
    char *text, *tmp;    /* [KG_CANON_MAX] */
    uint32_t *best;      /* [KG_CANON_MAX + 1] */
    uint8_t *ok;         /* [KG_CANON_MAX] */
    uint8_t *sa, *sb;    /* [KG_STATE_MAX] */
};

void kg_need_memo_free(kg_need_memo *w)
{
    if (!w) return;
    free(w->hash), free(w->off), free(w->len), free(w->need), free(w->keys);
    free(w->text), free(w->tmp), free(w->best), free(w->ok), free(w->sa), free(w->sb);
    free(w);
}

static kg_need_memo *memo_of(kipp_grammar_matcher *m)
{
    if (m->memo) return m->memo;
    kg_need_memo *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->hash = calloc(KG_MEMO_SLOTS, sizeof *w->hash);
    w->off = malloc(KG_MEMO_SLOTS * sizeof *w->off), w->len = malloc(KG_MEMO_SLOTS * sizeof *w->len);
    w->need = malloc(KG_MEMO_SLOTS * sizeof *w->need), w->keys = malloc(KG_MEMO_BYTES);
    w->text = malloc(KG_CANON_MAX), w->tmp = malloc(KG_CANON_MAX);
    w->best = malloc((KG_CANON_MAX + 1) * sizeof *w->best), w->ok = malloc(KG_CANON_MAX);
    w->sa = malloc(KG_STATE_MAX), w->sb = malloc(KG_STATE_MAX);
    if (!w->hash || !w->off || !w->len || !w->need || !w->keys || !w->text || !w->tmp || !w->best || !w->ok ||
        !w->sa || !w->sb) {
        kg_need_memo_free(w);
        return NULL;
    }
    return m->memo = w;
}

/* ok[i]: added tokens may spell text[i] (every stack is in framing text before it). 0 when text[n] does not
 * take st to a complete state (a shortest completion the automaton refuses: none is known). */
static int walk_text(const kipp_grammar *g, const uint8_t *st, const char *text, size_t n, kg_need_memo *w)
{
    uint8_t *a = w->sa, *b = w->sb;
    memcpy(a, st, kg_state_len(st));
    for (size_t i = 0; i < n; i++) {
        w->ok[i] = g->vi->n_framing && (uint8_t)kg_state_framing(g, a);
        if (!kg_step(g, a, (uint8_t)text[i], b)) return 0;
        uint8_t *t = a;
        a = b, b = t;
    }
    return kg_state_complete(g, a);
}

/* The fewest tokens that spell text[n] from st: ordinary tokens anywhere (their bytes are the text's, which
 * the automaton takes, so the mask allows them), added ones where ok[] says framing text. Right to left:
 * best[i] spells text[i..n). KG_FAR when some suffix cannot be spelled. */
static uint32_t spell(const kipp_vocab_index *vi, const char *text, size_t n, kg_need_memo *w)
{
    const kg_trie *t = &vi->all;
    uint32_t *best = w->best;
    best[n] = 0;
    for (size_t i = n; i-- > 0;) {
        uint32_t b = KG_FAR, x = vi->all_kid[(uint8_t)text[i]];
        for (size_t d = 1; x != KG_NONE; d++) { /* node x spells text[i..i+d) */
            const kg_trie_node *nd = &t->nodes[x];
            if (nd->ntok && best[i + d] + 1 < b) b = best[i + d] + 1;
            if (i + d >= n) break;
            uint8_t c = (uint8_t)text[i + d];
            uint32_t k = x + 1;
            x = KG_NONE;
            while (k < nd->end && t->nodes[k].byte < c) k = t->nodes[k].end; /* kids in byte order */
            if (k < nd->end && t->nodes[k].byte == c) x = k;
        }
        for (uint32_t f = 0; f < vi->n_framing; f++) {
            uint32_t id = vi->framing[f], len = vi->off[id + 1] - vi->off[id], j = 0;
            if (i + len > n || best[i + len] + 1 >= b || memcmp(vi->blob + vi->off[id], text + i, len)) continue;
            while (j < len && w->ok[i + j]) j++;
            if (j == len) b = best[i + len] + 1;
        }
        best[i] = b;
    }
    return best[0];
}

/* The need of st (kipp_grammar_matcher_need), remembered per state. */
static uint32_t need_of(kipp_grammar_matcher *m, kg_need_memo *w, const uint8_t *st)
{
    const kipp_grammar *g = m->g;
    size_t klen = kg_state_len(st);
    uint64_t h = XXH3_64bits(st, klen) | 1;
    uint32_t slot = (uint32_t)h & (KG_MEMO_SLOTS - 1);
    for (; w->hash[slot]; slot = (slot + 1) & (KG_MEMO_SLOTS - 1))
        if (w->hash[slot] == h && w->len[slot] == klen && !memcmp(w->keys + w->off[slot], st, klen))
            return w->need[slot];
    uint32_t need = 1;
    if (!kg_state_complete(g, st)) {
        size_t n = kg_shortest_text(g, st, w->text, w->tmp, KG_CANON_MAX);
        need = n >= KG_FAR || !walk_text(g, st, w->text, n, w) ? KG_FAR : sat((uint64_t)spell(g->vi, w->text, n, w) + 1);
    }
    if (w->n >= KG_MEMO_SLOTS / 2 || w->used + klen > KG_MEMO_BYTES) { /* full: forget, then keep this one */
        memset(w->hash, 0, KG_MEMO_SLOTS * sizeof *w->hash);
        w->n = 0, w->used = 0;
        slot = (uint32_t)h & (KG_MEMO_SLOTS - 1);
    }
    w->hash[slot] = h, w->off[slot] = (uint32_t)w->used, w->len[slot] = (uint32_t)klen, w->need[slot] = need;
    memcpy(w->keys + w->used, st, klen);
    w->used += klen, w->n++;
    return need;
}

uint32_t kipp_grammar_matcher_need(kipp_grammar_matcher *m)
{
    if (m->ended) return 0;
    kg_need_memo *w = memo_of(m);
    return w ? need_of(m, w, m->cur) : KG_FAR;
}

size_t kipp_grammar_matcher_shortest(kipp_grammar_matcher *m, char *out, size_t cap)
{
    kg_need_memo *w = memo_of(m);
    if (!w || m->ended) return m->ended ? 0 : KG_FAR;
    size_t n = kg_shortest_text(m->g, m->cur, w->text, w->tmp, KG_CANON_MAX);
    if (n < KG_FAR && n <= cap) memcpy(out, w->text, n);
    return n <= cap ? n : KG_FAR;
}

/* ---- the budgeted mask ---- */

typedef struct {
    kipp_grammar_matcher *m;
    kg_need_memo *w;
    uint32_t limit;    /* the need a token's next state may have */
    uint32_t least;    /* the least need seen past the limit */
} kg_fit_ctx;

static int fits(void *ctx, const uint8_t *st)
{
    kg_fit_ctx *c = ctx;
    size_t n = kg_shortest_text(c->m->g, st, NULL, NULL, KG_FAR - 1);
    if (n + 1 <= c->limit) return 1; /* every byte is a token (all_bytes): n tokens spell it */
    uint32_t need = need_of(c->m, c->w, st);
    if (need <= c->limit) return 1;
    if (need < c->least) c->least = need;
    return 0;
}

static size_t popcount_words(const uint64_t *b, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (size_t)__builtin_popcountll(b[i]);
    return c;
}

const uint64_t *kipp_grammar_matcher_mask_budget(kipp_grammar_matcher *m, uint32_t budget, uint32_t *n_allowed)
{
    const kipp_grammar *g = m->g;
    const uint64_t *plain = kipp_grammar_matcher_mask(m, n_allowed);
    if (!plain || m->ended || !g->vi->all_bytes || budget >= (uint64_t)g->worst + 2) return plain;
    kg_need_memo *w = memo_of(m);
    size_t words = (g->vi->vocab + 63) / 64;
    if (!m->bud) m->bud = malloc(words * sizeof *m->bud);
    if (!w || !m->bud) return NULL;
    if (need_of(m, w, m->cur) > budget) return plain; /* nothing fits: the reply ends at the budget, as without it */
    kg_fit_ctx c = {.m = m, .w = w, .limit = budget - 1, .least = KG_FAR};
    kg_compute_mask(m, m->bud, fits, &c);
    size_t n = popcount_words(m->bud, words);
    if (!n && c.least < KG_FAR) { /* a need the canonical token should have kept (a state past KG_MAX_STACKS) */
        c.limit = c.least;
        kg_compute_mask(m, m->bud, fits, &c);
        n = popcount_words(m->bud, words);
    }
    if (!n) return plain;
    if (n_allowed) *n_allowed = (uint32_t)n;
    return m->bud;
}
