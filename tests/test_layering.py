#!/usr/bin/env python3
"""test_layering.py: files call downwards only (STYLE.md 2): from the symbols each object file
defines and uses (nm), the graph of which file calls which, and no circle in it. Prints each
circle found and exits 1. usage: test_layering.py OBJECT..."""
import os
import subprocess
import sys


def symbols(path):
    """The global symbols `path` defines, and those it uses from elsewhere."""
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRC":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def calls(objects):
    """file -> the other files whose symbols it uses."""
    defined, used = {}, {}
    for path in objects:
        name = os.path.basename(path).removesuffix(".o")
        defined[name], used[name] = symbols(path)
    owner = {symbol: name for name, names in defined.items() for symbol in names}
    return {name: sorted({owner[s] for s in used[name] if s in owner} - {name}) for name in defined}


def circles(graph):
    """Each circle once, found by a depth-first walk: an edge back to a file on the path."""
    found, state = [], {}  # state: 1 on the path, 2 done

    def walk(name, path):
        state[name] = 1
        path.append(name)
        for callee in graph[name]:
            if state.get(callee) == 1:
                found.append(path[path.index(callee):] + [callee])
            elif callee not in state:
                walk(callee, path)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [])
    return found


def main():
    # CMake hands $<TARGET_OBJECTS:...> over as one ;-separated argument
    objects = [path for arg in sys.argv[1:] for path in arg.split(";") if path]
    if not objects:
        print(__doc__)
        return 2
    graph = calls(objects)
    found = circles(graph)
    for circle in found:
        print("circle: " + " -> ".join(circle))
    print(f"{len(graph)} files, {sum(len(c) for c in graph.values())} calls between them, "
          f"{len(found)} circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
