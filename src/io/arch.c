/* arch.c — the architectures and the model's shape fields as data (include/dtrain/arch.h). */
#include "dtrain/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHAPE_ROW(f, name, kind, def, min, open, archs, gpt2, llama) \
    {name, DT_SHAPE_##kind, offsetof(dt_model_shape, f), def, min, open, archs, {gpt2, llama}},
static const dt_shape_field fields[] = {DT_SHAPE_FIELDS(SHAPE_ROW)};
#undef SHAPE_ROW

const dt_shape_field *dt_shape_fields(int *n) {
    *n = (int)(sizeof fields / sizeof *fields);
    return fields;
}

double dt_shape_get(const dt_model_shape *s, const dt_shape_field *f) {
    if (f->kind == DT_SHAPE_DOUBLE) {
        double d;
        memcpy(&d, (const char *)s + f->offset, sizeof d);
        return d;
    }
    int v;
    memcpy(&v, (const char *)s + f->offset, sizeof v);
    return v;
}

void dt_shape_set(dt_model_shape *s, const dt_shape_field *f, double v) {
    if (f->kind == DT_SHAPE_DOUBLE) {
        memcpy((char *)s + f->offset, &v, sizeof v);
        return;
    }
    const int i = f->kind == DT_SHAPE_BOOL ? v != 0 : (int)v;
    memcpy((char *)s + f->offset, &i, sizeof i);
}

double dt_shape_default(const dt_shape_field *f) {
    if (f->kind == DT_SHAPE_BOOL) return strcmp(f->def, "true") == 0;
    return strtod(f->def, NULL);
}

const char *dt_shape_str(const dt_model_shape *s, const dt_shape_field *f, char *buf, size_t n) {
    const double v = dt_shape_get(s, f);
    if (f->kind == DT_SHAPE_BOOL) snprintf(buf, n, "%s", v != 0 ? "true" : "false");
    else if (f->kind == DT_SHAPE_DOUBLE) snprintf(buf, n, "%.9g", v);
    else snprintf(buf, n, "%d", (int)v);
    return buf;
}

static const struct {
    const char *name, *hf_model_type, *hf_lm, *hf_cls;
} archs[DT_ARCH_COUNT] = {
    [DT_ARCH_GPT2] = {"gpt2", "gpt2", "GPT2LMHeadModel", "GPT2ForSequenceClassification"},
    [DT_ARCH_LLAMA] = {"llama", "llama", "LlamaForCausalLM", "LlamaForSequenceClassification"},
};

dt_status dt_arch_from_hf(const char *model_type, dt_arch *out) {
    static const struct {
        const char *model_type;
        dt_arch arch;
    } hf[] = {{"gpt2", DT_ARCH_GPT2}, {"llama", DT_ARCH_LLAMA}, {"mistral", DT_ARCH_LLAMA}, {"qwen2", DT_ARCH_LLAMA}};
    for (size_t i = 0; i < sizeof hf / sizeof *hf; i++)
        if (strcmp(model_type, hf[i].model_type) == 0) {
            *out = hf[i].arch;
            return DT_OK;
        }
    return DT_ERR_USAGE;
}

dt_status dt_arch_parse(const char *type, dt_arch *out) {
#define MATCH(spelling, a, id)          \
    if (strcmp(type, spelling) == 0) { \
        *out = a;                      \
        return DT_OK;                  \
    }
    DT_ARCH_NAMES(MATCH)
#undef MATCH
    return DT_ERR_USAGE;
}

const char *dt_arch_name(dt_arch a) { return archs[a].name; }
const char *dt_arch_hf_model_type(dt_arch a) { return archs[a].hf_model_type; }
const char *dt_arch_hf_class(dt_arch a, int classifier) { return classifier ? archs[a].hf_cls : archs[a].hf_lm; }

static const struct {
    const char *name;
    dt_arch arch;
    const char *module;
} lora_targets[] = {
#define LORA_ROW(name, arch, module) {name, arch, module},
    DT_LORA_TARGETS(LORA_ROW)
#undef LORA_ROW
};
#define N_LORA ((int)(sizeof lora_targets / sizeof *lora_targets))
_Static_assert(N_LORA <= DT_LORA_MAX_TARGETS, "a target mask has DT_LORA_MAX_TARGETS bits");

int dt_lora_target_count(void) { return N_LORA; }
const char *dt_lora_target_name(int i) { return i >= 0 && i < N_LORA ? lora_targets[i].name : NULL; }
const char *dt_lora_target_module(int i) { return i >= 0 && i < N_LORA ? lora_targets[i].module : NULL; }

int dt_lora_target_parse(const char *name) {
    for (int i = 0; i < N_LORA; i++)
        if (strcmp(name, lora_targets[i].name) == 0) return i;
    return -1;
}

unsigned dt_lora_arch_targets(dt_arch a) {
    unsigned m = 0;
    for (int i = 0; i < N_LORA; i++)
        if (lora_targets[i].arch == a) m |= 1u << i;
    return m;
}

unsigned dt_lora_default_targets(dt_arch a) {
    if (a == DT_ARCH_GPT2) return 1u << dt_lora_target_parse("c_attn");
    return 1u << dt_lora_target_parse("q") | 1u << dt_lora_target_parse("v");
}

const char *dt_lora_targets_str(unsigned mask, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_LORA && k < n; i++)
        if (mask & (1u << i)) k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", lora_targets[i].name);
    return buf;
}
