"""ctrain summary against PyTorch, and the informational commands.

`ctrain summary` must print, for every layer, the module name PyTorch's
state_dict uses, the output shape PyTorch computes (forward hooks on the
equivalent nn.Module) and the layer's own parameter count, then totals
equal to PyTorch's and the activation-memory line of the static plan.
Checked for the zoo models cnn (54k parameters), mlp, lenet5 and
torchvision's resnet18 (totals only), and for a model file.

`ctrain summary --memory`: the plan at its peak adds up (the kinds sum to
the live bytes, live plus gaps is the arena, which is the summary's
activation line; every live buffer has an owner; the largest are listed
largest first), autocast copies appear under bf16 only, a max pool's
kept workspace is listed, and the flag takes no value.

Also: `ctrain devices`, `ctrain version`, `ctrain --help`, every
subcommand's --help (listing the flags the command accepts), and `ctrain`
alone (usage on stderr, exit 2).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
try:
    import torch
    from torch import nn
except ImportError as e:
    print("skip:", e)
    sys.exit(77)

ROW = re.compile(r"^(\w+)-(\d+)(?: \(([^)]*)\))?\s+(\[[-\d, ]*\])\s+([\d,]+)$")


class CnnModel(nn.Module):
    def __init__(self, c=1, k=10):
        super().__init__()
        self.layers = nn.ModuleList([
            nn.Conv2d(c, 32, 3), nn.MaxPool2d(2, 2), nn.Conv2d(32, 64, 5), nn.MaxPool2d(2, 2), nn.Dropout2d(0.1),
            nn.AdaptiveMaxPool2d((1, 1)), nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, k)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def lenet5(c, h, w, k):
    hh, ww = ((h // 2) - 4) // 2, ((w // 2) - 4) // 2
    return nn.Sequential(nn.Conv2d(c, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(16 * hh * ww, 120), nn.ReLU(), nn.Linear(120, 84),
                         nn.ReLU(), nn.Linear(84, k))


def mlp(c, h, w, k):
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, k))


MODEL_TEXT = """input 3x20x20
conv2d 3 8 3 padding=1 bias=false
batchnorm2d 8
relu
maxpool2d 3 stride=2 padding=1 ceil_mode=true
dropout2d 0.1
adaptiveavgpool2d 3
flatten
linear 72 16
gelu
dropout 0.5
linear 16 5
"""


def text_torch():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1, ceil_mode=True), nn.Dropout2d(0.1), nn.AdaptiveAvgPool2d((3, 3)),
                         nn.Flatten(), nn.Linear(72, 16), nn.GELU(), nn.Dropout(0.5), nn.Linear(16, 5))


def torch_rows(model, shape, batch):
    """[(name, type, output shape, own params)] for leaf modules in call order."""
    rows = []
    names = {m: n for n, m in model.named_modules()}
    hooks = []
    for m in model.modules():
        if not list(m.children()):
            hooks.append(m.register_forward_hook(
                lambda mod, i, o: rows.append((names[mod], type(mod).__name__, list(o.shape),
                                               sum(p.numel() for p in mod.parameters())))))
    model.eval()
    with torch.no_grad():
        model(torch.randn(batch, *shape))
    for h in hooks:
        h.remove()
    return rows


def parse_summary(text):
    rows, totals = [], {}
    for line in text.splitlines():
        m = ROW.match(line.strip())
        if m:
            rows.append((m.group(3), m.group(1), [int(v) for v in m.group(4)[1:-1].split(",") if v.strip()],
                         int(m.group(5).replace(",", ""))))
            continue
        for key in ("Total params", "Trainable params", "Non-trainable params"):
            if line.startswith(key + ":"):
                totals[key] = int(line.split(":")[1].strip().replace(",", ""))
        if line.startswith("Forward/backward pass size (MB):"):
            totals["activations"] = float(line.split(":")[1].split()[0])
    return rows, totals


MEM_HEAD = re.compile(r"^Memory plan of a training step: arena ([\d.]+) MB; at its peak, during (.+),$")
MEM_HOLD = re.compile(r"^(\d+) buffers hold ([\d.]+) MB \(the arena's gaps: ([\d.]+) MB\)$")
MEM_KIND = re.compile(r"^  (\S.*?)\s+([\d.]+) MB  \((\d+)\)$")
MEM_BUF = re.compile(r"^\s+([\d.]+) MB  (.+) of layer (\d+) \(([^,]+), (\w+)\), until (.+)$")


def memory_case(what, args):
    """ctrain summary --memory: returns {kind: MB} of the peak, or None."""
    r = u.run_ok(["summary", "--memory"] + args, "summary --memory %s" % what)
    if r.returncode:
        return None
    lines = r.stdout.splitlines()
    act = parse_summary(r.stdout)[1].get("activations")
    head = [i for i, l in enumerate(lines) if MEM_HEAD.match(l)]
    if not u.check(len(head) == 1, "%s: no 'Memory plan of a training step' line in %r" % (what, r.stdout[-600:])):
        return None
    i = head[0]
    arena = float(MEM_HEAD.match(lines[i]).group(1))
    hold = MEM_HOLD.match(lines[i + 1])
    if not u.check(hold is not None, "%s: %r" % (what, lines[i + 1])):
        return None
    n, live, gaps = int(hold.group(1)), float(hold.group(2)), float(hold.group(3))
    u.check(act is not None and abs(arena - act) < 0.006, "%s: arena %.2f MB, summary line %r" % (what, arena, act))
    u.check(abs(live + gaps - arena) < 0.015 and live > 0, "%s: live %.2f + gaps %.2f != arena %.2f" % (what, live, gaps,
                                                                                                        arena))
    kinds, j = {}, i + 2
    while j < len(lines) and MEM_KIND.match(lines[j]):
        m = MEM_KIND.match(lines[j])
        kinds[m.group(1)] = (float(m.group(2)), int(m.group(3)))
        j += 1
    u.check(abs(sum(v[0] for v in kinds.values()) - live) < 0.01 * (len(kinds) + 1),
            "%s: kinds %r do not add up to %.2f MB" % (what, kinds, live))
    u.check(sum(v[1] for v in kinds.values()) == n, "%s: kinds count %r, %d buffers" % (what, kinds, n))
    u.check("other" not in kinds, "%s: buffers without an owner: %r" % (what, kinds.get("other")))
    u.check(j < len(lines) and lines[j] == "Largest live buffers:", "%s: no 'Largest live buffers:'" % what)
    sizes = [float(MEM_BUF.match(l).group(1)) for l in lines[j + 1:] if MEM_BUF.match(l)]
    u.check(len(sizes) == min(10, n) and sizes == sorted(sizes, reverse=True),
            "%s: largest buffers %r (of %d live)" % (what, sizes, n))
    return {k: v[0] for k, v in kinds.items()}


def summary_case(what, args, model, shape, batch, check_rows=True):
    r = u.run_ok(["summary"] + args + ["--batch-size", batch], "summary %s" % what)
    if r.returncode:
        return
    rows, totals = parse_summary(r.stdout)
    want = sum(p.numel() for p in model.parameters())
    u.check(totals.get("Total params") == want, "%s: Total params %r, PyTorch %d" % (what, totals.get("Total params"),
                                                                                   want))
    u.check(totals.get("Trainable params") == want and totals.get("Non-trainable params") == 0,
            "%s: trainable/non-trainable %r" % (what, totals))
    u.check(totals.get("activations", 0) > 0, "%s: no positive 'Forward/backward pass size (MB)' line" % what)
    u.check(r.stdout.splitlines()[0].endswith("input %s" % "x".join(str(s) for s in shape)),
            "%s: first line %r" % (what, r.stdout.splitlines()[0]))
    if not check_rows:
        return want
    ref = torch_rows(model, shape, batch)
    u.check(len(rows) == len(ref), "%s: %d layer rows, PyTorch has %d leaf modules" % (what, len(rows), len(ref)))
    for i, (a, b) in enumerate(zip(rows, ref)):
        u.check(a == b, "%s: row %d is %s, PyTorch %s" % (what, i + 1, a, b))
    return want


def main():
    work = u.tmpdir("summary")
    try:
        n = summary_case("cnn", ["--model", "cnn"], CnnModel(1, 10), (1, 28, 28), 64)
        u.check(n is not None and 53000 < n < 55000, "cnn has %r parameters, expected about 54k" % n)
        summary_case("cnn 3x32x32/100", ["--model", "cnn", "--input", "3x32x32", "--classes", "100"],
                     CnnModel(3, 100), (3, 32, 32), 8)
        summary_case("lenet5 1x32x32", ["--model", "lenet5", "--input", "1x32x32"], lenet5(1, 32, 32, 10), (1, 32, 32),
                     2)
        summary_case("mlp 3x8x8/7", ["--model", "mlp", "--input", "3x8x8", "--classes", "7"], mlp(3, 8, 8, 7),
                     (3, 8, 8), 3)
        text = os.path.join(work, "m.txt")
        with open(text, "w") as f:
            f.write(MODEL_TEXT)
        summary_case("model file", ["--model", text], text_torch(), (3, 20, 20), 5)
        try:
            import torchvision
            summary_case("resnet18 3x64x64", ["--model", "resnet18", "--input", "3x64x64", "--classes", "10"],
                         torchvision.models.resnet18(num_classes=10), (3, 64, 64), 2, check_rows=False)
        except ImportError:
            print("torchvision missing: resnet18 not compared")
        # The step memory grows with the batch.
        a = u.run(["summary", "--model", "cnn", "--batch-size", "8"])
        b = u.run(["summary", "--model", "cnn", "--batch-size", "64"])
        ta, tb = parse_summary(a.stdout)[1], parse_summary(b.stdout)[1]
        u.check(0 < ta.get("activations", 0) < tb.get("activations", 0),
                "activation memory at batch 8 (%r) not below batch 64 (%r)" % (ta.get("activations"),
                                                                              tb.get("activations")))
        text_args = ["--model", text, "--batch-size", "64"]
        k32 = memory_case("model file fp32", text_args)
        k16 = memory_case("model file bf16", text_args + ["--precision", "bf16"])
        if k32 is not None and k16 is not None:
            u.check(not any(k.startswith("cast") for k in k32), "fp32 plan with autocast copies: %r" % k32)
            u.check(any(k.startswith("cast inputs") for k in k16), "bf16 plan without the input's cast: %r" % k16)
        r = u.run_ok(["summary", "--memory", "--model", "lenet5", "--batch-size", "32"], "summary --memory lenet5")
        u.check(re.search(r"workspace of layer \d+ \(\d+, maxpool2d\)", r.stdout) is not None,
                "lenet5: no max pool workspace among the largest buffers: %r" % r.stdout[-900:])
        memory_case("resnet18 3x32x32", ["--model", "resnet18", "--input", "3x32x32", "--batch-size", "4"])
        r = u.run(["summary", "--model", "cnn", "--memory=3"])
        u.check(r.returncode == 2 and "takes no value" in r.stderr, "--memory=3: %d %r" % (r.returncode, r.stderr))
        r = u.run(["summary"])
        u.check(r.returncode == 2 and "--model" in r.stderr, "summary without --model: %d %r" % (r.returncode,
                                                                                                 r.stderr))

        # Informational commands.
        r = u.run_ok(["devices"], "devices")
        u.check(r.stdout.startswith("cpu ") and "\nref " in r.stdout and "cuda" in r.stdout,
                "devices output %r" % r.stdout)
        r = u.run(["devices", "extra"])
        u.check(r.returncode == 2, "devices with an argument: exit %d" % r.returncode)
        r = u.run_ok(["version"], "version")
        with open(os.path.join(u.SOURCE, "CMakeLists.txt")) as f:
            ver = re.search(r"project\(ctrain VERSION ([\d.]+)", f.read()).group(1)
        u.check(r.stdout.strip() == "ctrain " + ver, "version %r, CMakeLists says %s" % (r.stdout, ver))
        r = u.run_ok(["--help"], "--help")
        for cmd in ("train", "eval", "predict", "summary", "devices", "version"):
            u.check(re.search(r"^  %s " % cmd, r.stdout, re.M), "--help does not list %s" % cmd)
        r = u.run([])
        u.check(r.returncode == 2 and r.stdout == "" and "usage: ctrain" in r.stderr,
                "ctrain alone: exit %d, stdout %r, stderr %r" % (r.returncode, r.stdout, r.stderr[:80]))
        # Each command's --help lists every flag the command accepts
        # (accepted = not rejected as unknown).
        flags = {
            "train": ["model", "data", "epochs", "batch-size", "max-steps", "optimizer", "lr", "momentum",
                      "weight-decay", "scheduler", "clip-grad-norm", "label-smoothing", "input", "classes", "resize",
                      "augment", "device", "threads", "workers", "seed", "no-shuffle", "init", "save",
                      "checkpoint-dir", "keep-last", "resume", "monitor", "patience", "min-delta", "restore-best",
                      "log-dir", "metrics-json"],
            "eval": ["model", "weights", "data", "batch-size", "input", "classes", "resize", "device", "threads",
                     "workers", "seed", "metrics-json"],
            "predict": ["model", "weights", "data", "images", "batch-size", "input", "classes", "resize", "device",
                        "threads", "workers"],
            "summary": ["model", "input", "classes", "batch-size", "memory"],
        }
        for cmd, fl in flags.items():
            r = u.run_ok([cmd, "--help"], "%s --help" % cmd)
            u.check(r.stdout.startswith("usage: ctrain %s" % cmd), "%s --help: %r" % (cmd, r.stdout[:60]))
            args = []
            for f in fl:
                u.check("--" + f in r.stdout, "%s --help does not mention --%s" % (cmd, f))
                args += ["--" + f] + {"optimizer": ["adam"], "scheduler": ["step"], "augment": ["flip"],
                                      "monitor": ["loss"], "input": ["1x8x8"], "no-shuffle": [], "resume": [],
                                      "restore-best": [], "memory": []}.get(f, ["1"])
            # Every flag is accepted: parsing reaches the unknown one at the end.
            rr = u.run([cmd] + args + ["--bogus-flag-x"])
            u.check("'--bogus-flag-x'" in rr.stderr, "%s: a documented flag is refused: %r" % (cmd, rr.stderr.strip()))
    finally:
        u.cleanup(work)
    u.finish()


if __name__ == "__main__":
    main()
