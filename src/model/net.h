/* net.h — inside the model module: an architecture as the model code reads it, the model's
 * tensors by name, and the transformer layer written once (net.c) for training, evaluation
 * (model.c) and cached decoding (decode.c).
 *
 * An architecture (gpt2.c, llama.c) is data and one hook: the variants its layer is built from (which
 * norm, which MLP, ...), the Hugging Face names of its weights file, and `layout`, which lists
 * its tensors in parameter order (name, shape, init, weight decay, bucket) and fills the named
 * offsets the layer reads them by. Nothing outside src/model includes this header. */
#ifndef DTRAIN_MODEL_NET_H
#define DTRAIN_MODEL_NET_H

#include <stddef.h>

#include "dtrain/model.h"
#include "dtrain/ops.h"

#define NET_NONE ((size_t)-1) /* an offset of a tensor the architecture does not have */
/* An offset with this bit is in dt_net's base16, not params: a frozen matrix kept in bf16
 * (model.lora.base_dtype), read by the products and the embedding only. */
#define NET_BF16 ((size_t)1 << (sizeof(size_t) * 8 - 2))
static inline int net_is_bf16(size_t off) { return off != NET_NONE && off >= NET_BF16; }

/* A LoRA adapter on columns [col0, col0 + cols) of a product's output (one of the projections a
 * stacked product holds: Llama's q of [q | k | v]): A (rank, in), B (cols, rank), offsets in
 * floats; slot: its place among its layer's adapters (net_acts lora_h). */
typedef struct net_lora {
    size_t a, b;
    int col0, cols;
    int slot;
} net_lora;

#define NET_MAX_LORA 3 /* adapters on one product: q, k and v */

/* A weight product's operand: where its weight and bias lie in the parameter buffer (the
 * gradient buffer covers the trainable ones, dt_net's `frozen`) and how the weight is stored. */
/* A product's place in tensor parallelism (dt_model_cfg tp): whole on every share, its output
 * columns split (its input whole; the shares' input gradients summed), or its input columns
 * split (its output the sum of the shares', the bias added once). */
typedef enum { NET_TP_WHOLE = 0, NET_TP_COLS, NET_TP_ROWS } net_tp;

typedef struct net_linear {
    size_t w, b;  /* offsets in floats; b NET_NONE: no bias */
    int in, out;  /* K, N: inp(M,K) -> out(M,N): this share's */
    net_tp tp;
    int trans;    /* 0: W stored (in, out) (GPT-2's Conv1D); 1: (out, in) (nn.Linear, embeddings) */
    int n_lora;   /* model.lora: the adapters on it */
    net_lora lora[NET_MAX_LORA];
} net_linear;

typedef struct net_norm {
    size_t w, b;  /* weight, bias (C); b NET_NONE: none (RMSNorm) */
} net_norm;

/* One layer's tensors, named (GPT-2's; Llama's). */
typedef struct net_layer {
    net_norm attn_norm;   /* ln_1; input_layernorm */
    net_linear qkv;       /* attn.c_attn (C, 3C); q_proj, k_proj, v_proj stacked ((NH+2NKV)*hs, C): rows [q | k | v] */
    net_linear attn_out;  /* attn.c_proj (C, C); o_proj (C, NH*hs) */
    net_norm mlp_norm;    /* ln_2; post_attention_layernorm */
    net_linear mlp_in;    /* mlp.c_fc (C, 4C); gate_proj, up_proj stacked (2I, C): rows [gate | up] */
    net_linear mlp_out;   /* mlp.c_proj (4C, C); down_proj (C, I) */
} net_layer;

/* The model's tensors, named. */
typedef struct net_weights {
    size_t wte;           /* (V, C) token embedding (wte; model.embed_tokens) */
    size_t wpe;           /* (P, C) learned positions (wpe); NET_NONE: none */
    net_layer *layers;    /* (L) */
    net_norm final_norm;  /* ln_f; model.norm */
    net_linear head;      /* language model: the output head (wte when tied; lm_head); classifier: score (NL, C) */
    int tied;             /* the architecture's output head is the token embedding (its file copy, when there,
                             must equal it) */
} net_weights;

/* How a tensor starts when no weights are loaded (DESIGN §4); UNIFORM: in (-std, std) (LoRA's A,
 * as PEFT's kaiming_uniform_(a=sqrt(5)): 1/sqrt(in)). */
typedef enum { NET_INIT_ZERO = 0, NET_INIT_ONE, NET_INIT_NORMAL, NET_INIT_UNIFORM } net_init;

/* Tensor parallelism: share r of tp of a length L (heads, MLP columns, vocabulary rows) is the
 * part comm.h's dt_comm_part gives rank r (the one split of the project): [L*r/tp, L*(r+1)/tp),
 * equal parts where tp divides L, else parts that differ by one. */
static inline int net_part_lo(int L, int tp, int r) {
    size_t lo, hi;
    dt_comm_part((size_t)L, tp, r, &lo, &hi);
    return (int)lo;
}
static inline int net_part_len(int L, int tp, int r) {
    size_t lo, hi;
    dt_comm_part((size_t)L, tp, r, &lo, &hi);
    return (int)(hi - lo);
}

/* What `layout` is given: it calls dt_net_add for every tensor, in parameter order. */
typedef struct net_builder {
    const dt_model_cfg *cfg;
    dt_tensor_info *tensors; /* NULL: counting only */
    net_init *init;          /* (n) */
    double *std;             /* (n) NET_INIT_NORMAL's standard deviation */
    int n;
    int tp, tp_rank;         /* tensor-parallel shares (>= 1) and this one: split tensors are laid out as its share */
    size_t off;              /* floats laid out so far */
    size_t mat;              /* ... of them in matrices (cols > 0) */
    size_t *bucket_numel;    /* NULL, or (n_layer + 2): the floats laid out in each bucket */
} net_builder;

/* A language model whose output head is its token embedding (GPT-2's; Llama's with
 * tie_word_embeddings). */
int dt_net_tied_head(const dt_model_cfg *c);
/* Pipeline parallelism: whether `stage` owns bucket `bucket` (the embeddings: the first stage;
 * a layer's: the stage running it; the head: the last), the one rule of who holds and saves what
 * (the last stage's copy of a tied embedding is held, not owned). */
int dt_net_stage_owns(const dt_model_cfg *c, int stage, int bucket);

/* Adds a tensor of rows x cols (cols 0: a vector of rows) named `name` to bucket `bucket`
 * (0 the embeddings, 1 + l layer l, L + 1 the head); decay: AdamW's weight decay applies.
 * Returns its offset. */
size_t dt_net_add(net_builder *b, const char *name, int rows, int cols, net_init init, double std, int decay, int bucket);
/* The same for a tensor split across tensor-parallel shares (dt_tensor_info split, sections):
 * rows x cols is its whole shape; this share's is laid out. A tensor of another pipeline stage
 * (dt_model_cfg pp) is listed with no elements (dt_tensor_info absent). */
size_t dt_net_add_split(net_builder *b, const char *name, int rows, int cols, net_init init, double std, int decay,
                        int bucket, int split, int sections);

typedef enum { NET_LAYERNORM = 0, NET_RMSNORM } net_norm_kind;
typedef enum { NET_GELU = 0, NET_SWIGLU } net_mlp_kind;

typedef struct net_arch {
    dt_arch id;
    net_norm_kind norm;   /* LayerNorm (eps 1e-5, mean and rstd kept) or RMSNorm (model.rms_norm_eps, rstd kept) */
    net_mlp_kind mlp;     /* GELU (tanh) on mlp_in's output, or SwiGLU on its [gate | up] */
    int rope;             /* rotary positions on q and k (else learned ones, wpe) */
    /* The tensors of cfg in parameter order, through dt_net_add, and their offsets in w
     * (w->layers has room for L). */
    void (*layout)(net_builder *b, net_weights *w);
    /* Weights files (Hugging Face's names): a prefix the model's names may carry on disk and
     * export writes before every name but score.weight's ("transformer."); names a file may
     * hold that are not weights (suffixes, "" ends the list); the language model's output
     * head's name ("lm_head.weight": when tied its values must equal the embedding's; a
     * classifier skips it). */
    const char *hf_prefix;
    const char *const *ignored_suffixes;
    const char *head_name;
    const char *embed_name, *positions_name, *layer_prefix; /* for the hint of a file of another shape */
    /* LoRA: where target t (arch.h DT_LORA_TARGETS row, one of this architecture's) lies in a
     * layer: its product and the columns of the whole product's output it makes (without tensor
     * parallelism's split), in `sections` equal blocks split alike (GPT-2's c_attn: q, k, v) */
    void (*lora_site)(const dt_model_shape *s, int t, net_layer *y, net_linear **lin, int *col0, int *cols,
                      int *sections);
} net_arch;

extern const net_arch dt_net_gpt2, dt_net_llama;

/* The architecture of a shape (NULL: none, an internal error). */
const net_arch *dt_net_arch(dt_arch id);

/* What the layer code needs of a model (model.c fills it; decode.c borrows it). */
typedef struct dt_net {
    const dt_ops *o;
    void *ctx;
    const dt_model_cfg *cfg;
    const net_arch *arch;
    dt_dtype act;
    float *params;         /* backend: the parameters but those in base16 */
    float *grads;          /* backend: the trainable parameters' (params from `frozen` on) */
    size_t frozen;         /* the parameters below this offset are frozen (model.lora's base): no gradient */
    const uint16_t *base16;/* backend: model.lora.base_dtype bf16, the frozen matrices (offsets with NET_BF16); else NULL */
    float lora_scale;      /* model.lora: alpha / rank */
    int lora_rank;
    float *lora_h;         /* (BT, rank) scratch: an adapter's gradient of x A^T; x A^T itself where the caller
                              keeps none (decoding) */
    net_weights w;
    dt_att_shape att;      /* attention's heads (B and T: the caller's); pos: the model's rows' positions when
                              packed (backend memory), else NULL */
    float *inv_freq;       /* rope: (hs/2) the rotary frequencies, backend memory; else NULL */
    int tp, tp_rank;       /* tensor parallelism (dt_model_cfg): shares, this one's; tp 1: whole. With tp > 1 the
                              embedding table (and a language model's head) holds this share's vocabulary rows,
                              [v0, v0 + n_vocab) */
    int v0, n_vocab;
    dt_comm *tp_comm;
    dt_status *tp_st;      /* the first failure of a sum over tp_comm (the layer's calls return nothing) */
    double *tp_ms;         /* the time spent in them so far, ms (the model's, dt_model_tp_ms) */
} dt_net;

const dt_net *dt_model_net(const dt_model *m);

/* The gradient of the parameters at offset `off`: NULL when they are frozen (or none, or bf16). */
static inline float *dt_net_grad(const dt_net *n, size_t off) {
    return off >= NET_BF16 || off < n->frozen ? NULL : n->grads + (off - n->frozen);
}

/* Every product of an activation with a weight goes through these two (adapters and
 * tensor-parallel splits change them, not their callers). Forward: out(M, lin->out) =
 * inp(M, lin->in) @ W + bias (+ each adapter's scale (inp A^T) B^T on its columns), rows of out
 * ldo apart; with `pre` non-NULL, pre = that product and out = gelu(pre) (the backend's fused
 * epilogue where it has one). Backward: dW += and dbias += from dout(M, out) (rows ldo apart);
 * dinp(M, in) = dout @ W^T (skipped when NULL), and with `pre` non-NULL dinp = gelu'(pre) *
 * (dout @ W^T), `tmp` (M, in) as scratch. keep (net_acts lora_h): where the forward leaves each
 * adapter's inp A^T, (M, rank) at its slot, for the backward to read (tensor parallelism: it
 * sums the shares' parts there); the forward may pass NULL (nothing kept: decoding, a product
 * without adapters), the backward of adapters may not. */
void dt_net_mm_fwd(const dt_net *n, const net_linear *lin, dt_act *out, const dt_act *inp, int M, int ldo, dt_act *pre,
                   float *keep);
void dt_net_mm_bwd(const dt_net *n, const net_linear *lin, dt_act *dinp, const dt_act *dout, const dt_act *inp, int M,
                   int ldo, const dt_act *pre, dt_act *tmp, float *keep);

/* out(B*T, C): the token embeddings of B sequences of T tokens (tokens: backend memory) at
 * positions pos0.. (pos0 -1: the model's own rows, at 0.. or, packed, at att.pos), plus their
 * learned positions' (GPT-2); and its backward (the model's rows), the embeddings' gradients +=
 * from dout(B*T, C). */
void dt_net_embed(const dt_net *n, dt_act *out, const int *tokens, int B, int T, int pos0);
void dt_net_embed_bwd(const dt_net *n, const dt_act *dout, const int *tokens, int B, int T);

/* A norm over N rows of C: the architecture's (LayerNorm: mean and rstd kept; RMSNorm: rstd). */
void dt_net_norm_fwd(const dt_net *n, const net_norm *nw, dt_act *out, float *mean, float *rstd, const dt_act *inp,
                     int N);
/* dinp(N,C) += (the residual stream), dw +=, db += */
void dt_net_norm_bwd(const dt_net *n, const net_norm *nw, dt_act *dinp, const dt_act *dout, const dt_act *inp,
                  const float *mean, const float *rstd, int N);

/* What one layer's forward writes: training and evaluation keep each layer's for backward;
 * decoding gives every layer the same scratch. Widths: QKV = qkv.out, A = attn_out.in (NH*hs),
 * PRE = mlp_in.out (GPT-2 4C, Llama 2I), ACT = mlp_out.in (4C, I). */
typedef struct net_acts {
    dt_act *norm1;              /* (BT, C) */
    float *norm1_mean, *norm1_rstd; /* (BT); mean: LayerNorm only */
    dt_act *qkv;                /* (BT, QKV), after rope where the architecture has it */
    dt_act *atty;               /* (BT, A) attention's output, before attn_out */
    void *att;                  /* what attention keeps for backward (ops attention_bytes); decoding: unused */
    dt_act *res2;               /* (BT, C) the residual stream after attention */
    dt_act *norm2;              /* (BT, C) */
    float *norm2_mean, *norm2_rstd; /* (BT) */
    dt_act *mlp_pre;            /* (BT, PRE) mlp_in's output */
    dt_act *mlp_act;            /* (BT, ACT) after the activation: mlp_out's input */
    dt_act *res3;               /* (BT, C) the layer's output */
    float *lora_h;              /* model.lora: (adapters, BT, rank) each adapter's x A^T at its slot, from the
                                   forward to the backward; NULL: not kept (decoding) */
} net_acts;

/* Where attention finds keys and values: in the rows themselves (B sequences of T, from
 * position 0: training, evaluation), or also in a cache (decoding: one sequence, T new rows at
 * positions pos0.., their keys and values appended to kc and vc, scratch for the scores). */
typedef struct net_span {
    int B, T;
    int pos0;            /* -1: no cache */
    dt_act *kc, *vc;
    float *scratch;
} net_span;

/* Layer l forward over the span's rows: x (B*T, C) in, a->res3 out. */
void dt_net_layer_fwd(const dt_net *n, int l, const net_acts *a, const dt_act *x, const net_span *s);

/* Backward scratch shared by the layers. */
typedef struct net_grads {
    dt_act *dresidual;   /* (BT, C) the residual stream's gradient: in from the layer above, out to the one below */
    dt_act *dnorm;       /* (BT, max(C, A)) a norm's output gradient; attention's output gradient */
    dt_act *dqkv;        /* (BT, QKV) */
    void *datt;          /* attention backward's scratch */
    dt_act *dpre;        /* (BT, PRE) mlp_pre's gradient */
    dt_act *dact;        /* (BT, ACT) mlp_act's gradient */
} net_grads;

/* Layer l backward: its parameters' gradients += , d->dresidual becomes the gradient of its
 * input x. */
void dt_net_layer_bwd(const dt_net *n, int l, const net_acts *a, const dt_act *x, const net_grads *d, int B, int T);

#endif
