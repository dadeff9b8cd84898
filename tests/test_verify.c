/* test_verify.c: verification between real processes on loopback, over random prefill memory:
 * verified pulls and pushes on the example and (shrunk) model layouts; one byte of the
 * destination changed after a transfer is found and named by region, block and view; a
 * prefill agent refuses checksum requests for ranges outside its storages and malformed ones,
 * hashing nothing; verify_one_in samples exactly one transfer in N, counted in the stats and
 * the Prometheus text. */
#include "auth.h"
#include "checksum.h"
#include "clock.h"
#include "core.h"
#include "layouts.h"
#include "prefill.h"
#include "prng.h"
#include "sidechan.h"

#include <cjson/cJSON.h>
#include <xxhash.h>
#include <zmq.h>

#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define SHRUNK_BLOCKS 4 /* blocks per view of a model layout in these tests */

/* What the prefill child serves: set before each fork, inherited by the child. */
static char *served_layout;
static size_t served_size;
static uint64_t fill_seed;
static bool fill_pattern; /* the prefill fills kvx's pattern of fill_seed, not random bytes */
/* Both agents' transports; NULL: kvx's default. The sessions that stop the prefill use keyed
 * ones, so the pull reads its storage through the mapping with no progress of the prefill
 * (over TCP the prefill serves its reads itself). */
static const char *transports;
/* The prefill's byte that SIGUSR1 changes (corrupt_at_signal), in its storage 0. */
static volatile uint8_t *corrupt_byte;
static uint64_t corrupt_offset;

static void corrupt_at_signal(int sig)
{
    (void)sig;
    if (corrupt_byte != NULL)
        *corrupt_byte ^= 0x5a;
}

/* A model layout with at most SHRUNK_BLOCKS blocks per view and storages cut to what their
 * views still reach, so two processes can hold it, in host memory; the caller frees it. */
static char *layout_shrunk(const char *path, size_t *size_p)
{
    size_t size;
    char *text   = source_file_read(path, &size);
    cJSON *root  = text != NULL ? cJSON_ParseWithLength(text, size) : NULL;
    cJSON *views = cJSON_GetObjectItem(root, "views");
    cJSON *storage;
    cJSON *view;
    char *out;

    assert_non_null(root);
    cJSON_ArrayForEach(storage, cJSON_GetObjectItem(root, "storages"))
    {
        const char *name = cJSON_GetObjectItem(storage, "name")->valuestring;
        double need      = 0;

        cJSON_ArrayForEach(view, views)
        {
            double blocks = cJSON_GetObjectItem(view, "num_blocks")->valuedouble;
            cJSON *offset = cJSON_GetObjectItem(view, "offset");
            double end;

            if (blocks > SHRUNK_BLOCKS)
                blocks = SHRUNK_BLOCKS;
            end = (offset != NULL ? offset->valuedouble : 0) +
                  (blocks - 1) * cJSON_GetObjectItem(view, "stride")->valuedouble +
                  cJSON_GetObjectItem(view, "page")->valuedouble;
            if (strcmp(cJSON_GetObjectItem(view, "storage")->valuestring, name) == 0 && end > need)
                need = end;
        }
        if (need > 0)
            cJSON_SetNumberValue(cJSON_GetObjectItem(storage, "size"), need);
        /* Written for GPUs; host memory here (test_gpu and docs/gpu.md for GPU storages). */
        cJSON_DeleteItemFromObject(storage, "mem");
        cJSON_DeleteItemFromObject(storage, "device");
    }
    cJSON_ArrayForEach(view, views)
    {
        cJSON *blocks = cJSON_GetObjectItem(view, "num_blocks");

        if (blocks->valuedouble > SHRUNK_BLOCKS)
            cJSON_SetNumberValue(blocks, SHRUNK_BLOCKS);
    }
    out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    free(text);
    *size_p = strlen(out);
    return out;
}

static kvx_status_t agent_from_json(const kvx_agent_params_t *params, kvx_agent_t **agent_p)
{
    kvx_layout_t *layout = NULL;
    kvx_status_t status  = kvx_layout_load_buffer(served_layout, served_size, &layout);

    return agent_from_layout(status, layout, params, agent_p);
}

/* Storage s's random bytes, the same on every call for one seed. */
static void random_fill(uint8_t *bytes, uint64_t size, uint64_t seed, size_t s)
{
    struct prng prng;

    prng_init(&prng, seed ^ (0x9e3779b97f4a7c15u * (s + 1)));
    for (uint64_t i = 0; i < size; i += 8) {
        uint64_t word = prng_next(&prng);

        memcpy(bytes + i, &word, size - i < 8 ? size - i : 8);
    }
}

/* The prefill process: random memory, serves until told to stop, then reports its stats. */
static int run_prefill(int ready, int go)
{
    const kvx_agent_params_t params = {
        .field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                      (transports != NULL ? KVX_AGENT_PARAM_FIELD_TRANSPORTS : 0),
        .listen     = "127.0.0.1:0",
        .transports = transports};
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;
    struct pollfd stop = {.fd = go, .events = POLLIN};

    alarm(300);
    if (agent_from_json(&params, &agent) != KVX_OK)
        return 10;
    for (size_t s = 0; s < kvx_regions_num_storages(kvx_agent_regions(agent)); s++) {
        uint64_t size;
        void *base = kvx_agent_storage(agent, s, &size);

        if (!fill_pattern)
            random_fill(base, size, fill_seed, s);
    }
    if (fill_pattern && kvx_agent_fill_pattern(agent, fill_seed) != KVX_OK)
        return 12;
    corrupt_byte = (uint8_t *)kvx_agent_storage(agent, 0, NULL) + corrupt_offset;
    signal(SIGUSR1, corrupt_at_signal);
    report_serving(ready, agent);
    while (poll(&stop, 1, 0) == 0)
        kvx_agent_progress(agent, 10);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    (void)!write(ready, &stats, sizeof(stats));
    return kvx_agent_destroy(agent) == KVX_OK ? 0 : 11;
}

struct prefill {
    pid_t pid;
    int ready;
    int stop;
    char address[ADDRESS_SIZE];
};

/* Starts the prefill process on `layout` (owned by the caller); before any agent here. */
static void prefill_start(struct prefill *p, char *layout, size_t size)
{
    int go[2];

    served_layout = layout;
    served_size   = size;
    fill_seed     = prng_seed_from_env(0x5eedf00d);
    assert_int_equal(pipe(go), 0);
    p->pid = start_prefill(run_prefill, go[0], p->address, &p->ready);
    close(go[0]);
    p->stop = go[1];
}

/* Stops it and returns its stats; it must exit 0. */
static kvx_agent_stats_t prefill_end(struct prefill *p)
{
    kvx_agent_stats_t stats;
    int status;

    assert_int_equal(write(p->stop, "q", 1), 1);
    assert_int_equal(read(p->ready, &stats, sizeof(stats)), sizeof(stats));
    assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(p->ready);
    close(p->stop);
    return stats;
}

/* A request for the first blocks every region holds (up to 3, highest first), in every
 * group of the table. */
struct request {
    uint64_t ids[3];
    kvx_group_ids_t groups[64];
    kvx_request_t request;
};

static void request_make(const kvx_regions_t *t, struct request *r)
{
    uint64_t capacity = UINT64_MAX;
    int64_t max_group = 0;
    size_t n;

    for (size_t i = 0; i < kvx_regions_count(t); i++) {
        kvx_region_info_t info;

        assert_int_equal(kvx_regions_get(t, i, &info), KVX_OK);
        capacity  = info.num_blocks < capacity ? info.num_blocks : capacity;
        max_group = info.group > max_group ? info.group : max_group;
    }
    assert_true(max_group < 64);
    n = capacity < 3 ? (size_t)capacity : 3;
    for (size_t i = 0; i < n; i++)
        r->ids[i] = n - 1 - i;
    for (int64_t g = 0; g <= max_group; g++)
        r->groups[g] = (kvx_group_ids_t){r->ids, n};
    r->request = (kvx_request_t){r->groups, (size_t)max_group + 1, NULL, 0, NULL};
}

static kvx_agent_t *decode_agent(uint32_t verify_one_in)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_VERIFY_ONE_IN |
                                     (transports != NULL ? KVX_AGENT_PARAM_FIELD_TRANSPORTS : 0),
                                 .verify_one_in = verify_one_in,
                                 .transports    = transports};
    kvx_agent_t *agent;

    assert_int_equal(agent_from_json(&params, &agent), KVX_OK);
    return agent;
}

static void storages_zero(kvx_agent_t *agent)
{
    for (size_t s = 0; s < kvx_regions_num_storages(kvx_agent_regions(agent)); s++) {
        uint64_t size;

        void *base = kvx_agent_storage(agent, s, &size); /* sets size: before the memset */

        memset(base, 0, size);
    }
}

/* One byte of the destination changes after the transfer: verifying finds it and names the
 * region and block that hold it, with the region's views; restored, it verifies again. */
static void corrupted_byte_is_named(kvx_agent_t *agent, kvx_xfer_t *xfer, const char *what)
{
    const kvx_regions_t *t = kvx_agent_regions(agent);
    size_t count;
    const kvx_pair_t *pairs = kvx_pairs_read(kvx_agent_last_pairs(agent), 0, NULL, &count);
    const kvx_pair_t *pair;
    uint64_t offset;
    uint8_t *byte;
    kvx_verify_result_t result;

    assert_true(count > 0);
    pair   = &pairs[count / 2];
    offset = pair->local_offset + pair->len / 2;
    byte   = (uint8_t *)kvx_agent_storage(agent, pair->local_storage, NULL) + offset;
    *byte ^= 0x5a;
    assert_int_equal(kvx_xfer_verify(xfer), KVX_ERR_MISMATCH);
    assert_non_null(strstr(kvx_errmsg(), "differ"));
    kvx_xfer_verify_result(xfer, &result);
    assert_int_equal(result.status, KVX_ERR_MISMATCH);
    assert_true(result.mismatches >= 1 && result.num_reported == result.mismatches);
    for (size_t i = 0; i < result.num_reported; i++) {
        const kvx_verify_mismatch_t *m = &result.reported[i];
        kvx_region_info_t info;

        assert_int_equal(m->range.local_storage, pair->local_storage);
        assert_true(m->range.local_offset <= offset &&
                    offset < m->range.local_offset + m->range.len);
        assert_true(m->region != SIZE_MAX);
        assert_int_equal(kvx_regions_get(t, m->region, &info), KVX_OK);
        assert_int_equal(info.storage, pair->local_storage);
        assert_true(offset >= info.offset + m->block * info.stride &&
                    offset < info.offset + m->block * info.stride + info.block_len);
        assert_int_equal(m->descriptor, info.first_descriptor + m->block);
        assert_string_equal(m->region_name, info.name);
        assert_int_equal(m->num_views, info.num_members);
        assert_int_equal(m->remote_block, m->block); /* the same table on both sides */
        assert_true(m->local_checksum != m->remote_checksum);
        if (i == 0) {
            char named[400];

            snprintf(named, sizeof(named), "region %zu (%s) block %" PRIu64, m->region, info.name,
                     m->block);
            assert_non_null(strstr(kvx_errmsg(), named));
            assert_non_null(strstr(kvx_errmsg(), kvx_regions_view_name(t, m->views[0])));
        }
    }
    *byte ^= 0x5a;
    if (kvx_xfer_verify(xfer) != KVX_OK)
        fail_msg("%s: restored, it still fails: %s", what, kvx_errmsg());
}

static void verified_pull_and_push(char *layout, size_t size, const char *name)
{
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    struct request r;
    kvx_verify_result_t result;
    kvx_read_stats_t stats;
    kvx_agent_stats_t served;

    prefill_start(&p, layout, size);
    agent = decode_agent(0);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    request_make(kvx_agent_regions(agent), &r);
    for (int push = 0; push < 2; push++) {
        storages_zero(agent);
        assert_int_equal((push ? kvx_write_post : kvx_read_post)(agent, &peer, 1, 1, &r.request,
                                                                 NULL, NULL, &xfer),
                         KVX_OK);
        assert_int_equal(kvx_xfer_verify(xfer), KVX_OK); /* before it completes */
        if (kvx_xfer_wait(xfer) != KVX_OK)
            fail_msg("%s %s: %s", name, push ? "push" : "pull", kvx_errmsg());
        kvx_xfer_stats(xfer, &stats);
        kvx_xfer_verify_result(xfer, &result);
        assert_true(result.requested);
        assert_int_equal(result.status, KVX_OK);
        assert_int_equal(result.bytes, stats.bytes);
        assert_true(result.segments >= stats.posted && result.segments > 0);
        assert_int_equal(result.mismatches, 0);
        corrupted_byte_is_named(agent, xfer, name);
        kvx_xfer_destroy(xfer);
    }
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    served = prefill_end(&p);
    assert_true(served.verify_served >= 6);
    assert_int_equal(served.verify_refused, 0);
}

static void verified_pulls_and_pushes_on_the_example_layouts(void **state)
{
    static const char *const examples[] = {
        "layouts/examples/example1-packed-mla-slab.json",
        "layouts/examples/example2-shared-base.json",
        "layouts/examples/example3-aliased-groups.json",
        "layouts/examples/example4-exact-aliases.json",
        "layouts/examples/example6-wider-after-narrower.json",
        "layouts/examples/example7-capacities.json",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(examples) / sizeof(examples[0]); i++) {
        size_t size;
        char *layout = source_file_read(examples[i], &size);

        assert_non_null(layout);
        verified_pull_and_push(layout, size, examples[i]);
        free(layout);
    }
}

static void verified_pulls_and_pushes_on_the_model_layouts(void **state)
{
    static const char *const models[] = {
        "layouts/models/llama3-8b.json",
        "layouts/models/deepseek-v3-mla.json",
        "layouts/models/deepseek-v4.1-demo.json",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
        size_t size;
        char *layout = layout_shrunk(models[i], &size);

        verified_pull_and_push(layout, size, models[i]);
        free(layout);
    }
}

/* One checksum request on an authenticated connection of its own: the answer (freed by the
 * caller) and its size. */
static char *checksum_ask(struct sidechan_client *client, const void *body, size_t size,
                          size_t *answer_size_p)
{
    static uint64_t next_id = 100;
    uint64_t id             = ++next_id;
    uint64_t got;
    char *reply = NULL;

    assert_int_equal(sidechan_client_send(client, VERB_CHECKSUM, id, body, size), KVX_OK);
    while (sidechan_client_wait(client, 10000)) {
        if (sidechan_client_recv(client, &got, &reply, answer_size_p) && got == id)
            return reply;
        free(reply);
    }
    fail_msg("no answer to a checksum request");
    return NULL;
}

/* A request a prefill agent must refuse, and what the refusal must say. */
static const struct refused_case {
    const char *rule;
    uint32_t storage;
    uint64_t offset;
    uint64_t len;
    uint32_t count; /* ranges the header claims; 0: as many as encoded (1) */
    const char *message;
} refused_cases[] = {
    {"storage_not_registered", 7, 0, 16, 0, "not registered"},
    {"range_past_the_storage_end", 0, 32768 - 8, 16, 0, "outside storage"},
    {"range_after_the_storage", 0, 1u << 30, 1, 0, "outside storage"},
    {"offset_plus_length_overflows", 0, UINT64_MAX - 2, 8, 0, "each >= 1"},
    {"empty_range", 0, 0, 0, 0, "each >= 1"},
    {"more_bytes_than_a_request_may_hash", 0, 0, (64u << 20) + 1, 0, "at most"},
    {"header_claims_more_ranges_than_sent", 0, 0, 8, 2, "bytes for 2 ranges"},
    {"more_ranges_than_allowed", 0, 0, 8, CHECKSUM_MAX_RANGES + 1, "ranges (1..256)"},
};

/* Refusals name the cause and hash nothing; a range inside answers the checksum of exactly
 * the prefill's bytes there. */
static void ranges_outside_the_registrations_are_refused(void **state)
{
    struct prefill p;
    struct auth_keys keys;
    struct sidechan_client *client;
    void *zmq;
    size_t size;
    char *layout = source_file_read("layouts/examples/example6-wider-after-narrower.json", &size);
    uint8_t body[CHECKSUM_MAX_REQUEST_SIZE];
    uint8_t expected_bytes[32768];
    struct checksum_range good = {0, 100, 1000};
    uint64_t sum;
    char *answer;
    size_t answer_size;
    kvx_agent_stats_t served;
    size_t n = sizeof(refused_cases) / sizeof(refused_cases[0]);

    (void)state;
    assert_non_null(layout);
    prefill_start(&p, layout, size);
    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    zmq = zmq_ctx_new();
    assert_int_equal(sidechan_client_create(zmq, p.address, &keys, 8, &client), KVX_OK);
    for (size_t i = 0; i < n; i++) {
        const struct refused_case *c = &refused_cases[i];
        struct checksum_range range  = {c->storage, c->offset, c->len};
        size_t body_size             = checksum_request_encode(&range, 1, body);

        if (c->count != 0)
            memcpy(body + 4, &c->count, 4); /* little-endian, as every kvx host */
        answer = checksum_ask(client, body, body_size, &answer_size);
        if (strncmp(answer, REPLY_ERROR, strlen(REPLY_ERROR)) != 0 ||
            strstr(answer, c->message) == NULL)
            fail_msg("%s: answered \"%s\"", c->rule, answer);
        free(answer);
    }
    answer = checksum_ask(client, body, checksum_request_encode(&good, 1, body), &answer_size);
    assert_true(checksum_answer_decode(answer, answer_size, 1, &sum));
    free(answer);
    random_fill(expected_bytes, sizeof(expected_bytes), fill_seed, 0);
    assert_true(sum == XXH3_64bits(expected_bytes + good.offset, good.len));
    sidechan_client_destroy(client);
    zmq_ctx_term(zmq);
    served = prefill_end(&p);
    assert_int_equal(served.verify_refused, n);
    assert_int_equal(served.verify_served, 1);
    assert_int_equal(served.verify_bytes_hashed, good.len);
    free(layout);
}

/* verify_one_in 3 over 9 pulls and 9 pushes: the 1st, 4th, 7th ... of the 18 are verified,
 * no more, and the counts add up in the stats on both sides and in the Prometheus text. */
static void sampling_counts_add_up(void **state)
{
    struct prefill p;
    size_t size;
    char *layout = source_file_read("layouts/examples/example7-capacities.json", &size);
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    struct request r;
    kvx_agent_stats_t stats;
    kvx_agent_stats_t served;
    uint64_t verified_bytes = 0;
    char *text;
    char line[128];

    (void)state;
    assert_non_null(layout);
    prefill_start(&p, layout, size);
    agent = decode_agent(3);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    request_make(kvx_agent_regions(agent), &r);
    for (int i = 0; i < 18; i++) {
        kvx_xfer_t *xfer;
        kvx_verify_result_t result;
        kvx_read_stats_t xs;

        assert_int_equal((i >= 9 ? kvx_write_post : kvx_read_post)(agent, &peer, 1, (uint64_t)i,
                                                                   &r.request, NULL, NULL, &xfer),
                         KVX_OK);
        assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
        kvx_xfer_verify_result(xfer, &result);
        kvx_xfer_stats(xfer, &xs);
        assert_int_equal(result.requested, i % 3 == 0);
        if (result.requested) {
            assert_int_equal(result.status, KVX_OK);
            assert_int_equal(result.bytes, xs.bytes);
            verified_bytes += result.bytes;
        }
        kvx_xfer_destroy(xfer);
    }
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers, 18);
    assert_int_equal(stats.transfers_verified, 6);
    assert_int_equal(stats.verify_mismatches, 0);
    assert_int_equal(stats.verify_failed, 0);
    assert_int_equal(stats.verify_bytes_hashed, verified_bytes);
    assert_int_equal(kvx_agent_stats_prometheus(&stats, "d", &text), KVX_OK);
    assert_non_null(strstr(text, "kvx_transfers_verified_total{agent=\"d\"} 6\n"));
    assert_non_null(strstr(text, "kvx_verify_mismatches_total{agent=\"d\"} 0\n"));
    snprintf(line, sizeof(line), "kvx_verify_hashed_bytes_total{agent=\"d\"} %" PRIu64 "\n",
             verified_bytes);
    assert_non_null(strstr(text, line));
    assert_non_null(strstr(text, "kvx_verify_hash_seconds_total{agent=\"d\"} "));
    free(text);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    served = prefill_end(&p);
    assert_int_equal(served.verify_bytes_hashed, verified_bytes);
    assert_int_equal(served.verify_refused, 0);
    free(layout);
}

/* A prefill process on example 1 (the pattern of fill_seed when fill_pattern is set, random
 * bytes otherwise), a decode agent connected to it, and a request for the first blocks of
 * every region; region 0's block 0 holds the byte the prefill's SIGUSR1 changes. */
struct session {
    char *layout;
    size_t size;
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    struct request r;
    kvx_region_info_t region0; /* valid as long as the agent */
};

static void session_open(struct session *s)
{
    kvx_layout_t *loaded;
    kvx_regions_t *regions;

    s->layout = source_file_read("layouts/examples/example1-packed-mla-slab.json", &s->size);
    assert_non_null(s->layout);
    assert_int_equal(kvx_layout_load_buffer(s->layout, s->size, &loaded), KVX_OK);
    assert_int_equal(kvx_regions_register(loaded, &regions), KVX_OK);
    assert_int_equal(kvx_regions_get(regions, 0, &s->region0), KVX_OK);
    kvx_regions_destroy(regions);
    kvx_layout_destroy(loaded);
    assert_int_equal(s->region0.storage, 0);
    corrupt_offset = s->region0.offset + 7; /* in block 0 of region 0, which the request moves */
    transports     = "sm,cma";
    prefill_start(&s->p, s->layout, s->size);
    s->agent = decode_agent(0);
    /* Again from the agent's table: its name must outlive the table read above. */
    assert_int_equal(kvx_regions_get(kvx_agent_regions(s->agent), 0, &s->region0), KVX_OK);
    assert_int_equal(kvx_agent_connect(s->agent, s->p.address, &s->peer), KVX_OK);
    request_make(kvx_agent_regions(s->agent), &s->r);
    assert_int_equal(s->r.ids[s->r.groups[0].count - 1], 0);
}

/* Ends it; the prefill's stats. */
static kvx_agent_stats_t session_close(struct session *s)
{
    kvx_agent_stats_t served;

    kvx_peer_destroy(s->peer);
    assert_int_equal(kvx_agent_destroy(s->agent), KVX_OK);
    served         = prefill_end(&s->p);
    corrupt_offset = 0;
    transports     = NULL;
    free(s->layout);
    return served;
}

/* The pattern check of the library (kvx_agent_check_pattern, what kvx fetch --verify --fill
 * and kvx demo use): a pull from a pattern-filled prefill checks; one changed byte inside the
 * transfer is named with the bytes expected and found, one outside it as written outside the
 * request, and a wrong seed is a mismatch. */
static void the_pattern_check_names_wrong_bytes_inside_and_outside_the_transfer(void **state)
{
    struct session t;
    kvx_agent_t *agent;
    size_t count;
    const kvx_pair_t *pairs;
    uint64_t storage_size;
    uint8_t *base;
    uint8_t *inside;
    uint8_t *outside;

    (void)state;
    fill_pattern = true;
    session_open(&t);
    agent = t.agent;
    assert_int_equal(kvx_agent_zero(agent), KVX_OK);
    assert_int_equal(kvx_read(agent, &t.peer, 1, 1, &t.r.request, NULL), KVX_OK);
    if (kvx_agent_check_pattern(agent, fill_seed) != KVX_OK)
        fail_msg("a clean pull: %s", kvx_errmsg());
    assert_int_equal(kvx_agent_check_pattern(agent, fill_seed + 1), KVX_ERR_MISMATCH);
    assert_non_null(strstr(kvx_errmsg(), "is the seed the one kvx serve --fill used?"));
    pairs  = kvx_pairs_read(kvx_agent_last_pairs(agent), 0, NULL, &count);
    base   = kvx_agent_storage(agent, pairs[0].local_storage, &storage_size);
    inside = base + pairs[0].local_offset + pairs[0].len / 2;
    *inside ^= 0x5a;
    assert_int_equal(kvx_agent_check_pattern(agent, fill_seed), KVX_ERR_MISMATCH);
    assert_non_null(strstr(kvx_errmsg(), ": expected 0x"));
    assert_non_null(strstr(kvx_errmsg(), "1 of the pair's"));
    *inside ^= 0x5a;
    outside = base + storage_size - 1; /* request_make asks for the first blocks only */
    for (size_t i = 0; i < count; i++)
        assert_true(pairs[i].local_offset + pairs[i].len < storage_size);
    *outside = 1;
    assert_int_equal(kvx_agent_check_pattern(agent, fill_seed), KVX_ERR_MISMATCH);
    assert_non_null(strstr(kvx_errmsg(), "was written but is outside the request"));
    session_close(&t);
    fill_pattern = false;
}

/* Stops the prefill process, posts a pull of `r` verified in progress, and runs our loop
 * until every get completed and the checksum requests wait in the stopped prefill's socket.
 * The pull reads the prefill's kvx-allocated storage through its mapping here, so none of
 * that needs the prefill's progress. */
static kvx_xfer_t *pull_awaiting_a_stopped_prefill(kvx_agent_t *agent, kvx_peer_t *peer,
                                                   struct request *r, const struct prefill *p)
{
    kvx_verify_result_t result = {0};
    kvx_xfer_t *xfer;
    int status;

    /* Stopped once the kernel says so: SIGSTOP lands at the child's next entry into the
     * kernel, and a child still running would hash the checksum request before the change
     * (a loaded CI host: the transfer then succeeded) */
    assert_int_equal(kill(p->pid, SIGSTOP), 0);
    assert_int_equal(waitpid(p->pid, &status, WUNTRACED), p->pid);
    assert_true(WIFSTOPPED(status));
    assert_int_equal(kvx_read_post(agent, &peer, 1, 1, &r->request, NULL, NULL, &xfer), KVX_OK);
    assert_int_equal(kvx_xfer_verify(xfer), KVX_OK);
    for (int i = 0; i < 10000 && result.pending == 0; i++) {
        kvx_agent_progress(agent, 1);
        kvx_xfer_verify_result(xfer, &result);
    }
    assert_true(result.pending > 0 && result.segments == 0);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS);
    return xfer;
}

/* A transfer verified in progress whose source changes after it was read (the prefill side's
 * byte, changed by its SIGUSR1 handler while it is stopped, before it hashes) fails with
 * KVX_ERR_MISMATCH naming the region and block, and sends no done: the prefill side keeps
 * the blocks. Deterministic: the pull reads the prefill's kvx-allocated storage through its
 * mapping here (no progress of the stopped prefill needed), the checksum request waits in
 * its socket, and the handler runs on SIGCONT before the prefill's code does. */
static void a_source_changed_before_it_is_hashed_fails_the_transfer_with_no_done(void **state)
{
    struct session t;
    kvx_xfer_t *xfer;
    kvx_verify_result_t result;
    kvx_agent_stats_t stats;

    (void)state;
    session_open(&t);
    xfer = pull_awaiting_a_stopped_prefill(t.agent, t.peer, &t.r, &t.p);
    assert_int_equal(kill(t.p.pid, SIGUSR1), 0);
    assert_int_equal(kill(t.p.pid, SIGCONT), 0);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_MISMATCH);
    assert_non_null(strstr(kvx_xfer_error(xfer), "block 0"));
    assert_non_null(strstr(kvx_xfer_error(xfer), t.region0.name));
    kvx_xfer_verify_result(xfer, &result);
    assert_int_equal(result.mismatches, 1);
    assert_int_equal(result.reported[0].region, 0);
    assert_int_equal(result.reported[0].block, 0);
    kvx_xfer_destroy(xfer);
    /* A clean pull of other blocks after it: verified, and its done is the only one. */
    for (size_t g = 0; g < t.r.request.num_local_groups; g++)
        t.r.groups[g].count--; /* block 0 leaves the request: ids are highest first */
    assert_int_equal(kvx_read_post(t.agent, &t.peer, 1, 2, &t.r.request, NULL, NULL, &xfer),
                     KVX_OK);
    assert_int_equal(kvx_xfer_verify(xfer), KVX_OK);
    if (kvx_xfer_wait(xfer) != KVX_OK)
        fail_msg("the clean pull: %s", kvx_errmsg());
    kvx_xfer_destroy(xfer);
    kvx_agent_stats(t.agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers_verified, 2);
    assert_int_equal(stats.verify_mismatches, 1);
    assert_int_equal(session_close(&t).done_unknown, 1); /* the clean pull's done only */
}

/* A prefill side that does not answer its checksum requests: the transfer verified in
 * progress fails at the agent's timeout (the injectable clock moved past it, no wall-clock
 * wait) with KVX_ERR_PEER_TIMEOUT naming the segments not answered, and sends no done; the
 * late answers, once the prefill runs again, are ignored. */
static void a_verification_not_answered_fails_at_the_deadline(void **state)
{
    struct session t;
    kvx_xfer_t *xfer;

    (void)state;
    session_open(&t);
    xfer = pull_awaiting_a_stopped_prefill(t.agent, t.peer, &t.r, &t.p);
    clock_advance_ms(10001); /* the agent's default timeout_ms, passed */
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_TIMEOUT);
    assert_non_null(strstr(kvx_xfer_error(xfer), "segments not answered within 10000 ms"));
    kvx_xfer_destroy(xfer);
    assert_int_equal(kill(t.p.pid, SIGCONT), 0);
    for (int i = 0; i < 20; i++)
        kvx_agent_progress(t.agent, 5); /* the late answers come and go unheard */
    assert_int_equal(session_close(&t).done_unknown, 0);
}

/* Issue 23: a prefill agent hashes a checksum request a slice a turn. A request of 64 MiB
 * (CHECKSUM_MAX_BYTES) to an agent in this process, whose turns the test runs one at a time:
 * no turn hashes more than 4 MiB (AGENT_HASH_BYTES_PER_TURN, docs/agent.md "Nothing blocks
 * the caller"), so it takes at least 16 turns, and the answer, which comes only once every
 * byte was hashed, is the checksum of the whole range. Counted in bytes hashed (the stats),
 * not in time. */
#define HASH_BYTES_PER_TURN (4u << 20)
static void a_checksum_request_is_hashed_a_slice_a_turn(void **state)
{
    static const char layout[] =
        "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 67108864}], 'views': ["
        "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 1048576,"
        " 'stride': 1048576, 'num_blocks': 64}]}";
    kvx_agent_params_t params   = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN,
                                   .listen     = "127.0.0.1:0"};
    struct checksum_range whole = {0, 0, CHECKSUM_MAX_BYTES};
    uint8_t body[CHECKSUM_MAX_REQUEST_SIZE];
    struct sidechan_client *client;
    struct auth_keys keys;
    kvx_agent_stats_t stats;
    kvx_agent_t *agent;
    uint64_t hashed = 0;
    uint64_t size   = 0;
    uint64_t deadline;
    uint64_t sum;
    uint8_t *base;
    size_t turns = 0;
    char *answer = NULL;
    size_t answer_size;
    uint64_t id;
    void *zmq;

    (void)state;
    assert_int_equal(agent_from_quoted(layout, &params, &agent), KVX_OK);
    base = kvx_agent_storage(agent, 0, &size);
    assert_int_equal(size, CHECKSUM_MAX_BYTES);
    random_fill(base, size, 7, 0);
    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    zmq = zmq_ctx_new();
    assert_int_equal(
        sidechan_client_create(zmq, kvx_agent_listen_address(agent), &keys, 8, &client), KVX_OK);
    assert_int_equal(sidechan_client_send(client, VERB_CHECKSUM, 1, body,
                                          checksum_request_encode(&whole, 1, body)),
                     KVX_OK);
    deadline = clock_ms() + 20000; /* a bound on a hang, not a timing */
    while (answer == NULL && clock_ms() < deadline) {
        kvx_agent_progress(agent, 1); /* at most one turn that does something */
        kvx_agent_stats(agent, &stats, sizeof(stats));
        if (stats.verify_bytes_hashed - hashed > HASH_BYTES_PER_TURN)
            fail_msg("one turn hashed %" PRIu64 " bytes", stats.verify_bytes_hashed - hashed);
        turns += stats.verify_bytes_hashed > hashed;
        hashed = stats.verify_bytes_hashed;
        if (sidechan_client_readable(client) &&
            sidechan_client_recv(client, &id, &answer, &answer_size)) {
            assert_int_equal(id, 1);
            assert_int_equal(hashed, CHECKSUM_MAX_BYTES); /* answered only when all was */
        }
    }
    assert_non_null(answer);
    assert_true(turns >= CHECKSUM_MAX_BYTES / HASH_BYTES_PER_TURN);
    assert_true(checksum_answer_decode(answer, answer_size, 1, &sum));
    assert_true(sum == XXH3_64bits(base, CHECKSUM_MAX_BYTES));
    free(answer);
    sidechan_client_destroy(client);
    zmq_ctx_term(zmq);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_outside_the_registrations_are_refused),
        cmocka_unit_test(sampling_counts_add_up),
        cmocka_unit_test(the_pattern_check_names_wrong_bytes_inside_and_outside_the_transfer),
        cmocka_unit_test(a_source_changed_before_it_is_hashed_fails_the_transfer_with_no_done),
        cmocka_unit_test(a_verification_not_answered_fails_at_the_deadline),
        cmocka_unit_test(verified_pulls_and_pushes_on_the_example_layouts),
        cmocka_unit_test(verified_pulls_and_pushes_on_the_model_layouts),
        cmocka_unit_test(a_checksum_request_is_hashed_a_slice_a_turn), /* forks nothing */
    };

    setenv("UCX_NET_DEVICES", "lo", 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
