"""`ctrain train --deterministic` (docs/CLI.md), as PyTorch's
torch.backends.cudnn.deterministic: only deterministic cuDNN algorithms,
so a run repeats bit for bit.

- train's, eval's and predict's --help list it;
- with --cudnn-benchmark it is a usage error (exit 2, one line naming both,
  nothing on stdout): the benchmark picks algorithms by measured time; in
  eval and predict too;
- on the cpu (deterministic anyway) it is accepted and changes nothing:
  the saved weights equal those of the same run without it, bit for bit,
  and so does `ctrain eval`'s test loss;
- on cuda (CTRAIN_TEST_DEVICE=cuda: tests/emu on the CUDA emulator, and
  ctest's cli_test_deterministic_cuda on a GPU) two runs of the seed's
  cnn with the flag save the same weights. On the emulator with
  CT_EMU_DNN_NONDET=1, whose nondeterministic backward algorithms rank
  first and vary per call, two runs without the flag must differ (else
  the check above would be blind); on a GPU that is printed, not checked.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

u.need_binary()
st_util = u.need_module("st_util")
USAGE = 2
BASE = ["train", "--model", "cnn", "--data", "synthetic:96", "--batch-size", "32", "--epochs", "1", "--seed", "3",
        "--optimizer", "sgd", "--momentum", "0.9"] + u.FAST

for cmd in ("train", "eval", "predict"):
    h = u.run([cmd, "--help"], timeout=30)
    u.check("--deterministic" in h.stdout, "%s --help lists --deterministic" % cmd)

EVAL = ["--model", "cnn", "--data", "synthetic:96", "--weights", "none.safetensors"]
for args in (BASE, ["eval"] + EVAL, ["predict"] + EVAL):
    r = u.run(args + ["--device", "cpu", "--deterministic", "--cudnn-benchmark"], timeout=60)
    err = r.stderr.strip()
    u.check(r.returncode == USAGE, "%s --deterministic with --cudnn-benchmark: exit %d, expected %d (%s)" % (
        args[0], r.returncode, USAGE, err))
    u.check("--deterministic" in err and "--cudnn-benchmark" in err and len(err.splitlines()) == 1,
            "%s: one line naming both flags expected: %r" % (args[0], err))
    u.check(r.stdout.strip() == "", "%s: nothing on stdout: %r" % (args[0], r.stdout))


def weights(d, name, extra):
    """The tensors (name -> raw bytes) a run saves, or None if it failed."""
    path = os.path.join(d, name + ".safetensors")
    r = u.run_ok(BASE + extra + ["--save", path], name, timeout=300)
    if r.returncode != 0:
        return None
    tensors, _ = st_util.load(path)
    return {k: st_util.tensor_bytes(v) for k, v in tensors.items()}


def differing(a, b):
    return sorted(k for k in a if a[k] != b.get(k))


d = u.tmpdir("deterministic")
try:
    plain = weights(d, "cpu", ["--device", "cpu"])
    det = weights(d, "cpu_det", ["--device", "cpu", "--deterministic"])
    if plain and det:
        u.check(plain == det, "cpu: --deterministic changed the weights: %s" % differing(plain, det))
        # An acceptance check: eval takes the flag on the cpu, where it
        # changes nothing.
        ev = ["eval", "--model", "cnn", "--data", "synthetic:96", "--weights", os.path.join(d, "cpu.safetensors"),
              "--device", "cpu"]
        loss = []
        for i, extra in enumerate(([], ["--deterministic"])):
            mj = os.path.join(d, "eval%d.json" % i)
            if u.run_ok(ev + ["--metrics-json", mj] + extra, "cpu eval %s" % extra).returncode == 0:
                loss.append(u.read_json(mj)["test_loss"])
        if len(loss) == 2:
            u.check(loss[0] == loss[1], "cpu: eval --deterministic changed the test loss: %r" % loss)
    if u.TEST_DEVICE.startswith("cuda"):
        dev = ["--device", u.TEST_DEVICE]
        a = weights(d, "cuda_det_a", dev + ["--deterministic"])
        b = weights(d, "cuda_det_b", dev + ["--deterministic"])
        if a and b:
            u.check(a == b, "cuda: two --deterministic runs differ in %s" % differing(a, b))
        fa = weights(d, "cuda_a", dev)
        fb = weights(d, "cuda_b", dev)
        if fa and fb:
            diff = differing(fa, fb)
            print("cuda without --deterministic: %d of %d tensors differ between two runs" % (len(diff), len(fa)))
            if os.environ.get("CT_EMU_DNN_NONDET") == "1":
                u.check(diff, "emulator with CT_EMU_DNN_NONDET: two runs without the flag are equal; the check is blind")
finally:
    u.cleanup(d)
u.finish()
