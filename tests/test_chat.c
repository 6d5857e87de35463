/* test_chat.c — chat templates (src/io/chat.c): ChatML with and without a default system prompt,
 * Qwen 2.5 Instruct's and Llama 3.1 and 3.2 Instruct's (their texts in tests/chat_templates/, as
 * the models' tokenizer_config.json hold them) rendered as jinja2 renders them (the expected
 * strings below are jinja2 3.1.6's output through transformers 5.23's apply_chat_template for
 * these templates and conversations; Llama 3.2's date is today's, strftime("%d %b %Y")), the
 * answers' spans, and every other template (one byte off), a missing file, a missing template or
 * eos_token refused naming the file and the key. tests/test_chat_templates.py checks the same
 * templates against transformers itself, through dtrain's tokens and assistant masks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/chat.h"

#define TURN "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
#define GEN "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
/* as JSON strings: \\n is the newline character inside the template's string literals */
static const char SMOLLM2[] = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                              "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
                              "Hugging Face<|im_end|>\\n' }}{% endif %}" TURN "{% endfor %}" GEN;
static const char CHATML[] = "{% for message in messages %}" TURN "{% endfor %}" GEN;

static char dir[512];

/* DIR/tokenizer_config.json with the template (a JSON string's contents), eos and bos (JSON values,
 * NULL: none) */
static void write_config_bos(const char *tmpl, const char *eos, const char *bos) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"");
    if (tmpl) fprintf(f, ", \"chat_template\": \"%s\"", tmpl);
    if (eos) fprintf(f, ", \"eos_token\": %s", eos);
    if (bos) fprintf(f, ", \"bos_token\": %s", bos);
    fprintf(f, "}\n");
    CHECK(fclose(f) == 0);
}

static void write_config(const char *tmpl, const char *eos) { write_config_bos(tmpl, eos, NULL); }

/* tests/chat_templates/NAME.jinja as a JSON string's contents (malloc'ed), its last `cut` bytes
 * left out and `from` replaced by `to` (NULL: nothing) */
static char *template_json(const char *name, size_t cut, const char *from, const char *to) {
    char path[600];
    snprintf(path, sizeof path, "%s/tests/chat_templates/%s.jinja", DTRAIN_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    static char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    CHECK(n > cut && n < sizeof text - 1);
    fclose(f);
    text[n - cut] = '\0';
    char *at = from ? strstr(text, from) : NULL;
    CHECK(!from || (at && strlen(to) == strlen(from)));
    if (at) memcpy(at, to, strlen(to));
    char *json = malloc(2 * n + 1), *o = json;
    CHECK(json != NULL);
    for (const char *p = text; *p; p++) {
        if (*p == '"' || *p == '\\') *o++ = '\\', *o++ = *p;
        else if (*p == '\n') *o++ = '\\', *o++ = 'n';
        else *o++ = *p;
    }
    *o = '\0';
    return json;
}

/* DIR's config with tests/chat_templates/NAME.jinja, opened as the template called `called` */
static dt_chat *open_template(const char *name, const char *eos, const char *bos, const char *called) {
    char *json = template_json(name, 0, NULL, NULL);
    write_config_bos(json, eos, bos);
    free(json);
    dt_chat *c;
    CHECK_OK(dt_chat_open(dir, &c));
    CHECK_STR_EQ(dt_chat_name(c), called);
    return c;
}

/* want with Llama 3.1's date, "26 Jul 2024", as today's (Llama 3.2's strftime_now("%d %b %Y")):
 * a static buffer */
static const char *dated(const char *want, int today) {
    static char out[4096];
    snprintf(out, sizeof out, "%s", want);
    char *at = strstr(out, "Today Date: 26 Jul 2024");
    if (!today || !at) return out;
    const time_t now = time(NULL);
    struct tm tm;
    CHECK(localtime_r(&now, &tm) != NULL);
    char date[32];
    CHECK(strftime(date, sizeof date, "%d %b %Y", &tm) == 11);
    memcpy(at + strlen("Today Date: "), date, 11);
    return out;
}

/* the answers' spans in m's rendering without the generation prompt: their texts are want[] */
static void check_spans(const dt_chat *c, const dt_chat_msg *m, int n, const char *const *want, int n_want) {
    char *text, *plain;
    size_t spans[64];
    int n_spans = -1;
    CHECK(n <= 32);
    CHECK_OK(dt_chat_render_answers(c, m, n, &text, spans, &n_spans));
    CHECK_OK(dt_chat_render(c, m, n, 0, &plain));
    CHECK_STR_EQ(text, plain);
    CHECK_INT_EQ(n_spans, n_want);
    for (int k = 0; k < n_spans; k++) {
        CHECK(spans[2 * k] <= spans[2 * k + 1] && spans[2 * k + 1] <= strlen(text));
        const size_t len = spans[2 * k + 1] - spans[2 * k];
        if (len != strlen(want[k]) || memcmp(text + spans[2 * k], want[k], len) != 0) {
            fprintf(stderr, "answer %d's span: \"%.*s\", expected \"%s\"\n", k, (int)len, text + spans[2 * k], want[k]);
            exit(1);
        }
    }
    free(text);
    free(plain);
}

static void check_render(const dt_chat *c, const dt_chat_msg *m, int n, int gen, const char *want) {
    char *got;
    CHECK(dt_chat_render(c, m, n, gen, &got) == DT_OK);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "rendered:\n%s\nexpected:\n%s\n", got, want);
        exit(1);
    }
    free(got);
}

static void refused(const char *tmpl, const char *eos, const char *says) {
    write_config(tmpl, eos);
    dt_chat *c = (dt_chat *)1;
    CHECK(dt_chat_open(dir, &c) == DT_ERR_DATA);
    CHECK(c == NULL);
    CHECK(strstr(dt_error_msg(), "tokenizer_config.json") != NULL);
    if (!strstr(dt_error_msg(), says)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", dt_error_msg(), says);
        exit(1);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/chat-%d", DTRAIN_TEST_TMP, (int)getpid());
    mkdir(DTRAIN_TEST_TMP, 0755);
    CHECK(mkdir(dir, 0755) == 0);
    const dt_chat_msg one[] = {{"user", "Hi"}};
    const dt_chat_msg four[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

    /* SmolLM2's: its default system message unless the conversation brings one */
    write_config(SMOLLM2, "\"<|im_end|>\"");
    dt_chat *c;
    CHECK(dt_chat_open(dir, &c) == DT_OK);
    CHECK(strcmp(dt_chat_eos(c), "<|im_end|>") == 0);
    check_render(c, one, 1, 1,
                 "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    check_render(c, four, 4, 1,
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                 "Hello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
    check_render(c, one, 0, 0, ""); /* no messages: the loop (and its default system) does not run */
    const char *const smol_answer[] = {"Hello!<|im_end|>"};
    check_spans(c, four, 4, smol_answer, 1);
    dt_chat_free(c);

    /* Qwen 2.5 Instruct: ChatML, Qwen's system message unless the conversation brings one, the
     * contents as they are; Llama 3.1 and 3.2 Instruct: the contents trimmed (Python's white space:
     * tab, no-break space, ideographic and em space), the date in the system turn */
    const dt_chat_msg ws[] = {{"system", "  Be brief.\n"}, {"user", " Hi \t"}, {"assistant", "\nHello!\u00a0"},
                              {"user", "2+2?\u3000"}, {"assistant", " \u2003Four."}};
    const dt_chat_msg mid[] = {{"user", "a"}, {"system", " mid "}, {"assistant", "b"}};
    const dt_chat_msg only[] = {{"system", "only"}};
#define QSYS "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    c = open_template("Qwen2.5-Instruct", "\"<|im_end|>\"", NULL, "Qwen 2.5 Instruct");
    CHECK_STR_EQ(dt_chat_eos(c), "<|im_end|>");
    check_render(c, one, 1, 0, QSYS "<|im_start|>user\nHi<|im_end|>\n");
    check_render(c, one, 1, 1, QSYS "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    check_render(c, four, 4, 0, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
                 "assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
    check_render(c, ws, 5, 1, "<|im_start|>system\n  Be brief.\n<|im_end|>\n<|im_start|>user\n Hi \t<|im_end|>\n"
                 "<|im_start|>assistant\n\nHello!\u00a0<|im_end|>\n<|im_start|>user\n2+2?\u3000<|im_end|>\n"
                 "<|im_start|>assistant\n \u2003Four.<|im_end|>\n<|im_start|>assistant\n");
    check_render(c, mid, 3, 0, QSYS "<|im_start|>user\na<|im_end|>\n<|im_start|>system\n mid <|im_end|>\n"
                 "<|im_start|>assistant\nb<|im_end|>\n");
    check_render(c, only, 1, 1, "<|im_start|>system\nonly<|im_end|>\n<|im_start|>assistant\n");
    const char *const qwen_answers[] = {"\nHello!\u00a0<|im_end|>", " \u2003Four.<|im_end|>"};
    check_spans(c, ws, 5, qwen_answers, 2);
    char *got = (char *)1;
    CHECK(dt_chat_render(c, one, 0, 1, &got) == DT_ERR_DATA); /* jinja2 fails on messages[0] */
    CHECK(got == NULL && strstr(dt_error_msg(), "Qwen 2.5 Instruct: no messages") != NULL);
    const dt_chat_msg tool[] = {{"user", "Hi"}, {"tool", "{}"}};
    CHECK(dt_chat_render(c, tool, 2, 0, &got) == DT_ERR_DATA); /* its own branch in the template */
    CHECK(strstr(dt_error_msg(), "role \"tool\"") != NULL);
    dt_chat_free(c);

#define L3SYS "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n" \
              "Today Date: 26 Jul 2024\n\n"
#define L3 "<|start_header_id|>"
#define L3END "<|end_header_id|>\n\n"
    for (int today = 0; today <= 1; today++) {
        c = open_template(today ? "Llama-3.2-Instruct" : "Llama-3.1-Instruct", "\"<|eot_id|>\"",
                          "{\"content\": \"<|begin_of_text|>\", \"special\": true}",
                          today ? "Llama 3.2 Instruct" : "Llama 3.1 Instruct");
        CHECK_STR_EQ(dt_chat_eos(c), "<|eot_id|>");
        check_render(c, one, 1, 0, dated(L3SYS "<|eot_id|>" L3 "user" L3END "Hi<|eot_id|>", today));
        check_render(c, one, 1, 1, dated(L3SYS "<|eot_id|>" L3 "user" L3END "Hi<|eot_id|>" L3 "assistant" L3END, today));
        check_render(c, four, 4, 1, dated(L3SYS "Be brief.<|eot_id|>" L3 "user" L3END "Hi<|eot_id|>" L3 "assistant" L3END
                                          "Hello!<|eot_id|>" L3 "user" L3END "2+2?<|eot_id|>" L3 "assistant" L3END, today));
        check_render(c, ws, 5, 0, dated(L3SYS "Be brief.<|eot_id|>" L3 "user" L3END "Hi<|eot_id|>" L3 "assistant" L3END
                                        "Hello!<|eot_id|>" L3 "user" L3END "2+2?<|eot_id|>" L3 "assistant" L3END
                                        "Four.<|eot_id|>", today));
        check_render(c, mid, 3, 1, dated(L3SYS "<|eot_id|>" L3 "user" L3END "a<|eot_id|>" L3 "system" L3END "mid<|eot_id|>"
                                         L3 "assistant" L3END "b<|eot_id|>" L3 "assistant" L3END, today));
        check_render(c, only, 1, 0, dated(L3SYS "only<|eot_id|>", today));
        const char *const llama_answers[] = {"Hello!<|eot_id|>", "Four.<|eot_id|>"};
        check_spans(c, ws, 5, llama_answers, 2);
        CHECK(dt_chat_render(c, one, 0, 0, &got) == DT_ERR_DATA);
        dt_chat_free(c);
    }
    /* no bos_token: jinja2 renders the undefined one empty */
    c = open_template("Llama-3.1-Instruct", "\"<|eot_id|>\"", NULL, "Llama 3.1 Instruct");
    check_render(c, one, 1, 0, L3 "system" L3END "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                 "<|eot_id|>" L3 "user" L3END "Hi<|eot_id|>");
    dt_chat_free(c);

    /* plain ChatML, eos as an AddedToken object */
    write_config(CHATML, "{\"content\": \"<|im_end|>\", \"special\": true}");
    CHECK(dt_chat_open(dir, &c) == DT_OK);
    CHECK(strcmp(dt_chat_eos(c), "<|im_end|>") == 0);
    check_render(c, one, 1, 0, "<|im_start|>user\nHi<|im_end|>\n");
    dt_chat_free(c);

    /* refusals: the known texts a byte off (without the trailing newline their tokenizer_config.json
     * holds, another default date), another template (one character off, Llama 3's form), none, no
     * eos, no file */
    char *off = template_json("Qwen2.5-Instruct", 1, NULL, NULL);
    refused(off, "\"<|im_end|>\"", "not a template dtrain renders exactly");
    free(off);
    off = template_json("Llama-3.1-Instruct", 0, "26 Jul 2024", "27 Jul 2024");
    refused(off, "\"<|eot_id|>\"", "not a template dtrain renders exactly");
    free(off);
    off = template_json("Llama-3.2-Instruct", 0, "strftime_now(", "strftime_now ");
    refused(off, "\"<|eot_id|>\"", "not a template dtrain renders exactly");
    free(off);
    refused("{% for message in messages %}" TURN "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant' }}"
            "{% endif %}", "\"<|im_end|>\"", "not a template dtrain renders exactly");
    refused("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] }}{% endfor %}",
            "\"<|eot_id|>\"", "chat_template: not a template");
    refused(NULL, "\"<|im_end|>\"", "chat_template: missing");
    refused(CHATML, NULL, "eos_token: missing");
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    remove(path);
    CHECK(dt_chat_open(dir, &c) == DT_ERR_DATA);
    rmdir(dir);
    printf("test_chat: ok\n");
    return 0;
}
