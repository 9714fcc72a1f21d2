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
    case OBD_ONEBIT_NORM:
        /* Whole blocks, so the sums do not depend on the split. */
        for (size_t b = t->begin; b < t->end; b += OBD_CODEC_BLOCK) {
            size_t e = min_sz(b + OBD_CODEC_BLOCK, t->end);
            x->wsums[b / OBD_CODEC_BLOCK] =
                x->ls == 1
                    ? impl->sumsq_block(x->dst[0], x->count, x->werr, b, e)
                    : impl->avg_sumsq_block((const float *const *)x->dst, x->ls,
                                            x->count, x->werr, b, e, x->b);
        }
        break;
    case OBD_ONEBIT_SIGNS:
        /* One trainer: its tensor is the average, so this pass reads it and
         * the error again instead of a stored sum (one tensor-sized write
         * fewer; bit-identical, see test_codec). Decoding cannot overwrite
         * a chunk before this pass is done with it: the chunk's result
         * needs this pass's bits first. */
        if (x->ls == 1)
            impl->compress_range(x->dst[0], x->count, x->werr, t->begin, t->end,
                                 t->scale, x->bits + t->begin / 8);
        else
            impl->sign_range(x->b, x->werr, t->begin, t->end, t->scale,
                             x->bits + t->begin / 8);
        break;
    case OBD_ONEBIT_SRV_NORM:
        for (size_t b = t->begin; b < t->end; b += OBD_CODEC_BLOCK) {
            size_t e = min_sz(b + OBD_CODEC_BLOCK, t->end);
            x->ssums[b / OBD_CODEC_BLOCK] =
                impl->server_sumsq_block(x->in, x->scales, x->n, x->serr, b, e);
        }
        break;
    case OBD_ONEBIT_SRV_SIGNS:
        impl->server_range(x->in, x->scales, x->n, x->serr, t->begin, t->end,
                           t->scale, x->out + (x->chunk_begin + t->begin) / 8);
        break;
    case OBD_ONEBIT_DECODE: {
        size_t end = min_sz(t->end, x->count);
        if (t->begin >= end)
            break;
        for (int i = 0; i < x->ls; i++)
            impl->decompress(x->out + t->begin / 8, t->scale,
                             x->dst[i] + t->begin, end - t->begin);
        break;
    }
    }
}
