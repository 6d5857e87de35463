/* tokenizer.c — the byte tokenizer and byte-level BPE from a tokenizer.json (include/dtrain/tokenizer.h).
 *
 * Tables: the vocabulary (token string -> id) and the merges ((left id, right id) -> rank and
 * merged id) are open-addressing hash tables built once; each id's bytes for decoding; the 256
 * byte characters' ids; a cache of the words seen (raw bytes -> ids), emptied when it grows
 * past WORD_CACHE_MAX entries.
 *
 * Encoding is tokenizers' pipeline over slices of the text, validated as UTF-8 once, copying only
 * what a normalizer changes and a piece given a prefix space:
 *   split_added (pass 0: added tokens with normalized false, on the raw text)
 *   -> normalize (utf8proc, each piece between them, in chunks cut before ASCII bytes)
 *   -> split_added (pass 1: added tokens with normalized true)
 *   -> pre_tokenize (a pre_step per Split, Digits and ByteLevel: one PCRE2 pattern each, UTF, UCP,
 *      JIT-compiled; a step hands each piece to the next as soon as its behaviour completes it)
 *   -> encode_word (BPE by rank, cached).
 * tokenizers' patterns are Oniguruma's; translate_pattern gives PCRE2 the same meaning or refuses.
 * Where the libraries' Unicode versions differ from those tokenizers 0.23 carries, data tables put
 * them level: IN_UNICODE_9 (its normalizers' tables), LETTERS_SINCE_14 and NUMBERS_SINCE_14 (its
 * Oniguruma's \p{L} and \p{N}, past PCRE2 10.42's), DIGITS_SINCE_16 (Rust's char::is_numeric). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "dtrain/tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "dtrain/data.h" /* DT_CLS_TOKEN: the byte tokenizer's <cls>, after a classification text */
#include "dtrain/file.h"

#define WORD_CACHE_MAX (1u << 18)
#define MAX_STEPS 8            /* pre-tokenizer steps */
#define MAX_NORMS 4            /* normalizers in a Sequence */
#define NORM_CHUNK (1u << 16)  /* text is normalized in chunks of about this many bytes */

/* Unicode White_Space: Oniguruma's \s (tokenizers' patterns) and Rust regex's (added tokens'
 * lstrip and rstrip). PCRE2's \s also holds U+180E, so patterns are given this class instead. */
#define WS_CLASS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static int is_white_space(unsigned cp) {
    return (cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* The code point at s[i] (valid UTF-8) and its length. */
static unsigned utf8_at(const char *s, size_t i, size_t *len) {
    const unsigned char *p = (const unsigned char *)s + i;
    if (p[0] < 0x80) return *len = 1, p[0];
    if (p[0] < 0xE0) return *len = 2, (p[0] & 0x1Fu) << 6 | (p[1] & 0x3Fu);
    if (p[0] < 0xF0) return *len = 3, (p[0] & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
    return *len = 4, (p[0] & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
}

/* GPT-2's pre-tokenization pattern as tokenizers writes it (ByteLevel's use_regex). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust regex's \w, which decides an added token's single_word. */
static const char WORD_CLASS[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";

/* The letters and numbers Unicode assigned after 14.0 (PCRE2 10.42's tables) up to 16.0 (those of
 * the Oniguruma in tokenizers 0.23), found by matching every code point with both: a step's re_new
 * adds them to \p{L} and \p{N} so that a newer script splits as tokenizers splits it (a PCRE2 that
 * knows them matches the same). DIGITS_SINCE_16: what Rust's char::is_numeric (Digits) adds, 17.0's. */
static const uint32_t LETTERS_SINCE_14[][2] = {
    {0x1C89, 0x1C8A}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC}, {0x105C0, 0x105F3}, {0x10D4A, 0x10D65}, {0x10D6F, 0x10D85},
    {0x10EC2, 0x10EC4}, {0x1123F, 0x11240}, {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E},
    {0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3}, {0x11BC0, 0x11BE0},
    {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F}, {0x13441, 0x13446},
    {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C}, {0x18CFF, 0x18CFF}, {0x1B132, 0x1B132},
    {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4EB}, {0x1E5D0, 0x1E5ED},
    {0x1E5F0, 0x1E5F0}, {0x2B739, 0x2B739}, {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF},
};
static const uint32_t NUMBERS_SINCE_14[][2] = {
    {0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x11F50, 0x11F59}, {0x16130, 0x16139},
    {0x16D70, 0x16D79}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA},
};
#define N_LETTERS_SINCE_14 (sizeof LETTERS_SINCE_14 / sizeof *LETTERS_SINCE_14)
#define N_NUMBERS_SINCE_14 (sizeof NUMBERS_SINCE_14 / sizeof *NUMBERS_SINCE_14)
#define DIGITS_SINCE_16 "\\x{11DE0}-\\x{11DE9}\\x{16FF4}-\\x{16FF6}"

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
    if (!m->arena || m->arena_len + n > m->arena_cap) { /* an empty first key needs the arena too */
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

/* How a pre-tokenizer step turns its pattern's matches and the text between them into pieces
 * (tokenizers' SplitDelimiterBehavior, in its order). */
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
static const char *const BEHAVIORS[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};

typedef struct pre_step {
    pcre2_code *re;          /* NULL: the piece passes whole (ByteLevel without its regex) */
    pcre2_code *re_new;      /* with Unicode 15 and 16's letters and numbers; NULL: re has no \p{L}, \p{N} */
    pcre2_match_data *md;
    int behavior, invert;
    int prefix_space;        /* ByteLevel's add_prefix_space: " " before a piece that lacks it */
} pre_step;

struct added {
    char *text;              /* what is matched and decoded: the content, normalized when normalized is true */
    size_t len;
    int id;
    int normalized, single_word, lstrip, rstrip;
};

struct dt_tokenizer {
    int bpe; /* 0: bytes */
    char name[4096];
    int vocab_size, eot;
    /* BPE */
    strmap vocab;            /* byte-level token string -> id */
    size_t max_key_len;      /* the longest token string's bytes */
    pair_entry *pairs;
    size_t pairs_cap;        /* power of two */
    int byte_id[256];        /* the id of each byte's character, -1 when the vocabulary lacks it */
    int unk;                 /* model.unk_token's id, -1 */
    int ignore_merges;
    char **bytes;            /* (vocab_size) each id's bytes, for decoding; NULL: no such id */
    uint32_t *bytes_len;
    struct added *added;
    int n_added, n_pass[2];  /* added tokens; of them, with normalized false (pass 0) and true (pass 1) */
    unsigned char added_first[2][256]; /* 1: some added token of the pass starts with this byte */
    pcre2_code *word_re;     /* WORD_CLASS, anchored (when a token is single_word) */
    pcre2_match_data *word_md;
    utf8proc_option_t norms[MAX_NORMS]; /* the normalizers, in order */
    int n_norms;
    unsigned char norm_below; /* text whose bytes are all below this is in every one's normal form */
    char *norm;              /* normalized text */
    size_t norm_len, norm_cap;
    uint32_t *held;          /* code points Unicode 9.0 lacks, standing aside while utf8proc runs (hold_new) */
    size_t n_held, held_cap;
    char *guarded;           /* the text with U+FFFF for them */
    size_t guarded_len, guarded_cap;
    pre_step steps[MAX_STEPS];
    int n_steps;
    int has_new;             /* some step has a re_new */
    int use_new;             /* the text being encoded holds a letter or number since 14.0: steps use re_new */
    pcre2_compile_context *cctx; /* newline LF, as Oniguruma's . reads it */
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    strmap cache;            /* raw word bytes -> offset into cache_ids << 8 | count (count < 256) */
    uint32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
    uint32_t *sym;           /* a word's symbols while merging (merge_word) */
    int32_t *prev, *next;    /* their links; prev -2: merged away */
    struct merge_cand *heap; /* the queue of candidate merges */
    size_t sym_cap;
    char *scratch;           /* a piece with its prefix space */
    size_t scratch_cap;
    char *word_chars;        /* a word in byte characters (ignore_merges): 2 * max_key_len */
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

/* ---- normalizers (utf8proc) ---- */

static dt_status norm_append(dt_tokenizer *t, const char *s, size_t len) {
    if (len == 0) return DT_OK;
    if (t->norm_len + len > t->norm_cap) {
        size_t c = t->norm_cap ? t->norm_cap : 1 << 16;
        while (c < t->norm_len + len) c *= 2;
        char *p = realloc(t->norm, c);
        if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory (normalizing %zu bytes)", t->norm_len + len);
        t->norm = p;
        t->norm_cap = c;
    }
    memcpy(t->norm + t->norm_len, s, len);
    t->norm_len += len;
    return DT_OK;
}

/* The code points Unicode 9.0 had assigned, an inversion list (from each even entry to the next
 * entry, exclusive): perl -MUnicode::UCD=prop_invlist -e 'print join(",", prop_invlist("In=9.0"))'.
 * tokenizers' normalizers (unicode-normalization-alignments) carry Unicode 9.0's tables, utf8proc a
 * later version's. On the code points 9.0 had the two agree (Unicode keeps decompositions and
 * combining classes stable); a code point assigned since is to tokenizers one with no decomposition,
 * combining class 0, composing with nothing: as U+FFFF is to utf8proc, which stands in for it. */
static const uint32_t IN_UNICODE_9[] = {
    0x0, 0x378, 0x37A, 0x380, 0x384, 0x38B, 0x38C, 0x38D, 0x38E, 0x3A2, 0x3A3, 0x530, 0x531, 0x557, 0x559, 0x560,
    0x561, 0x588, 0x589, 0x58B, 0x58D, 0x590, 0x591, 0x5C8, 0x5D0, 0x5EB, 0x5F0, 0x5F5, 0x600, 0x61D, 0x61E, 0x70E,
    0x70F, 0x74B, 0x74D, 0x7B2, 0x7C0, 0x7FB, 0x800, 0x82E, 0x830, 0x83F, 0x840, 0x85C, 0x85E, 0x85F, 0x8A0, 0x8B5,
    0x8B6, 0x8BE, 0x8D4, 0x984, 0x985, 0x98D, 0x98F, 0x991, 0x993, 0x9A9, 0x9AA, 0x9B1, 0x9B2, 0x9B3, 0x9B6, 0x9BA,
    0x9BC, 0x9C5, 0x9C7, 0x9C9, 0x9CB, 0x9CF, 0x9D7, 0x9D8, 0x9DC, 0x9DE, 0x9DF, 0x9E4, 0x9E6, 0x9FC, 0xA01, 0xA04,
    0xA05, 0xA0B, 0xA0F, 0xA11, 0xA13, 0xA29, 0xA2A, 0xA31, 0xA32, 0xA34, 0xA35, 0xA37, 0xA38, 0xA3A, 0xA3C, 0xA3D,
    0xA3E, 0xA43, 0xA47, 0xA49, 0xA4B, 0xA4E, 0xA51, 0xA52, 0xA59, 0xA5D, 0xA5E, 0xA5F, 0xA66, 0xA76, 0xA81, 0xA84,
    0xA85, 0xA8E, 0xA8F, 0xA92, 0xA93, 0xAA9, 0xAAA, 0xAB1, 0xAB2, 0xAB4, 0xAB5, 0xABA, 0xABC, 0xAC6, 0xAC7, 0xACA,
    0xACB, 0xACE, 0xAD0, 0xAD1, 0xAE0, 0xAE4, 0xAE6, 0xAF2, 0xAF9, 0xAFA, 0xB01, 0xB04, 0xB05, 0xB0D, 0xB0F, 0xB11,
    0xB13, 0xB29, 0xB2A, 0xB31, 0xB32, 0xB34, 0xB35, 0xB3A, 0xB3C, 0xB45, 0xB47, 0xB49, 0xB4B, 0xB4E, 0xB56, 0xB58,
    0xB5C, 0xB5E, 0xB5F, 0xB64, 0xB66, 0xB78, 0xB82, 0xB84, 0xB85, 0xB8B, 0xB8E, 0xB91, 0xB92, 0xB96, 0xB99, 0xB9B,
    0xB9C, 0xB9D, 0xB9E, 0xBA0, 0xBA3, 0xBA5, 0xBA8, 0xBAB, 0xBAE, 0xBBA, 0xBBE, 0xBC3, 0xBC6, 0xBC9, 0xBCA, 0xBCE,
    0xBD0, 0xBD1, 0xBD7, 0xBD8, 0xBE6, 0xBFB, 0xC00, 0xC04, 0xC05, 0xC0D, 0xC0E, 0xC11, 0xC12, 0xC29, 0xC2A, 0xC3A,
    0xC3D, 0xC45, 0xC46, 0xC49, 0xC4A, 0xC4E, 0xC55, 0xC57, 0xC58, 0xC5B, 0xC60, 0xC64, 0xC66, 0xC70, 0xC78, 0xC84,
    0xC85, 0xC8D, 0xC8E, 0xC91, 0xC92, 0xCA9, 0xCAA, 0xCB4, 0xCB5, 0xCBA, 0xCBC, 0xCC5, 0xCC6, 0xCC9, 0xCCA, 0xCCE,
    0xCD5, 0xCD7, 0xCDE, 0xCDF, 0xCE0, 0xCE4, 0xCE6, 0xCF0, 0xCF1, 0xCF3, 0xD01, 0xD04, 0xD05, 0xD0D, 0xD0E, 0xD11,
    0xD12, 0xD3B, 0xD3D, 0xD45, 0xD46, 0xD49, 0xD4A, 0xD50, 0xD54, 0xD64, 0xD66, 0xD80, 0xD82, 0xD84, 0xD85, 0xD97,
    0xD9A, 0xDB2, 0xDB3, 0xDBC, 0xDBD, 0xDBE, 0xDC0, 0xDC7, 0xDCA, 0xDCB, 0xDCF, 0xDD5, 0xDD6, 0xDD7, 0xDD8, 0xDE0,
    0xDE6, 0xDF0, 0xDF2, 0xDF5, 0xE01, 0xE3B, 0xE3F, 0xE5C, 0xE81, 0xE83, 0xE84, 0xE85, 0xE87, 0xE89, 0xE8A, 0xE8B,
    0xE8D, 0xE8E, 0xE94, 0xE98, 0xE99, 0xEA0, 0xEA1, 0xEA4, 0xEA5, 0xEA6, 0xEA7, 0xEA8, 0xEAA, 0xEAC, 0xEAD, 0xEBA,
    0xEBB, 0xEBE, 0xEC0, 0xEC5, 0xEC6, 0xEC7, 0xEC8, 0xECE, 0xED0, 0xEDA, 0xEDC, 0xEE0, 0xF00, 0xF48, 0xF49, 0xF6D,
    0xF71, 0xF98, 0xF99, 0xFBD, 0xFBE, 0xFCD, 0xFCE, 0xFDB, 0x1000, 0x10C6, 0x10C7, 0x10C8, 0x10CD, 0x10CE, 0x10D0,
    0x1249, 0x124A, 0x124E, 0x1250, 0x1257, 0x1258, 0x1259, 0x125A, 0x125E, 0x1260, 0x1289, 0x128A, 0x128E, 0x1290,
    0x12B1, 0x12B2, 0x12B6, 0x12B8, 0x12BF, 0x12C0, 0x12C1, 0x12C2, 0x12C6, 0x12C8, 0x12D7, 0x12D8, 0x1311, 0x1312,
    0x1316, 0x1318, 0x135B, 0x135D, 0x137D, 0x1380, 0x139A, 0x13A0, 0x13F6, 0x13F8, 0x13FE, 0x1400, 0x169D, 0x16A0,
    0x16F9, 0x1700, 0x170D, 0x170E, 0x1715, 0x1720, 0x1737, 0x1740, 0x1754, 0x1760, 0x176D, 0x176E, 0x1771, 0x1772,
    0x1774, 0x1780, 0x17DE, 0x17E0, 0x17EA, 0x17F0, 0x17FA, 0x1800, 0x180F, 0x1810, 0x181A, 0x1820, 0x1878, 0x1880,
    0x18AB, 0x18B0, 0x18F6, 0x1900, 0x191F, 0x1920, 0x192C, 0x1930, 0x193C, 0x1940, 0x1941, 0x1944, 0x196E, 0x1970,
    0x1975, 0x1980, 0x19AC, 0x19B0, 0x19CA, 0x19D0, 0x19DB, 0x19DE, 0x1A1C, 0x1A1E, 0x1A5F, 0x1A60, 0x1A7D, 0x1A7F,
    0x1A8A, 0x1A90, 0x1A9A, 0x1AA0, 0x1AAE, 0x1AB0, 0x1ABF, 0x1B00, 0x1B4C, 0x1B50, 0x1B7D, 0x1B80, 0x1BF4, 0x1BFC,
    0x1C38, 0x1C3B, 0x1C4A, 0x1C4D, 0x1C89, 0x1CC0, 0x1CC8, 0x1CD0, 0x1CF7, 0x1CF8, 0x1CFA, 0x1D00, 0x1DF6, 0x1DFB,
    0x1F16, 0x1F18, 0x1F1E, 0x1F20, 0x1F46, 0x1F48, 0x1F4E, 0x1F50, 0x1F58, 0x1F59, 0x1F5A, 0x1F5B, 0x1F5C, 0x1F5D,
    0x1F5E, 0x1F5F, 0x1F7E, 0x1F80, 0x1FB5, 0x1FB6, 0x1FC5, 0x1FC6, 0x1FD4, 0x1FD6, 0x1FDC, 0x1FDD, 0x1FF0, 0x1FF2,
    0x1FF5, 0x1FF6, 0x1FFF, 0x2000, 0x2065, 0x2066, 0x2072, 0x2074, 0x208F, 0x2090, 0x209D, 0x20A0, 0x20BF, 0x20D0,
    0x20F1, 0x2100, 0x218C, 0x2190, 0x23FF, 0x2400, 0x2427, 0x2440, 0x244B, 0x2460, 0x2B74, 0x2B76, 0x2B96, 0x2B98,
    0x2BBA, 0x2BBD, 0x2BC9, 0x2BCA, 0x2BD2, 0x2BEC, 0x2BF0, 0x2C00, 0x2C2F, 0x2C30, 0x2C5F, 0x2C60, 0x2CF4, 0x2CF9,
    0x2D26, 0x2D27, 0x2D28, 0x2D2D, 0x2D2E, 0x2D30, 0x2D68, 0x2D6F, 0x2D71, 0x2D7F, 0x2D97, 0x2DA0, 0x2DA7, 0x2DA8,
    0x2DAF, 0x2DB0, 0x2DB7, 0x2DB8, 0x2DBF, 0x2DC0, 0x2DC7, 0x2DC8, 0x2DCF, 0x2DD0, 0x2DD7, 0x2DD8, 0x2DDF, 0x2DE0,
    0x2E45, 0x2E80, 0x2E9A, 0x2E9B, 0x2EF4, 0x2F00, 0x2FD6, 0x2FF0, 0x2FFC, 0x3000, 0x3040, 0x3041, 0x3097, 0x3099,
    0x3100, 0x3105, 0x312E, 0x3131, 0x318F, 0x3190, 0x31BB, 0x31C0, 0x31E4, 0x31F0, 0x321F, 0x3220, 0x32FF, 0x3300,
    0x4DB6, 0x4DC0, 0x9FD6, 0xA000, 0xA48D, 0xA490, 0xA4C7, 0xA4D0, 0xA62C, 0xA640, 0xA6F8, 0xA700, 0xA7AF, 0xA7B0,
    0xA7B8, 0xA7F7, 0xA82C, 0xA830, 0xA83A, 0xA840, 0xA878, 0xA880, 0xA8C6, 0xA8CE, 0xA8DA, 0xA8E0, 0xA8FE, 0xA900,
    0xA954, 0xA95F, 0xA97D, 0xA980, 0xA9CE, 0xA9CF, 0xA9DA, 0xA9DE, 0xA9FF, 0xAA00, 0xAA37, 0xAA40, 0xAA4E, 0xAA50,
    0xAA5A, 0xAA5C, 0xAAC3, 0xAADB, 0xAAF7, 0xAB01, 0xAB07, 0xAB09, 0xAB0F, 0xAB11, 0xAB17, 0xAB20, 0xAB27, 0xAB28,
    0xAB2F, 0xAB30, 0xAB66, 0xAB70, 0xABEE, 0xABF0, 0xABFA, 0xAC00, 0xD7A4, 0xD7B0, 0xD7C7, 0xD7CB, 0xD7FC, 0xD800,
    0xFA6E, 0xFA70, 0xFADA, 0xFB00, 0xFB07, 0xFB13, 0xFB18, 0xFB1D, 0xFB37, 0xFB38, 0xFB3D, 0xFB3E, 0xFB3F, 0xFB40,
    0xFB42, 0xFB43, 0xFB45, 0xFB46, 0xFBC2, 0xFBD3, 0xFD40, 0xFD50, 0xFD90, 0xFD92, 0xFDC8, 0xFDD0, 0xFDFE, 0xFE00,
    0xFE1A, 0xFE20, 0xFE53, 0xFE54, 0xFE67, 0xFE68, 0xFE6C, 0xFE70, 0xFE75, 0xFE76, 0xFEFD, 0xFEFF, 0xFF00, 0xFF01,
    0xFFBF, 0xFFC2, 0xFFC8, 0xFFCA, 0xFFD0, 0xFFD2, 0xFFD8, 0xFFDA, 0xFFDD, 0xFFE0, 0xFFE7, 0xFFE8, 0xFFEF, 0xFFF9,
    0x1000C, 0x1000D, 0x10027, 0x10028, 0x1003B, 0x1003C, 0x1003E, 0x1003F, 0x1004E, 0x10050, 0x1005E, 0x10080,
    0x100FB, 0x10100, 0x10103, 0x10107, 0x10134, 0x10137, 0x1018F, 0x10190, 0x1019C, 0x101A0, 0x101A1, 0x101D0,
    0x101FE, 0x10280, 0x1029D, 0x102A0, 0x102D1, 0x102E0, 0x102FC, 0x10300, 0x10324, 0x10330, 0x1034B, 0x10350,
    0x1037B, 0x10380, 0x1039E, 0x1039F, 0x103C4, 0x103C8, 0x103D6, 0x10400, 0x1049E, 0x104A0, 0x104AA, 0x104B0,
    0x104D4, 0x104D8, 0x104FC, 0x10500, 0x10528, 0x10530, 0x10564, 0x1056F, 0x10570, 0x10600, 0x10737, 0x10740,
    0x10756, 0x10760, 0x10768, 0x10800, 0x10806, 0x10808, 0x10809, 0x1080A, 0x10836, 0x10837, 0x10839, 0x1083C,
    0x1083D, 0x1083F, 0x10856, 0x10857, 0x1089F, 0x108A7, 0x108B0, 0x108E0, 0x108F3, 0x108F4, 0x108F6, 0x108FB,
    0x1091C, 0x1091F, 0x1093A, 0x1093F, 0x10940, 0x10980, 0x109B8, 0x109BC, 0x109D0, 0x109D2, 0x10A04, 0x10A05,
    0x10A07, 0x10A0C, 0x10A14, 0x10A15, 0x10A18, 0x10A19, 0x10A34, 0x10A38, 0x10A3B, 0x10A3F, 0x10A48, 0x10A50,
    0x10A59, 0x10A60, 0x10AA0, 0x10AC0, 0x10AE7, 0x10AEB, 0x10AF7, 0x10B00, 0x10B36, 0x10B39, 0x10B56, 0x10B58,
    0x10B73, 0x10B78, 0x10B92, 0x10B99, 0x10B9D, 0x10BA9, 0x10BB0, 0x10C00, 0x10C49, 0x10C80, 0x10CB3, 0x10CC0,
    0x10CF3, 0x10CFA, 0x10D00, 0x10E60, 0x10E7F, 0x11000, 0x1104E, 0x11052, 0x11070, 0x1107F, 0x110C2, 0x110D0,
    0x110E9, 0x110F0, 0x110FA, 0x11100, 0x11135, 0x11136, 0x11144, 0x11150, 0x11177, 0x11180, 0x111CE, 0x111D0,
    0x111E0, 0x111E1, 0x111F5, 0x11200, 0x11212, 0x11213, 0x1123F, 0x11280, 0x11287, 0x11288, 0x11289, 0x1128A,
    0x1128E, 0x1128F, 0x1129E, 0x1129F, 0x112AA, 0x112B0, 0x112EB, 0x112F0, 0x112FA, 0x11300, 0x11304, 0x11305,
    0x1130D, 0x1130F, 0x11311, 0x11313, 0x11329, 0x1132A, 0x11331, 0x11332, 0x11334, 0x11335, 0x1133A, 0x1133C,
    0x11345, 0x11347, 0x11349, 0x1134B, 0x1134E, 0x11350, 0x11351, 0x11357, 0x11358, 0x1135D, 0x11364, 0x11366,
    0x1136D, 0x11370, 0x11375, 0x11400, 0x1145A, 0x1145B, 0x1145C, 0x1145D, 0x1145E, 0x11480, 0x114C8, 0x114D0,
    0x114DA, 0x11580, 0x115B6, 0x115B8, 0x115DE, 0x11600, 0x11645, 0x11650, 0x1165A, 0x11660, 0x1166D, 0x11680,
    0x116B8, 0x116C0, 0x116CA, 0x11700, 0x1171A, 0x1171D, 0x1172C, 0x11730, 0x11740, 0x118A0, 0x118F3, 0x118FF,
    0x11900, 0x11AC0, 0x11AF9, 0x11C00, 0x11C09, 0x11C0A, 0x11C37, 0x11C38, 0x11C46, 0x11C50, 0x11C6D, 0x11C70,
    0x11C90, 0x11C92, 0x11CA8, 0x11CA9, 0x11CB7, 0x12000, 0x1239A, 0x12400, 0x1246F, 0x12470, 0x12475, 0x12480,
    0x12544, 0x13000, 0x1342F, 0x14400, 0x14647, 0x16800, 0x16A39, 0x16A40, 0x16A5F, 0x16A60, 0x16A6A, 0x16A6E,
    0x16A70, 0x16AD0, 0x16AEE, 0x16AF0, 0x16AF6, 0x16B00, 0x16B46, 0x16B50, 0x16B5A, 0x16B5B, 0x16B62, 0x16B63,
    0x16B78, 0x16B7D, 0x16B90, 0x16F00, 0x16F45, 0x16F50, 0x16F7F, 0x16F8F, 0x16FA0, 0x16FE0, 0x16FE1, 0x17000,
    0x187ED, 0x18800, 0x18AF3, 0x1B000, 0x1B002, 0x1BC00, 0x1BC6B, 0x1BC70, 0x1BC7D, 0x1BC80, 0x1BC89, 0x1BC90,
    0x1BC9A, 0x1BC9C, 0x1BCA4, 0x1D000, 0x1D0F6, 0x1D100, 0x1D127, 0x1D129, 0x1D1E9, 0x1D200, 0x1D246, 0x1D300,
    0x1D357, 0x1D360, 0x1D372, 0x1D400, 0x1D455, 0x1D456, 0x1D49D, 0x1D49E, 0x1D4A0, 0x1D4A2, 0x1D4A3, 0x1D4A5,
    0x1D4A7, 0x1D4A9, 0x1D4AD, 0x1D4AE, 0x1D4BA, 0x1D4BB, 0x1D4BC, 0x1D4BD, 0x1D4C4, 0x1D4C5, 0x1D506, 0x1D507,
    0x1D50B, 0x1D50D, 0x1D515, 0x1D516, 0x1D51D, 0x1D51E, 0x1D53A, 0x1D53B, 0x1D53F, 0x1D540, 0x1D545, 0x1D546,
    0x1D547, 0x1D54A, 0x1D551, 0x1D552, 0x1D6A6, 0x1D6A8, 0x1D7CC, 0x1D7CE, 0x1DA8C, 0x1DA9B, 0x1DAA0, 0x1DAA1,
    0x1DAB0, 0x1E000, 0x1E007, 0x1E008, 0x1E019, 0x1E01B, 0x1E022, 0x1E023, 0x1E025, 0x1E026, 0x1E02B, 0x1E800,
    0x1E8C5, 0x1E8C7, 0x1E8D7, 0x1E900, 0x1E94B, 0x1E950, 0x1E95A, 0x1E95E, 0x1E960, 0x1EE00, 0x1EE04, 0x1EE05,
    0x1EE20, 0x1EE21, 0x1EE23, 0x1EE24, 0x1EE25, 0x1EE27, 0x1EE28, 0x1EE29, 0x1EE33, 0x1EE34, 0x1EE38, 0x1EE39,
    0x1EE3A, 0x1EE3B, 0x1EE3C, 0x1EE42, 0x1EE43, 0x1EE47, 0x1EE48, 0x1EE49, 0x1EE4A, 0x1EE4B, 0x1EE4C, 0x1EE4D,
    0x1EE50, 0x1EE51, 0x1EE53, 0x1EE54, 0x1EE55, 0x1EE57, 0x1EE58, 0x1EE59, 0x1EE5A, 0x1EE5B, 0x1EE5C, 0x1EE5D,
    0x1EE5E, 0x1EE5F, 0x1EE60, 0x1EE61, 0x1EE63, 0x1EE64, 0x1EE65, 0x1EE67, 0x1EE6B, 0x1EE6C, 0x1EE73, 0x1EE74,
    0x1EE78, 0x1EE79, 0x1EE7D, 0x1EE7E, 0x1EE7F, 0x1EE80, 0x1EE8A, 0x1EE8B, 0x1EE9C, 0x1EEA1, 0x1EEA4, 0x1EEA5,
    0x1EEAA, 0x1EEAB, 0x1EEBC, 0x1EEF0, 0x1EEF2, 0x1F000, 0x1F02C, 0x1F030, 0x1F094, 0x1F0A0, 0x1F0AF, 0x1F0B1,
    0x1F0C0, 0x1F0C1, 0x1F0D0, 0x1F0D1, 0x1F0F6, 0x1F100, 0x1F10D, 0x1F110, 0x1F12F, 0x1F130, 0x1F16C, 0x1F170,
    0x1F1AD, 0x1F1E6, 0x1F203, 0x1F210, 0x1F23C, 0x1F240, 0x1F249, 0x1F250, 0x1F252, 0x1F300, 0x1F6D3, 0x1F6E0,
    0x1F6ED, 0x1F6F0, 0x1F6F7, 0x1F700, 0x1F774, 0x1F780, 0x1F7D5, 0x1F800, 0x1F80C, 0x1F810, 0x1F848, 0x1F850,
    0x1F85A, 0x1F860, 0x1F888, 0x1F890, 0x1F8AE, 0x1F910, 0x1F91F, 0x1F920, 0x1F928, 0x1F930, 0x1F931, 0x1F933,
    0x1F93F, 0x1F940, 0x1F94C, 0x1F950, 0x1F95F, 0x1F980, 0x1F992, 0x1F9C0, 0x1F9C1, 0x1FFFE, 0x2A6D7, 0x2A700,
    0x2B735, 0x2B740, 0x2B81E, 0x2B820, 0x2CEA2, 0x2F800, 0x2FA1E, 0x2FFFE, 0x30000, 0x3FFFE, 0x40000, 0x4FFFE,
    0x50000, 0x5FFFE, 0x60000, 0x6FFFE, 0x70000, 0x7FFFE, 0x80000, 0x8FFFE, 0x90000, 0x9FFFE, 0xA0000, 0xAFFFE,
    0xB0000, 0xBFFFE, 0xC0000, 0xCFFFE, 0xD0000, 0xDFFFE, 0xE0000, 0xE0001, 0xE0002, 0xE0020, 0xE0080, 0xE0100,
    0xE01F0, 0xEFFFE, 0x110000,
};

/* Whether tokenizers' normalizers see cp as it is (U+FFFF itself stands aside too: see held). */
static int in_unicode_9(uint32_t cp) {
    size_t lo = 0, hi = sizeof IN_UNICODE_9 / sizeof *IN_UNICODE_9; /* lo: the entries <= cp */
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (IN_UNICODE_9[mid] <= cp) lo = mid + 1;
        else hi = mid;
    }
    return (lo & 1) && cp != 0xFFFF;
}

/* t->held: the code points of s[0..len) that Unicode 9.0 lacks, in order; t->guarded: s with each
 * of them U+FFFF (built only when there is one). */
static dt_status hold_new(dt_tokenizer *t, const char *s, size_t len) {
    t->n_held = 0;
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        size_t l;
        const uint32_t cp = utf8_at(s, i, &l);
        if (cp >= 0x378 && !in_unicode_9(cp)) {
            if (!t->n_held) { /* the first: room for the copy (2-byte characters become 3 bytes) */
                const size_t need = len + len / 2 + 4;
                if (need > t->guarded_cap) {
                    char *p = realloc(t->guarded, need);
                    if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory (normalizing %zu bytes)", len);
                    t->guarded = p;
                    t->guarded_cap = need;
                }
                memcpy(t->guarded, s, i);
                k = i;
            }
            if (t->n_held == t->held_cap) {
                size_t c = t->held_cap ? t->held_cap * 2 : 256;
                uint32_t *p = realloc(t->held, c * sizeof *p);
                if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory (normalizing %zu bytes)", len);
                t->held = p;
                t->held_cap = c;
            }
            t->held[t->n_held++] = cp;
            memcpy(t->guarded + k, "\xEF\xBF\xBF", 3);
            k += 3;
        } else if (t->n_held) {
            memcpy(t->guarded + k, s + i, l);
            k += l;
        }
        i += l;
    }
    t->guarded_len = k;
    return DT_OK;
}

/* Appends s[0..len), utf8proc's output, with each U+FFFF the code point it stands for. */
static dt_status append_restored(dt_tokenizer *t, const char *s, size_t len) {
    size_t from = 0, j = 0;
    for (size_t i = 0; i + 3 <= len; i++) {
        if (memcmp(s + i, "\xEF\xBF\xBF", 3) != 0) continue;
        utf8proc_uint8_t c[4];
        if (j == t->n_held) break;
        DT_TRY(norm_append(t, s + from, i - from));
        DT_TRY(norm_append(t, (const char *)c, (size_t)utf8proc_encode_char((utf8proc_int32_t)t->held[j++], c)));
        from = i + 3;
        i += 2;
    }
    if (j != t->n_held) return dt_error_set(DT_ERR_INTERNAL, "%s: normalizing: %zu of %zu held code points came back",
                                            t->name, j, t->n_held);
    return norm_append(t, s + from, len - from);
}

/* Appends s[0..len) after each normalizer in turn, as tokenizers' Unicode 9.0 tables make it. */
static dt_status normalize_chunk(dt_tokenizer *t, const char *s, size_t len) {
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < t->norm_below) i++;
    if (i == len) return norm_append(t, s, len);
    DT_TRY(hold_new(t, s, len));
    const utf8proc_uint8_t *in = (const utf8proc_uint8_t *)(t->n_held ? t->guarded : s);
    utf8proc_uint8_t *cur = NULL;
    utf8proc_ssize_t n = (utf8proc_ssize_t)(t->n_held ? t->guarded_len : len);
    for (int k = 0; k < t->n_norms; k++) {
        utf8proc_uint8_t *next = NULL;
        n = utf8proc_map(in, n, &next, t->norms[k]);
        free(cur);
        if (n < 0)
            return dt_error_set(n == UTF8PROC_ERROR_NOMEM ? DT_ERR_NOMEM : DT_ERR_DATA, "%s: normalizing the text: %s",
                                t->name, utf8proc_errmsg(n));
        in = cur = next;
    }
    dt_status st = t->n_held ? append_restored(t, (const char *)cur, (size_t)n)
                             : norm_append(t, (const char *)cur, (size_t)n);
    free(cur);
    return st;
}

/* s[0..len) in the normalizers' form: s itself when it is (every byte below norm_below), else
 * t->norm (valid until the next call). No normal form joins an ASCII character to what precedes
 * it, so the text is normalized in chunks cut before ASCII bytes, about NORM_CHUNK bytes each:
 * utf8proc's buffers stay small whatever the text. */
static dt_status normalize(dt_tokenizer *t, const char *s, size_t len, const char **out, size_t *out_len) {
    *out = s;
    *out_len = len;
    if (!t->n_norms) return DT_OK;
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < t->norm_below) i++;
    if (i == len) return DT_OK;
    t->norm_len = 0;
    for (size_t a = 0; a < len;) {
        size_t b = len - a > NORM_CHUNK ? a + NORM_CHUNK : len;
        while (b < len && (unsigned char)s[b] >= 0x80) b++;
        DT_TRY(normalize_chunk(t, s + a, b - a));
        a = b;
    }
    *out = t->norm;
    *out_len = t->norm_len;
    return DT_OK;
}

/* ---- loading tokenizer.json: normalizer, pre-tokenizer, post-processor ---- */

/* The normalizer: NFC, NFD, NFKC, NFKD, or a Sequence of them (nested ones flattened). */
static dt_status load_normalizer(dt_tokenizer *t, json_t *n, int depth) {
    static const struct {
        const char *type;
        utf8proc_option_t opt;
    } forms[] = {{"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
                 {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
                 {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
                 {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}};
    if (!n || json_is_null(n)) return DT_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    json_t *list = json_object_get(n, "normalizers"), *v;
    size_t i;
    if (type && strcmp(type, "Sequence") == 0 && json_is_array(list) && depth < 4) {
        json_array_foreach(list, i, v) DT_TRY(load_normalizer(t, v, depth + 1));
        return DT_OK;
    }
    for (i = 0; type && i < sizeof forms / sizeof *forms; i++) {
        if (strcmp(type, forms[i].type) != 0) continue;
        if (t->n_norms == MAX_NORMS)
            return dt_error_set(DT_ERR_DATA, "%s: normalizer Sequence: more than %d normalizers", t->name, MAX_NORMS);
        t->norms[t->n_norms++] = forms[i].opt;
        /* NFC leaves every code point below U+0300 (bytes below 0xCC) as it is; the others only ASCII */
        if (i != 0) t->norm_below = 0x80;
        return DT_OK;
    }
    return dt_error_set(DT_ERR_DATA, "%s: normalizer %s: dtrain reads NFC, NFD, NFKC and NFKD (alone or in a "
                        "Sequence), or none", t->name, type ? type : "(no type)");
}

/* src[0..] is \p or \P: for \p{L} and \p{N} (\pL, \P{L}, \p{^L}, ... ) 'L' or 'N', else 0; *len: the
 * escape's length; *neg: whether it is negated. */
static char property_since_14(const char *src, size_t *len, int *neg) {
    const char *name = src + 2, *end = name + (*name != '\0');
    if (*name == '{') {
        end = strchr(name, '}');
        if (!end) return 0;
        name++;
    }
    *len = (size_t)(end - src) + (*end == '}');
    *neg = src[1] == 'P';
    if (*name == '^') *neg = !*neg, name++;
    return end - name == 1 && (*name == 'L' || *name == 'N') ? *name : 0;
}

/* What translate_pattern refuses in src[i..]: the construct's name, or NULL. Each is read
 * differently by Oniguruma (tokenizers) and PCRE2: \w \d \h \b \v and their negations (ASCII or
 * Unicode, hex digit or space, ...), \Q, ^ and $ (line anchors in Oniguruma), a [ in a class
 * (a nested class, or PCRE2's POSIX class) and && (Oniguruma's intersection), a class opening
 * with ] and group options other than i ((?m) is dotall in Oniguruma). */
static const char *refused_at(const char *src, size_t i, int in_class) {
    const char c = src[i], d = c ? src[i + 1] : 0;
    static const char escapes[] = "wWdDhHbBvVQ";
    static const char *const names[] = {"\\w", "\\W", "\\d", "\\D", "\\h", "\\H", "\\b", "\\B", "\\v", "\\V", "\\Q"};
    if (c == '\\' && d && strchr(escapes, d)) return names[strchr(escapes, d) - escapes];
    if (c == '\\' && d == 'S' && in_class) return "\\S in a class";
    size_t len;
    int neg;
    if (c == '\\' && (d == 'p' || d == 'P') && in_class && property_since_14(src + i, &len, &neg) && neg)
        return "a negated \\p{L} or \\p{N} in a class";
    if (!in_class && (c == '^' || c == '$')) return c == '^' ? "the anchor ^" : "the anchor $";
    if (in_class && c == '[') return "[ in a class";
    if (in_class && c == '&' && d == '&') return "&& in a class";
    if (!in_class && c == '[' && (d == ']' || (d == '^' && src[i + 2] == ']'))) return "a class opening with ]";
    if (!in_class && c == '(' && d == '?') {
        size_t k = i + 2;
        while ((src[k] >= 'a' && src[k] <= 'z') || (src[k] >= 'A' && src[k] <= 'Z') || src[k] == '-') k++;
        if (k > i + 2 && (src[k] == ':' || src[k] == ')'))
            for (size_t j = i + 2; j < k; j++)
                if (src[j] != 'i' && src[j] != '-') return "a group option other than i";
    }
    return NULL;
}

/* Appends ranges as a class's items, \x{A}-\x{B}; returns the bytes written. */
static size_t put_ranges(char *o, const uint32_t (*r)[2], size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(o + k, "\\x{%X}-\\x{%X}", r[i][0], r[i][1]);
    return k;
}

static int is_hex4(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!s[i] || !strchr("0123456789abcdefABCDEF", s[i])) return 0;
    return 1;
}

/* src, a tokenizers (Oniguruma) pattern, as PCRE2 must be given it to match the same text: \s
 * and \S as White_Space (WS_CLASS), \p{L} and \p{N} with Unicode 15 and 16's letters and numbers
 * (with_new), \uHHHH as \x{HHHH}; into *out (malloc'ed). What the two read differently otherwise
 * is refused (refused_at), naming the construct. */
static dt_status translate_pattern(const dt_tokenizer *t, const char *what, const char *src, int with_new, char **out) {
    const size_t n = strlen(src);
    char *o = malloc((n + 1) * (N_LETTERS_SINCE_14 * 24 + 16)); /* \pL becomes [^\p{L}...], 24 bytes a range */
    if (!o) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    size_t k = 0, len;
    int in_class = 0, neg;
    for (size_t i = 0; i < n; i++) {
        const char *bad = refused_at(src, i, in_class);
        if (bad) {
            free(o);
            return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s: pattern \"%s\": %s: dtrain refuses it (Oniguruma, "
                                "which tokenizers uses, and PCRE2, which dtrain uses, read it differently)", t->name,
                                what, src, bad);
        }
        const char c = src[i], d = src[i + 1];
        if (c == '\\' && (d == 's' || d == 'S')) {
            k += (size_t)sprintf(o + k, in_class ? "%s" : d == 's' ? "[%s]" : "[^%s]", WS_CLASS);
            i++;
        } else if (c == '\\' && (d == 'p' || d == 'P') && property_since_14(src + i, &len, &neg)) {
            const char name = property_since_14(src + i, &len, &neg);
            k += (size_t)sprintf(o + k, in_class ? "\\p{%c}" : neg ? "[^\\p{%c}" : "[\\p{%c}", name);
            if (with_new) k += put_ranges(o + k, name == 'L' ? LETTERS_SINCE_14 : NUMBERS_SINCE_14,
                                          name == 'L' ? N_LETTERS_SINCE_14 : N_NUMBERS_SINCE_14);
            if (!in_class) o[k++] = ']';
            i += len - 1;
        } else if (c == '\\' && d == 'u' && is_hex4(src + i + 2)) {
            k += (size_t)sprintf(o + k, "\\x{%.4s}", src + i + 2);
            i += 5;
        } else if (c == '\\' && d && strchr("pPxo", d) && src[i + 2] == '{' && strchr(src + i, '}')) {
            const size_t e = (size_t)(strchr(src + i, '}') - src); /* \p{...}, \x{...}: as written */
            memcpy(o + k, src + i, e + 1 - i);
            k += e + 1 - i;
            i = e;
        } else if (c == '\\' && d) { /* any other escape passes as written */
            o[k++] = c, o[k++] = d, i++;
        } else if (!in_class && c == '[') {
            in_class = 1;
            o[k++] = c;
            if (d == '^') o[k++] = d, i++;
        } else {
            if (in_class && c == ']') in_class = 0;
            o[k++] = c;
        }
    }
    o[k] = '\0';
    *out = o;
    return DT_OK;
}

/* Compiles pat, src's translation (or src itself, literal), JIT too where PCRE2 has it. */
static dt_status compile_pattern(dt_tokenizer *t, const char *what, const char *src, const char *pat, int literal,
                                 pcre2_code **re) {
    int err;
    PCRE2_SIZE at;
    const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &err, &at, t->cctx);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s: pattern \"%s\" does not compile (PCRE2, at byte %zu of "
                            "its translation): %s", t->name, what, src, (size_t)at, (const char *)msg);
    }
    uint32_t min_len = 0;
    if (pcre2_pattern_info(*re, PCRE2_INFO_MINLENGTH, &min_len) != 0 || min_len == 0)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s: pattern \"%s\" can match the empty string: dtrain "
                            "refuses it (tokenizers splits at such matches in ways dtrain does not copy)", t->name,
                            what, src);
    (void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* the interpreter serves where JIT is not built */
    return DT_OK;
}

/* Compiles a step's pattern (src: a tokenizers pattern, or a literal string) with its match data:
 * re as PCRE2's tables have it and, when the pattern holds \p{L} or \p{N}, re_new with the letters
 * and numbers of Unicode 15 and 16 added (slower: used on text that holds one, see use_new). */
static dt_status compile_step(dt_tokenizer *t, pre_step *st, const char *what, const char *src, int literal) {
    char *pat = NULL, *pat_new = NULL;
    dt_status rc = literal ? DT_OK : translate_pattern(t, what, src, 0, &pat);
    if (rc == DT_OK && !literal) rc = translate_pattern(t, what, src, 1, &pat_new);
    if (rc == DT_OK) rc = compile_pattern(t, what, src, literal ? src : pat, literal, &st->re);
    if (rc == DT_OK && !literal && strcmp(pat, pat_new) != 0) {
        rc = compile_pattern(t, what, src, pat_new, 0, &st->re_new);
        t->has_new = 1;
    }
    free(pat);
    free(pat_new);
    if (rc != DT_OK) return rc;
    st->md = pcre2_match_data_create_from_pattern(st->re, NULL); /* the two have the same groups */
    return st->md ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
}

/* Split: pattern {"Regex": ...} or {"String": ...}, behavior, invert. */
static dt_status load_split(dt_tokenizer *t, json_t *p, pre_step *st) {
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    st->behavior = -1;
    for (int i = 0; behavior && i < 5; i++)
        if (strcmp(behavior, BEHAVIORS[i]) == 0) st->behavior = i;
    if (st->behavior < 0)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer Split: behavior %s: expected Removed, Isolated, "
                            "MergedWithPrevious, MergedWithNext or Contiguous", t->name,
                            behavior ? behavior : "missing");
    json_t *invert = json_object_get(p, "invert"), *pat = json_object_get(p, "pattern");
    if (!json_is_boolean(invert))
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer Split: invert: expected true or false", t->name);
    st->invert = json_is_true(invert);
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *s = json_string_value(json_object_get(pat, "String"));
    if (re || s) return compile_step(t, st, "Split", re ? re : s, !re);
    return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer Split: pattern: expected {\"Regex\": \"...\"} or "
                        "{\"String\": \"...\"}", t->name);
}

/* One step (not a Sequence) into t->steps; *byte_level once ByteLevel, which must come last. */
static dt_status load_step(dt_tokenizer *t, json_t *p, const char *type, int *byte_level) {
    if (*byte_level)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer Sequence: %s after ByteLevel: dtrain reads ByteLevel as "
                            "the last step (the steps after it would see byte characters)", t->name, type);
    if (t->n_steps == MAX_STEPS)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer Sequence: more than %d steps", t->name, MAX_STEPS);
    pre_step *st = &t->steps[t->n_steps];
    if (strcmp(type, "Split") == 0) {
        DT_TRY(load_split(t, p, st));
    } else if (strcmp(type, "Digits") == 0) { /* Rust's char::is_numeric: \p{N}, each a match */
        json_t *v = json_object_get(p, "individual_digits");
        if (v && !json_is_boolean(v))
            return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer Digits: individual_digits: expected true or false",
                                t->name);
        st->behavior = json_is_true(v) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        DT_TRY(compile_step(t, st, "Digits", "[\\p{N}" DIGITS_SINCE_16 "]", 0));
    } else if (strcmp(type, "ByteLevel") == 0) {
        json_t *v = json_object_get(p, "use_regex");
        *byte_level = 1;
        st->behavior = SPLIT_ISOLATED;
        st->prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        if (!v || json_is_true(v)) DT_TRY(compile_step(t, st, "ByteLevel", GPT2_PATTERN, 0));
        if (!st->re && !st->prefix_space) return DT_OK; /* it changes no piece: no step */
    } else {
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s: dtrain reads Split, Digits and ByteLevel (alone or in "
                            "a Sequence that ends with ByteLevel)", t->name, type);
    }
    t->n_steps++;
    return DT_OK;
}

static dt_status load_steps(dt_tokenizer *t, json_t *p, int depth, int *byte_level) {
    const char *type = json_string_value(json_object_get(p, "type"));
    json_t *list = json_object_get(p, "pretokenizers"), *v;
    size_t i;
    if (!type)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s: dtrain reads byte-level BPE (a pre_tokenizer with a "
                            "ByteLevel step)", t->name, json_is_null(p) || !p ? "null" : "without a type");
    if (strcmp(type, "Sequence") == 0 && json_is_array(list) && depth < 4) {
        json_array_foreach(list, i, v) DT_TRY(load_steps(t, v, depth + 1, byte_level));
        return DT_OK;
    }
    return load_step(t, p, type, byte_level);
}

static dt_status load_pre_tokenizer(dt_tokenizer *t, json_t *pre) {
    int byte_level = 0;
    DT_TRY(load_steps(t, pre, 0, &byte_level));
    if (!byte_level)
        return dt_error_set(DT_ERR_DATA, "%s: pre_tokenizer %s has no ByteLevel step: dtrain reads byte-level BPE (as "
                            "GPT-2's, Llama 3's, Qwen's and the tokenizers library's ByteLevelBPETokenizer)", t->name,
                            json_string_value(json_object_get(pre, "type")));
    return DT_OK;
}

/* ByteLevel and TemplateProcessing, alone or in a Sequence: what they add only
 * encode(add_special_tokens=True) sees, and dtrain's ids are those of add_special_tokens=False. */
static dt_status check_post_processor(const dt_tokenizer *t, json_t *post, int depth) {
    if (!post || json_is_null(post)) return DT_OK;
    const char *type = json_string_value(json_object_get(post, "type"));
    json_t *list = json_object_get(post, "processors"), *v;
    size_t i;
    if (type && strcmp(type, "Sequence") == 0 && json_is_array(list) && depth < 4) {
        json_array_foreach(list, i, v) DT_TRY(check_post_processor(t, v, depth + 1));
        return DT_OK;
    }
    if (type && (strcmp(type, "ByteLevel") == 0 || strcmp(type, "TemplateProcessing") == 0)) return DT_OK;
    return dt_error_set(DT_ERR_DATA, "%s: post_processor %s is not supported (dtrain reads ByteLevel and "
                        "TemplateProcessing, alone or in a Sequence)", t->name, type ? type : "(no type)");
}

/* What a tokenizer.json must and must not have besides the normalizer and pre-tokenizer. */
static dt_status check_model(dt_tokenizer *t, json_t *root, json_t *model) {
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || !type || strcmp(type, "BPE") != 0)
        return dt_error_set(DT_ERR_DATA, "%s: model.type is %s, not BPE (dtrain reads byte-level BPE tokenizers)", t->name,
                            type ? type : "missing");
    static const char *const none[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = json_string_value(json_object_get(model, none[i]));
        if (s && s[0]) return dt_error_set(DT_ERR_DATA, "%s: model.%s \"%s\" is not supported", t->name, none[i], s);
    }
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return dt_error_set(DT_ERR_DATA, "%s: model.byte_fallback is not supported (byte-level BPE needs none)", t->name);
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return dt_error_set(DT_ERR_DATA, "%s: model.dropout %g is not supported (BPE dropout splits words at random; "
                            "dtrain's ids are tokenizers' without it)", t->name, json_number_value(dropout));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    return check_post_processor(t, json_object_get(root, "post_processor"), 0);
}

/* ---- loading tokenizer.json: the model, the added tokens ---- */

static dt_status load_vocab(dt_tokenizer *t, json_t *vocab) {
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return dt_error_set(DT_ERR_DATA, "%s: model.vocab is missing or empty", t->name);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= (1 << 24))
            return dt_error_set(DT_ERR_DATA, "%s: model.vocab[\"%.40s\"]: expected an id 0..16777215", t->name, key);
        const size_t n = strlen(key);
        if (strmap_add(&t->vocab, key, n, id) < 0) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        if (n > t->max_key_len) t->max_key_len = n;
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

/* One added token: what it matches (its content; normalized too, when normalized is true, as
 * tokenizers' AddedVocabulary does), its flags and its id, numbered as tokenizers numbers them
 * when it reads the file (AddedVocabulary::add_tokens; the file's "id" is not read back): the
 * vocabulary's id of its content, else the next after the vocabulary's entries, in file order.
 * A content seen before is that token again, with these flags. */
static dt_status load_added_token(dt_tokenizer *t, json_t *a, size_t i, strmap *seen, int *next_id, int *id_out) {
    const char *content = json_string_value(json_object_get(a, "content"));
    json_int_t file_id = json_integer_value(json_object_get(a, "id"));
    if (!content || !content[0] || !json_is_integer(json_object_get(a, "id")) || file_id < 0)
        return dt_error_set(DT_ERR_DATA, "%s: added_tokens[%zu]: expected a non-empty content and an id", t->name, i);
    const size_t content_len = strlen(content);
    const long e = strmap_find(seen, content, content_len);
    struct added *d = &t->added[e >= 0 ? seen->val[e] : t->n_added];
    int id = e >= 0 ? d->id : (int)vocab_id(t, content, content_len);
    if (id < 0) id = (*next_id)++;
    if (id >= (1 << 24))
        return dt_error_set(DT_ERR_DATA, "%s: added_tokens[%zu]: id %d is past 16777215", t->name, i, id);
    json_t *norm = json_object_get(a, "normalized");
    const int special = json_is_true(json_object_get(a, "special"));
    d->normalized = norm ? json_is_true(norm) : !special; /* tokenizers' AddedToken::from */
    d->single_word = json_is_true(json_object_get(a, "single_word"));
    d->lstrip = json_is_true(json_object_get(a, "lstrip"));
    d->rstrip = json_is_true(json_object_get(a, "rstrip"));
    const char *text = content;
    size_t len = content_len;
    if (d->normalized) DT_TRY(normalize(t, content, content_len, &text, &len));
    char *copy = malloc(len + 1);
    if (!copy) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    memcpy(copy, text, len);
    copy[len] = '\0';
    free(d->text);
    d->text = copy;
    d->len = len;
    d->id = id;
    if (e < 0 && strmap_add(seen, content, content_len, t->n_added++) < 0)
        return dt_error_set(DT_ERR_NOMEM, "out of memory");
    if (id + 1 > t->vocab_size) t->vocab_size = id + 1;
    if (strcmp(content, "<|endoftext|>") == 0) t->eot = id;
    *id_out = id;
    return DT_OK;
}

/* Rust regex's \w, compiled when some added token is single_word. */
static dt_status compile_word_class(dt_tokenizer *t) {
    int err;
    PCRE2_SIZE at;
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED;
    t->word_re = pcre2_compile((PCRE2_SPTR)WORD_CLASS, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
    if (!t->word_re)
        return dt_error_set(DT_ERR_INTERNAL, "the word-character class does not compile (PCRE2 error %d)", err);
    t->word_md = pcre2_match_data_create_from_pattern(t->word_re, NULL);
    return t->word_md ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
}

static dt_status load_added(dt_tokenizer *t, json_t *added) {
    size_t n = json_array_size(added);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    strmap seen = {0};
    int next_id = (int)t->vocab.n, specials = 0, special_id = -1, single_word = 0;
    dt_status st = DT_OK;
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        json_t *a = json_array_get(added, i);
        int id = -1;
        st = load_added_token(t, a, i, &seen, &next_id, &id);
        if (st == DT_OK && json_is_true(json_object_get(a, "special"))) specials++, special_id = id;
    }
    strmap_free(&seen);
    DT_TRY(st);
    if (t->eot < 0 && specials == 1) t->eot = special_id;
    for (int i = 0; i < t->n_added; i++) {
        const struct added *d = &t->added[i];
        t->n_pass[d->normalized]++;
        t->added_first[d->normalized][(unsigned char)d->text[0]] = 1;
        single_word |= d->single_word;
    }
    return single_word ? compile_word_class(t) : DT_OK;
}

/* A token string's bytes for decoding into out: in byte characters, the bytes they stand for;
 * otherwise as written (tokenizers' ByteLevel decoder, token by token). */
static size_t decoded_bytes(const char *s, size_t n, const int *char_byte, char *out) {
    long k = token_bytes(s, n, char_byte, out);
    if (k >= 0) return (size_t)k;
    memcpy(out, s, n);
    return n;
}

/* Each id's bytes (decoding: added tokens as their text) and each byte's id (encoding). */
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
    t->word_chars = malloc(2 * t->max_key_len + 1);
    if (!t->bytes || !t->bytes_len || !t->word_chars) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    for (size_t e = 0; e < t->vocab.n + (size_t)t->n_added; e++) {
        const int added = e >= t->vocab.n;
        const int id = added ? t->added[e - t->vocab.n].id : (int)t->vocab.val[e];
        const char *s = added ? t->added[e - t->vocab.n].text : t->vocab.arena + t->vocab.off[e];
        const size_t n = added ? t->added[e - t->vocab.n].len : t->vocab.len[e];
        char *out = malloc(n + 1);
        if (!out) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        free(t->bytes[id]);
        t->bytes_len[id] = (uint32_t)decoded_bytes(s, n, char_byte, out);
        t->bytes[id] = out;
    }
    return DT_OK;
}

/* The PCRE2 settings every pattern shares: newline LF (Oniguruma's . matches all but \n) and a
 * JIT stack that long pieces cannot exhaust. */
static dt_status pcre2_settings(dt_tokenizer *t) {
    t->cctx = pcre2_compile_context_create(NULL);
    t->mctx = pcre2_match_context_create(NULL);
    t->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!t->cctx || !t->mctx || !t->jit_stack || pcre2_set_newline(t->cctx, PCRE2_NEWLINE_LF) != 0)
        return dt_error_set(DT_ERR_NOMEM, "out of memory");
    pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
    return DT_OK;
}

static dt_status load_json(dt_tokenizer *t, const char *path) {
    int fd; /* a regular file only: a FIFO must not block the open (json_load_file would) */
    DT_TRY(dt_file_open_regular(path, DT_ERR_DATA, &fd));
    json_error_t je;
    json_t *root = json_loadfd(fd, 0, &je);
    close(fd);
    if (!root)
        return dt_error_set(DT_ERR_DATA, "%s:%d: not a tokenizer.json: %s", path, je.line, je.text);
    json_t *model = json_object_get(root, "model");
    dt_status st = pcre2_settings(t);
    if (st == DT_OK) st = check_model(t, root, model);
    if (st == DT_OK) st = load_normalizer(t, json_object_get(root, "normalizer"), 0);
    if (st == DT_OK) st = load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"));
    if (st == DT_OK) st = load_vocab(t, json_object_get(model, "vocab"));
    if (st == DT_OK) st = load_merges(t, json_object_get(model, "merges"));
    if (st == DT_OK) st = load_added(t, json_object_get(root, "added_tokens"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (st == DT_OK && unk) t->unk = (int)vocab_id(t, unk, strlen(unk));
    json_decref(root);
    if (st == DT_OK) st = build_tables(t);
    return st;
}

dt_status dt_tokenizer_open(const char *spec, dt_tokenizer **out) {
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    snprintf(t->name, sizeof t->name, "%s", spec);
    t->eot = t->unk = -1;
    t->norm_below = 0xCC;
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
    for (int i = 0; i < MAX_STEPS; i++) {
        pcre2_match_data_free(t->steps[i].md); /* both accept NULL */
        pcre2_code_free(t->steps[i].re);
        pcre2_code_free(t->steps[i].re_new);
    }
    pcre2_match_data_free(t->word_md);
    pcre2_code_free(t->word_re);
    pcre2_compile_context_free(t->cctx);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jit_stack);
    free(t->norm);
    free(t->held);
    free(t->guarded);
    free(t->cache_ids);
    free(t->sym);
    free(t->prev);
    free(t->next);
    free(t->heap);
    free(t->scratch);
    free(t->word_chars);
    free(t);
}

dt_status dt_tokenizer_check_model(const dt_tokenizer *tok, int vocab_size, int num_labels) {
    if (tok && !tok->bpe) tok = NULL; /* the byte tokenizer, opened as "bytes" */
    const int cls = num_labels >= 2, ids = tok ? dt_tokenizer_vocab_size(tok) : 256;
    if (!tok && cls && vocab_size < DT_CLS_TOKEN + 1)
        return dt_error_set(DT_ERR_CONFIG,
                            "model.vocab_size: %d is too small for tsv data: the byte tokenizer "
                            "needs >= %d (256 bytes + <cls>)",
                            vocab_size, DT_CLS_TOKEN + 1);
    if (!tok) return DT_OK; /* a language model's byte shards: each token is checked as it is read */
    if (vocab_size < ids)
        return dt_error_set(DT_ERR_CONFIG, "model.vocab_size: %d is smaller than the %d ids of data.tokenizer %s "
                            "(hint: model.vocab_size: %d)", vocab_size, ids, dt_tokenizer_name(tok), ids);
    if (cls && dt_tokenizer_eot(tok) < 0)
        return dt_error_set(DT_ERR_CONFIG, "data.tokenizer %s has no end-of-text token to pad classification texts "
                            "with (<|endoftext|>, or one special added token)", dt_tokenizer_name(tok));
    if (cls && ids > 65536)
        return dt_error_set(DT_ERR_CONFIG, "data.tokenizer %s: %d ids; classification texts hold ids below 65536",
                            dt_tokenizer_name(tok), ids);
    return DT_OK;
}

int dt_tokenizer_vocab_size(const dt_tokenizer *t) { return t->vocab_size; }
int dt_tokenizer_eot(const dt_tokenizer *t) { return t->eot; }
const char *dt_tokenizer_name(const dt_tokenizer *t) { return t->name; }

int dt_tokenizer_token_id(dt_tokenizer *t, const char *text) {
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    const int id = text && dt_tokenizer_encode(t, text, strlen(text), &ids, &n, &cap) == DT_OK && n == 1 ? (int)ids[0] : -1;
    free(ids);
    return id;
}

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

static int in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n) {
    for (size_t i = 0; i < n && r[i][0] <= cp; i++)
        if (cp <= r[i][1]) return 1;
    return 0;
}

/* The offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code
 * points past U+10FFFF included), or len; *since_14: whether the text holds a letter or number of
 * LETTERS_SINCE_14 or NUMBERS_SINCE_14 (all at U+1C89 or past it: lead bytes 0xE1 and up). */
static size_t utf8_invalid_at(const unsigned char *s, size_t len, int *since_14) {
    *since_14 = 0;
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
        if (c >= 0xE1 && !*since_14) {
            size_t l;
            const uint32_t cp = utf8_at((const char *)s, i, &l);
            *since_14 = in_ranges(cp, LETTERS_SINCE_14, N_LETTERS_SINCE_14) ||
                        in_ranges(cp, NUMBERS_SINCE_14, N_NUMBERS_SINCE_14);
        }
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
        if ((v & 0xFF) == 0) return DT_OK; /* a word of no ids: cache_ids may still be NULL */
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
    if (t->ignore_merges && len <= t->max_key_len) { /* the whole word, when the vocabulary has it */
        size_t m = 0;
        for (size_t i = 0; i < len && m <= t->max_key_len; i++)
            m += put_utf8(t->word_chars + m, byte_char((unsigned char)w[i]));
        long id = m <= t->max_key_len ? vocab_id(t, t->word_chars, m) : -1;
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
        if (k) memcpy(t->cache_ids + t->cache_ids_len, t->sym, k * sizeof *t->sym); /* no symbols: no pointer arithmetic on NULL */
        if (strmap_add(&t->cache, w, len, (int64_t)t->cache_ids_len << 8 | (int64_t)k) < 0)
            return dt_error_set(DT_ERR_NOMEM, "out of memory");
        t->cache_ids_len += k;
    }
    return push(ids, n, cap, t->sym, k);
}

/* ---- pre-tokenization ---- */

/* The piece a step is building from consecutive spans (a match, or the text between two). */
typedef struct piece_run {
    size_t start, end;
    int have;       /* a piece is pending */
    int match;      /* Contiguous: its spans' kind; MergedWithNext: a lone match, which takes the span after it */
    int prev_match; /* the last span's kind */
} piece_run;

static dt_status pre_tokenize(dt_tokenizer *t, int k, const char *s, size_t len, uint32_t **ids, size_t *n,
                              size_t *cap);

/* A piece step k completed (never empty): to step k + 1, or to BPE after the last step. */
static inline dt_status next_step(dt_tokenizer *t, int k, const char *s, size_t len, uint32_t **ids, size_t *n,
                                  size_t *cap) {
    return k + 1 == t->n_steps ? encode_word(t, s, len, ids, n, cap) : pre_tokenize(t, k + 1, s, len, ids, n, cap);
}

/* Step k's next span s[a..b), a match or not (after invert): a piece of its own, dropped,
 * or joined to the pending piece, as tokenizers' NormalizedString::split does with the
 * behaviour; a completed piece goes on to step k + 1. */
static inline dt_status piece_span(dt_tokenizer *t, int k, piece_run *r, const char *s, size_t a, size_t b, int match,
                                   uint32_t **ids, size_t *n, size_t *cap) {
    const int bh = t->steps[k].behavior;
    if (bh == SPLIT_ISOLATED) return next_step(t, k, s + a, b - a, ids, n, cap);
    if (bh == SPLIT_REMOVED) return match ? DT_OK : next_step(t, k, s + a, b - a, ids, n, cap);
    const int join = r->have && (bh == SPLIT_CONTIGUOUS    ? r->match == match
                                 : bh == SPLIT_MERGED_PREV ? match && !r->prev_match
                                                           : r->match && !match);
    r->prev_match = match;
    if (join) {
        r->end = b;
        if (bh == SPLIT_MERGED_NEXT) r->match = 0;
        return DT_OK;
    }
    if (r->have) DT_TRY(next_step(t, k, s + r->start, r->end - r->start, ids, n, cap));
    *r = (piece_run){a, b, 1, match, match};
    return DT_OK;
}

/* s with a space before it, in t->scratch. */
static dt_status with_prefix_space(dt_tokenizer *t, const char **s, size_t *len) {
    if (*len + 1 > t->scratch_cap) {
        char *p = realloc(t->scratch, *len + 1);
        if (!p) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        t->scratch = p;
        t->scratch_cap = *len + 1;
    }
    t->scratch[0] = ' ';
    memcpy(t->scratch + 1, *s, *len);
    *s = t->scratch;
    *len += 1;
    return DT_OK;
}

static dt_status match_failed(const dt_tokenizer *t, int k, int rc) {
    PCRE2_UCHAR msg[256];
    if (rc >= 0) snprintf((char *)msg, sizeof msg, "a match of no characters");
    else pcre2_get_error_message(rc, msg, sizeof msg);
    return dt_error_set(DT_ERR_DATA, "%s: pre-tokenizer step %d: the pattern failed on the text: %s", t->name, k + 1,
                        (const char *)msg);
}

/* Pre-tokenizes s[0..len) from step k on: step k's pieces go to step k + 1, the last step's to
 * BPE. A step runs its pattern over the piece alone (lookarounds stop at its ends, as in
 * tokenizers, where each piece is a string of its own). */
static dt_status pre_tokenize(dt_tokenizer *t, int k, const char *s, size_t len, uint32_t **ids, size_t *n,
                              size_t *cap) {
    if (len == 0) return DT_OK;
    if (k == t->n_steps) return encode_word(t, s, len, ids, n, cap);
    const pre_step *st = &t->steps[k];
    if (st->prefix_space && s[0] != ' ') DT_TRY(with_prefix_space(t, &s, &len)); /* ByteLevel: the last step */
    if (!st->re) return next_step(t, k, s, len, ids, n, cap);
    const pcre2_code *re = t->use_new && st->re_new ? st->re_new : st->re;
    piece_run r = {0};
    size_t at = 0;
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    while (at < len) {
        const int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, st->md, t->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0 || ov[0] < at || ov[1] <= ov[0]) return match_failed(t, k, rc);
        if (st->behavior == SPLIT_ISOLATED) { /* every span a piece (GPT-2's one step) */
            if (ov[0] > at) DT_TRY(next_step(t, k, s + at, ov[0] - at, ids, n, cap));
            DT_TRY(next_step(t, k, s + ov[0], ov[1] - ov[0], ids, n, cap));
        } else {
            if (ov[0] > at) DT_TRY(piece_span(t, k, &r, s, at, ov[0], st->invert, ids, n, cap));
            DT_TRY(piece_span(t, k, &r, s, ov[0], ov[1], !st->invert, ids, n, cap));
        }
        at = ov[1];
    }
    if (at < len) DT_TRY(piece_span(t, k, &r, s, at, len, st->invert, ids, n, cap));
    return r.have ? next_step(t, k, s + r.start, r.end - r.start, ids, n, cap) : DT_OK;
}

/* ---- added tokens ---- */

/* Where the white space that ends s[0..i) starts (lstrip). */
static size_t white_space_before(const char *s, size_t i) {
    while (i > 0) {
        size_t j = i - 1, l;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (!is_white_space(utf8_at(s, j, &l))) break;
        i = j;
    }
    return i;
}

/* Where the white space that starts s[i..len) ends (rstrip). */
static size_t white_space_after(const char *s, size_t len, size_t i) {
    size_t l;
    while (i < len && is_white_space(utf8_at(s, i, &l))) i += l;
    return i;
}

/* single_word: no word character (Rust regex's \w) just before s[a] or at s[b]. */
static int single_word_at(const dt_tokenizer *t, const char *s, size_t len, size_t a, size_t b) {
    if (a > 0) {
        size_t j = a - 1;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (pcre2_match(t->word_re, (PCRE2_SPTR)s, len, j, PCRE2_NO_UTF_CHECK, t->word_md, NULL) >= 0) return 0;
    }
    return b == len || pcre2_match(t->word_re, (PCRE2_SPTR)s, len, b, PCRE2_NO_UTF_CHECK, t->word_md, NULL) < 0;
}

/* The longest added token of the pass that starts at s[0..len), or NULL. */
static const struct added *added_at(const dt_tokenizer *t, int pass, const char *s, size_t len) {
    const struct added *best = NULL;
    for (int i = 0; i < t->n_added; i++) {
        const struct added *a = &t->added[i];
        if (a->normalized == pass && a->len <= len && (!best || a->len > best->len) && memcmp(s, a->text, a->len) == 0)
            best = a;
    }
    return best;
}

typedef struct added_match {
    size_t start, stop; /* the token's span, its white space included (lstrip, rstrip) */
    size_t next;        /* where the search goes on: the end of what matched */
    uint32_t id;
} added_match;

/* The next added token of the pass in s[from..len) as tokenizers' AddedVocabulary::find_matches
 * takes them: leftmost, then longest; passed over (the search going on after it) when
 * single_word and a word character touches it; lstrip takes the white space before it (not
 * before `done`, where the previous token's span ended), rstrip the white space after it.
 * 0 when there is none. */
static int next_added(const dt_tokenizer *t, int pass, const char *s, size_t len, size_t from, size_t done,
                      added_match *m) {
    if (!t->n_pass[pass]) return 0;
    for (size_t i = from; i < len; i++) {
        if (!t->added_first[pass][(unsigned char)s[i]]) continue;
        const struct added *a = added_at(t, pass, s + i, len - i);
        if (!a) continue;
        if (a->single_word && !single_word_at(t, s, len, i, i + a->len)) {
            i += a->len - 1;
            continue;
        }
        size_t start = i, stop = i + a->len;
        if (a->lstrip) start = white_space_before(s, start);
        if (a->lstrip && start < done) start = done;
        if (a->rstrip) stop = white_space_after(s, len, stop);
        *m = (added_match){start, stop, i + a->len, (uint32_t)a->id};
        return 1;
    }
    return 0;
}

static dt_status split_added(dt_tokenizer *t, int pass, const char *s, size_t len, uint32_t **ids, size_t *n,
                             size_t *cap);

/* Text between added tokens: after pass 0 it is normalized and goes to pass 1; after pass 1,
 * to the pre-tokenizer. */
static dt_status between_added(dt_tokenizer *t, int pass, const char *s, size_t len, uint32_t **ids, size_t *n,
                               size_t *cap) {
    if (pass == 1) return pre_tokenize(t, 0, s, len, ids, n, cap);
    const char *norm;
    size_t norm_len;
    DT_TRY(normalize(t, s, len, &norm, &norm_len));
    return split_added(t, 1, norm, norm_len, ids, n, cap);
}

/* s[0..len) split around the pass's added tokens, each their id, the text between them onward. */
static dt_status split_added(dt_tokenizer *t, int pass, const char *s, size_t len, uint32_t **ids, size_t *n,
                             size_t *cap) {
    size_t done = 0, from = 0;
    added_match m;
    while (from < len && next_added(t, pass, s, len, from, done, &m)) {
        if (done < m.start) DT_TRY(between_added(t, pass, s + done, m.start - done, ids, n, cap));
        DT_TRY(push(ids, n, cap, &m.id, 1));
        done = m.stop;
        from = m.next;
    }
    return done < len ? between_added(t, pass, s + done, len - done, ids, n, cap) : DT_OK;
}

dt_status dt_tokenizer_encode(dt_tokenizer *t, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap) {
    if (!t->bpe) { /* bytes: one id per byte */
        DT_TRY(grow(ids, *n, cap, len));
        for (size_t i = 0; i < len; i++) (*ids)[(*n)++] = (unsigned char)text[i];
        return DT_OK;
    }
    int since_14;
    const size_t bad = utf8_invalid_at((const unsigned char *)text, len, &since_14);
    if (bad < len)
        return dt_error_set(DT_ERR_DATA, "invalid UTF-8 at byte offset %zu (byte 0x%02X): the BPE tokenizer reads UTF-8 "
                            "text", bad, (unsigned char)text[bad]);
    t->use_new = t->has_new && since_14;
    return split_added(t, 0, text, len, ids, n, cap);
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
