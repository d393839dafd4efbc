"""`ctrain train --tf32` (docs/CLI.md), PyTorch's allow_tf32: f32
convolutions and matmuls may round their inputs to TF32 on the tensor cores.
`eval` and `predict` take it too.

- the three commands' --help list it;
- on the cpu it is a usage error (exit 2, one line naming the flag, the
  device and --device cuda, nothing on stdout), for eval and predict too,
  before they read any data;
- on cuda (CTRAIN_TEST_DEVICE=cuda: tests/emu on the CUDA emulator, which
  rounds to TF32 wherever it is allowed, and ctest's cli_test_tf32_cuda on
  a GPU, where cuBLASLt's TF32 compute type rounds the mlp's matmuls) the
  mlp trained with it saves other weights than without it, both runs
  --deterministic so that the difference is TF32's; `ctrain eval` of the
  strict run's weights reports another test loss with the flag than
  without it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st_util = u.need_module("st_util")
USAGE = 2
BASE = ["train", "--model", "mlp", "--data", "synthetic:64", "--batch-size", "32", "--epochs", "1", "--seed", "3"] + u.FAST

for cmd in ("train", "eval", "predict"):
    h = u.run([cmd, "--help"], timeout=30)
    u.check("--tf32" in h.stdout, "%s --help lists --tf32" % cmd)


def refused(args, what):
    r = u.run(args, timeout=60)
    err = r.stderr.strip()
    u.check(r.returncode == USAGE, "%s: exit %d, expected %d (%s)" % (what, r.returncode, USAGE, err))
    u.check("--tf32" in err and "--device cuda" in err and len(err.splitlines()) == 1,
            "%s: one line naming the flag and --device cuda: %r" % (what, err))
    u.check(r.stdout.strip() == "", "%s: nothing on stdout: %r" % (what, r.stdout))
    return err


for dev in ("cpu", "ref"):
    err = refused(BASE + ["--device", dev, "--tf32"], "--tf32 on " + dev)
    u.check(("'%s'" % dev) in err, "--tf32 on %s: the device named: %r" % (dev, err))
# Refused before any data is read: a missing data folder is not reached.
for cmd in ("eval", "predict"):
    refused([cmd, "--model", "mlp", "--data", "fashion-mnist:/nonexistent", "--weights", "none.safetensors", "--device",
             "cpu", "--tf32"], cmd + " --tf32 on cpu")

if u.TEST_DEVICE.startswith("cuda"):
    d = u.tmpdir("tf32")
    try:
        got = {}
        for name, extra in (("strict", []), ("tf32", ["--tf32"])):
            path = os.path.join(d, name + ".safetensors")
            r = u.run_ok(BASE + ["--device", u.TEST_DEVICE, "--deterministic", "--save", path] + extra, name, timeout=300)
            if r.returncode == 0:
                tensors, _ = st_util.load(path)
                got[name] = {k: st_util.tensor_bytes(v) for k, v in tensors.items()}
        if len(got) == 2:
            u.check(got["strict"] != got["tf32"], "cuda: --tf32 left every weight as strict f32 gave it")
            ev = ["eval", "--model", "mlp", "--data", "synthetic:64", "--weights", os.path.join(d, "strict.safetensors"),
                  "--device", u.TEST_DEVICE]
            loss = {}
            for name, extra in (("strict", []), ("tf32", ["--tf32"])):
                mj = os.path.join(d, "eval_%s.json" % name)
                if u.run_ok(ev + ["--metrics-json", mj] + extra, "eval " + name, timeout=120).returncode == 0:
                    loss[name] = u.read_json(mj)["test_loss"]
            if len(loss) == 2:
                print("eval test loss: strict f32 %r, --tf32 %r" % (loss["strict"], loss["tf32"]))
                u.check(loss["strict"] != loss["tf32"], "cuda: eval --tf32 reports strict f32's loss")
    finally:
        u.cleanup(d)
u.finish()
