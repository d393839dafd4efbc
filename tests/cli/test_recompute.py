"""`ctrain train --recompute[=auto|N|cheap|norm|selective|off]` and `ctrain summary --recompute`
end to end (activation recompute, i.e. gradient checkpointing).

- A chain model file (batch norm, both dropout kinds, no residuals) and the
  zoo resnet18 at 3x32x32 train a few steps on synthetic data with
  recompute off (no flag, `--recompute off`) and on (bare `--recompute` =
  auto, `--recompute=2`, `--recompute 3`; resnet18 also `--recompute
  cheap`, `--recompute norm` and `--recompute selective`): the saved
  tensors are equal
  byte for byte and the final metrics exactly, while the start line says
  "recompute: K segments" (K > 1, K = N when N is given) only when on and
  the step plan (`peak_memory_bytes`) shrinks, auto's the least;
- a run with recompute stopped by --max-steps in the middle of epoch 2 and
  resumed with another segment count ends on the weights and checkpoint
  (model + optimizer state) of an uninterrupted run without recompute;
- `ctrain summary --recompute` reports a smaller "Forward/backward pass
  size (MB)" than without, and its "(X MB without recompute)" is the plain
  summary's figure; the layer table is unchanged;
- on cuda (the CUDA emulator's CLI, where built) the default is the
  selective mode, whose ResNet-50 plan is below norm's, below plain;
- bad values (x, -1, 5000) are usage errors (exit 2, one line naming
  --recompute) that write nothing; eval and predict do not take the flag.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st_util = u.need_module("st_util")

USAGE = 2
THREADS = ["--threads", "2", "--workers", "0"]
# Conv/batch-norm/relu blocks with dropout2d and dropout between them: a
# chain with a clean cut after every layer, so every count up to the layer
# count is placeable, and recomputed segments hold batch norm and dropout.
CHAIN = """input 3x16x16
conv2d 3 8 3 padding=1
batchnorm2d 8
relu
conv2d 8 8 3 padding=1
batchnorm2d 8
relu
dropout2d 0.2
maxpool2d 2
conv2d 8 16 3 padding=1
batchnorm2d 16
relu
conv2d 16 16 3 padding=1
batchnorm2d 16
relu
maxpool2d 2
flatten
dropout 0.3
linear 256 10
"""
# Deterministic metrics: everything but the timings and the plan size.
# The named modes that drop single layers' outputs (no segments).
MODES = ("cheap", "norm", "selective")
SAME_KEYS = ("steps", "epochs", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "test_top5",
             "skipped_steps", "loss_scale", "resumed_from_epoch")
START = re.compile(r"\(recompute: (\d+ segments|cheap|norm|selective), (\d+) layers run forward twice\)")


def raw_tensors(path):
    tensors, _ = st_util.load(path)
    return {k: (str(v.dtype), tuple(v.shape), st_util.tensor_bytes(v)) for k, v in tensors.items()}


def same_tensors(what, pa, pb):
    if not (u.check(os.path.exists(pa), "%s: %s missing" % (what, pa)) and
            u.check(os.path.exists(pb), "%s: %s missing" % (what, pb))):
        return
    ta, tb = raw_tensors(pa), raw_tensors(pb)
    u.check(sorted(ta) == sorted(tb), "%s: tensor names differ: %s vs %s" % (what, sorted(ta)[:5], sorted(tb)[:5]))
    diff = [k for k in ta if k in tb and ta[k] != tb[k]]
    u.check(not diff, "%s: %d tensor(s) differ, e.g. %s" % (what, len(diff), diff[:6]))


def start_line(stdout):
    return next((l for l in stdout.splitlines() if l.startswith("ctrain:")), "")


def train_variants(work, tag, base, variants, want_on_segments):
    """Trains base + each variant's flags; checks the start lines, compares
    weights and metrics with the first (plain) variant; returns {label:
    (save path, metrics)}."""
    out = {}
    for label, flags in variants:
        save = os.path.join(work, "%s_%d.safetensors" % (tag, len(out)))
        js = os.path.join(work, "%s_%d.json" % (tag, len(out)))
        # The flags go between other flags: a bare --recompute must not eat
        # the next flag as its value.
        r = u.run_ok(["train"] + base[:2] + flags + base[2:] + ["--save", save, "--metrics-json", js],
                     "%s %s" % (tag, label), timeout=300)
        if r.returncode:
            continue
        line = start_line(r.stdout)
        m = START.search(line)
        on = label not in ("plain", "off")
        if on:
            if u.check(m is not None, "%s %s: start line does not report recompute: %r" % (tag, label, line)):
                k = 0 if m.group(1) in MODES else int(m.group(1).split()[0])
                n = int(m.group(2))
                want = want_on_segments.get(label)
                # auto may pick the norm, cheap or selective mode where its plan is as small
                u.check((k > 1 or label in MODES + ("auto",)) and n > 0,
                        "%s %s: %d segments, %d layers recomputed" % (tag, label, k, n))
                u.check(want is None or k == want, "%s %s: %d segments, asked for %s" % (tag, label, k, want))
        else:
            u.check("recompute" not in line, "%s %s: start line mentions recompute: %r" % (tag, label, line))
        out[label] = (save, u.read_json(js))
        print("%s %-16s %s" % (tag, label, line[line.find("step memory plan"):]))
    plain = out.get("plain")
    if not u.check(plain is not None, "%s: the plain run failed" % tag):
        return out
    for label, (save, mj) in out.items():
        if label == "plain":
            continue
        same_tensors("%s: --save of %s vs plain" % (tag, label), plain[0], save)
        for k in SAME_KEYS:
            u.check(mj.get(k) == plain[1].get(k), "%s %s: metrics %s %r, plain %r" % (tag, label, k, mj.get(k),
                                                                                       plain[1].get(k)))
        pk, pp = mj.get("peak_memory_bytes", 0), plain[1].get("peak_memory_bytes", 0)
        if label == "off":
            u.check(pk == pp, "%s off: peak_memory_bytes %s, plain %s" % (tag, pk, pp))
        else:
            u.check(pk < pp, "%s %s: peak_memory_bytes %s not below plain %s" % (tag, label, pk, pp))
    auto = out.get("auto")
    for label, (_, mj) in out.items():
        if auto and label not in ("plain", "off") + MODES:
            u.check(auto[1]["peak_memory_bytes"] <= mj["peak_memory_bytes"],
                    "%s: auto's plan %d bytes is larger than %s's %d" % (tag, auto[1]["peak_memory_bytes"], label,
                                                                         mj["peak_memory_bytes"]))
    return out


def bias_before_bn(text):
    """Bias names of the layers a batch norm directly follows: batch norm
    subtracts the channel mean, so their exact gradient is zero and they
    move by rounding noise only (one ulp on the cpu, not at all where the
    sums are exact, as on the CUDA emulator)."""
    layers = [ln.split()[0] for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("input")]
    return {"%d.bias" % i for i in range(len(layers) - 1) if layers[i + 1].startswith("batchnorm")}


def check_moved(what, init, trained, exempt=()):
    if not (os.path.exists(init) and os.path.exists(trained)):
        return
    a, b = raw_tensors(init), raw_tensors(trained)
    moved = [k for k in a if k in b and a[k] != b[k]]
    # Every weight, bias and running statistic changes (num_batches_tracked too).
    want = [k for k in a if k not in exempt]
    u.check(all(k in moved for k in want), "%s: only %d of %d tensors changed in training: unchanged %s" % (
        what, len(moved), len(a), sorted(set(want) - set(moved))[:6]))


def resume(work, chain):
    """Uninterrupted without recompute vs stopped + resumed with it."""
    args = ["--model", chain, "--data", "synthetic", "--input", "3x16x16", "--batch-size", "64", "--epochs", "2",
            "--seed", "9", "--optimizer", "adam", "--lr", "0.003", "--scheduler", "onecycle"] + THREADS
    a_dir, b_dir = os.path.join(work, "ckA"), os.path.join(work, "ckB")
    a_w, b_w = os.path.join(work, "resA.safetensors"), os.path.join(work, "resB.safetensors")
    a_j, b_j = os.path.join(work, "resA.json"), os.path.join(work, "resB.json")
    ra = u.run_ok(["train"] + args + ["--checkpoint-dir", a_dir, "--save", a_w, "--metrics-json", a_j],
                  "resume: uninterrupted, no recompute")
    # 1024 samples / 64 = 16 steps an epoch: stop at step 21, in epoch 2.
    rb1 = u.run_ok(["train"] + args + ["--recompute", "--checkpoint-dir", b_dir, "--max-steps", "21"],
                   "resume: first part with --recompute")
    rb2 = u.run_ok(["train"] + args + ["--recompute=3", "--checkpoint-dir", b_dir, "--resume", "--save", b_w,
                                       "--metrics-json", b_j], "resume: --resume with --recompute=3")
    if ra.returncode or rb1.returncode or rb2.returncode:
        return
    u.check(START.search(start_line(rb1.stdout)) is not None and START.search(start_line(rb2.stdout)) is not None,
            "resume: recompute not on in the interrupted run: %r / %r" % (start_line(rb1.stdout),
                                                                          start_line(rb2.stdout)))
    u.check("resumed from epoch 1" in rb2.stdout, "resume: not reported: %s" % rb2.stdout[-300:])
    same_tensors("resume: --save, uninterrupted plain vs resumed with recompute", a_w, b_w)
    same_tensors("resume: last checkpoint (model + optimizer)", os.path.join(a_dir, "last.safetensors"),
                 os.path.join(b_dir, "last.safetensors"))
    ma, mb = u.read_json(a_j), u.read_json(b_j)
    for k in ("steps", "train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        u.check(ma.get(k) == mb.get(k), "resume: metrics %s: uninterrupted %r, resumed %r" % (k, ma.get(k), mb.get(k)))
    u.check(ma.get("steps") == 32, "resume: %r steps, expected 32" % ma.get("steps"))


def summary():
    base = ["summary", "--model", "resnet18", "--input", "3x64x64", "--batch-size", "16"]
    plain = u.run_ok(base, "summary")
    rc = u.run_ok(base + ["--recompute"], "summary --recompute")
    two = u.run_ok(base + ["--recompute=2"], "summary --recompute=2")
    if plain.returncode or rc.returncode or two.returncode:
        return
    size = re.compile(r"^Forward/backward pass size \(MB\): (\d+\.\d\d) ", re.M)
    saving = re.compile(r"^Activation recompute: (\d+ segments|cheap|norm|selective), (\d+) layers run forward twice "
                        r"\((\d+\.\d\d) MB without recompute\)$", re.M)
    p, r, t = size.search(plain.stdout), size.search(rc.stdout), size.search(two.stdout)
    if not u.check(p and r and t, "summary: no 'Forward/backward pass size (MB)' line"):
        return
    u.check(not saving.search(plain.stdout) and "recompute" not in plain.stdout.lower(),
            "summary without --recompute mentions recompute")
    for label, out, s in (("--recompute", rc, r), ("--recompute=2", two, t)):
        m = saving.search(out.stdout)
        if not u.check(m, "summary %s: no 'Activation recompute: ... (X MB without recompute)' line" % label):
            continue
        print("summary %-14s %s MB, %s, %s layers twice, %s MB without (plain %s MB)" % (
            label, s.group(1), m.group(1), m.group(2), m.group(3), p.group(1)))
        u.check(float(s.group(1)) < float(p.group(1)),
                "summary %s: pass size %s MB not below plain %s MB" % (label, s.group(1), p.group(1)))
        u.check(m.group(3) == p.group(1), "summary %s: '%s MB without recompute', plain summary says %s MB" % (
            label, m.group(3), p.group(1)))
        segs = 0 if m.group(1) in MODES else int(m.group(1).split()[0])
        # auto may pick a named mode where its plan is as small
        u.check((segs > 1 or label == "--recompute") and int(m.group(2)) > 0, "summary %s: %s, %s layers" % (
            label, m.group(1), m.group(2)))
        if label == "--recompute=2":
            u.check(segs == 2, "summary --recompute=2: %s" % m.group(1))
        # The model and its parameters are those of the plain summary.
        u.check(out.stdout[:out.stdout.find("Forward/backward")] == plain.stdout[:plain.stdout.find("Forward/backward")],
                "summary %s: layer table or totals differ from the plain summary" % label)
    u.check(float(r.group(1)) <= float(t.group(1)), "summary: auto's %s MB above --recompute=2's %s MB" % (
        r.group(1), t.group(1)))


def cuda_default():
    """The default on cuda is the selective mode (cli_recompute): checked
    with the CUDA emulator's CLI (tests/emu) where the build has one, by
    `ctrain summary` of ResNet-50 bf16, whose plan it makes smaller than
    norm's (its 1x1 convolutions over 64 or 128 channels run again)."""
    emu = os.path.join(u.BUILD, "tests", "emu", "cli", "ctrain")
    if not os.path.exists(emu):
        print("cuda default: no CUDA emulator in %s (built with the CUDA backend only), not checked" % u.BUILD)
        return
    base = [emu, "summary", "--model", "resnet50", "--input", "3x64x64", "--batch-size", "4", "--precision", "bf16",
            "--device", "cuda"]
    size = re.compile(r"^Forward/backward pass size \(MB\): (\d+\.\d\d) ", re.M)
    mode = re.compile(r"^Activation recompute: (\w+), (\d+) layers run forward twice", re.M)
    got = {}
    for label, flags in (("default", []), ("selective", ["--recompute", "selective"]), ("norm", ["--recompute", "norm"]),
                         ("off", ["--recompute", "off"])):
        r = subprocess.run(base + flags, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        if not u.check(r.returncode == 0 and size.search(r.stdout), "emulator summary %s: exit %d: %s" % (
                label, r.returncode, r.stderr.strip()[-500:])):
            return
        m = mode.search(r.stdout)
        got[label] = (float(size.search(r.stdout).group(1)), m.group(1) if m else "off", int(m.group(2)) if m else 0)
    print("cuda (emulator) resnet50 bf16 3x64x64 batch 4: %s" % ", ".join(
        "%s %.2f MB (%s, %d layers twice)" % (k, v[0], v[1], v[2]) for k, v in got.items()))
    u.check(got["default"] == got["selective"] and got["default"][1] == "selective",
            "cuda default: %s, --recompute selective: %s" % (got["default"], got["selective"]))
    u.check(got["selective"][0] < got["norm"][0] < got["off"][0] and got["selective"][2] > got["norm"][2] > 0,
            "cuda: selective %s, norm %s, off %s: not each smaller than the next" % (got["selective"], got["norm"],
                                                                                  got["off"]))


def bad_values(work, chain, weights):
    base = ["train", "--model", chain, "--data", "synthetic", "--input", "3x16x16", "--max-steps", "1"] + THREADS
    save = os.path.join(work, "bad.safetensors")
    for flags in (["--recompute=x"], ["--recompute=-1"], ["--recompute=5000"], ["--recompute", "abc"],
                  ["--recompute="]):
        r = u.run(base + flags + ["--save", save])
        err = r.stderr.strip()
        u.check(r.returncode == USAGE and "--recompute" in err and len(err.splitlines()) == 1,
                "train %s: exit %d (want %d), stderr %r" % (" ".join(flags), r.returncode, USAGE, err))
        u.check(not os.path.exists(save), "train %s wrote --save" % " ".join(flags))
    ev = ["--model", chain, "--weights", weights, "--data", "synthetic", "--input", "3x16x16"] + THREADS
    for cmd in ("eval", "predict"):
        for flag in ("--recompute", "--recompute=2"):
            r = u.run([cmd] + ev + [flag])
            err = r.stderr.strip()
            u.check(r.returncode == USAGE and "recompute" in err and len(err.splitlines()) == 1,
                    "%s %s: exit %d (want %d), stderr %r" % (cmd, flag, r.returncode, USAGE, err))
    for cmd in ("train", "summary"):
        h = u.run([cmd, "--help"], timeout=30)
        u.check("--recompute" in h.stdout, "%s --help does not list --recompute" % cmd)


def main():
    work = u.tmpdir("recompute")
    try:
        chain = os.path.join(work, "chain.txt")
        with open(chain, "w") as f:
            f.write(CHAIN)
        cbase = ["--model", chain, "--data", "synthetic", "--input", "3x16x16", "--batch-size", "32", "--max-steps",
                 "6", "--seed", "4", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"] + THREADS
        init = os.path.join(work, "chain_init.safetensors")
        u.run_ok(["train"] + cbase + ["--max-steps", "1", "--lr", "0", "--momentum", "0", "--save", init],
                 "chain: initial weights")
        runs = train_variants(work, "chain", cbase,
                              [("plain", []), ("off", ["--recompute", "off"]), ("auto", ["--recompute"]),
                               ("2", ["--recompute=2"]), ("3", ["--recompute", "3"])],
                              {"2": 2, "3": 3})
        if "plain" in runs:
            check_moved("chain", init, runs["plain"][0], bias_before_bn(CHAIN))
        rbase = ["--model", "resnet18", "--data", "synthetic", "--input", "3x32x32", "--batch-size", "8",
                 "--max-steps", "2", "--seed", "4", "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9"] + THREADS
        train_variants(work, "resnet18", rbase, [("plain", []), ("auto", ["--recompute"]), ("2", ["--recompute=2"]),
                                                 ("cheap", ["--recompute", "cheap"]), ("norm", ["--recompute", "norm"]),
                                                 ("selective", ["--recompute", "selective"])],
                       {"2": 2})
        resume(work, chain)
        summary()
        cuda_default()
        bad_values(work, chain, runs["plain"][0] if "plain" in runs else init)
    finally:
        u.cleanup(work)
    u.finish()


main()
