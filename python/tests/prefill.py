"""A prefill process for the tests: serves a layout from numpy memory filled with a known
pattern, holds one request, prints one JSON line (address, token), and serves until its
stdin closes. usage: prefill.py LAYOUT BLOCKS_JSON [TP_RANK TP_SIZE]"""
import json
import select
import sys

import numpy as np

import kvx
import patterns


def main():
    layout = kvx.Layout.load(sys.argv[1])
    layout.in_host_memory()  # served from numpy memory whatever the layout says
    blocks = {int(g): ids for g, ids in json.loads(sys.argv[2]).items()}
    rank, size = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (0, 1)
    names = layout.regions().storage_names()
    memory = {name: patterns.filled(nbytes, rank, s)
              for s, (name, nbytes) in enumerate(zip(names, layout.storage_sizes()))}
    with kvx.Agent(layout, memory, tp_rank=rank, tp_size=size) as agent:
        address = agent.listen("127.0.0.1:0")
        token = agent.hold(7, blocks)
        print(json.dumps({"address": address, "token": token.hex()}), flush=True)
        while not select.select([sys.stdin], [], [], 0)[0]:
            agent.progress(10)
        # every byte still the pattern: nothing a peer did wrote our memory
        intact = all(np.array_equal(memory[n], patterns.filled(len(memory[n]), rank, s))
                     for s, n in enumerate(names))
        print(json.dumps({"intact": intact, "stats": agent.stats()}), flush=True)


if __name__ == "__main__":
    main()
