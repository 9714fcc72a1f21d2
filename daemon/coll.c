/* The registry of collective algorithms and the fingerprint of an op's
 * descriptor: what job.c looks up, above every algorithm (coll.h). */
#include "coll.h"

#include "hash.h"
#include "ops.h"

static const struct obd_algo *const algos[] = {
    &obd_algo_allreduce,      &obd_algo_reduce_scatter,
    &obd_algo_allgather,      &obd_algo_broadcast,
    &obd_algo_barrier,        &obd_algo_onebit,
    &obd_algo_onebit_reset,   &obd_algo_onebit_snapshot,
    &obd_algo_onebit_restore, &obd_algo_onebit_export,
};

const struct obd_algo *obd_coll_algo(uint32_t kind)
{
    for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++)
        if (algos[i]->kind == kind)
            return algos[i];
    return NULL;
}

uint64_t obd_coll_fingerprint(const struct obd_opdesc *d)
{
    uint64_t v[6] = {d->kind,  d->dtype, d->redop,
                     d->count, d->key,   (uint64_t)(int64_t)d->root};
    uint64_t h = OBCOMM_HASH_FNV1A_INIT;
    for (int i = 0; i < 6; i++)
        h = obcomm_hash_fnv1a_u64(h, v[i]);
    return h;
}
