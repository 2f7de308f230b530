/* post.h — internal to the library: the JSON-level pieces of post-training behind include/k3c.h's "post-training"
 * section (trajectory masks from rendered segments, the JSON-schema subset). Spec: docs/POST.md, TRAINING.md §3, §5. */
#ifndef K3C_POST_POST_H
#define K3C_POST_POST_H

#include "k3c.h"
#include "base/json.h"
#include "tok/xtml.h"

/* Per-segment loss mask of a rendered conversation (TRAINING.md §5.3): 1 on what the model writes — an assistant
 * message after its generation prefix (XTML: `<|open|>message role="assistant" ...<|sep|>` and the first channel's
 * `<|open|>think|response<|sep|>`; K2: `<|im_assistant|>name<|im_middle|>`) through its closing `<|end_of_msg|>` /
 * `<|im_end|>`; 0 on everything else. Only markup segments drive the state, so text a user typed never opens a
 * message. mask receives p->nseg bytes. */
void k3c_traj_segment_mask(const k3c_chat_prompt *p, k3c_chat_format fmt, uint8_t *mask);

/* Validates one conversation object {"messages", "tools"?, "options"?, "id"?, "meta"?} and renders + tokenizes it
 * (no generation prompt) into ids and a per-token mask. Errors name the field ("messages[2].tool_calls[0]...") and the
 * reason; nothing is kept on failure. */
int k3c_traj_from_json(const k3c_json *obj, const k3c_tok *tok, const k3c_traj_opts *o, k3c_traj *out, k3c_err *err);

/* The JSON-schema subset tool arguments are checked against: type (string, number, integer, boolean, null, object,
 * array, or a list of them), required, properties, additionalProperties (false), enum, items. Anything else in the
 * schema is ignored. On mismatch: K3C_EINVAL with the JSON path ("$.units: expected one of [\"c\",\"f\"]"). */
int k3c_json_schema_check(const k3c_json *schema, const k3c_json *v, k3c_err *err);

/* Format validity of an already parsed output (components "xtml", "tool_args"); 1 when fully valid. */
int k3c_verify_format_parsed(const k3c_chat_result *res, const k3c_json *tools, k3c_reward *out);

#endif
