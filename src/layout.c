/* layout.c: building and validating a layout through the API: storages, views and every
 * per-field rule of regions.md "View fields". Knows nothing of regions or of files. */
#include "layout.h"

#include "error.h"
#include "text.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INT63_MAX ((uint64_t)INT64_MAX)

static const char *const view_kind_names[] = {
    [KVX_VIEW_KIND_ATTN] = "attn",       [KVX_VIEW_KIND_SWA] = "swa",
    [KVX_VIEW_KIND_MLA] = "mla",         [KVX_VIEW_KIND_SWA_MLA] = "swa_mla",
    [KVX_VIEW_KIND_SCRATCH] = "scratch", [KVX_VIEW_KIND_MAMBA] = "mamba",
    [KVX_VIEW_KIND_PLE] = "ple",
};

static const char *const mem_type_names[] = {
    [KVX_MEM_DRAM] = "dram",
    [KVX_MEM_VRAM] = "vram",
};

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

const char *kvx_view_kind_str(kvx_view_kind_t kind)
{
    return (unsigned)kind < ARRAY_SIZE(view_kind_names) ? view_kind_names[kind] : NULL;
}

const char *kvx_mem_type_str(kvx_mem_type_t mem)
{
    return (unsigned)mem < ARRAY_SIZE(mem_type_names) ? mem_type_names[mem] : NULL;
}

bool layout_view_kind_parse(const char *text, kvx_view_kind_t *kind_p)
{
    for (size_t i = 0; i < ARRAY_SIZE(view_kind_names); i++) {
        if (strcmp(text, view_kind_names[i]) == 0) {
            *kind_p = (kvx_view_kind_t)i;
            return true;
        }
    }
    return false;
}

bool layout_mem_type_parse(const char *text, kvx_mem_type_t *mem_p)
{
    for (size_t i = 0; i < ARRAY_SIZE(mem_type_names); i++) {
        if (strcmp(text, mem_type_names[i]) == 0) {
            *mem_p = (kvx_mem_type_t)i;
            return true;
        }
    }
    return false;
}

kvx_status_t kvx_layout_create(const kvx_layout_params_t *params, kvx_layout_t **layout_p)
{
    const uint64_t known = KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE | KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR |
                           KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS;
    uint64_t mask = params != NULL ? params->field_mask : 0;
    kvx_layout_t *layout;

    if (layout_p == NULL)
        return error_set(KVX_ERR_INVALID, "layout: no place for the result");
    if ((mask & ~known) != 0)
        return error_set(KVX_ERR_INVALID, "layout params: unknown field bits 0x%" PRIx64,
                         mask & ~known);
    if ((mask & KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE) &&
        (params->block_size < 1 || params->block_size > INT63_MAX))
        return error_set(KVX_ERR_INVALID, "block_size: %" PRIu64 " is not in 1..2^63-1",
                         params->block_size);

    layout = calloc(1, sizeof(*layout));
    if (layout == NULL)
        return error_no_memory("a layout");
    layout->block_size = (mask & KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE) ? params->block_size : 16;
    layout->csa_linear = (mask & KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR) && params->csa_linear;
    layout->whole_row_regions =
        (mask & KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS) && params->whole_row_regions;
    *layout_p = layout;
    return KVX_OK;
}

void kvx_layout_destroy(kvx_layout_t *layout)
{
    if (layout == NULL)
        return;
    for (size_t i = 0; i < layout->num_storages; i++)
        free(layout->storages[i].name);
    for (size_t i = 0; i < layout->num_views; i++)
        free(layout->views[i].name);
    model_free(&layout->model);
    free(layout->storages);
    free(layout->storage_by_name);
    free(layout->views);
    free(layout);
}

/* FNV-1a: storage names are short and few; any spread is enough. */
static size_t name_hash(const char *name)
{
    uint64_t h = 14695981039346656037u;

    for (; *name != '\0'; name++)
        h = (h ^ (unsigned char)*name) * 1099511628211u;
    return (size_t)h;
}

long layout_storage_find(const kvx_layout_t *layout, const char *name)
{
    size_t mask = layout->storage_hash_size - 1;

    if (layout->storage_hash_size == 0)
        return -1;
    for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
        uint32_t slot = layout->storage_by_name[i];
        if (slot == 0)
            return -1;
        if (strcmp(layout->storages[slot - 1].name, name) == 0)
            return (long)slot - 1;
    }
}

static void storage_hash_insert(uint32_t *table, size_t size, const char *name, uint32_t index)
{
    size_t i;

    for (i = name_hash(name) & (size - 1); table[i] != 0; i = (i + 1) & (size - 1))
        ;
    table[i] = index + 1;
}

/* Makes room for one more storage, growing the array and rebuilding the name hash so it
 * stays at most half full. On failure the layout is unchanged. */
static kvx_status_t layout_reserve_storage(kvx_layout_t *layout)
{
    size_t max = layout->max_storages == 0 ? 8 : layout->max_storages * 2;
    struct storage *storages;
    uint32_t *hash;

    if (layout->num_storages < layout->max_storages)
        return KVX_OK;
    storages = realloc(layout->storages, max * sizeof(*storages));
    if (storages == NULL)
        return error_no_memory("storages");
    layout->storages = storages;
    hash             = calloc(max * 2, sizeof(*hash));
    if (hash == NULL)
        return error_no_memory("the storage name index");
    for (size_t i = 0; i < layout->num_storages; i++)
        storage_hash_insert(hash, max * 2, storages[i].name, (uint32_t)i);
    free(layout->storage_by_name);
    layout->storage_by_name   = hash;
    layout->storage_hash_size = max * 2;
    layout->max_storages      = max;
    return KVX_OK;
}

/* The error for field `field` (a path such as "views[3].name") whose `len` bytes at `text`
 * hold an unprintable byte at offset `bad` (text_find_unprintable). Names reach terminals,
 * logs and --json output, where an escape sequence or a broken character would do harm, so
 * the message quotes the value escaped. */
static kvx_status_t unprintable_fail(const char *field, const char *text, size_t len, size_t bad,
                                     const char *why)
{
    char quoted[TEXT_ESCAPED_MAX];

    text_escape(quoted, sizeof(quoted), text, len);
    return error_set(KVX_ERR_INVALID, "%s: byte %zu (0x%02x) is %s, in \"%s\"", field, bad,
                     (unsigned char)text[bad], why, quoted);
}

/* Checks a name field: present, non-empty, at most KVX_MAX_NAME_LEN bytes, printable UTF-8. */
static kvx_status_t check_name(const char *what, size_t index, const char *name)
{
    char field[40]; /* "storages[<20 digits>].name" */
    const char *why;
    size_t len;
    size_t bad;

    if (name == NULL)
        return error_set(KVX_ERR_INVALID, "%s[%zu].name: missing", what, index);
    len = strlen(name);
    if (len == 0)
        return error_set(KVX_ERR_INVALID, "%s[%zu].name: is empty", what, index);
    if (len > KVX_MAX_NAME_LEN)
        return error_set(KVX_ERR_INVALID, "%s[%zu].name: %zu bytes is longer than %d", what, index,
                         len, KVX_MAX_NAME_LEN);
    bad = text_find_unprintable(name, len, &why);
    if (bad == len)
        return KVX_OK;
    snprintf(field, sizeof(field), "%s[%zu].name", what, index);
    return unprintable_fail(field, name, len, bad, why);
}

kvx_mem_type_t kvx_layout_storage_mem(const kvx_layout_t *layout, size_t index)
{
    return layout != NULL && index < layout->num_storages ? layout->storages[index].mem
                                                          : KVX_MEM_DRAM;
}

kvx_status_t kvx_layout_set_storage_mem(kvx_layout_t *layout, size_t index, kvx_mem_type_t mem,
                                        int64_t device)
{
    if (layout == NULL || index >= layout->num_storages)
        return error_set(KVX_ERR_INVALID, "set storage memory: no storage %zu", index);
    if (kvx_mem_type_str(mem) == NULL)
        return error_set(KVX_ERR_INVALID, "storages[%zu].mem: %d is not a memory type", index,
                         (int)mem);
    if (device < 0)
        return error_set(KVX_ERR_INVALID, "storages[%zu].device: %" PRId64 " is negative", index,
                         device);
    layout->storages[index].mem    = mem;
    layout->storages[index].device = device;
    return KVX_OK;
}

kvx_status_t kvx_layout_add_storage(kvx_layout_t *layout, const kvx_storage_params_t *params)
{
    const uint64_t known = KVX_STORAGE_PARAM_FIELD_MEM | KVX_STORAGE_PARAM_FIELD_DEVICE;
    size_t i;
    struct storage s;
    kvx_status_t status;

    if (layout == NULL || params == NULL)
        return error_set(KVX_ERR_INVALID, "add storage: layout and params are required");
    i = layout->num_storages;
    if ((params->field_mask & ~known) != 0)
        return error_set(KVX_ERR_INVALID, "storages[%zu]: unknown field bits 0x%" PRIx64, i,
                         params->field_mask & ~known);
    if (i >= KVX_MAX_STORAGES)
        return error_set(KVX_ERR_INVALID, "storages[%zu]: more than %d storages", i,
                         KVX_MAX_STORAGES);
    status = check_name("storages", i, params->name);
    if (status != KVX_OK)
        return status;
    if (layout_storage_find(layout, params->name) >= 0)
        return error_set(KVX_ERR_INVALID, "storages[%zu].name: \"%s\" is already a storage", i,
                         params->name);
    if (params->size < 1 || params->size > INT63_MAX)
        return error_set(KVX_ERR_INVALID, "storages[%zu].size: %" PRIu64 " is not in 1..2^63-1", i,
                         params->size);

    s.size   = params->size;
    s.mem    = KVX_MEM_DRAM;
    s.device = 0;
    if (params->field_mask & KVX_STORAGE_PARAM_FIELD_MEM) {
        if (kvx_mem_type_str(params->mem) == NULL)
            return error_set(KVX_ERR_INVALID, "storages[%zu].mem: %d is not a memory type", i,
                             (int)params->mem);
        s.mem = params->mem;
    }
    if (params->field_mask & KVX_STORAGE_PARAM_FIELD_DEVICE) {
        if (params->device < 0)
            return error_set(KVX_ERR_INVALID, "storages[%zu].device: %" PRId64 " is negative", i,
                             params->device);
        s.device = params->device;
    }
    status = layout_reserve_storage(layout);
    if (status != KVX_OK)
        return status;
    s.name = strdup(params->name);
    if (s.name == NULL)
        return error_no_memory("a storage name");
    layout->storages[i] = s;
    storage_hash_insert(layout->storage_by_name, layout->storage_hash_size, s.name, (uint32_t)i);
    layout->num_storages++;
    return KVX_OK;
}

/* Checks one 63-bit field of views[i]. */
static kvx_status_t check_view_u63(size_t i, const char *field, uint64_t value, uint64_t min)
{
    if (value > INT63_MAX)
        return error_set(KVX_ERR_INVALID, "views[%zu].%s: %" PRIu64 " does not fit in 63 bits", i,
                         field, value);
    if (value < min)
        return error_set(KVX_ERR_INVALID, "views[%zu].%s: %" PRIu64 " is less than %" PRIu64, i,
                         field, value, min);
    return KVX_OK;
}

/* Every per-view rule of regions.md "View fields", in the order of the table there, so the
 * first broken rule is the one reported. */
static kvx_status_t view_check(const kvx_layout_t *layout, size_t i, const kvx_view_params_t *p,
                               struct view *v)
{
    const uint64_t known = KVX_VIEW_PARAM_FIELD_GROUP | KVX_VIEW_PARAM_FIELD_OFFSET |
                           KVX_VIEW_PARAM_FIELD_DENSE | KVX_VIEW_PARAM_FIELD_HEADS;
    const struct storage *s;
    uint64_t end; /* offset + (num_blocks - 1) * stride + page */
    long storage;
    kvx_status_t status;

    if ((p->field_mask & ~known) != 0)
        return error_set(KVX_ERR_INVALID, "views[%zu]: unknown field bits 0x%" PRIx64, i,
                         p->field_mask & ~known);
    status = check_name("views", i, p->name);
    if (status != KVX_OK)
        return status;
    if (kvx_view_kind_str(p->kind) == NULL)
        return error_set(KVX_ERR_INVALID, "views[%zu].kind: %d is not a view kind", i,
                         (int)p->kind);
    if (p->storage == NULL)
        return error_set(KVX_ERR_INVALID, "views[%zu].storage: missing", i);
    storage = layout_storage_find(layout, p->storage);
    if (storage < 0) {
        char quoted[TEXT_ESCAPED_MAX]; /* any bytes: a name that breaks the rules is no storage */

        text_escape(quoted, sizeof(quoted), p->storage, strlen(p->storage));
        return error_set(KVX_ERR_INVALID, "views[%zu].storage: no storage named \"%s\"", i, quoted);
    }

    v->kind       = p->kind;
    v->storage    = (uint32_t)storage;
    v->page       = p->page;
    v->stride     = p->stride;
    v->num_blocks = p->num_blocks;
    v->group      = (p->field_mask & KVX_VIEW_PARAM_FIELD_GROUP) ? p->group : 0;
    v->offset     = (p->field_mask & KVX_VIEW_PARAM_FIELD_OFFSET) ? p->offset : 0;
    v->dense      = (p->field_mask & KVX_VIEW_PARAM_FIELD_DENSE) ? p->dense : true;
    v->heads      = (p->field_mask & KVX_VIEW_PARAM_FIELD_HEADS) ? p->heads : 1;

    if (v->group < 0)
        return error_set(KVX_ERR_INVALID, "views[%zu].group: %" PRId64 " is negative", i, v->group);
    if ((status = check_view_u63(i, "offset", v->offset, 0)) != KVX_OK ||
        (status = check_view_u63(i, "page", v->page, 1)) != KVX_OK ||
        (status = check_view_u63(i, "stride", v->stride, 1)) != KVX_OK ||
        (status = check_view_u63(i, "num_blocks", v->num_blocks, 1)) != KVX_OK ||
        (status = check_view_u63(i, "heads", v->heads, 1)) != KVX_OK)
        return status;
    if (v->stride < v->page)
        return error_set(KVX_ERR_INVALID,
                         "views[%zu].stride: %" PRIu64 " is smaller than page %" PRIu64, i,
                         v->stride, v->page);

    s = &layout->storages[storage];
    if (__builtin_mul_overflow(v->num_blocks - 1, v->stride, &end) ||
        __builtin_add_overflow(end, v->offset, &end) ||
        __builtin_add_overflow(end, v->page, &end) || end > INT63_MAX)
        return error_set(KVX_ERR_INVALID,
                         "views[%zu] (%s): offset + (num_blocks - 1) * stride"
                         " + page overflows 63 bits",
                         i, p->name);
    if (end > s->size)
        return error_set(KVX_ERR_INVALID,
                         "views[%zu] (%s): ends at byte %" PRIu64 ", beyond storage %s of %" PRIu64
                         " bytes",
                         i, p->name, end, s->name, s->size);
    return KVX_OK;
}

kvx_status_t kvx_layout_add_view(kvx_layout_t *layout, const kvx_view_params_t *params)
{
    struct view v;
    kvx_status_t status;
    size_t i;

    if (layout == NULL || params == NULL)
        return error_set(KVX_ERR_INVALID, "add view: layout and params are required");
    i = layout->num_views;
    if (i >= KVX_MAX_VIEWS)
        return error_set(KVX_ERR_INVALID, "views[%zu]: more than %d views", i, KVX_MAX_VIEWS);
    status = view_check(layout, i, params, &v);
    if (status != KVX_OK)
        return status;
    if (i == layout->max_views) {
        size_t max         = i == 0 ? 16 : i * 2;
        struct view *views = realloc(layout->views, max * sizeof(*views));
        if (views == NULL)
            return error_no_memory("views");
        layout->views     = views;
        layout->max_views = max;
    }
    v.name = strdup(params->name);
    if (v.name == NULL)
        return error_no_memory("a view name");
    layout->views[i] = v;
    layout->num_views++;
    return KVX_OK;
}

kvx_status_t kvx_layout_validate(const kvx_layout_t *layout)
{
    if (layout == NULL)
        return error_set(KVX_ERR_INVALID, "layout: none given");
    if (layout->num_storages == 0)
        return error_set(KVX_ERR_INVALID, "storages: the layout has none");
    if (layout->num_views == 0)
        return error_set(KVX_ERR_INVALID, "views: the layout has none");
    return KVX_OK;
}

uint64_t kvx_layout_block_size(const kvx_layout_t *layout)
{
    return layout->block_size;
}

size_t kvx_layout_num_storages(const kvx_layout_t *layout)
{
    return layout->num_storages;
}

uint64_t kvx_layout_storage_size(const kvx_layout_t *layout, size_t index)
{
    return index < layout->num_storages ? layout->storages[index].size : 0;
}

size_t kvx_layout_num_views(const kvx_layout_t *layout)
{
    return layout->num_views;
}

/* Copies `text` (NULL as "") to *p and advances *p past its terminator. */
static const char *strings_append(char **p, const char *text)
{
    size_t len  = text != NULL ? strlen(text) : 0;
    char *start = *p;

    memcpy(start, text != NULL ? text : "", len);
    start[len] = '\0';
    *p += len + 1;
    return start;
}

kvx_status_t model_copy(const kvx_model_t *in, struct model *out)
{
    const char *fields[] = {in->id, in->revision, in->dtype, in->cache_dtype, in->backend};
    const char *names[]  = {"id", "revision", "dtype", "cache_dtype", "backend"};
    struct model copy    = {.public = *in};
    size_t size          = 0;
    char *p;

    if (in->id == NULL || in->id[0] == '\0')
        return error_set(KVX_ERR_INVALID, "model.id: missing (required)");
    for (size_t i = 0; i < 5; i++) {
        size_t len = fields[i] != NULL ? strlen(fields[i]) : 0;
        char field[24]; /* "model.cache_dtype" */
        const char *why;
        size_t bad;

        if (len > KVX_MAX_NAME_LEN)
            return error_set(KVX_ERR_INVALID, "model.%s: %zu bytes is longer than %d", names[i],
                             len, KVX_MAX_NAME_LEN);
        bad = len > 0 ? text_find_unprintable(fields[i], len, &why) : 0;
        if (bad < len) {
            snprintf(field, sizeof(field), "model.%s", names[i]);
            return unprintable_fail(field, fields[i], len, bad, why);
        }
        size += len + 1;
    }
    copy.strings = malloc(size);
    if (copy.strings == NULL)
        return error_no_memory("the model identity");
    p                       = copy.strings;
    copy.public.id          = strings_append(&p, in->id);
    copy.public.revision    = strings_append(&p, in->revision);
    copy.public.dtype       = strings_append(&p, in->dtype);
    copy.public.cache_dtype = strings_append(&p, in->cache_dtype);
    copy.public.backend     = strings_append(&p, in->backend);
    *out                    = copy;
    return KVX_OK;
}

void model_free(struct model *model)
{
    free(model->strings);
    model->strings = NULL;
}

kvx_status_t kvx_layout_set_model(kvx_layout_t *layout, const kvx_model_t *model)
{
    struct model copy;
    kvx_status_t status;

    if (layout == NULL || model == NULL)
        return error_set(KVX_ERR_INVALID, "set model: layout and model are required");
    status = model_copy(model, &copy);
    if (status != KVX_OK)
        return status;
    model_free(&layout->model);
    layout->model     = copy;
    layout->has_model = true;
    return KVX_OK;
}
