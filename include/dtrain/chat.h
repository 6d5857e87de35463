/* chat.h — a chat model's conversation as its prompt: the chat template of the model's
 * tokenizer_config.json, rendered for the templates dtrain recognises exactly, and the
 * end-of-turn token generation stops at.
 *
 * dtrain has no Jinja engine: it renders a template only when the template's text is one it
 * knows to the byte (ChatML, as Hugging Face writes it, with or without a default system prompt
 * (SmolLM2's)), and refuses any other by name rather than approximate it. */
#ifndef DTRAIN_CHAT_H
#define DTRAIN_CHAT_H

#include <stddef.h>

#include "dtrain/status.h"

typedef struct dt_chat dt_chat;

typedef struct dt_chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content; /* UTF-8 */
} dt_chat_msg;

/* Reads DIR/tokenizer_config.json (its chat_template and eos_token). DT_ERR_DATA naming the file
 * and the key: no such file, no chat_template, a template dtrain does not render exactly.
 * dt_chat_free accepts NULL. */
dt_status dt_chat_open(const char *dir, dt_chat **out);
void dt_chat_free(dt_chat *c);

/* The template's name ("ChatML") and the end-of-turn token's text ("<|im_end|>"). */
const char *dt_chat_name(const dt_chat *c);
const char *dt_chat_eos(const dt_chat *c);

/* The n messages as the template renders them, followed by the assistant's turn opening when
 * add_generation_prompt (apply_chat_template's same-named argument): a malloc'ed string in *out. */
dt_status dt_chat_render(const dt_chat *c, const dt_chat_msg *msgs, int n, int add_generation_prompt, char **out);
/* The same without the generation prompt, for training on a conversation: *n_spans receives
 * how many of the messages are the assistant's, and spans (2 per message, room for 2 * n) the
 * bytes of each one's answer in *out, [start, end): its content and the end-of-turn token after
 * it (TRL's assistant-only loss counts that token too). */
dt_status dt_chat_render_answers(const dt_chat *c, const dt_chat_msg *msgs, int n, char **out, size_t *spans,
                                 int *n_spans);

#endif
