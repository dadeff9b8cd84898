/* transport_settings.c: the UCX settings kvx changes from UCX's defaults, put into a context's
 * configuration the way each UCX version takes them, and the TCP segment sizes UCX will really
 * use, which the handshake compares (wire_tcp_segments_agree). Reads the environment, never
 * writes it: the library owns its tuning without touching the process's. */
#include "error.h"
#include "transport_private.h"
#include "wire.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* kvx's TCP segments, bytes. UCX moves kvx's reads and writes over TCP as active messages, in
 * segments of 8 KiB by default; 256 KiB ones make TCP pulls and pushes 2.5-3.5x faster from
 * 64 KiB blocks up, and 4 KiB ones no slower (docs/performance.md "UCX's TCP segments"). */
#define TCP_SEGMENT_SIZE (256u << 10)

#define ENV_TX "UCX_TCP_TX_SEG_SIZE"
#define ENV_RX "UCX_TCP_RX_SEG_SIZE"

/* A size in UCX's syntax (ucs_str_to_memunits): decimal digits, then optionally one of
 * b k m g t (any case) and a b: "256k", "8kb", "65536". Stricter than UCX (no spaces, nothing
 * after the unit), so what kvx reads is what UCX reads. */
static bool size_parse(const char *text, uint64_t *bytes_p)
{
    static const char units[] = "bkmgt";
    uint64_t value            = 0;
    const char *c             = text;
    const char *unit;

    if (!isdigit((unsigned char)*c))
        return false;
    for (; isdigit((unsigned char)*c); c++) {
        if (__builtin_mul_overflow(value, 10, &value) ||
            __builtin_add_overflow(value, (uint64_t)(*c - '0'), &value))
            return false;
    }
    if (*c != '\0') {
        unit = strchr(units, tolower((unsigned char)*c));
        if (unit == NULL || *unit == '\0')
            return false;
        for (ptrdiff_t i = 0; i < unit - units; i++) {
            if (__builtin_mul_overflow(value, 1024, &value))
                return false;
        }
        c++;
        if (*c != '\0' && tolower((unsigned char)*c) == 'b' && unit != units)
            c++;
        if (*c != '\0')
            return false;
    }
    *bytes_p = value;
    return true;
}

/* The size the environment variable `name` sets, if set; *bytes_p is unchanged otherwise. */
static kvx_status_t env_size(const char *name, uint64_t *bytes_p)
{
    const char *text = getenv(name);
    uint64_t bytes;

    if (text == NULL)
        return KVX_OK;
    if (!size_parse(text, &bytes) || bytes < 1 || bytes > KVX_MAX_TCP_SEGMENT)
        return error_set(KVX_ERR_INVALID,
                         "%s: \"%.64s\" is not a size of 1..%u bytes (digits, then optionally"
                         " k, m or g)",
                         name, text, KVX_MAX_TCP_SEGMENT);
    *bytes_p = bytes;
    return KVX_OK;
}

static bool ucx_is_1_13(void)
{
    unsigned major;
    unsigned minor;
    unsigned release;

    ucp_get_version(&major, &minor, &release);
    return major == 1 && minor <= 13;
}

/* The name UCX's ucp_config_modify takes for TCP's setting `name` ("TX_SEG_SIZE"). It keeps
 * names it does not know and hands them to each transport's configuration when a worker opens
 * it: up to 1.16 matched against the transport's own field names ("TX_SEG_SIZE"), from 1.17
 * against the names with the transport's prefix ("TCP_TX_SEG_SIZE"). The environment was read
 * first and the value given here wins. */
static ucs_status_t tcp_setting(ucp_config_t *config, const char *name, const char *value)
{
    char prefixed[64];
    unsigned major;
    unsigned minor;
    unsigned release;

    ucp_get_version(&major, &minor, &release);
    snprintf(prefixed, sizeof(prefixed), "TCP_%s", name);
    return ucp_config_modify(config, major == 1 && minor < 17 ? name : prefixed, value);
}

kvx_status_t transport_settings_apply(ucp_config_t *config, bool tcp,
                                      struct transport_segments *segments_p)
{
    struct transport_segments seg = {WIRE_UCX_TCP_TX_DEFAULT, WIRE_UCX_TCP_RX_DEFAULT};
    char value[24];
    ucs_status_t st;
    kvx_status_t status;

    if (!tcp) {
        /* UCX reads no TCP setting, and a name no transport takes would make it warn */
        *segments_p = (struct transport_segments){0, 0};
        return KVX_OK;
    }
    /* TCP's interface advertises no zero-copy put, whatever the environment says: its
     * receiver writes a put request wherever the request says, and UCX 1.22's own puts pick it
     * for any key, even one a peer made of its own memory (a stock client's ucp_put_nbx at
     * 0x1000 killed a prefill in uct_tcp_ep_handle_put_req: test_data_plane). Not advertised,
     * UCX's puts fall back to its software RMA, which a context with TCP does not serve. Not on
     * UCX 1.13: without TCP's put its rendezvous takes a path that aborts the process when a
     * peer dies mid-transfer (uct_iface.h "comp->count > 0": test_ctrlc), and its own puts
     * never pick TCP's put request (docs/security.md says what that leaves). */
    if (!ucx_is_1_13() && (st = tcp_setting(config, "PUT_ENABLE", "n")) != UCS_OK)
        return transport_ucs_error("turning TCP's zero-copy put off", st);
    if (getenv(ENV_TX) != NULL || getenv(ENV_RX) != NULL) {
        /* The user's word, and UCX's defaults for the one not set: kvx's 256 KiB beside a
         * smaller rx the user chose would be refused by UCX (tx must not exceed rx). */
        if ((status = env_size(ENV_TX, &seg.tx)) != KVX_OK ||
            (status = env_size(ENV_RX, &seg.rx)) != KVX_OK)
            return status;
        if (seg.tx > seg.rx)
            return error_set(KVX_ERR_INVALID,
                             "%s: %" PRIu64 " bytes%s is more than %s %" PRIu64
                             "%s: UCX needs tx <= rx",
                             ENV_TX, seg.tx, getenv(ENV_TX) == NULL ? " (UCX's default)" : "",
                             ENV_RX, seg.rx, getenv(ENV_RX) == NULL ? " (UCX's default)" : "");
        *segments_p = seg;
        return KVX_OK;
    }
    snprintf(value, sizeof(value), "%u", TCP_SEGMENT_SIZE);
    st = tcp_setting(config, "TX_SEG_SIZE", value);
    if (st == UCS_OK)
        st = tcp_setting(config, "RX_SEG_SIZE", value);
    if (st != UCS_OK)
        return transport_ucs_error("setting the TCP segment sizes", st);
    *segments_p = (struct transport_segments){TCP_SEGMENT_SIZE, TCP_SEGMENT_SIZE};
    return KVX_OK;
}
