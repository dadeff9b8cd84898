/* layouts.c: test helpers that turn single-quoted JSON into layouts and region tables, and
 * read files of the source tree. */
#include "layouts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvx_status_t layout_from_quoted(const char *quoted, kvx_layout_t **layout_p)
{
    size_t size = strlen(quoted);
    char *json  = malloc(size + 1);
    kvx_status_t status;

    if (json == NULL)
        return KVX_ERR_NO_MEMORY;
    for (size_t i = 0; i <= size; i++)
        json[i] = quoted[i] == '\'' ? '"' : quoted[i];
    status = kvx_layout_load_buffer(json, size, layout_p);
    free(json);
    return status;
}

kvx_status_t regions_from_quoted(const char *quoted, kvx_regions_t **regions_p)
{
    kvx_layout_t *layout;
    kvx_status_t status = layout_from_quoted(quoted, &layout);

    if (status != KVX_OK)
        return status;
    status = kvx_regions_register(layout, regions_p);
    kvx_layout_destroy(layout);
    return status;
}

char *source_file_read(const char *relative_path, size_t *size_p)
{
    const char *root = getenv("KVX_SOURCE_DIR");
    char path[4096];
    FILE *file;
    char *buffer;
    long size;

    snprintf(path, sizeof(path), "%s/%s", root != NULL ? root : ".", relative_path);
    file = fopen(path, "rb");
    if (file == NULL)
        return NULL;
    if (fseek(file, 0, SEEK_END) != 0 || (size = ftell(file)) < 0 ||
        fseek(file, 0, SEEK_SET) != 0) {
        fclose(file);
        return NULL;
    }
    buffer = malloc((size_t)size + 1);
    if (buffer != NULL && fread(buffer, 1, (size_t)size, file) != (size_t)size) {
        free(buffer);
        buffer = NULL;
    }
    fclose(file);
    if (buffer == NULL)
        return NULL;
    buffer[size] = '\0';
    if (size_p != NULL)
        *size_p = (size_t)size;
    return buffer;
}
