/* layout_file.c: the strict reader of layout files (spec formats.md, "kvx_layout": 1). It
 * turns JSON into kvx_layout_add_* calls, so a file and the API share every rule. */
#include "layout.h"

#include "error.h"
#include "text.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The JSON path of a value, views[12].stride or block_size, kept as its two parts and
 * formatted only when an error names it: formatting every path cost a third of a load. */
struct json_path {
    const char *parent; /* "views[12]", or "" at the top level */
    const char *key;
};

#define PATH_FMT        "%s%s%s"
#define PATH_ARGS(path) (path).parent, (path).parent[0] != '\0' ? "." : "", (path).key
#define TOP_LEVEL(key)  ((struct json_path){"", (key)})

/* Room for "storages[<20 digits>]". */
#define PARENT_MAX_LEN 40

/* `text` escaped into `out` (TEXT_ESCAPED_MAX bytes) for a message: a key or value that is
 * not what the reader expects may hold any bytes, and a message never prints them raw. */
static const char *quote(char *out, const char *text)
{
    text_escape(out, TEXT_ESCAPED_MAX, text, strlen(text));
    return out;
}

/* Fails unless every member of `object` is one of `keys` and none repeats. cJSON keeps
 * duplicate keys and finds the first, so a repeat would silently hide a value. */
static kvx_status_t check_keys(const cJSON *object, const char *path, const char *const *keys,
                               size_t num_keys)
{
    for (const cJSON *item = object->child; item != NULL; item = item->next) {
        bool known = false;

        for (size_t k = 0; k < num_keys && !known; k++)
            known = strcmp(item->string, keys[k]) == 0;
        if (!known) {
            char quoted[TEXT_ESCAPED_MAX];

            return error_set(KVX_ERR_INVALID, "%s: unknown key \"%s\"", path,
                             quote(quoted, item->string));
        }
        for (const cJSON *prev = object->child; prev != item; prev = prev->next) {
            if (strcmp(prev->string, item->string) == 0)
                return error_set(KVX_ERR_INVALID, "%s: key \"%s\" appears twice", path,
                                 item->string);
        }
    }
    return KVX_OK;
}

/* Reads a non-negative integer no larger than KVX_MAX_JSON_INTEGER: a count, size or id. */
static kvx_status_t read_uint(const cJSON *item, struct json_path path, uint64_t *value_p)
{
    double d;

    if (!cJSON_IsNumber(item))
        return error_set(KVX_ERR_INVALID, PATH_FMT ": expected an integer", PATH_ARGS(path));
    d = item->valuedouble;
    if (d < 0)
        return error_set(KVX_ERR_INVALID, PATH_FMT ": %g is negative", PATH_ARGS(path), d);
    if (d > (double)KVX_MAX_JSON_INTEGER)
        return error_set(KVX_ERR_INVALID,
                         PATH_FMT ": %g is larger than 2^53, the largest integer"
                                  " JSON keeps exact",
                         PATH_ARGS(path), d);
    if (d != floor(d))
        return error_set(KVX_ERR_INVALID, PATH_FMT ": %g is not an integer", PATH_ARGS(path), d);
    *value_p = (uint64_t)d;
    return KVX_OK;
}

static kvx_status_t read_bool(const cJSON *item, struct json_path path, bool *value_p)
{
    if (!cJSON_IsBool(item))
        return error_set(KVX_ERR_INVALID, PATH_FMT ": expected true or false", PATH_ARGS(path));
    *value_p = cJSON_IsTrue(item);
    return KVX_OK;
}

static kvx_status_t read_string(const cJSON *item, struct json_path path, const char **value_p)
{
    if (!cJSON_IsString(item))
        return error_set(KVX_ERR_INVALID, PATH_FMT ": expected a string", PATH_ARGS(path));
    *value_p = item->valuestring;
    return KVX_OK;
}

/* The member `key` of `object`, NULL if absent; *path_p names it for errors. */
static const cJSON *field(const cJSON *object, const char *parent, const char *key,
                          struct json_path *path_p)
{
    *path_p = (struct json_path){parent, key};
    return cJSON_GetObjectItemCaseSensitive(object, key);
}

/* Fails unless `object` is a JSON object holding only `keys`, each once. */
static kvx_status_t object_check(const cJSON *object, const char *parent, const char *const *keys,
                                 size_t num_keys)
{
    if (!cJSON_IsObject(object))
        return error_set(KVX_ERR_INVALID, "%s: expected an object", parent);
    return check_keys(object, parent, keys, num_keys);
}

static kvx_status_t missing(struct json_path path)
{
    return error_set(KVX_ERR_INVALID, PATH_FMT ": missing (required)", PATH_ARGS(path));
}

/* Reads the required integer or string `key` of an object into *value_p. */
static kvx_status_t read_required_uint(const cJSON *object, const char *parent, const char *key,
                                       uint64_t *value_p)
{
    struct json_path path;
    const cJSON *item = field(object, parent, key, &path);

    return item == NULL ? missing(path) : read_uint(item, path, value_p);
}

static kvx_status_t read_required_string(const cJSON *object, const char *parent, const char *key,
                                         const char **value_p)
{
    struct json_path path;
    const cJSON *item = field(object, parent, key, &path);

    return item == NULL ? missing(path) : read_string(item, path, value_p);
}

static kvx_status_t read_storage(kvx_layout_t *layout, const cJSON *object, size_t i)
{
    static const char *const keys[] = {"name", "size", "mem", "device"};
    kvx_storage_params_t p          = {0};
    char parent[PARENT_MAX_LEN];
    char quoted[TEXT_ESCAPED_MAX];
    struct json_path path;
    const cJSON *item;
    kvx_status_t status;
    uint64_t device;
    const char *mem = NULL;

    snprintf(parent, sizeof(parent), "storages[%zu]", i);
    status = object_check(object, parent, keys, sizeof(keys) / sizeof(keys[0]));
    if (status != KVX_OK)
        return status;

    if ((status = read_required_string(object, parent, "name", &p.name)) != KVX_OK ||
        (status = read_required_uint(object, parent, "size", &p.size)) != KVX_OK)
        return status;
    if ((item = field(object, parent, "mem", &path)) != NULL) {
        if ((status = read_string(item, path, &mem)) != KVX_OK)
            return status;
        if (!layout_mem_type_parse(mem, &p.mem))
            return error_set(KVX_ERR_INVALID, PATH_FMT ": \"%s\" is not dram or vram",
                             PATH_ARGS(path), quote(quoted, mem));
        p.field_mask |= KVX_STORAGE_PARAM_FIELD_MEM;
    }
    if ((item = field(object, parent, "device", &path)) != NULL) {
        if ((status = read_uint(item, path, &device)) != KVX_OK)
            return status;
        p.device = (int64_t)device;
        p.field_mask |= KVX_STORAGE_PARAM_FIELD_DEVICE;
    }
    return kvx_layout_add_storage(layout, &p);
}

static kvx_status_t read_view(kvx_layout_t *layout, const cJSON *object, size_t i)
{
    static const char *const keys[] = {"name", "group",  "kind",       "storage", "offset",
                                       "page", "stride", "num_blocks", "dense",   "heads"};
    kvx_view_params_t p             = {0};
    char parent[PARENT_MAX_LEN];
    char quoted[TEXT_ESCAPED_MAX];
    struct json_path path;
    const cJSON *item;
    const char *kind = NULL;
    uint64_t group;
    kvx_status_t status;

    snprintf(parent, sizeof(parent), "views[%zu]", i);
    status = object_check(object, parent, keys, sizeof(keys) / sizeof(keys[0]));
    if (status != KVX_OK)
        return status;

    if ((status = read_required_string(object, parent, "name", &p.name)) != KVX_OK ||
        (status = read_required_string(object, parent, "kind", &kind)) != KVX_OK)
        return status;
    if (!layout_view_kind_parse(kind, &p.kind))
        return error_set(KVX_ERR_INVALID,
                         PATH_FMT ": \"%s\" is not one of attn, swa, mla, swa_mla,"
                                  " scratch, mamba, ple",
                         PATH_ARGS(((struct json_path){parent, "kind"})), quote(quoted, kind));
    if ((status = read_required_string(object, parent, "storage", &p.storage)) != KVX_OK)
        return status;
    if ((status = read_required_uint(object, parent, "page", &p.page)) != KVX_OK ||
        (status = read_required_uint(object, parent, "stride", &p.stride)) != KVX_OK ||
        (status = read_required_uint(object, parent, "num_blocks", &p.num_blocks)) != KVX_OK)
        return status;

    if ((item = field(object, parent, "group", &path)) != NULL) {
        if ((status = read_uint(item, path, &group)) != KVX_OK)
            return status;
        p.group = (int64_t)group;
        p.field_mask |= KVX_VIEW_PARAM_FIELD_GROUP;
    }
    if ((item = field(object, parent, "offset", &path)) != NULL) {
        if ((status = read_uint(item, path, &p.offset)) != KVX_OK)
            return status;
        p.field_mask |= KVX_VIEW_PARAM_FIELD_OFFSET;
    }
    if ((item = field(object, parent, "dense", &path)) != NULL) {
        if ((status = read_bool(item, path, &p.dense)) != KVX_OK)
            return status;
        p.field_mask |= KVX_VIEW_PARAM_FIELD_DENSE;
    }
    if ((item = field(object, parent, "heads", &path)) != NULL) {
        if ((status = read_uint(item, path, &p.heads)) != KVX_OK)
            return status;
        p.field_mask |= KVX_VIEW_PARAM_FIELD_HEADS;
    }
    return kvx_layout_add_view(layout, &p);
}

/* Reads the optional "model" object: the compatibility factors (docs/wire.md). */
static kvx_status_t read_model(kvx_layout_t *layout, const cJSON *root)
{
    static const char *const keys[]    = {"id",       "revision",  "dtype",  "cache_dtype",
                                          "kv_heads", "head_size", "layers", "backend"};
    static const char *const strings[] = {"id", "revision", "dtype", "cache_dtype", "backend"};
    const char *values[5]              = {NULL};
    const cJSON *object                = cJSON_GetObjectItemCaseSensitive(root, "model");
    kvx_model_t model                  = {0};
    struct json_path path;
    const cJSON *item;
    kvx_status_t status;

    if (object == NULL)
        return KVX_OK;
    if (!cJSON_IsObject(object))
        return error_set(KVX_ERR_INVALID, "model: expected an object");
    status = check_keys(object, "model", keys, sizeof(keys) / sizeof(keys[0]));
    if (status != KVX_OK)
        return status;
    for (size_t i = 0; i < 5; i++) {
        if ((item = field(object, "model", strings[i], &path)) != NULL &&
            (status = read_string(item, path, &values[i])) != KVX_OK)
            return status;
    }
    if (values[0] == NULL)
        return missing((struct json_path){"model", "id"});
    if (((item = field(object, "model", "kv_heads", &path)) != NULL &&
         (status = read_uint(item, path, &model.kv_heads)) != KVX_OK) ||
        ((item = field(object, "model", "head_size", &path)) != NULL &&
         (status = read_uint(item, path, &model.head_size)) != KVX_OK) ||
        ((item = field(object, "model", "layers", &path)) != NULL &&
         (status = read_uint(item, path, &model.layers)) != KVX_OK))
        return status;
    model.id          = values[0];
    model.revision    = values[1];
    model.dtype       = values[2];
    model.cache_dtype = values[3];
    model.backend     = values[4];
    return kvx_layout_set_model(layout, &model);
}

/* Reads the array `key` of the top-level object, calling read_one on each element. */
static kvx_status_t read_array(kvx_layout_t *layout, const cJSON *root, const char *key,
                               kvx_status_t (*read_one)(kvx_layout_t *, const cJSON *, size_t))
{
    const cJSON *array = cJSON_GetObjectItemCaseSensitive(root, key);
    const cJSON *item;
    size_t i = 0;
    kvx_status_t status;

    if (array == NULL)
        return error_set(KVX_ERR_INVALID, "%s: missing (required)", key);
    if (!cJSON_IsArray(array))
        return error_set(KVX_ERR_INVALID, "%s: expected an array", key);
    if (array->child == NULL)
        return error_set(KVX_ERR_INVALID, "%s: is empty", key);
    cJSON_ArrayForEach(item, array)
    {
        status = read_one(layout, item, i++);
        if (status != KVX_OK)
            return status;
    }
    return KVX_OK;
}

/* Reads the layout-wide keys into params. */
static kvx_status_t read_layout_params(const cJSON *root, kvx_layout_params_t *p)
{
    static const char *const keys[] = {
        "kvx_layout", "block_size", "csa_linear", "whole_row_regions",
        "model",      "storages",   "views"};
    const cJSON *item;
    uint64_t version;
    kvx_status_t status;

    if (!cJSON_IsObject(root))
        return error_set(KVX_ERR_INVALID, "layout: expected a JSON object");
    status = check_keys(root, "layout", keys, sizeof(keys) / sizeof(keys[0]));
    if (status != KVX_OK)
        return status;
    item = cJSON_GetObjectItemCaseSensitive(root, "kvx_layout");
    if (item == NULL)
        return missing(TOP_LEVEL("kvx_layout"));
    if ((status = read_uint(item, TOP_LEVEL("kvx_layout"), &version)) != KVX_OK)
        return status;
    if (version != 1)
        return error_set(KVX_ERR_INVALID,
                         "kvx_layout: version %" PRIu64 " is not supported (this reader knows 1)",
                         version);
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "block_size")) != NULL) {
        if ((status = read_uint(item, TOP_LEVEL("block_size"), &p->block_size)) != KVX_OK)
            return status;
        p->field_mask |= KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "csa_linear")) != NULL) {
        if ((status = read_bool(item, TOP_LEVEL("csa_linear"), &p->csa_linear)) != KVX_OK)
            return status;
        p->field_mask |= KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "whole_row_regions")) != NULL) {
        if ((status = read_bool(item, TOP_LEVEL("whole_row_regions"), &p->whole_row_regions)) !=
            KVX_OK)
            return status;
        p->field_mask |= KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS;
    }
    return KVX_OK;
}

/* True when the text holds a NUL before its last byte, raw or escaped as \u0000 in a
 * string: cJSON would end the C string there, so two names that differ after it would
 * collide. Escape pairs are skipped so "\\\\u0000" (a backslash, then text) is no NUL. */
static bool has_nul(const char *json, size_t size)
{
    if (size > 1 && memchr(json, '\0', size - 1) != NULL)
        return true;
    for (size_t i = 0; i + 1 < size; i++) {
        if (json[i] != '\\')
            continue;
        if (json[i + 1] == 'u' && i + 5 < size && json[i + 2] == '0' && json[i + 3] == '0' &&
            json[i + 4] == '0' && json[i + 5] == '0')
            return true;
        i++; /* the escaped character */
    }
    return false;
}

/* The digits of a number's text without its point: integer digits, then fraction digits. */
struct significand {
    const char *int_digits;
    size_t int_len;
    const char *frac_digits;
    size_t len; /* int_len + the fraction's digits */
};

static char significand_digit(const struct significand *s, size_t i)
{
    return i < s->int_len ? s->int_digits[i] : s->frac_digits[i - s->int_len];
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool is_number_char(char c)
{
    return is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Why the number token `text` (`len` bytes, as cJSON accepted it) cannot be read exactly,
 * or NULL. cJSON keeps only a double, which rounds 2^53 + 1 into range and drops a fraction
 * below its precision, and it takes leading zeros, which JSON forbids; so the decimal text
 * itself is weighed: its significant digits times a power of ten. A negative value is left
 * to read_uint, which refuses it by its sign. */
static const char *number_text_check(const char *text, size_t len)
{
    static const char too_large[] = "is larger than 2^53, the largest integer JSON keeps exact";
    const char *end               = text + len;
    const char *p                 = text + (len > 0 && text[0] == '-');
    struct significand s          = {.int_digits = p};
    int64_t exponent              = 0; /* clamped: only its sign and size against 16 matter */
    bool exponent_negative        = false;
    size_t first; /* the first and last non-zero digits of s */
    size_t last;
    uint64_t value = 0;

    for (; p < end && is_digit(*p); p++)
        ;
    s.int_len = s.len = (size_t)(p - s.int_digits);
    if (s.int_len > 1 && s.int_digits[0] == '0')
        return "has a leading zero";
    if (p < end && *p == '.') {
        for (s.frac_digits = ++p; p < end && is_digit(*p); p++)
            ;
        s.len += (size_t)(p - s.frac_digits);
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        exponent_negative = ++p < end && *p == '-';
        for (p += p < end && (*p == '-' || *p == '+'); p < end && is_digit(*p); p++)
            exponent = exponent < 1000000000 ? exponent * 10 + (*p - '0') : exponent;
    }
    if (text[0] == '-')
        return NULL;
    for (first = 0; first < s.len && significand_digit(&s, first) == '0'; first++)
        ;
    if (first == s.len)
        return NULL; /* zero */
    for (last = s.len - 1; significand_digit(&s, last) == '0'; last--)
        ;
    /* The value is digits first..last times 10^exponent. */
    exponent = (exponent_negative ? -exponent : exponent) + (int64_t)(s.len - 1 - last) -
               (int64_t)(s.len - s.int_len);
    if (exponent < 0)
        return "is not an integer";                  /* a non-zero digit after the point */
    if ((int64_t)(last - first + 1) + exponent > 16) /* 2^53 has 16 digits */
        return too_large;
    for (size_t i = first; i <= last; i++)
        value = value * 10 + (uint64_t)(significand_digit(&s, i) - '0');
    for (; exponent > 0; exponent--)
        value *= 10;
    return value > (uint64_t)KVX_MAX_JSON_INTEGER ? too_large : NULL;
}

/* Appends to `path` (`size` bytes) the path of number `*skip_p` (counted in document order)
 * under `node` and returns true, or counts the numbers under `node` off *skip_p. cJSON keeps
 * members and elements in document order, so this order is the order of the text. */
static bool number_path_find(const cJSON *node, size_t *skip_p, char *path, size_t size)
{
    size_t len   = strlen(path);
    size_t index = 0;

    for (const cJSON *item = node->child; item != NULL; item = item->next, index++) {
        size_t at = len; /* the key is escaped in place: no buffer per level of nesting */

        if (cJSON_IsObject(node)) {
            if (at > 0 && at + 1 < size)
                path[at++] = '.';
            text_escape(path + at, size - at, item->string, strlen(item->string));
        } else {
            snprintf(path + at, size - at, "[%zu]", index);
        }
        if (cJSON_IsNumber(item)) {
            if (*skip_p == 0)
                return true;
            (*skip_p)--;
        } else if (number_path_find(item, skip_p, path, size)) {
            return true;
        }
        path[len] = '\0';
    }
    return false;
}

/* Checks the text of every number in the `len` bytes of `json` (which parsed into `root`)
 * with number_text_check, naming the first bad one by its key path. Outside strings, a
 * number is the only token that starts with '-' or a digit; strings, most of a layout's
 * text, are skipped with memchr to their closing quote (one after an even run of
 * backslashes), so the scan costs little next to the parse. */
static kvx_status_t numbers_check(const cJSON *root, const char *json, size_t len)
{
    const char *end = json + len;
    const char *p   = json;
    size_t count    = 0; /* numbers before the one at p */

    while (p < end) {
        const char *start = p;
        const char *why;
        char path[256];

        if (*p == '"') {
            const char *quote_at = p;
            size_t backslashes;

            do {
                quote_at = memchr(quote_at + 1, '"', (size_t)(end - quote_at - 1));
                if (quote_at == NULL)
                    return KVX_OK; /* not in text cJSON parsed; nothing left to check */
                for (backslashes = 0; quote_at[-1 - (ptrdiff_t)backslashes] == '\\'; backslashes++)
                    ;
            } while (backslashes % 2 != 0);
            p = quote_at + 1;
            continue;
        }
        if (*p != '-' && !is_digit(*p)) {
            p++;
            continue;
        }
        while (p < end && is_digit(*p))
            p++;
        if (p - start <= 15 && (p == end || !is_number_char(*p)) &&
            (p - start == 1 || *start != '0')) {
            count++; /* the common case: at most 15 digits, below 2^53, no leading zero */
            continue;
        }
        while (p < end && is_number_char(*p))
            p++;
        why = number_text_check(start, (size_t)(p - start));
        if (why == NULL) {
            count++;
            continue;
        }
        path[0] = '\0';
        if (!number_path_find(root, &count, path, sizeof(path)))
            snprintf(path, sizeof(path), "layout: the number at byte %td", start - json);
        return error_set(KVX_ERR_INVALID, "%s: %.*s%s %s", path,
                         (int)(p - start < 40 ? p - start : 40), start, p - start > 40 ? "..." : "",
                         why);
    }
    return KVX_OK;
}

/* The 1-based line and column (in bytes) of `at` in `json`, for a message an editor can jump
 * to: a byte offset alone made the reader count lines. */
static void text_position(const char *json, const char *at, size_t *line_p, size_t *column_p)
{
    const char *line_start = json;
    size_t line            = 1;

    for (const char *c = json; c < at; c++) {
        if (*c == '\n') {
            line++;
            line_start = c + 1;
        }
    }
    *line_p   = line;
    *column_p = (size_t)(at - line_start) + 1;
}

kvx_status_t kvx_layout_load_buffer(const char *json, size_t size, kvx_layout_t **layout_p)
{
    kvx_layout_params_t params = {0};
    kvx_layout_t *layout       = NULL;
    const char *end            = NULL;
    cJSON *root;
    kvx_status_t status;

    if (json == NULL || layout_p == NULL)
        return error_set(KVX_ERR_INVALID, "layout: no buffer or no place for the result");
    if (size > KVX_MAX_LAYOUT_FILE)
        return error_set(KVX_ERR_INVALID, "layout: %zu bytes is more than the %u allowed", size,
                         KVX_MAX_LAYOUT_FILE);
    if (has_nul(json, size))
        return error_set(KVX_ERR_INVALID, "layout: holds a NUL byte or \\u0000, which would cut"
                                          " a name short");
    root = cJSON_ParseWithLengthOpts(json, size, &end, false);
    if (root == NULL) {
        size_t line;
        size_t column;

        end = end != NULL && end >= json && end <= json + size ? end : json;
        text_position(json, end, &line, &column);
        return error_set(KVX_ERR_INVALID,
                         "layout: not valid JSON at line %zu, column %zu (near byte %td)", line,
                         column, end - json);
    }
    while (end < json + size && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
        end++;
    if (end == json + size - 1 && *end == '\0')
        end++; /* one terminator, as from strlen() + 1, is not data */
    if (end < json + size) {
        size_t line;
        size_t column;

        text_position(json, end, &line, &column);
        status = error_set(KVX_ERR_INVALID,
                           "layout: unexpected data after the JSON object at line %zu, column %zu"
                           " (byte %td)",
                           line, column, end - json);
        goto out;
    }

    status = numbers_check(root, json, (size_t)(end - json));
    if (status != KVX_OK)
        goto out;
    status = read_layout_params(root, &params);
    if (status != KVX_OK)
        goto out;
    status = kvx_layout_create(&params, &layout);
    if (status != KVX_OK)
        goto out;
    status = read_model(layout, root);
    if (status != KVX_OK)
        goto out;
    status = read_array(layout, root, "storages", read_storage);
    if (status != KVX_OK)
        goto out;
    status = read_array(layout, root, "views", read_view);
    if (status != KVX_OK)
        goto out;
    status = kvx_layout_validate(layout);
    if (status != KVX_OK)
        goto out;
    *layout_p = layout;
    layout    = NULL;

out:
    kvx_layout_destroy(layout);
    cJSON_Delete(root);
    return status;
}

/* What a path that is not a regular file names, for the message. */
static const char *file_type_name(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "not a regular file";
}

/* Opens without blocking and checks the type before reading a byte: a FIFO with no writer
 * would block a plain open(), and a device or FIFO has no size to bound the read by. */
kvx_status_t kvx_layout_load_file(const char *path, kvx_layout_t **layout_p)
{
    char *buffer = NULL;
    size_t done  = 0;
    struct stat st;
    kvx_status_t status;
    int fd;

    if (path == NULL || layout_p == NULL)
        return error_set(KVX_ERR_INVALID, "layout: no path or no place for the result");
    fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return error_set(KVX_ERR_IO, "%s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        status = error_set(KVX_ERR_IO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        status = error_set(KVX_ERR_IO, "%s: is %s, not a regular file", path,
                           file_type_name(st.st_mode));
        goto out;
    }
    if (st.st_size > (off_t)KVX_MAX_LAYOUT_FILE) {
        status = error_set(KVX_ERR_INVALID, "%s: %lld bytes is more than the %u allowed", path,
                           (long long)st.st_size, KVX_MAX_LAYOUT_FILE);
        goto out;
    }
    buffer = malloc((size_t)st.st_size + 1); /* + 1: a zero-byte file is still a buffer */
    if (buffer == NULL) {
        status = error_no_memory("a layout file buffer");
        goto out;
    }
    while (done < (size_t)st.st_size) {
        ssize_t n = read(fd, buffer + done, (size_t)st.st_size - done);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            status = error_set(KVX_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0) {
            status = error_set(KVX_ERR_IO, "%s: ended at byte %zu of %lld (changed while read)",
                               path, done, (long long)st.st_size);
            goto out;
        }
        done += (size_t)n;
    }
    status = kvx_layout_load_buffer(buffer, done, layout_p);
    if (status != KVX_OK) /* the message names the file: a command may load two */
        status = error_set(status, "%s: %s", path, kvx_errmsg());

out:
    free(buffer);
    close(fd);
    return status;
}
