"""What a long run meets, end to end (issue 44): special files as outputs
and inputs, signals, a resume of a finished run, crafted checkpoint
metadata, stale temp files and a kill campaign. Every node, link and FIFO
is made in a temp directory, never the system's own.

- --save through a symlink replaces the link's target and keeps the link;
  --save into a FIFO with a reader writes through it; --save and
  --metrics-json into /proc fail before the first step.
- a FIFO named *.png in a folder dataset, and one given to predict
  --images, are refused at once (they hung in open()).
- SIGTERM stops at a step boundary: exit 143, a mid-epoch checkpoint,
  --save and --metrics-json (stopped_by_signal 15); the resumed run ends
  bit-identical to an uninterrupted one. Two SIGINTs exit 130 at once.
- the cnn at --lr 1e6 stops non-zero naming the step (it trained to NaN
  weights and exited 0), or passes over those steps with --on-nonfinite
  skip; with CTRAIN_TEST_DEVICE=cuda (emu_cli_test_reliability) only this
  case runs, for the guard in the fused device kernels.
- weights holding NaN (eval --weights, train --init) are refused with
  exit 4 naming the tensor and the count.
- resuming a finished run reports its numbers, not zeros; a checkpoint
  whose counters disagree (correct > seen, an epoch of 2^53 + 1) is
  refused with exit 4 naming the key.
- a full disk (RLIMIT_FSIZE: EFBIG) at a checkpoint keeps the previous one
  intact and names the cause (exit 3); at the logs, training goes on with
  a warning and the events file ends at a whole record.
- 10 SIGKILLs at random times across a run with checkpoints: each resume
  goes on, the final weights are bit-identical to an uninterrupted run,
  and no temp file is left in the checkpoint directory.
"""
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st = u.need_module("st_util")
np = u.need_module("numpy")

BASE = ["--model", "mlp", "--batch-size", "32", "--seed", "3", "--optimizer", "adam", "--lr", "0.001"] + u.FAST


def popen(args, out):
    return subprocess.Popen([u.CTRAIN] + u.with_device(args), stdout=out, stderr=subprocess.STDOUT, env=u.ENV)


def same_file(a, b, what):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        u.check(fa.read() == fb.read(), "%s: %s and %s differ" % (what, a, b))


def special_outputs(d):
    data = ["--data", "synthetic:64", "--epochs", "1"] + BASE
    real = os.path.join(d, "real.safetensors")
    link = os.path.join(d, "link.safetensors")
    open(real, "w").close()
    os.symlink("real.safetensors", link)
    u.run_ok(["train"] + data + ["--save", link], "--save through a symlink")
    u.check(os.path.islink(link), "--save replaced the symlink itself")
    u.check(os.path.getsize(real) > 1000, "--save did not write the link's target")

    fifo = os.path.join(d, "w.fifo")
    os.mkfifo(fifo)
    got = []

    def reader():
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader)
    t.start()
    # The reader is blocked in open() until the writer opens: start the
    # writer only once the thread is waiting.
    time.sleep(0.2)
    u.run_ok(["train"] + data + ["--save", fifo], "--save into a FIFO with a reader")
    t.join(60)
    u.check(got and got[0][:8] != b"" and len(got[0]) > 1000, "nothing came through the FIFO")
    u.check(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced")

    for flag in ("--save", "--metrics-json"):
        r = u.run(["train"] + data + [flag, "/proc/ctrain-no-such/x"], timeout=60)
        u.check(r.returncode == 3, "%s /proc/...: exit %d, expected 3: %s" % (flag, r.returncode, r.stderr))
        u.check("Epoch" not in r.stdout, "%s /proc/...: trained before failing" % flag)


def fifo_inputs(d):
    rng = np.random.default_rng(0)
    root = os.path.join(d, "imgs")
    for c in ("a", "b"):
        os.makedirs(os.path.join(root, "train", c))
        os.makedirs(os.path.join(root, "test", c))
        for i in range(3):
            u.write_png(os.path.join(root, "train", c, "%d.png" % i), rng.integers(0, 255, (8, 8)))
            u.write_png(os.path.join(root, "test", c, "%d.png" % i), rng.integers(0, 255, (8, 8)))
    os.mkfifo(os.path.join(root, "train", "a", "stuck.png"))
    r = u.run(["train", "--model", "mlp", "--data", "folder:" + root, "--epochs", "1"] + u.FAST, timeout=60)
    u.check(r.returncode == 3 and "is a FIFO" in r.stderr, "folder with a FIFO: exit %d: %s" % (r.returncode, r.stderr))
    r = u.run(["predict", "--model", "mlp", "--weights", os.path.join(d, "real.safetensors"), "--images",
               os.path.join(root, "train", "a", "stuck.png")], timeout=60)
    u.check(r.returncode != 0 and "FIFO" in r.stderr, "predict --images FIFO: exit %d: %s" % (r.returncode, r.stderr))


def wait_for(path, text, limit=60):
    """Until the log at path shows text (the run reached that point)."""
    t0 = time.time()
    while time.time() - t0 < limit * u.TIME_SCALE:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.05)
    return False


def signals(d):
    data = ["--data", "synthetic:8192", "--epochs", "2"] + BASE
    ref = os.path.join(d, "ref.safetensors")
    u.run_ok(["train"] + data + ["--save", ref], "uninterrupted run")
    ck, w, mj = os.path.join(d, "ck"), os.path.join(d, "sig.safetensors"), os.path.join(d, "sig.json")
    with open(os.path.join(d, "sig.log"), "w") as log:
        p = popen(["train"] + data + ["--checkpoint-dir", ck, "--save", w, "--metrics-json", mj], log)
        wait_for(log.name, "Epoch 2/2")
        time.sleep(0.3 * u.TIME_SCALE)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(120 * u.TIME_SCALE)
    text = open(os.path.join(d, "sig.log")).read()
    u.check(rc == 128 + signal.SIGTERM, "SIGTERM: exit %d, expected 143: %s" % (rc, text[-500:]))
    u.check("stopped by signal 15" in text, "SIGTERM: no stop line: %s" % text[-500:])
    u.check(os.path.exists(os.path.join(ck, "last.safetensors")) and os.path.exists(w), "SIGTERM: nothing saved")
    m = u.read_json(mj) if os.path.exists(mj) else {}
    u.check(m.get("stopped_by_signal") == 15 and 256 < m.get("steps", 0) < 512,
            "SIGTERM: metrics %s (expected stopped_by_signal 15, a step inside the run)" % m)
    r = u.run_ok(["train"] + data + ["--checkpoint-dir", ck, "--resume", "--save", w], "resume after SIGTERM")
    same_file(ref, w, "resumed after SIGTERM vs uninterrupted")

    # The second SIGINT must come after the first was taken (two pending
    # ones merge into one) and before the stop has saved. So the test waits
    # for the watcher's line about the first, and the steps are long
    # (about half a second of a 1024-sample CNN batch) so the stop is still
    # finishing its step when the second arrives; a few tries for a machine
    # that stalls the test between the two.
    slow = ["--model", "cnn", "--data", "synthetic:65536", "--batch-size", "1024", "--epochs", "1"] + u.FAST
    for attempt in range(4):
        saved = os.path.join(d, "int%d.safetensors" % attempt)
        with open(os.path.join(d, "int.log"), "w") as log:
            p = popen(["train"] + slow + ["--save", saved], log)
            wait_for(log.name, "Epoch 1/1")
            p.send_signal(signal.SIGINT)
            wait_for(log.name, "interrupt: stopping", limit=10)
            p.send_signal(signal.SIGINT)
            rc = p.wait(60 * u.TIME_SCALE)
        if "second interrupt" in open(log.name).read():
            break
    u.check(rc == 130, "two SIGINTs: exit %d, expected 130" % rc)
    u.check(not os.path.exists(saved), "two SIGINTs: saved anyway")


def finished_and_crafted(d):
    data = ["--data", "synthetic:256", "--epochs", "2"] + BASE
    ck, mj = os.path.join(d, "done"), os.path.join(d, "done.json")
    first = u.run_ok(["train"] + data + ["--checkpoint-dir", ck, "--metrics-json", mj], "a finished run")
    m1 = u.read_json(mj)
    r = u.run_ok(["train"] + data + ["--checkpoint-dir", ck, "--resume", "--metrics-json", mj], "resume of a finished run")
    m2 = u.read_json(mj)
    u.check("nothing to train" in r.stdout, "finished run: no note: %s" % r.stdout[-400:])
    u.check(m2.get("already_done") is True and m2["test_loss"] == m1["test_loss"] and m2["train_loss"] == m1["train_loss"],
            "finished run resumed: %s vs %s" % (m2, m1))
    u.check(first.returncode == 0 and m2["test_accuracy"] == m1["test_accuracy"], "finished run: accuracy changed")

    last = os.path.join(ck, "last.safetensors")
    tensors, meta = st.load(last)
    for key, value, word in (("loop.correct", str(int(meta["loop.seen"]) + 1000), "loop.correct"),
                             ("loop.epoch", str(2 ** 53 + 1), "loop.epoch")):
        bad = dict(meta)
        bad[key] = value
        if key == "loop.correct":
            bad["loop.seen"] = bad["loop.seen"] if int(bad["loop.seen"]) else "64"
            bad["loop.correct"] = str(int(bad["loop.seen"]) + 1000)
        ckb = os.path.join(d, "bad_" + key.replace(".", "_"))
        os.makedirs(ckb)
        st.save(os.path.join(ckb, "last.safetensors"), tensors, bad)
        r = u.run(["train"] + data + ["--checkpoint-dir", ckb, "--resume"], timeout=60)
        u.check(r.returncode == 4 and word in r.stderr, "crafted %s: exit %d: %s" % (key, r.returncode, r.stderr))


def nan_weights(d):
    """Weights holding NaN are refused, naming the tensor and the count."""
    tensors, meta = st.load(os.path.join(d, "real.safetensors"))
    name = sorted(k for k in tensors if str(tensors[k].dtype) == "torch.float32")[0]
    t = tensors[name].clone()  # st_util gives torch tensors
    t.view(-1)[:3] = float("nan")
    tensors[name] = t
    bad = os.path.join(d, "nan.safetensors")
    st.save(bad, tensors, meta)
    for args in (["eval", "--model", "mlp", "--data", "synthetic:64", "--weights", bad],
                 ["train", "--model", "mlp", "--data", "synthetic:64", "--epochs", "1", "--init", bad]):
        r = u.run(args + u.FAST, timeout=60)
        u.check(r.returncode == 4 and name in r.stderr and "3 non-finite" in r.stderr,
                "%s with NaN weights: exit %d: %s" % (args[0], r.returncode, r.stderr))


def limited(max_bytes):
    """A preexec_fn: files this process writes stop at max_bytes (EFBIG,
    "File too large"), a full disk without root or a tmpfs."""
    import resource

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def full_disk(d):
    """A checkpoint write that fails keeps the previous checkpoint intact
    and names the cause; a failing log writer warns and training goes on,
    its events file cut at a whole record."""
    data = ["--data", "synthetic:256", "--epochs", "1"] + BASE
    ck = os.path.join(d, "fullck")
    u.run_ok(["train"] + data + ["--checkpoint-dir", ck], "first epoch")
    last = os.path.join(ck, "last.safetensors")
    before = open(last, "rb").read()
    args = [u.CTRAIN] + u.with_device(["train", "--data", "synthetic:256", "--epochs", "2"] + BASE +
                                      ["--checkpoint-dir", ck, "--resume"])
    r = subprocess.run(args, capture_output=True, text=True, env=u.ENV, preexec_fn=limited(200000), timeout=120)
    u.check(r.returncode == 3 and "File too large" in r.stderr,
            "full disk at the checkpoint: exit %d: %s" % (r.returncode, r.stderr.strip()))
    u.check(open(last, "rb").read() == before, "full disk: the previous checkpoint changed")
    u.check(not [f for f in os.listdir(ck) if ".tmp." in f], "full disk: temp files left")

    logs, mj = os.path.join(d, "fulllogs"), os.path.join(d, "full.json")
    args = [u.CTRAIN] + u.with_device(["train", "--data", "synthetic:2048", "--epochs", "2"] + BASE +
                                      ["--log-dir", logs, "--metrics-json", mj])
    r = subprocess.run(args, capture_output=True, text=True, env=u.ENV, preexec_fn=limited(6000), timeout=120)
    u.check(r.returncode == 0 and "warning" in r.stderr and "File too large" in r.stderr,
            "full disk at the logs: exit %d: %s" % (r.returncode, r.stderr.strip()[-600:]))
    u.check(os.path.exists(mj) and u.read_json(mj).get("epochs") == 2, "full disk at the logs: training stopped")
    tb = u.need_module("tb_decode")
    events = [os.path.join(logs, f) for f in os.listdir(logs) if f.startswith("events.")]
    for e in events:
        try:
            n = len(tb.read_records(open(e, "rb").read()))
        except tb.DecodeError as err:
            n = -1
            u.check(False, "full disk: %s is cut inside a record: %s" % (e, err))
        u.check(n != 0, "full disk: %s holds no record" % e)


def diverging(d):
    """The cnn at --lr 1e6 without a loss scaler: it used to train to
    all-NaN weights and exit 0 with a finite test loss."""
    args = ["train", "--model", "cnn", "--data", "synthetic:512", "--batch-size", "64", "--epochs", "1", "--lr", "1e6"]
    r = u.run(args + ["--save", os.path.join(d, "div.safetensors")] + u.FAST, timeout=120)
    u.check(r.returncode == 2 and "step" in r.stderr and ("NaN" in r.stderr or "nan" in r.stderr),
            "diverging cnn: exit %d: %s" % (r.returncode, r.stderr.strip()[-400:]))
    u.check(not os.path.exists(os.path.join(d, "div.safetensors")), "diverging cnn: NaN weights saved")
    mj = os.path.join(d, "div.json")
    r = u.run(args + ["--on-nonfinite", "skip", "--metrics-json", mj] + u.FAST, timeout=120)
    m = u.read_json(mj) if os.path.exists(mj) else {}
    u.check(r.returncode == 0 and m.get("skipped_steps", 0) > 0,
            "diverging cnn with --on-nonfinite skip: exit %d, metrics %s: %s" % (r.returncode, m, r.stderr[-300:]))


def kill_campaign(d, kills=10):
    data = ["--data", "synthetic:1024", "--epochs", "30"] + BASE
    ref = os.path.join(d, "kref.safetensors")
    u.run_ok(["train"] + data + ["--save", ref], "uninterrupted run")
    ck, w = os.path.join(d, "kck"), os.path.join(d, "kill.safetensors")
    rng = random.Random(44)
    done, n_kill, attempts = False, 0, 0
    while not done and attempts < 60:
        attempts += 1
        resume = ["--resume"] if os.path.exists(os.path.join(ck, "last.safetensors")) else []
        with open(os.path.join(d, "kill.log"), "w") as log:
            p = popen(["train"] + data + ["--checkpoint-dir", ck, "--save", w] + resume, log)
            try:
                rc = p.wait(rng.uniform(0.25, 0.9) * u.TIME_SCALE if n_kill < kills else 300 * u.TIME_SCALE)
                u.check(rc == 0, "kill campaign: a run exited %d: %s" % (rc, open(log.name).read()[-400:]))
                done = rc == 0
                if rc:
                    break
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                n_kill += 1
    u.check(done and n_kill >= kills, "kill campaign: %d kills, finished %s after %d attempts" % (n_kill, done, attempts))
    if done:
        same_file(ref, w, "after %d SIGKILLs vs uninterrupted" % n_kill)
    left = [f for f in os.listdir(ck) if ".tmp." in f]
    u.check(not left, "kill campaign: temp files left in the checkpoint directory: %s" % left)
    print("kill campaign: %d SIGKILLs over %d runs, final weights identical" % (n_kill, attempts))


d = u.tmpdir("reliability")
try:
    if u.TEST_DEVICE.startswith("cuda"):
        # On a CUDA device (the emulator's in CI): the guard's device path,
        # the fused kernels skipping the step; the rest is host code.
        diverging(d)
        u.finish()  # exits; the finally below cleans up
    special_outputs(d)
    fifo_inputs(d)
    signals(d)
    finished_and_crafted(d)
    nan_weights(d)
    diverging(d)
    full_disk(d)
    kill_campaign(d)
finally:
    u.cleanup(d)
u.finish()
