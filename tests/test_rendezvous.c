/* test_rendezvous.c — the rendezvous's wire parser and sanitiser (rendezvous.h), on their own:
 *   - dt_rdzv_parse_hello takes the hellos dtrain sends (with and without a MAC, to rank 0 and
 *     to a ring neighbour) and says where the MAC's text ends;
 *   - it refuses the older form, numbers out of range or with signs, short or long digests,
 *     nonces and MACs, host names with spaces or escapes, a nonce without a MAC, anything after
 *     the MAC, and a line cut anywhere;
 *   - dt_rdzv_sanitize replaces control characters, ESC, DEL and bytes >= 0x80, and cuts long
 *     text with "...";
 *   - dt_rdzv_listen_addr binds loopback only for a loopback MASTER_ADDR literal or "localhost",
 *     every address (with a note) for a name that resolves to loopback here (127.0.1.1), an
 *     unset or unresolvable one, else the address; dt_rdzv_ring_listen_addr likewise. */
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

static void test_listen_addr(void) {
    static const struct {
        const char *addr;
        int resolved;
        uint32_t ip, want;
        const char *why; /* a word of the note, or NULL: none */
    } rows[] = {
        {"127.0.0.1", 0, 0, 0x7f000001u, NULL},
        {"127.0.0.2", 0, 0, 0x7f000002u, NULL},
        {"localhost", 1, 0x7f000001u, 0x7f000001u, NULL},
        {"LOCALHOST", 0, 0, 0x7f000001u, NULL},
        {"node1", 1, 0x7f000101u, 0, "loopback"}, /* Debian: the host name is 127.0.1.1 */
        {"node1", 1, 0x7f000001u, 0, "loopback"},
        {"127.1", 1, 0x7f000001u, 0, "loopback"}, /* not a dotted quad: a name */
        {"node1", 1, 0x0a000005u, 0x0a000005u, NULL},
        {"10.0.0.5", 1, 0x0a000005u, 0x0a000005u, NULL},
        {"node1", 0, 0, 0, "resolve"},
        {"", 0, 0, 0, "not set"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *why = "unset";
        uint32_t got = dt_rdzv_listen_addr(rows[i].addr, rows[i].resolved, rows[i].ip, &why);
        printf("listen: \"%s\" -> %08x (%s)\n", rows[i].addr, got, why ? why : "no note");
        CHECK_INT_EQ(got, rows[i].want);
        if (rows[i].why) CHECK(why && strstr(why, rows[i].why));
        else CHECK(why == NULL);
    }
    CHECK_INT_EQ(dt_rdzv_ring_listen_addr("127.0.0.1", 0x7f000001u), 0x7f000001u);
    CHECK_INT_EQ(dt_rdzv_ring_listen_addr("localhost", 0x7f000001u), 0x7f000001u);
    CHECK_INT_EQ(dt_rdzv_ring_listen_addr("node1", 0x7f000101u), 0u);
    CHECK_INT_EQ(dt_rdzv_ring_listen_addr("node1", 0x0a000007u), 0x0a000007u);
}

int main(void) {
    test_listen_addr();
    test_accepts();
    test_refuses();
    test_sanitize();
    TEST_PASS("test_rendezvous");
}
