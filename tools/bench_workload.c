/* bench_workload.c: `kvx bench --workload`, requests shaped like an engine's on the built-in
 * model layouts. Builds the layouts and the requests; bench.c times and prints them. */
#include "bench_workload.h"

#include "builtin_layouts.h"
#include "cli.h"

#include <cjson/cJSON.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_SEED 2026 /* block-id shuffle of the workload */

/* Loads built-in layout `b` with every view's num_blocks set to `blocks` and every storage's
 * size to size / num_blocks * blocks. Only a layout whose views all have one num_blocks and
 * whose storages are whole numbers of such rows rescales, as the built-in models do
 * (docs/models.md); kvx validates the result like any layout. Prints the error on failure. */
static kvx_status_t builtin_layout_rescale(const struct builtin_layout *b, uint64_t blocks,
                                           kvx_layout_t **layout_p)
{
    cJSON *root         = cJSON_ParseWithLength(b->json, b->size);
    double old_blocks   = 0; /* views[0].num_blocks, as every view's must be */
    kvx_status_t status = KVX_ERR_INVALID;
    size_t i            = 0;
    cJSON *item;
    char *text;

    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(root, "views"))
    {
        cJSON *num_blocks = cJSON_GetObjectItemCaseSensitive(item, "num_blocks");
        double value      = cJSON_GetNumberValue(num_blocks);

        old_blocks = i == 0 ? value : old_blocks;
        if (!(value >= 1) || value != old_blocks) {
            fprintf(stderr,
                    "kvx: error: --layouts: %s: views[%zu].num_blocks: %.0f is not views[0]'s %.0f;"
                    " only views of one num_blocks can be rescaled\n",
                    b->name, i, value, old_blocks);
            goto out;
        }
        cJSON_SetNumberValue(num_blocks, (double)blocks);
        i++;
    }
    if (i == 0) {
        fprintf(stderr, "kvx: error: --layouts: %s: no views to rescale\n", b->name);
        goto out;
    }
    i = 0;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(root, "storages"))
    {
        cJSON *size_item = cJSON_GetObjectItemCaseSensitive(item, "size");
        double value     = cJSON_GetNumberValue(size_item);
        bool is_whole    = value >= 0 && value < 0x1p53 && value == (double)(uint64_t)value;
        uint64_t size    = is_whole ? (uint64_t)value : 0;
        uint64_t row     = size / (uint64_t)old_blocks; /* bytes per block in this storage */
        uint64_t scaled;

        if (!is_whole || row * (uint64_t)old_blocks != size) {
            fprintf(stderr,
                    "kvx: error: --layouts: %s: storages[%zu].size: %.0f is not a multiple of"
                    " num_blocks %.0f, so it cannot be rescaled\n",
                    b->name, i, value, old_blocks);
            goto out;
        }
        if (__builtin_mul_overflow(row, blocks, &scaled) || scaled >= UINT64_C(1) << 53) {
            fprintf(stderr,
                    "kvx: error: --layouts: %s: storages[%zu].size: %" PRIu64 " blocks of %" PRIu64
                    " bytes are too many\n",
                    b->name, i, blocks, row);
            goto out;
        }
        cJSON_SetNumberValue(size_item, (double)scaled);
        i++;
    }
    text = cJSON_PrintUnformatted(root);
    if (text == NULL) {
        fprintf(stderr, "kvx: error: --layouts: %s: out of memory\n", b->name);
        status = KVX_ERR_NO_MEMORY;
        goto out;
    }
    status = kvx_layout_load_buffer(text, strlen(text), layout_p);
    cJSON_free(text);
    if (status != KVX_OK)
        cli_fail(status);

out:
    cJSON_Delete(root);
    return status;
}

kvx_status_t workload_layout_create(const struct bench_args *a, const char *name,
                                    kvx_layout_t **layout_p, uint64_t *capacity_p)
{
    for (size_t l = 0; l < num_builtin_layouts; l++) {
        const struct builtin_layout *b = &builtin_layouts[l];
        uint64_t capacity              = 0;
        uint64_t block_size; /* tokens */
        kvx_layout_t *layout;
        kvx_status_t status;

        if (strcmp(b->name, name) != 0)
            continue;
        /* Capacity: the largest request's blocks, so the largest request takes every block
         * (in shuffled order) and a Llama-8B 32k request needs 4 GiB per side, not 8. */
        status = builtin_layout_rescale(b, 1, &layout);
        if (status != KVX_OK)
            return status;
        block_size = kvx_layout_block_size(layout);
        kvx_layout_destroy(layout);
        for (size_t i = 0; i < a->num_sizes; i++) {
            uint64_t blocks = (a->sizes[i] + block_size - 1) / block_size;

            capacity = blocks > capacity ? blocks : capacity;
        }
        status = builtin_layout_rescale(b, capacity, layout_p);
        if (status == KVX_OK) {
            cli_layout_memory(*layout_p, a->memory, "bench");
            *capacity_p = capacity;
        }
        return status;
    }
    fprintf(stderr, "kvx: error: --layouts: no built-in layout %s (see kvx demo --tables)\n", name);
    return KVX_ERR_INVALID;
}

/* The workload on a connected client: one point per token count, `blocks` capacity. */
kvx_status_t workload_run(struct bench_client *c, struct bench_samples *s, uint64_t *ids,
                          const char *name, uint64_t capacity, bool header)
{
    const struct bench_args *a   = c->args;
    const kvx_regions_t *regions = kvx_agent_regions(c->agent);
    uint64_t block_size          = kvx_regions_block_size(regions);
    kvx_group_ids_t groups[BENCH_MAX_POINTS];
    size_t num_groups   = 1;
    unsigned rng        = BENCH_SEED;
    kvx_status_t status = KVX_OK;

    for (size_t r = 0; r < kvx_regions_count(regions); r++) {
        kvx_region_info_t info;

        kvx_regions_get(regions, r, &info);
        if (info.group >= 0 && (size_t)info.group + 1 > num_groups)
            num_groups = (size_t)info.group + 1;
    }
    if (num_groups > BENCH_MAX_POINTS)
        num_groups = BENCH_MAX_POINTS;
    for (size_t i = 0; status == KVX_OK && i < a->num_sizes; i++) {
        uint64_t blocks       = (a->sizes[i] + block_size - 1) / block_size;
        kvx_request_t request = {groups, num_groups, NULL, 0, NULL};

        /* Distinct ids in random order, as an engine's free list hands them out after a
         * while: neighbours rarely continue each other, so little coalesces. */
        for (uint64_t b = 0; b < capacity; b++)
            ids[b] = b;
        for (uint64_t b = 0; b < blocks; b++) {
            uint64_t j   = b + (uint64_t)rand_r(&rng) % (capacity - b);
            uint64_t tmp = ids[b];

            ids[b] = ids[j];
            ids[j] = tmp;
        }
        for (size_t g = 0; g < num_groups; g++)
            groups[g] = (kvx_group_ids_t){ids, blocks};
        /* one warm-up unless told: requests are large */
        status = bench_point_run(c, &request, c->args->warmups_given ? c->args->warmups : 1, s);
        if (status == KVX_OK && i == 0 && header)
            bench_header_print(c, "requests of shuffled block ids, the same ids in every group", 1);
        if (status == KVX_OK)
            bench_point_print(c, s, name, a->sizes[i], blocks);
    }
    return status;
}
