#include "onebit_task.h"

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

void obd_onebit_task_run(const struct obd_onebit_ctx *x,
                         const struct obd_onebit_task *t)
{
    const struct obd_codec_impl *impl = x->impl;
    switch (t->pass) {
    case OBD_ONEBIT_WORKER:
        /* Whole blocks, so the sums do not depend on the split. Decoding
         * cannot overwrite a trainer's buffer before this pass is done
         * with it: every chunk's result needs this pass's bits first. */
        for (size_t b = t->begin; b < t->end; b += OBD_CODEC_BLOCK) {
            size_t e = min_sz(b + OBD_CODEC_BLOCK, t->end);
            x->wsums[b / OBD_CODEC_BLOCK] = impl->lazy_worker_block(
                (const float *const *)x->dst, x->ls, x->count, &x->wprev,
                x->wnext, b, e, x->bits + b / 8);
        }
        break;
    case OBD_ONEBIT_SERVER:
        for (size_t b = t->begin; b < t->end; b += OBD_CODEC_BLOCK) {
            size_t e = min_sz(b + OBD_CODEC_BLOCK, t->end);
            x->ssums[b / OBD_CODEC_BLOCK] = impl->lazy_server_block(
                x->in, x->scales, x->n, &x->sprev, x->snext, b, e,
                x->out + (x->chunk_begin + b) / 8);
        }
        break;
    case OBD_ONEBIT_DECODE: {
        size_t end = min_sz(t->end, x->count);
        if (t->begin >= end)
            break;
        for (int i = 0; i < x->ls; i++)
            (x->stream ? impl->decompress_stream : impl->decompress)(
                x->out + t->begin / 8, t->scale, x->dst[i] + t->begin,
                end - t->begin);
        break;
    }
    }
}
