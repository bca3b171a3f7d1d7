/*
 * grammar_schema.c - compile the JSON Schema subset of constrained output
 * into grammar nodes (grammar_impl.h). Keywords outside the subset are
 * refused with their path, never ignored: a schema we cannot enforce must not
 * look enforced. enum/const values become literal tries of their compact
 * JSON text; anyOf and type arrays become alternatives; local $ref is
 * resolved once per target (a cycle reuses the target's node).
 *
 * A schema compiled here can always be completed: containers nest at most
 * KG_MAX_NEST deep, every $ref has a finite instance, and no $ref cycle is
 * an alternative of itself; each node's need (grammar_impl.h) lets the
 * automaton start a value only where its shortest completion fits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/grammar_impl.h"

#define KG_MAX_NODES 65000u
#define KG_SCHEMA_DEPTH 64
#define KG_MAX_REFS 256

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "$defs", "definitions", "deprecated", "readOnly",
                                          "writeOnly", NULL};
static const char *const keywords[] = {"type", "properties", "required", "additionalProperties", "items",
                                       "minItems", "maxItems", "enum", "const", "maxLength", "minLength",
                                       "anyOf", "$ref", NULL};

#define SUPPORTED "type, properties, required, additionalProperties (true/false), items, minItems, maxItems, " \
                  "enum, const, minLength, maxLength, anyOf, local $ref"

typedef struct {
    kipp_grammar *g;
    json_t *root;
    char *err;
    size_t errlen;
    char *ref_name[KG_MAX_REFS];
    uint32_t ref_node[KG_MAX_REFS];
    size_t n_refs;
    int nest; /* objects and arrays around the schema being compiled */
} kg_cc;

static int in_list(const char *k, const char *const *list)
{
    for (size_t i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return 0;
    uint32_t nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return KIPP_ENOMEM;
    *p = q, *cap = nc;
    return 0;
}

int kg_add_node(kipp_grammar *g, kg_node n, uint32_t *id)
{
    if (g->n_nodes >= KG_MAX_NODES || grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof n))
        return KIPP_ENOMEM;
    g->nodes[g->n_nodes] = n;
    *id = g->n_nodes++;
    return 0;
}

/* Lay out the literal trie of strings idx[0..n) (sorted) from byte depth at lit node at. */
static int lit_lay(kipp_grammar *g, const char *const *s, const size_t *len, const uint32_t *idx, size_t n,
                   size_t depth, uint32_t at)
{
    size_t i = 0, nk = 0;
    while (i < n && len[idx[i]] == depth) g->lits[at].terminal = 1, i++;
    for (size_t j = i; j < n; nk++) {
        uint8_t b = (uint8_t)s[idx[j]][depth];
        while (j < n && (uint8_t)s[idx[j]][depth] == b) j++;
    }
    if (grow((void **)&g->lits, &g->cap_lits, g->n_lits + (uint32_t)nk, sizeof *g->lits)) return KIPP_ENOMEM;
    uint32_t first = g->n_lits;
    g->lits[at].first_kid = first, g->lits[at].n_kids = (uint16_t)nk;
    g->n_lits += (uint32_t)nk;
    for (size_t k = 0; i < n; k++) {
        size_t j = i;
        uint8_t b = (uint8_t)s[idx[j]][depth];
        while (j < n && (uint8_t)s[idx[j]][depth] == b) j++;
        g->lits[first + k] = (kg_lit_node){.byte = b};
        int rc = lit_lay(g, s, len, idx + i, j - i, depth + 1, first + (uint32_t)k);
        if (rc) return rc;
        i = j;
    }
    return 0;
}

int kg_add_lit(kipp_grammar *g, const char *const *s, const size_t *len, size_t n, int framing, uint32_t *id)
{
    uint32_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx || n > 65535 || grow((void **)&g->lits, &g->cap_lits, g->n_lits + 1, sizeof *g->lits)) {
        free(idx);
        return KIPP_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) { /* insertion sort by bytes: enums are short */
        size_t j = i;
        while (j > 0) {
            size_t a = idx[j - 1], m = len[a] < len[i] ? len[a] : len[i];
            int c = memcmp(s[a], s[i], m);
            if (c < 0 || (c == 0 && len[a] <= len[i])) break;
            idx[j] = idx[j - 1], j--;
        }
        idx[j] = (uint32_t)i;
    }
    uint32_t at = g->n_lits++;
    g->lits[at] = (kg_lit_node){0};
    int rc = lit_lay(g, s, len, idx, n, 0, at);
    free(idx);
    return rc ? rc : kg_add_node(g, (kg_node){.kind = KN_LIT, .framing = (uint8_t)framing, .first = at}, id);
}

/* A literal node of the compact JSON text of each value of vals[n]. */
static int lit_json(kg_cc *c, json_t *const *vals, size_t n, uint32_t *id)
{
    char **s = calloc(n ? n : 1, sizeof *s);
    size_t *len = calloc(n ? n : 1, sizeof *len);
    int rc = s && len ? 0 : KIPP_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        s[i] = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s[i]) rc = KIPP_ENOMEM;
        else len[i] = strlen(s[i]);
    }
    if (!rc) rc = kg_add_lit(c->g, (const char *const *)s, len, n, 0, id);
    for (size_t i = 0; s && i < n; i++) free(s[i]);
    free(s), free(len);
    return rc ? kipp_err(c->err, c->errlen, KIPP_ENOMEM, "out of memory compiling the schema") : 0;
}

static int compile(kg_cc *c, json_t *s, const char *path, int depth, uint32_t *out);

/* A refusal: "schema at PATH: WHAT". The reason is kept whole; a path too long for the buffer loses its middle. */
static int bad(kg_cc *c, const char *path, const char *what)
{
    size_t n = strlen(path), w = strlen(what), room = c->errlen > w + 16 ? c->errlen - w - 16 : 0;
    if (n <= room) return kipp_err(c->err, c->errlen, KIPP_EINVAL, "schema at %s: %s", path, what);
    size_t head = room / 3, tail = room - head;
    return kipp_err(c->err, c->errlen, KIPP_EINVAL, "schema at %.*s...%s: %s", (int)head, path, path + n - tail, what);
}

/* Entering an object or array: refused past KG_MAX_NEST, naming the limit. */
static int nest_in(kg_cc *c, const char *path)
{
    if (c->nest >= KG_MAX_NEST) {
        char m[160];
        snprintf(m, sizeof m, "objects and arrays nest more than %d deep here, past the limit of constrained output "
                 "(%d levels); expected a shallower schema", KG_MAX_NEST, KG_MAX_NEST);
        return bad(c, path, m);
    }
    c->nest++;
    return 0;
}

static int get_count(kg_cc *c, json_t *s, const char *key, const char *path, uint32_t def, uint32_t *v)
{
    json_t *x = json_object_get(s, key);
    *v = def;
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1000000) {
        char m[128];
        snprintf(m, sizeof m, "\"%s\" must be an integer 0..1000000", key);
        return bad(c, path, m);
    }
    *v = (uint32_t)json_integer_value(x);
    return 0;
}

static int alts_node(kg_cc *c, const uint32_t *alt, size_t n, uint32_t *out)
{
    kipp_grammar *g = c->g;
    if (n == 1) return *out = alt[0], 0;
    if (grow((void **)&g->alts, &g->cap_alts, g->n_alts + (uint32_t)n, sizeof *g->alts)) return KIPP_ENOMEM;
    memcpy(g->alts + g->n_alts, alt, n * sizeof *alt);
    kg_node nd = {.kind = KN_ANYOF, .first = g->n_alts, .n = (uint32_t)n};
    g->n_alts += (uint32_t)n;
    return kg_add_node(g, nd, out);
}

static int compile_object(kg_cc *c, json_t *s, const char *path, int depth, uint32_t *out)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    char p[600];
    if (props && !json_is_object(props)) return bad(c, path, "\"properties\" must be an object");
    if (req && !json_is_array(req)) return bad(c, path, "\"required\" must be an array of property names");
    if (addl && !json_is_boolean(addl))
        return bad(c, path, "\"additionalProperties\" as a schema is not supported, only true or false");
    size_t i, n = props ? json_object_size(props) : 0;
    json_t *x;
    json_array_foreach(req, i, x) {
        if (!json_is_string(x) || !json_object_get(props, json_string_value(x))) {
            snprintf(p, sizeof p, "required property %s is not declared in \"properties\"",
                     json_is_string(x) ? json_string_value(x) : "(not a string)");
            return bad(c, path, p);
        }
    }
    if (n == 0 && !json_is_false(addl)) return *out = c->g->n_obj_any, 0;
    kg_prop *tmp = calloc(n ? n : 1, sizeof *tmp);
    if (!tmp) return KIPP_ENOMEM;
    const char *key;
    size_t k = 0;
    int rc = 0;
    json_object_foreach(props, key, x) {
        snprintf(p, sizeof p, "%s/properties/%s", path, key);
        json_t *ks = json_string(key);
        rc = ks ? lit_json(c, &ks, 1, &tmp[k].key) : KIPP_ENOMEM;
        json_decref(ks);
        if (!rc) rc = compile(c, x, p, depth + 1, &tmp[k].value);
        json_t *r;
        json_array_foreach(req, i, r) tmp[k].required |= !strcmp(json_string_value(r), key);
        if (rc) break;
        k++;
    }
    kipp_grammar *g = c->g;
    if (!rc && grow((void **)&g->props, &g->cap_props, g->n_props + (uint32_t)n, sizeof *g->props)) rc = KIPP_ENOMEM;
    if (!rc) {
        if (n) memcpy(g->props + g->n_props, tmp, n * sizeof *tmp);
        rc = kg_add_node(g, (kg_node){.kind = KN_OBJ, .first = g->n_props, .n = (uint32_t)n}, out);
        g->n_props += (uint32_t)n;
    }
    free(tmp);
    return rc;
}

static int compile_array(kg_cc *c, json_t *s, const char *path, int depth, uint32_t *out)
{
    json_t *items = json_object_get(s, "items");
    char p[600];
    uint32_t mn, mx, child = c->g->n_any;
    int rc = get_count(c, s, "minItems", path, 0, &mn);
    if (!rc) rc = get_count(c, s, "maxItems", path, KG_UNBOUNDED, &mx);
    if (rc) return rc;
    if (mn > mx) return bad(c, path, "\"minItems\" is above \"maxItems\"");
    if (items && !json_is_object(items) && !json_is_true(items))
        return bad(c, path, "\"items\" must be one schema (tuple forms are not supported)");
    snprintf(p, sizeof p, "%s/items", path);
    if (items && (rc = compile(c, items, p, depth + 1, &child))) return rc;
    return kg_add_node(c->g, (kg_node){.kind = KN_ARR, .min = mn, .max = mx, .child = child}, out);
}

static int compile_type(kg_cc *c, json_t *s, const char *type, const char *path, int depth, uint32_t *out)
{
    kipp_grammar *g = c->g;
    uint32_t mn, mx;
    int rc;
    if (!strcmp(type, "object") || !strcmp(type, "array")) {
        if ((rc = nest_in(c, path))) return rc;
        rc = type[0] == 'o' ? compile_object(c, s, path, depth, out) : compile_array(c, s, path, depth, out);
        c->nest--;
        return rc;
    }
    if (!strcmp(type, "string")) {
        if ((rc = get_count(c, s, "minLength", path, 0, &mn)) || (rc = get_count(c, s, "maxLength", path, KG_UNBOUNDED, &mx)))
            return rc;
        if (mn > mx) return bad(c, path, "\"minLength\" is above \"maxLength\"");
        if (mn == 0 && mx == KG_UNBOUNDED) return *out = g->n_str_any, 0;
        return kg_add_node(g, (kg_node){.kind = KN_STR, .min = mn, .max = mx}, out);
    }
    if (!strcmp(type, "number")) return *out = g->n_num_any, 0;
    if (!strcmp(type, "integer")) return kg_add_node(g, (kg_node){.kind = KN_INT}, out);
    json_t *v[2] = {json_true(), json_false()};
    if (!strcmp(type, "boolean")) return lit_json(c, v, 2, out);
    v[0] = json_null();
    if (!strcmp(type, "null")) return lit_json(c, v, 1, out);
    char m[200];
    snprintf(m, sizeof m, "type \"%.60s\" is not a JSON Schema type", type);
    return bad(c, path, m);
}

static int compile_ref(kg_cc *c, const char *ref, const char *path, int depth, uint32_t *out)
{
    for (size_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->ref_name[i], ref)) return *out = c->ref_node[i], 0;
    if (strncmp(ref, "#", 1) || (ref[1] && ref[1] != '/') || c->n_refs == KG_MAX_REFS)
        return bad(c, path, "only local \"$ref\" (\"#/$defs/...\", \"#/definitions/...\") is supported");
    json_t *t = c->root;
    char tok[256];
    for (const char *p = ref + 1; *p == '/' && t;) {
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof tok; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) tok[n++] = p[1] == '0' ? '~' : '/', p++;
            else tok[n++] = *p;
        }
        tok[n] = 0;
        t = json_is_object(t) ? json_object_get(t, tok) : NULL;
    }
    if (!t) return bad(c, path, "\"$ref\" names no schema in this document");
    /* A one-alternative indirection, made before the target compiles, closes cycles. */
    uint32_t ind, target;
    kipp_grammar *g = c->g;
    int rc = grow((void **)&g->alts, &g->cap_alts, g->n_alts + 1, sizeof *g->alts);
    if (!rc) rc = kg_add_node(g, (kg_node){.kind = KN_ANYOF, .first = g->n_alts, .n = 1}, &ind);
    if (rc) return rc;
    g->alts[g->n_alts++] = g->n_any;
    uint32_t slot = g->n_alts - 1;
    if (!(c->ref_name[c->n_refs] = strdup(ref))) return KIPP_ENOMEM;
    c->ref_node[c->n_refs++] = ind;
    if ((rc = compile(c, t, ref, depth + 1, &target))) return rc;
    g->alts[slot] = target;
    return *out = ind, 0;
}

/* The keywords of s: refuse unknown ones; *only_anno: nothing but annotations. */
static int check_keys(kg_cc *c, json_t *s, const char *path, const char *alone)
{
    const char *k;
    json_t *v;
    char m[300];
    json_object_foreach(s, k, v) {
        if (in_list(k, annotations)) continue;
        if (!in_list(k, keywords)) {
            snprintf(m, sizeof m, "keyword \"%.60s\" is not supported (supported: " SUPPORTED ")", k);
            return bad(c, path, m);
        }
        if (alone && strcmp(k, alone)) {
            snprintf(m, sizeof m, "\"%s\" beside \"%.60s\" is not supported", alone, k);
            return bad(c, path, m);
        }
    }
    return 0;
}

static int compile(kg_cc *c, json_t *s, const char *path, int depth, uint32_t *out)
{
    if (depth > KG_SCHEMA_DEPTH) return bad(c, path, "the schema nests too deeply (at most 64 levels)");
    if (json_is_true(s)) return *out = c->g->n_any, 0;
    if (!json_is_object(s)) return bad(c, path, "a schema must be an object or true");
    json_t *ref = json_object_get(s, "$ref"), *any = json_object_get(s, "anyOf"), *type = json_object_get(s, "type");
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    int rc = check_keys(c, s, path, ref ? "$ref" : any ? "anyOf" : NULL);
    if (rc) return rc;
    if (ref) return json_is_string(ref) ? compile_ref(c, json_string_value(ref), path, depth, out)
                                        : bad(c, path, "\"$ref\" must be a string");
    char p[600];
    size_t i, n;
    json_t *x;
    uint32_t alt[64];
    if (any) {
        if (!json_is_array(any) || !(n = json_array_size(any)) || n > 64)
            return bad(c, path, "\"anyOf\" must be an array of 1..64 schemas");
        json_array_foreach(any, i, x) {
            snprintf(p, sizeof p, "%s/anyOf/%zu", path, i);
            if ((rc = compile(c, x, p, depth + 1, &alt[i]))) return rc;
        }
        return alts_node(c, alt, n, out);
    }
    if (cn) return lit_json(c, &cn, 1, out);
    if (en) {
        if (!json_is_array(en) || !json_array_size(en)) return bad(c, path, "\"enum\" must be a non-empty array");
        json_t **v = malloc(json_array_size(en) * sizeof *v);
        if (!v) return KIPP_ENOMEM;
        json_array_foreach(en, i, x) v[i] = x;
        rc = lit_json(c, v, json_array_size(en), out);
        free(v);
        return rc;
    }
    if (json_is_string(type)) return compile_type(c, s, json_string_value(type), path, depth, out);
    if (json_is_array(type) && (n = json_array_size(type)) > 0 && n <= 7) {
        json_array_foreach(type, i, x) {
            if (!json_is_string(x)) return bad(c, path, "\"type\" must be a string or an array of strings");
            if ((rc = compile_type(c, s, json_string_value(x), path, depth, &alt[i]))) return rc;
        }
        return alts_node(c, alt, n, out);
    }
    if (type) return bad(c, path, "\"type\" must be a string or an array of 1..7 strings");
    if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties"))
        return compile_type(c, s, "object", path, depth, out);
    if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
        return compile_type(c, s, "array", path, depth, out);
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        return compile_type(c, s, "string", path, depth, out);
    return *out = c->g->n_any, 0;
}

/* ---- needs: what the shortest completion of each node takes ---- */

static uint32_t add_need(uint32_t a, uint32_t b)
{
    return a >= KG_NEED_INF || b >= KG_NEED_INF ? KG_NEED_INF : a + b < KG_NEED_INF ? a + b : KG_NEED_INF - 1;
}

static uint32_t node_need(const kipp_grammar *g, const kg_node *nd)
{
    uint32_t n = KG_NEED_INF, inner = 0;
    switch (nd->kind) {
    case KN_ANYOF:
        for (uint32_t i = 0; i < nd->n; i++)
            if (g->nodes[g->alts[nd->first + i]].need < n) n = g->nodes[g->alts[nd->first + i]].need;
        return n;
    case KN_ARR: return nd->min == 0 ? 1 : add_need(1, g->nodes[nd->child].need);
    case KN_OBJ: /* '{', then each required key (a literal: 1) and value in turn */
        for (uint32_t i = 0; i < nd->n; i++) {
            const kg_prop *p = &g->props[nd->first + i];
            if (p->required && g->nodes[p->value].need > inner) inner = g->nodes[p->value].need;
        }
        return add_need(1, inner);
    default: return 1; /* scalars, literals, free-form values ("{}" and "[]" complete) */
    }
}

void kg_set_needs(kipp_grammar *g)
{
    for (uint32_t i = 0; i < g->n_nodes; i++) g->nodes[i].need = KG_NEED_INF;
    for (int changed = 1; changed;) { /* needs only fall from "none finite": the fixpoint is the least one */
        changed = 0;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
            uint32_t n = node_need(g, &g->nodes[i]);
            if (n != g->nodes[i].need) g->nodes[i].need = (uint8_t)n, changed = 1;
        }
    }
}

/* 1 when alternative node at reaches target through alternatives only (a $ref cycle that nests no value). */
static int alt_reaches(const kipp_grammar *g, uint32_t at, uint32_t target, uint8_t *seen)
{
    const kg_node *nd = &g->nodes[at];
    if (nd->kind != KN_ANYOF || seen[at]) return 0;
    seen[at] = 1;
    for (uint32_t i = 0; i < nd->n; i++) {
        uint32_t a = g->alts[nd->first + i];
        if (a == target || alt_reaches(g, a, target, seen)) return 1;
    }
    return 0;
}

/* Every $ref has a finite instance and is no alternative of itself; the document's shortest completion fits. */
static int check_complete(kg_cc *c, uint32_t doc)
{
    kipp_grammar *g = c->g;
    char m[400];
    kg_set_needs(g);
    uint8_t *seen = malloc(g->n_nodes);
    if (!seen) return KIPP_ENOMEM;
    int rc = 0;
    for (size_t i = 0; !rc && i < c->n_refs; i++) {
        memset(seen, 0, g->n_nodes);
        if (alt_reaches(g, c->ref_node[i], c->ref_node[i], seen))
            rc = bad(c, c->ref_name[i], "this $ref refers to itself through $ref and anyOf alone, with no value in "
                     "between; expected each cycle to pass through an object property or array item");
        else if (g->nodes[c->ref_node[i]].need == KG_NEED_INF)
            rc = bad(c, c->ref_name[i], "no finite document matches this $ref: each of its branches requires "
                     "another level of it (a $ref cycle through required properties or minItems, with no exit); "
                     "expected an optional property, an array that may be empty or a non-recursive anyOf branch");
    }
    free(seen);
    if (!rc && add_need(1, g->nodes[doc].need) > KG_MAX_DEPTH) {
        snprintf(m, sizeof m, "the shortest document nests objects and arrays %u deep (through required properties, "
                 "minItems and $ref), past the limit of constrained output (%d levels); expected a shallower schema",
                 g->nodes[doc].need - 1u, KG_MAX_NEST);
        rc = bad(c, "#", m);
    }
    return rc;
}

int kg_compile_schema(kipp_grammar *g, const char *schema, uint32_t *doc, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(schema, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kipp_err(err, errlen, KIPP_EINVAL, "the schema is not valid JSON: %s (line %d)", je.text, je.line);
    kg_cc c = {.g = g, .root = root, .err = err, .errlen = errlen};
    int rc = compile(&c, root, "#", 0, doc);
    if (!rc) rc = check_complete(&c, *doc);
    if (rc == KIPP_ENOMEM) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory compiling the schema");
    for (size_t i = 0; i < c.n_refs; i++) free(c.ref_name[i]);
    json_decref(root);
    return rc;
}
