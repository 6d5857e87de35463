/* rdzv_auth.c — the shared secret, the challenge-response and the handshake hub of the
 * rendezvous (src/comm/rdzv_auth.h), and the hello parser and sanitiser of rendezvous.h.
 * HMAC-SHA256, the nonces and the constant-time comparison are OpenSSL's (libcrypto). */
#include "rdzv_auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/clock.h"

/* ------------------------------------------------------------------ the secret */

static dt_status secret_file(const char *path, rdzv_secret *s) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return dt_error_set(DT_ERR_USAGE, "environment: DTRAIN_RDZV_SECRET_FILE=%s: cannot open it: %s", path,
                            strerror(errno));
    struct stat st;
    dt_status bad = DT_OK;
    if (fstat(fd, &st) != 0)
        bad = dt_error_set(DT_ERR_USAGE, "environment: DTRAIN_RDZV_SECRET_FILE=%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        bad = dt_error_set(DT_ERR_USAGE, "environment: DTRAIN_RDZV_SECRET_FILE=%s: expected a regular file", path);
    else if (st.st_uid != geteuid())
        bad = dt_error_set(DT_ERR_USAGE,
                           "environment: DTRAIN_RDZV_SECRET_FILE=%s: owned by uid %ld, expected this user's (uid %ld)",
                           path, (long)st.st_uid, (long)geteuid());
    else if (st.st_mode & (S_IRWXG | S_IRWXO))
        bad = dt_error_set(DT_ERR_USAGE,
                           "environment: DTRAIN_RDZV_SECRET_FILE=%s: mode %04o lets group or others at it, expected "
                           "0600 or 0400 (hint: chmod 600 %s)",
                           path, (unsigned)(st.st_mode & 07777), path);
    size_t k = 0;
    while (bad == DT_OK && k <= RDZV_SECRET_MAX) {
        unsigned char buf[256];
        ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            bad = dt_error_set(DT_ERR_USAGE, "environment: DTRAIN_RDZV_SECRET_FILE=%s: %s", path, strerror(errno));
        if (got <= 0) break;
        size_t take = k + (size_t)got > RDZV_SECRET_MAX ? RDZV_SECRET_MAX - k : (size_t)got;
        memcpy(s->key + k, buf, take);
        OPENSSL_cleanse(buf, sizeof buf);
        if (take < (size_t)got) k = RDZV_SECRET_MAX + 1;
        else k += take;
    }
    close(fd);
    if (bad == DT_OK && k > RDZV_SECRET_MAX)
        bad = dt_error_set(DT_ERR_USAGE, "environment: DTRAIN_RDZV_SECRET_FILE=%s: longer than %d bytes", path,
                           RDZV_SECRET_MAX);
    s->len = bad == DT_OK ? k : 0;
    return bad;
}

dt_status rdzv_secret_load(rdzv_secret *s) {
    memset(s, 0, sizeof *s);
    const char *v = getenv("DTRAIN_RDZV_SECRET"), *file = getenv("DTRAIN_RDZV_SECRET_FILE");
    /* set but empty is a mistake (a $VAR that did not expand), never "no secret" */
    if (v && !*v)
        return dt_error_set(DT_ERR_USAGE,
                            "environment: DTRAIN_RDZV_SECRET is set but empty (a variable that did not expand?): set it "
                            "to the job's secret on every rank, or unset it to run without one (hint: a random one: "
                            "openssl rand -hex 32)");
    if (file && !*file)
        return dt_error_set(DT_ERR_USAGE,
                            "environment: DTRAIN_RDZV_SECRET_FILE is set but empty (a variable that did not expand?): "
                            "set it to the path of the file that holds the job's secret, or unset it to run without "
                            "one");
    const char *from = file ? file : "DTRAIN_RDZV_SECRET";
    if (v && file)
        return dt_error_set(DT_ERR_USAGE, "environment: set only one of DTRAIN_RDZV_SECRET and DTRAIN_RDZV_SECRET_FILE");
    if (v) {
        size_t n = strlen(v);
        if (n > RDZV_SECRET_MAX)
            return dt_error_set(DT_ERR_USAGE, "environment: DTRAIN_RDZV_SECRET is longer than %d bytes", RDZV_SECRET_MAX);
        memcpy(s->key, v, n);
        s->len = n;
        /* out of the environment (and of /proc/PID/environ), so that no child inherits it:
         * it is read once per process, here */
        OPENSSL_cleanse((char *)v, n);
        unsetenv("DTRAIN_RDZV_SECRET");
    } else if (file) {
        DT_TRY(secret_file(file, s));
    } else {
        return DT_OK;
    }
    while (s->len && (s->key[s->len - 1] == '\n' || s->key[s->len - 1] == '\r' || s->key[s->len - 1] == ' ' ||
                      s->key[s->len - 1] == '\t'))
        s->key[--s->len] = 0; /* a file's final newline is not part of the secret */
    if (s->len < RDZV_SECRET_MIN) {
        rdzv_secret_wipe(s);
        return dt_error_set(DT_ERR_USAGE,
                            "environment: %s%s is shorter than %d characters (hint: a random one: openssl rand -hex 32)",
                            file ? "the secret in DTRAIN_RDZV_SECRET_FILE=" : "", from, RDZV_SECRET_MIN);
    }
    return DT_OK;
}

void rdzv_secret_wipe(rdzv_secret *s) {
    OPENSSL_cleanse(s->key, sizeof s->key);
    s->len = 0;
}

/* ------------------------------------------------------------------ MACs */

static void to_hex(const unsigned char *b, size_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * n] = '\0';
}

dt_status rdzv_nonce(char out[RDZV_NONCE_HEX + 1]) {
    unsigned char b[RDZV_NONCE_HEX / 2];
    if (RAND_bytes(b, (int)sizeof b) != 1) return dt_error_set(DT_ERR_DEVICE, "rendezvous: no random bytes for a nonce");
    to_hex(b, sizeof b, out);
    return DT_OK;
}

static int mac_raw(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *text, size_t len,
                   unsigned char md[32]) {
    char msg[RDZV_LINE + 256];
    int head = snprintf(msg, sizeof msg, "dtrain-rdzv-2 %s\n%s\n%s\n", role, ns, nc);
    if (head < 0 || (size_t)head + len > sizeof msg) return 0;
    memcpy(msg + head, text, len);
    unsigned int mdlen = 0;
    int ok = HMAC(EVP_sha256(), s->key, (int)s->len, (const unsigned char *)msg, (size_t)head + len, md, &mdlen) != NULL &&
             mdlen == 32;
    OPENSSL_cleanse(msg, sizeof msg);
    return ok;
}

dt_status rdzv_mac(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *text, size_t len,
                   char out[RDZV_MAC_HEX + 1]) {
    unsigned char md[32];
    if (!mac_raw(s, role, ns, nc, text, len, md)) return dt_error_set(DT_ERR_DEVICE, "rendezvous: HMAC-SHA256 failed");
    to_hex(md, sizeof md, out);
    return DT_OK;
}

int rdzv_mac_ok(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *text, size_t len,
                const char *mac_hex) {
    char want[RDZV_MAC_HEX + 1];
    if (strlen(mac_hex) != RDZV_MAC_HEX || rdzv_mac(s, role, ns, nc, text, len, want) != DT_OK) return 0;
    return CRYPTO_memcmp(want, mac_hex, RDZV_MAC_HEX) == 0;
}

/* ------------------------------------------------------------------ the greeting and the proof */

void rdzv_greeting(const rdzv_secret *s, const char *nonce, char *out, size_t n) {
    if (s->len) snprintf(out, n, "DTRAIN-AUTH 2 hmac-sha256 nonce=%s", nonce);
    else snprintf(out, n, "DTRAIN-AUTH 2 open");
}

static int all_hex(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return 0;
    return 1;
}

dt_status rdzv_read_greeting(const rdzv_secret *s, const char *line, const char *who, int rank,
                             char ns[RDZV_NONCE_HEX + 1]) {
    char clean[600];
    ns[0] = '\0';
    if (strncmp(line, "ERR ", 4) == 0) {
        dt_rdzv_sanitize(line + 4, clean, sizeof clean);
        return dt_error_set(DT_ERR_USAGE, "rendezvous: %s refused rank %d: %s", who, rank, clean);
    }
    const char *open_ = "DTRAIN-AUTH 2 open", *hmac = "DTRAIN-AUTH 2 hmac-sha256 nonce=";
    int is_open = strcmp(line, open_) == 0;
    int is_hmac = strncmp(line, hmac, strlen(hmac)) == 0 && strlen(line + strlen(hmac)) == RDZV_NONCE_HEX &&
                  all_hex(line + strlen(hmac), RDZV_NONCE_HEX);
    if (!is_open && !is_hmac) {
        dt_rdzv_sanitize(line, clean, 120);
        return dt_error_set(DT_ERR_DEVICE,
                            "rendezvous: %s does not speak dtrain's rendezvous (it said \"%s\"; hint: another program "
                            "on that port, or another dtrain version?)",
                            who, clean);
    }
    if (is_hmac && !s->len)
        return dt_error_set(DT_ERR_USAGE,
                            "rendezvous: %s requires the shared secret, and rank %d has none (hint: set "
                            "DTRAIN_RDZV_SECRET or DTRAIN_RDZV_SECRET_FILE to the same secret on every rank)",
                            who, rank);
    if (is_open && s->len)
        return dt_error_set(DT_ERR_USAGE,
                            "rendezvous: %s runs without a shared secret, but rank %d has one (hint: set "
                            "DTRAIN_RDZV_SECRET or DTRAIN_RDZV_SECRET_FILE on every rank, rank 0 included)",
                            who, rank);
    if (is_hmac) snprintf(ns, RDZV_NONCE_HEX + 1, "%s", line + strlen(hmac));
    return DT_OK;
}

dt_status rdzv_check_proof(const rdzv_secret *s, const char *role, const char *ns, const char *nc, const char *hello,
                           const char *line, const char *who, int rank) {
    char clean[600];
    if (strncmp(line, "ERR ", 4) == 0) {
        dt_rdzv_sanitize(line + 4, clean, sizeof clean);
        int auth = strcmp(line + 4, "authentication failed") == 0;
        return dt_error_set(DT_ERR_USAGE, "rendezvous: %s refused rank %d: %s%s", who, rank, clean,
                            auth ? " (hint: DTRAIN_RDZV_SECRET or DTRAIN_RDZV_SECRET_FILE must hold the same secret on "
                                   "every rank)"
                                 : "");
    }
    if (strncmp(line, "AUTH mac=", 9) != 0 || !rdzv_mac_ok(s, role, ns, nc, hello, strlen(hello), line + 9))
        return dt_error_set(DT_ERR_USAGE,
                            "rendezvous: %s did not prove that it knows the shared secret (hint: another "
                            "DTRAIN_RDZV_SECRET there, or not the job's rank at all)",
                            who);
    return DT_OK;
}

/* ------------------------------------------------------------------ the hello */

/* "KEY=" at *p and a value of 1..max characters accepted by ok(), up to ' ' or the end */
static int field(const char **p, const char *key, char *val, size_t max, int (*ok)(int c)) {
    size_t kl = strlen(key), n = 0;
    if (strncmp(*p, key, kl) != 0) return 0;
    const char *v = *p + kl;
    while (v[n] && v[n] != ' ') {
        if (n >= max || !ok((unsigned char)v[n])) return 0;
        val[n] = v[n];
        n++;
    }
    if (n == 0) return 0;
    val[n] = '\0';
    *p = v + n;
    return 1;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_hexc(int c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }
static int is_hostc(int c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '-' || c == '_';
}

/* " KEY=N" with lo <= N <= hi (at most 5 digits, no sign) */
static int num_field(const char **p, const char *key, int lo, int hi, int *out) {
    char v[8];
    if (**p != ' ') return 0;
    (*p)++;
    if (!field(p, key, v, 5, is_digit)) return 0;
    int x = atoi(v);
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

static dt_status bad_hello(const char *what) {
    return dt_error_set(DT_ERR_DATA, "not a dtrain hello: %s", what);
}

dt_status dt_rdzv_parse_hello(const char *line, dt_rdzv_hello *h) {
    memset(h, 0, sizeof *h);
    const char *p = line;
    if (strncmp(p, "DTRAIN-RING 2", 13) == 0) h->ring = 1;
    else if (strncmp(p, "DTRAIN-RDZV 2", 13) != 0) return bad_hello("expected \"DTRAIN-RDZV 2\" or \"DTRAIN-RING 2\"");
    p += 13;
    if (!num_field(&p, "rank=", 0, DT_MAX_WORLD - 1, &h->rank)) return bad_hello("expected rank=0..63");
    if (!h->ring) {
        char dg[16];
        if (!num_field(&p, "world=", 2, DT_MAX_WORLD, &h->world)) return bad_hello("expected world=2..64");
        if (*p++ != ' ' || !field(&p, "digest=", dg, 8, is_hexc) || strlen(dg) != 8)
            return bad_hello("expected digest= and 8 hex digits");
        h->digest = (uint32_t)strtoul(dg, NULL, 16);
        if (*p++ != ' ' || !field(&p, "host=", h->host, sizeof h->host - 1, is_hostc))
            return bad_hello("expected host= and a host name");
        if (!num_field(&p, "data=", 1, 65535, &h->data_port)) return bad_hello("expected data=1..65535");
    }
    if (*p == '\0') return DT_OK;
    if (*p++ != ' ' || !field(&p, "nonce=", h->nonce, 32, is_hexc) || strlen(h->nonce) != 32)
        return bad_hello("expected the end of the line, or nonce= and 32 hex digits");
    h->signed_len = (size_t)(p - line);
    if (*p++ != ' ' || !field(&p, "mac=", h->mac, 64, is_hexc) || strlen(h->mac) != 64 || *p != '\0') {
        h->nonce[0] = h->mac[0] = '\0';
        return bad_hello("expected mac= and 64 hex digits at the end of the line");
    }
    return DT_OK;
}

void dt_rdzv_sanitize(const char *in, char *out, size_t n) {
    if (n == 0) return;
    size_t k = 0, i = 0;
    for (; in[i] && k + 1 < n; i++) out[k++] = (unsigned char)in[i] >= 0x20 && (unsigned char)in[i] < 0x7f ? in[i] : '?';
    out[k] = '\0';
    if (in[i] && n >= 4) memcpy(out + n - 4, "...", 4);
}

/* ------------------------------------------------------------------ the hub */

int rdzv_read_line(int fd, char *buf, size_t n, size_t *k) {
    for (;;) {
        char c;
        ssize_t got = recv(fd, &c, 1, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (got <= 0) return -1;
        if (c == '\n') {
            buf[*k] = '\0';
            return 1;
        }
        if (*k + 1 >= n) return -1;
        buf[(*k)++] = c;
    }
}

void rdzv_hub_init(rdzv_hub *h, int lfd, const rdzv_secret *s, const char *what) {
    memset(h, 0, sizeof *h);
    h->lfd = lfd;
    h->secret = s;
    h->what = what;
    int fl = lfd >= 0 ? fcntl(lfd, F_GETFL) : -1;
    if (fl >= 0) fcntl(lfd, F_SETFL, fl | O_NONBLOCK); /* accept until the backlog is empty */
}

static void remove_at(rdzv_hub *h, int i) {
    h->p[i] = h->p[h->n - 1];
    h->n--;
}

int rdzv_hub_take(rdzv_hub *h, int i) {
    int fd = h->p[i].fd;
    remove_at(h, i);
    return fd;
}

void rdzv_hub_log(rdzv_hub *h, const char *verb, const char *peer, const char *why) {
    if (h->logged < 5) {
        char clean[300];
        dt_rdzv_sanitize(why, clean, sizeof clean);
        fprintf(stderr, "dtrain: %s: %s a connection from %s: %s\n", h->what, verb, peer, clean);
    } else if (h->logged == 5) {
        fprintf(stderr, "dtrain: %s: turning away or dropping more connections (not logged)\n", h->what);
    }
    h->logged++;
}

void rdzv_hub_drop(rdzv_hub *h, int i, const char *tell, const char *why) {
    rdzv_pend *p = &h->p[i];
    if (tell) {
        char line[128];
        int n = snprintf(line, sizeof line, "ERR %s\n", tell);
        ssize_t sent = send(p->fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT); /* it is going anyway */
        (void)sent;
    }
    rdzv_hub_log(h, "dropped", p->peer, why);
    close(p->fd);
    remove_at(h, i);
}

int rdzv_hub_victim(const rdzv_hub *h, uint32_t ip) {
    int mine = 0, best = -1, best_n = 0;
    for (int i = 0; i < h->n; i++) mine += h->p[i].ip == ip;
    if (mine < RDZV_HUB_PER_IP && h->n < RDZV_HUB_MAX) return -1;
    for (int i = 0; i < h->n; i++) {
        int n = h->p[i].ip == ip; /* the newcomer counts for its own address */
        for (int j = 0; j < h->n; j++) n += h->p[j].ip == h->p[i].ip;
        if (mine >= RDZV_HUB_PER_IP && h->p[i].ip != ip) continue; /* over the cap: one of its own */
        int own = h->p[i].ip == ip, best_own = best >= 0 && h->p[best].ip == ip;
        int better = best < 0 || n > best_n || (n == best_n && own > best_own) ||
                     (n == best_n && own == best_own && h->p[i].by < h->p[best].by);
        if (better) {
            best = i;
            best_n = n;
        }
    }
    return best;
}

/* one new connection: its greeting, its deadline; someone goes when its address or the hub is
 * full (rdzv_hub_victim). 1 when one was accepted. */
static int hub_accept(rdzv_hub *h) {
    struct sockaddr_in pa;
    socklen_t pl = sizeof pa;
    int c = accept4(h->lfd, (struct sockaddr *)&pa, &pl, SOCK_CLOEXEC);
    if (c < 0) return 0;
    uint32_t ip = pa.sin_family == AF_INET ? pa.sin_addr.s_addr : 0;
    int victim = rdzv_hub_victim(h, ip);
    if (victim >= 0)
        rdzv_hub_drop(h, victim, NULL,
                      h->p[victim].ip == ip ? "too many connections from there waiting to say who they are"
                                            : "too many connections waiting to say who they are");
    rdzv_pend *p = &h->p[h->n];
    memset(p, 0, sizeof *p);
    p->fd = c;
    p->ip = ip;
    p->by = dt_clock_now() + RDZV_HELLO_S;
    char ipt[INET_ADDRSTRLEN] = "?";
    if (pa.sin_family == AF_INET) inet_ntop(AF_INET, &pa.sin_addr, ipt, sizeof ipt);
    snprintf(p->peer, sizeof p->peer, "%s:%d", ipt, ntohs(pa.sin_port));
    char greet[128];
    if (h->secret->len && rdzv_nonce(p->nonce) != DT_OK) {
        close(c);
        return 1;
    }
    rdzv_greeting(h->secret, p->nonce, greet, sizeof greet - 1);
    strcat(greet, "\n");
    h->n++;
    if (send(c, greet, strlen(greet), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)strlen(greet))
        rdzv_hub_drop(h, h->n - 1, NULL, "closed before its greeting was sent");
    return 1;
}

/* why pending connection i goes: it closed, or sent a line too long */
static const char *closed_why(const rdzv_hub *h, int i) {
    if (h->p[i].k + 1 >= sizeof h->p[i].line) return "a line too long";
    if (h->secret->len) return "closed without a hello";
    return "closed without a hello (hint: a rank with a shared secret? set DTRAIN_RDZV_SECRET or "
           "DTRAIN_RDZV_SECRET_FILE on every rank, rank 0 included, or on none)";
}

int rdzv_hub_wait(rdzv_hub *h, double until, int extra) {
    for (;;) {
        double now = dt_clock_now(), wake = until;
        for (int i = h->n - 1; i >= 0; i--)
            if (h->p[i].by <= now) rdzv_hub_drop(h, i, NULL, "said nothing in time");
            else if (h->p[i].by < wake) wake = h->p[i].by;
        if (now >= until) return -1;
        struct pollfd pf[RDZV_HUB_MAX + 2];
        int np = 0;
        for (int i = 0; i < h->n; i++) pf[np++] = (struct pollfd){.fd = h->p[i].fd, .events = POLLIN};
        int li = h->lfd >= 0 ? np : -1, xi = extra >= 0 ? np + (li >= 0) : -1;
        if (li >= 0) pf[np++] = (struct pollfd){.fd = h->lfd, .events = POLLIN};
        if (xi >= 0) pf[np++] = (struct pollfd){.fd = extra, .events = POLLIN};
        double left = wake - now;
        int r = poll(pf, (nfds_t)np, !(left > 0) ? 0 : left > 3600 ? 3600 * 1000 : (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            dt_error_set(DT_ERR_DEVICE, "%s: poll failed: %s", h->what, strerror(errno));
            return -3;
        }
        if (r == 0) continue;
        if (xi >= 0 && pf[xi].revents) return -2;
        for (int i = h->n - 1; i >= 0; i--) {
            if (!pf[i].revents) continue;
            int got = rdzv_read_line(h->p[i].fd, h->p[i].line, sizeof h->p[i].line, &h->p[i].k);
            if (got == 1) return i;
            if (got < 0) rdzv_hub_drop(h, i, NULL, closed_why(h, i));
        }
        /* the whole backlog at once: a flood gets no head start on the connections queued behind it */
        if (li >= 0 && pf[li].revents)
            for (int k = 0; k < 4 * RDZV_HUB_MAX && hub_accept(h); k++) {
            }
    }
}

void rdzv_hub_close(rdzv_hub *h) {
    for (int i = 0; i < h->n; i++) close(h->p[i].fd);
    h->n = 0;
}
