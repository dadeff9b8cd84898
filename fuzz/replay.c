/* replay.c: the fuzz targets' entry point in an ordinary build (any compiler, no libFuzzer):
 * runs LLVMFuzzerTestOneInput once on each file named, as libFuzzer does with file
 * arguments. Every build then compiles the targets against the library as it is now, and
 * ctest replays their seeds and kept crashes: a decoder's signature that moved breaks
 * `make test`, not only the fuzz stage at the end of CI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Only some targets have one (fuzz_wire registers its local layout there). */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static uint8_t *read_whole(const char *path, size_t *size_p)
{
    FILE *f = fopen(path, "rb");
    uint8_t *data = NULL;
    long size;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0 || (data = malloc((size_t)size + 1)) == NULL ||
        fread(data, 1, (size_t)size, f) != (size_t)size) {
        free(data);
        data = NULL;
    }
    if (f != NULL)
        fclose(f);
    *size_p = data != NULL ? (size_t)size : 0;
    return data;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize != NULL)
        LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        size_t size;
        uint8_t *data = read_whole(argv[i], &size);

        if (data == NULL) {
            fprintf(stderr, "replay: cannot read %s\n", argv[i]);
            return 1;
        }
        LLVMFuzzerTestOneInput(data, size); /* a broken invariant aborts */
        free(data);
    }
    printf("replay: %d inputs, no broken invariant\n", argc - 1);
    return 0;
}
