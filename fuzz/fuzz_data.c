/* fuzz_data.c: libFuzzer target for the owner's check of a vectored read (transport_am.c
 * am_ranges_granted): the ranges any peer with a grant sends a served transport's worker. The
 * input is the message's range count (4 bytes) and then its data. An accepted message's
 * ranges are non-empty, each inside one storage the transport serves (never its device
 * memory or an empty slot), and say exactly what the bytes said; a refused one touches no
 * storage. Aborts on a broken invariant. */
#include "fuzz_invariant.h"
#include "transport_private.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t host0[4096];
static uint8_t host1[100];
static uint8_t device[64];

/* Whether [p, p + n) lies inside mem. */
static bool inside(const struct transport_mem *mem, const void *p, size_t n)
{
    const uint8_t *at = p, *base = mem->address;

    return at >= base && n <= mem->size && (size_t)(at - base) <= mem->size - n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct transport_mem mems[3] = {
        {.address = host0, .size = sizeof(host0), .index = 0},
        {.address = host1, .size = sizeof(host1), .index = 1},
        {.address = device, .size = sizeof(device), .index = 3, .device = true},
    };
    struct transport_mem *slots[4] = {&mems[0], &mems[1], NULL, &mems[2]};
    struct transport t             = {.served = true, .mems = slots, .num_mems = 4};
    ucp_dt_iov_t iov[AM_READV_MAX];
    uint32_t count;

    if (size < sizeof(count))
        return 0;
    memcpy(&count, data, sizeof(count));
    memset(iov, 0, sizeof(iov));
    if (!am_ranges_granted(&t, data + sizeof(count), size - sizeof(count), count, iov)) {
        for (size_t i = 0; i < AM_READV_MAX; i++) /* filled or not: nothing else */
            invariant(iov[i].buffer == NULL || inside(&mems[0], iov[i].buffer, iov[i].length) ||
                          inside(&mems[1], iov[i].buffer, iov[i].length),
                      "a refused message's ranges point at nothing outside");
        return 0;
    }
    invariant(count >= 2 && count <= AM_READV_MAX &&
                  size - sizeof(count) == count * sizeof(struct am_range),
              "an accepted message has 2 to AM_READV_MAX ranges and nothing more");
    for (uint32_t i = 0; i < count; i++) {
        struct am_range range;

        memcpy(&range, data + sizeof(count) + i * sizeof(range), sizeof(range));
        invariant(range.storage < 2 && iov[i].length == range.length && iov[i].length > 0,
                  "an accepted range is non-empty, in a host storage, of the length asked");
        invariant(iov[i].buffer == (uint8_t *)mems[range.storage].address + range.offset &&
                      inside(&mems[range.storage], iov[i].buffer, iov[i].length),
                  "an accepted range lies inside its storage, where it said");
    }
    t.served = false; /* a transport that serves nobody accepts nothing */
    invariant(!am_ranges_granted(&t, data + sizeof(count), size - sizeof(count), count, iov),
              "a keyed transport serves no range");
    return 0;
}
