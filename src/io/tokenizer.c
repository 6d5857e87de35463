/* tokenizer.c — the byte tokenizer and byte-level BPE from a tokenizer.json (include/dtrain/tokenizer.h).
 *
 * Tables: the vocabulary (token string -> id) and the merges ((left id, right id) -> rank and
 * merged id) are open-addressing hash tables built once; each id's bytes for decoding; the 256
 * byte characters' ids; a cache of the words seen (raw bytes -> ids), emptied when it grows
 * past WORD_CACHE_MAX entries. Pre-tokenization is one PCRE2 pattern (UTF, UCP, JIT-compiled),
 * run over text validated as UTF-8 once. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "dtrain/tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORD_CACHE_MAX (1u << 18)

/* GPT-2's pre-tokenization pattern. `tokenizers` (Oniguruma) counts U+0085 (NEL) as \s; S
 * names it besides \s so that the pattern does not depend on how a PCRE2 build classes it. */
#define S "[\\s\\x{85}]"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\x{85}\\p{L}\\p{N}]+|" S "+(?!"
                                   "[^\\s\\x{85}])|" S "+";
#undef S

/* ---- a string -> int table (the vocabulary, the word cache) ---- */

typedef struct strmap {
    uint32_t *slot;   /* entry index + 1, 0: empty */
    size_t cap;       /* power of two */
    size_t n;
    uint32_t *off, *len; /* entry i's key: arena[off[i]..+len[i]) */
    int64_t *val;
    size_t entries_cap;
    char *arena;
    size_t arena_len, arena_cap;
} strmap;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void strmap_free(strmap *m) {
    free(m->slot);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static int strmap_grow(strmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t h = hash_bytes(m->arena + m->off[i], m->len[i]) & (cap - 1);
        while (slot[h]) h = (h + 1) & (cap - 1);
        slot[h] = (uint32_t)i + 1;
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return 0;
}

/* The entry of key, or -1. */
static long strmap_find(const strmap *m, const char *key, size_t n) {
    if (!m->cap) return -1;
    size_t h = hash_bytes(key, n) & (m->cap - 1);
    for (uint32_t e; (e = m->slot[h]) != 0; h = (h + 1) & (m->cap - 1))
        if (m->len[e - 1] == n && memcmp(m->arena + m->off[e - 1], key, n) == 0) return (long)e - 1;
    return -1;
}

/* Adds key (not present yet) with val; returns its entry, -1 when out of memory. */
static long strmap_add(strmap *m, const char *key, size_t n, int64_t val) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
    if (m->n == m->entries_cap) {
        size_t c = m->entries_cap ? m->entries_cap * 2 : 1024;
        uint32_t *off = realloc(m->off, c * sizeof *off), *len = off ? realloc(m->len, c * sizeof *len) : NULL;
        if (off) m->off = off;
        if (len) m->len = len;
        int64_t *val2 = len ? realloc(m->val, c * sizeof *val2) : NULL;
        if (!val2) return -1;
        m->val = val2;
        m->entries_cap = c;
    }
    if (m->arena_len + n > m->arena_cap) {
        size_t c = m->arena_cap ? m->arena_cap : 1 << 16;
        while (c < m->arena_len + n) c *= 2;
        char *a = realloc(m->arena, c);
        if (!a) return -1;
        m->arena = a;
        m->arena_cap = c;
    }
    memcpy(m->arena + m->arena_len, key, n);
    const size_t i = m->n++;
    m->off[i] = (uint32_t)m->arena_len;
    m->len[i] = (uint32_t)n;
    m->val[i] = val;
    m->arena_len += n;
    size_t h = hash_bytes(key, n) & (m->cap - 1);
    while (m->slot[h]) h = (h + 1) & (m->cap - 1);
    m->slot[h] = (uint32_t)i + 1;
    return (long)i;
}

/* ---- (left, right) -> rank, merged id ---- */

typedef struct pair_entry {
    uint64_t key; /* left << 32 | right, + 1 so that 0 is empty */
    int32_t rank, id;
} pair_entry;

struct dt_tokenizer {
    int bpe; /* 0: bytes */
    char name[4096];
    int vocab_size, eot;
    /* BPE */
    strmap vocab;            /* byte-level token string -> id */
    pair_entry *pairs;
    size_t pairs_cap;        /* power of two */
    int byte_id[256];        /* the id of each byte's character, -1 when the vocabulary lacks it */
    int unk;                 /* model.unk_token's id, -1 */
    int add_prefix_space, use_regex, ignore_merges;
    char **bytes;            /* (vocab_size) each id's bytes, for decoding; NULL: no such id */
    uint32_t *bytes_len;
    struct added {
        char *text;
        size_t len;
        int id;
    } *added;
    int n_added;
    unsigned char added_first[256]; /* 1: some added token starts with this byte */
    pcre2_code *re;
    pcre2_match_data *md;
    strmap cache;            /* raw word bytes -> offset into cache_ids << 8 | count (count < 256) */
    uint32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
    uint32_t *sym;           /* a word's symbols while merging (merge_word) */
    int32_t *prev, *next;    /* their links; prev -2: merged away */
    struct merge_cand *heap; /* the queue of candidate merges */
    size_t sym_cap;
    char *scratch;           /* a segment with its prefix space */
    size_t scratch_cap;
};

static const pair_entry *pair_find(const dt_tokenizer *t, uint32_t a, uint32_t b) {
    const uint64_t key = ((uint64_t)a << 32 | b) + 1;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (t->pairs_cap - 1);
    for (; t->pairs[h].key; h = (h + 1) & (t->pairs_cap - 1))
        if (t->pairs[h].key == key) return &t->pairs[h];
    return NULL;
}

static void pair_put(dt_tokenizer *t, uint32_t a, uint32_t b, int rank, int id) {
    const uint64_t key = ((uint64_t)a << 32 | b) + 1;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (t->pairs_cap - 1);
    for (; t->pairs[h].key; h = (h + 1) & (t->pairs_cap - 1))
        if (t->pairs[h].key == key) return; /* a repeated merge: the first (lowest) rank counts */
    t->pairs[h] = (pair_entry){key, rank, id};
}

/* ---- GPT-2's byte <-> character map ---- */

/* The code point GPT-2 gives byte b: printable Latin-1 stands for itself, the other 68 bytes
 * map to 256, 257, ... in byte order. */
static unsigned byte_char(unsigned b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 256 + n;
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6); /* every byte character is below U+0800 */
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

size_t dt_tokenizer_byte_string(unsigned b, char out[3]) {
    size_t n = put_utf8(out, byte_char(b & 0xFF));
    out[n] = '\0';
    return n;
}

/* The bytes a byte-level token string stands for (each character back to its byte); -1 when
 * a character is not one of the 256. */
static long token_bytes(const char *s, size_t n, const int *char_byte, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < n) {
            cp = (unsigned)(c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1;
        }
        if (cp >= 324 || char_byte[cp] < 0) return -1;
        out[k++] = (char)char_byte[cp];
    }
    return (long)k;
}

/* ---- loading tokenizer.json ---- */

/* The pre-tokenizer: ByteLevel (alone, or alone in a Sequence). */
static dt_status load_pre_tokenizer(dt_tokenizer *t, json_t *pre) {
    json_t *seq = json_object_get(pre, "pretokenizers");
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && strcmp(type, "Sequence") == 0 && json_array_size(seq) == 1) pre = json_array_get(seq, 0);
    type = json_string_value(json_object_get(pre, "type"));
    if (!pre || !type || strcmp(type, "ByteLevel") != 0)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s is not supported (dtrain reads byte-level BPE: "
                            "pre_tokenizer ByteLevel, as GPT-2's and the tokenizers library's ByteLevelBPETokenizer)",
                            t->name, type ? type : "(none)");
    json_t *v = json_object_get(pre, "add_prefix_space");
    t->add_prefix_space = json_is_true(v);
    v = json_object_get(pre, "use_regex");
    t->use_regex = v ? json_is_true(v) : 1;
    return DT_OK;
}

/* What a tokenizer.json must and must not have besides the pre-tokenizer. */
static dt_status check_parts(dt_tokenizer *t, json_t *root, json_t *model) {
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || !type || strcmp(type, "BPE") != 0)
        return dt_error_set(DT_ERR_DATA, "%s: model.type is %s, not BPE (dtrain reads byte-level BPE tokenizers)", t->name,
                            type ? type : "missing");
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm))
        return dt_error_set(DT_ERR_DATA, "%s: normalizer %s is not supported (byte-level BPE has none)", t->name,
                            json_string_value(json_object_get(norm, "type")) ? json_string_value(json_object_get(norm, "type"))
                                                                             : "?");
    static const char *const none[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = json_string_value(json_object_get(model, none[i]));
        if (s && s[0]) return dt_error_set(DT_ERR_DATA, "%s: model.%s \"%s\" is not supported", t->name, none[i], s);
    }
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return dt_error_set(DT_ERR_DATA, "%s: model.byte_fallback is not supported (byte-level BPE needs none)", t->name);
    json_t *post = json_object_get(root, "post_processor");
    const char *pt = json_string_value(json_object_get(post, "type"));
    if (pt && strcmp(pt, "ByteLevel") != 0)
        return dt_error_set(DT_ERR_DATA, "%s: post_processor %s is not supported (it adds tokens dtrain would not)",
                            t->name, pt);
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    return load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"));
}

static dt_status load_vocab(dt_tokenizer *t, json_t *vocab) {
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return dt_error_set(DT_ERR_DATA, "%s: model.vocab is missing or empty", t->name);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= (1 << 24))
            return dt_error_set(DT_ERR_DATA, "%s: model.vocab[\"%.40s\"]: expected an id 0..16777215", t->name, key);
        if (strmap_add(&t->vocab, key, strlen(key), id) < 0) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        if (id + 1 > t->vocab_size) t->vocab_size = (int)id + 1;
    }
    return DT_OK;
}

static long vocab_id(const dt_tokenizer *t, const char *s, size_t n) {
    long e = strmap_find(&t->vocab, s, n);
    return e < 0 ? -1 : (long)t->vocab.val[e];
}

/* One merge, "a b" or ["a", "b"], into the pair table. */
static dt_status load_merge(dt_tokenizer *t, json_t *m, size_t rank) {
    const char *a, *b;
    size_t la, lb;
    char buf[1024];
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1])
            return dt_error_set(DT_ERR_DATA, "%s: model.merges[%zu] \"%.60s\": expected two tokens separated by one space",
                                t->name, rank, s);
        a = s, la = (size_t)(sp - s), b = sp + 1, lb = strlen(b);
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0)), la = strlen(a);
        b = json_string_value(json_array_get(m, 1)), lb = strlen(b);
    } else {
        return dt_error_set(DT_ERR_DATA, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", t->name, rank);
    }
    if (la + lb > sizeof buf) return dt_error_set(DT_ERR_DATA, "%s: model.merges[%zu]: tokens too long", t->name, rank);
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    long ia = vocab_id(t, a, la), ib = vocab_id(t, b, lb), iab = vocab_id(t, buf, la + lb);
    if (ia < 0 || ib < 0 || iab < 0)
        return dt_error_set(DT_ERR_DATA, "%s: model.merges[%zu] (%.*s %.*s): %s is not in model.vocab", t->name, rank,
                            (int)la, a, (int)lb, b, ia < 0 ? "the first part" : ib < 0 ? "the second part" : "the merged token");
    pair_put(t, (uint32_t)ia, (uint32_t)ib, (int)rank, (int)iab);
    return DT_OK;
}

static dt_status load_merges(dt_tokenizer *t, json_t *merges) {
    if (!json_is_array(merges))
        return dt_error_set(DT_ERR_DATA, "%s: model.merges is missing (a BPE model needs its merges list)", t->name);
    size_t n = json_array_size(merges);
    t->pairs_cap = 1024;
    while (t->pairs_cap < 2 * n + 2) t->pairs_cap *= 2;
    t->pairs = calloc(t->pairs_cap, sizeof *t->pairs);
    if (!t->pairs) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) DT_TRY(load_merge(t, json_array_get(merges, i), i));
    return DT_OK;
}

static dt_status load_added(dt_tokenizer *t, json_t *added) {
    size_t n = json_array_size(added);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    int specials = 0, special_id = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(added, i);
        const char *content = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!content || !content[0] || !json_is_integer(json_object_get(a, "id")) || id < 0 || id >= (1 << 24))
            return dt_error_set(DT_ERR_DATA, "%s: added_tokens[%zu]: expected a non-empty content and an id", t->name, i);
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++)
            if (json_is_true(json_object_get(a, flags[f])))
                return dt_error_set(DT_ERR_DATA, "%s: added_tokens[%zu] \"%.40s\": %s is not supported", t->name, i, content,
                                    flags[f]);
        struct added *d = &t->added[t->n_added++];
        d->len = strlen(content);
        d->text = strdup(content);
        d->id = (int)id;
        if (!d->text) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        t->added_first[(unsigned char)content[0]] = 1;
        if (id + 1 > t->vocab_size) t->vocab_size = (int)id + 1;
        if (strcmp(content, "<|endoftext|>") == 0) t->eot = (int)id;
        if (json_is_true(json_object_get(a, "special"))) specials++, special_id = (int)id;
    }
    if (t->eot < 0 && specials == 1) t->eot = special_id;
    return DT_OK;
}

/* Each id's bytes (decoding) and each byte's id (encoding). */
static dt_status build_tables(dt_tokenizer *t) {
    int char_byte[324];
    for (int i = 0; i < 324; i++) char_byte[i] = -1;
    for (unsigned b = 0; b < 256; b++) char_byte[byte_char(b)] = (int)b;
    for (unsigned b = 0; b < 256; b++) {
        char s[2];
        t->byte_id[b] = (int)vocab_id(t, s, put_utf8(s, byte_char(b)));
    }
    t->bytes = calloc((size_t)t->vocab_size, sizeof *t->bytes);
    t->bytes_len = calloc((size_t)t->vocab_size, sizeof *t->bytes_len);
    if (!t->bytes || !t->bytes_len) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    for (size_t e = 0; e < t->vocab.n; e++) {
        const int id = (int)t->vocab.val[e];
        char *out = malloc(t->vocab.len[e] + 1);
        if (!out) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        long k = token_bytes(t->vocab.arena + t->vocab.off[e], t->vocab.len[e], char_byte, out);
        if (k < 0) { /* not a byte-level token (e.g. a special token listed in the vocabulary): as written */
            memcpy(out, t->vocab.arena + t->vocab.off[e], t->vocab.len[e]);
            k = (long)t->vocab.len[e];
        }
        free(t->bytes[id]);
        t->bytes[id] = out;
        t->bytes_len[id] = (uint32_t)k;
    }
    for (int i = 0; i < t->n_added; i++) { /* added tokens decode to their content */
        const struct added *a = &t->added[i];
        free(t->bytes[a->id]);
        t->bytes[a->id] = strdup(a->text);
        if (!t->bytes[a->id]) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        t->bytes_len[a->id] = (uint32_t)a->len;
    }
    return DT_OK;
}

static dt_status compile_pattern(dt_tokenizer *t) {
    int err;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dt_error_set(DT_ERR_INTERNAL, "the pre-tokenization pattern does not compile at %zu: %s", (size_t)at,
                            (const char *)msg);
    }
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* the interpreter serves where JIT is not built */
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    return t->md ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
}

static dt_status load_json(dt_tokenizer *t, const char *path) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return dt_error_set(DT_ERR_DATA, "%s:%d: not a tokenizer.json: %s", path, je.line, je.text);
    json_t *model = json_object_get(root, "model");
    dt_status st = check_parts(t, root, model);
    if (st == DT_OK) st = load_vocab(t, json_object_get(model, "vocab"));
    if (st == DT_OK) st = load_merges(t, json_object_get(model, "merges"));
    if (st == DT_OK) st = load_added(t, json_object_get(root, "added_tokens"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (st == DT_OK && unk) t->unk = (int)vocab_id(t, unk, strlen(unk));
    json_decref(root);
    if (st == DT_OK) st = build_tables(t);
    if (st == DT_OK) st = compile_pattern(t);
    return st;
}

dt_status dt_tokenizer_open(const char *spec, dt_tokenizer **out) {
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    snprintf(t->name, sizeof t->name, "%s", spec);
    t->eot = t->unk = -1;
    if (strcmp(spec, "bytes") == 0) {
        t->vocab_size = 256;
        *out = t;
        return DT_OK;
    }
    t->bpe = 1;
    dt_status st = load_json(t, spec);
    if (st != DT_OK) {
        dt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

void dt_tokenizer_free(dt_tokenizer *t) {
    if (!t) return;
    strmap_free(&t->vocab);
    strmap_free(&t->cache);
    free(t->pairs);
    for (int i = 0; t->bytes && i < t->vocab_size; i++) free(t->bytes[i]);
    free(t->bytes);
    free(t->bytes_len);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].text);
    free(t->added);
    if (t->md) pcre2_match_data_free(t->md);
    if (t->re) pcre2_code_free(t->re);
    free(t->cache_ids);
    free(t->sym);
    free(t->prev);
    free(t->next);
    free(t->heap);
    free(t->scratch);
    free(t);
}

int dt_tokenizer_vocab_size(const dt_tokenizer *t) { return t->vocab_size; }
int dt_tokenizer_eot(const dt_tokenizer *t) { return t->eot; }
const char *dt_tokenizer_name(const dt_tokenizer *t) { return t->name; }

/* ---- encoding ---- */

/* Room for k more ids. */
static dt_status grow(uint32_t **ids, size_t n, size_t *cap, size_t k) {
    if (n + k <= *cap) return DT_OK;
    size_t c = *cap ? *cap : 1024;
    while (c < n + k) c *= 2;
    uint32_t *p = realloc(*ids, c * sizeof *p);
    if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory (%zu tokens)", n + k);
    *ids = p;
    *cap = c;
    return DT_OK;
}

static dt_status push(uint32_t **ids, size_t *n, size_t *cap, const uint32_t *v, size_t k) {
    if (k == 0) return DT_OK;
    DT_TRY(grow(ids, *n, cap, k));
    memcpy(*ids + *n, v, k * sizeof *v);
    *n += k;
    return DT_OK;
}

/* The offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code
 * points past U+10FFFF included), or len. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + k > len) return i;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return i;
        i += k;
    }
    return len;
}

/* A candidate merge: the pair that starts at symbol `pos`, as it was when queued. */
typedef struct merge_cand {
    int32_t rank, pos;
    uint32_t left, right;
} merge_cand;

static int cand_less(const merge_cand *a, const merge_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(merge_cand *h, size_t *n, merge_cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static merge_cand heap_pop(merge_cand *h, size_t *n) {
    merge_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Queues the pair (a, next[a]) when it has a merge. */
static void queue_pair(dt_tokenizer *t, size_t *nh, int32_t a) {
    if (a < 0) return;
    const int32_t b = t->next[a];
    if (b < 0) return;
    const pair_entry *p = pair_find(t, t->sym[a], t->sym[b]);
    if (p) heap_push(t->heap, nh, (merge_cand){p->rank, a, t->sym[a], t->sym[b]});
}

/* Merges a word's symbols (t->sym[0..n)) by rank: the lowest-ranked adjacent pair first, the
 * leftmost of equals, until no pair has a merge (as tokenizers does: a queue of candidate
 * pairs, O(n log n), so a word of megabytes does not take O(n^2)). Symbols are a linked list
 * over sym[]; a candidate whose symbols have changed since it was queued is skipped. Returns
 * the count left, compacted into sym[0..). */
static size_t merge_word(dt_tokenizer *t, size_t n) {
    if (n < 2) return n;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        t->prev[i] = (int32_t)i - 1;
        t->next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) queue_pair(t, &nh, (int32_t)i);
    while (nh) {
        const merge_cand c = heap_pop(t->heap, &nh);
        const int32_t a = c.pos, b = t->next[a];
        if (t->prev[a] == -2 || b < 0 || t->sym[a] != c.left || t->sym[b] != c.right) continue; /* stale */
        t->sym[a] = pair_find(t, c.left, c.right)->id;
        t->next[a] = t->next[b];
        if (t->next[b] >= 0) t->prev[t->next[b]] = a;
        t->prev[b] = -2; /* merged away */
        queue_pair(t, &nh, t->prev[a]);
        queue_pair(t, &nh, a);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = t->next[i]) t->sym[k++] = t->sym[i];
    return k;
}

/* One pre-tokenized word (raw bytes): its ids from the cache, or merged and cached. */
static dt_status encode_word(dt_tokenizer *t, const char *w, size_t len, uint32_t **ids, size_t *n, size_t *cap) {
    long e = strmap_find(&t->cache, w, len);
    if (e >= 0) {
        const int64_t v = t->cache.val[e];
        return push(ids, n, cap, t->cache_ids + (v >> 8), (size_t)(v & 0xFF));
    }
    if (len > t->sym_cap) { /* a word's symbols, their links and its queue (2 candidates per merge at most) */
        uint32_t *p = realloc(t->sym, len * sizeof *p);
        int32_t *pv = p ? realloc(t->prev, len * sizeof *pv) : NULL;
        if (p) t->sym = p;
        if (pv) t->prev = pv;
        int32_t *nx = pv ? realloc(t->next, len * sizeof *nx) : NULL;
        if (nx) t->next = nx;
        merge_cand *h = nx ? realloc(t->heap, 3 * len * sizeof *h) : NULL;
        if (!h) return dt_error_set(DT_ERR_NOMEM, "out of memory (a word of %zu bytes)", len);
        t->heap = h;
        t->sym_cap = len;
    }
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        int id = t->byte_id[(unsigned char)w[i]];
        if (id < 0) id = t->unk; /* a byte the vocabulary lacks: unk_token, else dropped (as tokenizers does) */
        if (id >= 0) t->sym[k++] = (uint32_t)id;
    }
    if (t->ignore_merges && len <= 512) { /* the whole word, when the vocabulary has it */
        char bl[1024];
        size_t m = 0;
        for (size_t i = 0; i < len; i++) m += put_utf8(bl + m, byte_char((unsigned char)w[i]));
        long id = vocab_id(t, bl, m);
        if (id >= 0) t->sym[0] = (uint32_t)id, k = 1;
    }
    k = merge_word(t, k);
    if (k < 256 && len <= 256) { /* cache it (a reset when full keeps the memory bounded) */
        if (t->cache.n >= WORD_CACHE_MAX) {
            strmap_free(&t->cache);
            t->cache_ids_len = 0;
        }
        if (t->cache_ids_len + k > t->cache_ids_cap) {
            size_t c = t->cache_ids_cap ? t->cache_ids_cap * 2 : 1 << 16;
            while (c < t->cache_ids_len + k) c *= 2;
            uint32_t *p = realloc(t->cache_ids, c * sizeof *p);
            if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory");
            t->cache_ids = p;
            t->cache_ids_cap = c;
        }
        memcpy(t->cache_ids + t->cache_ids_len, t->sym, k * sizeof *t->sym);
        if (strmap_add(&t->cache, w, len, (int64_t)t->cache_ids_len << 8 | (int64_t)k) < 0)
            return dt_error_set(DT_ERR_NOMEM, "out of memory");
        t->cache_ids_len += k;
    }
    return push(ids, n, cap, t->sym, k);
}

/* Text between added tokens: the prefix space, the pattern's pieces, each piece's BPE. */
static dt_status encode_segment(dt_tokenizer *t, const char *s, size_t len, uint32_t **ids, size_t *n, size_t *cap) {
    if (len == 0) return DT_OK;
    if (t->add_prefix_space && s[0] != ' ') {
        if (len + 1 > t->scratch_cap) {
            char *p = realloc(t->scratch, len + 1);
            if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory");
            t->scratch = p;
            t->scratch_cap = len + 1;
        }
        t->scratch[0] = ' ';
        memcpy(t->scratch + 1, s, len);
        s = t->scratch;
        len++;
    }
    if (!t->use_regex) return encode_word(t, s, len, ids, n, cap);
    for (size_t at = 0; at < len;) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        if (rc < 0 || ov[1] <= at) /* the pattern matches every character; should it not, the rest is one word */
            return encode_word(t, s + at, len - at, ids, n, cap);
        if (ov[0] > at) DT_TRY(encode_word(t, s + at, ov[0] - at, ids, n, cap));
        DT_TRY(encode_word(t, s + ov[0], ov[1] - ov[0], ids, n, cap));
        at = ov[1];
    }
    return DT_OK;
}

/* The added token that starts at s[0..len) (the longest), or NULL. */
static const struct added *added_at(const dt_tokenizer *t, const char *s, size_t len) {
    const struct added *best = NULL;
    for (int i = 0; i < t->n_added; i++) {
        const struct added *a = &t->added[i];
        if (a->len <= len && (!best || a->len > best->len) && memcmp(s, a->text, a->len) == 0) best = a;
    }
    return best;
}

dt_status dt_tokenizer_encode(dt_tokenizer *t, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap) {
    if (!t->bpe) { /* bytes: one id per byte */
        DT_TRY(grow(ids, *n, cap, len));
        for (size_t i = 0; i < len; i++) (*ids)[(*n)++] = (unsigned char)text[i];
        return DT_OK;
    }
    const size_t bad = utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len)
        return dt_error_set(DT_ERR_DATA, "invalid UTF-8 at byte offset %zu (byte 0x%02X): the BPE tokenizer reads UTF-8 "
                            "text", bad, (unsigned char)text[bad]);
    size_t seg = 0;
    for (size_t i = 0; i < len; i++) {
        if (!t->added_first[(unsigned char)text[i]]) continue;
        const struct added *a = added_at(t, text + i, len - i);
        if (!a) continue;
        DT_TRY(encode_segment(t, text + seg, i - seg, ids, n, cap));
        const uint32_t id = (uint32_t)a->id;
        DT_TRY(push(ids, n, cap, &id, 1));
        i += a->len - 1;
        seg = i + 1;
    }
    return encode_segment(t, text + seg, len - seg, ids, n, cap);
}

dt_status dt_tokenizer_decode(const dt_tokenizer *t, const uint32_t *ids, size_t n, char **out, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= (uint32_t)t->vocab_size || (t->bpe && !t->bytes[ids[i]]))
            return dt_error_set(DT_ERR_DATA, "token %u at index %zu is not in %s's vocabulary (%d ids)", ids[i], i, t->name,
                                t->vocab_size);
        total += t->bpe ? t->bytes_len[ids[i]] : 1;
    }
    char *p = malloc(total + 1);
    if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t->bpe) {
            p[k++] = (char)ids[i];
            continue;
        }
        memcpy(p + k, t->bytes[ids[i]], t->bytes_len[ids[i]]);
        k += t->bytes_len[ids[i]];
    }
    p[k] = '\0';
    *out = p;
    *len = k;
    return DT_OK;
}
