"""Print the packages of a `pip freeze` (stdin) whose version differs from uv.lock (argv[1])."""

import sys
import tomllib

locked = {p["name"]: p.get("version") for p in tomllib.load(open(sys.argv[1], "rb"))["package"]}
changed = 0
for line in sys.stdin:
    name, sep, version = line.strip().partition("==")
    key = name.lower().replace("_", "-")
    if sep and locked.get(key) != version:
        changed += 1
        print(f"  {key}: {locked.get(key, 'not locked')} -> {version}")
print(f"  {changed} package(s) differ" if changed else "  none")
