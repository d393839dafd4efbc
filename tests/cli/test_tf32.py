"""`ctrain train --tf32` (docs/CLI.md), PyTorch's allow_tf32: f32
convolutions and matmuls may round their inputs to TF32 on the tensor cores.

- --help lists it;
- on the cpu it is a usage error (exit 2, one line naming the flag, the
  device and --device cuda, nothing on stdout);
- on cuda (CTRAIN_TEST_DEVICE=cuda: tests/emu on the CUDA emulator, which
  rounds to TF32 wherever it is allowed, and ctest's cli_test_tf32_cuda on
  a GPU, where cuBLASLt's TF32 compute type rounds the mlp's matmuls) the
  mlp trained with it saves other weights than without it, both runs
  --deterministic so that the difference is TF32's.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st_util = u.need_module("st_util")
USAGE = 2
BASE = ["train", "--model", "mlp", "--data", "synthetic:64", "--batch-size", "32", "--epochs", "1", "--seed", "3"] + u.FAST

h = u.run(["train", "--help"], timeout=30)
u.check("--tf32" in h.stdout, "train --help lists --tf32")

for dev in ("cpu", "ref"):
    r = u.run(BASE + ["--device", dev, "--tf32"], timeout=60)
    err = r.stderr.strip()
    u.check(r.returncode == USAGE, "--tf32 on %s: exit %d, expected %d (%s)" % (dev, r.returncode, USAGE, err))
    u.check("--tf32" in err and "--device cuda" in err and ("'%s'" % dev) in err and len(err.splitlines()) == 1,
            "--tf32 on %s: one line naming the flag, the device and --device cuda: %r" % (dev, err))
    u.check(r.stdout.strip() == "", "--tf32 on %s: nothing on stdout: %r" % (dev, r.stdout))

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
    finally:
        u.cleanup(d)
u.finish()
