// cudnn_att.cpp — cudnn_att.h on the cuDNN frontend's graph API (the frontend is header-only and
// C++ only; scripts/setup.sh fetches it into the build tree). Built with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: cuDNN is not linked, its symbols are found through the
// handle this file opens, as the rest of the backend does with cuBLASLt.
//
// One graph per direction and shape, built once when first needed and cached (building takes
// up to a second; executing is a launch or a few; inference plans the forward only). Forward:
// the SDPA node with a causal mask, statistics kept for backward. Backward: the SDPA backward
// node, deterministic. Q, K and V are read from the qkv rows by strides, dQ, dK, dV written
// into the dqkv rows the same way, as karpathy/llm.c does. Grouped-query attention is the
// frontend's own (h_k = h_v = NKV < h_q = NH, as its samples/cpp/sdpa graphs and
// test/python/sdpa set K's and V's dims): K and V are NKV heads of the packed rows, never
// repeated in memory; backward sums a key/value head's query heads into dK, dV itself.
//
// The tensors, with W = (NH + 2 NKV) HS the qkv row and dims {B, heads, T, HS}:
//   Q, dQ   {B, NH, T, HS}   strides {T W, HS, W, 1}  at column 0 of the row
//   K, dK   {B, NKV, T, HS}  strides {T W, HS, W, 1}  at column NH HS
//   V, dV   {B, NKV, T, HS}  strides {T W, HS, W, 1}  at column (NH + NKV) HS
//   O, dO   {B, NH, T, HS}   strides {T NH HS, HS, NH HS, 1}
//   stats   {B, NH, T, 1}    strides {NH T, T, 1, 1} (fp32)
//   mask    {B, 1, T, T}     strides {T L, T L, L, 1}    packed rows only: SDPA's bias, L = DTC_MASK_LD(T)
// GPT-2 (NKV = NH, W = 3C) gives the graphs it always had. Packed rows (data.packing) add the
// mask as the SDPA node's bias, broadcast over the heads (0, or a large negative number where a
// row's key is another example's; the causal mask stays cuDNN's), in both directions: a plan
// of its own, the same workspace rules. cuDNN's ragged (THD) layout would skip the other
// examples' blocks instead of masking them, but its batch is the number of examples, which
// changes every step, and a plan per count would be built mid-training.
// Every frontend call that can fail is checked, and exceptions (the frontend throws from its
// dynamic loader) are caught at this file's C boundary.
#include "cudnn_att.h"

#include <dlfcn.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

// the frontend's dynamic loader reads cuDNN's symbols through this handle (one per process)
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

enum Uid : int64_t { Q_UID = 1, K_UID, V_UID, SCALE_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID, MASK_UID };

struct Lib {
    void *h = nullptr;
    decltype(&cudnnCreate) create = nullptr;
    decltype(&cudnnDestroy) destroy = nullptr;
    decltype(&cudnnSetStream) set_stream = nullptr;
    decltype(&cudnnGetVersion) version = nullptr;
    decltype(&cudnnGetErrorString) error_string = nullptr;
    std::string error; // empty when loaded
};

// The frontend opens a CUDA runtime of its own (dtrain's is linked statically): the major
// dtrain was built with, not the first of .so.12 / .so.13 it finds (the user's
// CUDNN_FRONTEND_CUDART_LIB_NAME wins). Set while the program starts, before any thread could
// read the environment (setenv beside a concurrent getenv is undefined).
const bool cudart_named = [] {
    const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    return setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0) == 0;
}();

Lib &lib() {
    static Lib l;
    static std::once_flag once;
    std::call_once(once, [] {
        (void)cudart_named;
        const std::string soname = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
        l.h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!l.h) {
            const char *e = dlerror();
            l.error = "cannot load " + soname + ": " + (e ? e : "?");
            return;
        }
        *(void **)&l.create = dlsym(l.h, "cudnnCreate");
        *(void **)&l.destroy = dlsym(l.h, "cudnnDestroy");
        *(void **)&l.set_stream = dlsym(l.h, "cudnnSetStream");
        *(void **)&l.version = dlsym(l.h, "cudnnGetVersion");
        *(void **)&l.error_string = dlsym(l.h, "cudnnGetErrorString");
        if (!l.create || !l.destroy || !l.set_stream || !l.version || !l.error_string) {
            l.error = soname + " lacks cudnnCreate, cudnnSetStream or cudnnGetVersion";
            return;
        }
        fe::cudnn_dlhandle = l.h;
    });
    return l;
}

using Key = std::array<int, 6>; // B, NH, NKV, T, HS, packed

void say(char *why, size_t n, const std::string &s) {
    if (why && n) std::snprintf(why, n, "%s", s.c_str());
}

// the shape of a key
struct Shape {
    int64_t B, NH, NKV, T, HS;
    bool packed;
    explicit Shape(const Key &k) : B(k[0]), NH(k[1]), NKV(k[2]), T(k[3]), HS(k[4]), packed(k[5] != 0) {}
    int64_t width() const { return (NH + 2 * NKV) * HS; } // a qkv row
    // q, k, v (and their gradients): `heads` heads read by strides from the packed rows
    std::vector<int64_t> qkv_dim(int64_t heads) const { return {B, heads, T, HS}; }
    std::vector<int64_t> qkv_stride() const { return {T * width(), HS, width(), 1}; }
    std::vector<int64_t> out_stride() const { return {T * NH * HS, HS, NH * HS, 1}; }
    std::vector<int64_t> mask_dim() const { return {B, 1, T, T}; }
    std::vector<int64_t> mask_stride() const { return {T * DTC_MASK_LD(T), T * DTC_MASK_LD(T), DTC_MASK_LD(T), 1}; }
};

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name, int64_t uid,
                                                    std::vector<int64_t> dim, std::vector<int64_t> stride) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

// packed rows' mask: bf16 whatever the graph's io type, as dtk_att_example_mask writes it
std::shared_ptr<fe::graph::Tensor_attributes> mask_input(fe::graph::Graph &g, const Shape &s) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("mask")
                        .set_uid(MASK_UID)
                        .set_dim(s.mask_dim())
                        .set_stride(s.mask_stride())
                        .set_data_type(fe::DataType_t::BFLOAT16));
}

std::shared_ptr<fe::graph::Tensor_attributes> scale_input(fe::graph::Graph &g) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("attn_scale")
                        .set_uid(SCALE_UID)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_is_pass_by_value(true)
                        .set_data_type(fe::DataType_t::FLOAT));
}

// validate, lower, pick by heuristic A (its engines first; the fallback list's after them, as
// the frontend's tests ask, for a graph A has no engine for), check and build the first that
// builds: "" when it worked, else what failed
std::string finish(fe::graph::Graph &g, cudnnHandle_t h) {
    fe::error_t e = g.validate();
    if (e.is_good()) e = g.build_operation_graph(h);
    if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (e.is_good()) e = g.check_support(h);
    if (e.is_good()) e = g.build_plans(h);
    return e.is_good() ? std::string() : e.get_message();
}

} // namespace

struct dtc_att {
    cudnnHandle_t h = nullptr;
    cudaStream_t s = nullptr;
    std::map<Key, std::shared_ptr<fe::graph::Graph>> fwd, bwd;
    std::map<Key, size_t> ws_fwd, ws_bwd; // each plan's workspace (bytes)
};

namespace {

std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

std::string build_fwd(dtc_att *a, const Key &k, std::shared_ptr<fe::graph::Graph> &out) {
    const Shape s(k);
    auto g = new_graph();
    auto Q = input(*g, "Q", Q_UID, s.qkv_dim(s.NH), s.qkv_stride());
    auto K = input(*g, "K", K_UID, s.qkv_dim(s.NKV), s.qkv_stride());
    auto V = input(*g, "V", V_UID, s.qkv_dim(s.NKV), s.qkv_stride());
    auto opts = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_causal_mask(true)
                    .set_attn_scale(scale_input(*g));
    if (s.packed) opts.set_bias(mask_input(*g, s));
    auto [O, stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(O_UID).set_dim(s.qkv_dim(s.NH)).set_stride(s.out_stride());
    if (!stats) return "the SDPA node gave no statistics";
    stats->set_output(true).set_uid(STATS_UID).set_data_type(fe::DataType_t::FLOAT).set_dim({s.B, s.NH, s.T, 1})
        .set_stride({s.NH * s.T, s.T, 1, 1});
    std::string e = finish(*g, a->h);
    if (e.empty()) out = g;
    return e;
}

std::string build_bwd(dtc_att *a, const Key &k, std::shared_ptr<fe::graph::Graph> &out) {
    const Shape s(k);
    auto g = new_graph();
    auto Q = input(*g, "Q", Q_UID, s.qkv_dim(s.NH), s.qkv_stride());
    auto K = input(*g, "K", K_UID, s.qkv_dim(s.NKV), s.qkv_stride());
    auto V = input(*g, "V", V_UID, s.qkv_dim(s.NKV), s.qkv_stride());
    auto O = input(*g, "O", O_UID, s.qkv_dim(s.NH), s.out_stride());
    auto dO = input(*g, "dO", DO_UID, s.qkv_dim(s.NH), s.out_stride());
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(STATS_UID)
                               .set_dim({s.B, s.NH, s.T, 1})
                               .set_stride({s.NH * s.T, s.T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_backward")
                    .set_causal_mask(true)
                    .set_deterministic_algorithm(true)
                    .set_attn_scale(scale_input(*g));
    if (s.packed) opts.set_bias(mask_input(*g, s));
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
    dQ->set_output(true).set_uid(DQ_UID).set_dim(s.qkv_dim(s.NH)).set_stride(s.qkv_stride());
    dK->set_output(true).set_uid(DK_UID).set_dim(s.qkv_dim(s.NKV)).set_stride(s.qkv_stride());
    dV->set_output(true).set_uid(DV_UID).set_dim(s.qkv_dim(s.NKV)).set_stride(s.qkv_stride());
    std::string e = finish(*g, a->h);
    if (e.empty()) out = g;
    return e;
}

std::string shape_name(const Key &k) {
    std::string kv = k[2] == k[1] ? "" : " (" + std::to_string(k[2]) + " key/value heads)";
    return std::to_string(k[0]) + "x" + std::to_string(k[1]) + " heads" + kv + " of " + std::to_string(k[3]) +
           " positions x " + std::to_string(k[4]) + (k[5] ? ", packed rows (a mask per example)" : "");
}

Key key_of(const dtc_shape &s) { return {s.B, s.NH, s.NKV, s.T, s.HS, s.packed ? 1 : 0}; }

// what the frontend's graph would refuse less clearly (or accept wrongly): "" or why; a call
// (not a plan) also passes its mask, which packed rows need and others must not pass
std::string bad_shape(const dtc_shape &s, const void *mask = nullptr, bool call = false) {
    if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.NKV <= 0 || s.HS <= 0 || s.NH % s.NKV != 0)
        return "no attention of B " + std::to_string(s.B) + ", T " + std::to_string(s.T) + ", " +
               std::to_string(s.NH) + " query heads over " + std::to_string(s.NKV) + " key/value heads of " +
               std::to_string(s.HS);
    if (call && !mask != !s.packed)
        return s.packed ? "packed rows without their mask" : "a mask for rows that are not packed";
    return "";
}

// the packed buffers: where q, k and v (or their gradients) start in a qkv row
std::array<char *, 3> qkv_parts(const void *base, const dtc_shape &s) {
    char *p = (char *)const_cast<void *>(base);
    const size_t hs2 = 2 * (size_t)s.HS; // bf16: 2 bytes an element
    return {p, p + hs2 * s.NH, p + hs2 * ((size_t)s.NH + s.NKV)};
}

// the forward plan of shape k, and with backward the backward one too, built when missing: ""
// or what cuDNN refused
std::string plan(dtc_att *a, const Key &k, bool backward) {
    for (int bwd = 0; bwd <= (backward ? 1 : 0); bwd++) {
        auto &plans = bwd ? a->bwd : a->fwd;
        if (plans.count(k)) continue;
        std::shared_ptr<fe::graph::Graph> g;
        std::string e = bwd ? build_bwd(a, k, g) : build_fwd(a, k, g);
        if (!e.empty()) return std::string(bwd ? "backward" : "forward") + " plan for " + shape_name(k) + ": " + e;
        int64_t w = 0;
        if (g->get_workspace_size(w).is_bad() || w < 0) return "no workspace size for " + shape_name(k);
        plans[k] = g;
        (bwd ? a->ws_bwd : a->ws_fwd)[k] = (size_t)w;
    }
    return "";
}

// the workspace the planned directions need
size_t workspace(const dtc_att *a, const Key &k, bool backward) {
    const size_t f = a->ws_fwd.at(k);
    return backward && a->ws_bwd.at(k) > f ? a->ws_bwd.at(k) : f;
}

std::string run(dtc_att *a, const fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, void *ws) {
    cudnnStatus_t st = lib().set_stream(a->h, a->s);
    if (st != CUDNN_STATUS_SUCCESS) return std::string("cudnnSetStream: ") + lib().error_string(st);
    fe::error_t e = g.execute(a->h, pack, ws);
    return e.is_good() ? std::string() : "execute: " + e.get_message();
}

// the shape's plan for one direction and enough workspace for it: "" or why not
std::string ready(dtc_att *a, const Key &k, bool backward, size_t ws_bytes) {
    std::string e = plan(a, k, backward);
    const size_t need = e.empty() ? (backward ? a->ws_bwd.at(k) : a->ws_fwd.at(k)) : 0;
    if (e.empty() && need > ws_bytes)
        e = "the workspace has " + std::to_string(ws_bytes) + " bytes, " + shape_name(k) + " needs " +
            std::to_string(need);
    return e;
}

// f() at the C boundary: its result, or -1 with the exception's message in why
template <typename F> int guarded(char *why, size_t n, F f) {
    try {
        return f();
    } catch (const std::exception &e) {
        say(why, n, e.what());
    } catch (...) {
        say(why, n, "an unknown exception in the cuDNN frontend");
    }
    return -1;
}

} // namespace

extern "C" dtc_att *dtc_att_open(cudaStream_t s, char *why, size_t n) {
    dtc_att *out = nullptr;
    guarded(why, n, [&] {
        Lib &l = lib();
        if (!l.error.empty()) {
            say(why, n, l.error);
            return -1;
        }
        const size_t v = l.version();
        if (v / 10000 != CUDNN_MAJOR) {
            say(why, n, "cuDNN " + std::to_string(v) + " is loaded, dtrain was built with " +
                            std::to_string(CUDNN_MAJOR) + ".x");
            return -1;
        }
        auto a = std::make_unique<dtc_att>();
        cudnnStatus_t st = l.create(&a->h);
        if (st != CUDNN_STATUS_SUCCESS) {
            say(why, n, std::string("cudnnCreate: ") + l.error_string(st));
            return -1;
        }
        a->s = s;
        out = a.release();
        return 0;
    });
    return out;
}

extern "C" void dtc_att_close(dtc_att *a) {
    if (!a) return;
    try {
        a->fwd.clear();
        a->bwd.clear();
        if (a->h) lib().destroy(a->h);
    } catch (...) {
    }
    delete a;
}

extern "C" int dtc_att_plan(dtc_att *a, dtc_shape s, int backward, size_t *ws, char *why, size_t n) {
    return guarded(why, n, [&] {
        const Key k = key_of(s);
        std::string e = bad_shape(s);
        if (e.empty()) e = plan(a, k, backward != 0);
        if (!e.empty()) {
            say(why, n, e);
            return -1;
        }
        *ws = workspace(a, k, backward != 0);
        return 0;
    });
}

extern "C" int dtc_att_fwd(dtc_att *a, void *out, float *stats, const void *qkv, const void *mask, dtc_shape s,
                           void *ws, size_t ws_bytes, char *why, size_t n) {
    return guarded(why, n, [&] {
        const Key k = key_of(s);
        std::string e = bad_shape(s, mask, true);
        if (e.empty()) e = ready(a, k, false, ws_bytes);
        if (e.empty()) {
            float scale = 1.0f / std::sqrt((float)s.HS);
            const std::array<char *, 3> in = qkv_parts(qkv, s);
            std::unordered_map<int64_t, void *> pack = {
                {Q_UID, in[0]}, {K_UID, in[1]}, {V_UID, in[2]},
                {SCALE_UID, &scale}, {O_UID, out}, {STATS_UID, stats}};
            if (s.packed) pack[MASK_UID] = const_cast<void *>(mask);
            e = run(a, *a->fwd[k], pack, ws);
        }
        if (e.empty()) return 0;
        say(why, n, e);
        return -1;
    });
}

extern "C" int dtc_att_bwd(dtc_att *a, void *dqkv, const void *dout, const void *qkv, const void *mask,
                           const void *out, const float *stats, dtc_shape s, void *ws, size_t ws_bytes, char *why,
                           size_t n) {
    return guarded(why, n, [&] {
        const Key k = key_of(s);
        std::string e = bad_shape(s, mask, true);
        if (e.empty()) e = ready(a, k, true, ws_bytes);
        if (e.empty()) {
            float scale = 1.0f / std::sqrt((float)s.HS);
            const std::array<char *, 3> in = qkv_parts(qkv, s), d = qkv_parts(dqkv, s);
            std::unordered_map<int64_t, void *> pack = {
                {Q_UID, in[0]}, {K_UID, in[1]}, {V_UID, in[2]},
                {O_UID, const_cast<void *>(out)}, {DO_UID, const_cast<void *>(dout)},
                {STATS_UID, const_cast<float *>(stats)}, {SCALE_UID, &scale},
                {DQ_UID, d[0]}, {DK_UID, d[1]}, {DV_UID, d[2]}};
            if (s.packed) pack[MASK_UID] = const_cast<void *>(mask);
            e = run(a, *a->bwd[k], pack, ws);
        }
        if (e.empty()) return 0;
        say(why, n, e);
        return -1;
    });
}
