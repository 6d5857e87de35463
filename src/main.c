/* main.c — the dtrain command line (DESIGN.md §2): train, eval, export, data tokenize.
 * Exit status: 0 success; 2 bad usage, config or input data; 1 any other failure. */
#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/answers.h"
#include "dtrain/backend.h"
#include "dtrain/bench.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/datashow.h"
#include "dtrain/device.h"
#include "dtrain/clock.h"
#include "dtrain/doctor.h"
#include "dtrain/export.h"
#include "dtrain/chat.h"
#include "dtrain/generate.h"
#include "dtrain/predict.h"
#include "dtrain/infer.h"
#include "dtrain/launch.h"
#include "dtrain/rendezvous.h"
#include "dtrain/safetensors.h"
#include "dtrain/worker.h"

#ifndef DTRAIN_VERSION
#define DTRAIN_VERSION "0.0.0"
#endif

#define MAX_OVERRIDES 256

/* One command's help: its usage line and what it does, with its options. `dtrain --help`
 * prints them all; `dtrain CMD --help` its own. */
typedef struct {
    const char *cmd, *usage, *text;
} help_entry;

static const help_entry help[] = {
    {"train", "dtrain [train] --config FILE [--set key.path=value]... [--dry-run] [--quiet] [--progress auto|always|never]",
     "train      trains as the YAML config says; writes config.yaml, train.log, metrics.jsonl,\n"
     "           checkpoints/ and model.safetensors into run.dir (default runs/<config name>).\n"
     "           Started again, it resumes from the newest valid checkpoint (checkpoint.resume: auto);\n"
     "           a finished run only evaluates again, and refuses (exit 2) a changed config;\n"
     "           a crashed or hung worker restarts all workers from it (fault_tolerance.max_restarts);\n"
     "           SIGTERM or Ctrl-C stops after the current step with a checkpoint (twice: at once).\n"
     "  --config FILE        the YAML config (keys: README.md, \"Config reference\")\n"
     "  --set key.path=value override one key after the file is read, e.g. --set training.max_steps=20\n"
     "  --dry-run            print the resolved config and the model size, open and check the data as\n"
     "                       the run would, then exit 0 (2 when the run would refuse the data)\n"
     "  --quiet              print only errors and the final summary\n"
     "  --progress MODE      progress bar: auto (when stdout is a terminal), always, never\n"},
    {"eval", "dtrain eval    [--config FILE] [--checkpoint DIR|FILE] [--set key.path=value]...",
     "eval       evaluates weights on data.val_path and prints the validation loss and accuracy.\n"
     "  --config FILE        the YAML config (the model shape and the validation data); with\n"
     "                       --checkpoint it may be left out: then the config.yaml next to the\n"
     "                       weights (a run or checkpoint directory's), or a Hugging Face\n"
     "                       directory's config.json (give it --set data.val_path=FILE)\n"
     "  --checkpoint PATH    a .safetensors file, a checkpoint directory, or a run directory: its\n"
     "                       model.safetensors, or while the run has none (unfinished, stopped, failed)\n"
     "                       its newest valid checkpoint; default: model.init_from\n"
     "  --set key.path=value override one key, e.g. --set eval.max_batches=10\n"},
    {"export", "dtrain export  --checkpoint DIR|FILE --out PATH [--format safetensors|hf|peft] [--config FILE] "
     "[--set key.path=value]...",
     "export     writes the weights as a standalone F32 safetensors file with Hugging Face GPT-2\n"
     "           tensor names (--format safetensors, the default), or a Hugging Face directory that\n"
     "           transformers' AutoModelForCausalLM / AutoModelForSequenceClassification and\n"
     "           AutoTokenizer.from_pretrained(PATH) load (--format hf: config.json, model.safetensors,\n"
     "           tokenizer.json, tokenizer_config.json; for the byte tokenizer a tokenizer.json that\n"
     "           gives dtrain's ids, <cls> included). The tokenizer must be the one the run recorded\n"
     "           (data.tokenizer_sha256) and fit the model; a language model whose config names none\n"
     "           (bytes) but whose ids are not bytes gets no tokenizer files (a note says so).\n"
     "           A run trained with model.lora: --format hf merges its adapters into the model;\n"
     "           --format peft writes the adapters as PEFT does (adapter_config.json,\n"
     "           adapter_model.safetensors), for peft.PeftModel.from_pretrained(base, PATH) over the\n"
     "           base model.init_from names.\n"
     "  --checkpoint PATH    as for eval: a file, a checkpoint directory, or a run directory (its final\n"
     "                       weights, else its newest valid checkpoint)\n"
     "  --out PATH           the file (replaced atomically) or, for hf, the directory (built next to it\n"
     "                       and renamed into place; it may hold an earlier export, nothing else, and\n"
     "                       never what export reads: the weights, --checkpoint, the tokenizer)\n"
     "  --format F           safetensors (default), hf or peft\n"
     "  --config FILE        hf, peft: the config the model was trained with (default: the config.yaml next\n"
     "                       to the weights)\n"},
    {"generate", "dtrain generate --checkpoint DIR|FILE [--config FILE] --prompt TEXT [--chat] [--max-new-tokens N] "
     "[--temperature T] [--top-k K] [--top-p P] [--seed S] [--set key.path=value]...",
     "generate   continues TEXT with a language model, printing each token as it is chosen (stdout: the\n"
     "           continuation; stderr: tokens and speed). A key/value cache keeps the cost of a new token\n"
     "           independent of the text before it, but for attention itself. With a BPE tokenizer the\n"
     "           text follows the end-of-text token, as every document in training did, and generation\n"
     "           stops at the next one.\n"
     "  --checkpoint PATH    as for eval; its config is the config.yaml next to the weights (a run or\n"
     "                       checkpoint directory has one) unless --config is given; a Hugging Face\n"
     "                       directory (config.json + model.safetensors) needs neither\n"
     "  --prompt TEXT        the text to continue (UTF-8; may be \"\" with a BPE tokenizer)\n"
     "  --chat               TEXT is a user's message to a chat model: rendered with the chat template\n"
     "                       of the tokenizer_config.json beside the model's tokenizer.json (ChatML,\n"
     "                       as SmolLM2's; another template is refused), the answer ends at its\n"
     "                       eos_token\n"
     "  --max-new-tokens N   at most N new tokens (default 64); fewer where model.n_positions ends\n"
     "  --temperature T      0: always the most likely token (greedy); default 1.0\n"
     "  --top-k K            draw from the K most likely tokens only (default 0: all)\n"
     "  --top-p P            ... and from the most likely whose probabilities sum to P (default 1: all)\n"
     "  --seed S             the same seed, model and options give the same text (default: from the\n"
     "                       clock, printed on stderr)\n"
     "  --no-cache           recompute the whole text for every token (the same tokens, slower; a check)\n"
     "  --set key.path=value override a key of the config, e.g. --set training.device=cpu\n"},
    {"predict", "dtrain predict --checkpoint DIR|FILE [--config FILE] --input FILE --out FILE.jsonl [--set key.path=value]...",
     "predict    runs the model over every line of FILE and writes one JSON object per line to OUT:\n"
     "           a classifier's {\"line\", \"label\", \"probs\"} (plus \"true_label\" for LABEL<TAB>TEXT lines,\n"
     "           with their accuracy and loss on stderr); a language model's {\"line\", \"tokens\", \"loss\",\n"
     "           \"perplexity\"}. The input streams; OUT appears whole at the end (a temporary file until\n"
     "           then); a progress line on a terminal.\n"
     "  --checkpoint PATH    as for generate (its config.yaml, unless --config is given)\n"
     "  --input FILE         LABEL<TAB>TEXT lines (the training TSV) or plain TEXT lines\n"
     "  --out FILE           the JSON lines file to write (not --input)\n"
     "  --progress MODE      auto (when stderr is a terminal), always, never\n"
     "  --set key.path=value override a key of the config, e.g. --set data.batch_size_per_worker=64\n"},
    {"doctor", "dtrain doctor  [--num-workers N] [--device cpu|cuda] [--tensor-parallel T] [--pipeline-parallel P]",
     "doctor     lists CPUs and GPUs, runs the collective self-test with N worker processes (default 2)\n"
     "           and prints an all-reduce bandwidth table (algbw, busbw) next to memcpy bandwidth.\n"
     "  --num-workers N      worker processes for the self-test (default 2)\n"
     "  --device cpu|cuda    test the CPU collective (default) or the GPUs with NCCL\n"
     "  --tensor-parallel T  also lay the workers out as training.tensor_parallel T does and test every\n"
     "                       tensor-parallel and data-parallel group's collective, with rank 0's\n"
     "                       groups' all-reduce tables (T divides N; on GPUs each group's own NCCL\n"
     "                       communicator)\n"
     "  --pipeline-parallel P  also lay them out as training.pipeline_parallel P does and test every pair\n"
     "                       of neighbouring stages (a send each way, an exchange) and every pipeline's\n"
     "                       first and last stages, with rank 0's pair's send table (P x T divides N)\n"},
    {"bench", "dtrain bench   --config FILE --workers 1,2,4 | --layouts d4,d2t2,t4 [--steps K] [--repeat K]\n"
              "               [--set key.path=value]...",
     "bench      runs the config once per worker count (same batch per worker; --steps K overrides\n"
     "           training.max_steps) and prints train/eval time, throughput, speedup, scaling efficiency\n"
     "           and the share of step time spent waiting for all-reduce, then a verdict: runs too noisy\n"
     "           to compare and efficiencies above 110% are flagged (?), efficiencies under 50% explained;\n"
     "           writes RUN_DIR/bench/bench.csv and bench.svg (throughput and efficiency against workers).\n"
     "  --workers LIST       worker counts to run, e.g. 1,2,4\n"
     "  --layouts LIST       or layouts of the workers, in this order, e.g. d4,d2t2,t4 (d: data-parallel\n"
     "                       replicas, t: training.tensor_parallel shares, p: pipeline stages; 1 when left\n"
     "                       out), all at the first one's global batch: the table compares each with the\n"
     "                       first (ms/step, tokens/s, the share of the step in collectives, MB sent, the\n"
     "                       largest rank's memory while it trained, and with stages 1F1B's bubble\n"
     "                       estimate); a pipeline takes its replica's batch in micro-batches of the\n"
     "                       first layout's batch per worker; bench.csv only\n"
     "  --steps K            training steps per run\n"
     "  --repeat K           runs per worker count (1..20, default 1), interleaved; the table shows the\n"
     "                       medians and the slowest and fastest run\n"},
    {"data", "dtrain data tokenize|detokenize --tokenizer bytes|PATH/tokenizer.json IN OUT\n"
             "  dtrain data show --config FILE [--set key.path=value]... [--limit N] [--json]",
     "data tokenize  turns a text file (or .gz) into an llm.c token shard (OUT: never IN itself), the\n"
     "               file as one document.\n"
     "  --tokenizer bytes    one token per byte (token = byte value)\n"
     "  --tokenizer PATH     a byte-level BPE tokenizer.json (GPT-2's, or one made with the tokenizers\n"
     "                       library): the text (UTF-8) after its end-of-text token; uint16 tokens when the\n"
     "                       vocabulary fits, else a uint32 (version 7) shard\n"
     "data detokenize  turns a shard back into text with the same tokenizer (IN.bin OUT.txt)\n"
     "data show  prints the first examples of the config's data.train_path as the model reads them,\n"
     "           the tokens the loss counts between \xc2\xab and \xc2\xbb (chat and completion data: the answer's)\n"
     "  --limit N            examples to show (default 3)\n"
     "  --json               one line an example: {\"example\": i, \"ids\": [...], \"targets\": [...]}, -1 for\n"
     "                       a target the loss does not count\n"},
};

static const char *const help_tail =
    "\n"
    "exit status: 0 success (also a clean stop on SIGTERM/SIGINT), 2 bad usage/config/data (the message\n"
    "names file, key or line), 1 other failure.\n"
    "environment: DTRAIN_RDZV_SECRET=S or DTRAIN_RDZV_SECRET_FILE=PATH (mode 0600): the same secret on every rank\n"
    "  started by a launcher authenticates the rendezvous (docs/multinode.md);\n"
    "  DTRAIN_FAULT=rank=R,step=S,kind=kill|exit|hang|corrupt-checkpoint injects a fault (testing aid).\n";

/* Every command's help (cmd NULL), or one command's. */
static void print_help(const char *cmd) {
    const int n = (int)(sizeof help / sizeof help[0]);
    printf("dtrain " DTRAIN_VERSION " — data-parallel GPT training and fine-tuning\n\nusage:\n");
    for (int i = 0; i < n; i++)
        if (!cmd || strcmp(cmd, help[i].cmd) == 0) printf("  %s\n", help[i].usage);
    if (!cmd) printf("  dtrain --help | --version | CMD --help\n");
    printf("\n");
    for (int i = 0; i < n; i++)
        if (!cmd || strcmp(cmd, help[i].cmd) == 0) fputs(help[i].text, stdout);
    fputs(help_tail, stdout);
}

static int fail(dt_status st) {
    fprintf(stderr, "dtrain: error: %s\n", dt_error_msg());
    return dt_status_exit_code(st);
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "dtrain: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see dtrain --help)\n");
    return 2;
}

typedef struct cli {
    const char *config, *checkpoint, *out, *tokenizer, *device, *workers, *layouts, *input, *format;
    long steps;
    int num_workers, repeat, tensor_parallel, pipeline_parallel;
    const char *overrides[MAX_OVERRIDES];
    int n_overrides;
    int dry_run, quiet, progress;
    int help, version;
    /* generate */
    const char *prompt;
    long max_new_tokens, top_k;
    double temperature, top_p;
    unsigned long long seed;
    int have_seed, no_cache, chat;
    int gen_opts; /* how many of the above were given */
    /* data show */
    long limit;
    int json;
} cli;

static int parse_long(const char *opt, const char *arg, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (*end || end == arg || errno || v < lo || v > hi) {
        fprintf(stderr, "dtrain: %s: expected an integer %ld..%ld, got \"%s\"\n(see dtrain --help)\n", opt, lo, hi, arg);
        return 2;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *arg, double lo, double hi, int lo_open, double *out) {
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (*end || end == arg || errno || !(v >= lo) || v > hi || (lo_open && v == lo)) {
        fprintf(stderr, "dtrain: %s: expected a number %s%g..%g, got \"%s\"\n(see dtrain --help)\n", opt,
                lo_open ? "above " : "", lo, hi, arg);
        return 2;
    }
    *out = v;
    return 0;
}

/* Parses options for every subcommand; positional arguments stay at argv[optind..]. */
static int parse_options(int argc, char **argv, cli *c) {
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},   {"set", required_argument, NULL, 's'},
        {"dry-run", no_argument, NULL, 'n'},        {"quiet", no_argument, NULL, 'q'},
        {"progress", required_argument, NULL, 'p'}, {"checkpoint", required_argument, NULL, 'k'},
        {"out", required_argument, NULL, 'o'},      {"tokenizer", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},           {"version", no_argument, NULL, 'V'},
        {"num-workers", required_argument, NULL, 'w'}, {"device", required_argument, NULL, 'd'},
        {"workers", required_argument, NULL, 'W'},     {"steps", required_argument, NULL, 'S'},
        {"layouts", required_argument, NULL, 'Y'},     {"tensor-parallel", required_argument, NULL, 'X'},
        {"pipeline-parallel", required_argument, NULL, 'G'},
        {"repeat", required_argument, NULL, 'R'},      {"prompt", required_argument, NULL, 'P'},
        {"max-new-tokens", required_argument, NULL, 'M'}, {"temperature", required_argument, NULL, 'T'},
        {"top-k", required_argument, NULL, 'K'},       {"top-p", required_argument, NULL, 'O'},
        {"seed", required_argument, NULL, 'E'},        {"no-cache", no_argument, NULL, 'N'},
        {"chat", no_argument, NULL, 'C'},
        {"input", required_argument, NULL, 'I'},       {"format", required_argument, NULL, 'F'},
        {"limit", required_argument, NULL, 'L'},       {"json", no_argument, NULL, 'J'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0;
    int ch;
    long lv;
    while ((ch = getopt_long(argc, argv, "c:s:hV", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': c->config = optarg; break;
        case 's':
            if (c->n_overrides == MAX_OVERRIDES) return usage_error("too many --set options (max %s)", "256");
            c->overrides[c->n_overrides++] = optarg;
            break;
        case 'n': c->dry_run = 1; break;
        case 'q': c->quiet = 1; break;
        case 'p':
            if (strcmp(optarg, "auto") == 0) c->progress = -1;
            else if (strcmp(optarg, "always") == 0) c->progress = 1;
            else if (strcmp(optarg, "never") == 0) c->progress = 0;
            else return usage_error("--progress: expected auto, always or never, got \"%s\"", optarg);
            break;
        case 'k': c->checkpoint = optarg; break;
        case 'o': c->out = optarg; break;
        case 't': c->tokenizer = optarg; break;
        case 'w': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > DT_MAX_WORLD) {
                char fmt[80];
                snprintf(fmt, sizeof fmt, "--num-workers: expected an integer 1..%d, got \"%%s\"", DT_MAX_WORLD);
                return usage_error(fmt, optarg);
            }
            c->num_workers = (int)v;
            break;
        }
        case 'd': c->device = optarg; break;
        case 'W': c->workers = optarg; break;
        case 'Y': c->layouts = optarg; break;
        case 'S': {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || errno || v < 1)
                return usage_error("--steps: expected an integer >= 1, got \"%s\"", optarg);
            c->steps = v;
            break;
        }
        case 'R':
            if (parse_long("--repeat", optarg, 1, DT_BENCH_MAX_REPEAT, &lv)) return 2;
            c->repeat = (int)lv;
            break;
        case 'X': case 'G':
            if (parse_long(ch == 'X' ? "--tensor-parallel" : "--pipeline-parallel", optarg, 1, DT_MAX_WORLD, &lv)) return 2;
            *(ch == 'X' ? &c->tensor_parallel : &c->pipeline_parallel) = (int)lv;
            break;
        case 'P': c->prompt = optarg; c->gen_opts++; break;
        case 'M':
            c->gen_opts++;
            if (parse_long("--max-new-tokens", optarg, 1, 1000000, &c->max_new_tokens)) return 2;
            break;
        case 'T':
            c->gen_opts++;
            if (parse_double("--temperature", optarg, 0, 100, 0, &c->temperature)) return 2;
            break;
        case 'K':
            c->gen_opts++;
            if (parse_long("--top-k", optarg, 0, 1L << 30, &c->top_k)) return 2;
            break;
        case 'O':
            c->gen_opts++;
            if (parse_double("--top-p", optarg, 0, 1, 1, &c->top_p)) return 2;
            break;
        case 'E': {
            char *end;
            errno = 0;
            c->seed = strtoull(optarg, &end, 10);
            if (*end || end == optarg || errno || optarg[0] == '-')
                return usage_error("--seed: expected an integer 0..18446744073709551615, got \"%s\"", optarg);
            c->have_seed = 1;
            c->gen_opts++;
            break;
        }
        case 'N': c->no_cache = 1; c->gen_opts++; break;
        case 'C': c->chat = 1; c->gen_opts++; break;
        case 'I': c->input = optarg; break;
        case 'L':
            if (parse_long("--limit", optarg, 1, 1L << 40, &c->limit)) return 2;
            break;
        case 'J': c->json = 1; break;
        case 'F':
            if (strcmp(optarg, "safetensors") != 0 && strcmp(optarg, "hf") != 0 && strcmp(optarg, "peft") != 0)
                return usage_error("--format: expected safetensors, hf or peft, got \"%s\"", optarg);
            c->format = optarg;
            break;
        case 'h': c->help = 1; break;
        case 'V': c->version = 1; break;
        case ':': return usage_error("option %s needs a value", argv[optind - 1]);
        default: return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    return 0;
}

static int load_config(const cli *c, dt_config *cfg) {
    if (!c->config) return usage_error("%s", "missing --config FILE");
    dt_status st = dt_config_load(cfg, c->config, c->overrides, c->n_overrides);
    if (st == DT_ERR_IO) st = DT_ERR_USAGE; /* a config file that cannot be read is bad input: exit 2 */
    return st == DT_OK ? 0 : fail(st);
}

/* After a clean stop (SIGTERM/SIGINT): where the checkpoint is and how to go on. */
static void say_how_to_resume(const dt_config *cfg, int sig, const char *note) {
    if (!note[0]) {
        fprintf(stderr, "dtrain: SIG%s arrived as the run finished: nothing to resume\n", sigabbrev_np(sig));
        return;
    }
    fprintf(stderr, "dtrain: SIG%s: %s\n", sigabbrev_np(sig), note);
    if (cfg->checkpoint.resume == DT_RESUME_AUTO)
        fprintf(stderr, "dtrain: to resume, run the same command again (checkpoint.resume: auto continues from it)\n");
    else
        fprintf(stderr, "dtrain: to resume, run the same command with --set checkpoint.resume=auto (checkpoint.resume "
                        "is %s here, which would not continue from it)\n",
                cfg->checkpoint.resume == DT_RESUME_NEVER ? "never" : "a path");
}

static int cmd_train(const cli *c) {
    dt_config cfg;
    int rc = load_config(c, &cfg);
    if (rc) return rc;
    if (c->dry_run) {
        dt_status dst = dt_worker_describe(&cfg, stdout);
        return dst == DT_OK ? 0 : fail(dst);
    }
    dt_ext_env env;
    int external = 0;
    dt_status st = dt_ext_env_detect(cfg.training.num_workers, &env, &external);
    if (st != DT_OK) return fail(st);
    dt_worker_opts opts = {.quiet = c->quiet, .progress = c->progress};
    dt_launch_result res;
    if (external) { /* one process per worker, started by torchrun / mpirun / srun / K8s */
        st = dt_worker_launch_external(&cfg, &env, &opts, &res);
        rc = st == DT_OK ? 0 : fail(st);
        if (rc == 0 && res.stopped_by && env.rank == 0) say_how_to_resume(&cfg, res.stopped_by, res.note);
        dt_launch_finish(&res, rc);
        return rc;
    }
    if ((st = dt_worker_launch(&cfg, &opts, &res)) != DT_OK) return fail(st);
    if (res.stopped_by) say_how_to_resume(&cfg, res.stopped_by, res.note);
    return 0;
}

static int cmd_bench(const cli *c) {
    dt_config cfg;
    int rc = load_config(c, &cfg);
    if (rc) return rc;
    if (!c->workers == !c->layouts)
        return usage_error("%s", c->workers ? "bench: --workers and --layouts: give one of them"
                                            : "bench: needs --workers N,N,... (e.g. --workers 1,2,4) or --layouts "
                                              "(e.g. --layouts d4,d2t2,t4)");
    int workers[DT_BENCH_MAX_RUNS], n = 0, n_layouts = 0;
    dt_bench_layout layouts[DT_BENCH_MAX_RUNS];
    dt_status st = c->workers ? dt_bench_parse_workers(c->workers, workers, &n)
                              : dt_bench_parse_layouts(c->layouts, layouts, &n_layouts);
    for (int i = 0; i < n_layouts; i++) workers[n++] = layouts[i].dp * layouts[i].pp * layouts[i].tp;
    if (st == DT_OK) { /* forked workers: the largest run needs a device each */
        dt_device_kind dev;
        int most = 0;
        for (int i = 0; i < n; i++) most = workers[i] > most ? workers[i] : most;
        st = dt_backend_resolve(&cfg, &dev);
        if (st == DT_OK) st = dt_backend_check_workers(&cfg, dev, most);
    }
    dt_bench_opts bo = {.workers = workers, .n = n, .layouts = layouts, .n_layouts = n_layouts, .steps = c->steps,
                        .repeat = c->repeat ? c->repeat : 1};
    if (st == DT_OK) st = dt_bench_run(&cfg, &bo, stdout, NULL);
    return st == DT_OK ? 0 : fail(st);
}

static int cmd_doctor(const cli *c) {
    dt_doctor_opts o = {.num_workers = c->num_workers, .device = DT_DEVICE_CPU,
                        .timeout_s = 60.0, .max_bytes = 256l << 20, .tensor_parallel = c->tensor_parallel,
                        .pipeline_parallel = c->pipeline_parallel};
    if (c->device && (dt_device_parse(c->device, &o.device) != DT_OK || o.device == DT_DEVICE_AUTO))
        return usage_error("--device: expected cpu or cuda, got \"%s\"", c->device);
    if (o.num_workers > 8) o.max_bytes = 64l << 20; /* every worker holds one buffer of the largest size */
    dt_status st = dt_doctor_run(&o);
    return st == DT_OK ? 0 : fail(st);
}

/* Chat and completion validation data: the exact match of greedy answers, each set's (the first
 * eval.max_batches x data.batch_size_per_worker questions when eval.max_batches is set). */
static dt_status eval_answers(dt_infer *s) {
    DT_TRY(dt_infer_load(s, 1, 1));
    dt_status st = DT_OK;
    const long limit = s->cfg.eval.max_batches > 0 ? s->cfg.eval.max_batches * s->cfg.data.batch_size_per_worker : 0;
    for (int i = 0; i < dt_config_val_count(&s->cfg) && st == DT_OK; i++) {
        dt_answers_result r;
        st = dt_answers_exact_match(s, dt_config_val_path(&s->cfg, i), limit, stdout, &r);
        if (st != DT_OK) break;
        char label[64] = "";
        if (s->cfg.data.n_val_sets) snprintf(label, sizeof label, " [%s]", dt_config_val_name(&s->cfg, i));
        printf("exact match%s: %ld of %ld greedy answers (%.4f) in %.1f s\n", label, r.exact, r.asked,
               r.asked ? (double)r.exact / (double)r.asked : 0.0, r.seconds);
    }
    dt_infer_close(s);
    return st;
}

static int cmd_eval(const cli *c) {
    if (!c->config && !c->checkpoint) return usage_error("%s", "eval: needs --checkpoint DIR|FILE or --config FILE");
    /* --config, else the config saved next to the weights (as generate and predict take it); the
     * weights of --checkpoint, else the config's model.init_from; what is chosen is said on stdout */
    dt_infer s;
    dt_infer_opts io = {.cmd = "eval", .checkpoint = c->checkpoint, .config = c->config, .overrides = c->overrides,
                        .n_overrides = c->n_overrides, .say = stdout};
    dt_status st = dt_infer_resolve(&s, &io);
    dt_eval_point ep;
    if (st == DT_OK) st = dt_worker_eval(&s.cfg, s.weights, &ep);
    if (st == DT_OK && (s.cfg.data.format == DT_FORMAT_CHAT || s.cfg.data.format == DT_FORMAT_COMPLETION))
        st = eval_answers(&s);
    return st == DT_OK ? 0 : fail(st);
}

static int cmd_export(const cli *c) {
    const int hf = c->format && strcmp(c->format, "hf") == 0, peft = c->format && strcmp(c->format, "peft") == 0;
    if (!c->checkpoint || !c->out)
        return usage_error("export: needs --checkpoint DIR|FILE and --out %s", hf || peft ? "DIR" : "FILE");
    if (!hf && !peft && (c->config || c->n_overrides))
        return usage_error("%s", "export: --config and --set go with --format hf or peft (a safetensors export "
                                 "copies the weights as they are)");
    dt_export_opts o = {.checkpoint = c->checkpoint, .config = c->config, .out = c->out, .hf = hf, .peft = peft,
                        .overrides = c->overrides, .n_overrides = c->n_overrides};
    dt_export_result r;
    dt_status st = dt_export(&o, &r);
    if (st != DT_OK) return fail(st);
    const char *files = peft               ? " (adapter_config.json, adapter_model.safetensors)"
                        : !hf              ? ""
                        : r.tokenizer_files ? " (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)"
                                            : " (config.json, model.safetensors)";
    printf("exported %d tensors from %s to %s%s\n", r.n_tensors, r.weights, c->out, files);
    if (r.note[0]) fprintf(stderr, "note: %s\n", r.note);
    return 0;
}

static void emit_stdout(void *user, const char *bytes, size_t n) {
    (void)user;
    fwrite(bytes, 1, n, stdout);
    fflush(stdout);
}

/* --chat: the prompt as the user's message, rendered with the chat template of the
 * tokenizer_config.json beside the model's tokenizer.json (no end-of-text token before it:
 * the template says how the text starts); generation stops at the template's eos_token. */
static dt_status chat_prompt(const dt_infer *s, const char *msg, dt_gen_opts *go, char **rendered) {
    if (!s->tok)
        return dt_error_set(DT_ERR_USAGE, "--chat: the model reads bytes (data.tokenizer: bytes): a chat template needs "
                            "the model's tokenizer.json and tokenizer_config.json");
    char dir[DT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", dt_tokenizer_name(s->tok));
    dt_chat *chat;
    DT_TRY(dt_chat_open(dirname(dir), &chat));
    const dt_chat_msg m = {"user", msg};
    dt_status st = dt_chat_render(chat, &m, 1, 1, rendered);
    const char *eos = dt_chat_eos(chat);
    const int eos_id = dt_tokenizer_token_id(s->tok, eos);
    if (st == DT_OK && eos_id < 0)
        st = dt_error_set(DT_ERR_DATA, "%s/tokenizer_config.json: eos_token %s is not one token of %s", dir, eos,
                          dt_tokenizer_name(s->tok));
    if (st == DT_OK) {
        go->prompt = *rendered;
        go->prompt_len = strlen(*rendered);
        go->bare = 1;
        go->stop_id = eos_id;
    }
    dt_chat_free(chat);
    return st;
}

static int cmd_generate(const cli *c) {
    if (!c->prompt) return usage_error("%s", "generate: needs --prompt TEXT (\"\" starts a new document with a BPE tokenizer)");
    dt_infer s;
    dt_infer_opts io = {.cmd = "generate", .checkpoint = c->checkpoint, .config = c->config, .overrides = c->overrides,
                        .n_overrides = c->n_overrides, .batch = 1, .seq_len = 1};
    dt_status st = dt_infer_open(&s, &io);
    if (st != DT_OK) return fail(st);
    const uint64_t seed = c->have_seed ? (uint64_t)c->seed : ((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)(dt_clock_now() * 1e9) ^ ((uint64_t)getpid() << 40);
    dt_gen_opts go = {.prompt = c->prompt, .prompt_len = strlen(c->prompt), .max_new_tokens = (int)c->max_new_tokens,
                      .temperature = c->temperature, .top_k = (int)c->top_k, .top_p = c->top_p, .seed = seed,
                      .no_cache = c->no_cache, .stop_id = -1};
    char *rendered = NULL;
    if (c->chat && (st = chat_prompt(&s, c->prompt, &go, &rendered)) != DT_OK) {
        dt_infer_close(&s);
        return fail(st);
    }
    dt_gen_result r;
    st = dt_generate(s.model, s.tok, &go, emit_stdout, NULL, &r);
    free(rendered);
    if (r.new_tokens) putchar('\n');
    fflush(stdout);
    const int trained = s.cfg.data.seq_len; /* the positions training windows covered */
    dt_infer_close(&s);
    if (st != DT_OK) return fail(st);
    const char *const why[] = {"--max-new-tokens", c->chat ? "the end of the answer (eos_token)" : "the end-of-text token",
                               "model.n_positions"};
    fprintf(stderr, "generated %d tokens in %.2f s (%.1f tokens/s%s) after a prompt of %d tokens (%.2f s); stopped at %s; ",
            r.new_tokens, r.decode_s, r.decode_s > 0 ? r.new_tokens / r.decode_s : 0.0, c->no_cache ? ", no cache" : "",
            r.prompt_tokens, r.prompt_s, why[r.stop]);
    if (c->temperature > 0) fprintf(stderr, "seed %llu\n", (unsigned long long)seed);
    else fprintf(stderr, "greedy\n");
    /* the last new token was predicted at position prompt + new - 2 (0-based) */
    const int last = r.prompt_tokens + r.new_tokens - 2;
    if (r.new_tokens && last >= trained)
        fprintf(stderr, "note: the text went on to position %d, past the %d positions the model was trained on "
                "(data.seq_len): what follows position %d was never trained (hint: fewer --max-new-tokens, or a "
                "model trained with a longer data.seq_len)\n", last + 1, trained, trained);
    return 0;
}

static int cmd_predict(const cli *c) {
    if (!c->input || !c->out) return usage_error("%s", "predict: needs --input FILE and --out FILE.jsonl");
    dt_infer s;
    dt_infer_opts io = {.cmd = "predict", .checkpoint = c->checkpoint, .config = c->config, .overrides = c->overrides,
                        .n_overrides = c->n_overrides, .batch = 0, .seq_len = 0};
    dt_status st = dt_infer_open(&s, &io);
    if (st != DT_OK) return fail(st);
    dt_predict_opts po = {.input = c->input, .out = c->out, .progress = c->progress};
    dt_predict_result r;
    st = dt_predict(&s, &po, &r);
    dt_infer_close(&s);
    if (st != DT_OK) return fail(st);
    fprintf(stderr, "predicted %ld lines in %.1f s: %s", r.lines, r.seconds, c->out);
    if (r.labelled)
        fprintf(stderr, " | %ld labelled: accuracy %.6f, loss %.9g", r.labelled, (double)r.correct / (double)r.labelled,
                r.loss_sum / (double)r.labelled);
    if (r.tokens)
        fprintf(stderr, " | %ld tokens: loss %.9g, perplexity %.6g", r.tokens, r.loss_sum / (double)r.tokens,
                exp(r.loss_sum / (double)r.tokens));
    fputc('\n', stderr);
    return 0;
}

static int cmd_data_show(const cli *c, int argc) {
    if (argc - optind != 1) return usage_error("%s", "data show: expected no arguments besides the options");
    dt_config cfg;
    int rc = load_config(c, &cfg);
    if (rc) return rc;
    const dt_datashow_opts o = {.limit = c->limit ? c->limit : 3, .json = c->json};
    dt_status st = dt_datashow(&cfg, &o, stdout);
    return st == DT_OK ? 0 : fail(st);
}

static int cmd_data(const cli *c, int argc, char **argv) {
    if (optind < argc && strcmp(argv[optind], "show") == 0) return cmd_data_show(c, argc);
    const int de = optind < argc && strcmp(argv[optind], "detokenize") == 0;
    if (optind >= argc || (!de && strcmp(argv[optind], "tokenize") != 0))
        return usage_error("data: expected the subcommand \"tokenize\", \"detokenize\" or \"show\"%s", "");
    if (!c->tokenizer || !c->tokenizer[0])
        return usage_error("data %s: --tokenizer bytes or --tokenizer PATH/tokenizer.json is required", argv[optind]);
    if (argc - optind != 3)
        return usage_error("%s", de ? "data detokenize: expected IN.bin OUT.txt" : "data tokenize: expected IN.txt OUT.bin");
    size_t n = 0;
    dt_status st = (de ? dt_data_detokenize : dt_data_tokenize)(c->tokenizer, argv[optind + 1], argv[optind + 2], &n);
    if (st != DT_OK) return fail(st);
    printf("wrote %zu %s to %s\n", n, de ? "bytes" : "tokens", argv[optind + 2]);
    return 0;
}

int main(int argc, char **argv) {
    const char *cmd = "train";
    int first = 1;
    if (argc > 1 && argv[1][0] != '-') {
        cmd = argv[1];
        first = 2;
    }
    cli c = {.progress = -1, .max_new_tokens = 64, .temperature = 1.0, .top_p = 1.0};
    /* getopt sees argv[first-1..] so that argv[0] of the sub-parse is the command */
    int sub_argc = argc - first + 1;
    char **sub_argv = argv + first - 1;
    int rc = parse_options(sub_argc, sub_argv, &c);
    if (rc) return rc;
    if (c.help) {
        int known = 0; /* `dtrain CMD --help`: that command's own; `dtrain --help`: all of them */
        for (size_t i = 0; i < sizeof help / sizeof help[0]; i++) known |= strcmp(cmd, help[i].cmd) == 0;
        print_help(first == 2 && known ? cmd : NULL);
        return 0;
    }
    if (c.version) {
        printf("dtrain %s\n", DTRAIN_VERSION);
        dt_doctor_print_versions(stdout);
        return 0;
    }
    /* options that only one command reads are refused elsewhere, not silently ignored */
    if ((c.workers || c.layouts || c.steps || c.repeat) && strcmp(cmd, "bench") != 0)
        return usage_error("--workers, --layouts, --steps and --repeat belong to `dtrain bench` (for training: --set "
                           "training.num_workers=N, --set training.max_steps=K)%s", "");
    if ((c.tensor_parallel || c.pipeline_parallel) && strcmp(cmd, "doctor") != 0)
        return usage_error("--tensor-parallel and --pipeline-parallel belong to `dtrain doctor` (for training: --set "
                           "training.tensor_parallel=T, --set training.pipeline_parallel=P)%s", "");
    if (c.input && strcmp(cmd, "predict") != 0)
        return usage_error("--input belongs to `dtrain predict`%s", "");
    if (c.format && strcmp(cmd, "export") != 0)
        return usage_error("--format belongs to `dtrain export`%s", "");
    if (c.gen_opts && strcmp(cmd, "generate") != 0)
        return usage_error("--prompt, --chat, --max-new-tokens, --temperature, --top-k, --top-p, --seed and --no-cache belong "
                           "to `dtrain generate`%s", "");
    if ((c.num_workers || c.device) && strcmp(cmd, "doctor") != 0)
        return usage_error("--num-workers and --device belong to `dtrain doctor` (for training: --set "
                           "training.num_workers=N, --set training.device=cpu|cuda)%s", "");
    if ((strcmp(cmd, "train") == 0 || strcmp(cmd, "bench") == 0 || strcmp(cmd, "generate") == 0 ||
         strcmp(cmd, "predict") == 0 || strcmp(cmd, "export") == 0) && optind < sub_argc)
        return usage_error("unexpected argument \"%s\"", sub_argv[optind]);
    if (strcmp(cmd, "train") == 0) return cmd_train(&c);
    if (strcmp(cmd, "eval") == 0) return cmd_eval(&c);
    if (strcmp(cmd, "export") == 0) return cmd_export(&c);
    if (strcmp(cmd, "generate") == 0) return cmd_generate(&c);
    if (strcmp(cmd, "predict") == 0) return cmd_predict(&c);
    if (strcmp(cmd, "data") == 0) return cmd_data(&c, sub_argc, sub_argv);
    if (strcmp(cmd, "doctor") == 0) return cmd_doctor(&c);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(&c);
    if (strcmp(cmd, "help") == 0) {
        print_help(NULL);
        return 0;
    }
    return usage_error("unknown command \"%s\"", cmd);
}
