/* test_ckpt.c — the checkpoint module on real files, and the DTRAIN_FAULT parser:
 *   - save -> verify -> load restores weights, moments and trainer state exactly; the
 *     weights file is a plain safetensors file with the model's names;
 *   - a flipped byte, a truncated file, a missing manifest (a half-written checkpoint) and
 *     a broken trainer.json are each reported naming the file; find_latest skips them and
 *     reports each;
 *   - keep_last pruning, leftover temp dirs removed, saving the same step again replaces it;
 *   - a shape change is refused naming the key; set_aside moves checkpoints, deletes nothing;
 *   - links planted in checkpoints/ (old step_N, .tmp-/.old- leftovers, this pid's temp dir,
 *     the step being replaced) are removed as links: the files they point to survive;
 *   - a FIFO as a checkpoint's manifest or weights is refused at once, naming it;
 *   - the tokenizer's SHA-256 recorded (trainer.json) and compared on resume; a dead writer's
 *     .tmp-best.PID pruned;
 *   - config digest and diff. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <zlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/fault.h"
#include "dtrain/backend.h"
#include "dtrain/safetensors.h"
#include "testutil.h"

static dt_model_cfg small_cfg(void) {
    dt_model_cfg c = {.shape = {.vocab_size = 300, .n_positions = 16, .n_layer = 2, .n_head = 2, .n_embd = 16, .num_labels = 3},
                      .seq_len = 16, .max_batch = 2, .seed = 5};
    return c;
}

typedef struct fixture {
    dt_backend *be;
    dt_model *m;
    dt_optim *o;
} fixture;

static void fixture_init(fixture *f, uint64_t seed) {
    dt_model_cfg mc = small_cfg();
    mc.seed = seed;
    CHECK(dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &f->be) == DT_OK);
    CHECK(dt_model_init(&f->m, &mc, f->be) == DT_OK);
    int nt = dt_model_num_tensors(f->m);
    dt_param_seg segs[64];
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(f->m, i);
        segs[i] = (dt_param_seg){t->offset, t->numel, t->ndim >= 2};
    }
    dt_optim_cfg oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .total_steps = 10};
    CHECK(dt_optim_init(&f->o, &oc, f->be, dt_model_num_params(f->m), segs, nt) == DT_OK);
}

static void fixture_free(fixture *f) {
    dt_optim_free(f->o);
    dt_model_free(f->m);
    dt_backend_close(f->be);
}

static dt_ckpt_state state_for(long step, const fixture *f) {
    dt_ckpt_state s = {.step = step, .epoch = 2, .cursor = 48, .seed = 18446744073709551557ull,
                       .config_digest = 0xdeadbeef, .world = 3, .global_batch = 12, .train_samples = 1000};
    s.model = dt_model_config(f->m)->shape;
    return s;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void flip_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    CHECK(fseek(f, at, SEEK_SET) == 0);
    int c = fgetc(f);
    CHECK(c != EOF);
    CHECK(fseek(f, at, SEEK_SET) == 0);
    fputc(c ^ 1, f);
    CHECK(fclose(f) == 0);
}

static char reports[8][2048];
static int n_reports;
static void collect(void *user, const char *msg) {
    (void)user;
    if (n_reports < 8) snprintf(reports[n_reports++], sizeof reports[0], "%s", msg);
}

static void test_roundtrip(dt_config *cfg) {
    const char *run = test_path("run");
    test_mkdir_p(run);
    fixture a, b;
    fixture_init(&a, 5);
    fixture_init(&b, 99); /* different weights, zero moments */
    size_t n = dt_model_num_params(a.m);
    float *mh = malloc(n * sizeof(float)), *vh = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        mh[i] = (float)i * 1e-3f - 0.5f;
        vh[i] = (float)(i % 97) * 1e-4f;
    }
    dt_optim_set_moments(a.o, mh, vh);
    dt_ckpt_state s = state_for(7, &a);
    char dir[2048];
    CHECK(dt_ckpt_save(run, a.m, a.o, &s, cfg, dir, sizeof dir) == DT_OK);
    CHECK_STR_CONTAINS(dir, "/run/checkpoints/step_00000007");
    CHECK_INT_EQ(count_entries(test_path("run/checkpoints")), 1); /* no temp dir left */

    dt_ckpt_state got;
    CHECK(dt_ckpt_verify(dir, &got) == DT_OK);
    CHECK_INT_EQ(got.step, 7);
    CHECK_INT_EQ(got.epoch, 2);
    CHECK_INT_EQ(got.cursor, 48);
    CHECK(got.seed == 18446744073709551557ull); /* beyond 2^53: stored as a string */
    CHECK(got.config_digest == 0xdeadbeef);
    CHECK_INT_EQ(got.world, 3);
    CHECK_INT_EQ(got.global_batch, 12);
    CHECK_INT_EQ(got.train_samples, 1000);
    CHECK_INT_EQ(got.model.n_layer, 2);
    CHECK_INT_EQ(got.model.num_labels, 3);
    CHECK(dt_ckpt_check_shape(&got, &dt_model_config(b.m)->shape, dir) == DT_OK);

    CHECK(dt_ckpt_load(dir, b.m, b.o) == DT_OK);
    CHECK(memcmp(dt_model_params(a.m), dt_model_params(b.m), n * sizeof(float)) == 0);
    float *m2 = malloc(n * sizeof(float)), *v2 = malloc(n * sizeof(float));
    dt_optim_get_moments(b.o, m2, v2);
    CHECK(memcmp(mh, m2, n * sizeof(float)) == 0);
    CHECK(memcmp(vh, v2, n * sizeof(float)) == 0);

    /* the weights file is a plain safetensors file with the model's names */
    char p[2200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    dt_st_file *st;
    CHECK(dt_st_open(&st, p) == DT_OK);
    CHECK(dt_st_find(st, "h.1.mlp.c_proj.weight") != NULL);
    CHECK(dt_st_find(st, "score.weight") != NULL);
    dt_st_close(st);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    CHECK(dt_st_open(&st, p) == DT_OK);
    CHECK(dt_st_find(st, "exp_avg.wte.weight") != NULL);
    CHECK(dt_st_find(st, "exp_avg_sq.h.0.attn.c_attn.weight") != NULL);
    dt_st_close(st);

    /* a shape change is refused, naming the key */
    dt_model_cfg other = small_cfg();
    other.shape.n_embd = 32;
    CHECK(dt_ckpt_check_shape(&got, &other.shape, dir) == DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "model.n_embd: 16, the config says 32: refusing to resume");

    /* saving the same step again replaces it whole */
    s.cursor = 60;
    CHECK(dt_ckpt_save(run, a.m, a.o, &s, cfg, dir, sizeof dir) == DT_OK);
    CHECK(dt_ckpt_verify(dir, &got) == DT_OK);
    CHECK_INT_EQ(got.cursor, 60);
    CHECK_INT_EQ(count_entries(test_path("run/checkpoints")), 1);

    free(mh);
    free(vh);
    free(m2);
    free(v2);
    fixture_free(&a);
    fixture_free(&b);
}

static void test_damage(dt_config *cfg) {
    const char *run = test_path("dmg");
    test_mkdir_p(run);
    fixture a;
    fixture_init(&a, 5);
    char dirs[5][2048];
    for (int i = 0; i < 5; i++) {
        dt_ckpt_state s = state_for(10 * (i + 1), &a);
        CHECK(dt_ckpt_save(run, a.m, a.o, &s, cfg, dirs[i], sizeof dirs[i]) == DT_OK);
    }
    dt_ckpt_state got;
    char p[2200];
    /* step 50: one flipped byte in the weights */
    snprintf(p, sizeof p, "%s/model.safetensors", dirs[4]);
    flip_byte(p, 200);
    CHECK(dt_ckpt_verify(dirs[4], &got) == DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "step_00000050/model.safetensors: crc32 ");
    CHECK_STR_CONTAINS(dt_error_msg(), "(the file is corrupt)");
    /* step 40: the optimizer state truncated */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dirs[3]);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    CHECK(truncate(p, sb.st_size - 1) == 0);
    CHECK(dt_ckpt_verify(dirs[3], &got) == DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "step_00000040/optimizer.safetensors: ");
    CHECK_STR_CONTAINS(dt_error_msg(), "(truncated or partly written)");
    /* step 30: no manifest, as if the writer died before the last file */
    snprintf(p, sizeof p, "%s/manifest.json", dirs[2]);
    CHECK(unlink(p) == 0);
    CHECK(dt_ckpt_verify(dirs[2], &got) == DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "step_00000030/manifest.json: missing: the checkpoint is incomplete");
    /* step 20: trainer.json replaced by garbage of the same size is caught by its CRC */
    snprintf(p, sizeof p, "%s/trainer.json", dirs[1]);
    flip_byte(p, 3);
    CHECK(dt_ckpt_verify(dirs[1], &got) == DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "step_00000020/trainer.json: crc32");

    /* find_latest: reports 50, 40, 30, 20 and returns 10 */
    char found_dir[2048];
    int found = 0;
    n_reports = 0;
    CHECK(dt_ckpt_find_latest(run, collect, NULL, found_dir, sizeof found_dir, &got, &found) == DT_OK);
    CHECK(found);
    CHECK_INT_EQ(got.step, 10);
    CHECK_STR_CONTAINS(found_dir, "step_00000010");
    CHECK_INT_EQ(n_reports, 4);
    CHECK_STR_CONTAINS(reports[0], "step_00000050/model.safetensors");
    CHECK_STR_CONTAINS(reports[3], "step_00000020/trainer.json");
    /* a checkpoint directory given directly must verify */
    CHECK(dt_ckpt_find_latest(dirs[0], collect, NULL, found_dir, sizeof found_dir, &got, &found) == DT_OK && found);
    CHECK(dt_ckpt_find_latest(dirs[4], collect, NULL, found_dir, sizeof found_dir, &got, &found) == DT_ERR_DATA);
    /* nothing at all */
    CHECK(dt_ckpt_find_latest(test_path("nowhere"), collect, NULL, found_dir, sizeof found_dir, &got, &found) == DT_OK);
    CHECK(!found);

    /* prune: keep the newest 2 names (broken or not), and remove a dead writer's temp dir */
    snprintf(p, sizeof p, "%s/checkpoints/.tmp-step_00000060.12345", run);
    CHECK(mkdir(p, 0755) == 0);
    CHECK(dt_ckpt_prune(run, 2) == DT_OK);
    snprintf(p, sizeof p, "%s/checkpoints", run);
    CHECK_INT_EQ(count_entries(p), 2);
    CHECK(access(dirs[4], F_OK) == 0 && access(dirs[3], F_OK) == 0 && access(dirs[0], F_OK) != 0);

    /* set_aside moves the whole directory; nothing is deleted */
    char moved[2048];
    CHECK(dt_ckpt_set_aside(run, 45, moved, sizeof moved) == DT_OK); /* only the newer ones */
    CHECK_STR_CONTAINS(moved, "/dmg/checkpoints.prev-");
    CHECK_INT_EQ(count_entries(moved), 1);
    CHECK(access(dirs[3], F_OK) == 0 && access(dirs[4], F_OK) != 0);
    CHECK(dt_ckpt_set_aside(run, 45, moved, sizeof moved) == DT_OK);
    CHECK_STR_EQ(moved, ""); /* nothing newer left */
    CHECK(dt_ckpt_set_aside(run, -1, moved, sizeof moved) == DT_OK); /* all of it */
    CHECK_STR_CONTAINS(moved, "/dmg/checkpoints.prev-");
    CHECK_INT_EQ(count_entries(moved), 1);
    CHECK(access(p, F_OK) != 0);
    CHECK(dt_ckpt_set_aside(run, -1, moved, sizeof moved) == DT_OK);
    CHECK_STR_EQ(moved, ""); /* nothing left to move */
    fixture_free(&a);
}

static void write_precious(const char *dir) {
    test_mkdir_p(dir);
    char p[1300];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/precious%d", dir, i);
        test_write_file(p, "keep me", 7);
    }
}

static void check_precious(const char *dir) {
    char p[1300], got[64];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/precious%d", dir, i);
        test_slurp(p, got, sizeof got);
        CHECK_STR_EQ(got, "keep me");
    }
    CHECK_INT_EQ(count_entries(dir), 3);
}

static int is_link(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
}

/* Links in checkpoints/ are never followed when deleting or setting aside: a run directory
 * that was copied or downloaded cannot make prune empty a directory outside it. */
static void test_planted_links(dt_config *cfg) {
    const char *run = test_path("links"), *outside = test_path("outside");
    test_mkdir_p(run);
    write_precious(outside);
    fixture a;
    fixture_init(&a, 5);
    char root[1300], p[1400];
    snprintf(root, sizeof root, "%s/checkpoints", run);
    for (int i = 1; i <= 3; i++) {
        dt_ckpt_state s = state_for(10 * i, &a);
        CHECK_OK(dt_ckpt_save(run, a.m, a.o, &s, cfg, NULL, 0));
    }
    /* an old step, a dead writer's temp dir, a replaced step whose step_N exists: all links */
    const char *planted[] = {"step_00000001", ".tmp-step_00000001.999", ".old-step_00000030.777"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", root, planted[i]);
        CHECK(symlink(outside, p) == 0);
    }
    CHECK_OK(dt_ckpt_prune(run, 2));
    check_precious(outside);
    for (int i = 0; i < 3; i++) { /* the links themselves are gone */
        snprintf(p, sizeof p, "%s/%s", root, planted[i]);
        CHECK(!is_link(p));
    }
    CHECK_INT_EQ(count_entries(root), 2); /* step_20, step_30 */

    /* this pid's own temp name, and the step being replaced, as links */
    snprintf(p, sizeof p, "%s/.tmp-step_00000040.%ld", root, (long)getpid());
    CHECK(symlink(outside, p) == 0);
    dt_ckpt_state s = state_for(40, &a);
    CHECK_OK(dt_ckpt_save(run, a.m, a.o, &s, cfg, NULL, 0));
    check_precious(outside);
    snprintf(p, sizeof p, "%s/step_00000050", root);
    CHECK(symlink(outside, p) == 0);
    s = state_for(50, &a);
    CHECK_OK(dt_ckpt_save(run, a.m, a.o, &s, cfg, NULL, 0));
    check_precious(outside);
    CHECK(!is_link(p));
    dt_ckpt_state got;
    CHECK_OK(dt_ckpt_verify(p, &got));
    CHECK_INT_EQ(got.step, 50);
    CHECK_INT_EQ(count_entries(root), 4); /* 20, 30, 40, 50: no temp dir left */

    /* set_aside moves a link as a link */
    snprintf(p, sizeof p, "%s/step_00000060", root);
    CHECK(symlink(outside, p) == 0);
    char moved[2048];
    CHECK_OK(dt_ckpt_set_aside(run, 55, moved, sizeof moved));
    snprintf(p, sizeof p, "%s/step_00000060", moved);
    CHECK(is_link(p));
    check_precious(outside);

    /* a FIFO as the manifest or as the weights: refused at once, naming it (used to block) */
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/step_00000050", root);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(unlink(p) == 0 && mkfifo(p, 0644) == 0);
    alarm(20); /* a hang fails the test */
    CHECK_INT_EQ(dt_ckpt_verify(dir, &got), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "step_00000050/model.safetensors: not a regular file (a FIFO)");
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    CHECK(unlink(p) == 0 && mkfifo(p, 0644) == 0);
    CHECK_INT_EQ(dt_ckpt_verify(dir, &got), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "step_00000050/manifest.json: not a regular file (a FIFO)");
    alarm(0);
    fixture_free(&a);
}

static void test_config_digest(void) {
    dt_config a, b;
    const char *yaml = "training: {num_workers: 2}\ndata: {train_path: x.tsv}\nmodel: {num_labels: 2}\n";
    CHECK(dt_config_load_string(&a, "a.yaml", yaml, NULL, 0) == DT_OK);
    const char *sets[] = {"training.num_workers=4", "optimizer.lr=0.01"};
    CHECK(dt_config_load_string(&b, "b.yaml", yaml, sets, 2) == DT_OK);
    CHECK(dt_config_digest(&a) != dt_config_digest(&b));
    char diff[512];
    CHECK_INT_EQ(dt_config_diff(&a, &b, diff, sizeof diff), 3);
    CHECK_STR_CONTAINS(diff, "run.dir \"runs/a\" -> \"runs/b\", training.num_workers 2 -> 4");
    CHECK_STR_CONTAINS(diff, "optimizer.lr 0.0003 -> 0.01");
    dt_config c;
    CHECK(dt_config_load_string(&c, "elsewhere/a.yaml", yaml, NULL, 0) == DT_OK); /* another file, same settings */
    CHECK(dt_config_digest(&a) == dt_config_digest(&c));
    CHECK_INT_EQ(dt_config_diff(&a, &c, diff, sizeof diff), 0);
}

static void test_fault_parse(void) {
    dt_fault f;
    CHECK(dt_fault_parse(NULL, &f) == DT_OK && f.kind == DT_FAULT_NONE);
    CHECK(dt_fault_parse("", &f) == DT_OK && f.kind == DT_FAULT_NONE);
    CHECK(dt_fault_parse("rank=1,step=7,kind=kill", &f) == DT_OK);
    CHECK(f.kind == DT_FAULT_KILL && f.rank == 1 && f.step == 7 && f.attempt == 0);
    CHECK(dt_fault_parse("kind=hang,step=3,rank=0,attempt=2", &f) == DT_OK);
    CHECK(f.kind == DT_FAULT_HANG && f.attempt == 2);
    CHECK(dt_fault_parse("rank=0,step=3,kind=exit,attempt=any", &f) == DT_OK && f.attempt == DT_FAULT_ANY_ATTEMPT);
    CHECK(dt_fault_parse("step=5,kind=corrupt-checkpoint", &f) == DT_OK && f.kind == DT_FAULT_CORRUPT_CKPT);
    const struct {
        const char *spec, *msg;
    } bad[] = {
        {"rank=1,step=7,kind=boom", "kind: expected kill, exit, hang or corrupt-checkpoint, got \"boom\""},
        {"rank=1,step=x,kind=kill", "step: expected a non-negative integer, got \"x\""},
        {"rank=1,kind=kill", "needs rank=R,step=S,kind=K"},
        {"step=2,kind=kill", "needs rank=R,step=S,kind=K"},
        {"rank=1,step=0,kind=kill", "step: expected >= 1"},
        {"rank=1,step=2,kind=kill,when=now", "unknown key \"when\""},
        {"rank=1,step2,kind=kill", "\"step2\": expected key=value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(dt_fault_parse(bad[i].spec, &f) == DT_ERR_USAGE);
        CHECK_STR_CONTAINS(dt_error_msg(), bad[i].msg);
    }
    /* a fault that is not due does nothing */
    CHECK(dt_fault_parse("rank=1,step=7,kind=kill", &f) == DT_OK);
    dt_fault_before_step(&f, 0, 0, 7);
    dt_fault_before_step(&f, 1, 1, 7);
    dt_fault_before_step(&f, 1, 0, 6);
}

/* Makes the manifest's size and CRC of `file` in checkpoint `dir` match the file again, as a
 * crafted checkpoint would. */
static void fix_manifest(const char *dir, const char *file) {
    char p[2200], m[2200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    snprintf(m, sizeof m, "%s/manifest.json", dir);
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL);
    unsigned char buf[65536];
    size_t got, bytes = 0;
    uLong crc = crc32(0L, Z_NULL, 0);
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        crc = crc32(crc, buf, (uInt)got);
        bytes += got;
    }
    fclose(f);
    json_t *man = json_load_file(m, 0, NULL);
    CHECK(man != NULL);
    json_t *entry = json_object_get(json_object_get(man, "files"), file);
    char hex[16];
    snprintf(hex, sizeof hex, "%08lx", (unsigned long)crc);
    json_object_set_new(entry, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(entry, "crc32", json_string(hex));
    CHECK(json_dump_file(man, m, JSON_INDENT(2)) == 0);
    json_decref(man);
}

/* Sets trainer.json's `key` (in "model" when in_model) to the JSON `value` in checkpoint `dir`
 * and fixes the manifest's size and CRC, as a crafted checkpoint would. */
static void set_trainer_field(const char *dir, int in_model, const char *key, const char *value) {
    char p[2200];
    snprintf(p, sizeof p, "%s/trainer.json", dir);
    json_t *root = json_load_file(p, 0, NULL);
    CHECK(root != NULL);
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    CHECK(v != NULL);
    json_object_set_new(in_model ? json_object_get(root, "model") : root, key, v);
    char *text = json_dumps(root, JSON_INDENT(2));
    FILE *f = fopen(p, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
    free(text);
    json_decref(root);
    fix_manifest(dir, "trainer.json");
}

/* Sets element `at` of tensor `name` in checkpoint file `file` to v (fixing the manifest). */
static void set_tensor_value(const char *dir, const char *file, const char *name, size_t at, float v) {
    char p[2200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    dt_st_file *f;
    CHECK(dt_st_open(&f, p) == DT_OK);
    int n = dt_st_count(f);
    dt_st_entry *e = calloc((size_t)n, sizeof *e);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        bufs[i] = malloc(t->numel * sizeof(float));
        CHECK(dt_st_read_f32(f, t, bufs[i]) == DT_OK);
        if (strcmp(t->name, name) == 0) bufs[i][at] = v;
        e[i] = (dt_st_entry){.name = t->name, .ndim = t->ndim, .data = bufs[i]};
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
    }
    char tmp[2300];
    snprintf(tmp, sizeof tmp, "%s.new", p);
    CHECK(dt_st_write(tmp, e, n, NULL, NULL, 0) == DT_OK);
    dt_st_close(f);
    CHECK(rename(tmp, p) == 0);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(e);
    fix_manifest(dir, file);
}

/* A NaN or Inf in a checkpoint's weights or moments is refused naming the file and tensor. */
static void test_non_finite(dt_config *cfg) {
    const char *run = test_path("nan");
    test_mkdir_p(run);
    fixture a;
    fixture_init(&a, 5);
    dt_ckpt_state s = state_for(1, &a), got;
    char dir[2048];
    CHECK(dt_ckpt_save(run, a.m, a.o, &s, cfg, dir, sizeof dir) == DT_OK);
    CHECK(dt_ckpt_load(dir, a.m, a.o) == DT_OK);
    set_tensor_value(dir, "optimizer.safetensors", "exp_avg_sq.h.1.attn.c_proj.weight", 3, INFINITY);
    CHECK(dt_ckpt_verify(dir, &got) == DT_OK); /* the checksums are right */
    CHECK_INT_EQ(dt_ckpt_load(dir, a.m, a.o), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "/optimizer.safetensors: tensor exp_avg_sq.h.1.attn.c_proj.weight holds +Inf at "
                                       "element 3 (1 value is NaN or Inf)");
    set_tensor_value(dir, "model.safetensors", "wpe.weight", 0, NAN);
    CHECK_INT_EQ(dt_ckpt_load(dir, a.m, a.o), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "/model.safetensors: tensor wpe.weight holds NaN at element 0");
    fixture_free(&a);
}

/* Every trainer.json field is range-checked: what would overflow the resume arithmetic, wrap
 * around or pass the shape check by truncation is refused naming the file and the field. */
static void test_trainer_fields(dt_config *cfg) {
    const char *run = test_path("fields");
    test_mkdir_p(run);
    fixture a;
    fixture_init(&a, 5);
    static const struct {
        int in_model;
        const char *key, *value, *msg;
    } cases[] = {
        {0, "epoch", "9223372036854775807", "epoch: expected an integer in [0, 2147483646], got 9223372036854775807"},
        {0, "step", "-3", "step: expected an integer in [0, 100000000000], got -3"},
        {0, "cursor", "1001", "cursor: expected at most train_samples (1000), got 1001"},
        {0, "world_size", "65", "world_size: expected an integer in [1, 64], got 65"},
        {0, "global_batch", "1.5", "global_batch: expected an integer"},
        {0, "seed", "\"-1\"", "seed: expected at most 20 characters of 0123456789, got \"-1\""},
        {0, "seed", "\"18446744073709551616\"", "seed: expected at most 18446744073709551615, got 18446744073709551616"},
        {0, "seed", "7", "seed: expected a string"},
        {0, "config_digest", "\"deadbeefff\"", "config_digest: expected at most 8 characters of"},
        {1, "n_embd", "4294967304", "n_embd: expected an integer in [1, 2147483647], got 4294967304"},
        {1, "num_labels", "-1", "num_labels: expected an integer in [0, 2147483647], got -1"},
        {1, "n_layer", "null", "n_layer: expected an integer"},
        {0, "train_samples", "\"12\"", "train_samples: expected an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_ckpt_state s = state_for((long)i + 1, &a), got;
        char dir[2048];
        CHECK(dt_ckpt_save(run, a.m, a.o, &s, cfg, dir, sizeof dir) == DT_OK);
        CHECK(dt_ckpt_verify(dir, &got) == DT_OK);
        set_trainer_field(dir, cases[i].in_model, cases[i].key, cases[i].value);
        dt_error_clear();
        CHECK_INT_EQ(dt_ckpt_verify(dir, &got), DT_ERR_DATA);
        CHECK_STR_CONTAINS(dt_error_msg(), "/trainer.json: ");
        CHECK_STR_CONTAINS(dt_error_msg(), cases[i].msg);
    }
    fixture_free(&a);
}

/* data.tokenizer's SHA-256 goes into trainer.json (nothing for the byte tokenizer: such a
 * checkpoint is as before) and a resume with another tokenizer file is refused naming both; a
 * checkpoint that recorded none (bytes, or from before) resumes with any. */
static void test_tokenizer_recorded(dt_config *bytes) {
    const char *run = test_path("tok"), *tok = test_path("tok.json");
    test_mkdir_p(run);
    test_write_file(tok, "{\"version\": 1}\n", 15); /* the config hashes the bytes; nothing here reads it */
    const char *yaml = "data: {train_path: x.tsv}\nmodel: {num_labels: 3}\n";
    char set[1400];
    snprintf(set, sizeof set, "data.tokenizer=%s", tok);
    const char *const ovr[] = {set};
    dt_config bpe, changed;
    CHECK_OK(dt_config_load_string(&bpe, "t.yaml", yaml, ovr, 1));
    CHECK_STR_EQ(bpe.data.tokenizer_sha256, "cedb60dfefb0ead1fa5a3ccb3c68e0ceaf4bb3415df80c79863092f362bd5ab9");
    fixture a;
    fixture_init(&a, 5);
    dt_ckpt_state s = state_for(1, &a), got;
    char dir[2048], p[2200], text[4096];
    CHECK_OK(dt_ckpt_save(run, a.m, a.o, &s, &bpe, dir, sizeof dir));
    snprintf(p, sizeof p, "%s/trainer.json", dir);
    test_slurp(p, text, sizeof text);
    CHECK_STR_CONTAINS(text, "\"tokenizer_sha256\": \"cedb60dfefb0ead1fa5a3ccb3c68e0ceaf4bb3415df80c79863092f362bd5ab9\"");
    CHECK_OK(dt_ckpt_verify(dir, &got));
    CHECK_STR_EQ(got.tokenizer_sha256, bpe.data.tokenizer_sha256);
    CHECK_OK(dt_ckpt_check_tokenizer(&got, &bpe, dir));
    test_write_file(tok, "{\"version\": 2}\n", 15); /* the file changed since */
    CHECK_OK(dt_config_load_string(&changed, "t.yaml", yaml, ovr, 1));
    CHECK_INT_EQ(dt_ckpt_check_tokenizer(&got, &changed, dir), DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "/tok/checkpoints/step_00000001: checkpoint trained with data.tokenizer of "
                                       "SHA-256 cedb60dfefb0ead1fa5a3ccb3c68e0ceaf4bb3415df80c79863092f362bd5ab9, but ");
    CHECK_STR_CONTAINS(dt_error_msg(), "refusing to resume with another tokenizer");
    CHECK_INT_EQ(dt_ckpt_check_tokenizer(&got, bytes, dir), DT_ERR_CONFIG); /* bytes now */
    CHECK_STR_CONTAINS(dt_error_msg(), "but data.tokenizer is bytes");
    /* the byte tokenizer: nothing recorded, and any tokenizer resumes it */
    s = state_for(2, &a);
    CHECK_OK(dt_ckpt_save(run, a.m, a.o, &s, bytes, dir, sizeof dir));
    snprintf(p, sizeof p, "%s/trainer.json", dir);
    test_slurp(p, text, sizeof text);
    CHECK(strstr(text, "tokenizer_sha256") == NULL);
    CHECK_OK(dt_ckpt_verify(dir, &got));
    CHECK_STR_EQ(got.tokenizer_sha256, "");
    CHECK_OK(dt_ckpt_check_tokenizer(&got, &changed, dir));
    set_trainer_field(dir, 0, "tokenizer_sha256", "\"xyz\"");
    CHECK_INT_EQ(dt_ckpt_verify(dir, &got), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "trainer.json: tokenizer_sha256: expected 64 characters of 0123456789abcdef (a "
                                       "SHA-256)");
    fixture_free(&a);
}

/* The best checkpoint's temporary directory of a writer that died (.tmp-best.PID in the run
 * directory) is pruned like a step's; .old-best.PID only while best/ exists (a crash between
 * its renames leaves the previous best there alone). */
static void test_prune_best(dt_config *cfg) {
    const char *run = test_path("bestprune");
    test_mkdir_p(run);
    fixture a;
    fixture_init(&a, 5);
    dt_ckpt_state s = state_for(10, &a);
    CHECK_OK(dt_ckpt_save(run, a.m, a.o, &s, cfg, NULL, 0));
    char p[1400];
    const char *left[] = {".tmp-best.12345", ".old-best.777"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", run, left[i]);
        write_precious(p);
    }
    CHECK_OK(dt_ckpt_prune(run, 2));
    snprintf(p, sizeof p, "%s/.tmp-best.12345", run);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/.old-best.777", run);
    CHECK(access(p, F_OK) == 0); /* no best/: it may be the only best there is */
    CHECK_OK(dt_ckpt_save_best(run, a.m, a.o, &s, cfg, NULL, 0));
    CHECK_OK(dt_ckpt_prune(run, 2));
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/best", run);
    dt_ckpt_state got;
    CHECK_OK(dt_ckpt_verify(p, &got));
    CHECK_INT_EQ(count_entries(run), 2); /* checkpoints/, best/ */
    fixture_free(&a);
}

int main(void) {
    test_dir_init("ckpt");
    dt_config cfg;
    CHECK(dt_config_load_string(&cfg, "t.yaml", "data: {train_path: x.tsv}\nmodel: {num_labels: 3}\n", NULL, 0) == DT_OK);
    test_roundtrip(&cfg);
    test_damage(&cfg);
    test_trainer_fields(&cfg);
    test_non_finite(&cfg);
    test_planted_links(&cfg);
    test_tokenizer_recorded(&cfg);
    test_prune_best(&cfg);
    test_config_digest();
    test_fault_parse();
    test_dir_remove();
    TEST_PASS("test_ckpt");
}
