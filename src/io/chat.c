/* chat.c — chat templates recognised to the byte and rendered (include/dtrain/chat.h).
 *
 * A template is recognised when its text is one of those below (ChatML with any default system
 * prompt of plain text is recognised by its pattern), and rendered by one of two turn syntaxes:
 * ChatML's (SmolLM2, Qwen 2.5) and Llama 3's. Only the branches a conversation of system, user
 * and assistant messages with string content takes are rendered: tools never reach dtrain. */
#include "dtrain/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/hfdir.h"

/* ---- the templates' texts, as the models' tokenizer_config.json hold them ---- */

/* ChatML as transformers writes it; the SmolLM2 form adds a default system message (SYS) when
 * the conversation has none: DEFSYS_HEAD SYS DEFSYS_TAIL. */
#define CHATML_TURN "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
#define CHATML_GEN "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
static const char CHATML[] = "{% for message in messages %}" CHATML_TURN "{% endfor %}" CHATML_GEN;
static const char DEFSYS_HEAD[] = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
                                  "%}{{ '<|im_start|>system\n";
static const char DEFSYS_TAIL[] = "<|im_end|>\n' }}{% endif %}" CHATML_TURN "{% endfor %}" CHATML_GEN;

/* Qwen/Qwen2.5-*-Instruct: ChatML, its default system message, tool-calling branches */
#define QWEN_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
static const char QWEN25[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

/* meta-llama/Llama-3.1-*-Instruct (Llama-3.3-70B-Instruct's too, we believe), Llama-3.2-{1B,3B}-Instruct:
 * the same text but for the date (3.2: strftime_now when defined), the built-in tools (3.1), a comment */
#define L3_HEAD \
    "{{- bos_token }}\n" \
    "{%- if custom_tools is defined %}\n" \
    "    {%- set tools = custom_tools %}\n" \
    "{%- endif %}\n" \
    "{%- if not tools_in_user_message is defined %}\n" \
    "    {%- set tools_in_user_message = true %}\n" \
    "{%- endif %}\n" \
    "{%- if not date_string is defined %}\n"
#define L3_SYSTEM \
    "{%- endif %}\n" \
    "{%- if not tools is defined %}\n" \
    "    {%- set tools = none %}\n" \
    "{%- endif %}\n" \
    "\n" \
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n" \
    "{%- if messages[0]['role'] == 'system' %}\n" \
    "    {%- set system_message = messages[0]['content']|trim %}\n" \
    "    {%- set messages = messages[1:] %}\n" \
    "{%- else %}\n" \
    "    {%- set system_message = \"\" %}\n" \
    "{%- endif %}\n" \
    "\n"
#define L3_TURNS \
    "{%- endif %}\n" \
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n" \
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n" \
    "{%- if tools is not none and not tools_in_user_message %}\n" \
    "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n" \
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n" \
    "    {{- \"Do not use variables.\\n\\n\" }}\n" \
    "    {%- for t in tools %}\n" \
    "        {{- t | tojson(indent=4) }}\n" \
    "        {{- \"\\n\\n\" }}\n" \
    "    {%- endfor %}\n" \
    "{%- endif %}\n" \
    "{{- system_message }}\n" \
    "{{- \"<|eot_id|>\" }}\n" \
    "\n" \
    "{#- Custom tools are passed in a user message with some extra guidance #}\n" \
    "{%- if tools_in_user_message and not tools is none %}\n" \
    "    {#- Extract the first user message so we can plug it in here #}\n" \
    "    {%- if messages | length != 0 %}\n" \
    "        {%- set first_user_message = messages[0]['content']|trim %}\n" \
    "        {%- set messages = messages[1:] %}\n" \
    "    {%- else %}\n" \
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n" \
    "{%- endif %}\n" \
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n" \
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n" \
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n" \
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n" \
    "    {{- \"Do not use variables.\\n\\n\" }}\n" \
    "    {%- for t in tools %}\n" \
    "        {{- t | tojson(indent=4) }}\n" \
    "        {{- \"\\n\\n\" }}\n" \
    "    {%- endfor %}\n" \
    "    {{- first_user_message + \"<|eot_id|>\"}}\n" \
    "{%- endif %}\n" \
    "\n" \
    "{%- for message in messages %}\n" \
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n" \
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n" \
    "    {%- elif 'tool_calls' in message %}\n" \
    "        {%- if not message.tool_calls|length == 1 %}\n" \
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n" \
    "        {%- endif %}\n" \
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
#define L3_TAIL \
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n" \
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n" \
    "        {%- if message.content is mapping or message.content is iterable %}\n" \
    "            {{- message.content | tojson }}\n" \
    "        {%- else %}\n" \
    "            {{- message.content }}\n" \
    "        {%- endif %}\n" \
    "        {{- \"<|eot_id|>\" }}\n" \
    "    {%- endif %}\n" \
    "{%- endfor %}\n" \
    "{%- if add_generation_prompt %}\n" \
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n" \
    "{%- endif %}\n"
static const char LLAMA31[] =
    L3_HEAD
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    L3_SYSTEM
    "{#- System message + builtin tools #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n"
    L3_TURNS
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- endif %}\n"
    "                {%- endfor %}\n"
    "            {{- \")\" }}\n"
    "        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- \"}\" }}\n"
    "        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n"
    "            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n"
    "            {{- \"<|eot_id|>\" }}\n"
    "        {%- endif %}\n"
    L3_TAIL;
static const char LLAMA32[] =
    L3_HEAD
    "    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
    "    {%- else %}\n"
    "        {%- set date_string = \"26 Jul 2024\" %}\n"
    "    {%- endif %}\n"
    L3_SYSTEM
    "{#- System message #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    L3_TURNS
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "        {{- '\"parameters\": ' }}\n"
    "        {{- tool_call.arguments | tojson }}\n"
    "        {{- \"}\" }}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    L3_TAIL;

/* ---- how they render a conversation ---- */

/* A turn: OPEN role MID content END AFTER; the answer's span is content END. */
typedef struct syntax {
    const char *open, *mid, *end, *after;
    int trim; /* the content stripped of white space at both ends (Jinja's trim, Python's str.strip) */
} syntax;
static const syntax CHATML_SYNTAX = {"<|im_start|>", "\n", "<|im_end|>", "\n", 0};
static const syntax LLAMA3_SYNTAX = {"<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "", 1};

/* Llama 3's system turn, always there: the knowledge cutoff and a date before the conversation's
 * own system message (none: empty). */
#define LLAMA3_CUTOFF "Cutting Knowledge Date: December 2023\nToday Date: "
#define LLAMA31_DATE "26 Jul 2024"

/* The templates known by their whole text. */
static const struct known {
    const char *name, *text;
    const syntax *syntax;
    const char *default_system; /* ChatML: the system turn a conversation without one gets (NULL: none) */
    int llama3_system;          /* Llama 3's system turn (above) */
    int today;                  /* its date: the day of rendering (strftime_now), not LLAMA31_DATE */
} KNOWN[] = {
    {"Qwen 2.5 Instruct", QWEN25, &CHATML_SYNTAX, QWEN_SYSTEM, 0, 0},
    {"Llama 3.1 Instruct", LLAMA31, &LLAMA3_SYNTAX, NULL, 1, 0},
    {"Llama 3.2 Instruct", LLAMA32, &LLAMA3_SYNTAX, NULL, 1, 1},
};

struct dt_chat {
    const char *name;
    const syntax *syntax;
    char *default_system; /* NULL: none */
    int llama3_system, today;
    int needs_message; /* the template reads messages[0]: no messages fails in Jinja */
    char *bos, *eos;   /* bos: NULL when tokenizer_config.json has none (Jinja renders it empty) */
};

static int has_suffix(const char *s, size_t n, const char *suffix) {
    const size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* The template recognised: 0 (c filled), -1 not one dtrain renders. */
static int recognise(const char *t, dt_chat *c) {
    c->syntax = &CHATML_SYNTAX;
    c->name = "ChatML";
    if (strcmp(t, CHATML) == 0) return 0;
    for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN; i++) {
        const struct known *k = &KNOWN[i];
        if (strcmp(t, k->text) != 0) continue;
        *c = (dt_chat){.name = k->name, .syntax = k->syntax, .llama3_system = k->llama3_system, .today = k->today,
                       .needs_message = 1};
        if (!k->default_system) return 0;
        c->default_system = strdup(k->default_system);
        return c->default_system ? 0 : -1;
    }
    const size_t n = strlen(t), h = strlen(DEFSYS_HEAD);
    if (n < h || memcmp(t, DEFSYS_HEAD, h) != 0 || !has_suffix(t, n, DEFSYS_TAIL)) return -1;
    const size_t len = n - h - strlen(DEFSYS_TAIL);
    for (size_t i = 0; i < len; i++) /* a plain string literal: no quote, escape or template syntax */
        if (strchr("'\\{}%", t[h + i])) return -1;
    c->name = "ChatML with a default system prompt";
    c->default_system = strndup(t + h, len);
    return c->default_system ? 0 : -1;
}

dt_status dt_chat_open(const char *dir, dt_chat **out) {
    *out = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (access(path, F_OK) != 0)
        return dt_error_set(DT_ERR_DATA, "%s: no such file: a chat model's tokenizer_config.json holds its chat_template "
                            "(hint: generate: leave out --chat and give the prompt as the model expects it; chat data: "
                            "put the model's tokenizer_config.json beside its tokenizer.json)", path);
    dt_hf_tokens t;
    void *held;
    DT_TRY(dt_hf_read_tokens(dir, &t, &held));
    dt_status st = DT_OK;
    dt_chat *c = calloc(1, sizeof *c);
    if (!c) st = dt_error_set(DT_ERR_NOMEM, "out of memory");
    else if (!t.chat_template)
        st = dt_error_set(DT_ERR_DATA, "%s: chat_template: missing (not a chat model's tokenizer, or a template in a "
                          "file of its own) (hint: generate: leave out --chat and give the prompt as the model expects it; "
                          "chat data: data.format completion takes prompts rendered already)", path);
    else if (!t.eos)
        st = dt_error_set(DT_ERR_DATA, "%s: eos_token: missing: generation would not know where the answer ends", path);
    else if (recognise(t.chat_template, c) != 0)
        st = dt_error_set(DT_ERR_DATA, "%s: chat_template: not a template dtrain renders exactly (it knows ChatML, with "
                          "or without a default system prompt, as SmolLM2's, and Qwen 2.5 Instruct's and Llama 3.1 (3.3) "
                          "and 3.2 Instruct's, as their tokenizer_config.json hold them); refusing rather than "
                          "approximating it (hint: generate: leave out --chat and give the prompt as the template would "
                          "render it; chat data: render the conversations yourself into data.format completion "
                          "lines)", path);
    else if (!(c->eos = strdup(t.eos)) || (t.bos && !(c->bos = strdup(t.bos))))
        st = dt_error_set(DT_ERR_NOMEM, "out of memory");
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
    free(c->bos);
    free(c->eos);
    free(c);
}

const char *dt_chat_name(const dt_chat *c) { return c->name; }
const char *dt_chat_eos(const dt_chat *c) { return c->eos; }

/* The UTF-8 character of n bytes at s is white space as Python's str.isspace has it (Jinja's trim
 * is str.strip): 1, else 0. */
static int space(const unsigned char *s, size_t n) {
    if (n == 1) return (s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20);
    if (n == 2) return s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0);
    if ((s[0] & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
    const unsigned cp = (unsigned)(s[0] & 0x0f) << 12 | (unsigned)(s[1] & 0x3f) << 6 | (s[2] & 0x3fu);
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* The length of the white-space character that starts (front) or ends s[0, n); 0: none. */
static size_t space_len(const unsigned char *s, size_t n, int front) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (space(front ? s : s + n - k, k)) return k;
    return 0;
}

/* content without the white space at its ends: [*start, *end) */
static void trim(const char *content, size_t *start, size_t *end) {
    const unsigned char *s = (const unsigned char *)content;
    size_t a = 0, b = strlen(content), k;
    while (a < b && (k = space_len(s + a, b - a, 1))) a += k;
    while (a < b && (k = space_len(s + a, b - a, 0))) b -= k;
    *start = a;
    *end = b;
}

/* Appends a turn; an assistant's adds its answer's span (content and end-of-turn token) to spans
 * when given. */
static void turn(FILE *f, const syntax *x, const char *role, const char *content, size_t *spans, int *n_spans) {
    size_t a = 0, b = strlen(content);
    if (x->trim) trim(content, &a, &b);
    fprintf(f, "%s%s%s", x->open, role, x->mid);
    const long start = ftell(f);
    fwrite(content + a, 1, b - a, f);
    fputs(x->end, f);
    if (spans && strcmp(role, "assistant") == 0) {
        spans[2 * *n_spans] = (size_t)start;
        spans[2 * *n_spans + 1] = (size_t)ftell(f);
        ++*n_spans;
    }
    fputs(x->after, f);
}

/* Llama 3's system turn with msg's content (NULL: none); the date today's as strftime_now("%d %b %Y")
 * gives it (local time, English month names), or 3.1's fixed one. */
static void llama3_system(FILE *f, const dt_chat *c, const dt_chat_msg *msg) {
    static const char *const MONTHS[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    char date[32] = LLAMA31_DATE;
    const time_t now = time(NULL);
    struct tm tm;
    if (c->today && localtime_r(&now, &tm))
        snprintf(date, sizeof date, "%02d %s %04d", tm.tm_mday, MONTHS[tm.tm_mon], tm.tm_year + 1900);
    fputs(c->bos ? c->bos : "", f);
    fprintf(f, "%ssystem%s" LLAMA3_CUTOFF "%s\n\n", c->syntax->open, c->syntax->mid, date);
    size_t a = 0, b = 0;
    if (msg) trim(msg->content, &a, &b);
    fwrite(msg ? msg->content + a : "", 1, b - a, f);
    fputs(c->syntax->end, f);
}

static dt_status render(const dt_chat *c, const dt_chat_msg *msgs, int n, int add_generation_prompt, char **out,
                        size_t *spans, int *n_spans) {
    *out = NULL;
    if (n == 0 && c->needs_message)
        return dt_error_set(DT_ERR_DATA, "chat template %s: no messages to render (it reads the first one)", c->name);
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant"))
            return dt_error_set(DT_ERR_DATA, "chat template %s: message %d's role \"%.40s\": dtrain renders system, "
                                "user and assistant messages only", c->name, i, msgs[i].role);
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    if (!f) return dt_error_set(DT_ERR_NOMEM, "out of memory rendering the chat template");
    const int system_first = n > 0 && strcmp(msgs[0].role, "system") == 0;
    int i = 0;
    if (c->llama3_system) llama3_system(f, c, system_first ? &msgs[i++] : NULL);
    else if (c->default_system && n > 0 && !system_first) turn(f, c->syntax, "system", c->default_system, NULL, NULL);
    for (; i < n; i++) turn(f, c->syntax, msgs[i].role, msgs[i].content, spans, n_spans);
    if (add_generation_prompt) fprintf(f, "%sassistant%s", c->syntax->open, c->syntax->mid);
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
