/* cli_memory.c: where the command line keeps a layout's storages (--memory). The model layouts
 * are written for GPUs ("mem": "vram"); the library never serves those from host memory on
 * its own, so a command that does says so, and --memory cuda puts every storage on a GPU. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

bool cli_memory_parse(const char *text, enum cli_memory *memory)
{
    if (strcmp(text, "host") == 0)
        *memory = CLI_MEMORY_HOST;
    else if (strcmp(text, "cuda") == 0)
        *memory = CLI_MEMORY_CUDA;
    else {
        cli_errorf("--memory: \"%s\" is neither host nor cuda", text);
        return false;
    }
    return true;
}

void cli_layout_memory(kvx_layout_t *layout, enum cli_memory memory, const char *command)
{
    size_t moved = 0;

    for (size_t s = 0; s < kvx_layout_num_storages(layout); s++) {
        kvx_mem_type_t mem = kvx_layout_storage_mem(layout, s);

        /* A storage written for a GPU keeps its device; a host one goes to the first GPU. */
        if (memory == CLI_MEMORY_CUDA && mem != KVX_MEM_VRAM)
            (void)kvx_layout_set_storage_mem(layout, s, KVX_MEM_VRAM, 0);
        if (memory == CLI_MEMORY_HOST && mem == KVX_MEM_VRAM &&
            kvx_layout_set_storage_mem(layout, s, KVX_MEM_DRAM, 0) == KVX_OK)
            moved++;
    }
    if (moved > 0)
        fprintf(stderr,
                "kvx %s: %zu of the layout's storages say \"vram\"; this run keeps them in host "
                "memory (--memory cuda puts them on the GPU)\n",
                command, moved);
}
