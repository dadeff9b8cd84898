/* layouts.h: helpers shared by the tests that build layouts from JSON written with single
 * quotes (so C strings stay readable) and register them. */
#ifndef KVX_TESTS_LAYOUTS_H
#define KVX_TESTS_LAYOUTS_H

#include "kvx.h"

/* Loads `quoted` (JSON with ' for ") into *layout_p; returns the status, as the library. */
kvx_status_t layout_from_quoted(const char *quoted, kvx_layout_t **layout_p);

/* Loads and registers `quoted`; returns the status. *regions_p is set on success only. */
kvx_status_t regions_from_quoted(const char *quoted, kvx_regions_t **regions_p);

/* Reads a whole file under the source tree ($KVX_SOURCE_DIR or the current directory) into
 * a NUL-terminated buffer the caller frees; NULL on failure. */
char *source_file_read(const char *relative_path, size_t *size_p);

#endif
