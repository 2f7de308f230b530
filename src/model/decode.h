/* decode.h — a decode step of the model: the forward over a batch of sequence segments, each read against and
 * advancing its decode state, run by the same layer code and layer walk as a training forward (model/layer_*.c,
 * forward.c) in their decode mode, over buffers planned once for the largest step. Float32 weights as stored.
 * Spec: docs/ENGINE.md "The step", docs/MODEL.md §3.1, §4.2 (absorbed form), §5.3, §6.2 + §9.2. */
#ifndef K3C_MODEL_DECODE_H
#define K3C_MODEL_DECODE_H

#include "model/weights.h"
#include "ops/decode.h"

typedef struct k3c_decode_step k3c_decode_step;

/* Where a step's inputs and its logits live (the weights' backend memory, fixed addresses: a backend may capture a
 * step once and replay it): ids [max_rows], the segment of every row [max_rows], the segment table [max_rows], image
 * rows [max_rows, hidden] and logits [max_out, vocab]. */
typedef struct {
    int32_t *tok, *row_seg;
    k3c_dec_seg *segs;
    float *img, *logits;
} k3c_decode_inputs;

/* The step's buffers in w->be's memory for up to max_rows rows and logits of up to max_out rows (nothing for a
 * backward); the engine's ops are the backend's (ops/decode.h). */
int k3c_decode_step_init(const k3c_weights *w, int64_t max_rows, int64_t max_out, k3c_decode_step **out,
                         k3c_err *err);
void k3c_decode_step_free(k3c_decode_step *s);
const k3c_decode_inputs *k3c_decode_step_inputs(const k3c_decode_step *s);
/* The state layout the step reads (k3c_dec_dims) and the decode ops of its backend. */
const k3c_dec_dims *k3c_decode_step_dims(const k3c_decode_step *s);
const k3c_dec_ops *k3c_decode_step_ops(const k3c_decode_step *s);

/* One step over b (its n rows: the first n ids of inputs->tok): the embeddings (rows img_row[0..n_img) replaced by
 * inputs->img's rows in that order), every layer, and the logits of out_rows[0..n_out) (NULL: every row) into
 * inputs->logits (n_out 0: none). Reads per step only what sits at the inputs' fixed addresses, b, img_row and
 * out_rows. */
int k3c_decode_step_run(k3c_decode_step *s, const k3c_dec_batch *b, const int64_t *img_row, int64_t n_img,
                        const int64_t *out_rows, int64_t n_out, k3c_err *err);

#endif
