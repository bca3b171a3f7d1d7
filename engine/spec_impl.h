/*
 * spec_impl.h - the speculative drafter's state, shared by engine/spec.c (the
 * prompt-lookup drafter, the gate and the verification step) and
 * engine/spec_draft.c (the draft-model drafter and speculative sampling).
 * Engine-internal.
 */
#ifndef KIPP_ENGINE_SPEC_IMPL_H
#define KIPP_ENGINE_SPEC_IMPL_H

#include "engine/internal.h"

/** One sequence's drafter: options, buffers, the gate's estimates and counters. */
struct kipp_spec {
    const kipp_model *model; /* the model its logits rows, stop ids and reference are for */
    const kipp_model *same;  /* the last other model found to share its tokenizer: that check reads the whole
                              * vocabulary, so it runs once per model, not per step */
    uint32_t vocab;
    kipp_spec_options o;
    uint32_t stop[2];
    float *logits;           /* [k_max+1][vocab] FP32 verification rows */
    uint32_t *hist;          /* [hist_cap] p->history + emitted-so-far, for penalties */
    size_t hist_cap;
    uint32_t *ref;           /* [n_ref] reference tokens (predicted output) */
    size_t n_ref;
    double acc, rej;         /* decayed accepted draft tokens / rejections */
    double t_rows[KIPP_SPEC_K_MAX + 2]; /* [r] average seconds of an r-row verification; 0 = not timed */
    double fixed_cost[KIPP_SPEC_K_MAX + 1]; /* [k] options.costs; [0] == 0 when none were given */
    uint32_t idle, probe_every; /* plain steps while paused; interval before the next probe */
    kipp_spec_stats st;
    /* the draft model (spec_draft.c); dm NULL = prompt lookup */
    kipp_model *dm;
    kipp_session *ds;        /* the draft's own session, created at the first proposal */
    uint32_t *ds_tok;        /* [ds_cap] the ids ds holds, in order (its length many) */
    uint32_t ds_cap;
    float *dlog;             /* [vocab] the draft's latest logits row */
    float *q;                /* [k_max][vocab] the draft's sampling distribution at each drafted position */
    float *pr;               /* [vocab] the target's distribution at the row being verified */
    int sampled;             /* 1: the last proposal sampled its draft (q holds its rows); 0: greedy */
    double t_deval;          /* average seconds of one draft evaluation; 0 = not timed */
    double draft_prior;      /* the gate's cost of one draft evaluation in decode steps until timed */
    uint32_t ramp;           /* a draft model's longest draft for now: 1, doubled after each whole draft accepted */
};

/** Seconds on the monotonic clock. */
double kipp_spec_now(void);

/**
 * Draft-model proposal (spec_draft.c): bring sp->ds up to ctx[0..n_ctx) and
 * draft up to k tokens after it into draft; *n_draft gets the count. p and
 * rng as kipp_spec_propose_ex. 0 or a KIPP_E* code (nothing drafted).
 */
int kipp_spec_draft_model(kipp_spec *sp, const uint32_t *ctx, size_t n_ctx, uint32_t k, uint32_t cap,
                          const kipp_sample_params *p, kipp_rng *rng, uint32_t *draft, uint32_t *n_draft, char *err,
                          size_t errlen);

/** Check dm against sp's model (kipp_draft_check) and allocate the draft's buffers; 0 or a KIPP_E* code. */
int kipp_spec_draft_init(kipp_spec *sp, kipp_model *dm, char *err, size_t errlen);
/** Free what kipp_spec_draft_init and the proposals made (the draft session included). */
void kipp_spec_draft_free(kipp_spec *sp);
/** Room in sp->hist for n ids; 0 or KIPP_ENOMEM. */
int kipp_spec_hist_reserve(kipp_spec *sp, size_t n, char *err, size_t errlen);
/**
 * Start sampling n_draft + 1 verified rows: *rp = *p with its history moved
 * into sp->hist (owned by sp), which keeps room for the rows' emitted tokens.
 * Shared by the prompt-lookup and draft-model row samplers. 0 or KIPP_ENOMEM.
 */
int kipp_spec_rows_begin(kipp_spec *sp, const kipp_sample_params *p, uint32_t n_draft, kipp_sample_params *rp,
                         char *err, size_t errlen);

/** 1 when t is one of the drafter's stop ids. */
static inline int kipp_spec_is_stop(const kipp_spec *sp, uint32_t t)
{
    for (uint32_t i = 0; i < sp->o.n_stop; i++)
        if (sp->stop[i] == t) return 1;
    return 0;
}

/**
 * Speculative sampling over verified rows (spec_draft.c): row r of logits
 * follows ctx + draft[0..r); accept draft[r] with probability min(1, p/q),
 * else sample the residual and stop; the row after a whole accepted draft is
 * sampled from p. Writes out[] and *accepted; returns the count or a KIPP_E* code.
 */
int kipp_spec_sample_rows(kipp_spec *sp, const kipp_sample_params *p, kipp_rng *rng, const float *logits,
                          const uint32_t *draft, uint32_t n_draft, uint32_t max_new, uint32_t *out,
                          uint32_t *accepted, char *err, size_t errlen);

/** Test-only: 1 samples a rejected row's token from p instead of max(0, p - q) (a broken rejection step). */
extern int kipp_spec_broken_residual;

#endif
