/* test_rendezvous.c — the rendezvous's wire parser and sanitiser (rendezvous.h), on their own:
 *   - dt_rdzv_parse_hello takes the hellos dtrain sends (with and without a MAC, to rank 0 and
 *     to a ring neighbour) and says where the MAC's text ends;
 *   - it refuses the older form, numbers out of range or with signs, short or long digests,
 *     nonces and MACs, host names with spaces or escapes, a nonce without a MAC, anything after
 *     the MAC, and a line cut anywhere;
 *   - dt_rdzv_sanitize replaces control characters, ESC, DEL and bytes >= 0x80, and cuts long
 *     text with "...". */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dtrain/rendezvous.h"

#define NONCE "0123456789abcdef0123456789abcdef"
#define MAC "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static void test_accepts(void) {
    dt_rdzv_hello h;
    const char *plain = "DTRAIN-RDZV 2 rank=3 world=4 digest=0a1b2c3d host=node-07.cluster_x data=40123";
    CHECK_OK(dt_rdzv_parse_hello(plain, &h));
    CHECK_INT_EQ(h.ring, 0);
    CHECK_INT_EQ(h.rank, 3);
    CHECK_INT_EQ(h.world, 4);
    CHECK_INT_EQ(h.digest, 0x0a1b2c3du);
    CHECK_STR_EQ(h.host, "node-07.cluster_x");
    CHECK_INT_EQ(h.data_port, 40123);
    CHECK_STR_EQ(h.nonce, "");
    CHECK_STR_EQ(h.mac, "");
    char line[512];
    snprintf(line, sizeof line, "%s nonce=" NONCE " mac=" MAC, plain);
    CHECK_OK(dt_rdzv_parse_hello(line, &h));
    CHECK_STR_EQ(h.nonce, NONCE);
    CHECK_STR_EQ(h.mac, MAC);
    CHECK_INT_EQ(h.signed_len, strlen(plain) + strlen(" nonce=" NONCE));
    CHECK_OK(dt_rdzv_parse_hello("DTRAIN-RING 2 rank=0", &h));
    CHECK_INT_EQ(h.ring, 1);
    CHECK_INT_EQ(h.rank, 0);
    CHECK_OK(dt_rdzv_parse_hello("DTRAIN-RING 2 rank=63 nonce=" NONCE " mac=" MAC, &h));
    CHECK_INT_EQ(h.rank, 63);
    CHECK_INT_EQ(h.signed_len, strlen("DTRAIN-RING 2 rank=63 nonce=" NONCE));
}

static void test_refuses(void) {
    static const char *const bad[] = {
        "",
        "DTRAIN-RDZV 1 rank=1 world=2 digest=00000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 ",
        "DTRAIN-RDZV 2 rank=64 world=2 digest=00000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=-1 world=2 digest=00000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=+1 world=2 digest=00000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=65 digest=00000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=1 digest=00000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=0000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=000000000 host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=0000000G host=h data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host= data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=a\x1b[2J data=1",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=0",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=65536",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=999999",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=" NONCE,
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=0123 mac=" MAC,
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=" NONCE " mac=0011",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=" NONCE " mac=" MAC " x",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=" NONCE " mac=" MAC "0",
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 mac=" MAC,
        "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=0123456789ABCDEF0123456789ABCDEF mac=" MAC,
        "DTRAIN-RING 2 rank=1 world=2",
        "DTRAIN-RING rank=0",
        "DTRAIN-RING 2  rank=0",
        "dtrain-ring 2 rank=0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_rdzv_hello h;
        dt_status st = dt_rdzv_parse_hello(bad[i], &h);
        if (st != DT_ERR_DATA) printf("accepted: \"%s\"\n", bad[i]);
        CHECK_INT_EQ(st, DT_ERR_DATA);
        CHECK(strstr(dt_error_msg(), "not a dtrain hello") != NULL);
    }
    /* every prefix of a good line but the whole one is refused */
    const char *good = "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1 nonce=" NONCE " mac=" MAC;
    char cut[512];
    for (size_t n = 0; n < strlen(good); n++) {
        snprintf(cut, sizeof cut, "%.*s", (int)n, good);
        dt_rdzv_hello h;
        int ok = dt_rdzv_parse_hello(cut, &h) == DT_OK;
        /* the line without its nonce and MAC is a hello without a secret */
        CHECK(!ok || n == strlen("DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=h data=1"));
    }
}

static void test_sanitize(void) {
    char out[64];
    dt_rdzv_sanitize("evil \x1b[2J\x1b]0;title\x07 done\r\n\x7f\xc3\xa9", out, sizeof out);
    CHECK_STR_EQ(out, "evil ?[2J?]0;title? done?????");
    dt_rdzv_sanitize("plain text: 1..3", out, sizeof out);
    CHECK_STR_EQ(out, "plain text: 1..3");
    char longer[200];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    dt_rdzv_sanitize(longer, out, 16);
    CHECK_STR_EQ(out, "xxxxxxxxxxxx...");
    dt_rdzv_sanitize("", out, sizeof out);
    CHECK_STR_EQ(out, "");
}

int main(void) {
    test_accepts();
    test_refuses();
    test_sanitize();
    TEST_PASS("test_rendezvous");
}
