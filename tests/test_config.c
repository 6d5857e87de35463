/* test_config.c — config loading: defaults, every key, the DESIGN §3 seed example, exact error
 * messages for broken files and overrides, ${ENV}, --set, and print -> load round trips;
 * data.tokenizer_sha256; model.init_from DIR reading dtrain's byte tokenizer as bytes, and
 * nothing else. */
#include "dtrain/config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/hfdir.h"
#include "testutil.h"

#define NAME "finetune.yaml"
#define MIN "data:\n  train_path: data/train.tsv\n"

static dt_config cfg;

/* Loads `yaml` (named NAME) with the given overrides and expects DT_OK. */
#define LOAD_OK(yaml, ...)                                                                      \
    do {                                                                                        \
        const char *const ovr_[] = {NULL, __VA_ARGS__};                                         \
        dt_status st_ = dt_config_load_string(&cfg, NAME, (yaml), ovr_ + 1,                     \
                                              (int)(sizeof ovr_ / sizeof ovr_[0]) - 1);         \
        if (st_ != DT_OK) fprintf(stderr, "unexpected error: %s\n", dt_error_msg());            \
        CHECK_INT_EQ(st_, DT_OK);                                                               \
    } while (0)

/* Loads `yaml` with the given overrides and expects DT_ERR_CONFIG with exactly `msg`. */
#define LOAD_ERR(msg, yaml, ...)                                                                \
    do {                                                                                        \
        const char *const ovr_[] = {NULL, __VA_ARGS__};                                         \
        dt_error_clear();                                                                       \
        dt_status st_ = dt_config_load_string(&cfg, NAME, (yaml), ovr_ + 1,                     \
                                              (int)(sizeof ovr_ / sizeof ovr_[0]) - 1);         \
        CHECK_STR_EQ(dt_error_msg(), (msg));                                                    \
        CHECK_INT_EQ(st_, DT_ERR_CONFIG);                                                       \
    } while (0)

static void check_defaults(const dt_config *c) {
    CHECK_INT_EQ(c->training.num_workers, 1);
    CHECK_INT_EQ(c->training.use_gpu, -1);
    CHECK_INT_EQ(c->training.device, DT_DEVICE_AUTO);
    CHECK_INT_EQ(c->training.gpus_per_worker, 1);
    CHECK_INT_EQ(c->training.comm, DT_COMM_AUTO);
    CHECK_INT_EQ(c->training.epochs, 1);
    CHECK_INT_EQ(c->training.max_steps, 0);
    CHECK_INT_EQ(c->training.grad_accum_steps, 1);
    CHECK_INT_EQ(c->training.precision, DT_PREC_AUTO);
    CHECK(c->training.seed == 1337);
    CHECK(c->training.collective_timeout_s == 300.0);
    CHECK_INT_EQ(c->training.cpu_threads_per_worker, 0);
    CHECK_INT_EQ(c->training.check_replicas_every, 100);
    CHECK(c->optimizer.lr == 3e-4);
    CHECK(c->optimizer.weight_decay == 0.01);
    CHECK(c->optimizer.beta1 == 0.9);
    CHECK(c->optimizer.beta2 == 0.999);
    CHECK(c->optimizer.eps == 1e-8);
    CHECK(c->optimizer.grad_clip == 1.0);
    CHECK_INT_EQ(c->optimizer.schedule, DT_SCHED_COSINE);
    CHECK_INT_EQ(c->optimizer.warmup_steps, 0);
    CHECK(c->optimizer.min_lr_ratio == 0.0);
    CHECK_STR_EQ(c->data.val_path, "");
    CHECK_INT_EQ(c->data.format, DT_FORMAT_AUTO);
    CHECK_INT_EQ(c->data.batch_size_per_worker, 8);
    CHECK_INT_EQ(c->data.seq_len, 64);
    CHECK_INT_EQ(c->data.shuffle, 1);
    CHECK_STR_EQ(c->model.type, "transformer_like");
    CHECK_INT_EQ(c->model.shape.n_layer, 2);
    CHECK_INT_EQ(c->model.shape.n_head, 4);
    CHECK_INT_EQ(c->model.shape.n_embd, 128);
    CHECK_INT_EQ(c->model.shape.vocab_size, 257);
    CHECK_INT_EQ(c->model.shape.n_positions, 64);
    CHECK_INT_EQ(c->model.shape.num_labels, 0);
    CHECK_STR_EQ(c->model.init_from, "");
    CHECK_INT_EQ(c->eval.every_steps, 100);
    CHECK_INT_EQ(c->eval.max_batches, 0);
    CHECK_INT_EQ(c->checkpoint.every_steps, 500);
    CHECK_INT_EQ(c->checkpoint.keep_last, 3);
    CHECK_INT_EQ(c->checkpoint.resume, DT_RESUME_AUTO);
    CHECK_STR_EQ(c->checkpoint.resume_path, "");
    CHECK_INT_EQ(c->logging.every_steps, 10);
    CHECK_INT_EQ(c->logging.tensorboard, 1);
    CHECK_INT_EQ(c->fault_tolerance.max_restarts, 3);
    CHECK(c->fault_tolerance.backoff_s == 1.0);
}

static void test_defaults(void) {
    dt_config d;
    memset(&d, 0x5a, sizeof d);
    dt_config_defaults(&d);
    check_defaults(&d);
    CHECK_STR_EQ(d.data.train_path, "");

    LOAD_OK(MIN);
    check_defaults(&cfg);
    CHECK_STR_EQ(cfg.source, "");
    CHECK_STR_EQ(cfg.run.dir, "runs/finetune");
    CHECK_STR_EQ(cfg.data.train_path, "data/train.tsv");

    /* run.dir from the stem of the name; n_positions follows seq_len when absent */
    CHECK_INT_EQ(dt_config_load_string(&cfg, "configs/my.run.yml", MIN "  seq_len: 200\n", NULL, 0), DT_OK);
    CHECK_STR_EQ(cfg.run.dir, "runs/my.run");
    CHECK_INT_EQ(cfg.model.shape.n_positions, 200);
    /* a null string value is the empty string, a quoted "~" is not */
    LOAD_OK(MIN "  val_path: ~\nmodel:\n  init_from:\n  type: gpt2\nrun:\n  dir: \"~\"\n");
    CHECK_STR_EQ(cfg.data.val_path, "");
    CHECK_STR_EQ(cfg.model.init_from, "");
    CHECK_STR_EQ(cfg.run.dir, "~");
    /* empty sections are allowed */
    LOAD_OK(MIN "eval:\nlogging: ~\n");
    check_defaults(&cfg);

    CHECK_STR_EQ(dt_device_name(DT_DEVICE_AUTO), "auto");
    CHECK_STR_EQ(dt_device_name(DT_DEVICE_CPU), "cpu");
    CHECK_STR_EQ(dt_device_name(DT_DEVICE_CUDA), "cuda");
}

static const char *full_yaml =
    "run:\n"
    "  dir: \"out/run1\"\n"
    "training:\n"
    "  num_workers: 2\n"
    "  use_gpu: off\n"
    "  device: cpu\n"
    "  resources_per_worker:\n"
    "    gpu: 0\n"
    "  communication_backend: shm\n"
    "  epochs: 5\n"
    "  max_steps: 1000\n"
    "  grad_accum_steps: 4\n"
    "  precision: fp32\n"
    "  seed: 18446744073709551615\n"
    "  collective_timeout_s: 12.5\n"
    "  cpu_threads_per_worker: 3\n"
    "  check_replicas_every: 0\n"
    "optimizer:\n"
    "  lr: 1.0e-3\n"
    "  weight_decay: 0.1\n"
    "  betas:\n"
    "    - 0.8\n"
    "    - 0.95\n"
    "  eps: 1e-6\n"
    "  grad_clip: 0.5\n"
    "  schedule: linear\n"
    "  warmup_steps: 20\n"
    "  min_lr_ratio: 0.1\n"
    "data:\n"
    "  train_path: data/train.bin\n"
    "  val_path: 'data/val.bin'\n"
    "  format: tokens\n"
    "  batch_size_per_worker: 32\n"
    "  seq_len: 256\n"
    "  shuffle: no\n"
    "model:\n"
    "  type: gpt2\n"
    "  n_layer: 6\n"
    "  n_head: 6\n"
    "  n_embd: 384\n"
    "  vocab_size: 50257\n"
    "  n_positions: 1024\n"
    "  num_labels: 0\n"
    "  init_from: \"weights/gpt2.safetensors\"\n"
    "eval:\n"
    "  every_steps: 50\n"
    "  max_batches: 20\n"
    "checkpoint:\n"
    "  every_steps: 200\n"
    "  keep_last: 5\n"
    "  resume: \"runs/old/checkpoints/step_00000100\"\n"
    "logging:\n"
    "  every_steps: 5\n"
    "  tensorboard: False\n"
    "fault_tolerance:\n"
    "  max_restarts: 7\n"
    "  backoff_s: 2.5\n";

static void test_full(void) {
    LOAD_OK(full_yaml);
    CHECK_STR_EQ(cfg.run.dir, "out/run1");
    CHECK_INT_EQ(cfg.training.num_workers, 2);
    CHECK_INT_EQ(cfg.training.use_gpu, 0);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CPU);
    CHECK_INT_EQ(cfg.training.gpus_per_worker, 0);
    CHECK_INT_EQ(cfg.training.comm, DT_COMM_SHM);
    CHECK_INT_EQ(cfg.training.epochs, 5);
    CHECK_INT_EQ(cfg.training.max_steps, 1000);
    CHECK_INT_EQ(cfg.training.grad_accum_steps, 4);
    CHECK_INT_EQ(cfg.training.precision, DT_PREC_FP32);
    CHECK(cfg.training.seed == UINT64_MAX);
    CHECK(cfg.training.collective_timeout_s == 12.5);
    CHECK_INT_EQ(cfg.training.cpu_threads_per_worker, 3);
    CHECK_INT_EQ(cfg.training.check_replicas_every, 0);
    CHECK(cfg.optimizer.lr == 1e-3);
    CHECK(cfg.optimizer.weight_decay == 0.1);
    CHECK(cfg.optimizer.beta1 == 0.8);
    CHECK(cfg.optimizer.beta2 == 0.95);
    CHECK(cfg.optimizer.eps == 1e-6);
    CHECK(cfg.optimizer.grad_clip == 0.5);
    CHECK_INT_EQ(cfg.optimizer.schedule, DT_SCHED_LINEAR);
    CHECK_INT_EQ(cfg.optimizer.warmup_steps, 20);
    CHECK(cfg.optimizer.min_lr_ratio == 0.1);
    CHECK_STR_EQ(cfg.data.train_path, "data/train.bin");
    CHECK_STR_EQ(cfg.data.val_path, "data/val.bin");
    CHECK_INT_EQ(cfg.data.format, DT_FORMAT_TOKENS);
    CHECK_INT_EQ(cfg.data.batch_size_per_worker, 32);
    CHECK_INT_EQ(cfg.data.seq_len, 256);
    CHECK_INT_EQ(cfg.data.shuffle, 0);
    CHECK_STR_EQ(cfg.model.type, "gpt2");
    CHECK_INT_EQ(cfg.model.shape.n_layer, 6);
    CHECK_INT_EQ(cfg.model.shape.n_head, 6);
    CHECK_INT_EQ(cfg.model.shape.n_embd, 384);
    CHECK_INT_EQ(cfg.model.shape.vocab_size, 50257);
    CHECK_INT_EQ(cfg.model.shape.n_positions, 1024);
    CHECK_INT_EQ(cfg.model.shape.num_labels, 0);
    CHECK_STR_EQ(cfg.model.init_from, "weights/gpt2.safetensors");
    CHECK_INT_EQ(cfg.eval.every_steps, 50);
    CHECK_INT_EQ(cfg.eval.max_batches, 20);
    CHECK_INT_EQ(cfg.checkpoint.every_steps, 200);
    CHECK_INT_EQ(cfg.checkpoint.keep_last, 5);
    CHECK_INT_EQ(cfg.checkpoint.resume, DT_RESUME_PATH);
    CHECK_STR_EQ(cfg.checkpoint.resume_path, "runs/old/checkpoints/step_00000100");
    CHECK_INT_EQ(cfg.logging.every_steps, 5);
    CHECK_INT_EQ(cfg.logging.tensorboard, 0);
    CHECK_INT_EQ(cfg.fault_tolerance.max_restarts, 7);
    CHECK(cfg.fault_tolerance.backoff_s == 2.5);

    /* spellings: every boolean form, enum aliases, quoted numbers, flow mappings */
    LOAD_OK(MIN "  shuffle: 'off'\nlogging: {tensorboard: 1}\ntraining: {use_gpu: YES, communication_backend: auto,"
                " precision: bf16, seed: \"42\"}\ncheckpoint:\n  resume: never\noptimizer:\n  schedule: constant\n");
    CHECK_INT_EQ(cfg.data.shuffle, 0);
    CHECK_INT_EQ(cfg.logging.tensorboard, 1);
    CHECK_INT_EQ(cfg.training.use_gpu, 1);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CUDA);
    CHECK_INT_EQ(cfg.training.comm, DT_COMM_AUTO);
    CHECK_INT_EQ(cfg.training.precision, DT_PREC_BF16);
    CHECK(cfg.training.seed == 42);
    CHECK_INT_EQ(cfg.checkpoint.resume, DT_RESUME_NEVER);
    CHECK_INT_EQ(cfg.optimizer.schedule, DT_SCHED_CONSTANT);
    LOAD_OK(MIN "  format: tsv\ntraining: {device: cuda, communication_backend: nccl, use_gpu: on}\n");
    CHECK_INT_EQ(cfg.data.format, DT_FORMAT_TSV);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CUDA);
    CHECK_INT_EQ(cfg.training.comm, DT_COMM_NCCL);
    /* device alone (use_gpu stays "not given"); use_gpu: false alone -> cpu */
    LOAD_OK(MIN "training:\n  device: cuda\n");
    CHECK_INT_EQ(cfg.training.use_gpu, -1);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CUDA);
    LOAD_OK(MIN "training:\n  use_gpu: 0\n  device: auto\n  resources_per_worker: {gpu: 0}\n");
    CHECK_INT_EQ(cfg.training.use_gpu, 0);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CPU);
}

static void test_seed_example(void) {
    static const char *seed =
        "training:\n"
        "  num_workers: 4            # worker processes = GPUs used; 1 = single device\n"
        "  use_gpu: true             # false = CPU workers; missing GPU with use_gpu: true is an error\n"
        "  resources_per_worker: {gpu: 1}\n"
        "  communication_backend: \"collective\"   # collective|auto -> nccl on GPU, shm on CPU; or nccl|shm\n"
        "  epochs: 3                 # or max_steps\n"
        "data:\n"
        "  train_path: \"data/train.tsv\"   # file, directory or glob\n"
        "  val_path: \"data/val.tsv\"\n"
        "  batch_size_per_worker: 16\n"
        "model:\n"
        "  type: \"transformer_like\"  # GPT-2 style decoder\n"
        "  num_labels: 2             # 0 or absent = language modelling; >=2 = sequence classification\n";
    LOAD_OK(seed);
    CHECK_INT_EQ(cfg.training.num_workers, 4);
    CHECK_INT_EQ(cfg.training.use_gpu, 1);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CUDA);
    CHECK_INT_EQ(cfg.training.gpus_per_worker, 1);
    CHECK_INT_EQ(cfg.training.comm, DT_COMM_AUTO);
    CHECK_INT_EQ(cfg.training.epochs, 3);
    CHECK_STR_EQ(cfg.data.train_path, "data/train.tsv");
    CHECK_STR_EQ(cfg.data.val_path, "data/val.tsv");
    CHECK_INT_EQ(cfg.data.batch_size_per_worker, 16);
    CHECK_STR_EQ(cfg.model.type, "transformer_like");
    CHECK_INT_EQ(cfg.model.shape.num_labels, 2);
    CHECK_STR_EQ(cfg.run.dir, "runs/finetune");

    /* the same as a real file */
    const char *path = DTRAIN_SOURCE_DIR "/tests/configs/finetune.yaml";
    CHECK_INT_EQ(dt_config_load(&cfg, path, NULL, 0), DT_OK);
    CHECK_STR_EQ(cfg.source, path);
    CHECK_STR_EQ(cfg.run.dir, "runs/finetune");
    CHECK_INT_EQ(cfg.training.num_workers, 4);
    CHECK_INT_EQ(cfg.model.shape.num_labels, 2);
}

static void test_errors(void) {
    /* the STYLE.md example (the range now includes the largest world, DT_MAX_WORLD) */
    LOAD_ERR("finetune.yaml:7: training.num_workers: expected an integer in [1, 64], got \"four\"",
             "# fine-tune\n" MIN "model:\n  num_labels: 2\ntraining:\n  num_workers: four\n");
    /* more workers than any launcher, collective or per-rank table can hold */
    LOAD_ERR("finetune.yaml:4: training.num_workers: expected an integer in [1, 64], got \"100\"",
             MIN "training:\n  num_workers: 100\n");
    LOAD_OK(MIN "training:\n  num_workers: 64\n");
    LOAD_ERR("finetune.yaml:4: training.zero_stage: expected an integer in [0, 1], got \"2\"",
             MIN "training:\n  zero_stage: 2\n");
    LOAD_ERR("finetune.yaml:4: training.grad_comm_dtype: expected one of fp32, bf16, got \"fp16\"",
             MIN "training:\n  grad_comm_dtype: fp16\n");
    /* unknown keys: did-you-mean by edit distance, by the same name in another section, by a
     * longer key containing it, or the list of known keys */
    LOAD_ERR("finetune.yaml:3: training.num_worker: unknown key (did you mean training.num_workers?)",
             "# the brief's example\ntraining:\n  num_worker: 4\n" MIN);
    LOAD_ERR("finetune.yaml:5: training.lr: unknown key (did you mean optimizer.lr?)",
             MIN "training:\n  epochs: 2\n  lr: 0.1\n");
    LOAD_ERR("finetune.yaml:2: data.batch_size: unknown key (did you mean data.batch_size_per_worker?)",
             "data:\n  batch_size: 4\n  train_path: x\n");
    LOAD_ERR("finetune.yaml:5: training.resources_per_worker.cpu: unknown key (did you mean "
             "training.resources_per_worker.gpu?)",
             MIN "training:\n  resources_per_worker:\n    cpu: 1\n");
    /* the keys that act on evaluations and samples need what they act on */
    LOAD_ERR("finetune.yaml:4: checkpoint.best_metric: needs validation data to compare checkpoints by (hint: set "
             "data.val_path)", MIN "checkpoint:\n  best_metric: val_loss\n");
    LOAD_ERR("finetune.yaml:5: checkpoint.best_metric: expected none, val_loss or val_accuracy for a language model, "
             "got \"val_f1\" (macro-F1 is a classification score)",
             MIN "  val_path: v\ncheckpoint:\n  best_metric: val_f1\n");
    LOAD_ERR("finetune.yaml:4: checkpoint.best_metric: expected one of none, val_loss, val_accuracy, val_f1, got "
             "\"f1\"", MIN "checkpoint:\n  best_metric: f1\n");
    LOAD_ERR("finetune.yaml:5: training.early_stopping_patience: needs evaluations during training to count (hint: "
             "set data.val_path and eval.every_steps > 0)",
             MIN "  val_path: v\ntraining:\n  early_stopping_patience: 2\neval:\n  every_steps: 0\n");
    LOAD_ERR("finetune.yaml:4: logging.sample_every_steps: needs logging.sample_prompt with the byte tokenizer (it "
             "has no end-of-text token to start from)", MIN "logging:\n  sample_every_steps: 5\n");
    LOAD_ERR("finetune.yaml:4: logging.sample_every_steps: expected 0 for a classifier (model.num_labels: 2): samples "
             "are generated text (hint: dtrain predict shows a classifier's labels)",
             MIN "logging:\n  sample_every_steps: 5\n  sample_prompt: x\nmodel:\n  num_labels: 2\n");
    LOAD_ERR("finetune.yaml:4: eval.frequency: unknown key (known keys in eval: every_steps, max_batches)",
             MIN "eval:\n  frequency: 3\n");
    LOAD_ERR("finetune.yaml:4: training.dropout: unknown key (known keys in training: num_workers, use_gpu, "
             "device, resources_per_worker, communication_backend, epochs, max_steps, grad_accum_steps, "
             "precision, seed, collective_timeout_s, cpu_threads_per_worker, adapt_cpu_threads, check_replicas_every, "
             "zero_stage, tensor_parallel, pipeline_parallel, grad_comm_dtype, hierarchical_allreduce, "
             "early_stopping_patience)",
             MIN "training:\n  dropout: 0.1\n");
    /* Llama 3.1's rope scaling, nested as config.json nests it */
#define LLAMA MIN "model:\n  type: llama\n  intermediate_size: 64\n  rope_scaling:\n"
    LOAD_ERR("finetune.yaml:7: model.rope_scaling.factor: expected 0 (RoPE not scaled) or at least 1 (Llama 3.1's "
             "scaling), got 0.5", LLAMA "    factor: 0.5\n");
    LOAD_ERR("finetune.yaml:9: model.rope_scaling.high_freq_factor: expected more than "
             "model.rope_scaling.low_freq_factor (2), got 2", LLAMA "    factor: 8\n    low_freq_factor: 2\n    "
             "high_freq_factor: 2\n");
    CHECK_OK(dt_config_load_string(&cfg, NAME, LLAMA "    factor: 32\n    original_max_position_embeddings: 4096\n", NULL,
                                   0));
    CHECK(cfg.model.shape.rope_scaling_factor == 32 && cfg.model.shape.rope_original_max_position_embeddings == 4096 &&
          cfg.model.shape.rope_high_freq_factor == 4);
#undef LLAMA
    /* unknown sections */
    LOAD_ERR("finetune.yaml:3: trainig: unknown section (did you mean training?)", MIN "trainig:\n  epochs: 1\n");
    LOAD_ERR("finetune.yaml:1: num_workers: unknown section (did you mean training.num_workers?)",
             "num_workers: 2\n" MIN);
    LOAD_ERR("finetune.yaml:3: wandb: unknown section (known sections: run, training, optimizer, data, model, "
             "eval, checkpoint, logging, fault_tolerance)",
             MIN "wandb:\n  project: x\n");
    /* structure */
    LOAD_ERR("finetune.yaml:3: training: expected a mapping, got \"5\"", MIN "training: 5\n");
    LOAD_ERR("finetune.yaml:3: model: expected a mapping, got a list", MIN "model: [1, 2]\n");
    LOAD_ERR("finetune.yaml:4: training.epochs: expected an integer >= 1, got a mapping",
             MIN "training:\n  epochs:\n    n: 3\n");
    LOAD_ERR("finetune.yaml:4: training.resources_per_worker: expected a mapping, got \"1\" (hint: write "
             "resources_per_worker: {gpu: 1})",
             MIN "training:\n  resources_per_worker: 1\n");
    LOAD_ERR("finetune.yaml:5: training.epochs: duplicate key, first set at line 4",
             MIN "training:\n  epochs: 2\n  epochs: 3\n");
    LOAD_ERR("finetune.yaml:4: data: duplicate key, first set at line 1", MIN "model: {}\ndata: {}\n");
    LOAD_ERR("finetune.yaml:4: training: expected a key name, got a list", MIN "training:\n  ? [a]\n  : 1\n");
    /* YAML syntax */
    LOAD_ERR("finetune.yaml:4: YAML syntax error: found character that cannot start any token",
             MIN "training:\n\tepochs: 2\n");
    LOAD_ERR("finetune.yaml:5: YAML syntax error: did not find expected ',' or ']'",
             MIN "optimizer:\n  betas: [0.9, 0.95\n  lr: 1\n");
    LOAD_ERR("finetune.yaml:1: YAML syntax error: mapping values are not allowed in this context",
             "data: train_path: x\n");
    /* documents that are not a mapping */
    LOAD_ERR("finetune.yaml: expected a mapping of sections like training: and data:, got an empty document", "");
    LOAD_ERR("finetune.yaml: expected a mapping of sections like training: and data:, got an empty document",
             "# nothing but a comment\n\n");
    LOAD_ERR("finetune.yaml:2: expected a mapping of sections like training: and data:, got a list",
             "\n- data\n- model\n");
    LOAD_ERR("finetune.yaml:1: expected a mapping of sections like training: and data:, got \"hello\"", "hello\n");
    LOAD_ERR("finetune.yaml: expected a mapping of sections like training: and data:, got an empty document", "~\n");
    LOAD_ERR("finetune.yaml:4: expected a single YAML document, got a second one (hint: remove the \"---\" line)",
             MIN "---\ntraining: {epochs: 2}\n");
    /* required key */
    LOAD_ERR("finetune.yaml: data.train_path: required key is missing (hint: add train_path under data:, or "
             "pass --set data.train_path=PATH)",
             "training:\n  epochs: 2\n");
    LOAD_ERR("finetune.yaml:2: data.train_path: expected a non-empty path, got \"\"", "data:\n  train_path: \"\"\n");
    /* types and ranges */
    LOAD_ERR("finetune.yaml:3: data.seq_len: expected an integer >= 2, got \"12.5\"", MIN "  seq_len: 12.5\n");
    LOAD_ERR("finetune.yaml:3: data.seq_len: expected an integer >= 2, got \"128abc\"", MIN "  seq_len: 128abc\n");
    LOAD_ERR("finetune.yaml:3: data.seq_len: expected an integer >= 2, got \"1\"", MIN "  seq_len: 1\n");
    LOAD_ERR("finetune.yaml:3: data.batch_size_per_worker: expected an integer >= 1, got \"99999999999\"",
             MIN "  batch_size_per_worker: 99999999999\n");
    LOAD_ERR("finetune.yaml:4: optimizer.lr: expected a number > 0, got \"3e-4x\"", MIN "optimizer:\n  lr: 3e-4x\n");
    LOAD_ERR("finetune.yaml:4: optimizer.lr: expected a number > 0, got \"0\"", MIN "optimizer:\n  lr: 0\n");
    LOAD_ERR("finetune.yaml:4: optimizer.min_lr_ratio: expected a number in [0, 1], got \"1.5\"",
             MIN "optimizer:\n  min_lr_ratio: 1.5\n");
    LOAD_ERR("finetune.yaml:4: optimizer.eps: expected a number > 0, got \".nan\"", MIN "optimizer:\n  eps: .nan\n");
    LOAD_ERR("finetune.yaml:4: training.seed: expected an integer >= 0, got \"-1\"", MIN "training:\n  seed: -1\n");
    LOAD_ERR("finetune.yaml:3: data.shuffle: expected a boolean (true or false), got \"maybe\"",
             MIN "  shuffle: maybe\n");
    LOAD_ERR("finetune.yaml:4: training.resources_per_worker.gpu: expected an integer in [0, 1], got \"2\"",
             MIN "training:\n  resources_per_worker: {gpu: 2}\n");
    LOAD_ERR("finetune.yaml:4: checkpoint.keep_last: expected an integer >= 1, got \"0\"",
             MIN "checkpoint:\n  keep_last: 0\n");
    LOAD_ERR("finetune.yaml:4: logging.every_steps: expected an integer >= 1, got \"0\"",
             MIN "logging:\n  every_steps: 0\n");
    LOAD_ERR("finetune.yaml:4: checkpoint.resume: expected auto, never or a checkpoint path, got \"\"",
             MIN "checkpoint:\n  resume: ''\n");
    /* enums */
    LOAD_ERR("finetune.yaml:4: training.device: expected one of cpu, cuda, auto, got \"gpu\"",
             MIN "training:\n  device: gpu\n");
    LOAD_ERR("finetune.yaml:4: training.communication_backend: expected one of collective, auto, shm, nccl, mpi, tcp, got "
             "\"gloo\"",
             MIN "training:\n  communication_backend: gloo\n");
    LOAD_ERR("finetune.yaml:4: training.precision: expected one of auto, fp32, bf16, got \"fp16\"",
             MIN "training:\n  precision: fp16\n");
    LOAD_ERR("finetune.yaml:4: optimizer.schedule: expected one of constant, cosine, linear, got \"step\"",
             MIN "optimizer:\n  schedule: step\n");
    LOAD_ERR("finetune.yaml:3: data.format: expected one of auto, tokens, tsv, chat, completion, got \"csv\"", MIN "  format: csv\n");
    LOAD_ERR("finetune.yaml:3: data.pad_to: expected one of longest, seq_len, got \"max_length\"", MIN "  pad_to: max_length\n");
    LOAD_OK(MIN);
    CHECK_INT_EQ(cfg.data.pad_to_longest, 1); /* the default */
    LOAD_OK(MIN "  pad_to: seq_len\n");
    CHECK_INT_EQ(cfg.data.pad_to_longest, 0);
    LOAD_ERR("finetune.yaml:4: model.type: expected one of transformer_like, gpt2, llama, got \"bert\"",
             MIN "model:\n  type: bert\n");
    /* betas */
    LOAD_ERR("finetune.yaml:4: optimizer.betas: expected a list of two numbers [beta1, beta2], got a list of 3 "
             "(hint: write betas: [0.9, 0.95])",
             MIN "optimizer:\n  betas: [0.9, 0.95, 0.99]\n");
    LOAD_ERR("finetune.yaml:4: optimizer.betas: expected a list of two numbers [beta1, beta2], got \"0.9\" "
             "(hint: write betas: [0.9, 0.95])",
             MIN "optimizer:\n  betas: 0.9\n");
    LOAD_ERR("finetune.yaml:6: optimizer.betas[1]: expected a number in [0, 1), got \"1.0\"",
             MIN "optimizer:\n  betas:\n    - 0.9\n    - 1.0\n");
    LOAD_ERR("finetune.yaml:4: optimizer.betas[0]: expected a number in [0, 1), got a list",
             MIN "optimizer:\n  betas: [[0.9], 0.95]\n");
    /* cross-field rules, naming the key and its line */
    LOAD_ERR("finetune.yaml:5: model.n_embd: expected a multiple of model.n_head (12), got \"100\"",
             MIN "model:\n  n_head: 12\n  n_embd: 100\n");
    LOAD_ERR("finetune.yaml:4: model.n_head: expected a divisor of model.n_embd (128), got \"5\"",
             MIN "model:\n  n_head: 5\n");
    LOAD_ERR("finetune.yaml:5: model.n_positions: expected an integer >= data.seq_len (128), got \"100\"",
             MIN "  seq_len: 128\nmodel:\n  n_positions: 100\n");
    LOAD_ERR("finetune.yaml:4: model.num_labels: expected 0 (language modelling) or an integer >= 2 "
             "(classification), got \"1\"",
             MIN "model:\n  num_labels: 1\n");
    LOAD_ERR("finetune.yaml:5: model.vocab_size: expected an integer >= 257 when model.num_labels >= 2, got "
             "\"256\" (hint: classification uses the byte tokenizer: 256 byte ids + <cls>)",
             MIN "model:\n  num_labels: 3\n  vocab_size: 256\n");
    LOAD_ERR("finetune.yaml:5: training.device: expected cpu or auto with training.use_gpu: false, got \"cuda\" "
             "(hint: keep only one of training.use_gpu and training.device)",
             MIN "training:\n  use_gpu: false\n  device: cuda\n");
    LOAD_ERR("finetune.yaml:4: training.device: expected cuda or auto with training.use_gpu: true, got \"cpu\" "
             "(hint: keep only one of training.use_gpu and training.device)",
             MIN "training:\n  device: cpu\n  use_gpu: true\n");
    LOAD_ERR("finetune.yaml:5: training.resources_per_worker.gpu: expected 1 when training.device is cuda, got "
             "\"0\" (hint: one GPU per worker)",
             MIN "training:\n  use_gpu: true\n  resources_per_worker: {gpu: 0}\n");
    /* bf16 on a CPU: accepted here; the CPU backend refuses it where the CPU has no bf16 products */
    LOAD_OK(MIN "training:\n  device: cpu\n  precision: bf16\n");
    CHECK_INT_EQ(cfg.training.precision, DT_PREC_BF16);
    LOAD_ERR("finetune.yaml:4: training.communication_backend: expected collective, auto, shm, mpi or tcp when "
             "training.device is cpu, got \"nccl\" (hint: NCCL needs GPUs)",
             MIN "training:\n  communication_backend: nccl\n  use_gpu: no\n");
    /* model parallelism: the mesh must divide the workers and the layers; what is not built yet is refused */
    LOAD_OK(MIN "training:\n  device: cpu\n  num_workers: 4\n  tensor_parallel: 2\n");
    CHECK_INT_EQ(cfg.training.tensor_parallel, 2);
    CHECK_INT_EQ(cfg.training.pipeline_parallel, 1);
    LOAD_ERR("finetune.yaml:6: training.tensor_parallel: expected a divisor of training.num_workers (3), got 2 "
             "(num_workers = data-parallel replicas x pipeline_parallel x tensor_parallel)",
             MIN "training:\n  device: cpu\n  num_workers: 3\n  tensor_parallel: 2\n");
    LOAD_ERR("finetune.yaml:6: training.tensor_parallel: expected at most model.vocab_size (3), got 4 (each worker "
             "takes at least one row of the vocabulary)",
             MIN "training:\n  device: cpu\n  num_workers: 4\n  tensor_parallel: 4\nmodel:\n  vocab_size: 3\n");
    LOAD_ERR("finetune.yaml:6: training.tensor_parallel: expected a divisor of model.n_head (4), got 3 (each worker "
             "takes whole attention heads)", MIN "training:\n  device: cpu\n  num_workers: 3\n  tensor_parallel: 3\n");
    LOAD_ERR("finetune.yaml:6: training.tensor_parallel: expected a divisor of model.num_key_value_heads (2), got 4 "
             "(each worker takes whole key/value heads)",
             MIN "training:\n  device: cpu\n  num_workers: 4\n  tensor_parallel: 4\nmodel:\n  type: llama\n"
                 "  n_head: 8\n  num_key_value_heads: 2\n  intermediate_size: 64\n");
    LOAD_ERR("finetune.yaml:6: training.tensor_parallel: expected a divisor of model.intermediate_size (66), got 4 "
             "(each worker takes an equal share of the MLP)",
             MIN "training:\n  device: cpu\n  num_workers: 4\n  tensor_parallel: 4\nmodel:\n  type: llama\n"
                 "  n_head: 8\n  intermediate_size: 66\n");
    LOAD_OK(MIN "training:\n  device: cpu\n  num_workers: 8\n  pipeline_parallel: 2\n  tensor_parallel: 2\n");
    CHECK_INT_EQ(cfg.training.pipeline_parallel, 2);
    LOAD_ERR("finetune.yaml:6: training.pipeline_parallel: expected a divisor of training.num_workers (6) / "
             "tensor_parallel (2), got 2 (num_workers = data-parallel replicas x pipeline_parallel x tensor_parallel)",
             MIN "training:\n  device: cpu\n  num_workers: 6\n  pipeline_parallel: 2\n  tensor_parallel: 2\n");
    LOAD_ERR("finetune.yaml:6: training.pipeline_parallel: expected at most model.n_layer (2), got 3 (each stage runs "
             "at least one layer)", MIN "training:\n  device: cpu\n  num_workers: 3\n  pipeline_parallel: 3\nmodel:\n"
                                       "  n_layer: 2\n");
    LOAD_OK(MIN "training:\n  device: cuda\n  num_workers: 2\n  pipeline_parallel: 2\n"); /* over NCCL */
    /* samples with stages: the first replica's stages generate together (tests/test_lora.c) */
    LOAD_OK(MIN "training:\n  device: cpu\n  num_workers: 2\n  pipeline_parallel: 2\nlogging:\n"
                "  sample_every_steps: 5\n  sample_prompt: The\n");
    LOAD_OK(MIN "training:\n  device: cuda\n  num_workers: 2\n  tensor_parallel: 2\n"); /* over NCCL */
    LOAD_OK(MIN "training:\n  device: cpu\n  num_workers: 4\n  tensor_parallel: 2\n  zero_stage: 1\n");
    /* model.lora with both (tests/test_lora.c trains them) */
    LOAD_OK(MIN "training:\n  device: cpu\n  num_workers: 4\n  tensor_parallel: 2\n  pipeline_parallel: 2\nmodel:\n"
                "  lora:\n    rank: 4\n");
    /* a cross-field error on a key set by an override names the override */
    LOAD_ERR("--set training.resources_per_worker={gpu: 0}: training.resources_per_worker.gpu: expected 1 when training.device is cuda, got "
             "\"0\" (hint: one GPU per worker)",
             MIN "training:\n  use_gpu: true\n", "training.resources_per_worker={gpu: 0}");

    /* a real file with an error: the message carries the path as given */
    dt_error_clear();
    CHECK_INT_EQ(dt_config_load(&cfg, DTRAIN_SOURCE_DIR "/tests/configs/bad_workers.yaml", NULL, 0), DT_ERR_CONFIG);
    CHECK_STR_EQ(dt_error_msg(), DTRAIN_SOURCE_DIR "/tests/configs/bad_workers.yaml:7: training.num_workers: "
                                                   "expected an integer in [1, 64], got \"four\"");
}

static void test_env(void) {
    setenv("DT_TEST_USER", "alice", 1);
    setenv("DT_TEST_NW", "3", 1);
    setenv("DT_TEST_BAD", "four", 1);
    LOAD_OK(MIN "run:\n  dir: \"runs/${DT_TEST_USER}/x-${DT_TEST_NW}\"\ntraining:\n  num_workers: ${DT_TEST_NW}\n"
                "model:\n  init_from: ${DT_TEST_USER}\n");
    CHECK_STR_EQ(cfg.run.dir, "runs/alice/x-3");
    CHECK_INT_EQ(cfg.training.num_workers, 3);
    CHECK_STR_EQ(cfg.model.init_from, "alice");
    /* a lone $ or $NAME is literal */
    LOAD_OK(MIN "run:\n  dir: a$b$\n");
    CHECK_STR_EQ(cfg.run.dir, "a$b$");
    /* the substituted value is typed like any other; the message shows what the file says */
    LOAD_ERR("finetune.yaml:4: training.num_workers: expected an integer in [1, 64], got \"${DT_TEST_BAD}\" (after "
             "substituting the environment)",
             MIN "training:\n  num_workers: ${DT_TEST_BAD}\n");
    unsetenv("DT_TEST_UNSET");
    LOAD_ERR("finetune.yaml:4: run.dir: environment variable DT_TEST_UNSET is not set",
             MIN "run:\n  dir: \"runs/${DT_TEST_UNSET}/x\"\n");
    LOAD_ERR("finetune.yaml:5: optimizer.betas[1]: environment variable DT_TEST_UNSET is not set",
             MIN "optimizer:\n  betas: [0.9,\n    \"${DT_TEST_UNSET}\"]\n");
    LOAD_ERR("finetune.yaml:4: run.dir: expected ${NAME} with a NAME of letters, digits and _, got \"x/${HOME\"",
             MIN "run:\n  dir: x/${HOME\n");
    /* in overrides too */
    LOAD_OK(MIN, "data.val_path=${DT_TEST_USER}.tsv");
    CHECK_STR_EQ(cfg.data.val_path, "alice.tsv");
    LOAD_ERR("--set data.val_path=${DT_TEST_UNSET}: data.val_path: environment variable DT_TEST_UNSET is not set",
             MIN, "data.val_path=${DT_TEST_UNSET}");
}

/* Printing the config text of `c` into a malloc'd string. */
static char *printed(const dt_config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_config_print(c, mem);
    fclose(mem);
    return text;
}

/* A ${NAME} value never shows up expanded: not in the printed (saved) config, not in a
 * message, not in a diff; a saved config is read back without substituting anything. */
static void test_env_secrets(void) {
    setenv("DT_TEST_SECRET", "hunter2", 1);
    setenv("DT_TEST_LR", "0.5", 1);
    LOAD_OK(MIN "run:\n  dir: runs/${DT_TEST_SECRET}\noptimizer:\n  lr: ${DT_TEST_LR}\n  betas: [0.9, \"${DT_TEST_LR}\"]\n",
            "data.val_path=${DT_TEST_SECRET}.tsv");
    CHECK_STR_EQ(cfg.run.dir, "runs/hunter2");
    CHECK_STR_EQ(cfg.data.val_path, "hunter2.tsv");
    CHECK(cfg.optimizer.lr == 0.5 && cfg.optimizer.beta2 == 0.5);
    char *text = printed(&cfg);
    CHECK(strstr(text, "hunter2") == NULL);
    CHECK_STR_CONTAINS(text, "\n  dir: \"runs/${DT_TEST_SECRET}\"\n");
    CHECK_STR_CONTAINS(text, "\n  val_path: \"${DT_TEST_SECRET}.tsv\"\n");
    CHECK_STR_CONTAINS(text, "\n  lr: \"${DT_TEST_LR}\"\n");
    CHECK_STR_CONTAINS(text, "\n  betas: [0.9, \"${DT_TEST_LR}\"]\n");
    /* the printed text loads back to the same values (and digest) */
    dt_config a = cfg, b, saved;
    CHECK_INT_EQ(dt_config_load_string(&b, NAME, text, NULL, 0), DT_OK);
    CHECK_STR_EQ(b.run.dir, "runs/hunter2");
    CHECK(b.optimizer.lr == 0.5 && b.optimizer.beta2 == 0.5);
    CHECK(dt_config_digest(&a) == dt_config_digest(&b));
    /* a field changed after loading (bench, an external launcher's world size) prints as it is */
    setenv("DT_TEST_NW", "3", 1);
    LOAD_OK(MIN "training:\n  num_workers: ${DT_TEST_NW}\n  seed: ${DT_TEST_NW}\n");
    cfg.training.num_workers = 5;
    free(text);
    text = printed(&cfg);
    CHECK_STR_CONTAINS(text, "\n  num_workers: 5\n");
    CHECK_STR_CONTAINS(text, "\n  seed: \"${DT_TEST_NW}\"\n");
    char shown_buf[64];
    CHECK_STR_EQ(dt_config_shown(&cfg, "training.seed", shown_buf, sizeof shown_buf), "${DT_TEST_NW}");
    CHECK_STR_EQ(dt_config_shown(&cfg, "training.num_workers", shown_buf, sizeof shown_buf), "5");
    CHECK_STR_EQ(dt_config_shown(&cfg, "optimizer.betas[1]", shown_buf, sizeof shown_buf), "0.999");
    /* a key set again without ${} forgets the written form */
    LOAD_OK(MIN "run:\n  dir: runs/${DT_TEST_SECRET}\n", "run.dir=plain");
    free(text);
    text = printed(&cfg);
    CHECK_STR_CONTAINS(text, "\n  dir: \"plain\"\n");
    free(text);
    /* messages: the value as written */
    dt_error_clear();
    CHECK_INT_EQ(dt_config_load_string(&b, NAME, MIN "model:\n  n_layer: ${DT_TEST_SECRET}\n", NULL, 0),
                 DT_ERR_CONFIG);
    CHECK(strstr(dt_error_msg(), "hunter2") == NULL);
    CHECK_STR_CONTAINS(dt_error_msg(), "got \"${DT_TEST_SECRET}\"");
    /* in the cross-field rules too */
    setenv("DT_TEST_EMBD", "33", 1);
    setenv("DT_TEST_HEAD", "5", 1);
    LOAD_ERR("finetune.yaml:4: model.n_embd: expected a multiple of model.n_head (${DT_TEST_HEAD}), got "
             "\"${DT_TEST_EMBD}\" (after substituting the environment)",
             MIN "model:\n  n_embd: ${DT_TEST_EMBD}\n  n_head: ${DT_TEST_HEAD}\n");
    LOAD_ERR("finetune.yaml:5: model.n_positions: expected an integer >= data.seq_len (64), got \"${DT_TEST_HEAD}\" "
             "(after substituting the environment)",
             MIN "model:\n  n_embd: 32\n  n_positions: ${DT_TEST_HEAD}\n");

    /* a saved config is not expanded: a crafted one cannot print the environment */
    mkdir(DTRAIN_TEST_TMP, 0755);
    const char *path = DTRAIN_TEST_TMP "/config_saved.yaml";
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("data:\n  train_path: ${DT_TEST_SECRET}\nrun:\n  dir: runs/${DT_TEST_SECRET}\n"
          "optimizer:\n  lr: ${DT_TEST_LR}\n", f);
    CHECK(fclose(f) == 0);
    CHECK_INT_EQ(dt_config_load_saved(&saved, path), DT_OK);
    CHECK_STR_EQ(saved.data.train_path, "${DT_TEST_SECRET}");
    CHECK_STR_EQ(saved.run.dir, "runs/${DT_TEST_SECRET}");
    CHECK(saved.optimizer.lr == 3e-4); /* not a string: the default, the text kept for printing */
    text = printed(&saved);
    CHECK(strstr(text, "hunter2") == NULL && strstr(text, "0.5") == NULL);
    CHECK_STR_CONTAINS(text, "\n  lr: \"${DT_TEST_LR}\"\n");
    free(text);
    /* the diff compares written forms, so it neither reports these keys nor shows values */
    CHECK_INT_EQ(dt_config_load(&b, path, NULL, 0), DT_OK);
    char diff[1024];
    CHECK_INT_EQ(dt_config_diff(&saved, &b, diff, sizeof diff), 0);
    const char *const ovr[] = {"data.train_path=/data/x", "run.dir=plain/${DT_TEST_SECRET}"};
    CHECK_INT_EQ(dt_config_load(&b, path, ovr, 2), DT_OK);
    CHECK_INT_EQ(dt_config_diff(&saved, &b, diff, sizeof diff), 2);
    CHECK(strstr(diff, "hunter2") == NULL);
    CHECK_STR_CONTAINS(diff, "data.train_path \"${DT_TEST_SECRET}\" -> \"/data/x\"");
    remove(path);
    unsetenv("DT_TEST_SECRET");
}

/* Encoding errors name their line, a NUL in a value is an error, a quoted value is one line. */
static void test_encoding(void) {
    LOAD_ERR("finetune.yaml:4: YAML encoding error at byte offset 49: invalid leading UTF-8 octet (byte 0xff)",
             MIN "run:\n  dir: ab\xff\n");
    LOAD_ERR("finetune.yaml:2: data.train_path: expected text without NUL characters, got a NUL at byte 7 of the "
             "value",
             "data:\n  train_path: \"data/tr\\0ain.tsv\"\n");
    LOAD_ERR("finetune.yaml:4: training.num_workers: expected an integer in [1, 64], got \"12 first line...\"",
             MIN "training:\n  num_workers: |\n    12 first line\n    second\n");
    LOAD_ERR("finetune.yaml:6: YAML encoding error at byte offset 84: control characters are not allowed (byte 0x1b)",
             MIN "training:\n  num_workers: |\n    12 first line\n    \x1b[31m second\n");
    LOAD_ERR("finetune.yaml:4: training.num_workers: expected an integer in [1, 64], got "
             "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\"",
             MIN "training:\n  num_workers: "
                 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n");
    LOAD_ERR("finetune.yaml:4: training.num_workers: expected an integer in [1, 64], got \"\\x1b[2Jx\"",
             MIN "training:\n  num_workers: \"\\e[2Jx\"\n");
    /* key names and the file's name are quoted like values (escapes, line breaks, stray bytes) */
    LOAD_ERR("finetune.yaml:3: tr\\x1b[31mX\\x0aline2: unknown section (known sections: run, training, optimizer, data, "
             "model, eval, checkpoint, logging, fault_tolerance)",
             MIN "\"tr\\e[31mX\\nline2\": 1\n");
    dt_error_clear();
    CHECK_INT_EQ(dt_config_load_string(&cfg, "odd\nname\xff.yaml", "training: {num_workers: 0}\n", NULL, 0),
                 DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "odd\\x0aname\\xff.yaml:1: training.num_workers: expected");
    mkdir(DTRAIN_TEST_TMP, 0755);
    const char *odd_path = DTRAIN_TEST_TMP "/odd\nname\xff.yaml";
    FILE *of = fopen(odd_path, "w");
    CHECK(of && fputs(MIN, of) >= 0 && fclose(of) == 0);
    CHECK_INT_EQ(dt_config_load(&cfg, odd_path, NULL, 0), DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "/odd\\x0aname\\xff.yaml: run.dir: expected to default to runs/<config name>, "
                                       "but the config's file name is not UTF-8 text (hint: set run.dir)");
    const char *const set_dir[] = {"run.dir=runs/x"};
    CHECK_INT_EQ(dt_config_load(&cfg, odd_path, set_dir, 1), DT_OK);
    char *odd_text = printed(&cfg);
    CHECK_STR_CONTAINS(odd_text, "/odd\\x0aname\\xff.yaml\nrun:\n  dir: \"runs/x\"\n");
    dt_config back_odd;
    CHECK_INT_EQ(dt_config_load_string(&back_odd, NAME, odd_text, NULL, 0), DT_OK);
    free(odd_text);
    remove(odd_path);
    /* --set values are UTF-8 like the file (a saved config.yaml must load back) */
    LOAD_ERR("--set data.val_path=\\xffv: data.val_path: expected UTF-8 text, got the byte 0xff at offset 0 of the "
             "value",
             MIN, "data.val_path=\xffv");
    LOAD_ERR("--set run.dir=a\\xc0\\xaf: run.dir: expected UTF-8 text, got the byte 0xc0 at offset 1 of the value",
             MIN, "run.dir=a\xc0\xaf");
    /* YAML's own line breaks beyond ASCII, C1 controls and the BOM print escaped and load back */
    const char *odd = "a\xc2\x85" "b\xe2\x80\xa8" "c\xe2\x80\xa9" "d\xc2\x80" "e\xef\xbb\xbf" "f\xef\xbf\xbf" "g\xc3\xa9";
    char ovr[128];
    snprintf(ovr, sizeof ovr, "data.val_path=%s", odd);
    LOAD_OK(MIN, ovr);
    CHECK_STR_EQ(cfg.data.val_path, odd);
    char *text = printed(&cfg);
    CHECK_STR_CONTAINS(text, "val_path: \"a\\Nb\\Lc\\Pd\\x80e\\uFEFFf\\uFFFFg\xc3\xa9\"\n");
    dt_config back;
    CHECK_INT_EQ(dt_config_load_string(&back, NAME, text, NULL, 0), DT_OK);
    CHECK_STR_EQ(back.data.val_path, odd);
    free(text);
}

static void test_overrides(void) {
    LOAD_OK(MIN "training:\n  num_workers: 2\n", "training.num_workers=8", "optimizer.betas=[0.9,0.95]",
            "model.init_from=w/m.safetensors", "training.num_workers=6", "data.val_path=\"a b: c.tsv\"",
            "training.resources_per_worker={gpu: 0}", "training.use_gpu=false", "checkpoint.resume=runs/x/ck",
            "optimizer.lr=1e-3", "data.train_path=other.bin");
    CHECK_INT_EQ(cfg.training.num_workers, 6); /* in order: the last one wins */
    CHECK(cfg.optimizer.beta1 == 0.9);
    CHECK(cfg.optimizer.beta2 == 0.95);
    CHECK_STR_EQ(cfg.model.init_from, "w/m.safetensors");
    CHECK_STR_EQ(cfg.data.val_path, "a b: c.tsv");
    CHECK_INT_EQ(cfg.training.gpus_per_worker, 0);
    CHECK_INT_EQ(cfg.training.use_gpu, 0);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CPU);
    CHECK_INT_EQ(cfg.checkpoint.resume, DT_RESUME_PATH);
    CHECK_STR_EQ(cfg.checkpoint.resume_path, "runs/x/ck");
    CHECK(cfg.optimizer.lr == 1e-3);
    CHECK_STR_EQ(cfg.data.train_path, "other.bin");
    /* block-free forms: a whole section, a nested key, a value with '=' and glob characters */
    LOAD_OK("run: {}\n", "data={train_path: d/*.bin, seq_len: 32}", "training.resources_per_worker.gpu=1",
            "run.dir=runs/a=b", "checkpoint.resume=auto", "model.init_from=");
    CHECK_STR_EQ(cfg.data.train_path, "d/*.bin");
    CHECK_INT_EQ(cfg.data.seq_len, 32);
    CHECK_INT_EQ(cfg.model.shape.n_positions, 32);
    CHECK_STR_EQ(cfg.run.dir, "runs/a=b");
    CHECK_INT_EQ(cfg.checkpoint.resume, DT_RESUME_AUTO);
    /* an override can fix what the file broke only if the file parses: the file is checked first */
    LOAD_OK(MIN "model:\n  n_head: 5\n", "model.n_head=8");
    CHECK_INT_EQ(cfg.model.shape.n_head, 8);

    LOAD_ERR("--set training.num_workers=four: training.num_workers: expected an integer in [1, 64], got \"four\"", MIN,
             "training.num_workers=four");
    LOAD_ERR("--set training.num_workers: expected key.path=value, got \"training.num_workers\"", MIN,
             "training.num_workers");
    LOAD_ERR("--set =3: expected key.path=value, got \"=3\"", MIN, "=3");
    LOAD_ERR("--set training.num_worker=4: training.num_worker: unknown key (did you mean training.num_workers?)",
             MIN, "training.num_worker=4");
    LOAD_ERR("--set trainig.epochs=4: trainig.epochs: unknown key (did you mean training.epochs?)", MIN,
             "trainig.epochs=4");
    LOAD_ERR("--set training.lr=4: training.lr: unknown key (did you mean optimizer.lr?)", MIN, "training.lr=4");
    LOAD_ERR("--set optimizer.betas=[0.9: optimizer.betas: YAML syntax error: did not find expected ',' or ']'", MIN,
             "optimizer.betas=[0.9");
    LOAD_ERR("--set optimizer.betas=[0.9, 1.5]: optimizer.betas[1]: expected a number in [0, 1), got \"1.5\"", MIN,
             "optimizer.betas=[0.9, 1.5]");
    LOAD_ERR("--set optimizer.betas=0.9: optimizer.betas: expected a list of two numbers [beta1, beta2], got "
             "\"0.9\" (hint: write betas: [0.9, 0.95])",
             MIN, "optimizer.betas=0.9");
    LOAD_ERR("--set training={gpu: 1}: training.gpu: unknown key (did you mean training.resources_per_worker.gpu?)",
             MIN, "training={gpu: 1}");
    LOAD_ERR("--set training.device=gpu: training.device: expected one of cpu, cuda, auto, got \"gpu\"", MIN,
             "training.num_workers=2", "training.device=gpu");
    /* cross-field errors point at the override that set the key last */
    LOAD_ERR("--set model.n_embd=102: model.n_embd: expected a multiple of model.n_head (4), got \"102\"", MIN,
             "model.n_embd=102");
    LOAD_ERR("--set training.device=cuda: training.device: expected cpu or auto with training.use_gpu: false, got "
             "\"cuda\" (hint: keep only one of training.use_gpu and training.device)",
             MIN "training:\n  use_gpu: false\n", "training.device=cuda");
    /* a missing data.train_path can be given on the command line only */
    LOAD_OK("model: {n_layer: 3}\n", "data.train_path=x.bin");
    CHECK_STR_EQ(cfg.data.train_path, "x.bin");
    CHECK_INT_EQ(cfg.model.shape.n_layer, 3);
}

/* print -> load gives the same struct, field by field and byte by byte (source aside) */
static void check_round_trip(const char *yaml, const char *const *ovr, int n_ovr) {
    dt_config a, b;
    CHECK_INT_EQ(dt_config_load_string(&a, "rt.yaml", yaml, ovr, n_ovr), DT_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    CHECK(mem != NULL);
    dt_config_print(&a, mem);
    CHECK(fclose(mem) == 0);
    dt_status st = dt_config_load_string(&b, "other.yaml", text, NULL, 0);
    if (st != DT_OK) fprintf(stderr, "reload failed: %s\n--- printed:\n%s", dt_error_msg(), text);
    CHECK_INT_EQ(st, DT_OK);
    /* the printed form is stable */
    char *text2 = NULL;
    size_t len2 = 0;
    mem = open_memstream(&text2, &len2);
    CHECK(mem != NULL);
    dt_config_print(&b, mem);
    CHECK(fclose(mem) == 0);
    CHECK_STR_EQ(text2, text);
    free(text2);
    free(text);

    CHECK_STR_EQ(b.run.dir, a.run.dir);
    CHECK_INT_EQ(b.training.use_gpu, a.training.use_gpu);
    CHECK_INT_EQ(b.training.device, a.training.device);
    CHECK(b.training.seed == a.training.seed);
    CHECK(b.optimizer.lr == a.optimizer.lr);
    CHECK(b.optimizer.beta1 == a.optimizer.beta1 && b.optimizer.beta2 == a.optimizer.beta2);
    CHECK_STR_EQ(b.checkpoint.resume_path, a.checkpoint.resume_path);
    CHECK_STR_EQ(b.model.init_from, a.model.init_from);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
}

static void test_round_trip(void) {
    check_round_trip(MIN, NULL, 0);
    check_round_trip(full_yaml, NULL, 0);
    check_round_trip(MIN "training: {use_gpu: true, precision: bf16}\nmodel: {num_labels: 4}\n", NULL, 0);
    check_round_trip(MIN "training: {device: cuda}\ncheckpoint: {resume: never}\n", NULL, 0);
    check_round_trip(MIN "training: {use_gpu: false}\n", NULL, 0);
    const char *const ovr[] = {"optimizer.lr=0.30000000000000004", "optimizer.betas=[0.1, 0.7]",
                               "optimizer.eps=1e-300", "fault_tolerance.backoff_s=0.1",
                               "data.val_path=\"quote\\\" back\\\\slash tab\\t nl\\n ü\"",
                               "checkpoint.resume=\"auto/x\"", "training.seed=0"};
    check_round_trip(MIN, ovr, (int)(sizeof ovr / sizeof ovr[0]));
    dt_config c;
    CHECK_INT_EQ(dt_config_load_string(&c, NAME, MIN, ovr, (int)(sizeof ovr / sizeof ovr[0])), DT_OK);
    CHECK_STR_EQ(c.data.val_path, "quote\" back\\slash tab\t nl\n \xc3\xbc");

    /* use_gpu is printed only when it was given; device always */
    char *text = NULL;
    size_t len = 0;
    CHECK_INT_EQ(dt_config_load_string(&c, NAME, MIN "training: {device: cuda}\n", NULL, 0), DT_OK);
    FILE *mem = open_memstream(&text, &len);
    dt_config_print(&c, mem);
    fclose(mem);
    CHECK(strstr(text, "use_gpu") == NULL);
    CHECK_STR_CONTAINS(text, "\n  device: cuda\n");
    CHECK_STR_CONTAINS(text, "\n  betas: [0.9, 0.999]\n");
    CHECK_STR_CONTAINS(text, "\n  lr: 0.0003\n");
    CHECK_STR_CONTAINS(text, "\n  init_from: \"\"\n");
    CHECK_STR_CONTAINS(text, "\n  resources_per_worker:\n    gpu: 1\n  communication_backend: collective\n");
    free(text);
    CHECK_INT_EQ(dt_config_load_string(&c, NAME, MIN "training: {use_gpu: no}\n", NULL, 0), DT_OK);
    mem = open_memstream(&text, &len);
    dt_config_print(&c, mem);
    fclose(mem);
    CHECK_STR_CONTAINS(text, "\n  use_gpu: false\n  device: cpu\n");
    free(text);

    /* through a real file: source is the path, run.dir stays the printed one */
    mkdir(DTRAIN_TEST_TMP, 0755);
    const char *path = DTRAIN_TEST_TMP "/config_rt.yaml";
    dt_config a, b;
    CHECK_INT_EQ(dt_config_load_string(&a, NAME, full_yaml, NULL, 0), DT_OK);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    dt_config_print(&a, f);
    CHECK(fclose(f) == 0);
    CHECK_INT_EQ(dt_config_load(&b, path, NULL, 0), DT_OK);
    CHECK_STR_EQ(b.source, path);
    memset(b.source, 0, sizeof b.source);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    remove(path);
}

static void test_files(void) {
    const char *missing = DTRAIN_SOURCE_DIR "/tests/configs/does-not-exist.yaml";
    char want[2048];
    dt_error_clear();
    CHECK_INT_EQ(dt_config_load(&cfg, missing, NULL, 0), DT_ERR_IO);
    snprintf(want, sizeof want, "%s: cannot open: %s", missing, strerror(ENOENT));
    CHECK_STR_EQ(dt_error_msg(), want);

    const char *dir = DTRAIN_SOURCE_DIR "/tests/configs";
    dt_error_clear();
    CHECK_INT_EQ(dt_config_load(&cfg, dir, NULL, 0), DT_ERR_IO);
    snprintf(want, sizeof want, "%s: not a regular file (a directory)", dir);
    CHECK_STR_EQ(dt_error_msg(), want);

    /* a file plus overrides; errors in overrides name the override, not the file */
    const char *seed = DTRAIN_SOURCE_DIR "/tests/configs/finetune.yaml";
    const char *const ovr[] = {"training.num_workers=1", "training.use_gpu=false"};
    CHECK_INT_EQ(dt_config_load(&cfg, seed, ovr, 2), DT_OK);
    CHECK_INT_EQ(cfg.training.num_workers, 1);
    CHECK_INT_EQ(cfg.training.device, DT_DEVICE_CPU);
    const char *const bad[] = {"model.num_labels=1"};
    CHECK_INT_EQ(dt_config_load(&cfg, seed, bad, 1), DT_ERR_CONFIG);
    CHECK_STR_EQ(dt_error_msg(), "--set model.num_labels=1: model.num_labels: expected 0 (language modelling) or an "
                                 "integer >= 2 (classification), got \"1\"");
}

/* data.tokenizer_sha256: the SHA-256 of data.tokenizer's file when not given ("" for bytes); given
 * (a run's saved config.yaml records it), the file must still have it: exit 2 naming both. */
static void test_tokenizer_hash(void) {
    char tok[1200], set_tok[1300], set_sha[1300], want[4096];
    snprintf(tok, sizeof tok, "%s", test_path("tok.json"));
    FILE *f = fopen(tok, "w");
    CHECK(f && fputs("abc", f) >= 0 && fclose(f) == 0);
    snprintf(set_tok, sizeof set_tok, "data.tokenizer=%s", tok);
    const char *abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    LOAD_OK(MIN);
    CHECK_STR_EQ(cfg.data.tokenizer_sha256, "");
    LOAD_OK(MIN, set_tok);
    CHECK_STR_EQ(cfg.data.tokenizer_sha256, abc);
    snprintf(set_sha, sizeof set_sha, "data.tokenizer_sha256=%s", abc);
    LOAD_OK(MIN, set_tok, set_sha);
    const char *other = "0000000000000000000000000000000000000000000000000000000000000000";
    snprintf(set_sha, sizeof set_sha, "data.tokenizer_sha256=%s", other);
    /* the override is quoted as messages quote values: its first 80 bytes */
    snprintf(want, sizeof want, "--set %.80s...: data.tokenizer_sha256: the model was trained with the tokenizer of "
             "SHA-256 %s, but data.tokenizer %s has %s: the file changed since (hint: restore it, or --set "
             "data.tokenizer_sha256= to take it as it is now)", set_sha, other, tok, abc);
    LOAD_ERR(want, MIN, set_tok, set_sha);
    snprintf(want, sizeof want, "--set %.80s...: data.tokenizer_sha256: the model was trained with the tokenizer of "
             "SHA-256 %s, but data.tokenizer is bytes (hint: set data.tokenizer to that tokenizer.json, or --set "
             "data.tokenizer_sha256= to read bytes)", set_sha, other);
    LOAD_ERR(want, MIN, set_sha);
    LOAD_ERR("--set data.tokenizer_sha256=abc: data.tokenizer_sha256: expected 64 hexadecimal digits (a SHA-256) or "
             "\"\", got \"abc\"", MIN, "data.tokenizer_sha256=abc");
    /* a byte config's digest does not see the key; a tokenizer's hash is part of its digest */
    dt_config a, b;
    CHECK_OK(dt_config_load_string(&a, NAME, MIN, NULL, 0));
    const char *const ovr[] = {set_tok};
    CHECK_OK(dt_config_load_string(&b, NAME, MIN, ovr, 1));
    CHECK(dt_config_digest(&a) != dt_config_digest(&b));
    f = fopen(tok, "w");
    CHECK(f && fputs("abd", f) >= 0 && fclose(f) == 0);
    dt_config c2;
    CHECK_OK(dt_config_load_string(&c2, NAME, MIN, ovr, 1));
    CHECK(dt_config_digest(&b) != dt_config_digest(&c2));
    char diff[1024];
    CHECK_INT_EQ(dt_config_diff(&b, &c2, diff, sizeof diff), 1);
    CHECK_STR_CONTAINS(diff, "data.tokenizer_sha256 \"ba7816bf");
    memset(b.data.tokenizer_sha256, 0, sizeof b.data.tokenizer_sha256); /* a config saved before it was recorded */
    CHECK_INT_EQ(dt_config_diff(&b, &c2, diff, sizeof diff), 0);
    /* a FIFO as data.tokenizer: refused at once, naming it */
    CHECK(unlink(tok) == 0 && mkfifo(tok, 0644) == 0);
    snprintf(want, sizeof want, "--set data.tokenizer=%s: data.tokenizer: %s: not a regular file (a FIFO)", tok, tok);
    LOAD_ERR(want, MIN, set_tok);
}

/* A Hugging Face directory for model.init_from: config.json (dtrain's, for a byte classifier or
 * language model), an empty model.safetensors (only its presence is read here) and `tokenizer` as
 * its tokenizer.json (NULL: none). */
static void write_hf_dir(const char *dir, int num_labels, json_t *tokenizer) {
    test_mkdir_p(dir);
    char p[1400];
    const char *names[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    dt_hf_config hc = {.shape = {.arch = DT_ARCH_GPT2, .vocab_size = 257, .n_positions = 64, .n_layer = 1, .n_head = 1,
                                 .n_embd = 8, .num_labels = num_labels},
                       .pad_token_id = num_labels ? 0 : -1, .eos_token_id = -1, .bos_token_id = -1};
    CHECK_OK(dt_hf_write_config(dir, &hc));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "w");
    CHECK(f && fclose(f) == 0);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (tokenizer) CHECK(json_dump_file(tokenizer, p, JSON_INDENT(2)) == 0);
}

/* init_from DIR reads the byte tokenizer an export wrote as data.tokenizer: bytes (with <cls> or
 * without, any max_length), and any other tokenizer.json — 256 ids with a normalizer, a prefix
 * space, another added token, another post-processor — as the BPE file it is (it used to be read
 * as bytes, where the BPE reader refuses or reads it otherwise). */
static void test_init_dir_bytes(void) {
    char dir[1200], p[1400], set[1300];
    snprintf(dir, sizeof dir, "%s", test_path("hf"));
    snprintf(set, sizeof set, "model.init_from=%s", dir);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    for (int cls = 0; cls < 2; cls++) {
        for (int T = 16; T <= 64; T += 48) {
            write_hf_dir(dir, cls ? 2 : 0, NULL);
            CHECK_OK(dt_hf_write_byte_tokenizer(dir, cls, T));
            CHECK(dt_hf_is_byte_tokenizer(p));
            LOAD_OK(cls ? MIN "model:\n  num_labels: 2\n" : MIN, set);
            CHECK_STR_EQ(cfg.data.tokenizer, "bytes");
        }
    }
    static const char *const edits[] = {"normalizer", "add_prefix_space", "added_token", "post_processor", "merges"};
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        write_hf_dir(dir, 2, NULL);
        CHECK_OK(dt_hf_write_byte_tokenizer(dir, 1, 64));
        json_t *t = json_load_file(p, 0, NULL);
        CHECK(t != NULL);
        if (i == 0) json_object_set_new(t, "normalizer", json_pack("{s:s}", "type", "NFC"));
        if (i == 1) json_object_set_new(json_object_get(t, "pre_tokenizer"), "add_prefix_space", json_true());
        if (i == 2)
            json_array_append_new(json_object_get(t, "added_tokens"),
                                  json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 257, "content", "<|im_end|>",
                                            "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
        if (i == 3) json_object_set_new(t, "post_processor", json_null());
        if (i == 4) json_array_append_new(json_object_get(json_object_get(t, "model"), "merges"), json_pack("[ss]", "a", "b"));
        write_hf_dir(dir, 2, t);
        json_decref(t);
        CHECK(!dt_hf_is_byte_tokenizer(p));
        LOAD_OK(MIN "model:\n  num_labels: 2\n", set);
        CHECK_STR_EQ(cfg.data.tokenizer, p);
    }
}

int main(void) {
    test_defaults();
    test_full();
    test_seed_example();
    test_errors();
    test_env();
    test_env_secrets();
    test_encoding();
    test_overrides();
    test_round_trip();
    test_files();
    test_dir_init("config");
    test_tokenizer_hash();
    test_init_dir_bytes();
    test_dir_remove(); /* kept when a check fails */
    TEST_PASS("test_config");
}
