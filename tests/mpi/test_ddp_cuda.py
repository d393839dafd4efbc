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
- ZeRO-1 (--zero 1: each bucket reduced to the ranks owning its parts,
  each rank's shard of the optimizer state on its GPU updating its
  shard, the weights gathered back, the shards' gradient statistics
  summed on the devices): the same bits as plain DDP for the mlp on 2
  ranks; with clipping (the norm summed over the shards) within 1e-6 of
  plain DDP, and with uneven shards over 4 ranks (4 GPUs, or emulated;
  NCCL's reduce and all-reduce may sum in other orders) within 1e-6 too;
  under fp16 the scaler's skips agree; the banner shows each rank's
  share of the state; and a ZeRO checkpoint (the whole state, gathered
  from the GPUs) resumes without --zero to the uninterrupted run's bits.
  Rank 0's device peak falls by half of Adam's state (--metrics-json).
- A run repeats bit for bit; --check-sync compares the weights on the
  ranks every few steps (copied back from the devices).
- --cuda-graph: the step, its NCCL calls included, is captured after the
  warm-up steps and replayed, with the eager run's bits, plain and under
  ZeRO-1 (the emulator records a collective in a capture between
  processes and communicates at each replay).
- SyncBatchNorm (--sync-bn) on a batch-norm model trains as one GPU does
  (within 1e-4; without it the weights drift further).
- ZeRO-2 (--zero 2: no whole gradient buffer; each bucket written into
  one of two slots and reduce-scattered from there into the shard's
  gradients, the backward waiting on the device for a slot's previous
  collective: the emulator fails a run that writes a slot before that),
  on a model of six equal layers cut into six buckets so
  the slots are reused: the same bits as --zero 1, eagerly and captured
  in a CUDA graph, under fp16 with clipping (the scaler's skips and the
  norm from the shard), over 4 ranks (uneven shards), and resumed
  without --zero from its checkpoint. Rank 0's device peak falls by
  exactly the gradient bytes it no longer holds (--metrics-json).
  Accumulation is refused naming --zero 1; where the slots would hold no
  less (the mlp: one weight is 75% of it) the gradients stay whole, and
  the banner says so.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_util as mu  # noqa: E402
from mpi_util import u  # noqa: E402


def main():
    u.need_binary()
    u.need_module("st_util")
    mu.need_mpi_build()
    u.need_gpus(2)
    import numpy as np
    d = u.tmpdir("ddp_cuda")
    try:
        u.write_idx_dataset(os.path.join(d, "data"), np.random.default_rng(0), n_train=128, n_test=32, h=28, w=28)
        data = ["--data", "mnist:" + os.path.join(d, "data"), "--device", "cuda", "--deterministic"]
        equivalence(d, data)
        zero(d, data)
        zero2(d)
        repeat_and_check(d, data)
    finally:
        u.cleanup(d)
    u.finish()


def two_ranks(args, what):
    mu.ddp_ok(2, args + ["--batch-size", "16"], what, timeout=600)


def equivalence(d, data):
    for name, args in u.GPU_PARALLEL_CASES:
        u.equals_one_device(d, name, args + data, two_ranks)
    u.sync_bn_equals_one_device(d, data, two_ranks)
    u.bf16_within_split(d, data, two_ranks)
    u.fp16_scaler_agrees(d, data, 8, two_ranks, timeout=600)


def zero(d, data):
    mlp = ["--model", "mlp", "--optimizer", "adam", "--lr", "0.001", "--batch-size", "16", "--epochs", "3",
           "--max-steps", "20"] + data + u.FAST
    clip = ["--model", "cnn", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--clip-grad-norm", "0.5",
            "--batch-size", "16", "--epochs", "3", "--max-steps", "20"] + data + u.FAST
    w = {}
    for tag, args, extra in (("mlp", mlp, []), ("mlp_zero", mlp, ["--zero", "1"]),
                             ("mlp_zero_graph", mlp, ["--zero", "1", "--cuda-graph"]), ("clip", clip, []),
                             ("clip_zero", clip, ["--zero", "1"])):
        p = os.path.join(d, "z_%s.safetensors" % tag)
        m = ["--metrics-json", os.path.join(d, "z_%s.json" % tag)]
        r = mu.ddp_ok(2, args + extra + m + ["--save", p], "ddp " + tag, timeout=600)
        w[tag] = u.weights(p) if os.path.exists(p) else None
        if extra:
            u.check("ZeRO-1: optimizer state" in r.stdout and "per rank" in r.stdout,
                    "--zero 1 on cuda: the banner does not show the per-rank state: %s" % r.stdout[:400])
        if "--cuda-graph" in extra:
            u.check("cuda graph: on" in r.stdout, "--zero 1 --cuda-graph: the step was not captured: %s"
                    % r.stdout[-400:])
    if all(w.values()):
        u.check(u.same_bits(w["mlp"], w["mlp_zero"]), "--zero 1 on GPUs changes the mlp's weights")
        u.check(u.same_bits(w["mlp"], w["mlp_zero_graph"]), "--zero 1 with --cuda-graph changes the mlp's weights")
        # Rank 0's GPU holds half of Adam's two state buffers: its device
        # peak falls by that much.
        n = sum(int(t.numel()) for t in w["mlp"].values())
        peak = [u.read_json(os.path.join(d, "z_%s.json" % t))["device_peak_bytes"] for t in ("mlp", "mlp_zero")]
        want = 2 * 4 * (n - n // 2)
        print("--zero 1 on GPUs: device peak %d -> %d bytes, %d saved, half of Adam's state %d" % (
            peak[0], peak[1], peak[0] - peak[1], want))
        u.check(abs(peak[0] - peak[1] - want) <= 0.01 * want, "--zero 1 on GPUs saves %d bytes of device memory, "
                "not half of Adam's state (%d)" % (peak[0] - peak[1], want))
        err = u.normwise(w["clip"], w["clip_zero"])
        print("--zero 1 with clipping on GPUs: %.3g from plain DDP" % err)
        u.check(err < 1e-6, "--zero 1 with clipping on GPUs differs from plain DDP by %.3g" % err)
    # Uneven shards: 535818 parameters over 4 ranks (4 GPUs, or emulated).
    env4 = dict(u.ENV, CT_EMU_DEVICES="4")
    r = subprocess.run([u.CTRAIN, "devices"], capture_output=True, text=True, timeout=120, env=env4)
    if len([ln for ln in r.stdout.splitlines() if ln.startswith("cuda:")]) >= 4:
        four = {}
        for tag, extra in (("plain", []), ("zero", ["--zero", "1"])):
            p = os.path.join(d, "z4_%s.safetensors" % tag)
            args = [a if a != "16" else "8" for a in mlp]
            mu.ddp_ok(4, args + extra + ["--save", p], "4 ranks " + tag, timeout=600, env=env4)
            four[tag] = u.weights(p) if os.path.exists(p) else None
        if all(four.values()):
            # Four ranks' sums take NCCL's order, which its reduce and its
            # all-reduce need not share: within rounding, not bit for bit.
            err = u.normwise(four["plain"], four["zero"])
            print("--zero 1 over 4 GPUs (uneven shards): %.3g from plain DDP" % err)
            u.check(err < 1e-6, "--zero 1 over 4 GPUs (uneven shards) differs from plain DDP by %.3g" % err)
    else:
        print("4 ranks with uneven shards: skipped (fewer than 4 GPUs)")

    def two_ranks_zero(args, what):
        mu.ddp_ok(2, args + ["--batch-size", "16", "--zero", "1"], what, timeout=600)
    u.fp16_scaler_agrees(d, data, 8, two_ranks_zero, timeout=600)
    # A ZeRO checkpoint gathered from the GPUs resumes without --zero.
    ck, out = os.path.join(d, "z_ck"), os.path.join(d, "z_resumed.safetensors")
    mu.ddp_ok(2, mlp + ["--checkpoint-dir", ck, "--max-steps", "12", "--zero", "1"], "zero, first part", timeout=600)
    mu.ddp_ok(2, [a for a in mlp] + ["--checkpoint-dir", ck, "--resume", "--save", out], "zero checkpoint resumed",
              timeout=600)
    if w["mlp"] and os.path.exists(out):
        u.check(u.same_bits(w["mlp"], u.weights(out)), "a --zero 1 checkpoint from GPUs resumed without it differs")


def repeat_and_check(d, data):
    args = ["--model", "mlp", "--batch-size", "16", "--epochs", "2", "--check-sync", "3"] + data + u.FAST
    a, b = os.path.join(d, "rep_a.safetensors"), os.path.join(d, "rep_b.safetensors")
    r = mu.ddp_ok(2, args + ["--save", a], "ddp run a", timeout=600)
    mu.ddp_ok(2, args + ["--save", b], "ddp run b", timeout=600)
    u.check(u.same_bits(u.weights(a), u.weights(b)), "DDP over GPUs does not repeat bit for bit")
    u.check("cuda:0" in r.stdout, "rank 0 did not train on cuda:0: %s" % r.stdout[-500:])
    g = os.path.join(d, "rep_graph.safetensors")
    r = mu.ddp_ok(2, args + ["--save", g, "--cuda-graph"], "ddp run with --cuda-graph", timeout=600)
    u.check("cuda graph: on" in r.stdout, "DDP --cuda-graph: the step was not captured: %s" % r.stdout[-400:])
    if os.path.exists(g):
        u.check(u.same_bits(u.weights(a), u.weights(g)), "DDP over GPUs with --cuda-graph differs from eager")


def zero2(d):
    import numpy as np
    data = os.path.join(d, "data8")
    u.write_idx_dataset(data, np.random.default_rng(1), n_train=128, n_test=32, h=8, w=8)
    # Six 64x64 layers: with 16 KB buckets each layer is a bucket of its
    # own, so the two slots are each taken three times a step.
    model = os.path.join(d, "deep.txt")
    with open(model, "w") as f:
        f.write("input 1x8x8\nflatten\n" + "linear 64 64\nrelu\n" * 6 + "linear 64 10\n")
    base = ["--model", model, "--optimizer", "adam", "--lr", "0.001", "--batch-size", "16", "--epochs", "2",
            "--max-steps", "12", "--bucket-mb", "0.016", "--data", "mnist:" + data, "--device", "cuda",
            "--deterministic"] + u.FAST
    fp16 = ["--precision", "fp16", "--loss-scale-init", "1099511627776", "--clip-grad-norm", "0.5"]
    env4 = dict(u.ENV, CT_EMU_DEVICES="4")
    r = subprocess.run([u.CTRAIN, "devices"], capture_output=True, text=True, timeout=120, env=env4)
    four = len([ln for ln in r.stdout.splitlines() if ln.startswith("cuda:")]) >= 4
    runs = [("z1", 2, ["--zero", "1"]), ("z2", 2, ["--zero", "2"]), ("z2_graph", 2, ["--zero", "2", "--cuda-graph"]),
            ("z1_fp16", 2, ["--zero", "1"] + fp16), ("z2_fp16", 2, ["--zero", "2"] + fp16)]
    if four:
        runs += [("z1_4", 4, ["--zero", "1", "--batch-size", "8"]), ("z2_4", 4, ["--zero", "2", "--batch-size", "8"])]
    else:
        print("ZeRO-2 over 4 ranks: skipped (fewer than 4 GPUs)")
    w, js = {}, {}
    for tag, n, extra in runs:
        p, m = os.path.join(d, "zz_%s.safetensors" % tag), os.path.join(d, "zz_%s.json" % tag)
        r = mu.ddp_ok(n, base + extra + ["--save", p, "--metrics-json", m], "ddp " + tag, timeout=600,
                      env=env4 if n == 4 else None)
        w[tag] = u.weights(p) if os.path.exists(p) else None
        js[tag] = u.read_json(m) if os.path.exists(m) else None
        if "2" in extra:
            u.check("gradients" in r.stdout and "(the shard and two bucket slots)" in r.stdout,
                    "--zero 2 on cuda: the banner does not show the gradient slots: %s" % r.stdout[:500])
        if "--cuda-graph" in extra:
            u.check("cuda graph: on" in r.stdout, "--zero 2 --cuda-graph: the step was not captured: %s"
                    % r.stdout[-400:])
    for a, b in (("z1", "z2"), ("z1", "z2_graph"), ("z1_fp16", "z2_fp16"), ("z1_4", "z2_4")):
        if a in w and w[a] and w[b]:
            u.check(u.same_bits(w[a], w[b]), "--zero 2 on GPUs (%s) differs from --zero 1 (%s)" % (b, a))
    if js["z1_fp16"] and js["z2_fp16"]:
        a, b = js["z1_fp16"], js["z2_fp16"]
        u.check(a["skipped_steps"] > 0 and (a["skipped_steps"], a["loss_scale"]) == (b["skipped_steps"], b["loss_scale"]),
                "fp16 --zero 2: %s steps skipped (scale %s), --zero 1 %s (scale %s)" % (
                    b["skipped_steps"], b["loss_scale"], a["skipped_steps"], a["loss_scale"]))
    if js["z1"] and js["z2"]:
        # The block gives up the whole buffer (256-byte aligned); the
        # slots and the shard are allocated instead.
        grads = [js[t]["gradient_bytes"] for t in ("z1", "z2")]
        peak = [js[t]["device_peak_bytes"] for t in ("z1", "z2")]
        print("--zero 2 on GPUs: gradients %d -> %d bytes, device peak %d -> %d" % (grads[0], grads[1], peak[0], peak[1]))
        want = (grads[0] + 255) // 256 * 256 - grads[1]
        u.check(grads[1] < grads[0] and peak[0] - peak[1] == want, "--zero 2 on GPUs: the device peak fell by %d "
                "bytes, the gradients by %d" % (peak[0] - peak[1], want))
    # A ZeRO-2 checkpoint resumes without --zero to --zero 1's bits.
    ck, out = os.path.join(d, "zz_ck"), os.path.join(d, "zz_resumed.safetensors")
    mu.ddp_ok(2, base + ["--checkpoint-dir", ck, "--max-steps", "6", "--zero", "2"], "zero 2, first part", timeout=600)
    mu.ddp_ok(2, base + ["--checkpoint-dir", ck, "--resume", "--save", out], "zero 2 checkpoint resumed", timeout=600)
    if w["z1"] and os.path.exists(out):
        u.check(u.same_bits(w["z1"], u.weights(out)), "a --zero 2 checkpoint from GPUs resumed without it differs")
    r = mu.ddp(2, base + ["--zero", "2", "--accumulate", "2"], timeout=600)
    u.check(r.returncode != 0 and "ZeRO-2" in r.stderr and "--zero 1" in r.stderr,
            "--zero 2 --accumulate 2 on cuda: exit %d, expected a refusal naming ZeRO-2: %s" % (
                r.returncode, r.stderr[-800:]))
    mlp = ["--model", "mlp", "--batch-size", "16", "--epochs", "1", "--max-steps", "2", "--data", "mnist:" + data,
           "--device", "cuda", "--zero", "2"] + u.FAST
    r = mu.ddp_ok(2, mlp, "zero 2 where slots would not save", timeout=600)
    u.check("gradients whole" in r.stdout, "--zero 2 on the mlp: the banner does not say the gradients stay "
            "whole: %s" % r.stdout[:500])


if __name__ == "__main__":
    main()
