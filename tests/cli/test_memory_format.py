"""--memory-format auto|contiguous|channels-last (and --channels-last) on
train, eval and predict: the same run in every format gives the same
losses, accuracies and probabilities up to rounding (convnet: convolutions,
batch norms and pools, so every layout path of the cpu device runs, NHWC
included); a bad value is a usage error (exit 2) naming the flag and the
value; channels-last on the reference device, whose kernels read NCHW only,
exits 6 with one line naming the format and the backend; --help lists
the flag."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
import numpy as np  # noqa: E402

USAGE, NO_DEVICE = 2, 6
# A build without oneDNN computes convolutions on the cpu device with the
# reference kernels, which read NCHW only: channels-last is refused there.
NHWC_ON_CPU = "without oneDNN" not in u.run(["devices"], timeout=30).stdout
d = u.tmpdir("memfmt")
try:
    u.write_idx_dataset(d, np.random.default_rng(3), n_train=192, n_test=96, h=28, w=28)
    data = "fashion-mnist:" + d
    base = ["--model", "convnet", "--data", data, "--batch-size", "32", "--seed", "11"] + u.FAST
    runs = {}
    fmts = [["--memory-format", "contiguous"], ["--memory-format", "auto"]]
    if NHWC_ON_CPU:
        fmts += [["--memory-format", "channels-last"], ["--channels-last"]]
    else:
        r = u.run(["train"] + base + ["--channels-last", "--max-steps", "1"], timeout=120)
        u.check(r.returncode == NO_DEVICE and "channels-last" in r.stderr,
                "channels-last on a cpu device without oneDNN: exit %d, expected %d (%s)" % (r.returncode, NO_DEVICE,
                                                                                             r.stderr.strip()))
    for fmt in fmts:
        key = " ".join(fmt)
        mj, save = os.path.join(d, "m.json"), os.path.join(d, "w-%d.safetensors" % len(runs))
        # SGD, not Adam: convnet's convolution biases feed batch norms, so
        # their true gradient is 0 and what reaches them is rounding noise,
        # which Adam normalises into full-size steps of either sign. Each
        # layout rounds differently, so Adam's test loss drifted 5.5e-4
        # apart on an AVX2 CPU (SGD: equal to 1e-8; the step is compared
        # at 1e-5 in tests/unit/test_layout.c).
        r = u.run_ok(["train"] + base + ["--epochs", "1", "--optimizer", "sgd", "--lr", "0.05", "--save", save,
                                         "--metrics-json", mj] + fmt, "train " + key, timeout=300)
        if r.returncode:
            continue
        m = json.load(open(mj))
        e = u.run_ok(["eval"] + base + ["--weights", save, "--metrics-json", mj] + fmt, "eval " + key, timeout=120)
        ev = json.load(open(mj)) if e.returncode == 0 else {}
        p = u.run_ok(["predict"] + base + ["--weights", save] + fmt, "predict " + key, timeout=120)
        runs[key] = (m, ev, p.stdout)
    ref = runs.get("--memory-format contiguous")
    for key, (m, ev, out) in runs.items():
        if ref is None or key.endswith("contiguous"):
            continue
        for k in ("train_loss", "test_loss"):
            u.check(abs(m[k] - ref[0][k]) <= 1e-4 * max(1.0, abs(ref[0][k])),
                    "%s: train %s %.7f vs contiguous %.7f" % (key, k, m[k], ref[0][k]))
        u.check(abs(m["test_accuracy"] - ref[0]["test_accuracy"]) <= 1.5 / 96,
                "%s: test accuracy %.4f vs contiguous %.4f" % (key, m["test_accuracy"], ref[0]["test_accuracy"]))
        if ev and ref[1]:
            u.check(abs(ev["test_loss"] - ref[1]["test_loss"]) <= 1e-4 * max(1.0, abs(ref[1]["test_loss"])),
                    "%s: eval loss %.7f vs contiguous %.7f" % (key, ev["test_loss"], ref[1]["test_loss"]))
        u.check(out.count("\n") == ref[2].count("\n") and out.count("\n") >= 96,
                "%s: predict printed %d lines, contiguous %d" % (key, out.count("\n"), ref[2].count("\n")))
        print("%-30s train_loss %.9f test_loss %.9f acc %.4f" % (key, m["train_loss"], m["test_loss"],
                                                                   m["test_accuracy"]))
    u.check(len(runs) == len(fmts), "all %d formats should train, eval and predict (%d did)" % (len(fmts), len(runs)))

    r = u.run(["train"] + base + ["--memory-format", "nhwcc"])
    err = r.stderr.strip()
    u.check(r.returncode == USAGE and "--memory-format" in err and "nhwcc" in err,
            "bad --memory-format: exit %d, expected %d, message %r" % (r.returncode, USAGE, err))
    r = u.run(["train"] + base + ["--device", "ref", "--channels-last", "--max-steps", "1"], timeout=120)
    err = r.stderr.strip()
    u.check(r.returncode == NO_DEVICE and "channels-last" in err and "ref" in err and len(err.splitlines()) == 1,
            "channels-last on ref: exit %d, expected %d, message %r" % (r.returncode, NO_DEVICE, err))
    for cmd in ("train", "eval", "predict"):
        h = u.run([cmd, "--help"], timeout=30)
        u.check("--memory-format" in h.stdout and "--channels-last" in h.stdout, "%s --help lists --memory-format" % cmd)
finally:
    u.cleanup(d)
u.finish()
