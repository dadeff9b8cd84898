/* test_unmap_slices.c: a closing connection's mappings of its peer's segments leave our page
 * tables a slice at a time (src/unmap_slices.c), their bytes intact, and nothing but a shared
 * memory segment's mapping is ever touched: not a private mapping named by a range, nor one
 * that a lying peer's size stretched a range over. */
#define _GNU_SOURCE
#include "unmap_slices.h"

#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#define SEGMENT ((size_t)8 << 20)
#define SLICE   ((size_t)1 << 20)

/* Kilobytes of the mapping that starts at `start` now in our page tables (smaps' Rss). */
static long resident_kb(const void *start)
{
    FILE *smaps = fopen("/proc/self/smaps", "r");
    char line[512];
    bool in  = false;
    long rss = -1;

    assert_non_null(smaps);
    while (fgets(line, sizeof(line), smaps) != NULL) {
        uintptr_t low;
        uintptr_t high;

        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &low, &high) == 2) { /* a mapping's */
            in = low == (uintptr_t)start;
            continue;
        }
        if (in && sscanf(line, "Rss: %ld kB", &rss) == 1)
            break;
    }
    fclose(smaps);
    return rss;
}

static void fill(uint8_t *p, size_t size, uint8_t seed)
{
    for (size_t i = 0; i < size; i++)
        p[i] = (uint8_t)(seed + i * 7);
}

static bool intact(const uint8_t *p, size_t size, uint8_t seed)
{
    for (size_t i = 0; i < size; i++) {
        if (p[i] != (uint8_t)(seed + i * 7))
            return false;
    }
    return true;
}

/* A POSIX shared memory segment of `size` bytes, mapped at `at` (NULL: anywhere), filled. */
static uint8_t *segment_map(void *at, size_t size)
{
    char name[64];
    int fd;
    uint8_t *p;

    snprintf(name, sizeof(name), "/kvx-test-unmap-%d", (int)getpid());
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    shm_unlink(name);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at != NULL ? MAP_FIXED : 0), fd, 0);
    close(fd);
    assert_true(p != MAP_FAILED);
    fill(p, size, 3);
    return p;
}

/* Runs `u` a slice at a time to its end; returns the runs it took. */
static int run_all(struct unmap_slices *u)
{
    int runs = 0;

    for (;;) {
        size_t budget = SLICE;
        bool more     = unmap_slices_run(u, &budget);

        runs++;
        if (!more)
            return runs;
        assert_int_equal(budget, 0); /* a run that leaves some spends its whole budget */
        assert_true(runs < 1000);
    }
}

static void a_segment_leaves_our_page_tables_a_slice_at_a_time_its_bytes_intact(void **state)
{
    uint8_t *seg                = segment_map(NULL, SEGMENT);
    struct prefault_range range = {(uintptr_t)seg, SEGMENT};
    struct unmap_slices u;

    (void)state;
    assert_true(resident_kb(seg) >= (long)(SEGMENT >> 10) - 4);
    unmap_slices_start(&u, &range, 1);
    assert_int_equal(run_all(&u), SEGMENT / SLICE);
    assert_int_equal(resident_kb(seg), 0);
    assert_true(intact(seg, SEGMENT, 3)); /* refaulted from the segment */
    munmap(seg, SEGMENT);
}

static void a_private_mapping_is_never_touched(void **state)
{
    uint8_t *own = mmap(NULL, SEGMENT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct prefault_range range = {(uintptr_t)own, SEGMENT};
    struct unmap_slices u;

    (void)state;
    assert_true(own != MAP_FAILED);
    fill(own, SEGMENT, 5);
    unmap_slices_start(&u, &range, 1);
    assert_int_equal(run_all(&u), 1);
    assert_true(resident_kb(own) >= (long)(SEGMENT >> 10) - 4);
    assert_true(intact(own, SEGMENT, 5)); /* dropping them would have zeroed them */
    munmap(own, SEGMENT);
}

static void a_range_a_lying_size_stretched_past_its_segment_stops_at_the_segment(void **state)
{
    /* [segment][our private memory], one range over both, as a peer's lying size gives */
    uint8_t *both =
        mmap(NULL, 2 * SEGMENT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *seg;
    struct prefault_range range = {(uintptr_t)both, 2 * SEGMENT};
    struct unmap_slices u;

    (void)state;
    assert_true(both != MAP_FAILED);
    seg = segment_map(both, SEGMENT);
    fill(both + SEGMENT, SEGMENT, 9);
    unmap_slices_start(&u, &range, 1);
    assert_int_equal(run_all(&u), SEGMENT / SLICE);
    assert_int_equal(resident_kb(seg), 0);
    assert_true(resident_kb(both + SEGMENT) >= (long)(SEGMENT >> 10) - 4);
    assert_true(intact(both + SEGMENT, SEGMENT, 9));
    assert_true(intact(seg, SEGMENT, 3));
    munmap(both, 2 * SEGMENT);
}

static void ranges_are_taken_in_order_under_one_budget(void **state)
{
    uint8_t *a                      = segment_map(NULL, SEGMENT);
    uint8_t *b                      = segment_map(NULL, SEGMENT);
    struct prefault_range ranges[2] = {{(uintptr_t)a, SEGMENT}, {(uintptr_t)b, SEGMENT}};
    struct unmap_slices u;
    size_t budget = SEGMENT + SLICE;

    (void)state;
    unmap_slices_start(&u, ranges, 2);
    assert_true(unmap_slices_run(&u, &budget));
    assert_int_equal(budget, 0);
    assert_int_equal(resident_kb(a), 0);
    assert_true(resident_kb(b) <= (long)((SEGMENT - SLICE) >> 10) + 4);
    budget = SEGMENT;
    assert_false(unmap_slices_run(&u, &budget));
    assert_int_equal(budget, SLICE); /* what was left of it */
    assert_int_equal(resident_kb(b), 0);
    assert_true(intact(a, SEGMENT, 3) && intact(b, SEGMENT, 3));
    munmap(a, SEGMENT);
    munmap(b, SEGMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_segment_leaves_our_page_tables_a_slice_at_a_time_its_bytes_intact),
        cmocka_unit_test(a_private_mapping_is_never_touched),
        cmocka_unit_test(a_range_a_lying_size_stretched_past_its_segment_stops_at_the_segment),
        cmocka_unit_test(ranges_are_taken_in_order_under_one_budget),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
