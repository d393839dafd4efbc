"""Bad input to the ctrain command: every case must end with the documented
exit code (docs/CLI.md, src/cli/cli.h) and a one-line message on stderr
that names the offending file, flag or value -- never a crash, a hang, or
a partial output file.

The broken files are made here from valid tiny ones (IDX .gz, CIFAR
binary, model text, safetensors weights), one defect each.
"""
import gzip
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
try:
    import numpy as np
except ImportError as e:
    print("skip:", e)
    sys.exit(77)

OK, ERROR, USAGE, IO, BAD_INPUT, NO_MEMORY, NO_DEVICE, SHAPE = 0, 1, 2, 3, 4, 5, 6, 7


def expect(what, args, code, words, stdout_empty=False, max_lines=2):
    """Runs ctrain args; checks exit code, stderr words (case-insensitive)."""
    r = u.run(args, timeout=60)
    err = r.stderr.strip()
    u.check(r.returncode == code, "%s: exit %d, expected %d; stderr %r" % (what, r.returncode, code, err))
    u.check(r.returncode < 128 and r.returncode >= 0, "%s: killed by signal %d" % (what, -r.returncode))
    low = err.lower()
    missing = [w for w in words if w.lower() not in low]
    u.check(not missing, "%s: stderr lacks %s: %r" % (what, missing, err))
    u.check("Traceback" not in err and "Sanitizer" not in err and "Segmentation" not in err,
            "%s: crash output: %r" % (what, err))
    u.check(err.count("\n") < max_lines, "%s: expected a short message, got %d lines: %r" % (what, err.count("\n") + 1, err))
    if stdout_empty:
        u.check(r.stdout == "", "%s: stdout not empty (work started before the error?): %r" % (what, r.stdout[:300]))
    return r


def copy_dir(src, dst):
    os.makedirs(dst)
    for n in os.listdir(src):
        with open(os.path.join(src, n), "rb") as f, open(os.path.join(dst, n), "wb") as g:
            g.write(f.read())


def gz_edit(path, fn):
    with gzip.open(path, "rb") as f:
        data = f.read()
    with gzip.open(path, "wb") as f:
        f.write(fn(data))


def no_file_like(what, path):
    d = os.path.dirname(path) or "."
    base = os.path.basename(path)
    left = [n for n in os.listdir(d) if n.startswith(base)] if os.path.isdir(d) else []
    u.check(not left, "%s: left %s behind in %s" % (what, left, d))


def main():
    work = u.tmpdir("bad")
    try:
        rng = np.random.default_rng(99)
        fm = os.path.join(work, "fm")
        u.write_idx_dataset(fm, rng, n_train=64, n_test=32, h=16, w=16)
        F = u.FAST
        tr = lambda data, *more: ["train", "--model", "cnn", "--data", data, "--max-steps", "1"] + F + list(more)

        # ---- datasets ----
        expect("missing dataset dir", tr("fashion-mnist:/nonexistent/fm"), IO,
               ["/nonexistent/fm/train-images-idx3-ubyte.gz", "/nonexistent/fm/train-labels-idx1-ubyte",
                "apt-get install dataset-fashion-mnist"], stdout_empty=True)
        expect("mnist without a path", tr("mnist"), USAGE, ["mnist:PATH"], stdout_empty=True)
        expect("unknown dataset kind", tr("imagenet:/x"), USAGE, ["imagenet", "cifar10:PATH"], stdout_empty=True)
        expect("synthetic with a bad count", tr("synthetic:12x"), USAGE, ["synthetic:12x", "synthetic:N"],
               stdout_empty=True)

        d = os.path.join(work, "trunc")
        copy_dir(fm, d)
        gz_edit(os.path.join(d, "train-images-idx3-ubyte.gz"), lambda b: b[:len(b) - 1000])
        expect("truncated IDX images", tr("fashion-mnist:" + d), BAD_INPUT,
               ["train-images-idx3-ubyte.gz", "truncated"], stdout_empty=True)
        d = os.path.join(work, "trunc_hdr")
        copy_dir(fm, d)
        gz_edit(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), lambda b: b[:5])
        expect("IDX labels shorter than the header", tr("fashion-mnist:" + d), BAD_INPUT,
               ["t10k-labels-idx1-ubyte.gz", "header"], stdout_empty=True)
        d = os.path.join(work, "magic")
        copy_dir(fm, d)
        gz_edit(os.path.join(d, "t10k-images-idx3-ubyte.gz"), lambda b: struct.pack(">I", 2049) + b[4:])
        expect("wrong IDX magic", tr("fashion-mnist:" + d), BAD_INPUT,
               ["t10k-images-idx3-ubyte.gz", "magic", "2051"], stdout_empty=True)
        d = os.path.join(work, "label")
        copy_dir(fm, d)
        gz_edit(os.path.join(d, "train-labels-idx1-ubyte.gz"), lambda b: b[:8 + 17] + bytes([10]) + b[8 + 18:])
        expect("IDX label out of range", tr("fashion-mnist:" + d), BAD_INPUT,
               ["train-labels-idx1-ubyte.gz", "label 10", "item 17", "[0, 10)"], stdout_empty=True)
        d = os.path.join(work, "count")
        copy_dir(fm, d)
        gz_edit(os.path.join(d, "train-labels-idx1-ubyte.gz"), lambda b: b[:4] + struct.pack(">I", 63) + b[8:-1])
        expect("IDX label count differs from image count", tr("fashion-mnist:" + d), BAD_INPUT,
               ["train-labels-idx1-ubyte.gz", "63"], stdout_empty=True)

        c10 = os.path.join(work, "c10")
        files = u.write_cifar10(c10, rng, per_file=4, n_test=8)
        r = u.run_ok(tr("cifar10:" + c10), "valid tiny CIFAR-10")
        with open(files[2], "r+b") as f:
            f.truncate(4 * 3073 - 100)
        expect("CIFAR file of the wrong size", tr("cifar10:" + c10), BAD_INPUT,
               ["data_batch_3.bin", "3073"], stdout_empty=True)
        with open(files[2], "r+b") as f:
            f.truncate(4 * 3073)
        with open(files[5], "r+b") as f:  # test_batch.bin: label byte of record 1
            f.seek(3073)
            f.write(bytes([11]))
        expect("CIFAR label out of range", tr("cifar10:" + c10), BAD_INPUT, ["test_batch.bin", "label 11"],
               stdout_empty=True)
        expect("CIFAR dir without files", tr("cifar10:" + fm), IO, ["data_batch_1.bin", "cifar-10-binary"],
               stdout_empty=True)

        # ---- flags ----
        spec = "fashion-mnist:" + fm
        expect("unknown flag", ["train", "--model", "cnn", "--data", spec, "--lrate", "0.1"], USAGE, ["--lrate"],
               stdout_empty=True)
        expect("flag missing a value", ["train", "--model", "cnn", "--data", spec, "--epochs"], USAGE,
               ["--epochs", "value"], stdout_empty=True)
        expect("malformed --lr", ["train", "--model", "cnn", "--data", spec, "--lr", "abc"], USAGE,
               ["--lr", "'abc'"], stdout_empty=True)
        expect("--epochs 0", ["train", "--model", "cnn", "--data", spec, "--epochs", "0"], USAGE,
               ["--epochs", "'0'"], stdout_empty=True)
        expect("--batch-size 1.5", ["train", "--model", "cnn", "--data", spec, "--batch-size", "1.5"], USAGE,
               ["--batch-size", "'1.5'"], stdout_empty=True)
        expect("--lr=-1", ["train", "--model", "cnn", "--data", spec, "--lr=-1"], USAGE, ["--lr", "'-1'"],
               stdout_empty=True)
        expect("--input 3x", ["train", "--model", "cnn", "--data", spec, "--input", "3x"], USAGE, ["--input", "'3x'"],
               stdout_empty=True)
        expect("unknown --optimizer", ["train", "--model", "cnn", "--data", spec, "--optimizer", "rmsprop"], USAGE,
               ["--optimizer", "rmsprop"], stdout_empty=True)
        expect("unknown --monitor", ["train", "--model", "cnn", "--data", spec, "--monitor", "f1"], USAGE,
               ["--monitor", "f1"], stdout_empty=True)
        expect("stray argument", ["train", "--model", "cnn", "--data", spec, "cnn"], USAGE, ["'cnn'"],
               stdout_empty=True)
        expect("--resume takes no value", ["train", "--model", "cnn", "--data", spec, "--resume=1"], USAGE,
               ["--resume"], stdout_empty=True)
        expect("--model missing", ["train", "--data", spec], USAGE, ["--model"], stdout_empty=True)
        expect("eval without --weights", ["eval", "--model", "cnn", "--data", spec], USAGE, ["--weights"],
               stdout_empty=True)
        expect("predict with both --data and --images", ["predict", "--model", "cnn", "--weights", "w",
                                                         "--data", spec, "--images", fm], USAGE, ["--images"],
               stdout_empty=True)
        expect("train flag given to eval", ["eval", "--model", "cnn", "--data", spec, "--weights", "w", "--epochs",
                                            "2"], USAGE, ["--epochs"], stdout_empty=True)
        expect("unknown command", ["fit"], USAGE, ["'fit'", "usage:"], stdout_empty=True, max_lines=20)
        expect("--resume without --checkpoint-dir", ["train", "--model", "cnn", "--data", spec, "--resume"], USAGE,
               ["--resume", "--checkpoint-dir"], stdout_empty=True)
        expect("--device cuda without CUDA", tr(spec, "--device", "cuda"), NO_DEVICE, ["cuda"], stdout_empty=True)
        expect("--device cuda:3", tr(spec, "--device", "cuda:3"), NO_DEVICE, ["cuda:3"], stdout_empty=True)
        expect("--device gpu", tr(spec, "--device", "gpu"), USAGE, ["'gpu'", "cpu:N"], stdout_empty=True)

        # ---- models ----
        expect("unknown model", ["train", "--model", "resnet7", "--data", spec] + F, IO,
               ["resnet7", "resnet18"], stdout_empty=True)
        bad = os.path.join(work, "bad.txt")
        with open(bad, "w") as f:
            f.write("input 1x16x16\nconv2d 1 8 3\nrelu\n\nfrobnicate 3\nflatten\n")
        expect("unknown layer in a model file", ["train", "--model", bad, "--data", spec] + F, BAD_INPUT,
               [bad + ":5", "frobnicate"], stdout_empty=True)
        with open(bad, "w") as f:
            f.write("# comment\ninput 1x16x16\nconv2d 1 8 x3\n")
        expect("malformed number in a model file", ["train", "--model", bad, "--data", spec] + F, BAD_INPUT,
               [bad + ":3", "x3"], stdout_empty=True)
        with open(bad, "w") as f:
            f.write("input 1x16x16\nconv2d 1 8 3\nflatten\nlinear 100 10\n")
        expect("model file with inconsistent layer sizes", ["train", "--model", bad, "--data", spec] + F, SHAPE,
               [bad + ":4", "100"], stdout_empty=True)
        expect("model file missing", ["train", "--model", os.path.join(work, "none.txt"), "--data", spec] + F, IO,
               ["none.txt"], stdout_empty=True)
        expect("cnn at 3x32x32 on 1x16x16 data", tr(spec, "--input", "3x32x32"), SHAPE,
               ["3x32x32", "1x16x16"], stdout_empty=True)
        expect("linreg with the wrong feature count", ["train", "--model", "linreg", "--input", "7", "--data", spec]
               + F, SHAPE, ["7", "256"], stdout_empty=True)
        expect("input too small for the model", ["train", "--model", "cnn", "--data", "synthetic", "--input",
                                                 "1x8x8", "--max-steps", "1"] + F, SHAPE, ["cnn", "smaller"],
               stdout_empty=True)

        # ---- weights ----
        w = os.path.join(work, "cnn.safetensors")
        u.run_ok(tr(spec, "--save", w), "train to get weights")
        if os.path.exists(w):
            r = u.run_ok(["eval", "--model", "cnn", "--data", spec, "--weights", w] + F, "eval of valid weights")
            expect("--weights of another model", ["eval", "--model", "lenet5", "--data", spec, "--weights", w] + F,
                   IO, [w, "missing key", "unexpected key", "layers.0.weight", "\"0.weight\""], stdout_empty=True)
            with open(w, "rb") as f:
                blob = f.read()
            tw = os.path.join(work, "trunc.safetensors")
            for cut in (4, 200, len(blob) // 2, len(blob) - 1):
                with open(tw, "wb") as f:
                    f.write(blob[:cut])
                expect("weights truncated to %d bytes" % cut, ["eval", "--model", "cnn", "--data", spec, "--weights",
                                                               tw] + F, BAD_INPUT, [tw], stdout_empty=True)
            expect("weights file missing", ["eval", "--model", "cnn", "--data", spec, "--weights",
                                            os.path.join(work, "nope.safetensors")] + F, IO, ["nope.safetensors"],
                   stdout_empty=True)
            expect("weights at another input size (cnn is size-agnostic, classes are not)",
                   ["eval", "--model", "cnn", "--data", "synthetic", "--input", "1x16x16", "--classes", "4",
                    "--weights", w] + F, SHAPE, [w, "layers.9.weight", "shape"], stdout_empty=True)
            expect("--init with another model's weights", ["train", "--model", "mlp", "--data", spec, "--init", w] + F,
                   IO, [w, "missing key"], stdout_empty=True)

        # ---- outputs ----
        out_dir = os.path.join(work, "out")
        os.makedirs(os.path.join(out_dir, "taken.safetensors"))
        expect("--save into a missing folder", tr(spec, "--save", os.path.join(work, "nodir", "w.safetensors")), IO,
               ["--save", "nodir"], stdout_empty=True)
        no_file_like("--save into a missing folder", os.path.join(work, "nodir"))
        expect("--save onto a folder", tr(spec, "--save", os.path.join(out_dir, "taken.safetensors")), IO,
               ["--save", "taken.safetensors", "directory"], stdout_empty=True)
        u.check(sorted(os.listdir(out_dir)) == ["taken.safetensors"], "--save onto a folder left %s" % os.listdir(out_dir))
        expect("--metrics-json into a missing folder", tr(spec, "--metrics-json", os.path.join(work, "nodir", "m.json")),
               IO, ["--metrics-json", "nodir"], stdout_empty=True)
        expect("--metrics-json under a file", tr(spec, "--metrics-json", os.path.join(w, "m.json")), IO,
               ["--metrics-json", "not a folder"], stdout_empty=True)
        expect("eval --metrics-json into a missing folder", ["eval", "--model", "cnn", "--data", spec, "--weights", w,
                                                             "--metrics-json", os.path.join(work, "nodir", "m.json")]
               + F, IO, ["--metrics-json", "nodir"], stdout_empty=True)
        expect("--log-dir under a file", tr(spec, "--log-dir", os.path.join(w, "logs")), IO, ["logs"])
        if os.geteuid() != 0:  # root ignores permissions
            ro = os.path.join(work, "ro")
            os.makedirs(ro)
            os.chmod(ro, 0o555)
            expect("--save into a read-only folder", tr(spec, "--save", os.path.join(ro, "w.safetensors")), IO,
                   ["--save", "not writable"], stdout_empty=True)
            os.chmod(ro, 0o755)

        # ---- the exit-code table, case by case (issue 44): each found
        # before any work, with the documented code ----
        d = os.path.join(work, "crc")
        copy_dir(fm, d)
        path = os.path.join(d, "train-images-idx3-ubyte.gz")
        with open(path, "r+b") as f:  # the gzip trailer's CRC-32
            f.seek(-8, os.SEEK_END)
            crc = f.read(4)
            f.seek(-8, os.SEEK_END)
            f.write(bytes([crc[0] ^ 0xFF]) + crc[1:])
        expect("IDX gzip with a bad CRC", tr("fashion-mnist:" + d), BAD_INPUT, ["train-images-idx3-ubyte.gz"],
               stdout_empty=True)
        for split, prefix in (("train", "train"), ("test", "t10k")):
            d = os.path.join(work, "empty_" + split)
            copy_dir(fm, d)
            u.write_idx_images(os.path.join(d, prefix + "-images-idx3-ubyte.gz"), np.zeros((0, 16, 16), np.uint8))
            u.write_idx_labels(os.path.join(d, prefix + "-labels-idx1-ubyte.gz"), [])
            expect("an empty %s split" % split, tr("fashion-mnist:" + d), BAD_INPUT, [split + " split", "no samples"],
                   stdout_empty=True)
        d = os.path.join(work, "sizes")
        copy_dir(fm, d)
        x, y = u.make_images(rng, 8, 1, 20, 20, 10)
        u.write_idx_images(os.path.join(d, "t10k-images-idx3-ubyte.gz"), x[:, 0])
        u.write_idx_labels(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), y)
        expect("a test split of another image size", tr("fashion-mnist:" + d), SHAPE, ["test split", "20x20", "16x16"],
               stdout_empty=True)
        expect("--classes below the labels", tr("fashion-mnist:" + fm, "--classes", "3"), SHAPE,
               ["labels up to", "3 outputs"], stdout_empty=True)
        big = os.path.join(work, "big.txt")
        with open(big, "w") as f:
            f.write("input 1x16x16\nflatten\nlinear 256 100000\nlinear 100000 100000\n")
        expect("absurd layer sizes in a model file", ["train", "--model", big, "--data", "fashion-mnist:" + fm] + F,
               BAD_INPUT, ["big.txt:4", "parameters"], stdout_empty=True)

        # ---- predict on images ----
        expect("predict --images on a folder without images", ["predict", "--model", "cnn", "--weights", w,
                                                                "--images", fm] + F, IO, [fm, ".png"],
               stdout_empty=True)
        imgs = os.path.join(work, "imgs")
        os.makedirs(imgs)
        u.write_png(os.path.join(imgs, "a.png"), rng.integers(0, 255, (16, 16)).astype(np.uint8))
        u.write_png(os.path.join(imgs, "b.png"), rng.integers(0, 255, (20, 16)).astype(np.uint8))
        expect("predict --images of two sizes", ["predict", "--model", "cnn", "--weights", w, "--images", imgs] + F,
               SHAPE, ["b.png", "a.png"], stdout_empty=True)
        with open(os.path.join(imgs, "b.png"), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\nnot really")
        expect("predict --images with a corrupt PNG", ["predict", "--model", "cnn", "--weights", w, "--images",
                                                       imgs] + F, BAD_INPUT, ["b.png"], stdout_empty=True)
    finally:
        u.cleanup(work)
    u.finish()


if __name__ == "__main__":
    main()
