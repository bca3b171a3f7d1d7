/*
 * grammar.c - constrained output (kipp.h "constrained output"): the API, not
 * yet the automaton. Every spec is refused, so no caller can believe its
 * output is constrained when it is not.
 */
#include "engine/internal.h"

int kipp_grammar_create(kipp_model *model, const kipp_grammar_spec *spec, kipp_grammar **out, char *err,
                        size_t errlen)
{
    (void)model;
    (void)spec;
    if (out) *out = NULL;
    return kipp_err(err, errlen, KIPP_ENOTSUP, "constrained output (JSON schema grammars) is not built yet");
}

void kipp_grammar_destroy(kipp_grammar *g) { (void)g; }
