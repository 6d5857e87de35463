/* chat.h — a chat model's conversation as its prompt: the chat template of the model's
 * tokenizer_config.json, rendered for the templates dtrain recognises exactly, and the
 * end-of-turn token generation stops at.
 *
 * dtrain has no Jinja engine: it renders a template only when the template's text is one it
 * knows to the byte, and refuses any other by name rather than approximate it. It knows
 * - ChatML, as Hugging Face writes it, with or without a default system prompt (SmolLM2's);
 * - Qwen 2.5 Instruct's (Qwen/Qwen2.5-*-Instruct): ChatML with Qwen's default system message;
 * - Llama 3.1 Instruct's (Llama 3.3 70B Instruct's is believed the same text; if it differs, it is
 *   refused) and Llama 3.2 Instruct's (1B, 3B; not the Vision models'): the tokenizer_config.json's
 *   bos_token, a system turn of "Cutting Knowledge Date: December 2023", "Today Date: D" and the
 *   conversation's system message, then the other messages, each one's content trimmed of white
 *   space as Jinja's trim does. D is 3.1's fixed "26 Jul 2024"; 3.2's is the day of rendering, as
 *   transformers renders it (its strftime_now("%d %b %Y"), local time: "05 Mar 2026"), so the
 *   same conversation renders differently on another day;
 * each as the model's tokenizer_config.json holds it (the text of its .jinja file, ending in a
 * newline). Only the branches of conversations without tools are rendered: the messages' roles
 * must be system, user or assistant. */
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

/* The template's name ("ChatML", "Qwen 2.5 Instruct", "Llama 3.2 Instruct") and the
 * tokenizer_config.json's eos_token, where generation stops ("<|im_end|>", "<|eot_id|>"). */
const char *dt_chat_name(const dt_chat *c);
const char *dt_chat_eos(const dt_chat *c);

/* The n messages as the template renders them, followed by the assistant's turn opening when
 * add_generation_prompt (apply_chat_template's same-named argument): a malloc'ed string in *out.
 * DT_ERR_DATA naming the template: a role other than system, user or assistant; no messages for
 * a template that reads the first (Qwen's, Llama's: transformers refuses them too). */
dt_status dt_chat_render(const dt_chat *c, const dt_chat_msg *msgs, int n, int add_generation_prompt, char **out);
/* The same without the generation prompt, for training on a conversation: *n_spans receives
 * how many of the messages are the assistant's, and spans (2 per message, room for 2 * n) the
 * bytes of each one's answer in *out, [start, end): its content as rendered (Llama's: trimmed)
 * and the end-of-turn token after it (<|im_end|>, <|eot_id|>; TRL's assistant-only loss counts
 * that token too). */
dt_status dt_chat_render_answers(const dt_chat *c, const dt_chat_msg *msgs, int n, char **out, size_t *spans,
                                 int *n_spans);

#endif
