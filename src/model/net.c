/* net.c — the transformer layer, written once, over the op table (net.h): its forward for
 * training, evaluation and cached decoding, its backward, and the two functions every weight
 * product goes through. */
#include "net.h"

#include "dtrain/clock.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

const net_arch *dt_net_arch(dt_arch id) {
    return id == DT_ARCH_GPT2 ? &dt_net_gpt2 : id == DT_ARCH_LLAMA ? &dt_net_llama : NULL;
}

size_t dt_net_add(net_builder *b, const char *name, int rows, int cols, net_init init, double std, int decay, int bucket) {
    return dt_net_add_split(b, name, rows, cols, init, std, decay, bucket, DT_SPLIT_NONE, 1);
}

int dt_net_tied_head(const dt_model_cfg *c) {
    return !c->shape.num_labels && (c->shape.arch == DT_ARCH_GPT2 || c->shape.tie_word_embeddings);
}

int dt_net_stage_owns(const dt_model_cfg *c, int stage, int bucket) {
    const int L = c->shape.n_layer, P = c->pp > 1 ? c->pp : 1;
    if (bucket == 0) return stage == 0;
    if (bucket == L + 1) return stage == P - 1;
    int lo, hi;
    dt_model_stage_layers(c, stage, &lo, &hi);
    return bucket - 1 >= lo && bucket - 1 < hi;
}

/* Pipeline parallelism: whether this stage holds a tensor of `bucket`: what it owns, and on the
 * last stage the token embedding too when the head is tied to it */
static int stage_holds(const net_builder *b, const char *name, int bucket) {
    const dt_model_cfg *c = b->cfg;
    if (c->pp <= 1 || dt_net_stage_owns(c, c->pp_rank, bucket)) return 1;
    return bucket == 0 && c->pp_rank == c->pp - 1 && dt_net_tied_head(c) &&
           strcmp(name, dt_net_arch(c->shape.arch)->embed_name) == 0;
}

size_t dt_net_add_split(net_builder *b, const char *name, int rows, int cols, net_init init, double std, int decay,
                        int bucket, int split, int sections) {
    const int tp = b->tp > 1 ? b->tp : 1;
    if (tp == 1) split = DT_SPLIT_NONE;
    const int whole[2] = {rows, cols ? cols : 1};
    const int absent = !stage_holds(b, name, bucket);
    if (split == DT_SPLIT_ROWS) rows = sections * net_part_len(rows / sections, tp, b->tp_rank);
    if (split == DT_SPLIT_COLS) cols = sections * net_part_len(cols / sections, tp, b->tp_rank);
    if (absent) rows = 0;
    const size_t off = b->off;
    const size_t numel = (size_t)rows * (size_t)(cols ? cols : 1);
    if (b->tensors) {
        dt_tensor_info *t = &b->tensors[b->n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->ndim = cols ? 2 : 1;
        t->shape[0] = rows;
        t->shape[1] = cols ? cols : 1;
        t->whole[0] = whole[0];
        t->whole[1] = whole[1];
        t->split = split;
        t->sections = split == DT_SPLIT_NONE ? 1 : sections;
        t->numel = numel;
        t->offset = off;
        t->bucket = bucket;
        t->decay = decay;
        t->absent = absent;
        b->init[b->n] = init;
        b->std[b->n] = std;
    }
    b->n++;
    b->off += numel;
    if (b->bucket_numel) b->bucket_numel[bucket] += numel;
    if (cols) b->mat += numel;
    return off;
}

/* ---- the weight products ---- */

/* out's (or dout's) column col0 of row 0 */
static dt_act *act_col(const dt_net *n, const dt_act *p, int col0) {
    return (dt_act *)((char *)p + (size_t)col0 * dt_dtype_size(n->act));
}

/* adapter a's inp A^T in keep, (M, rank) at its slot */
static float *lora_kept(const dt_net *n, float *keep, const net_lora *a, int M) {
    return keep + (size_t)a->slot * (size_t)M * (size_t)n->lora_rank;
}

/* Tensor parallelism: buf(n) summed over the shares, in place (a failure is kept in tp_st);
 * bf16 activations (a GPU's) as bf16; f32: buf is fp32 whatever the activations */
static void tp_sum_as(const dt_net *n, void *buf, size_t count, int f32) {
    if (*n->tp_st != DT_OK) return;
    const double t0 = dt_clock_now();
    *n->tp_st = n->act == DT_DTYPE_BF16 && !f32 ? dt_comm_allreduce_bf16(n->tp_comm, (uint16_t *)buf, count)
                                                : dt_comm_allreduce(n->tp_comm, (float *)buf, count, DT_REDUCE_SUM);
    *n->tp_ms += 1e3 * (dt_clock_now() - t0);
}
static void tp_sum(const dt_net *n, dt_act *buf, size_t count) { tp_sum_as(n, buf, count, 0); }

/* each adapter's scale (inp A^T) B^T added onto its columns of out, inp A^T left in keep (or
 * in n->lora_h, not kept). Tensor parallelism: a product split by columns holds its columns
 * of B (A and inp whole); one split by rows its columns of A and of inp (B whole), so inp A^T is
 * a part whose sum over the shares the product's own sum completes in out (the backward sums
 * the kept parts). */
static void lora_fwd(const dt_net *n, const net_linear *lin, dt_act *out, const dt_act *inp, int M, int ldo,
                     float *keep) {
    for (int i = 0; i < lin->n_lora; i++) {
        const net_lora *a = &lin->lora[i];
        n->o->lora_fwd(n->ctx, act_col(n, out, a->col0), keep ? lora_kept(n, keep, a, M) : n->lora_h, inp,
                       n->params + a->a, n->params + a->b, M, lin->in, a->cols, n->lora_rank, ldo, n->lora_scale);
    }
}

/* their gradients, and their part of dinp added onto it, from the inp A^T the forward kept.
 * Tensor parallelism: split by rows, the kept inp A^T is this share's part, summed first (the
 * forward's out needed no sum of its own); split by columns, dout is this share's columns, so
 * its dh (and dinp's part) is a part of the sum, and dA comes from the shares' dh summed. */
static void lora_bwd(const dt_net *n, const net_linear *lin, dt_act *dinp, const dt_act *dout, const dt_act *inp, int M,
                     int ldo, float *keep) {
    const int parts = n->tp > 1 && lin->tp == NET_TP_COLS, rows = n->tp > 1 && lin->tp == NET_TP_ROWS;
    for (int i = 0; i < lin->n_lora; i++) {
        const net_lora *a = &lin->lora[i];
        float *dA = dt_net_grad(n, a->a), *dB = dt_net_grad(n, a->b), *A = n->params + a->a, *B = n->params + a->b;
        float *h = lora_kept(n, keep, a, M);
        const int K = lin->in, N = a->cols, r = n->lora_rank;
        if (rows) tp_sum_as(n, h, (size_t)M * (size_t)r, 1);
        n->o->lora_bwd(n->ctx, dinp, parts ? NULL : dA, dB, h, n->lora_h, act_col(n, dout, a->col0), inp, A, B, M, K, N,
                       r, ldo, n->lora_scale);
        if (!parts) continue;
        tp_sum_as(n, n->lora_h, (size_t)M * (size_t)r, 1);
        n->o->lora_bwd(n->ctx, NULL, dA, NULL, h, n->lora_h, NULL, inp, A, B, M, K, N, r, ldo, n->lora_scale);
    }
}

/* a bf16 tensor of base16 (offset with NET_BF16) */
static const uint16_t *w16(const dt_net *n, size_t off) { return n->base16 + (off & ~NET_BF16); }

void dt_net_mm_fwd(const dt_net *n, const net_linear *lin, dt_act *out, const dt_act *inp, int M, int ldo, dt_act *pre,
                   float *keep) {
    /* tensor parallelism, split by rows: the shares' partial products summed, the bias added by one */
    const int rows = n->tp > 1 && lin->tp == NET_TP_ROWS;
    const float *b = lin->b == NET_NONE || (rows && n->tp_rank) ? NULL : n->params + lin->b;
    dt_act *y = pre ? pre : out;
    if (net_is_bf16(lin->w)) { /* a frozen bf16 weight: its own product, then GELU apart */
        n->o->matmul16_fwd(n->ctx, y, inp, w16(n, lin->w), b, M, lin->in, lin->out, ldo, lin->trans);
    } else if (pre && !rows && !lin->trans && !lin->n_lora && n->o->matmul_gelu_fwd) {
        /* the backend's fused product and GELU (ops.h: W (K,N)) */
        n->o->matmul_gelu_fwd(n->ctx, out, pre, inp, n->params + lin->w, b, M, lin->in, lin->out);
        return;
    } else {
        n->o->matmul_fwd(n->ctx, y, inp, n->params + lin->w, b, M, lin->in, lin->out, ldo, lin->trans);
    }
    lora_fwd(n, lin, y, inp, M, ldo, keep);
    if (rows) tp_sum(n, y, (size_t)M * (size_t)ldo);
    if (pre) n->o->gelu_fwd(n->ctx, out, pre, (size_t)M * lin->out);
}

void dt_net_mm_bwd(const dt_net *n, const net_linear *lin, dt_act *dinp, const dt_act *dout, const dt_act *inp, int M,
                   int ldo, const dt_act *pre, dt_act *tmp, float *keep) {
    dt_act *d = pre ? tmp : dinp;
    if (net_is_bf16(lin->w)) { /* a frozen bf16 weight (its bias frozen too): dinp alone */
        if (d) n->o->matmul16_bwd(n->ctx, d, dout, w16(n, lin->w), M, lin->in, lin->out, ldo, lin->trans);
    } else {
        const float *w = n->params + lin->w;
        float *dw = dt_net_grad(n, lin->w), *db = dt_net_grad(n, lin->b);
        if (pre && !lin->trans && !lin->n_lora && n->o->matmul_gelu_bwd) { /* GPT-2's mlp_out: split by rows, no sum */
            n->o->matmul_gelu_bwd(n->ctx, dinp, tmp, dw, db, dout, inp, w, pre, M, lin->in, lin->out);
            return;
        }
        n->o->matmul_bwd(n->ctx, d, dw, db, dout, inp, w, M, lin->in, lin->out, ldo, lin->trans);
    }
    lora_bwd(n, lin, d, dout, inp, M, ldo, keep);
    if (pre) n->o->gelu_bwd(n->ctx, dinp, pre, tmp, (size_t)M * lin->in);
    if (n->tp > 1 && lin->tp == NET_TP_COLS && dinp) tp_sum(n, dinp, (size_t)M * (size_t)lin->in); /* each share's part */
}

/* ---- the embedding ---- */

void dt_net_embed(const dt_net *n, dt_act *out, const int *tokens, int B, int T, int pos0) {
    const int C = n->cfg->shape.n_embd;
    const size_t p0 = (size_t)(pos0 < 0 ? 0 : pos0) * C;
    const int *pos = pos0 < 0 ? n->att.pos : NULL;
    const int wpe_here = n->w.wpe != NET_NONE && !(n->tp > 1 && n->tp_rank); /* tensor parallelism: one adds it */
    if (net_is_bf16(n->w.wte)) { /* frozen bf16 embeddings (the positions with them) */
        n->o->encoder16_fwd(n->ctx, out, tokens, pos, w16(n, n->w.wte), wpe_here ? w16(n, n->w.wpe) + p0 : NULL,
                            n->tp > 1 ? n->v0 : 0, n->tp > 1 ? n->n_vocab : INT_MAX, B, T, C);
        if (n->tp > 1) tp_sum(n, out, (size_t)B * T * C);
        return;
    }
    if (n->tp > 1) { /* each share's rows of the table (the positions added by one), summed */
        n->o->encoder_part_fwd(n->ctx, out, tokens, pos, n->params + n->w.wte, wpe_here ? n->params + n->w.wpe + p0 : NULL,
                               n->v0, n->n_vocab, B, T, C);
        tp_sum(n, out, (size_t)B * T * C);
        return;
    }
    n->o->encoder_fwd(n->ctx, out, tokens, pos, n->params + n->w.wte, wpe_here ? n->params + n->w.wpe + p0 : NULL, B, T,
                      C);
}

void dt_net_embed_bwd(const dt_net *n, const dt_act *dout, const int *tokens, int B, int T) {
    float *dwte = dt_net_grad(n, n->w.wte);
    if (!dwte) return; /* frozen (model.lora: with the positions) */
    if (n->tp > 1) { /* this share's rows; the positions' gradient is the same on every share */
        n->o->encoder_part_bwd(n->ctx, dwte, dt_net_grad(n, n->w.wpe), dout, tokens, n->att.pos, n->v0, n->n_vocab, B, T,
                               n->cfg->shape.n_embd);
        return;
    }
    n->o->encoder_bwd(n->ctx, dwte, dt_net_grad(n, n->w.wpe), dout, tokens, n->att.pos, B, T, n->cfg->shape.n_embd);
}

/* ---- norms ---- */

void dt_net_norm_fwd(const dt_net *n, const net_norm *nw, dt_act *out, float *mean, float *rstd, const dt_act *inp,
                     int N) {
    const int C = n->cfg->shape.n_embd;
    if (n->arch->norm == NET_RMSNORM)
        n->o->rmsnorm_fwd(n->ctx, out, rstd, inp, n->params + nw->w, N, C, (float)n->cfg->shape.rms_norm_eps);
    else n->o->layernorm_fwd(n->ctx, out, mean, rstd, inp, n->params + nw->w, n->params + nw->b, N, C);
}

void dt_net_norm_bwd(const dt_net *n, const net_norm *nw, dt_act *dinp, const dt_act *dout, const dt_act *inp,
                     const float *mean, const float *rstd, int N) {
    const int C = n->cfg->shape.n_embd;
    if (n->arch->norm == NET_RMSNORM)
        n->o->rmsnorm_bwd(n->ctx, dinp, dt_net_grad(n, nw->w), dout, inp, n->params + nw->w, rstd, N, C);
    else
        n->o->layernorm_bwd(n->ctx, dinp, dt_net_grad(n, nw->w), dt_net_grad(n, nw->b), dout, inp, n->params + nw->w,
                            mean, rstd, N, C);
}

/* ---- the layer ---- */

/* attention over the span: out(B*T, NH*hs) from qkv(B*T, (NH+2NKV)*hs) (rotated first where the
 * architecture has rotary positions) */
static void attend(const dt_net *n, dt_act *out, void *att, dt_act *qkv, const net_span *s) {
    dt_att_shape sh = n->att;
    sh.B = s->B;
    sh.T = s->T;
    if (s->pos0 >= 0) sh.pos = NULL; /* decoding: one sequence, no packing */
    if (n->arch->rope) n->o->rope_fwd(n->ctx, qkv, n->inv_freq, s->pos0 < 0 ? 0 : s->pos0, &sh);
    if (s->pos0 < 0) n->o->attention_fwd(n->ctx, out, att, qkv, &sh);
    else n->o->attention_cached(n->ctx, out, s->kc, s->vc, s->scratch, qkv, s->pos0, &sh);
}

/* the MLP's activation: out = gelu(mlp_in(x)) (pre kept) or silu(gate) * up of [gate | up] = pre */
static void mlp_in_fwd(const dt_net *n, const net_linear *lin, dt_act *act, dt_act *pre, const dt_act *x, int M,
                       float *keep) {
    if (n->arch->mlp == NET_GELU) {
        dt_net_mm_fwd(n, lin, act, x, M, lin->out, pre, keep);
        return;
    }
    dt_net_mm_fwd(n, lin, pre, x, M, lin->out, NULL, keep);
    n->o->swiglu_fwd(n->ctx, act, pre, M, lin->out / 2);
}

/* res2 = x + attn_out(attention(qkv(norm1(x)))), then res3 = res2 + mlp_out(act(mlp_in(norm2(res2)))) */
void dt_net_layer_fwd(const dt_net *n, int l, const net_acts *a, const dt_act *x, const net_span *s) {
    const net_layer *w = &n->w.layers[l];
    const int BT = s->B * s->T, C = n->cfg->shape.n_embd;
    dt_net_norm_fwd(n, &w->attn_norm, a->norm1, a->norm1_mean, a->norm1_rstd, x, BT);
    dt_net_mm_fwd(n, &w->qkv, a->qkv, a->norm1, BT, w->qkv.out, NULL, a->lora_h);
    attend(n, a->atty, a->att, a->qkv, s);
    dt_net_mm_fwd(n, &w->attn_out, a->res2, a->atty, BT, C, NULL, a->lora_h);
    n->o->add(n->ctx, a->res2, a->res2, x, (size_t)BT * C);
    dt_net_norm_fwd(n, &w->mlp_norm, a->norm2, a->norm2_mean, a->norm2_rstd, a->res2, BT);
    mlp_in_fwd(n, &w->mlp_in, a->mlp_act, a->mlp_pre, a->norm2, BT, a->lora_h);
    dt_net_mm_fwd(n, &w->mlp_out, a->res3, a->mlp_act, BT, C, NULL, a->lora_h);
    n->o->add(n->ctx, a->res3, a->res3, a->res2, (size_t)BT * C);
}

void dt_net_layer_bwd(const dt_net *n, int l, const net_acts *a, const dt_act *x, const net_grads *d, int B, int T) {
    const net_layer *w = &n->w.layers[l];
    const int BT = B * T, C = n->cfg->shape.n_embd;
    dt_att_shape sh = n->att;
    sh.B = B;
    sh.T = T;
    /* the MLP */
    if (n->arch->mlp == NET_GELU) {
        dt_net_mm_bwd(n, &w->mlp_out, d->dpre, d->dresidual, a->mlp_act, BT, C, a->mlp_pre, d->dact, a->lora_h);
    } else {
        dt_net_mm_bwd(n, &w->mlp_out, d->dact, d->dresidual, a->mlp_act, BT, C, NULL, NULL, a->lora_h);
        n->o->swiglu_bwd(n->ctx, d->dpre, a->mlp_pre, d->dact, BT, w->mlp_in.out / 2);
    }
    dt_net_mm_bwd(n, &w->mlp_in, d->dnorm, d->dpre, a->norm2, BT, w->mlp_in.out, NULL, NULL, a->lora_h);
    dt_net_norm_bwd(n, &w->mlp_norm, d->dresidual, d->dnorm, a->res2, a->norm2_mean, a->norm2_rstd, BT);
    /* attention */
    dt_net_mm_bwd(n, &w->attn_out, d->dnorm, d->dresidual, a->atty, BT, C, NULL, NULL, a->lora_h);
    n->o->attention_bwd(n->ctx, d->dqkv, d->datt, d->dnorm, a->qkv, a->atty, a->att, &sh);
    if (n->arch->rope) n->o->rope_bwd(n->ctx, d->dqkv, n->inv_freq, 0, &sh);
    dt_net_mm_bwd(n, &w->qkv, d->dnorm, d->dqkv, a->norm1, BT, w->qkv.out, NULL, NULL, a->lora_h);
    dt_net_norm_bwd(n, &w->attn_norm, d->dresidual, d->dnorm, x, a->norm1_mean, a->norm1_rstd, BT);
}
