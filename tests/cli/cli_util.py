"""Shared helpers for the end-to-end tests of the `ctrain` command.

They run the built binary ($CTRAIN_BUILD_DIR/ctrain) as a user would and
write tiny datasets in the real on-disk formats (IDX .gz, CIFAR binary,
PNG) by hand, so the tests need nothing beyond numpy (and torch where a
test compares with PyTorch). The data is learnable (each class has its own
bright patch plus noise) so a few steps of training move the metrics.
"""
import gzip
import importlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CTRAIN_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", os.path.join(SOURCE, "build"))
CTRAIN = os.path.join(BUILD, "ctrain")
sys.path.insert(0, os.path.join(SOURCE, "tests", "parity"))  # st_util, tb_decode, ctrain_models

# Keep every run small and single-threaded: the suite shares 2 cores.
FAST = ["--threads", "1", "--workers", "0"]

failures = []


def need_binary():
    """Exits 77 (skipped) when the binary is not built, or when the test
    wants a CUDA device (CTRAIN_TEST_DEVICE=cuda..., or
    CTRAIN_TEST_NEED_CUDA=1 for a test that picks its devices itself) and
    `ctrain devices` says there is none."""
    if not os.path.exists(CTRAIN):
        print("skip: %s not built" % CTRAIN)
        sys.exit(77)
    if TEST_DEVICE.startswith("cuda") or os.environ.get("CTRAIN_TEST_NEED_CUDA") == "1":
        # `ctrain devices` says "cuda     not available: <why>" exactly when
        # there is no CUDA device to open; anything else failing later is a
        # failure, not a skip.
        r = subprocess.run([CTRAIN, "devices"], capture_output=True, text=True, errors="replace",
                           timeout=120 * TIME_SCALE, env=ENV)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("cuda ")]
        if r.returncode == 0 and line and "not available" in line[0]:
            print("skip: no CUDA device:", line[0])
            sys.exit(77)


def need_module(name):
    """Imports module `name` (e.g. st_util, which needs numpy) or exits 77,
    skipped, saying why."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        print("skip:", e)
        sys.exit(77)


def check(cond, msg):
    """Records a failure (and prints it) instead of stopping at the first."""
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)
    return bool(cond)


def finish():
    if failures:
        print("%d failure(s)" % len(failures))
        sys.exit(1)
    print("all passed")
    sys.exit(0)


# One OpenMP thread for every run, also those without --threads (summary,
# eval, the error cases): spinning thread teams on a loaded 2-core machine
# cost more than they give for these tiny models.
ENV = dict(os.environ, OMP_NUM_THREADS="1")


# CTRAIN_TEST_DEVICE (e.g. cuda, as tests/emu sets it for the CUDA emulator
# and tests/CMakeLists.txt for a GPU) runs train/eval/predict/summary on
# that device wherever a test names none; on cuda `train`, `eval` and
# `predict` also get --deterministic (unless they ask for --cudnn-benchmark),
# since the tests compare runs bit for bit and cuDNN's default algorithms
# may add with atomics (and an evaluation inside `train` is compared with
# `eval`'s: the same switches, the same kernels). TIME_SCALE multiplies
# every timeout for a slower device.
TEST_DEVICE = os.environ.get("CTRAIN_TEST_DEVICE", "")
TIME_SCALE = float(os.environ.get("CTRAIN_TEST_TIME_SCALE", "1"))


def with_device(args):
    args = [str(a) for a in args]
    if TEST_DEVICE and args and args[0] in ("train", "eval", "predict", "summary") and "--device" not in args:
        args += ["--device", TEST_DEVICE]
        if TEST_DEVICE.startswith("cuda") and args[0] != "summary" and "--cudnn-benchmark" not in args:
            args.append("--deterministic")
    return args


def run(args, timeout=120, cwd=None):
    """Runs ctrain with args; returns the CompletedProcess (text)."""
    return subprocess.run([CTRAIN] + with_device(args), capture_output=True, text=True, errors="replace",
                          timeout=timeout * TIME_SCALE, cwd=cwd, env=ENV)


def run_ok(args, what, **kw):
    r = run(args, **kw)
    if not check(r.returncode == 0, "%s: exit %d, stderr: %s" % (what, r.returncode, r.stderr.strip()[-2000:])):
        print("command:", " ".join([CTRAIN] + [str(a) for a in args]))
    return r


def tmpdir(prefix):
    d = tempfile.mkdtemp(prefix="ctrain_cli_%s_" % prefix)
    return d


def cleanup(d):
    shutil.rmtree(d, ignore_errors=True)


# ---- tiny datasets ----

def make_images(rng, n, c, h, w, classes):
    """(uint8 [n,c,h,w], uint8 labels [n]): class k lights up its own patch."""
    import numpy as np

    labels = rng.integers(0, classes, n).astype(np.uint8)
    x = rng.integers(0, 90, (n, c, h, w)).astype(np.int32)
    ph, pw = max(h // 4, 2), max(w // 4, 2)
    for i in range(n):
        k = int(labels[i])
        r0 = (k * 3) % max(h - ph, 1)
        c0 = (k * 5) % max(w - pw, 1)
        x[i, :, r0:r0 + ph, c0:c0 + pw] += rng.integers(120, 165)
    return np.clip(x, 0, 255).astype(np.uint8), labels


def write_idx_images(path, x, magic=2051, gz=True):
    n, h, w = x.shape
    data = struct.pack(">IIII", magic, n, h, w) + x.tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def write_idx_labels(path, y, magic=2049, gz=True):
    data = struct.pack(">II", magic, len(y)) + bytes(bytearray(y))
    (gzip.open if gz else open)(path, "wb").write(data)


def write_idx_dataset(d, rng, n_train=256, n_test=128, h=16, w=16, classes=10):
    """Writes the four Fashion-MNIST-named IDX .gz files into d; returns
    {'train': (x, y), 'test': (x, y)} with x [n, h, w] uint8."""
    os.makedirs(d, exist_ok=True)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        x, y = make_images(rng, n, 1, h, w, classes)
        x = x[:, 0]
        write_idx_images(os.path.join(d, "%s-images-idx3-ubyte.gz" % prefix), x)
        write_idx_labels(os.path.join(d, "%s-labels-idx1-ubyte.gz" % prefix), y)
        out[split] = (x, y)
    return out


def write_cifar10(d, rng, per_file=20, n_test=40):
    """CIFAR-10 binary batches (1 label byte + 3072 pixel bytes per record)."""
    os.makedirs(d, exist_ok=True)
    names = ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]
    for name in names:
        n = n_test if name.startswith("test") else per_file
        x, y = make_images(rng, n, 3, 32, 32, 10)
        with open(os.path.join(d, name), "wb") as f:
            for i in range(n):
                f.write(bytes([int(y[i])]) + x[i].tobytes())
    return [os.path.join(d, n) for n in names]


def write_png(path, img):
    """img: uint8 [h, w] (gray) or [h, w, 3] (RGB); a valid PNG by hand."""
    import numpy as np

    img = np.ascontiguousarray(img, dtype=np.uint8)
    h, w = img.shape[:2]
    color = 0 if img.ndim == 2 else 2
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def read_json(path):
    import json

    with open(path) as f:
        return json.load(f)


def read_csv(path):
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    return [l.split(",") for l in lines]


# ---- saved weights ----

def weights(path):
    """The tensors of a safetensors file (torch tensors by name)."""
    import st_util
    return st_util.load(path)[0]


def normwise(a, b):
    """||a - b|| / ||a|| over every float tensor of two weight files."""
    num = den = 0.0
    for k, t in a.items():
        if not t.is_floating_point():
            continue
        x, y = t.double(), b[k].double()
        num += float(((x - y) ** 2).sum())
        den += float((x ** 2).sum())
    return (num / den) ** 0.5 if den else 0.0


def same_bits(a, b):
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


# A small batch-norm CNN for 1x28x28 inputs (SyncBatchNorm tests).
BN_MODEL = """input 1x28x28
conv2d 1 8 3 bias=false
batchnorm2d 8
relu
maxpool2d 2
conv2d 8 16 3 bias=false
batchnorm2d 16
relu
adaptiveavgpool2d 1
flatten
linear 16 10
"""


def write_bn_model(d):
    path = os.path.join(d, "bn.txt")
    with open(path, "w") as f:
        f.write(BN_MODEL)
    return path



# What a data-parallel strategy must match on the same global batch of 32
# samples. `parallel(args, what)` trains args (everything but the batch
# size) that way, over two devices or ranks (DP: --batch-size 32 split;
# DDP: 2 ranks of --batch-size 16).

def need_gpus(n):
    """Exits 77 unless `ctrain devices` lists n CUDA devices."""
    r = run(["devices"], timeout=120)
    gpus = [ln for ln in r.stdout.splitlines() if ln.startswith("cuda:")]
    if len(gpus) < n:
        print("skip: needs %d CUDA devices; `ctrain devices` lists %d" % (n, len(gpus)))
        sys.exit(77)


def fp16_scaler_agrees(d, data, steps, parallel, timeout=180):
    """fp16 with the loss scaler started at 2^40, one process against the
    strategy: the first steps overflow and are skipped. An overflow on any
    device is one in the summed gradients every device holds, so all skip
    together, as one process does, and end at the same scale."""
    args = ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1", "--precision", "fp16",
            "--loss-scale-init", "1099511627776"] + data + ["--epochs", "1", "--max-steps", str(steps)] + FAST
    m1, m2 = os.path.join(d, "fp16_1.json"), os.path.join(d, "fp16_2.json")
    run_ok(["train"] + args + ["--batch-size", "32", "--metrics-json", m1], "fp16 one process", timeout=timeout)
    parallel(args + ["--metrics-json", m2], "fp16 in parallel")
    if os.path.exists(m1) and os.path.exists(m2):
        a, b = read_json(m1), read_json(m2)
        print("fp16 scaler: one process skipped %s, scale %s; in parallel skipped %s, scale %s" % (
            a["skipped_steps"], a["loss_scale"], b["skipped_steps"], b["loss_scale"]))
        check(a["skipped_steps"] > 0 and a["skipped_steps"] == b["skipped_steps"] and
              a["loss_scale"] == b["loss_scale"], "fp16 loss scaling: in parallel %s steps skipped (scale %s), one "
              "process %s (scale %s)" % (b["skipped_steps"], b["loss_scale"], a["skipped_steps"], a["loss_scale"]))


def bf16_within_split(d, data, parallel, timeout=600):
    """Under bf16 autocast the GPU's weight gradients come out of cuBLASLt
    and cuDNN in bf16, rounded per micro-batch (as PyTorch's autocast rounds
    them), so any split of the global batch moves the result by that
    rounding: the strategy must stay within 3x of what one GPU moves when it
    accumulates the same 32 samples in two halves of 16."""
    common = ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--precision", "bf16"] + \
        data + ["--epochs", "1", "--max-steps", "5"] + FAST
    one, acc, two = (os.path.join(d, "bf16_%s.safetensors" % k) for k in ("one", "acc", "parallel"))
    run_ok(["train"] + common + ["--batch-size", "32", "--save", one], "bf16 one GPU", timeout=timeout)
    run_ok(["train"] + common + ["--batch-size", "16", "--accumulate", "2", "--save", acc], "bf16 accumulate",
           timeout=timeout)
    parallel(common + ["--save", two], "bf16 in parallel")
    if not all(os.path.exists(p) for p in (one, acc, two)):
        return
    w = weights(one)
    e_acc, e_par = normwise(w, weights(acc)), normwise(w, weights(two))
    print("bf16 after 5 steps: one GPU vs its accumulation of two halves %.3g, vs in parallel %.3g" % (e_acc, e_par))
    check(e_par <= 3 * e_acc and e_par < 1e-3, "bf16: in parallel the weights differ from one GPU's by %.3g, one "
          "GPU's own split into two halves by %.3g" % (e_par, e_acc))


# What DDP and DP over GPUs match one GPU on: with dropout (masks keyed by
# the sample's number in the global batch), clipping and accumulation.
GPU_PARALLEL_CASES = [
    ("mlp", ["--model", "mlp", "--optimizer", "adam", "--lr", "0.001"]),
    ("cnn", ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]),
    ("cnn_clip_acc", ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                      "--clip-grad-norm", "0.5", "--accumulate", "2"]),
]


def equals_one_device(d, name, args, parallel, timeout=600, tol=1e-5, extra=()):
    """args (everything but the batch size) for 20 steps on one device with
    batch 32 and by the strategy (with extra): the weights within tol
    (normwise). Returns the difference (None when a run failed)."""
    common = args + ["--epochs", "3", "--max-steps", "20"] + FAST
    one, two = os.path.join(d, name + "_1.safetensors"), os.path.join(d, name + "_2.safetensors")
    run_ok(["train"] + common + ["--batch-size", "32", "--save", one], name + " one device", timeout=timeout)
    parallel(common + list(extra) + ["--save", two], name + " in parallel")
    if not (os.path.exists(one) and os.path.exists(two)):
        return None
    err = normwise(weights(one), weights(two))
    print("%s: one device vs in parallel after 20 steps: normwise %.3g" % (name, err))
    if tol:
        check(err < tol, "%s: in parallel the weights differ from one device's by %.3g (> %g)" % (name, err, tol))
    return err


def sync_bn_equals_one_device(d, data, parallel):
    """A batch-norm model: with --sync-bn the strategy trains as one device
    does (within 1e-4), without it the replicas' statistics are their own
    halves' and the weights drift further. SGD with momentum: Adam's
    normalised step turns last-bit differences of near-zero gradients
    (summed in another order on split batches) into steps of the learning
    rate's size, which moves the weights by 2.5e-4 on the GPU either way."""
    args = ["--model", write_bn_model(d), "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"] + data
    equals_one_device(d, "bn_sync", args, parallel, tol=1e-4, extra=["--sync-bn"])
    err = equals_one_device(d, "bn_local", args, parallel, tol=None)
    check(err is None or err > 1e-4, "without --sync-bn the replicas' statistics should differ from the global batch's")
