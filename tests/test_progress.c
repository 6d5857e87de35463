/* test_progress.c — the progress bar on a real terminal (a pseudo-terminal of 80 columns):
 *   - every redraw fits the terminal: no line is wider than its columns - 1, so nothing wraps
 *     (at 80 columns the bar used to be wider, each redraw leaving a new line, the ETA never
 *     visible);
 *   - it follows the terminal's width as it changes (80 -> 50 columns mid-run);
 *   - it shows elapsed<ETA and this process's rate, and evaluation shows its own progress. */
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

static char out[1 << 22];
static size_t n_out;

/* The widest bar segment (text between \r / \n, the erase-line sequence left out) of out[from..to). */
static int widest_bar(size_t from, size_t to, int *bars) {
    int widest = 0;
    *bars = 0;
    size_t i = from;
    while (i < to) {
        size_t j = i;
        while (j < to && out[j] != '\r' && out[j] != '\n') j++;
        char seg[1024];
        size_t k = 0;
        for (size_t q = i; q < j && k + 1 < sizeof seg; q++) {
            if (out[q] == '\033' && q + 2 < j && out[q + 1] == '[' && out[q + 2] == 'K') {
                q += 2;
                continue;
            }
            seg[k++] = out[q];
        }
        seg[k] = '\0';
        if (strstr(seg, "step/s]") || strstr(seg, "batch/s]")) {
            (*bars)++;
            if ((int)k > widest) widest = (int)k;
        }
        i = j + 1;
    }
    return widest;
}

int main(void) {
    test_dir_init("progress");
    struct winsize ws = {.ws_row = 24, .ws_col = 80};
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    CHECK(pid >= 0);
    if (pid == 0) {
        char rd[700];
        snprintf(rd, sizeof rd, "run.dir=%s/run", test_dir());
        CHECK(chdir(DTRAIN_SOURCE_DIR) == 0);
        execl(DTRAIN_BIN, DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd, "--set",
              "training.max_steps=1500", "--set", "eval.every_steps=500", "--set", "training.cpu_threads_per_worker=1",
              (char *)NULL);
        _exit(127);
    }
    size_t resized_at = 0;
    double t0 = (double)time(NULL);
    for (;;) {
        ssize_t got = read(master, out + n_out, sizeof out - 1 - n_out);
        if (got <= 0) break; /* EIO once the child is gone */
        n_out += (size_t)got;
        if (!resized_at && memmem(out, n_out, "step/s]", 7) && (double)time(NULL) - t0 >= 0) {
            int bars;
            widest_bar(0, n_out, &bars);
            if (bars >= 5) { /* some redraws at 80 columns, then narrower */
                struct winsize narrow = {.ws_row = 24, .ws_col = 50};
                CHECK(ioctl(master, TIOCSWINSZ, &narrow) == 0);
                resized_at = n_out;
            }
        }
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    out[n_out] = '\0';
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(resized_at > 0);
    int bars80, bars50;
    int w80 = widest_bar(0, resized_at, &bars80);
    /* a redraw in flight when the size changed may still be 80 wide: skip past the next one */
    size_t after = resized_at;
    for (int k = 0; k < 2 && after < n_out; k++) {
        char *r = memchr(out + after, '\r', n_out - after);
        after = r ? (size_t)(r - out) + 1 : n_out;
    }
    int w50 = widest_bar(after, n_out, &bars50);
    printf("80 columns: %d redraws, widest %d; 50 columns: %d redraws, widest %d\n", bars80, w80, bars50, w50);
    CHECK(bars80 >= 5 && w80 <= 79 && w80 >= 60);
    CHECK(bars50 >= 3 && w50 <= 49);
    CHECK(strstr(out, "step/s]") != NULL && strstr(out, "<") != NULL); /* elapsed<ETA, the rate */
    CHECK(strstr(out, "eval ") != NULL && strstr(out, "batch/s]") != NULL);
    CHECK(strstr(out, "final: val loss") != NULL);
    test_dir_remove();
    TEST_PASS("test_progress");
}
