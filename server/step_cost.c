/*
 * step_cost.c - the online step-cost fit and the prefill share of a step
 * (step_cost.h). The fit is a 4-term weighted ridge regression solved afresh
 * each step (Gaussian elimination with partial pivoting on 4x4: cheaper than
 * one sampled row's argmax).
 */
#include "server/step_cost.h"

#include <math.h>
#include <string.h>

void serve_cost_init(serve_cost_model *m) { memset(m, 0, sizeof *m); }

double serve_attn_kpairs(uint32_t pos, uint32_t n)
{
    return ((double)n * pos + (double)n * (n + 1) / 2) / 1024.0;
}

static void features(const serve_step_load *l, double x[SERVE_COST_TERMS])
{
    x[0] = 1, x[1] = l->decode_tokens, x[2] = l->prefill_tokens, x[3] = l->attn_kpairs;
}

double serve_cost_predict(const serve_cost_model *m, const serve_step_load *load)
{
    double x[SERVE_COST_TERMS], t = 0;
    features(load, x);
    for (int i = 0; i < SERVE_COST_TERMS; i++) t += m->theta[i] * x[i];
    return t;
}

/* Solve a x = b in place (a: n x n, b: n) by elimination with partial
 * pivoting; 0, or -1 when a pivot vanishes (the ridge keeps it from doing so). */
static int solve(double a[SERVE_COST_TERMS][SERVE_COST_TERMS], double b[SERVE_COST_TERMS], double x[SERVE_COST_TERMS])
{
    const int n = SERVE_COST_TERMS;
    for (int k = 0; k < n; k++) {
        int p = k;
        for (int i = k + 1; i < n; i++)
            if (fabs(a[i][k]) > fabs(a[p][k])) p = i;
        if (!(fabs(a[p][k]) > 0)) return -1;
        if (p != k) {
            for (int j = 0; j < n; j++) {
                double t = a[k][j];
                a[k][j] = a[p][j], a[p][j] = t;
            }
            double t = b[k];
            b[k] = b[p], b[p] = t;
        }
        for (int i = k + 1; i < n; i++) {
            double f = a[i][k] / a[k][k];
            for (int j = k; j < n; j++) a[i][j] -= f * a[k][j];
            b[i] -= f * b[k];
        }
    }
    for (int i = n - 1; i >= 0; i--) {
        double s = b[i];
        for (int j = i + 1; j < n; j++) s -= a[i][j] * x[j];
        x[i] = s / a[i][i];
    }
    return 0;
}

void serve_cost_observe(serve_cost_model *m, const serve_step_load *load, double seconds)
{
    double x[SERVE_COST_TERMS], a[SERVE_COST_TERMS][SERVE_COST_TERMS], b[SERVE_COST_TERMS], th[SERVE_COST_TERMS];
    features(load, x);
    for (int i = 0; i < SERVE_COST_TERMS; i++) {
        for (int j = 0; j < SERVE_COST_TERMS; j++) m->xtx[i][j] = SERVE_COST_DECAY * m->xtx[i][j] + x[i] * x[j];
        m->xty[i] = SERVE_COST_DECAY * m->xty[i] + x[i] * seconds;
    }
    m->n++;
    if (load->decode_tokens > 0 && m->dec_first == 0) m->dec_first = load->decode_tokens;
    else if (load->decode_tokens > 0 && load->decode_tokens != m->dec_first) m->dec_varied = 1;
    /* minimise sum w (y - theta.x)^2 + ridge |theta - theta_prev|^2 (+ tie (b - c)^2 until varied) */
    memcpy(a, m->xtx, sizeof a);
    for (int i = 0; i < SERVE_COST_TERMS; i++) a[i][i] += SERVE_COST_RIDGE, b[i] = m->xty[i] + SERVE_COST_RIDGE * m->theta[i];
    if (!m->dec_varied) a[1][1] += SERVE_COST_TIE, a[2][2] += SERVE_COST_TIE, a[1][2] -= SERVE_COST_TIE, a[2][1] -= SERVE_COST_TIE;
    if (solve(a, b, th)) return;
    for (int i = 0; i < SERVE_COST_TERMS; i++) m->theta[i] = th[i] > 0 && isfinite(th[i]) ? th[i] : 0;
}

/* Seconds a chunk at pos costs to grow from had to had + k tokens. */
static double grow_cost(const serve_cost_model *m, uint32_t pos, uint32_t had, uint32_t k)
{
    return m->theta[2] * k + m->theta[3] * (serve_attn_kpairs(pos, had + k) - serve_attn_kpairs(pos, had));
}

/* The most tokens, at most hi, that a chunk at pos already holding had may
 * add within time_left seconds (grow_cost is increasing in k: bisect). */
static uint32_t fit(const serve_prefill_plan *p, uint32_t pos, uint32_t had, uint32_t hi, double time_left)
{
    if (isinf(time_left)) return hi;
    uint32_t lo = 0;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (grow_cost(p->cost, pos, had, mid) <= time_left) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static uint32_t min_u(uint32_t a, uint32_t b) { return a < b ? a : b; }

int serve_step_burst(const serve_prefill_plan *p, int n)
{
    return n > 0 && (double)n >= SERVE_BURST_RATIO * p->decoding;
}

uint32_t serve_step_plan_prefill(const serve_prefill_plan *p, const serve_prefill_want *pre, int n, uint32_t *give)
{
    int timed = p->target_s > 0 && p->decode.decode_tokens > 0 && !serve_step_burst(p, n) && p->cost &&
                (p->cost->theta[2] > 0 || p->cost->theta[3] > 0);
    double time_left = timed ? p->target_s - serve_cost_predict(p->cost, &p->decode) : INFINITY;
    uint32_t room = p->token_room, used = 0;
    for (int i = 0; i < n; i++) { /* a chunk each while the budgets last; the oldest always progresses */
        uint32_t want = min_u(pre[i].left, p->chunk), g = fit(p, pre[i].pos, 0, i ? min_u(want, room) : want, time_left);
        if (i == 0 && g < min_u(pre[i].left, p->min_chunk)) g = min_u(pre[i].left, p->min_chunk);
        give[i] = g, used += g, room = room > g ? room - g : 0;
        if (timed) time_left -= grow_cost(p->cost, pre[i].pos, 0, g);
    }
    for (int i = 0; i < n && room > 0; i++) { /* the rest lengthens them, oldest first */
        if (!give[i]) continue;
        uint32_t more = fit(p, pre[i].pos, give[i], min_u(pre[i].left - give[i], room), time_left);
        if (timed) time_left -= grow_cost(p->cost, pre[i].pos, give[i], more);
        give[i] += more, used += more, room -= more;
    }
    return used;
}
