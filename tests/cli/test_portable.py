"""The default build is portable: it runs on a CPU without AVX-512.

valgrind's CPU has no AVX-512 (it reports none and stops on any AVX-512
instruction), so the ctrain command runs under it (the `none` tool, which
emulates the instructions and checks nothing else): `ctrain version`, and
one training step of the cnn with NCHW activations, whose 2x2 max pools
take the pooling tiles that have an AVX-512 variant picked at run time.
A build with -DCTRAIN_NATIVE=ON on an AVX-512 machine may fail this, by
design; the test then says which build it ran. Skipped without valgrind
(apt-get install valgrind).
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402


def grind(args, timeout):
    # --trace-children: the command re-executes itself once at start.
    cmd = ["valgrind", "-q", "--tool=none", "--trace-children=yes", u.CTRAIN] + args
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout * u.TIME_SCALE,
                          env=u.ENV)


def main():
    u.need_binary()
    if not shutil.which("valgrind"):
        print("skip: valgrind not found (apt-get install valgrind)")
        sys.exit(77)
    r = grind(["version"], 120)
    u.check(r.returncode == 0 and r.stdout.startswith("ctrain "),
            "ctrain version under valgrind: exit %d: %s %s" % (r.returncode, r.stdout, r.stderr[-1500:]))
    r = grind(["train", "--model", "cnn", "--data", "synthetic:48", "--batch-size", "32", "--epochs", "1",
               "--max-steps", "1", "--memory-format", "contiguous", "--seed", "1"] + u.FAST, 600)
    u.check(r.returncode == 0 and "test_accuracy" in r.stdout,
            "one cnn step under valgrind: exit %d: %s" % (r.returncode, (r.stdout + r.stderr)[-2000:]))
    u.finish()


if __name__ == "__main__":
    main()
