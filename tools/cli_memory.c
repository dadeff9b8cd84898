/* cli_memory.c: where the command line keeps a layout's storages. The model layouts are
 * written for GPUs ("mem": "vram"); the library never serves those from host memory on its
 * own, so a command that does says so. */
#include "cli.h"

#include <stdio.h>

void cli_layout_in_host_memory(kvx_layout_t *layout, const char *command)
{
    size_t moved = 0;

    for (size_t s = 0; s < kvx_layout_num_storages(layout); s++) {
        if (kvx_layout_storage_mem(layout, s) == KVX_MEM_VRAM &&
            kvx_layout_set_storage_mem(layout, s, KVX_MEM_DRAM, 0) == KVX_OK)
            moved++;
    }
    if (moved > 0)
        fprintf(stderr,
                "kvx %s: %zu of the layout's storages say \"vram\"; this run keeps them in host "
                "memory\n",
                command, moved);
}
