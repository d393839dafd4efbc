"""Bit-exact resume through the ctrain command, and checkpoint hygiene.

Run A trains 3 epochs uninterrupted. Run B is the same command stopped by
--max-steps in the middle of epoch 2 (a checkpoint is written there), then
rerun without --max-steps plus --resume: its final weights, last
checkpoint (model and optimizer state) and history must equal A's bit for
bit (history except the seconds column). The model has batchnorm (running
statistics) and both dropout kinds (masks from the counter-based RNG), the
optimizer is Adam with ReduceLROnPlateau; a second pair uses SGD with
momentum and a step schedule that changes the LR every epoch, a third
AdamW with OneCycle (stepped every step) and gradient clipping, a fourth
SGD with momentum under OneCycle, which cycles the momentum. Run B's
loader uses a worker thread where A's loads inline: the data order must
not depend on it.

Also: per-epoch checkpoints, only --keep-last N kept, best.safetensors,
no temporary files left; a checkpoint that cannot be written stops the
run with a message naming the path; --resume with another model,
optimizer or LR is refused before anything is written.
"""
import glob
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st_util = u.need_module("st_util")

MODEL = """# batchnorm + dropout2d + dropout: everything resume must carry over
input 1x12x12
conv2d 1 8 3 padding=1
batchnorm2d 8
relu
maxpool2d 2
dropout2d 0.25
flatten
dropout 0.2
linear 288 4
"""
BATCHES = 16  # synthetic train split: 1024 samples / batch 64


def raw_tensors(path):
    """{name: (dtype, shape, bytes)} straight from the file."""
    tensors, meta = st_util.load(path)
    return {k: (str(v.dtype), tuple(v.shape), st_util.tensor_bytes(v)) for k, v in tensors.items()}, meta


def same_tensors(what, pa, pb):
    ta, _ = raw_tensors(pa)
    tb, _ = raw_tensors(pb)
    u.check(sorted(ta) == sorted(tb), "%s: tensor names differ: %s vs %s" % (what, sorted(ta), sorted(tb)))
    diff = [k for k in ta if k in tb and ta[k] != tb[k]]
    u.check(not diff, "%s: tensors differ: %s" % (what, diff[:8]))
    return not diff


def history_without_seconds(path):
    rows = u.read_csv(path)
    if not rows:
        return rows
    keep = [i for i, name in enumerate(rows[0]) if name != "seconds"]
    return [[r[i] for i in keep if i < len(r)] for r in rows]


def file_state(d):
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*"))):
        with open(p, "rb") as f:
            out[os.path.basename(p)] = (os.stat(p).st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
    return out


def no_temp_files(what, d):
    left = glob.glob(os.path.join(d, "*.tmp.*"))
    u.check(not left, "%s: temporary files left in %s: %s" % (what, d, left))


def pair(tag, work, model, train_args, keep_last, k_stop):
    """Runs A and the interrupted-then-resumed B; compares them."""
    a_dir, b_dir = os.path.join(work, tag + "_ckA"), os.path.join(work, tag + "_ckB")
    a_log, b_log = os.path.join(work, tag + "_logA"), os.path.join(work, tag + "_logB")
    a_w, b_w = os.path.join(work, tag + "_a.safetensors"), os.path.join(work, tag + "_b.safetensors")
    a_m, b_m = os.path.join(work, tag + "_a.json"), os.path.join(work, tag + "_b.json")
    base = ["train", "--model", model] + train_args + ["--epochs", "3", "--keep-last", str(keep_last)]
    ra = u.run_ok(base + ["--threads", "1", "--workers", "0", "--checkpoint-dir", a_dir, "--log-dir", a_log, "--save",
                          a_w, "--metrics-json", a_m], "%s: run A" % tag)
    b_cmd = base + ["--threads", "1", "--workers", "1", "--checkpoint-dir", b_dir, "--log-dir", b_log, "--save", b_w,
                    "--metrics-json", b_m]
    rb1 = u.run_ok(b_cmd + ["--max-steps", str(k_stop)], "%s: run B (stopped by --max-steps %d)" % (tag, k_stop))
    if ra.returncode or rb1.returncode:
        return
    # The interrupted run left a mid-epoch checkpoint of epoch 2.
    last_b = os.path.join(b_dir, "last.safetensors")
    if u.check(os.path.exists(last_b), "%s: no last.safetensors after --max-steps" % tag):
        _, meta = raw_tensors(last_b)
        u.check(meta.get("format") == "ctrain-checkpoint-1", "%s: checkpoint format %r" % (tag, meta.get("format")))
        u.check(meta.get("loop.epoch") == "1" and meta.get("loop.batch") == str(k_stop - BATCHES) and
                meta.get("loop.step") == str(k_stop),
                "%s: mid-epoch checkpoint at epoch %r batch %r step %r, expected 1, %d, %d" % (
                    tag, meta.get("loop.epoch"), meta.get("loop.batch"), meta.get("loop.step"), k_stop - BATCHES, k_stop))
        u.check(any(k.startswith("optim.") for k in raw_tensors(last_b)[0]), "%s: checkpoint has no optimizer state" % tag)
    u.check(os.path.exists(os.path.join(b_dir, "epoch-0001.safetensors")), "%s: epoch-0001 missing after B1" % tag)
    u.check(not os.path.exists(os.path.join(b_dir, "epoch-0002.safetensors")),
            "%s: epoch-0002 exists though epoch 2 did not finish" % tag)
    hist_b1 = u.read_csv(os.path.join(b_log, "history.csv"))
    u.check(len(hist_b1) == 2, "%s: history after the interrupted run has %d lines, expected header + epoch 1" % (
        tag, len(hist_b1)))

    rb2 = u.run_ok(b_cmd + ["--resume"], "%s: run B --resume" % tag)
    if rb2.returncode:
        return
    u.check("resumed from epoch 1" in rb2.stdout, "%s: resume not reported: %s" % (tag, rb2.stdout[-300:]))
    same_tensors("%s: final --save weights A vs resumed B" % tag, a_w, b_w)
    same_tensors("%s: last checkpoint (model + optimizer) A vs B" % tag, os.path.join(a_dir, "last.safetensors"),
                 last_b)
    ha = history_without_seconds(os.path.join(a_log, "history.csv"))
    hb = history_without_seconds(os.path.join(b_log, "history.csv"))
    u.check(len(ha) == 4, "%s: history of A has %d lines, expected header + 3 epochs" % (tag, len(ha)))
    u.check(ha == hb, "%s: history differs:\nA %s\nB %s" % (tag, ha, hb))
    ma, mb = u.read_json(a_m), u.read_json(b_m)
    for k in ("test_loss", "test_accuracy", "train_loss", "steps", "epochs"):
        if k == "epochs":
            continue  # B's second process ran only the remaining epochs
        u.check(ma.get(k) == mb.get(k), "%s: metrics %s: A %r, resumed B %r" % (tag, k, ma.get(k), mb.get(k)))
    u.check(mb.get("resumed_from_epoch") == 1 and ma.get("resumed_from_epoch") == -1,
            "%s: resumed_from_epoch A %r B %r" % (tag, ma.get("resumed_from_epoch"), mb.get("resumed_from_epoch")))
    u.check(ma.get("steps") == 3 * BATCHES, "%s: steps %r" % (tag, ma.get("steps")))

    # Checkpoint directory layout.
    for d in (a_dir, b_dir):
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*")))
        want_epochs = ["epoch-%04d.safetensors" % e for e in range(3 - keep_last + 1, 4)]
        u.check([n for n in names if n.startswith("epoch-")] == want_epochs,
                "%s: %s holds %s, expected the last %d epoch files %s" % (tag, d, names, keep_last, want_epochs))
        u.check("last.safetensors" in names and "best.safetensors" in names,
                "%s: %s lacks last/best: %s" % (tag, d, names))
        no_temp_files(tag, d)
    # best is one of the epochs; last equals the newest epoch file.
    same_tensors("%s: last vs epoch-0003" % tag, os.path.join(a_dir, "last.safetensors"),
                 os.path.join(a_dir, "epoch-0003.safetensors"))
    _, bm = raw_tensors(os.path.join(a_dir, "best.safetensors"))
    u.check(bm.get("loop.best_epoch") in ("0", "1", "2"), "%s: best checkpoint's best_epoch %r" % (
        tag, bm.get("loop.best_epoch")))
    return b_cmd, b_dir, b_w


def refused(what, cmd, ck_dir, save, must_name):
    """--resume with changed settings: non-zero exit, message, nothing written."""
    before = file_state(ck_dir)
    save_before = file_state(os.path.dirname(save))
    r = u.run(cmd)
    u.check(r.returncode != 0, "%s: exit 0; expected a refusal" % what)
    u.check(r.returncode == 2, "%s: exit %d, expected 2 (inconsistent flags)" % (what, r.returncode))
    err = r.stderr.strip()
    u.check(err.startswith("ctrain: error:") and all(w in err for w in must_name),
            "%s: message %r should name %s" % (what, err, must_name))
    u.check(file_state(ck_dir) == before, "%s: the checkpoint directory changed" % what)
    u.check(file_state(os.path.dirname(save)) == save_before, "%s: files next to --save changed" % what)


def corrupt_metadata(work, b_cmd, b_dir, with_flag):
    """A checkpoint whose metadata numbers do not read: exit 4 naming the
    file and the key, nothing written. strtod alone once took "abc" as 0."""
    import shutil
    tensors, meta = st_util.load(os.path.join(b_dir, "last.safetensors"))
    d = os.path.join(work, "ck_corrupt")
    save = os.path.join(work, "corrupt", "w.safetensors")
    os.makedirs(os.path.dirname(save))
    cmd = with_flag(with_flag(b_cmd, "--checkpoint-dir", d), "--save", save) + ["--resume"]
    # The same metadata rewritten must still resume (the test's own control).
    cases = [(None, None, None)] + [
        ("loop.epoch", "abc", "loop.epoch"), ("loop.epoch", "-3", "loop.epoch"), ("loop.step", "12x", "loop.step"),
        ("loop.best", "nan", "loop.best"), ("loop.train_seconds", "inf", "loop.train_seconds"),
        ("optim.steps", "", "optim.steps"), ("optim.scalar.lr", "-1", "optim.scalar.lr"),
        ("accumulate", "0", "accumulate"), ("scaler.enabled", "2", "scaler.enabled"),
        ("history", meta["history"] + ",0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5", "history"),
        ("history", meta["history"].replace(";1,", ";1e3x,", 1), "history"),
    ]
    for key, value, must in cases:
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(b_dir, d)
        m = dict(meta)
        if key:
            m[key] = value
        st_util.save(os.path.join(d, "last.safetensors"), tensors, m)
        r = u.run(cmd)
        what = "resume with metadata %s=%r" % (key, value)
        if not key:
            u.check(r.returncode == 0, "rewritten checkpoint: exit %d, %r" % (r.returncode, r.stderr.strip()[-500:]))
            os.remove(save)
            continue
        err = r.stderr.strip()
        u.check(r.returncode == 4, "%s: exit %d, expected 4 (bad input): %r" % (what, r.returncode, err))
        u.check("last.safetensors" in err and must in err, "%s: message %r should name the file and %s" % (
            what, err, must))
        u.check(not os.path.exists(save), "%s: --save written" % what)


def unwritable(work, model, args):
    # 1. The checkpoint dir's parent is a regular file: mkdir fails up front.
    blocker = os.path.join(work, "plainfile")
    with open(blocker, "w") as f:
        f.write("x")
    r = u.run(["train", "--model", model] + args + u.FAST + ["--max-steps", "2", "--checkpoint-dir",
                                                          os.path.join(blocker, "ck")])
    u.check(r.returncode == 3, "checkpoint dir under a file: exit %d, expected 3 (I/O)" % r.returncode)
    u.check("plainfile/ck" in r.stderr and "ctrain: error:" in r.stderr,
            "checkpoint dir under a file: message %r does not name the path" % r.stderr.strip())
    # 2. The epoch file's name is taken by a directory: the atomic rename
    #    fails after the data was written; the run stops, no temp file stays.
    d = os.path.join(work, "ck_blocked")
    os.makedirs(os.path.join(d, "epoch-0001.safetensors"))
    save = os.path.join(work, "blocked.safetensors")
    r = u.run(["train", "--model", model] + args + u.FAST + ["--epochs", "2", "--checkpoint-dir", d, "--save", save])
    u.check(r.returncode == 3, "blocked checkpoint file: exit %d, expected 3 (I/O)" % r.returncode)
    u.check("epoch-0001.safetensors" in r.stderr and "ctrain: error:" in r.stderr,
            "blocked checkpoint file: message %r does not name the file" % r.stderr.strip())
    u.check(not os.path.exists(save), "blocked checkpoint file: --save written though the run failed")
    no_temp_files("blocked checkpoint file", d)
    # 3. A read-only directory (only meaningful when not root).
    if os.geteuid() != 0:
        ro = os.path.join(work, "ck_ro")
        os.makedirs(ro)
        os.chmod(ro, 0o555)
        r = u.run(["train", "--model", model] + args + u.FAST + ["--max-steps", "2", "--checkpoint-dir", ro])
        u.check(r.returncode == 3 and "ck_ro" in r.stderr, "read-only checkpoint dir: exit %d, %r" % (
            r.returncode, r.stderr.strip()))
        os.chmod(ro, 0o755)


def main():
    work = u.tmpdir("resume")
    try:
        model = os.path.join(work, "bn_drop.txt")
        with open(model, "w") as f:
            f.write(MODEL)
        data = ["--data", "synthetic", "--input", "1x12x12", "--classes", "4", "--batch-size", "64", "--seed", "7"]
        out = pair("adam_plateau", work, model, data + ["--optimizer", "adam", "--lr", "0.002", "--scheduler",
                                                        "plateau"], 2, BATCHES + 7)
        pair("sgd_step", work, model, data + ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                                              "--weight-decay", "0.0005", "--scheduler", "step"], 1, BATCHES + 11)
        # A per-step schedule: the interrupted run must follow the same
        # curve (the schedule spans --epochs, not --max-steps).
        pair("adamw_onecycle", work, model, data + ["--optimizer", "adamw", "--lr", "0.004", "--scheduler",
                                                    "onecycle", "--clip-grad-norm", "1.0"], 3, BATCHES + 5)
        # SGD whose momentum OneCycle cycles every step (0.85..0.95): the
        # resumed run must take up the cycle's momentum, not --momentum's.
        pair("sgd_onecycle", work, model, data + ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                                                  "--scheduler", "onecycle"], 2, BATCHES + 3)
        if out:
            b_cmd, b_dir, b_w = out

            def with_flag(cmd, flag, value):
                c = list(cmd)
                if flag in c:
                    c[c.index(flag) + 1] = value
                    return c
                return c + [flag, value]

            new_save = os.path.join(work, "refused", "w.safetensors")
            os.makedirs(os.path.dirname(new_save))
            b = with_flag(b_cmd, "--save", new_save) + ["--resume"]
            refused("--resume with another --model", with_flag(with_flag(b, "--model", "mlp"), "--metrics-json",
                                                               new_save + ".json"), b_dir, new_save, ["model"])
            refused("--resume with --optimizer adamw", with_flag(b, "--optimizer", "adamw"), b_dir, new_save,
                    ["optimizer"])
            # SGD keeps other state tensors than Adam: still a settings error.
            refused("--resume with --optimizer sgd", with_flag(b, "--optimizer", "sgd"), b_dir, new_save,
                    ["optimizer"])
            refused("--resume with another --lr", with_flag(b, "--lr", "0.01"), b_dir, new_save, ["lr"])
            # An empty checkpoint dir: nothing to resume from.
            empty = os.path.join(work, "empty_ck")
            r = u.run(with_flag(b, "--checkpoint-dir", empty))
            u.check(r.returncode != 0 and "last.safetensors" in r.stderr,
                    "--resume from an empty dir: exit %d, %r" % (r.returncode, r.stderr.strip()))
            u.check(not os.path.exists(new_save), "--resume from an empty dir wrote --save")
            corrupt_metadata(work, b_cmd, b_dir, with_flag)
        unwritable(work, model, data + ["--optimizer", "adam"])
    finally:
        u.cleanup(work)
    u.finish()


if __name__ == "__main__":
    main()
