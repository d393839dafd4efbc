"""DistributedDataParallel over MPI (`ctrain train --strategy ddp`), end to
end on 2 ranks of one thread each, against single-process training.

- Equal to one device: 2 ranks with 16 samples each give the weights one
  process gives with batch 32, after 20 steps, within 1e-5 (normwise):
  the mlp with Adam, the cnn with its Dropout2d with Adam and with SGD +
  momentum (dropout masks are keyed by each sample's number in the global
  batch, so the ranks draw what the whole batch would), with clipping,
  accumulation and recompute together, and under bf16 autocast; under
  fp16 the loss scaler skips the same steps and ends at the same scale.
- The buckets do not change the result: --bucket-mb 0.001 (a bucket per
  parameter) and 1000 (one bucket) are bit-identical to the default; nor
  does ZeRO-1 (--zero 1: gradients reduce-scattered, each rank updating
  its shard, parameters all-gathered), with clipping on, also with uneven
  shards on 4 ranks, nor ZeRO-2 (--zero 2: the other shards' gradient
  pages released, test_mpi_comm.c checks which stay resident); ZeRO-1's
  checkpoints hold the whole state and resume without --zero.
- A DDP run repeats bit for bit; one rank equals single-process training
  bit for bit; --nproc 2 (ctrain starting mpirun itself) equals mpirun.
- SyncBatchNorm (--sync-bn): a batch-norm model on 2 ranks trains as one
  process does on the global batch, within 1e-4 (and does not without it).
- Distributed evaluation counts every test sample once: with 101 test
  samples over 2 ranks the accuracy and loss equal one process's.
- Ranks started with another batch size, seed or model are refused at
  start, naming the difference.
- A rank killed with SIGKILL, or stopped with SIGSTOP, ends the whole job
  non-zero within --dist-timeout, the message naming the collective.
- SIGTERM to the ranks (a scheduler's stop) stops them at one step;
  rank 0's checkpoint resumes to the uninterrupted run's weights bit for
  bit.
- Resume on another world size: a 2-rank run stopped mid-epoch resumes on
  one process (which takes --accumulate 2 to keep the global batch of
  32), and a 1-process run with --accumulate 2 resumes on 2 ranks; both
  end within 1e-6 of the uninterrupted 2-rank run.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_util as mu  # noqa: E402
from mpi_util import u  # noqa: E402


def main():
    u.need_binary()
    u.need_module("st_util")
    mu.need_mpi_build()
    import numpy as np
    d = u.tmpdir("ddp")
    try:
        u.write_idx_dataset(os.path.join(d, "data"), np.random.default_rng(0), n_train=256, n_test=101, h=28, w=28)
        data = ["--data", "mnist:" + os.path.join(d, "data")]
        equivalence(d, data)
        sync_bn(d, data)
        invariance(d, data)
        evaluation(d, data)
        mismatch(d, data)
        faults(d, data)
        signal_resume(d, data)
        other_world(d, data)
    finally:
        u.cleanup(d)
    u.finish()


def pair(d, data, name, model_args, steps=20):
    """Single process with batch 32 and 2 ranks with 16 each (--sync-bn
    for a batch-norm model); returns both weight files' paths."""
    common = model_args + data + ["--epochs", "3", "--max-steps", str(steps)] + u.FAST
    one, two = os.path.join(d, name + "_1.safetensors"), os.path.join(d, name + "_2.safetensors")
    u.run_ok(["train"] + common + ["--batch-size", "32", "--save", one], name + " single")
    sync = ["--sync-bn"] if name == "bn" else []
    mu.ddp_ok(2, common + sync + ["--batch-size", "16", "--save", two], name + " ddp")
    return one, two


def equivalence(d, data):
    cases = [
        ("mlp_adam", ["--model", "mlp", "--optimizer", "adam", "--lr", "0.001"]),
        # seed 1: with seed 0 one conv2 channel parts at step 11 under Adam
        # (1e-5 at step 10, 5e-3 at 11) while SGD stays at 3e-9: a discrete
        # choice flipping under rounding, as it would between two batch
        # sizes on one device (docs/PARALLEL.md).
        ("cnn_adam", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1"]),
        ("cnn_sgd", ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]),
        # The global norm clips (each rank's norm is the summed gradients'),
        # accumulation reduces once per group (no_sync), recompute reruns
        # the dropout and the hooks fire after the rerun layers' backward.
        ("cnn_clip_acc_rc", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1",
                             "--clip-grad-norm", "0.5", "--accumulate", "2", "--recompute", "2"]),
        # bf16 autocast and fp16 with dynamic loss scaling from a scale that
        # overflows: the skipped steps and the final scale must agree too.
        ("cnn_bf16", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1", "--precision", "bf16"]),
    ]
    for name, args in cases:
        one, two = pair(d, data, name, args)
        if not (os.path.exists(one) and os.path.exists(two)):
            continue
        a, b = u.weights(one), u.weights(two)
        err = u.normwise(a, b)
        print("%s: single vs 2-rank ddp after 20 steps: normwise %.3g" % (name, err))
        u.check(err < 1e-5, "%s: 2-rank DDP differs from single-process training by %.3g (> 1e-5)" % (name, err))
    u.fp16_scaler_agrees(d, data, 12, lambda a, what: mu.ddp_ok(2, a + ["--batch-size", "16"], what))


def sync_bn(d, data):
    """A batch-norm model: with --sync-bn 2 ranks train as one process does
    on the global batch (weights and running statistics within 1e-4);
    without it each rank normalises its half, which is not the same."""
    args = ["--model", u.write_bn_model(d), "--optimizer", "adam", "--lr", "0.002"]
    one, two = pair(d, data, "bn", args)
    plain = os.path.join(d, "bn_plain.safetensors")
    mu.ddp_ok(2, args + data + ["--epochs", "3", "--max-steps", "20", "--batch-size", "16", "--save", plain] + u.FAST,
              "bn without --sync-bn")
    if os.path.exists(one) and os.path.exists(two) and os.path.exists(plain):
        a = u.weights(one)
        err, err_plain = u.normwise(a, u.weights(two)), u.normwise(a, u.weights(plain))
        print("batch norm: single vs 2-rank ddp --sync-bn %.3g, without --sync-bn %.3g" % (err, err_plain))
        u.check(err < 1e-4, "--sync-bn: 2 ranks differ from one process by %.3g (> 1e-4)" % err)
        u.check(err_plain > 1e-4, "without --sync-bn the ranks' statistics should differ from the global batch's")


def invariance(d, data):
    # Clipping on (the norm active in the first steps): under --zero each
    # rank measures its shard and the squares are summed.
    base = ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--batch-size", "16", "--epochs", "3",
            "--max-steps", "20", "--clip-grad-norm", "0.5"] + data + u.FAST
    runs = {}
    for tag, extra in (("default", []), ("again", []), ("tiny", ["--bucket-mb", "0.001"]),
                       ("one", ["--bucket-mb", "1000"]), ("zero", ["--zero", "1"]),
                       ("zero_tiny", ["--zero", "1", "--bucket-mb", "0.001"]), ("zero2", ["--zero", "2"])):
        p = os.path.join(d, "inv_%s.safetensors" % tag)
        r = mu.ddp_ok(2, base + extra + ["--save", p], "ddp " + tag)
        runs[tag] = u.weights(p) if os.path.exists(p) else None
        if tag == "zero":
            u.check("ZeRO-1: optimizer state 0.22 of 0.43 MB per rank" in r.stdout,
                    "--zero 1: the banner does not show the per-rank state: %s" % r.stdout[:400])
        if tag == "zero2":
            u.check("ZeRO-2: optimizer state 0.22 of 0.43 MB per rank, gradients 0.11 of 0.22 MB" in r.stdout,
                    "--zero 2: the banner does not show the per-rank state: %s" % r.stdout[:400])
    if all(runs.values()):
        u.check(u.same_bits(runs["default"], runs["again"]), "a DDP run does not repeat bit for bit")
        for tag, flags in (("tiny", "--bucket-mb 0.001"), ("one", "--bucket-mb 1000"), ("zero", "--zero 1"),
                           ("zero_tiny", "--zero 1 --bucket-mb 0.001"), ("zero2", "--zero 2")):
            u.check(u.same_bits(runs["default"], runs[tag]), "%s changes the weights" % flags)
    # Uneven shards: 54090 parameters over 4 ranks.
    four = {}
    for tag, extra in (("plain", []), ("zero", ["--zero", "1"]), ("zero2", ["--zero", "2"])):
        p = os.path.join(d, "four_%s.safetensors" % tag)
        args = ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--batch-size", "8", "--epochs", "3",
                "--max-steps", "8", "--clip-grad-norm", "0.5"] + data + u.FAST
        mu.ddp_ok(4, args + extra + ["--save", p], "4 ranks " + tag)
        four[tag] = u.weights(p) if os.path.exists(p) else None
    if all(four.values()):
        for z in ("zero", "zero2"):
            u.check(u.same_bits(four["plain"], four[z]), "--%s on 4 ranks (uneven shards) changes the weights" % z)
    # One rank is single-process training, bit for bit; --nproc 2 is mpirun.
    single = os.path.join(d, "w1_single.safetensors")
    u.run_ok(["train"] + base + ["--save", single], "single batch 16")
    w1 = os.path.join(d, "w1_ddp.safetensors")
    mu.ddp_ok(1, base + ["--save", w1], "ddp on 1 rank")
    if os.path.exists(single) and os.path.exists(w1):
        u.check(u.same_bits(u.weights(single), u.weights(w1)), "DDP on one rank differs from single-process")
    np2 = os.path.join(d, "nproc.safetensors")
    r = u.run(["train", "--strategy", "ddp", "--nproc", "2"] + base + ["--save", np2], timeout=180)
    u.check(r.returncode == 0, "--nproc 2: exit %d, %s" % (r.returncode, r.stderr.strip()[-1500:]))
    if os.path.exists(np2) and runs["default"]:
        u.check(u.same_bits(runs["default"], u.weights(np2)), "--nproc 2 differs from mpirun -np 2")


def evaluation(d, data):
    """The same weights evaluated by one process and by 2 ranks (lr 0: the
    training does not move them) over 101 test samples."""
    init = os.path.join(d, "cnn_adam_1.safetensors")
    args = ["--model", "cnn", "--init", init, "--optimizer", "sgd", "--lr", "0", "--batch-size", "16", "--epochs",
            "1", "--max-steps", "2"] + data + u.FAST
    m1, m2 = os.path.join(d, "eval_1.json"), os.path.join(d, "eval_2.json")
    u.run_ok(["train"] + args + ["--metrics-json", m1], "eval single")
    mu.ddp_ok(2, args + ["--metrics-json", m2], "eval ddp")
    if os.path.exists(m1) and os.path.exists(m2):
        a, b = u.read_json(m1), u.read_json(m2)
        print("evaluation: single %s / %s, ddp %s / %s" % (a["test_accuracy"], a["test_loss"], b["test_accuracy"],
                                                          b["test_loss"]))
        u.check(a["test_accuracy"] == b["test_accuracy"], "distributed evaluation's accuracy %r != single's %r"
                % (b["test_accuracy"], a["test_accuracy"]))
        u.check(abs(a["test_loss"] - b["test_loss"]) <= 1e-6 * abs(a["test_loss"]),
                "distributed evaluation's loss %r != single's %r" % (b["test_loss"], a["test_loss"]))


def mpmd(parts, timeout=120):
    """mpirun with one rank per argument list (MPMD: `A : B`)."""
    cmd = mu.mpirun_prefix(1)
    for i, args in enumerate(parts):
        if i:
            cmd += [":", "-np", "1"]
        cmd += [u.CTRAIN, "train", "--strategy", "ddp"] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=u.ENV)


def mismatch(d, data):
    base = ["--model", "mlp", "--epochs", "1", "--max-steps", "2"] + data + u.FAST
    for what, a, b in (("batch size", ["--batch-size", "16"], ["--batch-size", "8"]),
                       ("seed", ["--batch-size", "16", "--seed", "1"], ["--batch-size", "16", "--seed", "2"]),
                       ("model", ["--batch-size", "16"], ["--batch-size", "16", "--model", "cnn"])):
        r = mpmd([base + a, base + b])
        err = r.stderr
        u.check(r.returncode != 0, "ranks with different %s: exit 0" % what)
        u.check(what in err and "differs from rank 0" in err or ("rank 1's %s" % what) in err,
                "ranks with different %s: the message does not name it: %s" % (what, err.strip()[-800:]))


def rank_pids(marker, launcher):
    """The ranks' pids: processes whose command line matches marker, but
    the launcher (mpirun's own command line holds the same arguments)."""
    r = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if int(p) not in (os.getpid(), launcher)]


def faults(d, data):
    """One rank killed, then one stopped: the job ends non-zero within the
    timeout instead of hanging."""
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        marker = os.path.join(d, "fault_%d" % sig)
        os.makedirs(marker, exist_ok=True)
        args = ["--model", "cnn", "--batch-size", "8", "--epochs", "50", "--dist-timeout", "5", "--log-dir",
                marker] + data + u.FAST
        cmd = mu.mpirun_prefix(2) + [u.CTRAIN, "train", "--strategy", "ddp"] + args
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             env=u.ENV)
        victim = None
        t0 = time.time()
        while time.time() - t0 < 60 and p.poll() is None:
            pids = rank_pids("ctrain train --strategy ddp .*%s" % marker, p.pid)
            if len(pids) >= 2 and os.path.exists(os.path.join(marker, "history.csv")):
                victim = max(pids)
                break
            time.sleep(0.2)
        if not u.check(victim is not None, "fault %s: the ranks did not start training" % sig.name):
            p.kill()
            p.communicate()
            continue
        os.kill(victim, sig)
        t1 = time.time()
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += "\n(hung: killed by the test)"
        took = time.time() - t1
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
        print("fault %s: job ended in %.1f s, exit %s" % (sig.name, took, p.returncode))
        u.check(p.returncode != 0, "fault %s: the job exited 0" % sig.name)
        u.check(took < 30, "fault %s: the job took %.1f s to end (timeout 5 s)" % (sig.name, took))
        if sig == signal.SIGSTOP:
            u.check("did not complete on rank" in err and "within 5 s" in err,
                    "SIGSTOP: no rank named the collective it waited in: %s" % err.strip()[-800:])


def signal_resume(d, data):
    """SIGTERM to every rank mid-run, as a scheduler (scancel) sends it:
    the ranks agree on one step to stop at (exit 143), rank 0 writes the
    checkpoint, and the resume ends where the uninterrupted run does."""
    ck, logs = os.path.join(d, "ck"), os.path.join(d, "sig_logs")
    base = ["--model", "cnn", "--batch-size", "8", "--epochs", "8", "--optimizer", "adam"] + data + u.FAST
    full = os.path.join(d, "full.safetensors")
    mu.ddp_ok(2, base + ["--save", full], "uninterrupted ddp")
    cmd = mu.mpirun_prefix(2) + [u.CTRAIN, "train", "--strategy", "ddp"] + base + ["--checkpoint-dir", ck,
                                                                                   "--log-dir", logs]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=u.ENV)
    pids = []
    t0 = time.time()
    while time.time() - t0 < 60 and p.poll() is None and len(pids) < 2:
        if os.path.exists(os.path.join(logs, "history.csv")):
            pids = rank_pids("ctrain train --strategy ddp .*%s" % logs, p.pid)
        time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    u.check(len(pids) == 2 and "stopped by signal 15" in out,
            "SIGTERM to both ranks: exit %d, %d ranks signalled, %s %s" % (p.returncode, len(pids), out[-300:], err[-300:]))
    resumed = os.path.join(d, "resumed.safetensors")
    mu.ddp_ok(2, base + ["--checkpoint-dir", ck, "--resume", "--save", resumed], "resumed ddp")
    if os.path.exists(full) and os.path.exists(resumed):
        u.check(u.same_bits(u.weights(full), u.weights(resumed)),
                "a DDP run stopped by SIGTERM and resumed differs from the uninterrupted run")


def train_on(n, args, what):
    """ctrain train on n ranks (n = 1: one process, no --strategy)."""
    return u.run_ok(["train"] + args, what) if n == 1 else mu.ddp_ok(n, args, what)


def other_world(d, data):
    base = ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1", "--batch-size", "16",
            "--epochs", "3"] + data + u.FAST
    full = os.path.join(d, "ow_full.safetensors")
    mu.ddp_ok(2, base + ["--save", full], "uninterrupted 2-rank run")
    # A ZeRO checkpoint holds the whole optimizer state: it resumes without
    # --zero to the uninterrupted run's weights, bit for bit.
    ck = os.path.join(d, "ow_zero")
    mu.ddp_ok(2, base + ["--checkpoint-dir", ck, "--max-steps", "12", "--zero", "1"], "zero, first part")
    out = os.path.join(d, "ow_zero.safetensors")
    mu.ddp_ok(2, base + ["--checkpoint-dir", ck, "--resume", "--save", out], "zero checkpoint resumed plain")
    if os.path.exists(full) and os.path.exists(out):
        u.check(u.same_bits(u.weights(full), u.weights(out)), "a --zero 1 checkpoint resumed without it differs")
    for first, then in ((2, 1), (1, 2)):
        name = "%d rank(s) -> %d" % (first, then)
        ck, out = os.path.join(d, "ow_ck_%d" % first), os.path.join(d, "ow_%d.safetensors" % first)
        acc = ["--accumulate", "2"] if first == 1 else []
        train_on(first, base + acc + ["--checkpoint-dir", ck, "--max-steps", "12"], name + ", first part")
        r = train_on(then, base + ["--checkpoint-dir", ck, "--resume", "--save", out], name + ", resumed")
        u.check("keeps its global batch of 32" in r.stdout, "%s: no note on the accumulation: %s"
                % (name, r.stdout[-500:]))
        if os.path.exists(full) and os.path.exists(out):
            err = u.normwise(u.weights(full), u.weights(out))
            print("resume %s: normwise %.3g from the uninterrupted run" % (name, err))
            u.check(err < 1e-6, "resume %s ends %.3g from the uninterrupted run" % (name, err))
    # 2 ranks x --accumulate 3 = 6 batches a step: 4 ranks cannot keep it.
    ck = os.path.join(d, "ow_ck_6")
    mu.ddp_ok(2, base + ["--checkpoint-dir", ck, "--accumulate", "3", "--max-steps", "2"], "2 ranks x 3")
    r = mu.ddp(4, base + ["--checkpoint-dir", ck, "--resume"])
    u.check(r.returncode == 2 and "cannot keep that global batch" in r.stderr,
            "resume of 6 batches a step on 4 ranks: exit %d, %s" % (r.returncode, r.stderr.strip()[-500:]))


if __name__ == "__main__":
    main()
