/* arch.c — the architectures and the model's shape fields as data (include/dtrain/arch.h). */
#include "dtrain/arch.h"

#include <string.h>

#define SHAPE_ROW(f, kind, def, min, gpt2) {#f, DT_SHAPE_##kind, offsetof(dt_model_shape, f), min, {gpt2}},
static const dt_shape_field fields[] = {DT_SHAPE_FIELDS(SHAPE_ROW)};
#undef SHAPE_ROW

const dt_shape_field *dt_shape_fields(int *n) {
    *n = (int)(sizeof fields / sizeof *fields);
    return fields;
}

double dt_shape_get(const dt_model_shape *s, const dt_shape_field *f) {
    int v;
    memcpy(&v, (const char *)s + f->offset, sizeof v);
    return v;
}

void dt_shape_set(dt_model_shape *s, const dt_shape_field *f, double v) {
    const int i = (int)v;
    memcpy((char *)s + f->offset, &i, sizeof i);
}

const char *dt_shape_str(const dt_model_shape *s, const dt_shape_field *f, char *buf, size_t n) {
    snprintf(buf, n, "%d", (int)dt_shape_get(s, f));
    return buf;
}

static const struct {
    const char *name, *hf_model_type, *hf_lm, *hf_cls;
} archs[DT_ARCH_COUNT] = {
    [DT_ARCH_GPT2] = {"gpt2", "gpt2", "GPT2LMHeadModel", "GPT2ForSequenceClassification"},
};

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
