/*
 * test_step_cost.c - the stall-free step planner's arithmetic
 * (server/step_cost.c), against hand-computed chunk sizes:
 *   - the token budget alone (--step-ms 0, or no decodes): SERVE_CHUNK each
 *     oldest first, the oldest always, the rest lengthening them;
 *   - a time target: the chunks that fit target - predicted decode part,
 *     with exact dyadic costs so every comparison is exact in double
 *     (the expected sizes were worked out with exact fractions);
 *   - the oldest's minimum chunk when the decode part alone exceeds it;
 *   - the online fit recovers the coefficients of exactly linear steps, and
 *     keeps the prefill cost through a long run of decode-only steps.
 */
#include <math.h>
#include <string.h>

#include "server/step_cost.h"
#include "tests/test_harness.h"

static serve_cost_model dyadic_model(void)
{
    serve_cost_model m;
    serve_cost_init(&m);
    m.theta[0] = 1.0 / 64, m.theta[1] = 1.0 / 256, m.theta[2] = 1.0 / 1024, m.theta[3] = 1.0 / 4096;
    return m;
}

static serve_prefill_plan plan_of(const serve_cost_model *m, uint32_t room, double target_s, double decode_tokens)
{
    return (serve_prefill_plan){.token_room = room, .chunk = 32, .min_chunk = 16, .target_s = target_s, .cost = m,
                                .decode = {.decode_tokens = decode_tokens}, .decoding = (uint32_t)decode_tokens};
}

static void test_attention_pairs(void)
{
    CHECK(serve_attn_kpairs(0, 30) == 465.0 / 1024, "%g", serve_attn_kpairs(0, 30));
    CHECK(serve_attn_kpairs(200, 30) == 6465.0 / 1024, "%g", serve_attn_kpairs(200, 30));
    CHECK(serve_attn_kpairs(7, 0) == 0, "%g", serve_attn_kpairs(7, 0));
}

static void test_token_budget_only(void)
{
    serve_cost_model m = dyadic_model();
    serve_prefill_want pre[3] = {{50, 0}, {40, 0}, {100, 0}};
    uint32_t give[3];
    serve_prefill_plan p = plan_of(&m, 100, 0, 8); /* no target */
    uint32_t got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 100 && give[0] == 36 && give[1] == 32 && give[2] == 32, "%u: %u %u %u", got, give[0], give[1], give[2]);
    p.token_room = 0; /* decodes filled the budget: the oldest still gets its chunk */
    got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 32 && give[0] == 32 && give[1] == 0 && give[2] == 0, "%u: %u %u %u", got, give[0], give[1], give[2]);
    p.token_room = 512; /* everything fits: whole prompts */
    got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 190 && give[0] == 50 && give[1] == 40 && give[2] == 100, "%u: %u %u %u", got, give[0], give[1], give[2]);
    /* a target with no decode in the step protects nobody's ITL: the token budget alone */
    p = plan_of(&m, 100, 5.0 / 64, 0);
    got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 100 && give[0] == 36, "%u: %u", got, give[0]);
}

static void test_time_target(void)
{
    serve_cost_model m = dyadic_model();
    serve_prefill_want pre[2] = {{100, 0}, {100, 200}};
    uint32_t give[2];
    /* decode part 1/64 + 8/256 = 3/64 s; target 5/64 leaves 1/32 s: 31 tokens at pos 0
     * (31/1024 + 496/1024/4096 s), nothing for the second */
    serve_prefill_plan p = plan_of(&m, 504, 5.0 / 64, 8);
    uint32_t got = serve_step_plan_prefill(&p, pre, 2, give);
    CHECK(got == 31 && give[0] == 31 && give[1] == 0, "%u: %u %u", got, give[0], give[1]);
    /* target 7/64 leaves 1/16 s: a full chunk of 32, then 30 at pos 200 (31 would cost 0.03187 > 0.03112 left) */
    p.target_s = 7.0 / 64;
    got = serve_step_plan_prefill(&p, pre, 2, give);
    CHECK(got == 62 && give[0] == 32 && give[1] == 30, "%u: %u %u", got, give[0], give[1]);
    /* the token room binds before the time: 40 tokens in all, the second gets 8 */
    p.token_room = 40;
    got = serve_step_plan_prefill(&p, pre, 2, give);
    CHECK(got == 40 && give[0] == 32 && give[1] == 8, "%u: %u %u", got, give[0], give[1]);
    /* a large target: the second pass lengthens the oldest to its whole prompt first */
    p.token_room = 504, p.target_s = 1;
    got = serve_step_plan_prefill(&p, pre, 2, give);
    CHECK(got == 200 && give[0] == 100 && give[1] == 100, "%u: %u %u", got, give[0], give[1]);
}

static void test_min_chunk(void)
{
    serve_cost_model m = dyadic_model();
    serve_prefill_want pre[2] = {{100, 0}, {100, 0}}, small[1] = {{5, 40}};
    uint32_t give[2];
    serve_prefill_plan p = plan_of(&m, 504, 1.0 / 32, 8); /* below the decode part (3/64 s) */
    uint32_t got = serve_step_plan_prefill(&p, pre, 2, give);
    CHECK(got == 16 && give[0] == 16 && give[1] == 0, "%u: %u %u", got, give[0], give[1]);
    got = serve_step_plan_prefill(&p, small, 1, give);
    CHECK(got == 5 && give[0] == 5, "a prompt shorter than the minimum finishes: %u", give[0]);
    m.theta[2] = m.theta[3] = 0; /* no prefill cost fitted yet: the token budget alone */
    got = serve_step_plan_prefill(&p, pre, 2, give);
    CHECK(got == 200 && give[0] == 100 && give[1] == 100, "%u: %u %u", got, give[0], give[1]);
}

/* A burst (at least as many prefilling as decoding choices) takes the token
 * budget alone; fewer prompts beside more decodes get the time target. */
static void test_burst(void)
{
    serve_cost_model m = dyadic_model();
    serve_prefill_want pre[3] = {{100, 0}, {100, 0}, {100, 0}};
    uint32_t give[3];
    serve_prefill_plan p = plan_of(&m, 504, 1.0 / 32, 8); /* target below the decode part: the minimum chunk */
    p.decoding = 3;                                       /* 3 prompts beside 3 decoding choices: a burst */
    CHECK(serve_step_burst(&p, 3) && serve_step_burst(&p, 4) && !serve_step_burst(&p, 2) && !serve_step_burst(&p, 0),
          "burst iff 1 <= prompts and prompts >= %g x 3 decoding", SERVE_BURST_RATIO);
    uint32_t got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 300 && give[0] == 100 && give[1] == 100 && give[2] == 100, "%u: %u %u %u", got, give[0], give[1], give[2]);
    p.token_room = 250; /* the token budget still binds a burst: 32 each, then the oldest lengthen */
    got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 250 && give[0] == 100 && give[1] == 100 && give[2] == 50, "%u: %u %u %u", got, give[0], give[1], give[2]);
    p.token_room = 504, p.decoding = 4; /* 3 prompts beside 4 decoding choices: stall-free, the oldest's minimum */
    got = serve_step_plan_prefill(&p, pre, 3, give);
    CHECK(got == 16 && give[0] == 16 && give[1] == 0 && give[2] == 0, "%u: %u %u %u", got, give[0], give[1], give[2]);
    p.decoding = 0; /* nothing decodes: always the token budget */
    CHECK(serve_step_burst(&p, 1), "a lone prompt with no decode is a burst");
}

static void test_fit(void)
{
    const double truth[4] = {0.02, 0.004, 0.0015, 0.0003};
    serve_cost_model m;
    serve_cost_init(&m);
    for (int i = 0; i < 300; i++) { /* varied, non-collinear loads */
        serve_step_load l = {.decode_tokens = 1 + i % 8, .prefill_tokens = (i * 37) % 257, .attn_kpairs = (i * 11) % 41};
        double y = truth[0] + truth[1] * l.decode_tokens + truth[2] * l.prefill_tokens + truth[3] * l.attn_kpairs;
        serve_cost_observe(&m, &l, y);
    }
    for (int i = 0; i < 4; i++) CHECK(fabs(m.theta[i] - truth[i]) <= 1e-6 * truth[i], "theta[%d] %.9g vs %.9g", i, m.theta[i], truth[i]);
    serve_step_load q = {8, 100, 20};
    double want = truth[0] + 8 * truth[1] + 100 * truth[2] + 20 * truth[3];
    CHECK(fabs(serve_cost_predict(&m, &q) - want) <= 1e-6 * want, "%.9g vs %.9g", serve_cost_predict(&m, &q), want);
    for (int i = 0; i < 3000; i++) { /* decode only: prefill is not seen for ~90 memories */
        serve_step_load l = {.decode_tokens = 1 + i % 8, .attn_kpairs = (i * 3) % 7};
        serve_cost_observe(&m, &l, truth[0] + truth[1] * l.decode_tokens + truth[3] * l.attn_kpairs);
    }
    CHECK(fabs(m.theta[2] - truth[2]) <= 1e-6 * truth[2], "prefill cost kept: %.9g vs %.9g", m.theta[2], truth[2]);
    CHECK(m.n == 3300, "%llu", (unsigned long long)m.n);
}

/* A fresh server decodes one stream at a time at first: a and b are not
 * identifiable, and b is tied to c until a second batch size shows up. */
static void test_tie_until_varied(void)
{
    const double truth[4] = {0.03, 0.002, 0.002, 0.0};
    serve_cost_model m;
    serve_cost_init(&m);
    for (int i = 0; i < 50; i++) {
        serve_step_load l = {.decode_tokens = 1, .prefill_tokens = (i % 3) * 50.0};
        serve_cost_observe(&m, &l, truth[0] + truth[1] + truth[2] * l.prefill_tokens);
    }
    CHECK(!m.dec_varied && fabs(m.theta[1] - m.theta[2]) <= 1e-3 * m.theta[2], "b %.9g c %.9g", m.theta[1], m.theta[2]);
    CHECK(fabs(m.theta[0] - truth[0]) <= 1e-3 * truth[0], "a %.9g", m.theta[0]);
    serve_step_load eight = {.decode_tokens = 8};
    double want = truth[0] + 8 * truth[1];
    CHECK(fabs(serve_cost_predict(&m, &eight) - want) <= 1e-3 * want, "B=8 %.9g vs %.9g", serve_cost_predict(&m, &eight), want);
    serve_step_load two = {.decode_tokens = 2};
    serve_cost_observe(&m, &two, truth[0] + 2 * truth[1]);
    CHECK(m.dec_varied, "a second batch size frees b");
}

int main(void)
{
    RUN(test_attention_pairs);
    RUN(test_token_budget_only);
    RUN(test_time_target);
    RUN(test_min_chunk);
    RUN(test_burst);
    RUN(test_fit);
    RUN(test_tie_until_varied);
    return th_finish();
}
