/* kvx.h: the whole public API of kvx, a library that moves KV-cache blocks between the
 * prefill and decode workers of a disaggregated LLM server. Anything not here may change.
 *
 * Conventions, for every function unless its comment says otherwise:
 * - Fallible calls return kvx_status_t; on failure kvx_errmsg() gives this thread's message
 *   and nothing the call could change has changed (outputs are written only on success).
 * - The caller owns what it passes in (strings, params); kvx copies what it keeps.
 *   `const` pointers kvx returns live as long as the handle they came from.
 * - Thread safety: one thread uses a handle at a time. A region table is immutable once
 *   registered, so any number of threads may read it at once.
 * - Integers that describe sizes, offsets and counts are 64-bit and must fit in 63 bits. */
#ifndef KVX_H
#define KVX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVX_API __attribute__((visibility("default")))
#else
#define KVX_API
#endif

/* ---------------------------------------------------------------------------------------
 * Status
 * ------------------------------------------------------------------------------------- */

/* Errors are grouped by what the caller must discard: -1..-99 the call or request only,
 * -100..-199 the peer, -200.. the agent or process. */
typedef enum kvx_status {
    KVX_OK               = 0,
    KVX_INPROGRESS       = 1,    /* a posted transfer has not completed yet */
    KVX_ERR_INVALID      = -1,   /* bad argument or input (layout, request); nothing changed */
    KVX_ERR_OUT_OF_RANGE = -2,   /* a block or descriptor id beyond its region's capacity */
    KVX_ERR_IO           = -3,   /* a file could not be read, or a peer failed */
    KVX_ERR_CANCELED     = -4,   /* a transfer was cancelled before it completed */
    KVX_ERR_BUSY         = -5,   /* the object still has dependants (peers, transfers) */
    KVX_ERR_MISMATCH     = -6,   /* verification: bytes differ between the two sides */
    KVX_ERR_PEER_DOWN    = -100, /* the peer is down (dead, restarted, closed): reconnect it */
    KVX_ERR_PEER_TIMEOUT = -101, /* the peer did not answer or complete within the deadline */
    KVX_ERR_PEER_REFUSED = -102, /* the peer answered with a refusal (its message follows) */
    KVX_ERR_NO_MEMORY    = -200, /* an allocation failed */
    KVX_ERR_INTERNAL     = -201, /* a broken invariant inside kvx: a bug, please report */
} kvx_status_t;

/* Fixed text naming a status ("invalid input"); never NULL. Any thread. */
KVX_API const char *kvx_status_str(kvx_status_t status);

/* This thread's message for its last failed call; "" if none failed yet. The string is
 * owned by kvx and valid until this thread's next failing call. */
KVX_API const char *kvx_errmsg(void);

/* The version of the UCX library loaded at run time ("1.22.0"): kvx builds against any from
 * 1.13 up, and what UCX does differs by version (docs/performance.md). Any thread. */
KVX_API const char *kvx_ucx_version(void);

/* Frees memory that a kvx call returned through a `char **..._p` out-parameter. NULL-safe. */
KVX_API void kvx_free(void *ptr);

/* Limits on what a layout may describe; input beyond them is rejected with a message. */
#define KVX_MAX_STORAGES     4096               /* a large model registers ~1,300 tensors */
#define KVX_MAX_VIEWS        65536              /* keeps every table index in 32 bits with room */
#define KVX_MAX_NAME_LEN     255                /* bytes, without the terminator */
#define KVX_MAX_LAYOUT_FILE  (64u << 20)        /* bytes: a 65,536-view layout is under 16 MiB */
#define KVX_MAX_JSON_INTEGER ((int64_t)1 << 53) /* largest integer a JSON double keeps exact */

/* ---------------------------------------------------------------------------------------
 * Layout: storages (allocations) and views (per-layer strided pages), spec/regions.md
 * ------------------------------------------------------------------------------------- */

typedef struct kvx_layout kvx_layout_t;

typedef enum kvx_view_kind {
    KVX_VIEW_KIND_ATTN,    /* full attention, K and V packed; head-split under TP */
    KVX_VIEW_KIND_SWA,     /* sliding-window attention; head-split */
    KVX_VIEW_KIND_MLA,     /* MLA latent; identical on every TP rank */
    KVX_VIEW_KIND_SWA_MLA, /* sliding-window MLA; counts as MLA */
    KVX_VIEW_KIND_SCRATCH, /* compressor ring / circular-buffer state; not MLA */
    KVX_VIEW_KIND_MAMBA,   /* SSM state */
    KVX_VIEW_KIND_PLE,     /* TP-replicated state */
} kvx_view_kind_t;

typedef enum kvx_mem_type {
    KVX_MEM_DRAM,
    KVX_MEM_VRAM,
} kvx_mem_type_t;

enum {
    KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE        = 1u << 0,
    KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR        = 1u << 1,
    KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS = 1u << 2,
};

typedef struct kvx_layout_params {
    uint64_t field_mask;    /* KVX_LAYOUT_PARAM_FIELD_* bits of the fields set below */
    uint64_t block_size;    /* _BLOCK_SIZE: tokens per block, >= 1; default 16 */
    bool csa_linear;        /* _CSA_LINEAR: model has compressor-ring groups; default false */
    bool whole_row_regions; /* _WHOLE_ROW_REGIONS: whole rows for MLA views; default false */
} kvx_layout_params_t;

enum {
    KVX_STORAGE_PARAM_FIELD_MEM    = 1u << 0,
    KVX_STORAGE_PARAM_FIELD_DEVICE = 1u << 1,
};

typedef struct kvx_storage_params {
    uint64_t field_mask; /* KVX_STORAGE_PARAM_FIELD_* bits of the optional fields set */
    const char *name;    /* required, unique, 1..KVX_MAX_NAME_LEN bytes of printable UTF-8 */
    uint64_t size;       /* required: bytes, >= 1 */
    kvx_mem_type_t mem;  /* _MEM: default KVX_MEM_DRAM */
    int64_t device;      /* _DEVICE: device id, >= 0; default 0 */
} kvx_storage_params_t;

enum {
    KVX_VIEW_PARAM_FIELD_GROUP  = 1u << 0,
    KVX_VIEW_PARAM_FIELD_OFFSET = 1u << 1,
    KVX_VIEW_PARAM_FIELD_DENSE  = 1u << 2,
    KVX_VIEW_PARAM_FIELD_HEADS  = 1u << 3,
};

typedef struct kvx_view_params {
    uint64_t field_mask;  /* KVX_VIEW_PARAM_FIELD_* bits of the optional fields set */
    const char *name;     /* required: layer name, 1..KVX_MAX_NAME_LEN bytes, printable UTF-8 */
    kvx_view_kind_t kind; /* required */
    const char *storage;  /* required: name of a storage added before this view */
    uint64_t page;        /* required: bytes per block of this view, padding included, >= 1 */
    uint64_t stride;      /* required: bytes from block b to block b+1, >= page */
    uint64_t num_blocks;  /* required: >= 1 */
    int64_t group;        /* _GROUP: KV-cache group, >= 0; default 0 */
    uint64_t offset;      /* _OFFSET: bytes from the storage start to block 0; default 0 */
    bool dense;           /* _DENSE: a block is one contiguous run of page bytes; default true */
    uint64_t heads;       /* _HEADS: KV heads of this view on this rank, >= 1; default 1 */
} kvx_view_params_t;

/* The model identity of a layout: the factors of the compatibility hash that P and D compare
 * before any transfer (docs/wire.md). Strings at most KVX_MAX_NAME_LEN bytes. Names and these
 * strings are printable UTF-8: no control character (U+0000-U+001F, U+007F-U+009F) and no
 * malformed, overlong or surrogate sequence; the message of a violation names the field and
 * the byte offset and quotes the value escaped. */
typedef struct kvx_model {
    const char *id;          /* model id, e.g. "deepseek-ai/DeepSeek-V3"; required */
    const char *revision;    /* NULL or "" when unknown */
    const char *dtype;       /* compute dtype, e.g. "bfloat16" */
    const char *cache_dtype; /* KV-cache dtype, e.g. "fp8_e4m3" */
    uint64_t kv_heads;       /* total KV heads of the model (all ranks) */
    uint64_t head_size;      /* elements per head */
    uint64_t layers;
    const char *backend; /* attention backend name, e.g. "FLASHMLA" */
} kvx_model_t;

/* Sets the layout's model identity (copied). Errors: KVX_ERR_INVALID for a missing id or a
 * string longer than KVX_MAX_NAME_LEN or not printable UTF-8; the layout is unchanged then. */
KVX_API kvx_status_t kvx_layout_set_model(kvx_layout_t *layout, const kvx_model_t *model);

/* Creates an empty layout. params may be NULL for every default. Errors: KVX_ERR_INVALID
 * for an unknown field bit or a zero block size. */
KVX_API kvx_status_t kvx_layout_create(const kvx_layout_params_t *params, kvx_layout_t **layout_p);

/* Destroys a layout; NULL-safe. Region tables registered from it stay valid. */
KVX_API void kvx_layout_destroy(kvx_layout_t *layout);

/* Adds a storage. The message of an invalid field names it as storages[i].field, i being the
 * index this storage would have had. On error the layout is unchanged. */
KVX_API kvx_status_t kvx_layout_add_storage(kvx_layout_t *layout,
                                            const kvx_storage_params_t *params);

/* Adds a view after checking every rule of regions.md "View fields" against the storages
 * added so far; messages name views[i].field with the value and the rule, i being the index
 * the view would have had. On error the layout is unchanged. */
KVX_API kvx_status_t kvx_layout_add_view(kvx_layout_t *layout, const kvx_view_params_t *params);

/* Checks the layout as a whole (at least one storage and one view). Views and storages were
 * checked as they were added, so this is the last step before registration. */
KVX_API kvx_status_t kvx_layout_validate(const kvx_layout_t *layout);

/* Reads a layout file (spec formats.md, "kvx_layout": 1) from a buffer of `size` bytes (no
 * terminator needed) or from a path. Strict: unknown keys, wrong types, negative or
 * fractional counts and missing required keys fail with the key's path. Integers above
 * KVX_MAX_JSON_INTEGER are rejected because JSON numbers are doubles; each number's text is
 * weighed, not its double, so 2^53 + 1 is not rounded into range, and a leading zero (0123)
 * is rejected as JSON does. The result has passed kvx_layout_validate(). A path that is not
 * a regular file (a FIFO, directory or device) fails with KVX_ERR_IO naming what it is,
 * before any read, so the call never blocks. */
KVX_API kvx_status_t kvx_layout_load_buffer(const char *json, size_t size, kvx_layout_t **layout_p);
KVX_API kvx_status_t kvx_layout_load_file(const char *path, kvx_layout_t **layout_p);

/* Read access. Indices follow the order of addition (file order). */
KVX_API uint64_t kvx_layout_block_size(const kvx_layout_t *layout);
KVX_API size_t kvx_layout_num_storages(const kvx_layout_t *layout);
KVX_API size_t kvx_layout_num_views(const kvx_layout_t *layout);

/* Bytes of storage `index`; 0 past the last storage. */
KVX_API uint64_t kvx_layout_storage_size(const kvx_layout_t *layout, size_t index);

/* The memory kind and device of storage `index` (KVX_MEM_DRAM past the last one), and a way
 * to change them: a program that serves a layout written for GPUs from host memory says so
 * (kvx serve --memory host). Memory kinds are not part of the compatibility hash: a host
 * storage may be read into a GPU one. */
KVX_API kvx_mem_type_t kvx_layout_storage_mem(const kvx_layout_t *layout, size_t index);
KVX_API kvx_status_t kvx_layout_set_storage_mem(kvx_layout_t *layout, size_t index,
                                                kvx_mem_type_t mem, int64_t device);

/* Fixed names for enums, as spelled in layout files ("swa_mla", "vram"); NULL if unknown. */
KVX_API const char *kvx_view_kind_str(kvx_view_kind_t kind);
KVX_API const char *kvx_mem_type_str(kvx_mem_type_t mem);

/* ---------------------------------------------------------------------------------------
 * Regions: what is transferred, one descriptor per region per block, spec/regions.md
 * ------------------------------------------------------------------------------------- */

typedef struct kvx_regions kvx_regions_t;

/* One region, as spec formats.md prints it. */
typedef struct kvx_region_info {
    const char *name; /* the name of its first member in step-1 order */
    size_t storage;   /* storage index in the layout */
    const char *storage_name;
    uint64_t offset;           /* bytes: region base inside its storage */
    uint64_t block_len;        /* bytes per descriptor */
    uint64_t stride;           /* bytes from block b to block b+1 */
    uint64_t num_blocks;       /* descriptors of this region */
    uint64_t first_descriptor; /* id of block 0: the sum of num_blocks of earlier regions */
    int64_t group;             /* KV-cache group; -1 when shared by several groups */
    uint64_t heads;
    bool mla;
    bool packed_row;
    bool scratch;
    bool ssm;
    bool ple;
    size_t num_members;
    const uint32_t *members; /* view indices (layout order), in step-1 order */
} kvx_region_info_t;

/* A descriptor: `len` bytes at `offset` inside storage `storage`. The address is the
 * storage's base address plus offset. */
typedef struct kvx_descriptor {
    size_t storage;
    uint64_t offset;
    uint64_t len;
} kvx_descriptor_t;

/* Block ids of one KV-cache group in a request; groups are passed as an array indexed by
 * group id. */
typedef struct kvx_group_ids {
    const uint64_t *ids;
    size_t count;
} kvx_group_ids_t;

/* Registers a validated layout into a region table: natural order, whole-row specs, alias
 * folding in two passes, region order, and the coverage proof (regions.md steps 1-4). The
 * table is returned only once every byte of every view is proven covered; a failure names
 * the view and region. The table copies what it needs: the layout may be destroyed. */
KVX_API kvx_status_t kvx_regions_register(const kvx_layout_t *layout, kvx_regions_t **regions_p);

/* Destroys a table; NULL-safe. */
KVX_API void kvx_regions_destroy(kvx_regions_t *regions);

KVX_API size_t kvx_regions_count(const kvx_regions_t *regions);
KVX_API uint64_t kvx_regions_num_descriptors(const kvx_regions_t *regions);
KVX_API uint64_t kvx_regions_block_size(const kvx_regions_t *regions); /* tokens per block */
KVX_API size_t kvx_regions_num_storages(const kvx_regions_t *regions);

/* The model identity registered with the table, or NULL when its layout had none. */
KVX_API const kvx_model_t *kvx_regions_model(const kvx_regions_t *regions);

/* The name of storage `storage` (a layout index); NULL if out of range. */
KVX_API const char *kvx_regions_storage_name(const kvx_regions_t *regions, size_t storage);

/* Fills *info_p for region `index`. Errors: KVX_ERR_OUT_OF_RANGE. */
KVX_API kvx_status_t kvx_regions_get(const kvx_regions_t *regions, size_t index,
                                     kvx_region_info_t *info_p);

/* The name of view `view` (a layout index, as in kvx_region_info_t.members); NULL if out of
 * range. */
KVX_API const char *kvx_regions_view_name(const kvx_regions_t *regions, size_t view);

/* Id of block b of region r (regions.md "Descriptors"). Errors: KVX_ERR_OUT_OF_RANGE. */
KVX_API kvx_status_t kvx_regions_descriptor_id(const kvx_regions_t *regions, size_t region,
                                               uint64_t block, uint64_t *id_p);

/* The descriptor with id `id`. O(log regions). Errors: KVX_ERR_OUT_OF_RANGE. */
KVX_API kvx_status_t kvx_regions_descriptor(const kvx_regions_t *regions, uint64_t id,
                                            kvx_descriptor_t *descriptor_p);

/* Address of descriptor `id` given the base address of every storage (indexed as in the
 * layout, kvx_regions_num_storages() entries). Errors: KVX_ERR_OUT_OF_RANGE. */
KVX_API kvx_status_t kvx_regions_descriptor_addr(const kvx_regions_t *regions,
                                                 const uint64_t *storage_bases, uint64_t id,
                                                 uint64_t *addr_p, uint64_t *len_p);

/* Bytes the table's descriptors cover, each byte once (regions that overlap, such as a whole
 * row and the pages inside it, count once): what moves when every block of every region
 * does. Allocates a list of the descriptors while it counts. Errors: KVX_ERR_NO_MEMORY. */
KVX_API kvx_status_t kvx_regions_bytes(const kvx_regions_t *regions, uint64_t *bytes_p);

/* The highest group a request may give block ids: the layout's highest view group (in a table
 * from the wire, its regions'); at least 0. A caller that takes sparse {group: ids} bounds
 * the dense array it builds by it. */
KVX_API int64_t kvx_regions_max_group(const kvx_regions_t *regions);

/* The request rule of regions.md "Descriptors": block ids per group (groups[g] holds group
 * g's ids) become descriptor ids, emitted group, then region, then block. Sets
 * *num_ids_p to the number of ids the request yields; when `ids` is not NULL also writes
 * them (max_ids must be at least that number). Checks the whole request before writing:
 * an id beyond a region's capacity fails with KVX_ERR_OUT_OF_RANGE naming the group, id and
 * region; when the table uses several groups, num_groups must cover the highest one and a
 * group the layout does not have must hold no ids. One side's ids only: an id repeated here
 * is listed twice (a plan refuses local ids named twice, remote ones may repeat). Allocates
 * nothing. */
KVX_API kvx_status_t kvx_regions_request_ids(const kvx_regions_t *regions,
                                             const kvx_group_ids_t *groups, size_t num_groups,
                                             uint64_t *ids, size_t max_ids, size_t *num_ids_p);

/* The table as JSON (spec formats.md "kvx_plan": 1), NUL-terminated, freed by kvx_free(). */
KVX_API kvx_status_t kvx_regions_to_json(const kvx_regions_t *regions, char **json_p);

/* `text` as a JSON string: in double quotes, with quotes and backslashes escaped (\" and \\),
 * bytes below 0x20 as \u00XX, and every other byte as it is (names are UTF-8 bytes). Like
 * snprintf: writes at most `size` bytes into `out` (NUL-terminated when size > 0; out may be
 * NULL when size is 0) and returns the length of the whole string, NUL not counted, so a
 * result >= size means it was cut. kvx's one JSON string writer: the region table's JSON,
 * kvx plan --json and kvx fetch --json all quote through it. Any thread. */
KVX_API size_t kvx_json_quote(char *out, size_t size, const char *text);

/* ---------------------------------------------------------------------------------------
 * Plan: a request's (local, remote) descriptor pairs for one peer, pull direction (the
 * local side reads). Built once per peer; a request then costs only its own blocks.
 * ------------------------------------------------------------------------------------- */

typedef struct kvx_peer_plan kvx_peer_plan_t;
typedef struct kvx_pairs kvx_pairs_t;

enum {
    KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP          = 1u << 0,
    KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK        = 1u << 1,
    KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP         = 1u << 2,
    KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE  = 1u << 3,
    KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE = 1u << 4,
    KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN      = 1u << 5,
};

#define KVX_MAX_TP 4096 /* ranks on either side; keeps per-rank tables small */

typedef struct kvx_peer_plan_params {
    uint64_t field_mask;        /* KVX_PEER_PLAN_PARAM_FIELD_* bits of the fields set below */
    uint32_t local_tp;          /* _LOCAL_TP: local TP size, 1..KVX_MAX_TP; default 1 */
    uint32_t local_rank;        /* _LOCAL_RANK: < local_tp; default 0 */
    uint32_t remote_tp;         /* _REMOTE_TP: remote TP size, 1..KVX_MAX_TP; default 1 */
    uint64_t local_block_size;  /* _LOCAL_BLOCK_SIZE: tokens; default the local table's */
    uint64_t remote_block_size; /* _REMOTE_BLOCK_SIZE: tokens; default the remote table's */
    uint64_t max_pair_len;      /* _MAX_PAIR_LEN: bytes a coalesced pair may reach; a single
                                   descriptor is never split. 0 (default): no limit */
} kvx_peer_plan_params_t;

/* One transfer: `len` bytes from `remote_offset` in the peer's storage `remote_storage`
 * into `local_offset` in local storage `local_storage` (indices as in each side's layout). */
typedef struct kvx_pair {
    uint32_t local_storage;
    uint32_t remote_storage;
    uint64_t local_offset;
    uint64_t remote_offset;
    uint64_t len;
} kvx_pair_t;

/* A request: block ids per group on each side (arrays indexed by group id, as for
 * kvx_regions_request_ids). remote == NULL means "the same blocks": the local ids, or with a
 * block-size ratio bsr > 1, each local id b as the remote ids b*bsr .. b*bsr + bsr - 1. */
#define KVX_TOKEN_LEN 16 /* bytes of a hold's capability */

/* A held request's capability: random bytes the prefill side holds the request with
 * (kvx_token_generate, kvx_hold), carried to the decode side with the request's transfer
 * parameters (as engines carry kv_transfer_params); a `done` or heartbeat for a held request
 * counts only with it. */
typedef struct kvx_token {
    uint8_t bytes[KVX_TOKEN_LEN];
} kvx_token_t;

typedef struct kvx_request {
    const kvx_group_ids_t *local;
    size_t num_local_groups;
    const kvx_group_ids_t *remote;
    size_t num_remote_groups;
    const kvx_token_t *token; /* transfers: the prefill side's hold token for this request,
                                 sent with its `done` (a pull) or its push request; NULL:
                                 none (a held request then refuses the done, a push involves
                                 no hold) */
} kvx_request_t;

typedef struct kvx_pairs_stats {
    uint64_t descriptors; /* descriptor pairs the request names, before coalescing */
    uint64_t coalesced;   /* pairs after coalescing and dropping repeats: what is posted */
    uint64_t bytes;       /* bytes the pairs move, each local byte once */
} kvx_pairs_stats_t;

/* Prepares everything a request to one peer needs: region by region, how the local block is
 * read from which remote rank (replicated MLA: whole block from one rank; head-split attn,
 * swa and mamba regions: a slice by the TP ratio; ple and scratch-only: whole block), and
 * per group the regions that take it. The tables must name the same regions in the same
 * order with the same groups; every length must agree with the TP and block-size rules.
 * Errors name the region, field, both values and the rule. The plan keeps pointers to both
 * tables, which must outlive it. */
KVX_API kvx_status_t kvx_peer_plan_create(const kvx_regions_t *local, const kvx_regions_t *remote,
                                          const kvx_peer_plan_params_t *params,
                                          kvx_peer_plan_t **plan_p);

/* Destroys a plan; NULL-safe. */
KVX_API void kvx_peer_plan_destroy(kvx_peer_plan_t *plan);

/* Remote ranks this local rank reads from, in ascending order. */
KVX_API size_t kvx_peer_plan_num_reads(const kvx_peer_plan_t *plan);
KVX_API uint32_t kvx_peer_plan_read_rank(const kvx_peer_plan_t *plan, size_t read);

/* Remote ranks that hold part of this local rank's request but are never read (replicated
 * MLA or heads held by several ranks): they are only notified when a request completes. */
KVX_API size_t kvx_peer_plan_num_notifies(const kvx_peer_plan_t *plan);
KVX_API uint32_t kvx_peer_plan_notify_rank(const kvx_peer_plan_t *plan, size_t notify);

/* A reusable result buffer: it grows to the largest request planned into it, so planning
 * allocates only when a request is larger than every earlier one. */
KVX_API kvx_status_t kvx_pairs_create(kvx_pairs_t **pairs_p);
KVX_API void kvx_pairs_destroy(kvx_pairs_t *pairs);

/* Plans one request into `pairs`: descriptor ids by the request rule on each side, then one
 * pair list per read rank in id order (group, region, block, sub-block, slice), coalesced as
 * built. The whole request is checked first (group counts, equal counts per group on both
 * sides, ids within every taking region's capacity, no group the table lacks, no id twice in
 * a group); on error `pairs` holds no pairs and the message names the group, id and region.
 * Each local byte is moved at most once (docs/plan.md "Each byte once"): when two of the
 * request's pairs name one byte, every list comes sorted by local storage and offset with the
 * repeats dropped, and two different sources for one byte fail the request naming both.
 * Stats: `descriptors` counts what the request names, `bytes` what the pairs move. A request
 * whose groups hold no ids yields no pairs: a notify-only request. Thread-safe for different
 * `pairs` on one plan. */
KVX_API kvx_status_t kvx_peer_plan_request(const kvx_peer_plan_t *plan,
                                           const kvx_request_t *request, kvx_pairs_t *pairs);

/* The pairs of read `read` (as in kvx_peer_plan_read_rank) of the last planned request:
 * *remote_rank_p gets the rank they are read from, *count_p their number (either may be
 * NULL). Valid until the next kvx_peer_plan_request into `pairs`; NULL past the last read. */
KVX_API const kvx_pair_t *kvx_pairs_read(const kvx_pairs_t *pairs, size_t read,
                                         uint32_t *remote_rank_p, size_t *count_p);
KVX_API size_t kvx_pairs_num_reads(const kvx_pairs_t *pairs);
KVX_API void kvx_pairs_stats(const kvx_pairs_t *pairs, kvx_pairs_stats_t *stats_p);

/* ---------------------------------------------------------------------------------------
 * Wire: handshake metadata, the compatibility hash and remote-table validation
 * (docs/wire.md). Decoding treats every byte as hostile.
 * ------------------------------------------------------------------------------------- */

#define KVX_WIRE_VERSION      1
#define KVX_COMPAT_HASH_LEN   32          /* bytes: SHA-256 */
#define KVX_MAX_METADATA_SIZE (16u << 20) /* bytes: a 65,536-region table is under 8 MiB */
#define KVX_MAX_BLOB_SIZE     4096        /* bytes of a remote key or transport address */
#define KVX_MAX_DIFFERENCES   4096        /* differences kept by kvx_metadata_validate */
#define KVX_MAX_TCP_SEGMENT   (1u << 30)  /* bytes of a UCX TCP segment a peer may state */

typedef enum kvx_transfer_mode {
    KVX_MODE_PULL, /* the decode side reads */
    KVX_MODE_PUSH, /* the prefill side writes */
} kvx_transfer_mode_t;

typedef struct kvx_blob {
    const void *data;
    size_t size; /* bytes */
} kvx_blob_t;

/* SHA-256 over the canonical encoding of the factors that must match (docs/wire.md): wire
 * version, the table's model identity (all empty when it has none) and the transfer mode. */
KVX_API kvx_status_t kvx_compat_hash(const kvx_regions_t *regions, kvx_transfer_mode_t mode,
                                     uint8_t hash[KVX_COMPAT_HASH_LEN]);

enum {
    KVX_METADATA_PARAM_FIELD_ENGINE_ID         = 1u << 0,
    KVX_METADATA_PARAM_FIELD_AGENT_NAME        = 1u << 1,
    KVX_METADATA_PARAM_FIELD_TP_RANK           = 1u << 2,
    KVX_METADATA_PARAM_FIELD_TP_SIZE           = 1u << 3,
    KVX_METADATA_PARAM_FIELD_MODE              = 1u << 4,
    KVX_METADATA_PARAM_FIELD_STORAGE_BASES     = 1u << 5,
    KVX_METADATA_PARAM_FIELD_REMOTE_KEYS       = 1u << 6,
    KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS = 1u << 7,
    KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS      = 1u << 8,
};

typedef struct kvx_metadata_params {
    uint64_t field_mask;           /* KVX_METADATA_PARAM_FIELD_* bits of the fields set */
    const char *engine_id;         /* _ENGINE_ID: default "" */
    const char *agent_name;        /* _AGENT_NAME: default "kvx" */
    uint32_t tp_rank;              /* _TP_RANK: default 0 */
    uint32_t tp_size;              /* _TP_SIZE: default 1 */
    kvx_transfer_mode_t mode;      /* _MODE: default KVX_MODE_PULL */
    const uint64_t *storage_bases; /* _STORAGE_BASES: address per storage; default all 0 */
    const kvx_blob_t *remote_keys; /* _REMOTE_KEYS: packed key per storage; default empty */
    kvx_blob_t transport_address;  /* _TRANSPORT_ADDRESS: default empty */
    uint64_t tcp_tx_seg_size;      /* _TCP_SEGMENTS: bytes of UCX's TCP segments this side
                                      sends and receives, each 1..KVX_MAX_TCP_SEGMENT, or both
                                      0 when its transports have no tcp; default: not sent, and
                                      a peer then assumes UCX's defaults (docs/wire.md) */
    uint64_t tcp_rx_seg_size;      /* _TCP_SEGMENTS */
} kvx_metadata_params_t;

/* Encodes this agent's metadata: an envelope (version, hash, factors) around the body (ids,
 * TP, block size, mode, region table, registrations, transport address). *buf_p is freed
 * with kvx_free(). */
KVX_API kvx_status_t kvx_metadata_pack(const kvx_regions_t *regions,
                                       const kvx_metadata_params_t *params, void **buf_p,
                                       size_t *size_p);

typedef struct kvx_metadata kvx_metadata_t;

/* Decodes a peer's metadata in two phases: the envelope first, whose version and hash must
 * equal this side's (`local`, `mode`), with a message naming each differing factor when the
 * peer sent them; only then the body, every count and length checked against KVX_MAX_*
 * before use. The result is fully valid or not returned. */
KVX_API kvx_status_t kvx_metadata_unpack(const void *buf, size_t size, const kvx_regions_t *local,
                                         kvx_transfer_mode_t mode, kvx_metadata_t **metadata_p);

/* Destroys decoded metadata; NULL-safe. */
KVX_API void kvx_metadata_destroy(kvx_metadata_t *metadata);

typedef struct kvx_metadata_info {
    const char *engine_id;
    const char *agent_name;
    uint32_t tp_rank;
    uint32_t tp_size;
    uint64_t block_size; /* tokens */
    kvx_transfer_mode_t mode;
    size_t num_registrations;
    kvx_blob_t transport_address;
} kvx_metadata_info_t;

typedef struct kvx_registration_info {
    const char *storage;
    uint64_t base; /* address in the peer's process */
    uint64_t size; /* bytes */
    kvx_mem_type_t mem;
    int64_t device;
    kvx_blob_t remote_key;
} kvx_registration_info_t;

KVX_API void kvx_metadata_get_info(const kvx_metadata_t *metadata, kvx_metadata_info_t *info_p);
KVX_API kvx_status_t kvx_metadata_registration(const kvx_metadata_t *metadata, size_t index,
                                               kvx_registration_info_t *info_p);

/* The peer's region table, as a table kvx_peer_plan_create() takes (each region is its own
 * single member). Lives as long as the metadata. */
KVX_API const kvx_regions_t *kvx_metadata_regions(const kvx_metadata_t *metadata);

/* Checks the peer's table against `local` as a pull plan would use it (params: local TP and
 * rank, block sizes; remote TP and block size default to the peer's): same region count,
 * names in the same order, groups and kinds, stride >= block_len, and block lengths that
 * agree with the TP and block-size rules (docs/plan.md). Returns KVX_OK, or KVX_ERR_INVALID
 * with the first difference as the message. *num_differences_p (may be NULL) gets how many
 * were found; kvx_metadata_difference() returns each of the first KVX_MAX_DIFFERENCES. */
KVX_API kvx_status_t kvx_metadata_validate(kvx_metadata_t *metadata, const kvx_regions_t *local,
                                           const kvx_peer_plan_params_t *params,
                                           size_t *num_differences_p);
KVX_API const char *kvx_metadata_difference(const kvx_metadata_t *metadata, size_t index);

/* ---------------------------------------------------------------------------------------
 * Authentication: one secret shared by a deployment (docs/security.md). The side channel is
 * ZeroMQ CURVE, with keys derived from it; a peer without it is answered nothing.
 * ------------------------------------------------------------------------------------- */

#define KVX_AUTH_KEY_LEN 32 /* bytes of the shared secret */

/* Fills `key` with a new random secret (for a process that makes its own, like kvx demo). */
KVX_API kvx_status_t kvx_auth_key_generate(uint8_t key[KVX_AUTH_KEY_LEN]);

/* Writes a new random secret to a new file `path`, mode 0600; an existing file is an error
 * and stays as it was. */
KVX_API kvx_status_t kvx_auth_key_create(const char *path);

/* Reads the secret of a file kvx_auth_key_create wrote. The file must be a regular file that
 * neither its group nor others may read or write. */
KVX_API kvx_status_t kvx_auth_key_load(const char *path, uint8_t key[KVX_AUTH_KEY_LEN]);

/* The environment variable that names a deployment's key file where none is given. */
#define KVX_AUTH_FILE_ENV "KVX_AUTH_FILE"

/* Which key file to use: `file` when given (neither NULL nor ""), else the file the
 * environment variable KVX_AUTH_FILE_ENV names when it is set and not empty, else NULL.
 * Every front end (kvx's commands, Python's Agent, the vLLM connector) asks here, so they
 * agree. The result is `file` or the environment's own string: not to be freed, valid until
 * the environment changes. */
KVX_API const char *kvx_auth_file(const char *file);

/* ---------------------------------------------------------------------------------------
 * Agent: one worker's storages, region table, UCX transport and handshake side channel
 * (docs/agent.md). Pull direction: the decode side connects to prefill agents and reads.
 * Thread safety: one thread uses an agent and its peers at a time.
 * ------------------------------------------------------------------------------------- */

typedef struct kvx_agent kvx_agent_t;
typedef struct kvx_peer kvx_peer_t;

enum {
    KVX_AGENT_PARAM_FIELD_NAME            = 1u << 0,
    KVX_AGENT_PARAM_FIELD_TRANSPORTS      = 1u << 1,
    KVX_AGENT_PARAM_FIELD_LISTEN          = 1u << 2,
    KVX_AGENT_PARAM_FIELD_ENGINE_ID       = 1u << 3,
    KVX_AGENT_PARAM_FIELD_TP_RANK         = 1u << 4,
    KVX_AGENT_PARAM_FIELD_TP_SIZE         = 1u << 5,
    KVX_AGENT_PARAM_FIELD_STORAGE_BASES   = 1u << 6,
    KVX_AGENT_PARAM_FIELD_TIMEOUT_MS      = 1u << 7,
    KVX_AGENT_PARAM_FIELD_LEASE_MS        = 1u << 8,
    KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS    = 1u << 9,
    KVX_AGENT_PARAM_FIELD_PEER_TTL_MS     = 1u << 10,
    KVX_AGENT_PARAM_FIELD_AUTH_KEY        = 1u << 11,
    KVX_AGENT_PARAM_FIELD_INSECURE        = 1u << 12,
    KVX_AGENT_PARAM_FIELD_MAX_PEERS       = 1u << 13,
    KVX_AGENT_PARAM_FIELD_MAX_MESSAGE     = 1u << 14,
    KVX_AGENT_PARAM_FIELD_MAX_PUSHES      = 1u << 15,
    KVX_AGENT_PARAM_FIELD_PUSH_TRANSPORTS = 1u << 16,
    KVX_AGENT_PARAM_FIELD_VERIFY_ONE_IN   = 1u << 17,
    KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS     = 1u << 18,
};

/* What a clear field_mask bit gives (kvx_agent_params_t): the agent's defaults, here only.
 * Front ends (kvx serve, kvx fetch, Python) set a field only when their user gave it. On one
 * host the transports are shared memory, cross-memory attach and TCP for wire-up; a push
 * writer takes one lane that reaches the requester's own process. */
#define KVX_DEFAULT_TRANSPORTS      "sm,cma,tcp"
#define KVX_DEFAULT_TIMEOUT_MS      10000   /* 10 s */
#define KVX_DEFAULT_LEASE_MS        30000   /* 30 s */
#define KVX_DEFAULT_HEARTBEAT_MS    5000    /* 5 s */
#define KVX_DEFAULT_PEER_TTL_MS     3600000 /* 1 hour */
#define KVX_DEFAULT_MAX_PEERS       64
#define KVX_DEFAULT_MAX_MESSAGE     1048576 /* 1 MiB */
#define KVX_DEFAULT_MAX_PUSHES      64
#define KVX_DEFAULT_PUSH_TRANSPORTS "tcp"
#define KVX_DEFAULT_MAX_PUSH_MS     300000 /* 5 min */

typedef struct kvx_agent_params {
    uint64_t field_mask;         /* KVX_AGENT_PARAM_FIELD_* bits of the fields set below */
    const char *name;            /* _NAME: in logs and metadata; default "kvx" */
    const char *transports;      /* _TRANSPORTS: a UCX_TLS list; default KVX_DEFAULT_TRANSPORTS */
    const char *listen;          /* _LISTEN: "HOST:PORT" of the side channel (prefill);
                                    default: none, the agent only connects */
    const char *engine_id;       /* _ENGINE_ID: default "" */
    uint32_t tp_rank;            /* _TP_RANK: default 0 */
    uint32_t tp_size;            /* _TP_SIZE: default 1 */
    void *const *storage_bases;  /* _STORAGE_BASES: the engine's memory, one base per storage
                                    of the layout, registered as is; default: kvx allocates
                                    every storage through UCX */
    uint32_t timeout_ms;         /* _TIMEOUT_MS: handshake and transfer deadline; default
                                    KVX_DEFAULT_TIMEOUT_MS */
    uint32_t lease_ms;           /* _LEASE_MS: how long kvx_hold keeps blocks with neither a done
                                    nor a heartbeat; default KVX_DEFAULT_LEASE_MS */
    uint32_t heartbeat_ms;       /* _HEARTBEAT_MS: decode side: how often progress heartbeats
                                    each prefill peer; a peer that answers none for three
                                    intervals is dead; default KVX_DEFAULT_HEARTBEAT_MS */
    uint32_t peer_ttl_ms;        /* _PEER_TTL_MS: decode side: a peer with nothing in flight and
                                    nothing wanted for this long is dropped; default
                                    KVX_DEFAULT_PEER_TTL_MS */
    const uint8_t *auth_key;     /* _AUTH_KEY: the deployment's secret, KVX_AUTH_KEY_LEN bytes
                                    (copied): the side channel is authenticated and encrypted
                                    with it. An agent needs it unless _INSECURE is set */
    bool insecure;               /* _INSECURE: no auth key: the side channel is plain ZeroMQ
                                    and may listen only on loopback (127.0.0.0/8, localhost) */
    uint32_t max_peers;          /* _MAX_PEERS: listener: authenticated side-channel
                                    connections open at once (handshakes in progress are
                                    bounded apart); default KVX_DEFAULT_MAX_PEERS */
    uint32_t max_message;        /* _MAX_MESSAGE: listener: bytes of one side-channel message
                                    (a push request's ids, a push registration's metadata,
                                    33 bytes of CURVE framing included);
                                    8 messages queue per connection, so a listener holds at most
                                    max_peers * 8 * max_message; default
                                    KVX_DEFAULT_MAX_MESSAGE */
    uint32_t max_pushes;         /* _MAX_PUSHES: listener: pushes one peer may have in flight
                                    (fewer while others push: its fair share); default
                                    KVX_DEFAULT_MAX_PUSHES */
    const char *push_transports; /* _PUSH_TRANSPORTS: listener: the UCX_TLS list its push
                                   writers use: one transport that carries both the proof and
                                   the data to the requester's own process; default
                                   KVX_DEFAULT_PUSH_TRANSPORTS */
    uint32_t verify_one_in;      /* _VERIFY_ONE_IN: decode side: verify every Nth transfer
                                    posted (the 1st, the N+1st, ...) as kvx_xfer_verify on a
                                    transfer in progress does; 0 (default): none */
    uint32_t max_push_ms;        /* _MAX_PUSH_MS: listener: the longest a push may write; a push
                                    writes for as long as its requester waits (its timeout_ms,
                                    sent with it), at most this. A writer that completes nothing
                                    for timeout_ms fails sooner. Default KVX_DEFAULT_MAX_PUSH_MS */
} kvx_agent_params_t;

/* Registers `layout`, creates the transport, maps every storage once (the caller's memory or
 * memory kvx allocates), and binds the side channel when params ask to listen. */
KVX_API kvx_status_t kvx_agent_create(const kvx_layout_t *layout, const kvx_agent_params_t *params,
                                      kvx_agent_t **agent_p);

/* Destroys an agent, as uv_loop_close closes a loop: only once nothing depends on it. Every
 * peer must be destroyed and every transfer destroyed and settled (a transfer cancelled by
 * its destroy, or by its peer's, still runs its callback from the next progress); otherwise
 * KVX_ERR_BUSY, and nothing changed. Calls no callback. NULL-safe (KVX_OK). */
KVX_API kvx_status_t kvx_agent_destroy(kvx_agent_t *agent);

/* The region table, and the base address and size of storage `index` (kvx-allocated or the
 * caller's; for a "vram" storage a device address, which the host cannot dereference). */
KVX_API const kvx_regions_t *kvx_agent_regions(const kvx_agent_t *agent);
KVX_API void *kvx_agent_storage(const kvx_agent_t *agent, size_t index, uint64_t *size_p);

/* The memory kind of storage `index` (KVX_MEM_DRAM past the last one). */
KVX_API kvx_mem_type_t kvx_agent_storage_mem(const kvx_agent_t *agent, size_t index);

/* Copies `len` bytes of host memory at `src` into storage `index` from `offset` on, or out of
 * it into `dst`, whatever the storage's memory kind: memcpy for host memory, the CUDA driver
 * for GPU memory (a synchronous copy through pageable host memory, docs/gpu.md). What the
 * command line's fill and --verify use on "vram" storages. Errors: KVX_ERR_OUT_OF_RANGE for
 * a range past the storage's end or a storage that is not there (nothing copied), KVX_ERR_IO
 * for a failed device copy. */
KVX_API kvx_status_t kvx_agent_storage_write(kvx_agent_t *agent, size_t index, uint64_t offset,
                                             const void *src, size_t len);
KVX_API kvx_status_t kvx_agent_storage_read(const kvx_agent_t *agent, size_t index, uint64_t offset,
                                            void *dst, size_t len);

/* The "HOST:PORT" the side channel is bound to, with the real port when the agent was asked
 * to listen on port 0; NULL for an agent that does not listen. */
KVX_API const char *kvx_agent_listen_address(const kvx_agent_t *agent);

/* Runs the agent's loop for up to `timeout_ms` and returns after the first turn that handled
 * an event, or at the timeout; 0 turns once. Each turn runs five phases in order: progress UCX
 * (notifications, peers' operations that need us, the steps of transfers and pushes), serve
 * the side channel (metadata, heartbeats, pushes; replies to our requests), fire due timers
 * (transfer and push deadlines, heartbeats, leases), fail what peers that went down had in
 * flight (closing their connections), and run the queued completions: transfer callbacks,
 * release callbacks and log lines. Those run only here (and in kvx_xfer_wait, kvx_read and
 * kvx_write, which run this loop), never inside any other call. Between turns it sleeps on
 * kvx_agent_fd() until an event or the next deadline; only while UCX operations of its own
 * are in flight does it turn on for up to 200 us first, and then sleep at most 1 ms at a
 * time (UCX does not signal every local completion). Create agents after any fork(): UCX in
 * a child forked from a process with an agent does not work. */
KVX_API kvx_status_t kvx_agent_progress(kvx_agent_t *agent, int timeout_ms);

/* One descriptor an event loop (asyncio, libuv, epoll) waits on: it is readable when
 * kvx_agent_progress has work, including a deadline that came due. Call
 * kvx_agent_progress(agent, 0) then. It is valid while the agent lives; do not read or close
 * it. */
KVX_API int kvx_agent_fd(const kvx_agent_t *agent);

/* A histogram with power-of-two buckets: bucket 0 counts values <= 1, bucket i values in
 * (2^(i-1), 2^i], and the last one everything larger. */
#define KVX_HISTOGRAM_BUCKETS 40
typedef struct kvx_histogram {
    uint64_t count;
    double sum;
    uint64_t buckets[KVX_HISTOGRAM_BUCKETS];
} kvx_histogram_t;

/* Everything an agent counted since it was created, on either side. */
typedef struct kvx_agent_stats {
    /* decode side: transfers it read (pull) or asked to be written (push) */
    uint64_t transfers;            /* completed */
    uint64_t transfers_failed;     /* failed, cancelled or past their deadline */
    uint64_t bytes;                /* of completed transfers */
    uint64_t notifications_failed; /* done notifications that could not be sent (the read
                                      still succeeded; the peer's hold ends at its lease) */
    uint64_t heartbeats_sent;
    uint64_t heartbeats_missed;           /* heartbeats a peer did not answer in time */
    uint64_t peers_dead;                  /* declared dead: transport error, silence or restart */
    uint64_t peers_idle;                  /* dropped after the idle TTL */
    kvx_histogram_t transfer_us;          /* post to completion, microseconds */
    kvx_histogram_t post_us;              /* planning and posting, microseconds */
    kvx_histogram_t transfer_bytes;       /* bytes per transfer */
    kvx_histogram_t transfer_descriptors; /* descriptors posted per transfer */
    /* prefill side */
    uint64_t notifications;         /* done and heartbeat notifications received */
    uint64_t notifications_dropped; /* malformed: counted, ignored */
    uint64_t held;                  /* requests held now */
    uint64_t released;              /* after every consumer's done */
    uint64_t done_unknown;          /* done for a request not held (never, or released) */
    uint64_t leases_expired;
    /* added after version 0.1: callers built against a shorter struct pass its size */
    uint64_t done_repeated;   /* done from a rank that reported that request already */
    uint64_t ops_orphaned;    /* operation records UCX still owes a completion (gauge) */
    uint64_t pushes_serving;  /* prefill side: pushes in flight now (gauge) */
    uint64_t pushes_refused;  /* prefill side: push requests answered with an error */
    uint64_t auth_refused;    /* side-channel handshakes refused: no auth key or another one */
    uint64_t peers_refused;   /* connections refused past max_peers */
    uint64_t tokens_refused;  /* dones and heartbeats for a held request with a wrong token */
    uint64_t peers_connected; /* authenticated side-channel connections open now (gauge) */
    /* verification (kvx_xfer_verify, verify_one_in) */
    uint64_t transfers_verified;  /* decode side: verifications that compared every segment */
    uint64_t verify_mismatches;   /* decode side: segments whose checksums differed */
    uint64_t verify_failed;       /* decode side: verifications that could not finish (a
                                     refusal, a deadline, a peer down) */
    uint64_t verify_bytes_hashed; /* either side: bytes this agent hashed */
    uint64_t verify_ns;           /* either side: nanoseconds this agent spent hashing */
    uint64_t verify_served;       /* prefill side: checksum requests answered */
    uint64_t verify_refused;      /* prefill side: checksum requests refused (malformed, or a
                                     range outside our storages) */
    /* answered dones (issue 21) */
    uint64_t dones_refused; /* decode side: dones a prefill rank refused (wrong token, hold
                               released or expired, repeated, no such request), each failing
                               its read with KVX_ERR_PEER_REFUSED */
    uint64_t dones_early;   /* prefill side: dones and pushes with a token that came before
                               their hold and waited for it */
    /* the data plane kvx serves itself where UCX checks no key (TCP: docs/security.md) */
    uint64_t data_reads_served;  /* peers' reads of our storages answered */
    uint64_t data_writes_served; /* peers' writes into our storages (push) done */
    uint64_t data_refused;       /* peers' reads and writes refused: a wrong grant, a range
                                    outside every storage, a malformed message */
    /* ranks bound to holds (issue 22) */
    uint64_t dones_rank_refused; /* prefill side: dones and pushes with the token refused for
                                    their rank: not a consumer rank of the hold, reported over
                                    another connection, or a second rank of one connection */
    /* admission (issue 22): handshakes are not peers */
    uint64_t handshakes;         /* listener: side-channel connections open and not
                                    authenticated yet (gauge) */
    uint64_t handshakes_refused; /* listener: connections closed in their handshake, past the
                                    bound of handshakes or of one address's (docs/security.md) */
    /* what the prefill side served (issue 24): its reads are one-sided, so counted from the
       dones, which carry the bytes each decode rank read from it (docs/wire.md) */
    uint64_t served_transfers; /* prefill side: dones that read bytes from it, counted or not */
    uint64_t served_bytes;     /* prefill side: the bytes those dones say were read */
    /* push requests on the data plane (issue 23) */
    uint64_t pushes_by_message;     /* prefill side: push requests that came as messages on
                                       the data plane with a registered writer's handle */
    uint64_t push_messages_refused; /* prefill side: push request messages refused: no
                                       registered writer of their handle, malformed, or past
                                       the requests waiting to start */
    /* dones on the data plane (issue 23) */
    uint64_t dones_by_message; /* prefill side: dones that came as messages with a connection's
                                  done handle and were judged there */
    uint64_t dones_resent;     /* decode side: dones sent as messages that the prefill sent
                                  back (before their hold, an unknown handle, or sent with a
                                  read whose answer was not out yet) */
    uint64_t dones_with_reads; /* prefill side: of dones_by_message, those that came with their
                                  read (one message for a small pull: one round trip) */
    uint64_t pushes_as_reads;  /* decode side: pushes to prefills of this host carried as reads
                                  (kvx_write_post; docs/agent.md "Write") */
    uint64_t pushes_with_bytes; /* prefill side: pushes answered with their bytes, one message
                                   and no puts (a share of at most 64 KiB) */
    /* admission by source (issue 36) */
    uint64_t peers_evicted; /* listener: authenticated connections closed, at max_peers, to
                               admit one from an address that held two fewer (docs/security.md) */
} kvx_agent_stats_t;

/* What a field of kvx_agent_stats_t is, for the outputs that list every one (Prometheus,
 * kvx fetch --json, Python's Agent.stats()): they all walk one table, so a field added to
 * the struct and to the table (src/stats_fields.c) shows in each. */
typedef enum kvx_stat_kind {
    KVX_STAT_KIND_COUNTER   = 0, /* a uint64_t that only grows */
    KVX_STAT_KIND_GAUGE     = 1, /* a uint64_t level, now */
    KVX_STAT_KIND_HISTOGRAM = 2, /* a kvx_histogram_t */
} kvx_stat_kind_t;

typedef struct kvx_stat_field {
    const char *name;   /* the field's name in kvx_agent_stats_t: its key in JSON and Python */
    const char *metric; /* its Prometheus name, after "kvx_" */
    const char *help;   /* Prometheus's HELP line: one sentence */
    kvx_stat_kind_t kind;
    size_t offset; /* of the field in kvx_agent_stats_t */
    double scale;  /* Prometheus's unit in the field's: 1e-6 for microseconds shown as
                      seconds; 1 when the field is shown as counted */
} kvx_stat_field_t;

/* Every field of kvx_agent_stats_t, in the struct's order, *count_p of them: a static table,
 * valid for the life of the process. Any thread. */
KVX_API const kvx_stat_field_t *kvx_agent_stats_fields(size_t *count_p);

/* Copies the first `size` bytes of the agent's counters (pass sizeof(kvx_agent_stats_t)):
 * fields are only ever added at the end, so a caller built against an older, shorter struct
 * keeps working. */
KVX_API void kvx_agent_stats(const kvx_agent_t *agent, kvx_agent_stats_t *stats_p, size_t size);

/* `stats` in the Prometheus text exposition format (version 0.0.4), every metric labelled
 * agent="`agent_name`": malloc'd, NUL-terminated; free() it. */
KVX_API kvx_status_t kvx_agent_stats_prometheus(const kvx_agent_stats_t *stats,
                                                const char *agent_name, char **text_p);

/* One line per state change (peer connected, dead, restarted, dropped when idle; transfer
 * failed; lease expired), never per block. Lines are queued (at most 64 between two
 * completion phases; more are counted in one "dropped" line) and delivered from the
 * completion phase of kvx_agent_progress, like every other callback. While a callback is
 * set, UCX's own warnings and errors come as lines too ("UCX WARN: ...") and UCX no longer
 * prints them; those of a closing connection's worker about what a dead peer left pending
 * are summed in one line (docs/agent.md, "Served, logged, and UCX's own lines"). */
typedef void (*kvx_log_cb_t)(void *arg, const char *line);

KVX_API void kvx_agent_set_log_callback(kvx_agent_t *agent, kvx_log_cb_t callback, void *arg);

/* Which lines reach the log callback. KVX_LOG_WARN: what went wrong or was refused (a peer
 * down, a transfer failed, a lease expired, a refused done or connection, rate-limited where a
 * peer could repeat it at will; UCX's own warnings). KVX_LOG_INFO (the default): those, and
 * every state change that went as it should (a peer connected or admitted, a done counted, a
 * hold released). */
typedef enum kvx_log_level {
    KVX_LOG_WARN = 0,
    KVX_LOG_INFO = 1,
} kvx_log_level_t;

KVX_API void kvx_agent_set_log_level(kvx_agent_t *agent, kvx_log_level_t level);

/* Called once per held request when it is released: every consumer rank reported `done`, or
 * its lease expired. The block ids are those given to kvx_hold, valid during the call. Runs
 * from the completion phase of kvx_agent_progress. */
typedef void (*kvx_release_cb_t)(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                                 size_t num_groups);

KVX_API void kvx_agent_set_release_callback(kvx_agent_t *agent, kvx_release_cb_t callback,
                                            void *arg);

/* A new random hold token (128 bits from the system's random source). */
KVX_API kvx_status_t kvx_token_generate(kvx_token_t *token_p);

/* Prefill side: holds request `request_id`'s blocks (copied) until `consumers` distinct decode
 * ranks reported `done` for it (a pull's done, or a push with the token), or until its lease (the
 * agent's lease_ms) expires without being extended by a heartbeat, then releases them through the
 * callback. `token` is the hold's capability (copied): a `done` or heartbeat counts only when it
 * comes over the authenticated side channel and carries it (kvx_request_t.token, kvx_want); any
 * other is counted in tokens_refused and changes nothing. Make it with kvx_token_generate, once per
 * request, and give the same one to every prefill rank that holds part of the request, since
 * a decode rank presents one token to all of them. Each `done` names its sender's TP rank,
 * and a rank counts once: a repeated or retried `done` from a rank that reported already
 * changes nothing (counted in done_repeated), so it can never release blocks another rank
 * has not read yet. Every done is answered (docs/agent.md, "Answered dones"): one that did not
 * count (a wrong token, a repeat, a request whose hold ended: the last 4096 ends are
 * remembered) is refused and changes nothing, and fails its transfer. A done or push with a
 * token for a request not held yet waits (at most 4096, each up to the agent's timeout_ms)
 * and is applied by this call, as if it had just arrived. Errors: KVX_ERR_INVALID for a
 * request already held, no token, consumers outside 1..KVX_MAX_TP, or more than KVX_MAX_HELD
 * requests. */
#define KVX_MAX_HELD 65536 /* requests held at once by one agent */
KVX_API kvx_status_t kvx_hold(kvx_agent_t *agent, uint64_t request_id,
                              const kvx_group_ids_t *groups, size_t num_groups, uint32_t consumers,
                              const kvx_token_t *token);

/* Decode side: tells each prefill rank in `peers` now that the requests `request_ids` are
 * still wanted, extending their leases to max(old, now + 2/3 lease); tokens[i] is request i's
 * hold token (the lease of a hold is extended only with it). At most 65,536 ids.
 * kvx_agent_progress does the same on its own every heartbeat_ms for the ids kvx_want
 * registered; this call is for engines that keep their own list. */
KVX_API kvx_status_t kvx_heartbeat(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                                   const uint64_t *request_ids, const kvx_token_t *tokens,
                                   size_t count);

/* Decode side: request `request_id` (whose hold token is `token`) is wanted from each of
 * `peers`: progress's heartbeats carry it (keeping its lease alive on the prefill side) until a
 * transfer of it completes or kvx_unwant (an abort) removes it. */
KVX_API kvx_status_t kvx_want(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                              uint64_t request_id, const kvx_token_t *token);
KVX_API void kvx_unwant(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                        uint64_t request_id);

/* Decode side: asks the agent listening at `address` ("HOST:PORT") for its metadata, checks
 * it (compatibility hash, then the region table against ours with the TP sizes of both),
 * connects the transport and unpacks the remote keys. Errors name the failing step. */
KVX_API kvx_status_t kvx_agent_connect(kvx_agent_t *agent, const char *address,
                                       kvx_peer_t **peer_p);

/* Decode side, before an agent exists: the checks of kvx_agent_connect's handshake without
 * its memory. Fetches the metadata of the agent listening at `address` over the side channel
 * that `params` describe (its auth key or insecure, timeout_ms, and our tp_rank and tp_size;
 * the rest is ignored) and checks it against `local` as a connect would: the compatibility
 * hash, then the region table. So a worker with a large cache can learn that nothing listens
 * there, that the key or the layout differs, before it allocates and touches gigabytes
 * (kvx fetch does). Maps no memory, opens no transport, keeps nothing: KVX_OK says a connect
 * made now would pass these checks (the transport's own, such as TCP segment sizes, come with
 * the connect). Errors as kvx_agent_connect's, naming the peer: KVX_ERR_PEER_DOWN when nothing
 * listens at the address (connection refused), so a caller may try again while a prefill
 * worker starts. */
KVX_API kvx_status_t kvx_peer_probe(const kvx_regions_t *local, const kvx_agent_params_t *params,
                                    const char *address);

/* Destroys a peer: every transfer in flight with it fails with KVX_ERR_CANCELED (its callback
 * runs from the next progress, not from here), and its connection is closed before this
 * returns, so nothing it had posted writes our memory afterwards. NULL-safe. */
KVX_API void kvx_peer_destroy(kvx_peer_t *peer);

/* NULL while the peer is usable; otherwise why it is not: dead (a transport error, no
 * heartbeat answer for three intervals, or a restart: another instance answers at its
 * address) or dropped after the idle TTL. Every transfer in flight with a dead peer failed
 * with that reason. */
KVX_API const char *kvx_peer_down_reason(const kvx_peer_t *peer);

/* Handshakes again with the peer's address and replaces the connection in place (the handle
 * stays valid): after it went down, or to pick up a prefill process that restarted. A peer
 * that is still up is closed first (its transfers fail with KVX_ERR_CANCELED). On failure the
 * peer stays down, valid and destroyable. */
KVX_API kvx_status_t kvx_peer_reconnect(kvx_peer_t *peer);

/* The transports UCX really uses for a peer, lane by lane with their roles, once a read
 * wired the endpoint up ("sysv(am) posix cma(rma_bw)"); before that, the list it was given. */
KVX_API const char *kvx_peer_transports(const kvx_peer_t *peer);

typedef struct kvx_read_stats {
    uint64_t descriptors; /* pairs before coalescing */
    uint64_t posted;      /* pairs after coalescing: operations posted */
    uint64_t bytes;
    double seconds; /* from the first post to the last completion */
} kvx_read_stats_t;

typedef struct kvx_xfer kvx_xfer_t;

/* Called exactly once when a posted transfer completes, fails or is cancelled, from the
 * completion phase of kvx_agent_progress() (or kvx_xfer_wait(), which runs it), never inside
 * any other call. It may post and destroy transfers, its own included, unless a
 * kvx_xfer_wait() is waiting on its own. */
typedef void (*kvx_xfer_cb_t)(void *arg, kvx_xfer_t *xfer, kvx_status_t status);

/* Posts a pull of one request (as kvx_read, without waiting) and returns its handle, in
 * microseconds whatever the request's size: reads that are same-host copies beyond a small
 * budget are made by progress, a slice a turn (docs/agent.md, "Nothing blocks the caller"). The
 * agent's progress sends the `done` notifications once every get completed, completes it
 * with KVX_OK once every prefill rank answered that its done counted (its hold was alive,
 * with request->token; or it held nothing and no token was given), and calls `callback`
 * (may be NULL). A refused done (wrong token, a repeat, the hold released already or its
 * lease expired, no such request) fails it with KVX_ERR_PEER_REFUSED and
 * "read ID: remote rank R: REASON", no answer by the deadline with KVX_ERR_PEER_TIMEOUT;
 * either way the bytes that arrived must not be used (they may be another request's), the
 * peers stay up, and kvx_xfer_failed_blocks() lists every block. Each rank's pairs come from that
 * rank's own table: ranks whose tables are the same (equal SHA-256 digests, checked at connect)
 * share one plan, and a rank whose table differs is planned on its own. A transfer that misses the
 * agent's deadline fails with KVX_ERR_PEER_TIMEOUT, one whose gets fail or whose peer goes down
 * with KVX_ERR_PEER_DOWN, as a whole: the peers it was reading from are closed (their connections,
 * and with them every pending get, end before the failure is reported; reconnect to use them)
 * and kvx_xfer_failed_blocks() lists the block ids not loaded. On error nothing was posted
 * and the callback never fires. */
KVX_API kvx_status_t kvx_read_post(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                                   uint64_t request_id, const kvx_request_t *request,
                                   kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p);

/* KVX_INPROGRESS, KVX_OK, or the error of a failed transfer (message in kvx_xfer_error). */
KVX_API kvx_status_t kvx_xfer_status(const kvx_xfer_t *xfer);
KVX_API const char *kvx_xfer_error(const kvx_xfer_t *xfer);

/* The local block ids (per group, as posted) that a failed transfer did not load: all of
 * them, since a failed transfer is never partly reported as done. Empty unless failed. */
KVX_API void kvx_xfer_failed_blocks(const kvx_xfer_t *xfer, const kvx_group_ids_t **groups_p,
                                    size_t *num_groups_p);

/* Progresses the agent until the transfer completed or failed; returns its final status. */
KVX_API kvx_status_t kvx_xfer_wait(kvx_xfer_t *xfer);

/* Bytes, descriptors and time of a completed transfer. */
KVX_API void kvx_xfer_stats(const kvx_xfer_t *xfer, kvx_read_stats_t *stats_p);

/* Releases a transfer. One still in progress is cancelled first: its peers are closed before
 * this returns, and its callback fires once with KVX_ERR_CANCELED from progress (the next one,
 * unless a closed connection still settles UCX's local copies, for at most 1 s: docs/agent.md
 * "Closing"), after which kvx frees it. No get writes our memory once that callback ran; the
 * blocks are the caller's again from then. The handle must not be used after this call
 * either way. Returns without waiting. NULL-safe. */
KVX_API void kvx_xfer_destroy(kvx_xfer_t *xfer);

/* Pulls one request from the prefill ranks in `peers` (one per remote TP rank this rank
 * reads from, in any order): plans it, gets every pair, and once all data is here sends a
 * `done` notification for `request_id` to each rank read from, and waits for their answers
 * (as kvx_read_post). Blocks until done or failed; on a failure of the gets nothing is
 * notified, and the message names the peer and step. */
KVX_API kvx_status_t kvx_read(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                              uint64_t request_id, const kvx_request_t *request,
                              kvx_read_stats_t *stats_p);

/* Push mode: asks each prefill rank in `peers` that holds part of the request to write it
 * into this agent's blocks (it plans from our side, puts, flushes and answers; a share of at
 * most 64 KiB of host memory it sends in its answer instead, which we copy where our own plan
 * puts it). kvx_write_post returns at once with a transfer handle, completed by
 * progress like a pull, the first push to a peer included (its writer's registration is
 * carried by progress under the transfer's deadline); kvx_write posts and waits. A rank's refusal
 * fails it with KVX_ERR_PEER_REFUSED and the writer's message, no answer within the deadline with
 * KVX_ERR_PEER_TIMEOUT. With request->token, each rank's push is that decode rank's done for
 * the prefill side's hold: checked before anything is written (a wrong token, a repeat or
 * an ended hold is refused), waiting for the hold when it is not made yet, and counted once
 * written, so the hold is released when every consumer pushed; without one no hold is
 * involved. A prefill rank writes for as long as this agent waits (its timeout_ms, sent
 * with each push), at most the prefill's max_push_ms, and stops sooner when its writer
 * completes nothing for the prefill's timeout_ms; blocks of a failed push may still change
 * until then. The pairs and stats are our own plan's, as for kvx_read.
 * On one host (every peer reached over shared memory or CMA), a push goes as kvx_read_post
 * does, with a read's guarantees: the prefill's writers take only TCP (docs/security.md),
 * and our own read moves the same bytes over shared memory and sends the done a push would
 * count. Its token is judged with its done, after the bytes were read (a refusal fails it,
 * and the blocks may hold what was read), and a done before its hold waits for it as a
 * read's does. Counted in pushes_as_reads; KVX_PUSH_ON_ONE_HOST=writers in the environment
 * when the agent is made keeps every push on the writers. */
KVX_API kvx_status_t kvx_write_post(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                                    uint64_t request_id, const kvx_request_t *request,
                                    kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p);
KVX_API kvx_status_t kvx_write(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                               uint64_t request_id, const kvx_request_t *request,
                               kvx_read_stats_t *stats_p);

/* Verification (docs/agent.md, "Verification"): the decode side asks each prefill rank a
 * transfer read from (pull) or was written by (push) for the XXH3-64 checksums of exactly the
 * byte ranges of its memory that were the source, one per (region, block) segment of the
 * transfer's pairs, and compares them with the checksums of what landed in its own memory. */
#define KVX_VERIFY_MAX_REPORTED 64 /* mismatches a result lists; all are counted */

typedef struct kvx_verify_mismatch {
    size_t region;           /* index in the local table; SIZE_MAX: bytes in no region */
    const char *region_name; /* its name (its first view's); "" for no region */
    size_t num_views;        /* the region's member views (layout indices), whose names */
    const uint32_t *views;   /* kvx_regions_view_name gives */
    uint64_t block;          /* the region's local block (UINT64_MAX: no region) */
    uint64_t descriptor;     /* its local descriptor id */
    uint32_t remote_rank;    /* the prefill rank that holds the source */
    uint64_t remote_block;   /* that rank's block of the same region (UINT64_MAX: none) */
    kvx_pair_t range;        /* the bytes compared: local and remote storage and offset */
    uint64_t local_checksum;
    uint64_t remote_checksum;
} kvx_verify_mismatch_t;

typedef struct kvx_verify_result {
    bool requested;      /* the transfer was verified, or is being verified */
    kvx_status_t status; /* KVX_INPROGRESS, KVX_OK (all equal), KVX_ERR_MISMATCH, or why the
                            verification could not finish (refused, timeout, peer down) */
    uint64_t segments;   /* (region, block) segments compared */
    uint64_t bytes;      /* bytes hashed on each side */
    uint64_t mismatches; /* segments whose checksums differ */
    double seconds;      /* from the first checksum request to the last answer */
    uint64_t pending;    /* segments not compared yet: > 0 from when the verification began
                            (a pull's gets all completed) until every answer came */
    size_t num_reported; /* the first min(mismatches, KVX_VERIFY_MAX_REPORTED) of them: */
    const kvx_verify_mismatch_t *reported; /* valid until the transfer is verified again or
                                              destroyed */
} kvx_verify_result_t;

/* Verifies a transfer. On a transfer in progress (pull or push): marks it to be verified
 * before it completes: a pull compares once every get completed and before its `done`
 * notifications (so the prefill side still holds the blocks unchanged), a push once every
 * rank answered; the transfer then completes with KVX_OK, or fails with KVX_ERR_MISMATCH
 * (kvx_xfer_error names the first segment that differs: region, block, views, both sides) or
 * with the verification's failure; returns KVX_OK at once. On a completed transfer: verifies
 * now, running the agent's loop until every answer came or the agent's timeout passed, and
 * returns KVX_OK, KVX_ERR_MISMATCH or the failure; a pull's prefill side may have reused its
 * blocks after the done by then, so verify before completion where that matters. The peers
 * must still be up, and the transfer must not be destroyed while this runs. Errors:
 * KVX_ERR_INVALID for a failed or cancelled transfer, or one being verified already. */
KVX_API kvx_status_t kvx_xfer_verify(kvx_xfer_t *xfer);

/* The transfer's last verification; result_p->requested is false if it had none. */
KVX_API void kvx_xfer_verify_result(const kvx_xfer_t *xfer, kvx_verify_result_t *result_p);

/* The pairs of the agent's last successful kvx_read (remote storage indices are the peers'),
 * valid until its next read: what a caller checks the transferred bytes against. */
KVX_API const kvx_pairs_t *kvx_agent_last_pairs(const kvx_agent_t *agent);

/* Known bytes, for testing a deployment end to end when kvx may fill the prefill side's
 * memory (kvx serve --fill, kvx fetch --verify --fill, kvx demo); otherwise verify with
 * checksums (kvx_xfer_verify). Byte o of TP rank r's storage s is a function of (seed, r, s,
 * o), so a byte from the wrong rank, storage or offset differs. GPU storages are written and
 * read through host memory (docs/gpu.md). kvx_agent_fill_pattern fills every storage with
 * this agent's rank's pattern; kvx_agent_zero zeroes every storage. kvx_agent_check_pattern
 * checks the agent's last transfer (kvx_agent_last_pairs): every byte moved against the
 * pattern of its source, then every byte outside the transfer still zero, as after a zero.
 * It returns KVX_OK or KVX_ERR_MISMATCH, with the first wrong byte in kvx_errmsg(): where on
 * both sides, and the bytes expected and found. */
KVX_API kvx_status_t kvx_agent_fill_pattern(kvx_agent_t *agent, uint64_t seed);
KVX_API kvx_status_t kvx_agent_zero(kvx_agent_t *agent);
KVX_API kvx_status_t kvx_agent_check_pattern(const kvx_agent_t *agent, uint64_t seed);

/* The fill and the zeroing above for `len` bytes of storage `index` from `offset` on: the
 * same bytes as the whole-storage calls put there, so a caller can fill gigabytes in steps
 * and say how far it got (kvx serve and kvx fetch on a terminal). Errors: KVX_ERR_OUT_OF_RANGE
 * for a range past the storage's end or a storage that is not there (nothing written),
 * KVX_ERR_IO for a failed device copy. */
KVX_API kvx_status_t kvx_agent_fill_pattern_range(kvx_agent_t *agent, uint64_t seed, size_t index,
                                                  uint64_t offset, uint64_t len);
KVX_API kvx_status_t kvx_agent_zero_range(kvx_agent_t *agent, size_t index, uint64_t offset,
                                          uint64_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVX_H */
