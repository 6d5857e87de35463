/* check.h — a tiny assertion header for the plain-C tests (after libuv's task.h).
 * Every CHECK prints the expression, both values and the location, then exits 1. */
#ifndef DTRAIN_TEST_CHECK_H
#define DTRAIN_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                              \
    do {                                                                                \
        long long ca_ = (long long)(a), cb_ = (long long)(b);                           \
        if (ca_ != cb_) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__, \
                    __LINE__, #a, #b, ca_, cb_);                                        \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* A dtrain call returns DT_OK, else its message is printed (needs dtrain/status.h) */
#define CHECK_OK(expr)                                                                          \
    do {                                                                                        \
        dt_status st_ = (expr);                                                                 \
        if (st_ != DT_OK) fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, dt_error_msg()); \
        CHECK_INT_EQ(st_, DT_OK);                                                               \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                  \
    do {                                                                                    \
        const char *ca_ = (a), *cb_ = (b);                                                  \
        if (strcmp(ca_, cb_) != 0) {                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s\n  got:      \"%s\"\n  expected: \"%s\"\n", \
                    __FILE__, __LINE__, #a, #b, ca_, cb_);                                  \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                     \
    do {                                                                                    \
        const char *ch_ = (hay), *cn_ = (needle);                                           \
        if (!strstr(ch_, cn_)) {                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: \"%s\" does not contain \"%s\"\n",        \
                    __FILE__, __LINE__, ch_, cn_);                                          \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* |a - b| <= tol * max(|a|, |b|, floor) */
#define CHECK_NEAR_REL(a, b, tol, floor_)                                                    \
    do {                                                                                     \
        double ca_ = (double)(a), cb_ = (double)(b);                                         \
        double scale_ = fmax(fmax(fabs(ca_), fabs(cb_)), (double)(floor_));                  \
        if (!(fabs(ca_ - cb_) <= (tol) * scale_)) {                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s ~ %s (%.9g vs %.9g, rel err %.3g > %g)\n", \
                    __FILE__, __LINE__, #a, #b, ca_, cb_, fabs(ca_ - cb_) / scale_, (double)(tol)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define TEST_PASS(name) do { printf("%s: ok\n", name); return 0; } while (0)

#endif
