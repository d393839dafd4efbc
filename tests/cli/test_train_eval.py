"""ctrain train -> eval -> predict on tiny Fashion-MNIST-format IDX files,
and the saved weights in PyTorch.

For the zoo model `cnn` and for a model text file (with batchnorm and
dropout): training writes --save weights and --metrics-json with every
documented key; `ctrain eval` on those weights reproduces the JSON's test
loss and accuracy exactly; `ctrain predict --data` prints one CSV line per
test sample whose probabilities sum to 1 and whose argmax is the predicted
column, agreeing with PyTorch's softmax; `ctrain predict --images` on PNG
copies of test images gives the same predictions as on the IDX data; and
the weights load strictly into the equivalent PyTorch model, which reaches
the same test accuracy and loss on the same file.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
try:
    import numpy as np
    import torch
    from torch import nn
    import st_util
except ImportError as e:
    print("skip:", e)
    sys.exit(77)

REQUIRED = ["model", "dataset", "epochs", "steps", "train_loss", "test_loss", "test_accuracy", "images_per_second",
            "epoch_seconds", "peak_memory_bytes", "device_peak_bytes", "precision", "device", "seed"]


class CnnModel(nn.Module):
    """The zoo's `cnn` (torchkeras' MNIST CnnModel) under its key names."""

    def __init__(self, in_channels=1, num_classes=10):
        super().__init__()
        self.layers = nn.ModuleList([
            nn.Conv2d(in_channels, 32, 3), nn.MaxPool2d(2, 2), nn.Conv2d(32, 64, 5), nn.MaxPool2d(2, 2),
            nn.Dropout2d(0.1), nn.AdaptiveMaxPool2d((1, 1)), nn.Flatten(), nn.Linear(64, 32), nn.ReLU(),
            nn.Linear(32, num_classes)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


MODEL_TEXT = """# a small model file for the CLI tests
input 1x16x16
conv2d 1 8 3 padding=1      # 0
batchnorm2d 8               # 1
relu                        # 2
maxpool2d 2                 # 3 -> 8x8x8
dropout2d 0.2               # 4
conv2d 8 12 3 stride=2      # 5 -> 12x3x3
relu                        # 6
flatten                     # 7
dropout 0.3                 # 8
linear 108 10               # 9
"""


def text_model_torch():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Dropout2d(0.2), nn.Conv2d(8, 12, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Dropout(0.3),
                         nn.Linear(108, 10))


def parse_predict(stdout, n_classes):
    lines = [l for l in stdout.splitlines() if l.strip()]
    header = lines[0].split(",")
    rows = []
    for l in lines[1:]:
        f = l.split(",")
        rows.append({"index": int(f[0]), "source": f[1], "label": int(f[2]), "pred": int(f[3]), "prob": float(f[4]),
                     "probs": [float(v) for v in f[5:]]})
    return header, rows


def check_predict_rows(what, header, rows, labels, n_classes):
    u.check(header == ["index", "source", "label", "predicted", "probability"] + ["p%d" % j for j in range(n_classes)],
            "%s: CSV header %s" % (what, header))
    if labels is not None:
        u.check(len(rows) == len(labels), "%s: %d CSV lines for %d samples" % (what, len(rows), len(labels)))
    for i, r in enumerate(rows):
        ok = u.check(r["index"] == i and len(r["probs"]) == n_classes, "%s: line %d malformed: %s" % (what, i, r))
        if not ok:
            break
        s = sum(r["probs"])
        u.check(abs(s - 1.0) < 1e-4, "%s: line %d probabilities sum to %r" % (what, i, s))
        best = max(range(n_classes), key=lambda j: r["probs"][j])
        u.check(r["pred"] == best or r["probs"][r["pred"]] == r["probs"][best],
                "%s: line %d predicted %d but argmax is %d" % (what, i, r["pred"], best))
        u.check(abs(r["prob"] - r["probs"][r["pred"]]) < 1e-5, "%s: line %d probability column %r vs p%d %r" % (
            what, i, r["prob"], r["pred"], r["probs"][r["pred"]]))
        if labels is not None:
            u.check(r["label"] == int(labels[i]), "%s: line %d label %d, file has %d" % (what, i, r["label"], labels[i]))


def torch_eval(model, x_u8, y):
    """(accuracy, mean CE loss, logits) of model on uint8 [n,h,w] images / 255."""
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(x_u8.astype(np.float32) / np.float32(255.0)).unsqueeze(1)
        logits = model(x)
        yt = torch.from_numpy(y.astype(np.int64))
        loss = nn.functional.cross_entropy(logits.double(), yt).item()
        acc = (logits.argmax(1) == yt).double().mean().item()
    return acc, loss, logits


def case(tag, model_arg, torch_model, work, data, fm_dir, extra):
    spec = "fashion-mnist:" + fm_dir
    wpath = os.path.join(work, tag + ".safetensors")
    mpath = os.path.join(work, tag + "_train.json")
    common = ["--model", model_arg, "--data", spec, "--batch-size", "32"] + u.FAST
    r = u.run_ok(["train"] + common + ["--epochs", "2", "--seed", "5", "--save", wpath, "--metrics-json", mpath] + extra,
                 "%s: train" % tag)
    if r.returncode:
        return
    m = u.read_json(mpath)
    for k in REQUIRED:
        u.check(k in m, "%s: metrics JSON lacks '%s' (has %s)" % (tag, k, sorted(m)))
    if any(k not in m for k in REQUIRED):
        return
    n_train, n_test = len(data["train"][1]), len(data["test"][1])
    u.check(m["dataset"] == "fashion-mnist", "%s: dataset %r" % (tag, m["dataset"]))
    u.check(m["epochs"] == 2 and len(m["epoch_seconds"]) == 2, "%s: epochs %r, epoch_seconds %r" % (
        tag, m["epochs"], m["epoch_seconds"]))
    u.check(all(isinstance(s, (int, float)) and s > 0 for s in m["epoch_seconds"]), "%s: epoch_seconds %r" % (
        tag, m["epoch_seconds"]))
    u.check(m["steps"] == 2 * ((n_train + 31) // 32), "%s: steps %r" % (tag, m["steps"]))
    u.check(m["seed"] == 5 and m["precision"] == "fp32" and m["device"].startswith("cpu"),
            "%s: seed/precision/device %r %r %r" % (tag, m["seed"], m["precision"], m["device"]))
    u.check(m["peak_memory_bytes"] > 0 and m["images_per_second"] > 0, "%s: peak memory %r, img/s %r" % (
        tag, m["peak_memory_bytes"], m["images_per_second"]))
    # the CPU's step arena at least (parameters are host memory there)
    u.check(m["device_peak_bytes"] > 0, "%s: device peak %r" % (tag, m["device_peak_bytes"]))
    acc_json = m["test_accuracy"]
    u.check(0 <= acc_json <= 1 and abs(acc_json * n_test - round(acc_json * n_test)) < 1e-9,
            "%s: test_accuracy %r is not k/%d" % (tag, acc_json, n_test))
    u.check(acc_json > 0.15, "%s: test accuracy %.3f; the tiny data is learnable, expected better than chance" % (
        tag, acc_json))

    # eval reproduces the numbers exactly.
    epath = os.path.join(work, tag + "_eval.json")
    r = u.run_ok(["eval", "--model", model_arg, "--data", spec, "--weights", wpath, "--metrics-json", epath,
                  "--batch-size", "50"] + u.FAST, "%s: eval" % tag)
    if r.returncode == 0:
        e = u.read_json(epath)
        u.check(e.get("test_accuracy") == m["test_accuracy"], "%s: eval accuracy %r != train's %r" % (
            tag, e.get("test_accuracy"), m["test_accuracy"]))
        u.check(e.get("samples") == n_test, "%s: eval samples %r" % (tag, e.get("samples")))
        # Another batch size sums the batch means in another order; allow
        # only rounding. The same batch size must be bit-identical.
        u.check(abs(e.get("test_loss", 1e9) - m["test_loss"]) <= 1e-6 * abs(m["test_loss"]),
                "%s: eval loss %r vs train's %r" % (tag, e.get("test_loss"), m["test_loss"]))
    r = u.run_ok(["eval", "--model", model_arg, "--data", spec, "--weights", wpath, "--metrics-json", epath,
                  "--batch-size", "32"] + u.FAST, "%s: eval (same batch size)" % tag)
    if r.returncode == 0:
        e = u.read_json(epath)
        u.check(e.get("test_loss") == m["test_loss"] and e.get("test_accuracy") == m["test_accuracy"],
                "%s: eval at the training batch size gives loss %r acc %r, train gave %r %r" % (
                    tag, e.get("test_loss"), e.get("test_accuracy"), m["test_loss"], m["test_accuracy"]))

    # predict on the data.
    x_test, y_test = data["test"]
    r = u.run_ok(["predict", "--model", model_arg, "--data", spec, "--weights", wpath] + u.FAST,
                 "%s: predict --data" % tag)
    rows = []
    if r.returncode == 0:
        header, rows = parse_predict(r.stdout, 10)
        check_predict_rows("%s: predict --data" % tag, header, rows, y_test, 10)
        if len(rows) == n_test:
            acc_pred = sum(1 for row in rows if row["pred"] == row["label"]) / n_test
            u.check(acc_pred == acc_json, "%s: predict accuracy %r, metrics %r" % (tag, acc_pred, acc_json))

    # PyTorch: strict load, same accuracy and loss, same probabilities.
    tensors, meta = st_util.load(wpath)
    try:
        torch_model.load_state_dict(tensors, strict=True)
    except RuntimeError as ex:
        u.check(False, "%s: PyTorch strict load_state_dict failed: %s" % (tag, ex))
        return
    acc_t, loss_t, logits = torch_eval(torch_model, x_test, y_test)
    print("%s: ctrain test acc %.4f loss %.6f; PyTorch acc %.4f loss %.6f" % (tag, acc_json, m["test_loss"], acc_t,
                                                                            loss_t))
    u.check(abs(loss_t - m["test_loss"]) <= 2e-5 * max(1.0, abs(loss_t)),
            "%s: PyTorch test loss %.8f, ctrain %.8f" % (tag, loss_t, m["test_loss"]))
    if acc_t != acc_json:
        # Only a near-tie between the two best logits may flip.
        top2 = logits.topk(2, dim=1).values
        margins = (top2[:, 0] - top2[:, 1]).abs()
        pt = logits.argmax(1).numpy()
        flipped = [i for i in range(len(rows)) if rows[i]["pred"] != pt[i]] if rows else []
        u.check(rows and all(margins[i] < 1e-4 for i in flipped),
                "%s: PyTorch test accuracy %.6f, ctrain %.6f (samples %s differ)" % (tag, acc_t, acc_json, flipped))
    if rows:
        probs_t = torch.softmax(logits.double(), 1).numpy()
        probs_c = np.array([row["probs"] for row in rows])
        diff = float(np.abs(probs_t - probs_c).max())
        u.check(diff < 2e-5, "%s: predict probabilities differ from PyTorch's softmax by %g" % (tag, diff))

    # predict on PNG copies of the first test images (one RGB with equal
    # channels: the gray conversion must give back the same value).
    img_dir = os.path.join(work, tag + "_png")
    os.makedirs(img_dir)
    k = 6
    for i in range(k):
        img = x_test[i] if i != 2 else np.stack([x_test[i]] * 3, axis=-1)
        u.write_png(os.path.join(img_dir, "img%02d.png" % i), img)
    with open(os.path.join(img_dir, "notes.txt"), "w") as f:
        f.write("not an image; predict must skip it\n")
    # A zoo model's input defaults to 1x28x28 (images are resized to the
    # model's input), so a model trained at 16x16 needs --input here.
    shape = ["--input", "1x16x16"] if model_arg == "cnn" else []
    r = u.run_ok(["predict", "--model", model_arg, "--images", img_dir, "--weights", wpath] + shape + u.FAST,
                 "%s: predict --images" % tag)
    if r.returncode == 0:
        header, irows = parse_predict(r.stdout, 10)
        check_predict_rows("%s: predict --images" % tag, header, irows, None, 10)
        if u.check(len(irows) == k, "%s: predict --images gave %d lines for %d PNGs" % (tag, len(irows), k)):
            for i, row in enumerate(irows):
                u.check(os.path.basename(row["source"]) == "img%02d.png" % i, "%s: image line %d source %r" % (
                    tag, i, row["source"]))
                if rows:
                    d = max(abs(a - b) for a, b in zip(row["probs"], rows[i]["probs"]))
                    u.check(row["pred"] == rows[i]["pred"] and d < 1e-6,
                            "%s: image %d predicted %d (probs off by %g), on the IDX data %d" % (
                                tag, i, row["pred"], d, rows[i]["pred"]))
    # A single file works too.
    r = u.run_ok(["predict", "--model", model_arg, "--images", os.path.join(img_dir, "img00.png"), "--weights",
                  wpath] + shape + u.FAST, "%s: predict --images FILE" % tag)
    if r.returncode == 0:
        header, irows = parse_predict(r.stdout, 10)
        u.check(len(irows) == 1, "%s: predict on one file gave %d lines" % (tag, len(irows)))


def main():
    work = u.tmpdir("train_eval")
    try:
        rng = np.random.default_rng(20240611)
        fm = os.path.join(work, "fm")
        data = u.write_idx_dataset(fm, rng, n_train=256, n_test=100, h=16, w=16)
        case("cnn", "cnn", CnnModel(1, 10), work, data, fm, ["--optimizer", "adam", "--lr", "0.003"])
        text = os.path.join(work, "small.txt")
        with open(text, "w") as f:
            f.write(MODEL_TEXT)
        case("text", text, text_model_torch(), work, data, fm, ["--optimizer", "sgd", "--lr", "0.05",
                                                              "--momentum", "0.9"])
    finally:
        u.cleanup(work)
    u.finish()


if __name__ == "__main__":
    main()
