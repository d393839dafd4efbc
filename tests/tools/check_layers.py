#!/usr/bin/env python3
"""Checks the includes between source folders against the table
"Allowed dependencies between folders" of docs/ARCHITECTURE.md.

The table is read from the document itself, so the docs and the check
cannot drift. Every `#include "..."` under src/ and in bench/*.c (and
bench/*.h) is resolved to the folder that holds the header (as the
compiler would: next to the including file first, then include/, then
src/); an include of a header of another folder must be allowed by the
including folder's row, or be listed in tests/tools/layer_exceptions.txt
(`file -> header  # reason`). The check fails (exit 1) on

  - a forbidden include not in the exceptions file (file, line, include
    and the rule it breaks are named),
  - an exception that no longer occurs, or that the table now allows
    (stale: the list can only shrink),
  - a table that is not a DAG, names an unknown folder, or misses a
    folder under src/.

Usage: check_layers.py [--root DIR] [--arch FILE] [--exceptions FILE]
(defaults: the repository holding this script, DIR/docs/ARCHITECTURE.md,
DIR/tests/tools/layer_exceptions.txt). Standard library only.
"""

import argparse
import os
import re
import sys

TABLE_HEADING = "## Allowed dependencies between folders"
# Folders outside src/ that the check also covers: they may include only
# public headers and their own.
EXTRA_FOLDERS = {"bench"}
SRC_EXTS = (".c", ".h", ".cu", ".cuh", ".inc", ".cpp")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
PUBLIC = "ctrain"  # include/ctrain: everyone may include it


def fail_usage(msg):
    print("check_layers: " + msg, file=sys.stderr)
    sys.exit(2)


def parse_table(arch_path):
    """Returns ({folder: set(allowed folders)}, [errors])."""
    try:
        with open(arch_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail_usage("cannot read %s: %s" % (arch_path, e))
    errors = []
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == TABLE_HEADING)
    except StopIteration:
        fail_usage('%s has no heading "%s"' % (arch_path, TABLE_HEADING))
    rows = {}
    in_table = False
    for n in range(start + 1, len(lines)):
        line = lines[n].strip()
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break  # the first table after the heading only
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not in_table:
            in_table = True  # the header row
            continue
        if set(cells[0]) <= set("-: "):
            continue  # the separator row
        if len(cells) < 2:
            errors.append("%s:%d: table row needs two columns" % (arch_path, n + 1))
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if len(names) != 1:
            errors.append("%s:%d: first column must name one folder in backticks" % (arch_path, n + 1))
            continue
        folder = names[0].strip().strip("/")
        if folder.startswith("src/"):
            folder = folder[4:]
        allowed = set()
        for a in re.findall(r"`([^`]+)`", cells[1]):
            a = a.strip().strip("/")
            if a.startswith("src/"):
                a = a[4:]
            allowed.add(a)
        if folder in rows:
            errors.append("%s:%d: folder %s has two rows" % (arch_path, n + 1, folder))
        rows[folder] = allowed
    if not rows:
        fail_usage('%s: no table under "%s"' % (arch_path, TABLE_HEADING))
    return rows, errors


def find_cycle(rows):
    """Returns a list of folders forming a cycle, or None."""
    state = {}  # 1: on the stack, 2: done
    stack = []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(rows.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state:
                c = visit(v)
                if c:
                    return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(rows):
        if u not in state:
            c = visit(u)
            if c:
                return c
    return None


def folder_of(relpath):
    """The folder a repository path belongs to (backend/cpu -> backend)."""
    parts = relpath.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "include" and len(parts) > 2 and parts[1] == "ctrain":
        return PUBLIC
    if parts[0] == "bench":
        return "bench"
    return None


def source_files(root):
    out = []
    src = os.path.join(root, "src")
    for d, subdirs, files in os.walk(src):
        subdirs.sort()
        for f in sorted(files):
            if f.endswith(SRC_EXTS):
                out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    bench = os.path.join(root, "bench")
    if os.path.isdir(bench):
        for f in sorted(os.listdir(bench)):
            if f.endswith((".c", ".h")) and os.path.isfile(os.path.join(bench, f)):
                out.append("bench/" + f)
    return out


def resolve(root, rel, header, known):
    """The folder of the header that `#include "header"` in rel names, or
    None when it cannot be told."""
    here = os.path.dirname(rel)
    cand = os.path.normpath(os.path.join(here, header)).replace(os.sep, "/")
    if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
        return folder_of(cand)
    if os.path.isfile(os.path.join(root, "include", header)):
        return folder_of("include/" + header)
    if os.path.isfile(os.path.join(root, "src", header)):
        return folder_of("src/" + header)
    # A header that does not exist (yet): judge it by its first component.
    first = header.split("/")[0]
    if first == PUBLIC:
        return PUBLIC
    if "/" in header and first in known:
        return first
    if "/" not in header:
        return folder_of(rel)  # a sibling header of the including file
    return None


def read_exceptions(path):
    """Returns {(file, header): line number} and [errors]."""
    out, errors = {}, []
    if not os.path.exists(path):
        return out, errors
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            body = line.split("#", 1)[0].strip()
            if not body:
                continue
            m = re.match(r"^(\S+)\s*->\s*(\S+)$", body)
            if not m:
                errors.append("%s:%d: expected `file -> header  # reason`, got: %s" % (path, n, line.rstrip()))
                continue
            if "#" not in line:
                errors.append("%s:%d: exception without a reason comment: %s" % (path, n, body))
            key = (m.group(1), m.group(2))
            if key in out:
                errors.append("%s:%d: duplicate exception %s -> %s" % (path, n, key[0], key[1]))
            out[key] = n
    return out, errors


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")))
    ap.add_argument("--arch", help="default: ROOT/docs/ARCHITECTURE.md")
    ap.add_argument("--exceptions", help="default: ROOT/tests/tools/layer_exceptions.txt")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    arch = args.arch or os.path.join(root, "docs", "ARCHITECTURE.md")
    exc_path = args.exceptions or os.path.join(root, "tests", "tools", "layer_exceptions.txt")
    if not os.path.isdir(os.path.join(root, "src")):
        fail_usage("%s has no src/" % root)

    rows, errors = parse_table(arch)
    src_folders = {d for d in os.listdir(os.path.join(root, "src")) if os.path.isdir(os.path.join(root, "src", d))}
    known = src_folders | EXTRA_FOLDERS
    for f in sorted(src_folders - set(rows)):
        errors.append("%s: folder src/%s has no row in the table \"%s\"" % (arch, f, TABLE_HEADING[3:]))
    for f in sorted(set(rows) - known):
        errors.append("%s: the table names folder %s, which is not under src/" % (arch, f))
    for f in sorted(rows):
        for a in sorted(rows[f] - known):
            errors.append("%s: row %s allows unknown folder %s" % (arch, f, a))
    cycle = find_cycle(rows)
    if cycle:
        errors.append("%s: the table is not a DAG: %s" % (arch, " -> ".join(cycle)))

    exceptions, exc_errors = read_exceptions(exc_path)
    errors += exc_errors
    used = set()
    n_includes = 0
    for rel in source_files(root):
        me = folder_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                n_includes += 1
                header = m.group(1)
                target = resolve(root, rel, header, known)
                if target is None:
                    errors.append('%s:%d: #include "%s": cannot tell which folder this header belongs to'
                                  % (rel, n, header))
                    continue
                if target == PUBLIC or target == me:
                    continue
                if target in rows.get(me, set()):
                    continue
                key = (rel, header)
                if key in exceptions:
                    used.add(key)
                    continue
                allowed = sorted(rows.get(me, set()))
                if allowed:
                    rule = "%s may include only %s, ctrain/*.h and its own headers" % (me, ", ".join(allowed))
                else:
                    rule = "%s may include only ctrain/*.h and its own headers" % me
                errors.append('%s:%d: #include "%s": %s may not include %s (%s; table "%s" in %s)'
                              % (rel, n, header, me, target, rule, TABLE_HEADING[3:], os.path.relpath(arch, root)))
    for key, n in sorted(exceptions.items(), key=lambda kv: kv[1]):
        if key not in used:
            errors.append("%s:%d: stale exception %s -> %s: that include no longer occurs or the table allows it;"
                          " delete the line" % (os.path.relpath(exc_path, root), n, key[0], key[1]))

    if errors:
        for e in errors:
            print(e)
        print("check_layers: %d problem(s)" % len(errors))
        return 1
    print("check_layers: %d includes in %d folders follow the table (%d listed exceptions)"
          % (n_includes, len(rows), len(exceptions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
