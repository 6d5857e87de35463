/* model.h — the model: its tensors, forward/backward orchestration over dt_ops, and weights
 * I/O (safetensors with Hugging Face's names; DESIGN.md §4). The architecture (model.type:
 * GPT-2) is a description the model code reads (src/model/net.h, one file per architecture),
 * not a fork of it.
 *
 * Parameters, gradients live in one flat backend buffer each, laid out so that every
 * all-reduce bucket is one contiguous range:
 *   bucket 0 "embed":  the embeddings (GPT-2: wte (V,C), wpe (P,C))
 *   bucket 1+l "h.l":  layer l's tensors (GPT-2: ln_1.w, ln_1.b, attn.c_attn.w (C,3C), .b (3C),
 *                      attn.c_proj.w (C,C), .b (C), ln_2.w, ln_2.b, mlp.c_fc.w (C,4C), .b (4C),
 *                      mlp.c_proj.w (4C,C), .b (C))
 *   bucket L+1 "head": the final norm (GPT-2: ln_f.w, ln_f.b), [score.w (num_labels,C)]
 * Backward finishes buckets in the order head, h.L-1 .. h.0, embed and reports each through
 * the optional callback as soon as its gradients are final (for overlapped all-reduce). */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/arch.h"
#include "dtrain/comm.h"
#include "dtrain/ops.h"
#include "dtrain/status.h"

typedef struct dt_model dt_model;

typedef struct dt_model_cfg {
    dt_model_shape shape; /* the architecture and its shape (arch.h): n_positions >= seq_len */
    int seq_len;      /* T */
    int pad_id;       /* classification: the padding id; the head reads the last other token (0: bytes) */
    int max_batch;    /* B: the largest batch forward() will see */
    int packed;       /* 1: a row may hold several examples (data.packing): attention stays within each one
                         and positions restart with it, as dt_model_set_positions says */
    uint64_t seed;    /* init seed */
    dt_lora lora;     /* model.lora (rank 0: none): the architecture's tensors frozen, adapters on lora.targets */
    /* Tensor parallelism (training.tensor_parallel; 0 or 1: the whole model): this model holds
     * share tp_rank of tp of every layer's products, Megatron's way (dt_tensor_info split), and
     * sums activations with the other shares over tp_comm (a collective of the tp ranks, on host
     * memory). The embeddings, norms and head are whole on every share. */
    int tp, tp_rank;
    dt_comm *tp_comm;
    /* Pipeline parallelism (training.pipeline_parallel; 0 or 1: every layer): this model is
     * stage pp_rank of pp and runs layers dt_model_stage_layers gives, the embeddings on the first
     * stage, the final norm and head on the last (and the token embedding there too when the head
     * is tied to it). The tensors of the other stages are listed with no elements here (numel 0;
     * whole and whole_offset as always). act_sets: the micro-batches whose activations it keeps
     * at once (dt_model_use_acts; 0 or 1: one). */
    int pp, pp_rank, act_sets;
} dt_model_cfg;

typedef struct dt_tensor_info {
    char name[64];    /* the Hugging Face name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;         /* 1 or 2 */
    int shape[2];
    size_t offset;    /* in floats from the start of the parameter buffer */
    size_t numel;
    int bucket;       /* 0 embed, 1+l layer l, L+1 head */
    int decay;        /* AdamW's weight decay applies (the architecture's matrices) */
    /* Tensor parallelism (dt_model_cfg tp): shape is this share's; whole the tensor's on disk.
     * split: DT_SPLIT_NONE (every share holds it whole), DT_SPLIT_ROWS or DT_SPLIT_COLS (of the
     * layout as stored): that dimension is `sections` equal blocks (GPT-2's [q | k | v] columns:
     * 3), each cut in tp equal parts; share t holds part t of every block, in block order. */
    int whole[2];
    int split, sections;
    size_t whole_offset; /* in floats in the whole model's layout: the whole tensors one after the other, in
                            this order (= offset without tensor parallelism) */
    int absent;          /* pipeline parallelism (dt_model_cfg pp): another stage holds it; nothing here (numel 0,
                            shape[0] 0) */
} dt_tensor_info;

enum { DT_SPLIT_NONE = 0, DT_SPLIT_ROWS, DT_SPLIT_COLS };

typedef struct dt_bucket {
    const char *name;
    size_t offset, numel; /* in floats */
} dt_bucket;

/* Result of a forward pass over one (micro-)batch. */
typedef struct dt_fwd_result {
    double loss_sum;  /* sum of per-row losses */
    long rows;        /* rows in the loss: B*T (LM) or B (classification) */
    long correct;     /* classification: argmax == label; LM: argmax == target */
    const int *pred;  /* each row's argmax (B labels, or B*T next tokens), valid until the next forward */
    const float *probs;  /* classification: (B, num_labels) softmax probabilities; NULL from
                            dt_model_forward_loss on a backend that fuses the loss and its
                            gradient (ops xent_fused); else NULL (same lifetime) */
    const float *losses; /* classification: (B) each row's loss, -log probs[label]; else NULL (same lifetime) */
} dt_fwd_result;

/* Validates the shape (messages name model.* keys), allocates everything through the open
 * backend `be` (which must outlive the model: parameters, gradients, and one arena for every
 * activation) and initialises weights from cfg->seed (DESIGN §4). dt_model_free accepts NULL. */
dt_status dt_model_init(dt_model **out, const dt_model_cfg *cfg, const dt_backend *be);
void dt_model_free(dt_model *m);

const dt_model_cfg *dt_model_config(const dt_model *m);
const dt_backend *dt_model_backend(const dt_model *m); /* the backend it was built on */
/* The trainable parameters: every tensor, or with model.lora the adapters (and a classifier's
 * score head, as PEFT's modules_to_save), laid out after the frozen ones. The tensors, buckets,
 * parameters and gradients below are theirs, offsets from the start of dt_model_params:
 * optimizer, collectives, replica checks and checkpoints see only them. */
size_t dt_model_num_params(const dt_model *m);
int dt_model_num_tensors(const dt_model *m);
const dt_tensor_info *dt_model_tensor(const dt_model *m, int i);
int dt_model_num_buckets(const dt_model *m);
const dt_bucket *dt_model_bucket(const dt_model *m, int i);  /* a bucket may be empty (numel 0) with LoRA */
float *dt_model_params(dt_model *m);  /* backend memory */
float *dt_model_grads(dt_model *m);   /* backend memory */
/* The frozen parameters' count (0 without model.lora), and their CRC32 (zlib) as floats: what
 * identifies the base a LoRA checkpoint's adapters apply to. A pipeline stage or tensor-parallel
 * share holds part of the base: every rank of the job calls dt_model_frozen_digest_stages
 * (`all`: their collective), which gathers the shares' tensors whole and combines the stages'
 * parts into the whole base's CRC, the same as one worker's; until then (and after the base
 * changes) dt_model_frozen_digest refuses there. */
size_t dt_model_num_frozen(const dt_model *m);
dt_status dt_model_frozen_digest(dt_model *m, uint32_t *out);
dt_status dt_model_frozen_digest_stages(dt_model *m, dt_comm *all, uint32_t *out);
/* Call after writing the parameters other than through the op table's upload (e.g. a
 * broadcast by a collective): the backend's working copy is refreshed before next use. */
void dt_model_params_changed(dt_model *m);

/* Training FLOPs per token (forward + backward, 6N + 12*L*C*T as in the PaLM appendix,
 * N = the weights of the layers' products, and of the LM head); static so --dry-run can print it. */
double dt_model_flops_per_token(const dt_model_cfg *cfg);
size_t dt_model_count_params(const dt_model_cfg *cfg);    /* every parameter, frozen or not */
size_t dt_model_count_trainable(const dt_model_cfg *cfg); /* the trainable ones (model.lora: the adapters') */
/* the bytes of the parameters: 4 each, 2 the frozen matrices model.lora.base_dtype bf16 keeps */
size_t dt_model_param_bytes(const dt_model_cfg *cfg);
/* the most trainable floats in one gradient bucket (dt_model_bucket's, this share's): what one
 * all-reduce or reduce-scatter carries at most */
size_t dt_model_largest_bucket(const dt_model_cfg *cfg);
/* Bytes of backend memory init allocates for this shape on backend `ops` at precision bf16
 * (0/1): parameters, gradients and the activation arena, from the same table init allocates
 * by (static, for --dry-run: the backend's estimate of what its attention keeps, ops.h
 * attention_bytes). */
size_t dt_model_memory_bytes(const dt_model_cfg *cfg, const dt_ops *ops, int bf16);
/* The largest call of each op family forward and backward make for this shape: what a
 * backend sizes its scratch by (ops.h). */
void dt_model_op_sizes(const dt_model_cfg *cfg, dt_op_sizes *out);

/* Forward over B <= max_batch sequences. tokens: host (B,T). targets: host, (B,T) for LM
 * (negative = ignore), (B) labels for classification. Keeps activations for backward. */
dt_status dt_model_forward(dt_model *m, const int *tokens, const int *targets, int B,
                           dt_fwd_result *res);
/* The length T (1..seq_len) of the rows the next forwards take, until set again: their inputs
 * (tokens, LM targets, packed positions) are host (B,T) arrays; a backward takes its forward's.
 * seq_len until set. Shorter rows are the same computation as rows of seq_len whose positions
 * past T are padding that nothing before them attends to (data.pad_to: longest); a pipeline
 * stage's rows are always seq_len (DT_ERR_INTERNAL). */
dt_status dt_model_set_length(dt_model *m, int T);
int dt_model_length(const dt_model *m);
/* The shortest length that holds what counts of each of B rows of seq_len (host (B,seq_len)
 * arrays): a language model's last position with a target >= 0, a classifier's last token other
 * than its padding (the row it reads); at least 1. */
int dt_model_rows_length(const dt_model *m, const int *tokens, const int *targets, int B);
/* data.pad_to longest: B rows of seq_len in host arrays (tokens; a language model's targets;
 * packed rows' positions, else NULL) cut in place to the shortest length that holds what counts
 * of each (dt_model_rows_length), rounded up to a step of seq_len / 8 rounded up to a multiple of
 * 8, at least 8 (so at most 8 lengths come, each a new shape for the backend), and that length
 * set (dt_model_set_length). A backend that keeps rows of seq_len (ops short_rows 0), and
 * pipeline stages, get seq_len: nothing is moved. */
dt_status dt_model_cut_rows(dt_model *m, int *tokens, int *targets, int *pos, int B);
/* A packed model (cfg.packed): the positions of the rows the next forwards read, host (B,T),
 * each token's position in its example (ops.h dt_att_shape's pos: 0 where an example starts,
 * else the one before + 1; else DT_ERR_INTERNAL); queued like the inputs (pos may be rewritten
 * at once). They hold until set again; a forward of another B is refused. */
dt_status dt_model_set_positions(dt_model *m, const int *pos, int B);
/* The same without the predictions (res->correct 0, res->pred NULL): what a training step
 * needs, without the argmax pass over the logits. `scale` is the one the backward that follows
 * will be given: a backend that fuses the loss with its gradient (ops.h xent_fused) writes the
 * language model's logits' gradient now (a backward with another scale is refused). */
dt_status dt_model_forward_loss(dt_model *m, const int *tokens, const int *targets, int B, float scale,
                                dt_fwd_result *res);

/* dt_model_forward_loss for a training step that waits for the device once: the inputs are
 * queued through the backend's upload_async (tokens and targets may be rewritten at once), the
 * loss stays on the device, its sum added to the model's (ops.h loss_sum), and nothing waits;
 * *rows receives the rows in the loss (B, or the targets >= 0: known on the host). Input errors
 * are returned; a device failure shows at the backend's next check. */
dt_status dt_model_forward_train(dt_model *m, const int *tokens, const int *targets, int B, float scale, long *rows);
/* Queues the copy of the loss sum that dt_model_forward_train added up since the last fetch
 * (in double; on the CPU the same bits as the sum of dt_model_forward_loss's loss_sums, in
 * order) to the host, and resets it to 0; dt_model_loss_fetched returns the copy once the
 * backend's next check has returned DT_OK. */
void dt_model_loss_fetch(dt_model *m);
double dt_model_loss_fetched(const dt_model *m);

typedef void (*dt_bucket_ready_fn)(void *user, int bucket);
/* Backward of the last forward: grads += d(scale * loss_sum)/dparams. `ready` (may be NULL)
 * is called as each bucket's gradients become final. */
dt_status dt_model_backward(dt_model *m, float scale, dt_bucket_ready_fn ready, void *user);
void dt_model_zero_grad(dt_model *m);

/* Weights I/O (host round trip through the backend). Save writes every tensor as F32 with
 * the names above, atomically. Load accepts our files and Hugging Face's (GPT-2: optional
 * "transformer." prefix; attn.bias/attn.masked_bias buffers ignored; an lm_head.weight must
 * equal wte.weight: dtrain's GPT-2 head is tied); names and shapes are checked
 * against the config, every value must be finite (DT_ERR_DATA naming file and tensor).
 * A classification model loading a file without score.weight keeps its random score
 * head and *score_initialised (may be NULL) is set to 0; else 1. */
/* With model.lora it writes the trainable tensors only (the adapters, the score head). */
dt_status dt_model_save(dt_model *m, const char *path);
/* The whole model with the names transformers' classes save (GPT-2: "transformer." before every
 * name but score.weight's, as GPT2LMHeadModel and GPT2ForSequenceClassification have them);
 * with model.lora the adapters merged into their products (W + scale B A). */
dt_status dt_model_save_hf(dt_model *m, const char *path);
/* model.lora: the trainable tensors with the names PEFT's save_pretrained gives them
 * ("base_model.model." + the Hugging Face name: ...attn.c_attn.lora_A.weight, score.weight). */
dt_status dt_model_save_peft(dt_model *m, const char *path);
/* With model.lora a file holding adapters (names ending lora_A.weight) is taken as
 * dt_model_save wrote it: every trainable tensor, nothing else; any other file as the frozen
 * model's weights (the adapters untouched). */
dt_status dt_model_load(dt_model *m, const char *path, int *score_loaded);
/* The same for a file that must hold adapters (model.lora.init_from): any other is refused
 * (DT_ERR_DATA), not taken as the frozen model's weights. */
dt_status dt_model_load_adapters(dt_model *m, const char *path, int *score_loaded);

/* Tensor parallelism (dt_model_cfg tp): the whole model as one host array of
 * dt_model_whole_params floats, each tensor whole at its whole_offset (the parameters' own
 * layout without tensor parallelism). gather: whole = every share's array (this share's layout:
 * dt_model_num_params floats, read a part at a time by `read`; read NULL: the parameters) put
 * together, a window of each tensor at a time (nothing the size of a share staged); a collective
 * over the shares (each calls it; whole may be NULL where it is not wanted). tensor_share: one tensor's
 * share of it. save_whole: whole into `path` as dt_model_save writes the weights (no
 * collective). dt_model_save of a share gathers the weights (every share calls it) and share 0
 * writes them. */
size_t dt_model_whole_params(const dt_model *m);
/* The time this share has spent in its collectives with the others so far (the activations'
 * sums, the cross-entropy's stats), ms; 0 without tensor parallelism. */
double dt_model_tp_ms(const dt_model *m);
/* floats [off, off + n) of a share's array (dt_model_gather_range) into dst (host) */
typedef dt_status (*dt_model_read_fn)(void *user, size_t off, size_t n, float *dst);
dt_status dt_model_gather_whole(dt_model *m, float *whole);
/* The same into whole = the whole layout's floats [base, base + count) only (the tensors that lie
 * there; every share still takes part in every tensor's gather). */
dt_status dt_model_gather_range(dt_model *m, dt_model_read_fn read, void *user, float *whole, size_t base,
                                size_t count);
/* local (tensor i's dt_model_tensor numel floats) = this share's part of whole (the whole
 * tensor's floats) */
void dt_model_tensor_share(const dt_model *m, int i, const float *whole, float *local);
dt_status dt_model_save_whole(dt_model *m, const float *whole, const char *path);

/* Pipeline parallelism (dt_model_cfg pp): stage `stage`'s layers [*lo, *hi), the contiguous
 * split of n_layer comm.h's dt_comm_part makes (every layer without stages). */
void dt_model_stage_layers(const dt_model_cfg *cfg, int stage, int *lo, int *hi);
/* The whole model's floats stage `stage` holds (each tensor at its whole_offset): one range
 * [*lo, *hi) of the whole layout (the last stage's copy of a tied embedding is the first's). */
void dt_model_stage_range(const dt_model *m, int stage, size_t *lo, size_t *hi);
/* Selects activation set k (0 .. act_sets-1): the next forward keeps its activations there, a
 * backward reads the forward that used it. */
void dt_model_use_acts(dt_model *m, int k);
/* The stage's boundaries, backend memory of B*T*n_embd activations (dt_model_stage_bytes): its
 * input in the current set (written by the caller before a forward of a
 * stage but the first), its output (the last layer's, after the forward), and the gradient the
 * backward starts from (written by the caller before the backward of a stage but the last) and
 * leaves (the input's, after the backward of a stage but the first). */
float *dt_model_stage_input(dt_model *m);
float *dt_model_stage_output(dt_model *m);
float *dt_model_stage_grad(dt_model *m);
/* the bytes of each of those three for a micro-batch of B rows: (B, T, C) activations */
size_t dt_model_stage_bytes(const dt_model *m, int B);
/* ... for a model of `c` on backend `ops` at precision bf16 (0/1) before one is built (--dry-run) */
size_t dt_model_stage_bytes_cfg(const dt_model_cfg *c, const dt_ops *ops, int bf16, int B);
/* A language model whose output head is its token embedding (GPT-2's; Llama's with
 * tie_word_embeddings). */
int dt_model_tied_head(const dt_model_cfg *cfg);
/* Tensor parallelism: the shares' sums from now on over `c` (the device collective of the group
 * whose host one the model was built with) */
void dt_model_set_tp_comm(dt_model *m, dt_comm *c);
/* The first and last stages of a language model whose head is its token embedding each hold it:
 * where its gradient lies (offset, floats; *n 0 on every other model and stage, and with
 * model.lora, which freezes it). Their sum is each one's. */
void dt_model_tied_grad(const dt_model *m, size_t *offset, size_t *n);

/* DT_ERR_DATA "PATH: tensor NAME holds NaN at element I (K values are NaN or Inf)" when one of
 * the n values is not finite; DT_OK otherwise. */
dt_status dt_check_finite(const float *v, size_t n, const char *path, const char *name);
/* The same over a tensor read in parts: dt_finite_add each part (elements base.. of the tensor;
 * returns 1 if it holds any NaN or Inf), then dt_finite_verdict. Start from a zeroed tally. */
typedef struct dt_finite_tally {
    size_t bad, first;
    float value;
} dt_finite_tally;
int dt_finite_add(dt_finite_tally *t, const float *v, size_t n, size_t base);
dt_status dt_finite_verdict(const dt_finite_tally *t, const char *path, const char *name);

#endif
