/* regions_json.c: a region table as spec formats.md's "kvx_plan": 1 document, laid out as
 * formats.md shows it: one region per line. Writes exact 64-bit integers and escapes names;
 * reads nothing. */
#include "regions.h"

#include "error.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing output buffer; `failed` sticks after the first allocation failure so callers
 * check once at the end. */
struct json_out {
    char *text;
    size_t len;
    size_t max;
    bool failed;
};

static void out_reserve(struct json_out *out, size_t extra)
{
    size_t max = out->max == 0 ? 4096 : out->max;
    char *text;

    if (out->failed || out->len + extra < out->max)
        return;
    while (max <= out->len + extra)
        max *= 2;
    text = realloc(out->text, max);
    if (text == NULL) {
        out->failed = true;
        return;
    }
    out->text = text;
    out->max  = max;
}

static void out_printf(struct json_out *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void out_printf(struct json_out *out, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    out_reserve(out, (size_t)n + 1);
    if (out->failed)
        return;
    va_start(ap, fmt);
    vsnprintf(out->text + out->len, out->max - out->len, fmt, ap);
    va_end(ap);
    out->len += (size_t)n;
}

/* A JSON string, as kvx_json_quote writes every one. */
static void out_string(struct json_out *out, const char *s)
{
    size_t len = kvx_json_quote(NULL, 0, s);

    out_reserve(out, len + 1);
    if (out->failed)
        return;
    kvx_json_quote(out->text + out->len, out->max - out->len, s);
    out->len += len;
}

static const char *bool_text(bool value)
{
    return value ? "true" : "false";
}

static void out_region(struct json_out *out, const kvx_regions_t *t, size_t index)
{
    const struct region *r = &t->regions[index];

    out_printf(out, "    {\"index\": %zu, \"name\": ", index);
    out_string(out, regions_region_name(t, r));
    out_printf(out, ", \"storage\": ");
    out_string(out, t->storage_names[r->storage]);
    out_printf(out,
               ", \"offset\": %" PRIu64 ", \"block_len\": %" PRIu64 ", \"stride\": %" PRIu64
               ", \"num_blocks\": %" PRIu64 ", \"group\": %" PRId64 ", \"mla\": %s"
               ", \"packed_row\": %s, \"scratch\": %s, \"ssm\": %s, \"ple\": %s"
               ", \"heads\": %" PRIu64 ", \"members\": [",
               r->offset, r->block_len, r->stride, r->num_blocks, r->group, bool_text(r->mla),
               bool_text(r->packed_row), bool_text(r->scratch), bool_text(r->ssm),
               bool_text(r->ple), r->heads);
    for (uint32_t m = 0; m < r->num_members; m++) {
        if (m > 0)
            out_printf(out, ", ");
        out_string(out, t->view_names[t->members[r->first_member + m]]);
    }
    out_printf(out, "]}");
}

/* One registration per storage that a region uses, in layout storage order (formats.md):
 * memory is registered whole, once, whatever the regions inside it. */
static void out_registrations(struct json_out *out, const kvx_regions_t *t)
{
    bool *used = calloc(t->num_storages, sizeof(*used));
    bool first = true;

    if (used == NULL) {
        out->failed = true;
        return;
    }
    for (size_t r = 0; r < t->num_regions; r++)
        used[t->regions[r].storage] = true;
    out_printf(out, "  \"registrations\": [");
    for (size_t s = 0; s < t->num_storages; s++) {
        if (!used[s])
            continue;
        out_printf(out, "%s\n    {\"storage\": ", first ? "" : ",");
        out_string(out, t->storage_names[s]);
        out_printf(out, ", \"offset\": 0, \"size\": %" PRIu64 "}", t->storage_sizes[s]);
        first = false;
    }
    out_printf(out, "\n  ]\n");
    free(used);
}

kvx_status_t kvx_regions_to_json(const kvx_regions_t *regions, char **json_p)
{
    struct json_out out = {0};

    out_printf(&out, "{\n  \"kvx_plan\": 1,\n  \"regions\": [");
    for (size_t r = 0; r < regions->num_regions; r++) {
        out_printf(&out, "%s\n", r > 0 ? "," : "");
        out_region(&out, regions, r);
    }
    out_printf(&out, "\n  ],\n  \"num_descriptors\": %" PRIu64 ",\n", regions->num_descriptors);
    out_registrations(&out, regions);
    out_printf(&out, "}");
    if (out.failed) {
        free(out.text);
        return error_no_memory("the region table's JSON");
    }
    *json_p = out.text;
    return KVX_OK;
}
