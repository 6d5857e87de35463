/* chat.c — chat templates recognised to the byte and rendered (include/dtrain/chat.h). */
#include "dtrain/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtrain/hfdir.h"

/* ChatML as transformers writes it; the SmolLM2 form adds a default system message (SYS) when
 * the conversation has none: DEFSYS_HEAD SYS DEFSYS_TAIL. */
#define CHATML_TURN "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
#define CHATML_GEN "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
static const char CHATML[] = "{% for message in messages %}" CHATML_TURN "{% endfor %}" CHATML_GEN;
static const char DEFSYS_HEAD[] = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
                                  "%}{{ '<|im_start|>system\n";
static const char DEFSYS_TAIL[] = "<|im_end|>\n' }}{% endif %}" CHATML_TURN "{% endfor %}" CHATML_GEN;

struct dt_chat {
    char *default_system; /* NULL: none */
    char *eos;
};

static int has_suffix(const char *s, size_t n, const char *suffix) {
    const size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* The template recognised: 0 (c filled), -1 not one dtrain renders. */
static int recognise(const char *t, dt_chat *c) {
    if (strcmp(t, CHATML) == 0) return 0;
    const size_t n = strlen(t), h = strlen(DEFSYS_HEAD);
    if (n < h || memcmp(t, DEFSYS_HEAD, h) != 0 || !has_suffix(t, n, DEFSYS_TAIL)) return -1;
    const size_t len = n - h - strlen(DEFSYS_TAIL);
    for (size_t i = 0; i < len; i++) /* a plain string literal: no quote, escape or template syntax */
        if (strchr("'\\{}%", t[h + i])) return -1;
    c->default_system = strndup(t + h, len);
    return c->default_system ? 0 : -1;
}

dt_status dt_chat_open(const char *dir, dt_chat **out) {
    *out = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (access(path, F_OK) != 0)
        return dt_error_set(DT_ERR_DATA, "%s: no such file: a chat model's tokenizer_config.json holds its chat_template "
                            "(hint: leave out --chat and give the prompt as the model expects it)", path);
    dt_hf_tokens t;
    void *held;
    DT_TRY(dt_hf_read_tokens(dir, &t, &held));
    dt_status st = DT_OK;
    dt_chat *c = calloc(1, sizeof *c);
    if (!c) st = dt_error_set(DT_ERR_NOMEM, "out of memory");
    else if (!t.chat_template)
        st = dt_error_set(DT_ERR_DATA, "%s: chat_template: missing (not a chat model's tokenizer, or a template in a "
                          "file of its own) (hint: leave out --chat and give the prompt as the model expects it)", path);
    else if (!t.eos)
        st = dt_error_set(DT_ERR_DATA, "%s: eos_token: missing: generation would not know where the answer ends", path);
    else if (recognise(t.chat_template, c) != 0)
        st = dt_error_set(DT_ERR_DATA, "%s: chat_template: not a template dtrain renders exactly (it knows ChatML, with "
                          "or without a default system prompt, as SmolLM2's); refusing rather than approximating it "
                          "(hint: leave out --chat and give the prompt as the template would render it)", path);
    else if (!(c->eos = strdup(t.eos))) st = dt_error_set(DT_ERR_NOMEM, "out of memory");
    dt_hf_tokens_free(held);
    if (st != DT_OK) {
        dt_chat_free(c);
        return st;
    }
    *out = c;
    return DT_OK;
}

void dt_chat_free(dt_chat *c) {
    if (!c) return;
    free(c->default_system);
    free(c->eos);
    free(c);
}

const char *dt_chat_name(const dt_chat *c) { return c->default_system ? "ChatML with a default system prompt" : "ChatML"; }
const char *dt_chat_eos(const dt_chat *c) { return c->eos; }

/* Appends "<|im_start|>ROLE\nCONTENT<|im_end|>\n" to the stream; an assistant's turn adds its
 * answer's span (its content's first byte to the end of <|im_end|>) to spans when given. */
static void turn(FILE *f, const char *role, const char *content, size_t *spans, int *n_spans) {
    fprintf(f, "<|im_start|>%s\n", role);
    const long start = ftell(f);
    fprintf(f, "%s<|im_end|>", content);
    if (spans && strcmp(role, "assistant") == 0) {
        spans[2 * *n_spans] = (size_t)start;
        spans[2 * *n_spans + 1] = (size_t)ftell(f);
        ++*n_spans;
    }
    fputc('\n', f);
}

static dt_status render(const dt_chat *c, const dt_chat_msg *msgs, int n, int add_generation_prompt, char **out,
                        size_t *spans, int *n_spans) {
    size_t len = 0;
    *out = NULL;
    FILE *f = open_memstream(out, &len);
    if (!f) return dt_error_set(DT_ERR_NOMEM, "out of memory rendering the chat template");
    if (c->default_system && n > 0 && strcmp(msgs[0].role, "system") != 0) turn(f, "system", c->default_system, NULL, NULL);
    for (int i = 0; i < n; i++) turn(f, msgs[i].role, msgs[i].content, spans, n_spans);
    if (add_generation_prompt) fputs("<|im_start|>assistant\n", f);
    if (fclose(f) != 0 || !*out) {
        free(*out);
        *out = NULL;
        return dt_error_set(DT_ERR_NOMEM, "out of memory rendering the chat template");
    }
    return DT_OK;
}

dt_status dt_chat_render(const dt_chat *c, const dt_chat_msg *msgs, int n, int add_generation_prompt, char **out) {
    return render(c, msgs, n, add_generation_prompt, out, NULL, NULL);
}

dt_status dt_chat_render_answers(const dt_chat *c, const dt_chat_msg *msgs, int n, char **out, size_t *spans,
                                 int *n_spans) {
    *n_spans = 0;
    return render(c, msgs, n, 0, out, spans, n_spans);
}
