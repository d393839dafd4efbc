"""DataParallel in one process (`ctrain train --strategy dp --devices
cpu:0,cpu:1`): a persistent replica per virtual CPU device, each global
batch split across them, against single-device training.

- Equal to one device on the same global batch (32) after 20 steps,
  within 1e-5 (normwise): the mlp with Adam, the cnn (with Dropout2d)
  with Adam and with SGD + momentum, and the cnn under bf16 autocast (the
  replicas keep the model's precision).
- A last batch smaller than the number of devices (257 samples, batch 32:
  a last batch of 1) still trains as one device does.
- SyncBatchNorm (--sync-bn): a batch-norm model trains as one device
  does, also with that last batch of one sample.
- A DP run repeats bit for bit, and a run stopped by --max-steps and
  resumed ends bit-identical to the uninterrupted one.
- The evaluation split across the replicas gives one device's accuracy
  exactly (the same weights: lr 0).
- Each replica plans for its slice: device 0's step memory plan is below
  the single device's for the whole batch.
- `ctrain summary --optimizer adam --strategy ddp --nproc 4 --zero 1|2`
  shows the optimizer state and each rank's part of it.
- A device without its own thread (cpu) or a single device is refused,
  and the data-parallel flags' usage errors name the flag (exit 2).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

DP = ["--strategy", "dp", "--devices", "cpu:0,cpu:1"]


def plan_mb(out):
    m = re.search(r"step memory plan ([0-9.]+) MB", out)
    return float(m.group(1)) if m else None


def main():
    u.need_binary()
    u.need_module("st_util")
    import numpy as np
    d = u.tmpdir("dp")
    try:
        u.write_idx_dataset(os.path.join(d, "data"), np.random.default_rng(0), n_train=256, n_test=101, h=28, w=28)
        data = ["--data", "mnist:" + os.path.join(d, "data")]
        cases = [
            ("mlp_adam", ["--model", "mlp", "--optimizer", "adam", "--lr", "0.001"] + data),
            ("cnn_adam", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1"] + data),
            ("cnn_sgd", ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"] + data),
            ("cnn_bf16", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--precision", "bf16"] + data),
            ("cnn_tail", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--data", "synthetic:257",
                          "--input", "1x28x28", "--classes", "10"]),
            # SyncBatchNorm: the replicas normalise with the global batch's
            # statistics, also when one holds no samples (the tail).
            ("bn_sync", ["--model", u.write_bn_model(d), "--optimizer", "adam", "--lr", "0.002", "--sync-bn"] + data),
            ("bn_tail", ["--model", u.write_bn_model(d), "--optimizer", "adam", "--lr", "0.002", "--sync-bn",
                         "--data", "synthetic:257", "--input", "1x28x28", "--classes", "10"]),
        ]
        for name, args in cases:
            common = ["train"] + args + ["--batch-size", "32", "--epochs", "3", "--max-steps", "20"] + u.FAST
            one, two = os.path.join(d, name + "_1.safetensors"), os.path.join(d, name + "_dp.safetensors")
            single = [a for a in common if a != "--sync-bn"]
            r1 = u.run_ok(single + ["--save", one], name + " single")
            r2 = u.run_ok(common + DP + ["--save", two], name + " dp")
            if not (os.path.exists(one) and os.path.exists(two)):
                continue
            err = u.normwise(u.weights(one), u.weights(two))
            print("%s: single vs dp over 2 devices after 20 steps: normwise %.3g" % (name, err))
            u.check(err < 1e-5, "%s: DP differs from one device by %.3g (> 1e-5)" % (name, err))
            if name == "cnn_adam":
                p1, p2 = plan_mb(r1.stdout), plan_mb(r2.stdout)
                u.check(p1 and p2 and p2 < p1, "device 0's plan %s MB is not below one device's %s MB" % (p2, p1))
                again = os.path.join(d, "again.safetensors")
                u.run_ok(common + DP + ["--save", again], "dp again")
                if os.path.exists(again):
                    u.check(u.same_bits(u.weights(two), u.weights(again)), "a DP run does not repeat bit for bit")
        resume(d, data)
        evaluation(d, data)
        refusals(data)
        summary_zero()
    finally:
        u.cleanup(d)
    u.finish()


def resume(d, data):
    base = ["train", "--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--batch-size", "32", "--epochs",
            "3"] + data + u.FAST + DP
    full, res, ck = os.path.join(d, "full.safetensors"), os.path.join(d, "res.safetensors"), os.path.join(d, "ck")
    u.run_ok(base + ["--save", full], "dp uninterrupted")
    u.run_ok(base + ["--checkpoint-dir", ck, "--max-steps", "11"], "dp first part")
    u.run_ok(base + ["--checkpoint-dir", ck, "--resume", "--save", res], "dp resumed")
    if os.path.exists(full) and os.path.exists(res):
        u.check(u.same_bits(u.weights(full), u.weights(res)), "a DP run resumed differs from the uninterrupted one")


def evaluation(d, data):
    init = os.path.join(d, "cnn_adam_1.safetensors")
    args = ["train", "--model", "cnn", "--init", init, "--optimizer", "sgd", "--lr", "0", "--batch-size", "32",
            "--epochs", "1", "--max-steps", "1"] + data + u.FAST
    m1, m2 = os.path.join(d, "e1.json"), os.path.join(d, "e2.json")
    u.run_ok(args + ["--metrics-json", m1], "eval single")
    u.run_ok(args + DP + ["--metrics-json", m2], "eval dp")
    if os.path.exists(m1) and os.path.exists(m2):
        a, b = u.read_json(m1), u.read_json(m2)
        u.check(a["test_accuracy"] == b["test_accuracy"], "DP evaluation's accuracy %r != one device's %r"
                % (b["test_accuracy"], a["test_accuracy"]))
        u.check(abs(a["test_loss"] - b["test_loss"]) <= 1e-6 * abs(a["test_loss"]),
                "DP evaluation's loss %r != one device's %r" % (b["test_loss"], a["test_loss"]))


def refusals(data):
    base = ["train", "--model", "mlp", "--epochs", "1", "--max-steps", "1"] + data + u.FAST
    r = u.run(base + ["--strategy", "dp", "--devices", "cpu,cpu:1"])
    u.check(r.returncode == 6 and "virtual host devices" in r.stderr, "dp on cpu: exit %d, %s"
            % (r.returncode, r.stderr.strip()))
    r = u.run(base + ["--strategy", "dp", "--devices", "cpu:0"])
    u.check(r.returncode == 2 and "2 or more devices" in r.stderr, "dp on one device: exit %d, %s"
            % (r.returncode, r.stderr.strip()))
    r = u.run(base + ["--strategy", "dp"])
    u.check(r.returncode == 2 and "--devices" in r.stderr, "dp without --devices: exit %d, %s"
            % (r.returncode, r.stderr.strip()))
    # Host replicas sum whole gradients: buckets are DP's over GPUs only.
    r = u.run(base + ["--strategy", "dp", "--devices", "cpu:0,cpu:1", "--bucket-mb", "1"])
    u.check(r.returncode == 6 and "DataParallel's over GPUs" in r.stderr, "dp on cpu with --bucket-mb: exit %d, %s"
            % (r.returncode, r.stderr.strip()))
    # The data-parallel flags' usage errors name the flag.
    for flags, says in ((["--strategy", "foo"], "--strategy expects single, dp or ddp"),
                        (["--nproc", "2"], "need --strategy ddp"),
                        (["--bucket-mb", "2"], "--bucket-mb needs --strategy ddp, or dp over GPUs"),
                        (["--sync-bn"], "--sync-bn needs --strategy dp or ddp"),
                        (["--strategy", "ddp", "--zero", "3"], "--zero expects 0, 1 or 2"),
                        (["--strategy", "ddp", "--nproc", "1.5"], "--nproc expects an integer")):
        r = u.run(base + flags)
        u.check(r.returncode == 2 and says in r.stderr, "%s: exit %d, %s" % (" ".join(flags), r.returncode,
                                                                             r.stderr.strip()))


def summary_zero():
    """summary shows the optimizer state and, under ZeRO-1, each rank's
    part: Adam's 2 x 54090 values of the cnn are 0.43 MB, 0.11 MB per rank
    over 4 ranks (the largest shard, 13523 values); under ZeRO-2 the
    gradients' shard too (0.05 of 0.22 MB), and what a GPU would keep."""
    r = u.run_ok(["summary", "--model", "cnn", "--optimizer", "adam", "--strategy", "ddp", "--nproc", "4", "--zero",
                  "1"], "summary --zero 1")
    u.check("Optimizer state (MB): 0.43  (adam: 2 buffers of the 54090-value flat parameter buffer)" in r.stdout and
            "ZeRO-1 over 4 ranks: 0.11 MB of optimizer state per rank (the largest shard), 0.32 MB saved per rank"
            in r.stdout, "summary --zero 1: %s" % r.stdout[-400:])
    r = u.run_ok(["summary", "--model", "cnn", "--optimizer", "adam", "--strategy", "ddp", "--nproc", "4", "--zero",
                  "2"], "summary --zero 2")
    u.check("ZeRO-2 gradients on the CPU: 0.05 of 0.22 MB per rank between steps (0.16 MB saved" in r.stdout,
            "summary --zero 2: %s" % r.stdout[-400:])
    # On a GPU a bucket slot holds whole parameters, and one weight is 95%
    # of the cnn: the slots and the shard would hold no less.
    u.check("ZeRO-2 gradients on a GPU: whole, 0.22 MB per rank" in r.stdout, "summary --zero 2: %s" % r.stdout[-400:])
    r = u.run(["summary", "--model", "cnn", "--zero", "1"])
    u.check(r.returncode == 2 and "need --strategy ddp" in r.stderr, "summary --zero 1 alone: exit %d, %s"
            % (r.returncode, r.stderr.strip()))


if __name__ == "__main__":
    main()
