/* block_ids.h: the --blocks syntax of the command line, 'G:ids;G:ids' with ids as
 * comma-separated numbers or ranges (0-99), into per-group arrays for kvx_request_t. */
#ifndef KVX_TOOLS_BLOCK_IDS_H
#define KVX_TOOLS_BLOCK_IDS_H

#include "kvx.h"

#include <stdio.h>

struct block_ids {
    kvx_group_ids_t *groups; /* indexed by group id; groups not named are empty */
    size_t num_groups;
};

/* Parses `text` for option `option` (named in messages). On error prints nothing, returns
 * false and leaves a message in `error` (size bytes). */
bool block_ids_parse(const char *option, const char *text, struct block_ids *out, char *error,
                     size_t size);

void block_ids_free(struct block_ids *ids);

/* Checks `ids` against the region table of the layout file at `layout_path` the way a
 * request is checked (kvx_regions_request_ids: every group the table uses named, every id
 * in range), so that a command can refuse bad --blocks before it allocates or connects.
 * On failure kvx_errmsg() holds the library's message. */
kvx_status_t block_ids_check_layout(const char *layout_path, const struct block_ids *ids);

/* Prints `groups` in the --blocks syntax ('G:ids;G:ids', runs of ids as ranges, empty groups
 * left out), so a message can name block ids the way the command line takes them. */
void block_ids_print(FILE *out, const kvx_group_ids_t *groups, size_t num_groups);

#endif
