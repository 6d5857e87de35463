/* fuzz_rendezvous.c — the rendezvous wire parser (dt_rdzv_parse_hello) and the sanitiser of
 * remote text (dt_rdzv_sanitize), on arbitrary bytes from the network.
 *
 * Input: byte 0 picks the sanitiser's buffer size (1..256); the rest, up to its first NUL, is
 * one line as a peer would send it. Checked besides the sanitizers:
 *   - a refused line is DT_ERR_DATA with one of the parser's fixed messages (it never quotes
 *     the line);
 *   - an accepted one has its fields in range (rank, world, port, a host name of
 *     [A-Za-z0-9._-], a nonce and mac of 32 and 64 hex digits or none, signed_len ending
 *     where " mac=" starts), and the line written back from the fields parses to the same;
 *   - the sanitised text is printable ASCII only and fits its buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/rendezvous.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static int all_of(const char *s, const char *set) { return strspn(s, set) == strlen(s); }

static void check_fields(const char *line, const dt_rdzv_hello *h) {
    FUZZ_ASSERT(h->rank >= 0 && h->rank < DT_MAX_WORLD, "rank %d", h->rank);
    if (!h->ring) {
        FUZZ_ASSERT(h->world >= 2 && h->world <= DT_MAX_WORLD, "world %d", h->world);
        FUZZ_ASSERT(h->data_port >= 1 && h->data_port <= 65535, "data port %d", h->data_port);
        FUZZ_ASSERT(h->host[0] && all_of(h->host, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"),
                    "host \"%s\"", h->host);
    }
    const char *hex = "0123456789abcdefABCDEF";
    FUZZ_ASSERT((!h->nonce[0] && !h->mac[0]) || (strlen(h->nonce) == 32 && strlen(h->mac) == 64), "nonce/mac lengths");
    FUZZ_ASSERT(all_of(h->nonce, hex) && all_of(h->mac, hex), "nonce/mac not hex");
    if (h->mac[0]) {
        FUZZ_ASSERT(h->signed_len < strlen(line) && strncmp(line + h->signed_len, " mac=", 5) == 0,
                    "signed_len %zu does not end before \" mac=\"", h->signed_len);
    }
}

/* The line the fields describe, parsed again, gives the same fields. */
static void check_round_trip(const dt_rdzv_hello *h) {
    char line[1024];
    int k = h->ring ? snprintf(line, sizeof line, "DTRAIN-RING 2 rank=%d", h->rank)
                    : snprintf(line, sizeof line, "DTRAIN-RDZV 2 rank=%d world=%d digest=%08x host=%s data=%d", h->rank,
                               h->world, (unsigned)h->digest, h->host, h->data_port);
    if (h->mac[0]) snprintf(line + k, sizeof line - (size_t)k, " nonce=%s mac=%s", h->nonce, h->mac);
    dt_rdzv_hello b;
    dt_status st = dt_rdzv_parse_hello(line, &b);
    FUZZ_ASSERT(st == DT_OK, "the written-back line \"%s\" is refused: %s", line, dt_error_msg());
    FUZZ_ASSERT(b.ring == h->ring && b.rank == h->rank && b.world == h->world && b.digest == h->digest &&
                    b.data_port == h->data_port && strcmp(b.host, h->host) == 0 && strcmp(b.nonce, h->nonce) == 0 &&
                    strcmp(b.mac, h->mac) == 0,
                "\"%s\" parses to other fields", line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t n = 1 + data[0] % 256;
    char *line = malloc(size);
    memcpy(line, data + 1, size - 1);
    line[size - 1] = '\0';

    dt_rdzv_hello h;
    dt_error_clear();
    dt_status st = dt_rdzv_parse_hello(line, &h);
    if (st == DT_OK) {
        check_fields(line, &h);
        check_round_trip(&h);
    } else {
        FUZZ_ASSERT(st == DT_ERR_DATA && dt_error_msg()[0], "refused with %s and no message", dt_status_str(st));
        const char *msg = dt_error_msg(); /* a fixed text: never what the peer sent */
        FUZZ_ASSERT(strncmp(msg, "not a dtrain hello: expected ", 29) == 0, "message \"%s\"", msg);
        for (const char *q = msg; *q; q++)
            FUZZ_ASSERT((unsigned char)*q >= 0x20 && (unsigned char)*q < 0x7f, "byte 0x%02x in the message",
                        (unsigned char)*q);
    }

    char *out = malloc(n);
    memset(out, 'x', n);
    dt_rdzv_sanitize(line, out, n);
    size_t len = strnlen(out, n);
    FUZZ_ASSERT(len < n, "sanitised text not terminated in its %zu bytes", n);
    for (size_t i = 0; i < len; i++)
        FUZZ_ASSERT((unsigned char)out[i] >= 0x20 && (unsigned char)out[i] < 0x7f, "byte 0x%02x in sanitised text",
                    (unsigned char)out[i]);
    free(out);
    free(line);
    return 0;
}
