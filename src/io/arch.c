/* arch.c — the architectures and the model's shape fields as data (include/dtrain/arch.h). */
#include "dtrain/arch.h"

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
