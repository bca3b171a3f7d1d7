/*
 * step_cost.h - the scheduler's step-cost model and the prefill share it
 * allows (Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024).
 *
 * The model predicts one step's wall time, from the start of its plan to the
 * end of its publishing, as
 *     t = a + b * decode_tokens + c * prefill_tokens + d * attention_kpairs
 * fitted online to the steps the scheduler measures: exponentially weighted
 * least squares (each step's weight is SERVE_COST_DECAY times the next one's),
 * regularized toward the previous fit so a term the recent steps do not vary
 * (no prefill for a while) keeps its last value instead of drifting to 0.
 * Until the steps have shown two different decode batch sizes, a and b
 * cannot be told apart (a fresh server decodes one stream first), so b is
 * tied to c meanwhile (on a CPU a decode row costs about what a prompt
 * token does, the output head aside): the cost of a larger decode batch is
 * then not guessed as zero.
 * attention_kpairs counts (query, key) position pairs in units of 1024: a
 * chunk of n tokens evaluated after pos positions attends n*pos + n(n+1)/2.
 *
 * serve_step_plan_prefill then gives the prefilling choices, oldest first,
 * the tokens that fit both the token budget (--step-tokens) and the time
 * target (--step-ms) beside the step's decode part. Pure arithmetic: no
 * locks, no engine; tests/test_step_cost.c pins it.
 */
#ifndef KIPP_STEP_COST_H
#define KIPP_STEP_COST_H

#include <stdint.h>

#define SERVE_COST_TERMS 4      /* a, b, c, d above */
#define SERVE_COST_DECAY 0.97   /* weight of a step relative to the next one (a memory of ~33 steps) */
#define SERVE_COST_RIDGE 1e-3   /* pull toward the previous fit, in units of feature^2 (features are O(1..1000)) */
#define SERVE_COST_TIE 10.0     /* pull of b toward c until two decode batch sizes were seen (see below) */
#define SERVE_MIN_CHUNK 16      /* prompt tokens the oldest prefilling choice gets in any step (progress) */
#define SERVE_BURST_RATIO 1.0   /* a burst: prefilling choices >= this x decoding choices (see serve_step_burst) */

/** What one step evaluates, in the model's features. */
typedef struct {
    double decode_tokens;   /* tokens of decoding items (pending token + drafts): each has a logits row, sampled */
    double prefill_tokens;  /* prompt tokens (and positions re-evaluated after a preemption) */
    double attn_kpairs;     /* (query, key) pairs attended by every token of the step / 1024 */
} serve_step_load;

/** The online fit. Zero-initialise (serve_cost_init); coefficients in seconds per unit. */
typedef struct {
    double xtx[SERVE_COST_TERMS][SERVE_COST_TERMS]; /* decayed sum of x x^T, x = (1, decode, prefill, attn) */
    double xty[SERVE_COST_TERMS];                   /* decayed sum of x * seconds */
    double theta[SERVE_COST_TERMS];                 /* the fit: a, b, c, d (each clamped at >= 0) */
    uint64_t n;                                     /* steps observed */
    double dec_first;                               /* the first positive decode token count seen (0 = none) */
    int dec_varied;                                 /* 1: another one has been seen since: b is fitted freely */
} serve_cost_model;

/** Reset m to no observations and every coefficient 0. */
void serve_cost_init(serve_cost_model *m);
/** Add one measured step: its load and its wall time in seconds; refits theta. */
void serve_cost_observe(serve_cost_model *m, const serve_step_load *load, double seconds);
/** Predicted seconds of a step with this load (theta . x). */
double serve_cost_predict(const serve_cost_model *m, const serve_step_load *load);
/** (query, key) pairs / 1024 of n tokens evaluated after pos positions: (n*pos + n(n+1)/2) / 1024. */
double serve_attn_kpairs(uint32_t pos, uint32_t n);

/** One prefilling choice, in admission order (oldest first). */
typedef struct {
    uint32_t left;          /* prompt tokens still to evaluate (>= 1) */
    uint32_t pos;           /* positions its session holds: where its chunk starts */
} serve_prefill_want;

/** The inputs of one step's prefill share. */
typedef struct {
    uint32_t token_room;    /* --step-tokens minus the decode tokens (0 when they fill it) */
    uint32_t chunk;         /* first pass: each prefilling choice gets up to this many (SERVE_CHUNK) */
    uint32_t min_chunk;     /* the oldest always gets min(left, min_chunk), budgets or not */
    double target_s;        /* step time target in seconds; 0 = none (token budget only) */
    const serve_cost_model *cost; /* the fit predicting the step (used when target_s > 0) */
    serve_step_load decode; /* the step's decode part */
    uint32_t decoding;      /* choices with a decode item in the step */
} serve_prefill_plan;

/**
 * 1 when the step's n prefilling choices are a burst: at least
 * SERVE_BURST_RATIO x p->decoding (always when nothing decodes). A burst's
 * prompts then take the token budget alone, with no time target: many short
 * prompts go through one pass at the prefill tile's efficiency and start
 * decoding together, and each decoding choice waits one long step (one
 * inter-token gap) instead of every prompt's first token waiting for dozens
 * of target-sized steps (on a CPU a prompt token costs about what a decode
 * row does, so a stall-free step holds only a few tens of them). TGI's
 * waiting_served_ratio makes the same call. Otherwise (few prompts beside
 * many decoding streams) the time target applies: Sarathi-Serve's stall-free
 * steps.
 */
int serve_step_burst(const serve_prefill_plan *p, int n);

/**
 * Fill give[n] with the prompt tokens each prefilling choice pre[n] (oldest
 * first) evaluates this step, and return their sum. First pass: each gets
 * min(left, chunk) while the token room and the time room last (a later one
 * gets what is left of them); the oldest gets at least min(left, min_chunk).
 * Second pass: what is left lengthens the chunks that got tokens, oldest
 * first. The time room is target_s minus the predicted decode part (with the
 * step's base cost a), and a chunk of n tokens at pos costs
 * c*n + d*serve_attn_kpairs(pos, n) plus what the earlier chunks cost; it
 * applies only when target_s > 0, the step decodes (someone's inter-token
 * latency is at stake), the prompts are not a burst (serve_step_burst) and
 * the fit gives prefill a positive cost (c or d > 0).
 */
uint32_t serve_step_plan_prefill(const serve_prefill_plan *p, const serve_prefill_want *pre, int n, uint32_t *give);

#endif
