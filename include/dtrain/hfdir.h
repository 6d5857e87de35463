/* hfdir.h — Hugging Face model directories (config.json, model.safetensors, tokenizer.json):
 * the architecture and shape (GPT-2, the Llama family) read from a config.json that
 * model.init_from names, and the config and tokenizer files `dtrain export --format hf`
 * writes, so that transformers' from_pretrained loads them with no extra code. */
#ifndef DTRAIN_HFDIR_H
#define DTRAIN_HFDIR_H

#include "dtrain/arch.h"
#include "dtrain/status.h"

/* A model as config.json has it. */
typedef struct dt_hf_config {
    dt_model_shape shape; /* the architecture (model_type), the fields arch.h names for it in config.json; num_labels
                             0: a language model, >= 2: a *ForSequenceClassification's id2label count */
    int pad_token_id; /* -1: none */
    int eos_token_id; /* -1: none */
    int bos_token_id; /* -1: none (written: the eos token's) */
    int max_length;   /* tokenizer_config.json's model_max_length (an export's: data.seq_len); 0: none */
} dt_hf_config;

/* 1 when `path` is a directory holding a config.json. */
int dt_hf_is_dir(const char *path);

/* DIR/config.json (and the model_max_length of DIR/tokenizer_config.json, when there) read and
 * checked to be a model dtrain can run: a model_type of arch.h's, its shape fields, and none of
 * the variants dtrain does not build (GPT-2: the tanh GELU (gelu_new), layer_norm_epsilon 1e-5,
 * n_inner 4 * n_embd, no cross attention, no per-layer attention scaling). DT_ERR_DATA naming
 * the file and the key otherwise. */
dt_status dt_hf_read_config(const char *dir, dt_hf_config *out);

/* A PEFT adapter directory's adapter_config.json (LoRA): r, lora_alpha and target_modules as
 * architecture a's targets (each the module's path or a suffix of it, as PEFT matches them:
 * "q_proj", "self_attn.q_proj", "c_attn"). DT_ERR_DATA naming the file and key for anything
 * else (another peft_type, a module dtrain cannot adapt, rank or alpha patterns, DoRA, rsLoRA). */
dt_status dt_hf_read_adapter_config(const char *dir, dt_arch a, dt_lora *out);

/* 1 when the tokenizer.json at `path` is dtrain's byte tokenizer exactly as export writes it
 * (dt_hf_write_byte_tokenizer, with <cls> or without, any max_length; the layout and the order
 * of keys aside): such a directory's texts are read with data.tokenizer: bytes, <cls> and all.
 * Anything else — 256 byte ids with a normalizer, a prefix space, another added token or
 * post-processor — is a BPE tokenizer.json for the BPE reader (0), and so is a file that is not
 * regular or does not parse. */
int dt_hf_is_byte_tokenizer(const char *path);

/* Writes DIR/config.json for c: the architecture's language model class (GPT2LMHeadModel,
 * tied embeddings) for num_labels 0, else its sequence classifier (num_labels labels LABEL_0..,
 * pad_token_id the id the classifier's padding uses, so that it reads the last non-pad
 * position as dtrain does); dropout 0, as dtrain trains. The file is new (DIR is being built);
 * fsynced. */
dt_status dt_hf_write_config(const char *dir, const dt_hf_config *c);

/* Writes DIR/tokenizer.json for dtrain's byte tokenizer (id = byte value): a byte-level BPE
 * without merges whose vocabulary is GPT-2's 256 byte characters. For a classifier
 * (with_cls) it adds <cls> = 256 after the text (TemplateProcessing) and cuts the text to
 * max_length - 1 tokens, as dtrain's classification input does, padding with id 0. */
dt_status dt_hf_write_byte_tokenizer(const char *dir, int with_cls, int max_length);

/* The special tokens and chat template a tokenizer_config.json names (NULL: none). */
typedef struct dt_hf_tokens {
    const char *bos, *eos, *unk, *pad, *cls;
    const char *chat_template;
} dt_hf_tokens;

/* Writes DIR/tokenizer_config.json: the generic fast tokenizer (tokenizer.json as it is),
 * model_max_length, and the special tokens and chat template given (NULL: none; bos and unk
 * NULL: eos's, as GPT-2's files have them). */
dt_status dt_hf_write_tokenizer_config(const char *dir, int max_length, const dt_hf_tokens *t);

/* DIR/tokenizer_config.json's special tokens and chat template into *t, the strings owned by
 * *held (json_decref'd by the caller through dt_hf_tokens_free); all NULL when there is no such
 * file. DT_ERR_DATA naming the file when it is there but not a JSON object. */
dt_status dt_hf_read_tokens(const char *dir, dt_hf_tokens *t, void **held);
void dt_hf_tokens_free(void *held);

#endif
