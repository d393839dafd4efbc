#!/usr/bin/env python3
"""The dependency check can fail (ctest layer_deps_negative).

Copies the tree's src/, include/, bench/*.[ch], docs/ARCHITECTURE.md and
tests/tools/layer_exceptions.txt into a temporary directory, checks that
the copy passes check_layers.py as the tree does, then breaks it one way
at a time and checks that check_layers.py fails naming what broke it:

  1. a forbidden include: core including train/metrics.h;
  2. the command line including an internal header;
  3. a stale exception (one that does not occur);
  4. a table with a cycle (core allowed to include train).

Standard library only. Exit 0 when every broken copy is refused.
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CHECK = os.path.join(HERE, "check_layers.py")


def copy_tree(dst):
    shutil.copytree(os.path.join(ROOT, "src"), os.path.join(dst, "src"))
    shutil.copytree(os.path.join(ROOT, "include"), os.path.join(dst, "include"))
    os.makedirs(os.path.join(dst, "bench"))
    for f in os.listdir(os.path.join(ROOT, "bench")):
        if f.endswith((".c", ".h")):
            shutil.copy(os.path.join(ROOT, "bench", f), os.path.join(dst, "bench", f))
    os.makedirs(os.path.join(dst, "docs"))
    shutil.copy(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), os.path.join(dst, "docs", "ARCHITECTURE.md"))
    os.makedirs(os.path.join(dst, "tests", "tools"))
    shutil.copy(os.path.join(HERE, "layer_exceptions.txt"), os.path.join(dst, "tests", "tools"))


def run(root):
    p = subprocess.run([sys.executable, CHECK, "--root", root], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    return p.returncode, p.stdout


def insert_after_first_line(path, text):
    with open(path) as f:
        lines = f.readlines()
    lines.insert(1, text + "\n")
    with open(path, "w") as f:
        f.writelines(lines)


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="ctrain_layers_") as tmp:
        base = os.path.join(tmp, "base")
        copy_tree(base)
        rc, out = run(base)
        if rc != 0:
            print(out)
            print("FAIL: the unmodified copy does not pass the check")
            return 1

        def case(name, mutate, expect):
            root = os.path.join(tmp, name)
            shutil.copytree(base, root)
            mutate(root)
            rc, out = run(root)
            missing = [e for e in expect if e not in out]
            if rc == 1 and not missing:
                print("ok: %s refused" % name)
                return
            print(out)
            failures.append("%s: rc %d (want 1), missing from the output: %s" % (name, rc, missing))

        case("core_includes_train",
             lambda r: insert_after_first_line(os.path.join(r, "src", "core", "tensor.c"),
                                               '#include "train/metrics.h"'),
             ['src/core/tensor.c:2: #include "train/metrics.h"', "core may not include train"])
        case("cli_includes_internal",
             lambda r: insert_after_first_line(os.path.join(r, "src", "cli", "main.c"),
                                               '#include "nn/model_impl.h"'),
             ['src/cli/main.c:2: #include "nn/model_impl.h"', "cli may not include nn"])

        def stale(r):
            with open(os.path.join(r, "tests", "tools", "layer_exceptions.txt"), "a") as f:
                f.write("src/core/rng.c -> nn/model_impl.h  # no such include\n")
        case("stale_exception", stale, ["stale exception src/core/rng.c -> nn/model_impl.h"])

        def cycle(r):
            p = os.path.join(r, "docs", "ARCHITECTURE.md")
            with open(p) as f:
                s = f.read()
            row = "| `core` | — |"
            if row not in s:
                failures.append("cycle: the table has no row %r to change" % row)
            with open(p, "w") as f:
                f.write(s.replace(row, "| `core` | `train` |", 1))
        case("table_cycle", cycle, ["is not a DAG"])

    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
