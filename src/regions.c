/* regions.c: the region table, from natural order to the coverage proof of spec/regions.md
 * steps 1-4. No I/O, no per-block allocation, no knowledge of transports. */
#include "regions.h"

#include "error.h"
#include "layout.h"
#include "natural_order.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define NO_REGION UINT32_MAX

/* What step 2 gives a view: its region spec inside its storage. */
struct spec {
    uint64_t offset; /* bytes: spec base inside the view's storage */
    uint64_t len;
    uint64_t stride;
    uint64_t num_blocks;
    bool whole_row;
};

/* One slot of the base index: regions sharing a base (storage, offset), in creation order,
 * chained through fold_state.next_same_base. */
struct base_slot {
    uint32_t storage;
    uint64_t offset;
    uint32_t first; /* NO_REGION marks an empty slot */
    uint32_t last;
};

/* Scratch state of one registration; allocated once, sized by the number of views. */
struct fold_state {
    const kvx_layout_t *layout;
    bool packed_storage;      /* regions.md step 2 */
    uint32_t *order;          /* view indices in step-1 order */
    uint32_t *region_of;      /* creation index of each view's region, by view index */
    struct region *created;   /* regions in creation order */
    uint32_t *next_same_base; /* by creation index */
    uint32_t *table_index;    /* table position of each created region */
    uint32_t *next_member;    /* per table region: the next free slot of its members */
    size_t num_created;
    struct base_slot *bases; /* open addressing, power-of-two size */
    size_t bases_size;
};

/* Step 1: natural order of names, input order among equal names. Names are turned into
 * natural-order keys once, so each comparison is a memcmp. */
struct order_entry {
    const unsigned char *key;
    size_t key_len;
    const char *name;
    uint32_t view;
};

static int order_entry_compare(const void *a, const void *b)
{
    const struct order_entry *ea = a;
    const struct order_entry *eb = b;
    size_t len                   = ea->key_len < eb->key_len ? ea->key_len : eb->key_len;
    int ret                      = memcmp(ea->key, eb->key, len);

    if (ret == 0 && ea->key_len != eb->key_len)
        ret = ea->key_len < eb->key_len ? -1 : 1;
    if (ret == 0)
        ret = strcmp(ea->name, eb->name); /* equal keys (a01, a1): bytewise */
    if (ret != 0)
        return ret;
    return ea->view < eb->view ? -1 : ea->view > eb->view;
}

/* Fills fs->order with the view indices in step-1 order. */
static kvx_status_t views_sort(struct fold_state *fs)
{
    const kvx_layout_t *layout = fs->layout;
    size_t nv                  = layout->num_views;
    size_t keys_size           = 0;
    struct order_entry *sorted = calloc(nv, sizeof(*sorted));
    unsigned char *keys;

    for (size_t i = 0; i < nv; i++)
        keys_size += NATURAL_ORDER_KEY_MAX(strlen(layout->views[i].name));
    keys = malloc(keys_size);
    if (sorted == NULL || keys == NULL) {
        free(sorted);
        free(keys);
        return error_no_memory("the view order");
    }
    for (size_t i = 0, used = 0; i < nv; i++) {
        const char *name = layout->views[i].name;
        size_t len       = natural_order_key(name, keys + used);

        sorted[i] = (struct order_entry){keys + used, len, name, (uint32_t)i};
        used += len;
    }
    qsort(sorted, nv, sizeof(*sorted), order_entry_compare);
    for (size_t i = 0; i < nv; i++)
        fs->order[i] = sorted[i].view;
    free(keys);
    free(sorted);
    return KVX_OK;
}

/* block_major(v) of regions.md step 2: the storage is v's rows plus a tail shorter than one
 * row. Written as n*stride <= size < n*stride + stride, overflow counting as false. */
static bool view_is_block_major(const struct view *v, const struct storage *s)
{
    uint64_t rows;

    if (__builtin_mul_overflow(v->num_blocks, v->stride, &rows) || rows > s->size)
        return false;
    return s->size - rows < v->stride;
}

/* packed_storage of regions.md step 2: one storage and one stride for every view, and no
 * compressor rings. */
static bool layout_is_packed_storage(const kvx_layout_t *layout)
{
    if (layout->csa_linear)
        return false;
    for (size_t i = 1; i < layout->num_views; i++) {
        if (layout->views[i].storage != layout->views[0].storage ||
            layout->views[i].stride != layout->views[0].stride)
            return false;
    }
    return true;
}

/* whole_row(v) and the spec of regions.md step 2. A whole row spans the storage row from
 * offset 0 with the stride as its length, never size / num_blocks, which would fold a
 * padding tail in and shift every descriptor. */
static struct spec view_spec(const struct fold_state *fs, const struct view *v)
{
    const kvx_layout_t *layout = fs->layout;
    bool mla                   = layout_kind_is_mla(v->kind);
    bool row_kind = v->kind != KVX_VIEW_KIND_SCRATCH && v->kind != KVX_VIEW_KIND_MAMBA &&
                    v->kind != KVX_VIEW_KIND_PLE;
    bool whole_row = row_kind && view_is_block_major(v, &layout->storages[v->storage]) &&
                     ((!v->dense && ((fs->packed_storage && mla) || !layout->csa_linear)) ||
                      (layout->whole_row_regions && mla));

    if (whole_row)
        return (struct spec){0, v->stride, v->stride, v->num_blocks, true};
    return (struct spec){v->offset, v->page, v->stride, v->num_blocks, false};
}

/* Mixes every input bit into the low bits the table mask keeps (murmur3's finalizer):
 * whole rows all start at offset 0, so the storage index must spread them too. */
static size_t base_hash(uint32_t storage, uint64_t offset)
{
    uint64_t h = offset ^ ((uint64_t)storage << 40);

    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53u;
    h ^= h >> 33;
    return (size_t)h;
}

/* The slot of base (storage, offset): the one holding it, or the empty one to fill. */
static struct base_slot *base_slot_find(struct fold_state *fs, uint32_t storage, uint64_t offset)
{
    size_t mask = fs->bases_size - 1;

    for (size_t i = base_hash(storage, offset) & mask;; i = (i + 1) & mask) {
        struct base_slot *slot = &fs->bases[i];
        if (slot->first == NO_REGION || (slot->storage == storage && slot->offset == offset))
            return slot;
    }
}

/* Adds view v to region r (regions.md step 3, "When a view joins r"). */
static void region_add_member(struct fold_state *fs, uint32_t r, uint32_t vi)
{
    struct region *region = &fs->created[r];
    const struct view *v  = &fs->layout->views[vi];

    region->mla |= layout_kind_is_mla(v->kind);
    region->scratch |= v->kind == KVX_VIEW_KIND_SCRATCH;
    region->ssm |= v->kind == KVX_VIEW_KIND_MAMBA;
    region->ple |= v->kind == KVX_VIEW_KIND_PLE;
    region->head_split |= v->kind == KVX_VIEW_KIND_ATTN || v->kind == KVX_VIEW_KIND_SWA ||
                          v->kind == KVX_VIEW_KIND_MAMBA;
    if (region->group != v->group)
        region->group = -1;
    region->num_members++;
    fs->region_of[vi] = r;
}

/* Joins v to a region if it is an exact-length alias (regions.md step 3.1) or a shorter
 * non-MLA view inside a packed row (step 3.2); otherwise starts a region (step 3.3).
 * On entry: views come in step-1 order, whole-row pass first. On exit: v is in exactly
 * one region. Regions sharing a base are found through the base index, so folding costs
 * O(regions at that base) per view, not O(regions). */
static void regions_fold_view(struct fold_state *fs, uint32_t vi, const struct spec *sp)
{
    const struct view *v   = &fs->layout->views[vi];
    bool mla               = layout_kind_is_mla(v->kind);
    struct base_slot *slot = base_slot_find(fs, v->storage, sp->offset);
    uint32_t packed_row    = NO_REGION;
    struct region *region;
    uint32_t r;

    if (slot->first != NO_REGION) {
        for (r = slot->first; r != NO_REGION; r = fs->next_same_base[r]) {
            region = &fs->created[r];
            if (region->block_len == sp->len) { /* 3.1: exact-length alias */
                if (mla) {
                    region->stride     = sp->stride;
                    region->num_blocks = sp->num_blocks;
                } else {
                    region->heads = v->heads;
                }
                region->packed_row |= sp->whole_row;
                region_add_member(fs, r, vi);
                return;
            }
            if (packed_row == NO_REGION && region->packed_row && sp->len < region->block_len &&
                region->stride == sp->stride && region->num_blocks == sp->num_blocks)
                packed_row = r;
        }
        if (!mla && packed_row != NO_REGION) { /* 3.2: shorter non-MLA inside a packed row */
            region_add_member(fs, packed_row, vi);
            return;
        }
    }

    r                     = (uint32_t)fs->num_created++; /* 3.3: a new region */
    region                = &fs->created[r];
    *region               = (struct region){0};
    region->storage       = v->storage;
    region->offset        = sp->offset;
    region->block_len     = sp->len;
    region->stride        = sp->stride;
    region->num_blocks    = sp->num_blocks;
    region->heads         = v->heads;
    region->group         = v->group;
    region->packed_row    = sp->whole_row;
    fs->next_same_base[r] = NO_REGION;
    if (slot->first == NO_REGION) {
        slot->storage = v->storage;
        slot->offset  = sp->offset;
        slot->first   = r;
    } else {
        fs->next_same_base[slot->last] = r;
    }
    slot->last = r;
    region_add_member(fs, r, vi);
}

/* Step 3: pass A folds the whole-row views, pass B the others, each in step-1 order, so a
 * packed row exists before any of its shorter aliases looks for it. */
static void regions_fold(struct fold_state *fs)
{
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < fs->layout->num_views; i++) {
            uint32_t vi    = fs->order[i];
            struct spec sp = view_spec(fs, &fs->layout->views[vi]);

            if (sp.whole_row == (pass == 0))
                regions_fold_view(fs, vi, &sp);
        }
    }
}

/* Most residues the proof steps through for one member before it gives up (bounded work on
 * hostile input). Real members settle at once: an exact alias has the region's length, so
 * its second block is already outside unless the strides agree modulo the region's. */
#define PROOF_WALK_MAX  (1u << 20)
#define PROOF_UNDECIDED UINT64_MAX

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a          = b;
        b          = t;
    }
    return a;
}

/* The first block of v that lies outside the union of r's blocks, v->num_blocks when every
 * block lies inside, or PROOF_UNDECIDED when that takes more than PROOF_WALK_MAX steps
 * (regions.md step 4). Blocks that touch (block_len == stride) form one interval: one
 * comparison. Otherwise block b starts in row (rel + b*stride_v) / stride_r at residue
 * (rel + b*stride_v) mod stride_r, and must start in a row below num_blocks at a residue
 * of at most block_len - page: the row bound is one division, and the residues are
 * constant (equal strides, the common case) or step by stride_v mod stride_r. */
static uint64_t member_first_uncovered(const struct region *r, const struct view *v)
{
    uint64_t rows_end = r->num_blocks * r->stride; /* fits: the region lies in its storage */
    uint64_t rel;
    uint64_t first_out; /* first block starting at or past rows_end */
    uint64_t step;
    uint64_t residue;
    uint64_t limit;

    if (v->offset < r->offset)
        return 0;
    rel = v->offset - r->offset;
    if (r->block_len == r->stride) {
        uint64_t last_end = rel + (v->num_blocks - 1) * v->stride + v->page;

        if (last_end <= rows_end)
            return v->num_blocks;
        if (rows_end < rel + v->page)
            return 0;
        return (rows_end - rel - v->page) / v->stride + 1;
    }

    first_out = rel >= rows_end ? 0 : (rows_end - rel - 1) / v->stride + 1;
    limit     = first_out < v->num_blocks ? first_out : v->num_blocks;
    residue   = rel % r->stride;
    if (v->page > r->block_len || residue > r->block_len - v->page)
        return 0;
    step = v->stride % r->stride;
    if (step != 0) {
        uint64_t g      = gcd(step, r->stride);
        uint64_t period = r->stride / g; /* residues repeat after this many blocks */

        /* Every residue of the cycle allowed: no need to visit them. */
        if (limit >= period && residue % g + r->stride - g <= r->block_len - v->page)
            return limit;
        for (uint64_t b = 1; b < limit; b++) {
            if (b > PROOF_WALK_MAX)
                return PROOF_UNDECIDED;
            residue = (residue + step) % r->stride;
            if (residue > r->block_len - v->page)
                return b;
        }
    }
    return limit;
}

/* Step 4's proof: every member's bytes lie inside its region's blocks. */
static kvx_status_t regions_prove_coverage(const kvx_layout_t *layout, const kvx_regions_t *t)
{
    for (size_t ri = 0; ri < t->num_regions; ri++) {
        const struct region *r = &t->regions[ri];
        const char *r_name     = regions_region_name(t, r);

        for (uint32_t m = 0; m < r->num_members; m++) {
            uint32_t vi          = t->members[r->first_member + m];
            const struct view *v = &layout->views[vi];
            uint64_t b           = member_first_uncovered(r, v);

            if (b == PROOF_UNDECIDED)
                return error_set(KVX_ERR_INVALID,
                                 "views[%" PRIu32 "] (%s): coverage by region %zu (%s) is not"
                                 " settled within %u steps (stride %" PRIu64
                                 " against the region's %" PRIu64 "); rejected rather than"
                                 " risk an uncovered byte",
                                 vi, v->name, ri, r_name, PROOF_WALK_MAX, v->stride, r->stride);
            if (b < v->num_blocks)
                return error_set(KVX_ERR_INVALID,
                                 "views[%" PRIu32 "] (%s) is not covered by region %zu (%s):"
                                 " its block %" PRIu64 " at storage offset %" PRIu64
                                 " lies outside the region's %" PRIu64 " blocks of %" PRIu64
                                 " bytes every %" PRIu64 " bytes from offset %" PRIu64,
                                 vi, v->name, ri, r_name, b, v->offset + b * v->stride,
                                 r->num_blocks, r->block_len, r->stride, r->offset);
        }
    }
    return KVX_OK;
}

/* Step 4's numbering: regions in the step-1 order of their first member, members in step-1
 * order, region-major descriptor ids. Fails only if the descriptor count overflows 63 bits. */
static kvx_status_t regions_order(struct fold_state *fs, kvx_regions_t *t)
{
    size_t num_views = fs->layout->num_views;

    for (size_t r = 0; r < fs->num_created; r++)
        fs->table_index[r] = NO_REGION;
    for (size_t i = 0; i < num_views; i++) {
        uint32_t r = fs->region_of[fs->order[i]];

        if (fs->table_index[r] == NO_REGION) {
            fs->table_index[r]           = (uint32_t)t->num_regions;
            t->regions[t->num_regions++] = fs->created[r];
        }
    }
    for (size_t r = 0, start = 0; r < t->num_regions; r++) {
        t->regions[r].first_member = (uint32_t)start;
        fs->next_member[r]         = (uint32_t)start;
        start += t->regions[r].num_members;
    }
    for (size_t i = 0; i < num_views; i++) {
        uint32_t vi = fs->order[i];
        uint32_t r  = fs->table_index[fs->region_of[vi]];

        t->members[fs->next_member[r]++] = vi;
    }
    return regions_number(t);
}

kvx_status_t regions_number(kvx_regions_t *t)
{
    uint64_t next_id = 0;

    t->single_group = true;
    t->max_group    = -1;
    for (size_t r = 0; r < t->num_regions; r++) {
        struct region *region = &t->regions[r];

        region->first_descriptor = next_id;
        if (__builtin_add_overflow(next_id, region->num_blocks, &next_id) ||
            next_id > (uint64_t)INT64_MAX)
            return error_set(KVX_ERR_INVALID,
                             "the table's descriptor count overflows 63 bits"
                             " at region %zu",
                             r);
        if (region->group != t->regions[0].group)
            t->single_group = false;
        if (region->group > t->max_group)
            t->max_group = region->group;
    }
    t->num_descriptors = next_id;
    return KVX_OK;
}

/* Copies the `name` member of `count` items into one allocation: the pointer array followed
 * by the strings, so the table owns its names with one free. */
char **regions_names_copy(const void *items, size_t count, size_t item_size, size_t name_offset)
{
    size_t size = count * sizeof(char *);
    char **names;
    char *text;

    for (size_t i = 0; i < count; i++)
        size += strlen(*(char *const *)((const char *)items + i * item_size + name_offset)) + 1;
    names = malloc(size > 0 ? size : 1);
    if (names == NULL)
        return NULL;
    text = (char *)(names + count);
    for (size_t i = 0; i < count; i++) {
        const char *name = *(char *const *)((const char *)items + i * item_size + name_offset);
        size_t len       = strlen(name) + 1;

        memcpy(text, name, len);
        names[i] = text;
        text += len;
    }
    return names;
}

void kvx_regions_destroy(kvx_regions_t *regions)
{
    if (regions == NULL)
        return;
    free(regions->view_groups);
    free(regions->view_names);
    free(regions->storage_names);
    model_free(&regions->model);
    free(regions->storage_sizes);
    free(regions->storage_mems);
    free(regions->storage_devices);
    free(regions->members);
    free(regions->regions);
    free(regions);
}

/* A table with room for one region per view, and copies of the names it reports, so that it
 * outlives the layout. */
static kvx_status_t regions_table_alloc(const kvx_layout_t *layout, kvx_regions_t **table_p)
{
    size_t nv        = layout->num_views;
    size_t ns        = layout->num_storages;
    kvx_regions_t *t = calloc(1, sizeof(*t));

    if (t == NULL)
        return error_no_memory("a region table");
    t->num_views       = nv;
    t->block_size      = layout->block_size;
    t->num_storages    = ns;
    t->regions         = calloc(nv, sizeof(*t->regions));
    t->members         = calloc(nv, sizeof(*t->members));
    t->storage_sizes   = calloc(ns, sizeof(*t->storage_sizes));
    t->storage_mems    = calloc(ns, sizeof(*t->storage_mems));
    t->storage_devices = calloc(ns, sizeof(*t->storage_devices));
    t->view_names =
        regions_names_copy(layout->views, nv, sizeof(struct view), offsetof(struct view, name));
    t->storage_names = regions_names_copy(layout->storages, ns, sizeof(struct storage),
                                          offsetof(struct storage, name));
    if (t->regions == NULL || t->members == NULL || t->storage_sizes == NULL ||
        t->storage_mems == NULL || t->storage_devices == NULL || t->view_names == NULL ||
        t->storage_names == NULL) {
        kvx_regions_destroy(t);
        return error_no_memory("a region table");
    }
    for (size_t i = 0; i < ns; i++) {
        t->storage_sizes[i]   = layout->storages[i].size;
        t->storage_mems[i]    = layout->storages[i].mem;
        t->storage_devices[i] = layout->storages[i].device;
    }
    if (layout->has_model) {
        kvx_status_t status = model_copy(&layout->model.public, &t->model);

        if (status != KVX_OK) {
            kvx_regions_destroy(t);
            return status;
        }
        t->has_model = true;
    }
    *table_p = t;
    return KVX_OK;
}

static void fold_state_free(struct fold_state *fs)
{
    free(fs->order);
    free(fs->region_of);
    free(fs->created);
    free(fs->next_same_base);
    free(fs->table_index);
    free(fs->next_member);
    free(fs->bases);
}

static kvx_status_t fold_state_init(struct fold_state *fs, const kvx_layout_t *layout)
{
    size_t nv = layout->num_views;
    kvx_status_t status;

    *fs                = (struct fold_state){.layout = layout};
    fs->packed_storage = layout_is_packed_storage(layout);
    for (fs->bases_size = 16; fs->bases_size < 2 * nv; fs->bases_size *= 2)
        ;
    fs->order          = calloc(nv, sizeof(*fs->order));
    fs->region_of      = calloc(nv, sizeof(*fs->region_of));
    fs->created        = calloc(nv, sizeof(*fs->created));
    fs->next_same_base = calloc(nv, sizeof(*fs->next_same_base));
    fs->table_index    = calloc(nv, sizeof(*fs->table_index));
    fs->next_member    = calloc(nv, sizeof(*fs->next_member));
    fs->bases          = calloc(fs->bases_size, sizeof(*fs->bases));
    if (fs->order == NULL || fs->region_of == NULL || fs->created == NULL ||
        fs->next_same_base == NULL || fs->table_index == NULL || fs->next_member == NULL ||
        fs->bases == NULL) {
        fold_state_free(fs);
        return error_no_memory("registration state");
    }
    for (size_t i = 0; i < fs->bases_size; i++)
        fs->bases[i].first = NO_REGION;
    status = views_sort(fs);
    if (status != KVX_OK)
        fold_state_free(fs);
    return status;
}

static int compare_group(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* The layout's group ids, each once: a request's groups are checked against them (a group
 * folded whole into shared regions is still the layout's), descriptors.c. */
static kvx_status_t regions_view_groups_copy(const kvx_layout_t *layout, kvx_regions_t *t)
{
    size_t n = 0;

    t->view_groups = calloc(layout->num_views + 1, sizeof(*t->view_groups));
    if (t->view_groups == NULL)
        return error_no_memory("the table's groups");
    for (size_t i = 0; i < layout->num_views; i++)
        t->view_groups[i] = layout->views[i].group;
    qsort(t->view_groups, layout->num_views, sizeof(*t->view_groups), compare_group);
    for (size_t i = 0; i < layout->num_views; i++) {
        if (n == 0 || t->view_groups[n - 1] != t->view_groups[i])
            t->view_groups[n++] = t->view_groups[i];
    }
    t->num_view_groups = n;
    return KVX_OK;
}

kvx_status_t kvx_regions_register(const kvx_layout_t *layout, kvx_regions_t **regions_p)
{
    struct fold_state fs;
    kvx_regions_t *table = NULL;
    kvx_status_t status;

    if (regions_p == NULL)
        return error_set(KVX_ERR_INVALID, "register: no place for the result");
    status = kvx_layout_validate(layout);
    if (status != KVX_OK)
        return status;
    status = regions_table_alloc(layout, &table);
    if (status != KVX_OK)
        return status;
    status = fold_state_init(&fs, layout);
    if (status != KVX_OK)
        goto err_free_table;

    regions_fold(&fs);
    status = regions_order(&fs, table);
    fold_state_free(&fs);
    if (status != KVX_OK)
        goto err_free_table;
    status = regions_prove_coverage(layout, table);
    if (status != KVX_OK)
        goto err_free_table;
    status = regions_view_groups_copy(layout, table);
    if (status != KVX_OK)
        goto err_free_table;
    *regions_p = table; /* the caller sees a table only once it is proven */
    return KVX_OK;

err_free_table:
    kvx_regions_destroy(table);
    return status;
}

size_t kvx_regions_count(const kvx_regions_t *regions)
{
    return regions->num_regions;
}

uint64_t kvx_regions_block_size(const kvx_regions_t *regions)
{
    return regions->block_size;
}

uint64_t kvx_regions_num_descriptors(const kvx_regions_t *regions)
{
    return regions->num_descriptors;
}

size_t kvx_regions_num_storages(const kvx_regions_t *regions)
{
    return regions->num_storages;
}

const kvx_model_t *kvx_regions_model(const kvx_regions_t *regions)
{
    return regions->has_model ? &regions->model.public : NULL;
}

const char *kvx_regions_storage_name(const kvx_regions_t *regions, size_t storage)
{
    return storage < regions->num_storages ? regions->storage_names[storage] : NULL;
}

const char *kvx_regions_view_name(const kvx_regions_t *regions, size_t view)
{
    return view < regions->num_views ? regions->view_names[view] : NULL;
}

kvx_status_t kvx_regions_get(const kvx_regions_t *regions, size_t index, kvx_region_info_t *info_p)
{
    const struct region *r;

    if (index >= regions->num_regions)
        return error_set(KVX_ERR_OUT_OF_RANGE, "region %zu: the table has %zu regions", index,
                         regions->num_regions);
    r       = &regions->regions[index];
    *info_p = (kvx_region_info_t){
        .name             = regions_region_name(regions, r),
        .storage          = r->storage,
        .storage_name     = regions->storage_names[r->storage],
        .offset           = r->offset,
        .block_len        = r->block_len,
        .stride           = r->stride,
        .num_blocks       = r->num_blocks,
        .first_descriptor = r->first_descriptor,
        .group            = r->group,
        .heads            = r->heads,
        .mla              = r->mla,
        .packed_row       = r->packed_row,
        .scratch          = r->scratch,
        .ssm              = r->ssm,
        .ple              = r->ple,
        .num_members      = r->num_members,
        .members          = &regions->members[r->first_member],
    };
    return KVX_OK;
}
