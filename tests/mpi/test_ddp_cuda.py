"""DistributedDataParallel over GPUs (`ctrain train --strategy ddp --device
cuda`): NCCL's collectives on each device's collective stream, against
single-GPU training on the same global batch.

Needs two CUDA devices, one per rank (skipped otherwise). In `make test`
it runs on the CUDA emulator (tests/emu: CT_EMU_DEVICES=2, each rank a
process emulating one GPU, its NCCL over MPI), so the backend's own
collective code runs in CI; on a machine with two GPUs the plain build
runs it on the hardware.

- Equal to one device: 2 ranks with 16 samples each give the weights one
  GPU gives with batch 32 after 20 steps, within 1e-5: the mlp, the cnn
  with its dropout (masks keyed by the sample's number in the global
  batch), with clipping and accumulation. Under bf16 autocast the
  weight gradients are rounded per micro-batch on the GPU, so DDP is held
  to what one GPU moves when it accumulates the batch in two halves.
  Under fp16 the loss scaler skips the same steps and ends at the same
  scale.
- A run repeats bit for bit; --check-sync compares the weights on the
  ranks every few steps (copied back from the devices).
- What is not built for GPUs is refused at start, naming it: --zero 1
  and --sync-bn on cuda.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_util as mu  # noqa: E402
from mpi_util import u  # noqa: E402


def need_two_gpus():
    r = u.run(["devices"], timeout=120)
    gpus = [ln for ln in r.stdout.splitlines() if ln.startswith("cuda:")]
    if len(gpus) < 2:
        print("skip: DDP over GPUs needs two CUDA devices, one per rank; `ctrain devices` lists %d" % len(gpus))
        sys.exit(77)


def main():
    u.need_binary()
    u.need_module("st_util")
    mu.need_mpi_build()
    need_two_gpus()
    import numpy as np
    d = u.tmpdir("ddp_cuda")
    try:
        u.write_idx_dataset(os.path.join(d, "data"), np.random.default_rng(0), n_train=128, n_test=32, h=28, w=28)
        data = ["--data", "mnist:" + os.path.join(d, "data"), "--device", "cuda", "--deterministic"]
        equivalence(d, data)
        repeat_and_check(d, data)
        refused(d, data)
    finally:
        u.cleanup(d)
    u.finish()


def equivalence(d, data):
    cases = [
        ("mlp", ["--model", "mlp", "--optimizer", "adam", "--lr", "0.001"]),
        ("cnn", ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]),
        ("cnn_clip_acc", ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                          "--clip-grad-norm", "0.5", "--accumulate", "2"]),
    ]
    for name, args in cases:
        common = args + data + ["--epochs", "3", "--max-steps", "20"] + u.FAST
        one, two = os.path.join(d, name + "_1.safetensors"), os.path.join(d, name + "_2.safetensors")
        u.run_ok(["train"] + common + ["--batch-size", "32", "--save", one], name + " one GPU", timeout=600)
        mu.ddp_ok(2, common + ["--batch-size", "16", "--save", two], name + " ddp", timeout=600)
        if not (os.path.exists(one) and os.path.exists(two)):
            continue
        err = u.normwise(u.weights(one), u.weights(two))
        print("%s: one GPU vs 2-rank ddp after 20 steps: normwise %.3g" % (name, err))
        u.check(err < 1e-5, "%s: DDP over 2 GPUs differs from one GPU by %.3g (> 1e-5)" % (name, err))
    bf16(d, data)
    mu.fp16_scaler_agrees(d, data, 8, timeout=600)


def bf16(d, data):
    """Under bf16 autocast the GPU's weight gradients come out of cuBLASLt
    and cuDNN in bf16, rounded per micro-batch (as PyTorch's autocast rounds
    them), so any split of the global batch moves the result by that
    rounding: DDP must stay within 3x of what one GPU moves when it
    accumulates the same 32 samples in two halves of 16."""
    common = ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--precision", "bf16"] + \
        data + ["--epochs", "1", "--max-steps", "5"] + u.FAST
    one, acc, two = (os.path.join(d, "bf16_%s.safetensors" % k) for k in ("one", "acc", "ddp"))
    u.run_ok(["train"] + common + ["--batch-size", "32", "--save", one], "bf16 one GPU", timeout=600)
    u.run_ok(["train"] + common + ["--batch-size", "16", "--accumulate", "2", "--save", acc], "bf16 accumulate",
             timeout=600)
    mu.ddp_ok(2, common + ["--batch-size", "16", "--save", two], "bf16 ddp", timeout=600)
    if not all(os.path.exists(p) for p in (one, acc, two)):
        return
    w = u.weights(one)
    e_acc, e_ddp = u.normwise(w, u.weights(acc)), u.normwise(w, u.weights(two))
    print("bf16 after 5 steps: one GPU vs its accumulation of two halves %.3g, vs 2-rank ddp %.3g" % (e_acc, e_ddp))
    u.check(e_ddp <= 3 * e_acc and e_ddp < 1e-3, "bf16: DDP over 2 GPUs differs from one GPU by %.3g, one GPU's own "
            "split into two halves by %.3g" % (e_ddp, e_acc))


def repeat_and_check(d, data):
    args = ["--model", "mlp", "--batch-size", "16", "--epochs", "2", "--check-sync", "3"] + data + u.FAST
    a, b = os.path.join(d, "rep_a.safetensors"), os.path.join(d, "rep_b.safetensors")
    r = mu.ddp_ok(2, args + ["--save", a], "ddp run a", timeout=600)
    mu.ddp_ok(2, args + ["--save", b], "ddp run b", timeout=600)
    u.check(u.same_bits(u.weights(a), u.weights(b)), "DDP over GPUs does not repeat bit for bit")
    u.check("cuda:0" in r.stdout, "rank 0 did not train on cuda:0: %s" % r.stdout[-500:])


def refused(d, data):
    base = ["--model", "mlp", "--batch-size", "16", "--epochs", "1", "--max-steps", "2"] + data + u.FAST
    for extra, text in ((["--zero", "1"], "ZeRO"), (["--sync-bn"], "SyncBatchNorm")):
        r = mu.ddp(2, base + extra, timeout=600)
        u.check(r.returncode != 0 and text in r.stderr,
                "%s on cuda: exit %d, expected a refusal naming %s: %s" % (" ".join(extra), r.returncode, text,
                                                                           r.stderr[-800:]))


if __name__ == "__main__":
    main()
