/*
 * simd_exp.h - vf_exp, written once over the vector vocabulary and included
 * at the end of each simd_<level>.h.
 *
 * expf, Cephes style: n = round(x / ln2), r = x - n ln2 (two-part ln2),
 * degree-6 polynomial, p * 2^n. ~2 ulp on [-87.3, 88.3]; x < -87.3 (and -inf)
 * gives exactly 0, which the online softmax relies on (padded chunks, the
 * first rescale of a running max of -inf).
 */
static inline vf vf_exp(vf x)
{
    const vf lo = vf_set1(-87.3f);
    vf xc = vf_min(vf_max(x, lo), vf_set1(88.3762626647949f));
    vf n = vf_round(vf_mul(xc, vf_set1(1.44269504088896341f)));
    vf r = vf_fnma(n, vf_set1(0.693359375f), xc);
    r = vf_fnma(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500E-4f);
    p = vf_fma(p, r, vf_set1(1.3981999507E-3f));
    p = vf_fma(p, r, vf_set1(8.3334519073E-3f));
    p = vf_fma(p, r, vf_set1(4.1665795894E-2f));
    p = vf_fma(p, r, vf_set1(1.6666665459E-1f));
    p = vf_fma(p, r, vf_set1(5.0000001201E-1f));
    p = vf_fma(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vf_keep_ge(x, lo, vf_ldexp(p, n));
}
