/* regions_json.c: a region table as spec formats.md's "kvx_plan": 1 document. Integers are
 * written as raw text so values above 2^53 stay exact; cJSON escapes the names. */
#include "regions.h"

#include "error.h"

#include <cjson/cJSON.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static bool add_int(cJSON *object, const char *key, int64_t value)
{
    char text[24];

    snprintf(text, sizeof(text), "%" PRId64, value);
    return cJSON_AddRawToObject(object, key, text) != NULL;
}

static bool add_uint(cJSON *object, const char *key, uint64_t value)
{
    char text[24];

    snprintf(text, sizeof(text), "%" PRIu64, value);
    return cJSON_AddRawToObject(object, key, text) != NULL;
}

static cJSON *region_to_json(const kvx_regions_t *t, size_t index)
{
    const struct region *r = &t->regions[index];
    cJSON *object          = cJSON_CreateObject();
    cJSON *members;
    bool ok;

    if (object == NULL)
        return NULL;
    ok = add_uint(object, "index", index) &&
         cJSON_AddStringToObject(object, "name", t->view_names[t->members[r->first_member]]) &&
         cJSON_AddStringToObject(object, "storage", t->storage_names[r->storage]) &&
         add_uint(object, "offset", r->offset) && add_uint(object, "block_len", r->block_len) &&
         add_uint(object, "stride", r->stride) && add_uint(object, "num_blocks", r->num_blocks) &&
         add_int(object, "group", r->group) && cJSON_AddBoolToObject(object, "mla", r->mla) &&
         cJSON_AddBoolToObject(object, "packed_row", r->packed_row) &&
         cJSON_AddBoolToObject(object, "scratch", r->scratch) &&
         cJSON_AddBoolToObject(object, "ssm", r->ssm) &&
         cJSON_AddBoolToObject(object, "ple", r->ple) && add_uint(object, "heads", r->heads) &&
         (members = cJSON_AddArrayToObject(object, "members")) != NULL;
    for (uint32_t m = 0; ok && m < r->num_members; m++) {
        cJSON *name = cJSON_CreateString(t->view_names[t->members[r->first_member + m]]);

        ok = name != NULL && cJSON_AddItemToArray(members, name);
    }
    if (!ok) {
        cJSON_Delete(object);
        return NULL;
    }
    return object;
}

/* One registration per storage that a region uses, in layout storage order (formats.md):
 * memory is registered whole, once, whatever the regions inside it. */
static bool add_registrations(const kvx_regions_t *t, cJSON *root)
{
    cJSON *array = cJSON_AddArrayToObject(root, "registrations");
    bool *used   = calloc(t->num_storages, sizeof(*used));
    bool ok      = array != NULL && used != NULL;

    for (size_t r = 0; ok && r < t->num_regions; r++)
        used[t->regions[r].storage] = true;
    for (size_t s = 0; ok && s < t->num_storages; s++) {
        cJSON *object;

        if (!used[s])
            continue;
        object = cJSON_CreateObject();
        ok     = object != NULL && cJSON_AddItemToArray(array, object);
        if (!ok) {
            cJSON_Delete(object);
            break;
        }
        ok = cJSON_AddStringToObject(object, "storage", t->storage_names[s]) != NULL &&
             add_uint(object, "offset", 0) && add_uint(object, "size", t->storage_sizes[s]);
    }
    free(used);
    return ok;
}

kvx_status_t kvx_regions_to_json(const kvx_regions_t *regions, char **json_p)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *array;
    char *text = NULL;
    bool ok;

    ok = root != NULL && add_uint(root, "kvx_plan", 1) &&
         (array = cJSON_AddArrayToObject(root, "regions")) != NULL;
    for (size_t r = 0; ok && r < regions->num_regions; r++) {
        cJSON *object = region_to_json(regions, r);

        ok = object != NULL && cJSON_AddItemToArray(array, object);
        if (!ok)
            cJSON_Delete(object);
    }
    ok = ok && add_uint(root, "num_descriptors", regions->num_descriptors) &&
         add_registrations(regions, root) && (text = cJSON_Print(root)) != NULL;
    cJSON_Delete(root);
    if (!ok)
        return error_no_memory("the region table's JSON");
    *json_p = text;
    return KVX_OK;
}
