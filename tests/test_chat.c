/* test_chat.c — chat templates (src/io/chat.c): ChatML with and without a default system prompt
 * rendered as jinja2 renders them (the expected strings below are jinja2 3.1.6's output for
 * these templates and conversations), and every other template, a missing file, a missing
 * template or eos_token refused naming the file and the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* DIR/tokenizer_config.json with the template (a JSON string's contents) and eos (NULL: none) */
static void write_config(const char *tmpl, const char *eos) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"");
    if (tmpl) fprintf(f, ", \"chat_template\": \"%s\"", tmpl);
    if (eos) fprintf(f, ", \"eos_token\": %s", eos);
    fprintf(f, "}\n");
    CHECK(fclose(f) == 0);
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
    dt_chat_free(c);

    /* plain ChatML, eos as an AddedToken object */
    write_config(CHATML, "{\"content\": \"<|im_end|>\", \"special\": true}");
    CHECK(dt_chat_open(dir, &c) == DT_OK);
    CHECK(strcmp(dt_chat_eos(c), "<|im_end|>") == 0);
    check_render(c, one, 1, 0, "<|im_start|>user\nHi<|im_end|>\n");
    dt_chat_free(c);

    /* refusals: another template (one character off, Llama 3's form), none, no eos, no file */
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
