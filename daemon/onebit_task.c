#include "onebit_task.h"

#include <string.h>

#include "reduce.h"

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* 1 if one of the n floats at p is a NaN, from the bits alone: with the
 * sign cleared, a NaN is above the bits of Inf (0x7f800000), and adding
 * 0x007fffff carries exactly those into bit 31. Eight lanes of OR make
 * gcc vectorise the loop at -O2 (a float comparison, or one lane, stays
 * scalar), so the scan costs about a read of the tensor. */
static int any_nan(const float *p, size_t n)
{
    uint32_t lane[8] = {0}, any = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            uint32_t u;
            memcpy(&u, &p[i + k], sizeof(u));
            lane[k] |= (u & 0x7fffffffu) + 0x007fffffu;
        }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], sizeof(u));
        any |= (u & 0x7fffffffu) + 0x007fffffu;
    }
    for (int k = 0; k < 8; k++)
        any |= lane[k];
    return (int)(any >> 31);
}

/* The AVERAGE pass over [begin, end). Its accumulator is one block, on
 * the worker's stack: the load and the store of a block stay in L1. */
static size_t average(const struct obd_onebit_ctx *x, size_t begin, size_t end)
{
    size_t written = 0;
    float acc[OBD_ONEBIT_AVG_BLOCK];
    for (size_t b = begin; b < end; b += OBD_ONEBIT_AVG_BLOCK) {
        size_t n = min_sz(OBD_ONEBIT_AVG_BLOCK, end - b);
        if (x->ls == 1) {
            /* Only a NaN changes (a signalling one comes out quiet), so
             * only a block that holds one is divided, by the run-time
             * divisor: a constant 1 the compiler would fold away. */
            if (any_nan(x->dst[0] + b, n)) {
                obd_reduce_div_in_place(OBCOMM_FLOAT32, x->dst[0] + b, n,
                                        x->ls);
                written += n * sizeof(float);
            }
            continue;
        }
        /* (s0 + s1) + s2 ..., then one division, stored into the first
         * buffer and copied from there: the kernels obd_reduce_load and
         * obd_reduce_store_many run over the whole tensor (a load's first
         * two sources, then one fold per further source), over blocks
         * that begin where theirs do (see the header). */
        const void *const pair[2] = {x->dst[0] + b, x->dst[1] + b};
        obd_reduce_load(OBCOMM_FLOAT32, OBCOMM_SUM, acc, pair, 2, n);
        for (int i = 2; i < x->ls; i++)
            obd_reduce_acc(OBCOMM_FLOAT32, OBCOMM_SUM, acc, x->dst[i] + b, n);
        obd_reduce_store(OBCOMM_FLOAT32, OBCOMM_AVG, x->dst[0] + b, acc, n,
                         x->ls);
        for (int i = 1; i < x->ls; i++)
            memcpy(x->dst[i] + b, x->dst[0] + b, n * sizeof(float));
        written += (size_t)x->ls * n * sizeof(float);
    }
    return written;
}

void obd_onebit_task_run(const struct obd_onebit_ctx *x,
                         struct obd_onebit_task *t)
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
    case OBD_ONEBIT_AVERAGE:
        t->written = average(x, t->begin, min_sz(t->end, x->count));
        break;
    }
}
