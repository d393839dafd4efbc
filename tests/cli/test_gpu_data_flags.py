"""--gpu-transforms and --data-on-gpu outside CUDA: refused before any data
is read, with exit code 2 (usage: inconsistent flags, docs/CLI.md) and one
line naming the flag, the device given and --device cuda. On a machine with
a GPU, the same flags on --device cuda must get past that check (a short
synthetic run); without one, --device cuda fails with exit 6 (no device)
before the flags matter, which is also checked. --help lists both flags.

The same for `ctrain eval` and `ctrain predict` (--data and --images): the
same refusal (exit 2, one line naming the command's flag and device, nothing
on stdout) before the weights are read (a missing weights file would be exit
3). On a GPU, eval and predict with either flag on weights trained here on
the CPU must match the cpu device's test loss/accuracy and probabilities,
and under --precision bf16 (the input narrowed to bf16 by the transform)
predict must give the float loader's probabilities."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402
import numpy as np  # noqa: E402

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

# ---- eval and predict ----
work = u.tmpdir("gpu_data_flags")
missing = os.path.join(work, "no-such-weights.safetensors")
png = os.path.join(work, "img.png")
u.write_png(png, np.arange(28 * 28, dtype=np.uint8).reshape(28, 28))
EVAL = ["eval", "--model", "cnn", "--data", "synthetic", "--weights", missing] + u.FAST
PRED_DATA = ["predict", "--model", "cnn", "--data", "synthetic", "--weights", missing] + u.FAST
PRED_IMG = ["predict", "--model", "cnn", "--images", png, "--weights", missing] + u.FAST
for base in (EVAL, PRED_DATA, PRED_IMG):
    cmd = base[0]
    for flag in ("--gpu-transforms", "--data-on-gpu"):
        for dev in ("cpu", "ref"):
            # The flag first and last: it may stand anywhere among the others.
            for args in ([cmd, flag] + base[1:] + ["--device", dev], base + ["--device", dev, flag]):
                r = u.run(args, timeout=60)
                err = r.stderr.strip()
                what = "%s %s on %s" % (cmd, flag, dev)
                u.check(r.returncode == USAGE, "%s: exit %d, expected %d (%s)" % (what, r.returncode, USAGE, err))
                u.check(err.startswith("ctrain %s: " % cmd) and flag in err and "--device cuda" in err
                        and ("'%s'" % dev) in err,
                        "%s: message should name the command, the flag, the device and --device cuda: %r" % (what, err))
                u.check(len(err.splitlines()) == 1, "%s: one line expected: %r" % (what, err))
                u.check(r.stdout.strip() == "", "%s: nothing on stdout (refused before loading): %r" % (what, r.stdout))
    # Both flags: --data-on-gpu is named (it is the stronger mode), as train does.
    r = u.run(base + ["--gpu-transforms", "--data-on-gpu"], timeout=60)
    u.check(r.returncode == USAGE and "--data-on-gpu" in r.stderr,
            "%s with both flags on cpu: exit %d: %r" % (cmd, r.returncode, r.stderr.strip()))
    # Without the flags the same command gets past the check and fails on the
    # missing weights file (exit 3): the refusal above really came first.
    r = u.run(base, timeout=60)
    u.check(r.returncode == 3, "%s without the flags: exit %d (missing weights expected, 3): %r" % (
        cmd, r.returncode, r.stderr.strip()))
for cmd in ("eval", "predict"):
    h = u.run([cmd, "--help"], timeout=30)
    u.check("--gpu-transforms" in h.stdout and "--data-on-gpu" in h.stdout, "%s --help lists both flags" % cmd)

# On cuda: weights trained here on the CPU, evaluated both ways.
wpath = os.path.join(work, "w.safetensors")
u.run_ok(BASE + ["--device", "cpu", "--save", wpath], "train on cpu for the eval weights")
EV = ["eval", "--model", "cnn", "--data", "synthetic", "--weights", wpath] + u.FAST


def metrics(r):
    """test_loss and test_accuracy from eval's line."""
    line = [l for l in r.stdout.splitlines() if l.startswith("test_loss:")]
    if not line:
        return None
    parts = line[0].replace(" - ", " ").split()
    return float(parts[1]), float(parts[3])


cpu = u.run_ok(EV + ["--device", "cpu"], "eval on cpu")
r = u.run(EV + ["--device", "cuda", "--gpu-transforms"], timeout=300)
if r.returncode == NO_DEVICE:
    print("no CUDA device here: eval --device cuda exits %d before the flags matter" % NO_DEVICE)
elif u.check(r.returncode == 0, "eval --gpu-transforms on cuda: exit %d: %s" % (r.returncode, r.stderr.strip())):
    want = metrics(cpu)
    for flag in ("--gpu-transforms", "--data-on-gpu"):
        r = u.run_ok(EV + ["--device", "cuda", flag], "eval %s on cuda" % flag, timeout=300)
        got = metrics(r)
        u.check(got is not None and want is not None and abs(got[0] - want[0]) <= 2e-3 and abs(got[1] - want[1]) <= 1e-2,
                "eval %s on cuda: %r, cpu %r" % (flag, got, want))
        p_cpu = u.run_ok(["predict"] + EV[1:] + ["--device", "cpu"], "predict on cpu")
        p_gpu = u.run_ok(["predict"] + EV[1:] + ["--device", "cuda", flag], "predict %s on cuda" % flag, timeout=300)
        a = [l.split(",") for l in p_cpu.stdout.splitlines()[1:]]
        b = [l.split(",") for l in p_gpu.stdout.splitlines()[1:]]
        diff = max([abs(float(x) - float(y)) for ra, rb in zip(a, b) for x, y in zip(ra[5:], rb[5:])] or [1.0])
        u.check(len(a) == len(b) > 0 and [ra[:3] for ra in a] == [rb[:3] for rb in b] and diff <= 2e-3,
                "predict %s on cuda: %d vs %d rows, probabilities differ by %g" % (flag, len(b), len(a), diff))
    # The narrowed input: under --precision bf16 the GPU transform writes the
    # bf16 (channels-last) batch the first convolution reads, where the float
    # loader's f32 batch is cast by the model: the same values, the same
    # forward, so the same probabilities. Training runs that way too.
    p_f = u.run_ok(["predict"] + EV[1:] + ["--device", "cuda", "--precision", "bf16"], "predict bf16 on cuda",
                   timeout=300)
    for flag in ("--gpu-transforms", "--data-on-gpu"):
        p_n = u.run_ok(["predict"] + EV[1:] + ["--device", "cuda", "--precision", "bf16", flag],
                       "predict bf16 %s on cuda" % flag, timeout=300)
        a = [l.split(",") for l in p_f.stdout.splitlines()[1:]]
        b = [l.split(",") for l in p_n.stdout.splitlines()[1:]]
        diff = max([abs(float(x) - float(y)) for ra, rb in zip(a, b) for x, y in zip(ra[5:], rb[5:])] or [1.0])
        u.check(len(a) == len(b) > 0 and diff <= 1e-6,
                "predict bf16 %s on cuda: %d vs %d rows, probabilities differ from the f32 batch's by %g" % (
                    flag, len(b), len(a), diff))
    u.run_ok(BASE + ["--device", "cuda", "--precision", "bf16", "--data-on-gpu"], "train bf16 --data-on-gpu",
             timeout=300)
u.cleanup(work)
u.finish()
