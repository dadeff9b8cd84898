"""stats_fields.py: the fields of kvx_agent_stats_t as include/kvx.h declares them, read from
the header itself and not from the library's list, so the tests that compare an output with
them see a field the list forgot (issue 24).
usage: stats_fields.py KVX_H [--json FILE]: prints "NAME KIND" lines (KIND: value or
histogram); with --json, checks that FILE's "stats" object has exactly those keys."""
import json
import re
import sys


def stats_fields(header_path):
    """[(name, kind)] of kvx_agent_stats_t, in declaration order."""
    with open(header_path, encoding="utf-8") as f:
        text = f.read()
    body = re.search(r"typedef struct kvx_agent_stats \{(.*?)\} kvx_agent_stats_t;", text, re.S)
    body = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    fields = re.findall(r"\b(uint64_t|kvx_histogram_t)\s+(\w+)\s*;", body)
    return [(name, "histogram" if kind == "kvx_histogram_t" else "value")
            for kind, name in fields]


def main(argv):
    fields = stats_fields(argv[1])
    if len(argv) == 4 and argv[2] == "--json":
        with open(argv[3], encoding="utf-8") as f:
            stats = json.load(f)["stats"]
        want = [name for name, _ in fields]
        if sorted(stats) != sorted(want):
            print("missing from the JSON:", sorted(set(want) - set(stats)),
                  "not in kvx_agent_stats_t:", sorted(set(stats) - set(want)))
            return 1
        return 0
    for name, kind in fields:
        print(name, kind)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
