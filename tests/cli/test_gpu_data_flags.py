"""--gpu-transforms and --data-on-gpu outside CUDA: refused before any data
is read, with exit code 2 (usage: inconsistent flags, docs/CLI.md) and one
line naming the flag, the device given and --device cuda. On a machine with
a GPU, the same flags on --device cuda must get past that check (a short
synthetic run); without one, --device cuda fails with exit 6 (no device)
before the flags matter, which is also checked. --help lists both flags."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
USAGE, NO_DEVICE = 2, 6
BASE = ["train", "--model", "cnn", "--data", "synthetic", "--epochs", "1", "--max-steps", "2"] + u.FAST

for flag in ("--gpu-transforms", "--data-on-gpu"):
    for dev in ("cpu", "ref", "cpu:1"):
        r = u.run(BASE + ["--device", dev, flag], timeout=60)
        err = r.stderr.strip()
        u.check(r.returncode == USAGE, "%s on %s: exit %d, expected %d (%s)" % (flag, dev, r.returncode, USAGE, err))
        u.check(flag in err and "--device cuda" in err and ("'%s'" % dev) in err,
                "%s on %s: message should name the flag, the device and --device cuda: %r" % (flag, dev, err))
        u.check(len(err.splitlines()) == 1, "%s on %s: one line expected: %r" % (flag, dev, err))
        u.check(r.stdout.strip() == "", "%s on %s: nothing on stdout (refused before loading): %r" % (flag, dev, r.stdout))
    # The default device is cpu: refused too.
    r = u.run(BASE + [flag], timeout=60)
    u.check(r.returncode == USAGE, "%s with the default device: exit %d" % (flag, r.returncode))

# On cuda the flags pass the check; without a GPU the device open fails (6).
r = u.run(BASE + ["--device", "cuda", "--gpu-transforms"], timeout=300)
if r.returncode == NO_DEVICE:
    print("no CUDA device here: --device cuda exits %d before the flags matter" % NO_DEVICE)
else:
    u.check(r.returncode == 0, "--gpu-transforms on cuda: exit %d: %s" % (r.returncode, r.stderr.strip()))
    r = u.run(BASE + ["--device", "cuda", "--data-on-gpu"], timeout=300)
    u.check(r.returncode == 0, "--data-on-gpu on cuda: exit %d: %s" % (r.returncode, r.stderr.strip()))

h = u.run(["train", "--help"], timeout=30)
u.check("--gpu-transforms" in h.stdout and "--data-on-gpu" in h.stdout, "train --help lists both flags")
u.finish()
