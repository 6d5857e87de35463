/* rdzv_auth.h — inside the rendezvous module (rendezvous.c, rdzv_auth.c): the shared secret,
 * the challenge-response every rendezvous and ring connection starts with, and the hub that
 * serves the connections still saying who they are, all at once, each with its own deadline.
 *
 * The accepting side speaks first, on every connection:
 *   "DTRAIN-AUTH 2 hmac-sha256 nonce=NS"  with a shared secret (NS: 16 random bytes, hex)
 *   "DTRAIN-AUTH 2 open"                  without one
 * The connecting side answers with its hello (dt_rdzv_parse_hello) ending, with a secret, in
 * " nonce=NC mac=M", M = HMAC-SHA256(secret, ROLE "\n" NS "\n" NC "\n" hello-before-" mac=");
 * the accepting side checks M and proves that it knows the secret too: "AUTH mac=M2", M2 the
 * same over the peer ROLE. Both nonces and the whole hello (rank, world, config digest, host,
 * port) are under both MACs, so neither answer can be replayed on another connection. */
#ifndef DTRAIN_RDZV_AUTH_H
#define DTRAIN_RDZV_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/rendezvous.h"
#include "dtrain/status.h"

#define RDZV_SECRET_MAX 4096
#define RDZV_SECRET_MIN 16
#define RDZV_NONCE_HEX 32
#define RDZV_MAC_HEX 64
#define RDZV_LINE 1024
#define RDZV_HUB_MAX 32      /* connections waiting to say who they are */
#define RDZV_HUB_PER_IP 4    /* of them from one source address */
#define RDZV_HELLO_S 10.0    /* each gets this long */

typedef struct rdzv_secret {
    size_t len; /* 0: none */
    unsigned char key[RDZV_SECRET_MAX];
} rdzv_secret;

/* From DTRAIN_RDZV_SECRET (then wiped and removed from the environment) or the file
 * DTRAIN_RDZV_SECRET_FILE names (a regular file of this user that group and others cannot
 * read); len 0 when neither is set. DT_ERR_USAGE naming the
 * variable or the file otherwise, also when one is set but empty (a $VAR that did not expand). The secret itself is never in a message. */
dt_status rdzv_secret_load(rdzv_secret *s);
void rdzv_secret_wipe(rdzv_secret *s);

/* RDZV_NONCE_HEX hex digits of fresh randomness; DT_ERR_DEVICE when none could be had */
dt_status rdzv_nonce(char out[RDZV_NONCE_HEX + 1]);
/* HMAC-SHA256(secret, role \n ns \n nc \n text[0..len)) as hex */
dt_status rdzv_mac(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *text, size_t len,
                   char out[RDZV_MAC_HEX + 1]);
/* 1 when mac_hex is that MAC (compared in constant time), else 0 */
int rdzv_mac_ok(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *text, size_t len,
                const char *mac_hex);

/* The greeting the accepting side sends (`nonce` "" without a secret). */
void rdzv_greeting(const rdzv_secret *s, const char *nonce, char *out, size_t n);
/* The connecting side reads it: the nonce into ns ("" for "open"); DT_ERR_USAGE when one side
 * has a secret and the other has none, or rank 0 refused us ("ERR ..."); DT_ERR_DEVICE for
 * anything else. `who` names the other side for the messages ("rank 0"), `rank` this one. */
dt_status rdzv_read_greeting(const rdzv_secret *s, const char *line, const char *who, int rank,
                             char ns[RDZV_NONCE_HEX + 1]);
/* The "AUTH mac=M" proof in `line` for the hello `hello` (the accepting side's `role`). */
dt_status rdzv_check_proof(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *hello,
                           const char *line, const char *who, int rank);

/* Reads what has arrived on fd (never blocking) into buf: 1 once a whole line is there (without
 * its newline, NUL-terminated), 0 when more is to come, -1 when the peer closed or the line
 * is longer than n - 1. *k is the number of bytes in buf so far. */
int rdzv_read_line(int fd, char *buf, size_t n, size_t *k);

typedef struct rdzv_pend {
    int fd;
    double by;                    /* it says who it is by then, or is dropped */
    size_t k;
    uint32_t ip;                  /* its source address (network order) */
    char nonce[RDZV_NONCE_HEX + 1]; /* the challenge it got ("" without a secret) */
    char peer[64];                /* "IP:PORT", for the log */
    char line[RDZV_LINE];
} rdzv_pend;

typedef struct rdzv_hub {
    const rdzv_secret *secret;
    const char *what;  /* "rendezvous", "ring": the log's prefix */
    int lfd, n;
    int logged;        /* drops logged so far (a few, then one line saying the rest are not) */
    rdzv_pend p[RDZV_HUB_MAX];
} rdzv_hub;

/* lfd (may be -1) is made non-blocking */
void rdzv_hub_init(rdzv_hub *h, int lfd, const rdzv_secret *s, const char *what);
/* Accepts connections on the listener (each gets its greeting) and reads the pending ones,
 * dropping those that close, send too much or say nothing in time, until one has sent a whole
 * line (returns its index: the line is in p[i].line), `extra` (>= 0) is readable (-2),
 * `until` (-1), or poll() failed (-3, with the error set). At most RDZV_HUB_PER_IP wait from
 * one source address (a newcomer pushes out the oldest of its own); when the hub is full a
 * newcomer pushes out the oldest connection of the address holding the most, so that a flood
 * from a few addresses never pushes out the one connection of another. */
int rdzv_hub_wait(rdzv_hub *h, double until, int extra);
/* Takes connection i out of the hub (now the caller's); returns its fd. */
int rdzv_hub_take(rdzv_hub *h, int i);
/* Closes connection i after sending `tell` (a fixed text, may be NULL); logs `why` (sanitised)
 * for the first few. */
void rdzv_hub_drop(rdzv_hub *h, int i, const char *tell, const char *why);
void rdzv_hub_close(rdzv_hub *h);
/* One log line "dtrain: WHAT: VERB a connection from PEER: WHY" (why sanitised), counted with
 * the drops: the first few, then one saying that the rest are not logged. */
void rdzv_hub_log(rdzv_hub *h, const char *verb, const char *peer, const char *why);
/* The index of the pending connection a newcomer from `ip` pushes out, or -1 (room for it). */
int rdzv_hub_victim(const rdzv_hub *h, uint32_t ip);

#endif
