/*
 * grammar_impl.h - internals of constrained output, shared by grammar.c (the
 * automaton and masks), grammar_schema.c (JSON Schema -> nodes) and
 * grammar_vocab.c (the vocabulary's byte tries). Engine-private.
 *
 * The automaton is a set of stacks (a small GLR-style pushdown automaton):
 * each stack is a list of frames, each frame a position inside one schema
 * node. anyOf, type arrays, optional properties and enum alternatives fork
 * stacks; a byte that a stack cannot take drops it. The serialized set is the
 * state: it keys the per-grammar mask cache.
 */
#ifndef KIPP_GRAMMAR_IMPL_H
#define KIPP_GRAMMAR_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/internal.h"

#define KG_MAX_DEPTH 24     /* frames per stack: the root, the containers, the innermost value */
#define KG_MAX_NEST (KG_MAX_DEPTH - 2) /* objects and arrays nested at most (a schema deeper is refused) */
#define KG_MAX_STACKS 48    /* live alternatives at once (anyOf over this many tools) */
#define KG_ANY_DEPTH 6      /* free-form values (json_object mode) nest at most this many containers */
#define KG_WS_MAX 12        /* whitespace bytes at most before a document without prefix (e.g. "\n\n") */
#define KG_INDENT 4         /* indentation bytes at most per nesting level after a gap's newline */
#define KG_NEED_INF 255     /* kg_node.need of a node no finite document completes */
#define KG_INT_DIGITS 15    /* digits at most in a number's integer part (no leading zeros) */
#define KG_FRAC_DIGITS 15   /* digits at most after a number's '.' */
#define KG_EXP_DIGITS 3     /* digits at most in an exponent */
#define KG_UNBOUNDED UINT32_MAX
#define KG_FAR (1u << 24)   /* bytes or tokens past any budget: no finite completion, or one too long to keep */
#define KG_CANON_MAX 8192u  /* bytes at most in a kept shortest completion (grammar_budget.c) */

/** Schema node kinds. */
enum {
    KN_ROOT,    /* prefix, document, suffix, repeated with separators */
    KN_ANY,     /* any JSON value (forks into the free-form kinds) */
    KN_ANYOF,   /* alternatives: alts[0..n_alts) */
    KN_OBJ,     /* declared properties, in order */
    KN_OBJ_ANY, /* any keys, any values */
    KN_ARR,     /* items = child, min/max items */
    KN_STR,     /* min/max code points */
    KN_NUM,
    KN_INT,
    KN_LIT,     /* one of a set of byte strings (enum, const, true/false/null, framing text) */
};

/** A literal set: a small byte trie; node 0 is the root. */
typedef struct {
    uint8_t byte;
    uint8_t terminal; /* 1: a whole literal ends here */
    uint16_t n_kids;
    uint32_t first_kid; /* index into the literal trie array */
    uint32_t dist;      /* bytes from here to the nearest terminal (grammar_budget.c) */
} kg_lit_node;

/** One compiled schema node. */
typedef struct {
    uint8_t kind;
    uint8_t framing;      /* KN_LIT: framing text (added tokens may spell it) */
    uint8_t need;         /* frames the shortest completion of a fresh value takes at its deepest (this node's
                           * own included; KG_NEED_INF: none is finite): a value starts only where they fit */
    uint32_t minb;        /* bytes of the shortest fresh value (KG_FAR: none finite, or over KG_CANON_MAX) */
    uint32_t pick;        /* ANYOF: the alternative whose shortest text is the least in byte order among the
                           * shortest (grammar_budget.c: the canonical completion) */
    uint32_t min, max;    /* STR: code points; ARR: items; KG_UNBOUNDED = no max */
    uint32_t child;       /* ARR: items; ROOT: the document */
    uint32_t first, n;    /* OBJ: props[first..first+n); ANYOF: alts[first..first+n); LIT: lit trie root index */
} kg_node;

/** An object's declared property. */
typedef struct {
    uint32_t key;   /* KN_LIT node of the key, quotes included */
    uint32_t value; /* node of the value */
    int required;
} kg_prop;

/** One frame of a stack: a position inside node. */
typedef struct {
    uint16_t node;
    uint8_t st;   /* phase within the node */
    uint8_t ws;   /* the current gap: 0 nothing yet, KG_WS_DONE one space, 1 + k a newline and k indentation
                   * bytes (the root's leading gap: bytes so far) */
    uint32_t n;   /* counter: property, items, code points, digits, literal trie node */
} kg_frame;

/** The vocabulary as byte strings, with tries for mask walks. Built once per model. */
typedef struct {
    uint8_t byte;
    uint8_t pad;
    uint16_t depth;    /* 1 = first byte */
    uint32_t end;      /* index past this node's subtree (preorder) */
    uint32_t tok, ntok; /* ids[tok..tok+ntok) end here */
} kg_trie_node;

typedef struct {
    kg_trie_node *nodes;
    uint32_t n_nodes;
    uint32_t *ids;
    uint32_t max_depth;
} kg_trie;

typedef struct kipp_vocab_index {
    uint32_t vocab;          /* rows of logits (padding ids included) */
    uint32_t n_tokens;       /* ids with a byte string */
    char *blob;              /* all token bytes */
    uint32_t *off;           /* [n_tokens + 1] offsets into blob */
    uint8_t *added;          /* [n_tokens] 1 added (non-special), 2 special: never in a document */
    kg_trie all;             /* every ordinary token */
    kg_trie odd;             /* ordinary tokens that are not plain string text */
    uint32_t *plain;         /* [n_plain] tokens that are plain string text (no '"', '\\', controls; whole UTF-8) */
    uint16_t *plain_cp;      /* [n_plain] their code points */
    uint32_t n_plain;
    uint32_t *framing;       /* [n_framing] added non-special tokens */
    uint32_t n_framing;
    uint32_t stop_ids[2], n_stop;
    uint32_t all_kid[256];   /* the all trie's first-level node of each byte, or UINT32_MAX */
    int all_bytes;           /* 1: every byte value is an ordinary token (byte-level BPE): any text can be spelled */
} kipp_vocab_index;

/**
 * Build the index of tokens[n_tokens] (byte strings; added[i] as in the
 * struct) for a vocabulary of vocab rows. Errors: KIPP_ENOMEM.
 */
int kipp_vocab_index_build(const kipp_str *tokens, const uint8_t *added, uint32_t n_tokens, uint32_t vocab,
                           const uint32_t *stop_ids, uint32_t n_stop, kipp_vocab_index **out, char *err,
                           size_t errlen);
void kipp_vocab_index_free(kipp_vocab_index *vi);
/** The model's index, built on first use (thread-safe) and kept for the process. NULL on failure. */
const kipp_vocab_index *kipp_vocab_index_of(kipp_model *model, char *err, size_t errlen);

/** A mask cache entry. */
typedef struct kg_cache_entry {
    uint64_t hash;
    uint32_t klen;
    uint8_t *key;
    uint64_t *bits;
    struct kg_cache_entry *next;
} kg_cache_entry;

struct kipp_grammar {
    const kipp_vocab_index *vi;
    kipp_vocab_index *own_vi; /* tests: an index the grammar owns */
    kg_node *nodes;
    uint32_t n_nodes, cap_nodes;
    kg_prop *props;
    uint32_t n_props, cap_props;
    uint32_t *alts;
    uint32_t n_alts, cap_alts;
    kg_lit_node *lits;
    uint32_t n_lits, cap_lits;
    uint32_t root, prefix, suffix, separator; /* LIT nodes, or UINT32_MAX: none */
    uint32_t max_count;
    uint32_t n_any, n_str_any, n_num_any, n_tfn, n_obj_any, n_arr_any; /* the free-form nodes */
    uint32_t worst;           /* bytes: no state's shortest completion is longer (KG_FAR: unbounded) */
    pthread_mutex_t mu;
    kg_cache_entry **buckets; /* [KG_BUCKETS] */
    uint32_t n_cached;
};

#define KG_NONE UINT32_MAX
#define KG_WS_DONE 255


/* grammar_schema.c */
int kg_add_node(kipp_grammar *g, kg_node n, uint32_t *id);
int kg_add_lit(kipp_grammar *g, const char *const *s, const size_t *len, size_t n, int framing, uint32_t *id);
int kg_compile_schema(kipp_grammar *g, const char *schema, uint32_t *doc, char *err, size_t errlen);
/** Set every node's need (kg_node) by a fixpoint over the node graph (cycles through $ref included). */
void kg_set_needs(kipp_grammar *g);

/* ---- the automaton over serialized states (grammar.c) ---- */

#define KG_STATE_MAX (1 + KG_MAX_STACKS * (1 + KG_MAX_DEPTH * sizeof(kg_frame)))

/** One byte over serialized state in into out[KG_STATE_MAX]; the new state's size, 0 when no stack survives. */
size_t kg_step(const kipp_grammar *g, const uint8_t *in, uint8_t c, uint8_t *out);
/** Bytes of a serialized state. */
size_t kg_state_len(const uint8_t *st);
/** 1 when some stack of st is complete (an end-of-turn id may come). */
int kg_state_complete(const kipp_grammar *g, const uint8_t *st);
/** 1 when every stack of st is outside the documents (added tokens may spell framing text here). */
int kg_state_framing(const kipp_grammar *g, const uint8_t *st);

/* ---- the matcher: one generation's position in a grammar (grammar.c) ---- */

typedef struct kipp_grammar_matcher kipp_grammar_matcher;
typedef struct kg_need_memo kg_need_memo;

struct kipp_grammar_matcher {
    const kipp_grammar *g;
    uint8_t *cur, *tmp;   /* [KG_STATE_MAX] the state, and a step's output */
    uint8_t *scratch;     /* [(max trie depth + 2) * KG_STATE_MAX] one state per walk depth */
    uint64_t *own;        /* a mask not kept by the cache */
    int ended;            /* an end-of-turn id was accepted */
    /* the token budget (grammar_budget.c), allocated on first use */
    uint64_t *bud;        /* the budgeted mask */
    kg_need_memo *memo;   /* tokens needed per state, and the work buffers of computing them */
};

/** Whether a token leads to a state that fits (a mask walk's filter); ctx is the filter's. */
typedef int (*kg_fit_fn)(void *ctx, const uint8_t *state);
/** The allowed tokens of the matcher's state into bits[vocab words]; with fit, only those whose state after
 * the token fits (end-of-turn ids always do: nothing follows them). */
void kg_compute_mask(kipp_grammar_matcher *m, uint64_t *bits, kg_fit_fn fit, void *ctx);

/* ---- the token budget (grammar_budget.c) ---- */

/** Free a matcher's memo of needs (NULL: nothing). */
void kg_need_memo_free(kg_need_memo *memo);
/** Set every node's minb and pick, each literal node's dist, and the grammar's worst. Errors: KIPP_ENOMEM. */
int kg_set_shortest(kipp_grammar *g);
/** The shortest completion of serialized state st, the least in byte order among those (the end of turn not
 * included), into out[cap] (tmp[cap]: work; out and tmp NULL: only its length); its length, or KG_FAR when
 * none is known or it passes cap. */
size_t kg_shortest_text(const kipp_grammar *g, const uint8_t *st, char *out, char *tmp, size_t cap);
/** The matcher's shortest completion (kg_shortest_text) into out[cap]; its length, or KG_FAR. */
size_t kipp_grammar_matcher_shortest(kipp_grammar_matcher *m, char *out, size_t cap);
/** Tokens the matcher needs at least to finish: its shortest completion, spelled in fewest tokens, plus the
 * end of turn (an upper bound on the true least: a completion longer in bytes may take fewer tokens);
 * 0 once ended, KG_FAR when unknown. */
uint32_t kipp_grammar_matcher_need(kipp_grammar_matcher *m);
/** The matcher's mask when budget tokens are left (this one and the end of turn included): where the need
 * could pass the budget, only the tokens after which the need still fits in budget - 1; the plain mask
 * where no token can pass it (budget >= worst + 2) or where the need already does. NULL on out of memory. */
const uint64_t *kipp_grammar_matcher_mask_budget(kipp_grammar_matcher *m, uint32_t budget, uint32_t *n_allowed);

/** Compile spec over an explicit vocabulary index (tests; vi is then owned by the grammar when own is 1). */
int kipp_grammar_create_vi(kipp_vocab_index *vi, int own, const kipp_grammar_spec *spec, kipp_grammar **out,
                           char *err, size_t errlen);
/** A matcher at the grammar's start. NULL on out of memory. */
kipp_grammar_matcher *kipp_grammar_matcher_create(const kipp_grammar *g);
void kipp_grammar_matcher_destroy(kipp_grammar_matcher *m);
/** Feed bytes; 0 when every byte was accepted, else KIPP_EINVAL (the matcher is left unchanged). */
int kipp_grammar_matcher_feed(kipp_grammar_matcher *m, const char *bytes, size_t n);
/** 1 when bytes[n] would be accepted; the state is kept. */
int kipp_grammar_matcher_can(kipp_grammar_matcher *m, const char *bytes, size_t n);
/** Feed token id's bytes (an end-of-turn id is accepted only when complete); 0 or KIPP_EINVAL. */
int kipp_grammar_matcher_accept(kipp_grammar_matcher *m, uint32_t id);
/** 1 when the documents are complete (an end-of-turn id may come now). */
int kipp_grammar_matcher_complete(const kipp_grammar_matcher *m);
/** The allowed tokens now: a bitset over vocab rows, owned by the grammar's cache or the matcher; valid until the
 * matcher's next call. *n_allowed gets the count. NULL on out of memory. */
const uint64_t *kipp_grammar_matcher_mask(kipp_grammar_matcher *m, uint32_t *n_allowed);

#endif
