/* push_limits.c: the admission rule and the deadline of push jobs (push_limits.h). The rule
 * is a reserve plus a fair share, chosen over a cap alone because a cap that shrinks as peers
 * come cannot take back what early peers hold: four peers that took 64 jobs each filled all
 * 256 before a fifth arrived. Kept slots can never be taken by another writer, so the fifth
 * always starts one; the shared ones are split evenly among the writers pushing now. */
#include "push_limits.h"

#include "error.h"

#include <inttypes.h>

kvx_status_t push_limits_admit(const struct push_load *load)
{
    size_t shared; /* jobs taken beyond each busy writer's first */
    size_t fair;

    if (load->writer_jobs >= load->max_per_peer)
        return error_set(KVX_ERR_BUSY,
                         "push: this peer has %zu pushes in flight already (max_pushes %" PRIu32
                         ")",
                         load->writer_jobs, load->max_per_peer);
    if (load->busy > PUSH_MAX_WRITERS || load->jobs < load->busy ||
        (load->writer_jobs > 0 && load->busy == 0))
        return error_set(KVX_ERR_INTERNAL, "push: %zu jobs of %zu busy writers do not add up",
                         load->jobs, load->busy);
    if (load->writer_jobs == 0)
        return KVX_OK; /* its kept slot */
    shared = load->jobs - load->busy;
    if (shared >= PUSH_SHARED_JOBS)
        return error_set(KVX_ERR_BUSY,
                         "push: all %d shared pushes are in flight (%zu peers pushing); this "
                         "peer has %zu",
                         PUSH_SHARED_JOBS, load->busy, load->writer_jobs);
    fair = PUSH_SHARED_JOBS / load->busy;
    if (load->writer_jobs - 1 >= fair)
        return error_set(KVX_ERR_BUSY,
                         "push: this peer has %zu pushes in flight, its fair share while %zu "
                         "peers push",
                         load->writer_jobs, load->busy);
    return KVX_OK;
}

uint32_t push_limits_deadline(uint32_t asked_ms, uint32_t timeout_ms, uint32_t max_push_ms)
{
    uint32_t ms = asked_ms != 0 ? asked_ms : timeout_ms;

    return ms < max_push_ms ? ms : max_push_ms;
}
