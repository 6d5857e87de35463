/* export.h — `dtrain export`: a model's weights as one standalone safetensors file, or as a
 * Hugging Face directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)
 * that transformers' AutoModelForCausalLM / AutoModelForSequenceClassification and
 * AutoTokenizer.from_pretrained load with no extra code. */
#ifndef DTRAIN_EXPORT_H
#define DTRAIN_EXPORT_H

#include "dtrain/status.h"

typedef struct dt_export_opts {
    const char *checkpoint; /* --checkpoint: a file, a checkpoint or run directory */
    const char *config;     /* --config (hf only; NULL: the config.yaml next to the weights) */
    const char *out;        /* --out: the file (safetensors) or the directory (hf) */
    int hf;                 /* --format hf (with model.lora: the adapters merged into the model) */
    int peft;               /* --format peft: model.lora's adapters as PEFT saves them (adapter_config.json,
                               adapter_model.safetensors), for peft.PeftModel.from_pretrained(base, out) */
    const char *const *overrides;
    int n_overrides;
} dt_export_opts;

typedef struct dt_export_result {
    int n_tensors;                /* the tensors written */
    char weights[1024 + 96];      /* the weights file they came from (DT_PATH_MAX + 96) */
    int tokenizer_files;          /* hf: tokenizer.json and tokenizer_config.json written; 0: the model has
                                     no known tokenizer (note says why) */
    char note[512];               /* "" or a line for the user */
} dt_export_result;

/* Writes o->out: the file atomically (safetensors), or the directory whole (hf: built next to
 * it as OUT.tmp.PID and renamed into place; an OUT that holds anything but the files export
 * writes is refused, DT_ERR_USAGE, and so is an OUT that is, or holds, what export reads: the
 * weights, the --checkpoint directory, the tokenizer). The weights are checked against the
 * config (hf) as training would load them, and the tokenizer against the model as every command
 * checks it (dt_infer_tokenizer; its SHA-256 against the run's record: data.tokenizer_sha256).
 * A language model without a known tokenizer (data.tokenizer: bytes, more than 257 ids) is
 * written without tokenizer files (r->tokenizer_files 0, r->note says so). Messages about the
 * choice of weights go to stderr. */
dt_status dt_export(const dt_export_opts *o, dt_export_result *r);

#endif
