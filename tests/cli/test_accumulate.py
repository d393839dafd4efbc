"""`ctrain train --accumulate N` end to end.

- batch 16 x --accumulate 4 trains to the weights of batch 64 (same init,
  --no-shuffle; an epoch of 200 samples ends in a short group of 8
  samples), and the metrics JSON counts optimizer steps: ceil(batches/4)
  per epoch;
- --max-steps counts optimizer steps, and a run stopped there and resumed
  ends bit for bit where an uninterrupted one does;
- --accumulate 0, abc and 1025 are usage errors (exit 2) naming the flag;
- --resume with another N (or none) is refused (exit 2) naming accumulate,
  before anything is written.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st_util = u.need_module("st_util")

MODEL = """input 1x16x16
conv2d 1 4 3 padding=1
relu
maxpool2d 2
flatten
linear 256 32
relu
linear 32 10
"""


def weights(path):
    tensors, _ = st_util.load(path)
    return {k: v.float().numpy() for k, v in tensors.items()}


def main():
    work = u.tmpdir("accum")
    try:
        rng = np.random.default_rng(5)
        u.write_idx_dataset(os.path.join(work, "data"), rng, n_train=200, n_test=64)
        model = os.path.join(work, "m.txt")
        with open(model, "w") as f:
            f.write(MODEL)
        init = os.path.join(work, "init.safetensors")
        base = ["train", "--model", model, "--data", "mnist:" + os.path.join(work, "data"), "--optimizer", "sgd", "--lr", "0.05",
                "--momentum", "0.9", "--seed", "3"] + u.FAST
        u.run_ok(base + ["--max-steps", "1", "--lr", "0", "--save", init], "init weights")

        def train(tag, extra):
            out = os.path.join(work, tag + ".safetensors")
            js = os.path.join(work, tag + ".json")
            r = u.run_ok(base + ["--init", init, "--no-shuffle", "--save", out, "--metrics-json", js] + extra, tag)
            return (weights(out), u.read_json(js)) if r.returncode == 0 else (None, None)

        wa, ja = train("b64", ["--batch-size", "64", "--epochs", "2"])
        wb, jb = train("b16x4", ["--batch-size", "16", "--accumulate", "4", "--epochs", "2"])
        if ja and jb:
            # 200 samples: 4 batches of 64 (last 8); 13 of 16 -> ceil(13/4) = 4 groups.
            u.check(ja["steps"] == 8 and jb["steps"] == 8, "steps: batch 64 %s, 16 x 4 %s (want 8)" % (ja["steps"], jb["steps"]))
        if wa and wb:
            w0 = weights(init)
            for k in wa:
                err = np.max(np.abs(wa[k] - wb[k])) / max(1e-2, np.max(np.abs(wa[k])))
                moved = np.max(np.abs(wa[k] - w0[k])) / max(1e-2, np.max(np.abs(wa[k])))
                u.check(err < 1e-5, "%s: batch 16 x accumulate 4 vs batch 64: rel err %.3g" % (k, err))
                u.check(moved > 1e-3, "%s: weights did not move (%.3g)" % (k, moved))
        _, jc = train("b16x3", ["--batch-size", "16", "--accumulate", "3", "--epochs", "1"])
        if jc:
            u.check(jc["steps"] == 5, "--accumulate 3 over 13 batches: %s steps, want 5" % jc["steps"])

        # --max-steps counts optimizer steps; stop mid-epoch, resume, same end.
        ck = os.path.join(work, "ck")
        args = base + ["--batch-size", "16", "--accumulate", "4", "--epochs", "2", "--init", init]
        full = os.path.join(work, "full.safetensors")
        u.run_ok(args + ["--save", full], "uninterrupted")
        part = os.path.join(work, "part.json")
        u.run_ok(args + ["--checkpoint-dir", ck, "--max-steps", "6", "--metrics-json", part], "stopped by --max-steps")
        jp = u.read_json(part) if os.path.exists(part) else {}
        u.check(jp.get("steps") == 6, "--max-steps 6: %s steps" % jp.get("steps"))
        resumed = os.path.join(work, "resumed.safetensors")
        u.run_ok(args + ["--checkpoint-dir", ck, "--resume", "--save", resumed], "resumed")
        if os.path.exists(full) and os.path.exists(resumed):
            a, b = weights(full), weights(resumed)
            u.check(all(np.array_equal(a[k], b[k]) for k in a), "resumed run differs from the uninterrupted one")

        # Another N on resume, or none: refused, naming the setting.
        last = os.path.join(ck, "last.safetensors")
        before = open(last, "rb").read() if os.path.exists(last) else b""
        for other in (["--accumulate", "2"], []):
            a2 = base + ["--batch-size", "16", "--epochs", "3", "--init", init] + other
            r = u.run(a2 + ["--checkpoint-dir", ck, "--resume"])
            u.check(r.returncode == 2 and "accumulate" in r.stderr,
                    "resume with %s: exit %d, stderr %s" % (other or "no --accumulate", r.returncode, r.stderr.strip()))
        u.check(open(last, "rb").read() == before if before else False, "a refused resume changed last.safetensors")

        for bad in ("0", "abc", "1025", "-1"):
            r = u.run(base + ["--accumulate", bad])
            u.check(r.returncode == 2 and "--accumulate" in r.stderr,
                    "--accumulate %s: exit %d, stderr %s" % (bad, r.returncode, r.stderr.strip()))
    finally:
        u.cleanup(work)
    u.finish()


main()
