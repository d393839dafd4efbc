"""The loader's order against PyTorch (tests/tools/sampler_dump):
ct_randperm must be torch.randperm(n, generator=Generator().manual_seed(s))
for n from 0 to past 2^16 and seeds beyond 32 bits; ct_sampler_indices must
be DistributedSampler(range(n), num_replicas, rank, shuffle, seed,
drop_last) after set_epoch(e), for every rank, with the pad (drop_last
False) and drop (True) tails, including more replicas than samples; and
the exact tail (evaluation) must be torch's order[rank:n:num_replicas],
which covers every sample exactly once over the ranks.
Exit 77 (skipped) without torch or the tool."""
import os
import subprocess
import sys

try:
    import torch
    from torch.utils.data import DistributedSampler
except ImportError:
    print("torch not available, skipped")
    sys.exit(77)

build = os.environ.get("CTRAIN_BUILD_DIR", "build")
tool = os.path.join(build, "tests", "sampler_dump")
if not os.path.exists(tool):
    print(f"{tool} not built, skipped")
    sys.exit(77)

PAD, DROP, EXACT = 0, 1, 2
SIZES = [1, 2, 7, 10, 101, 1000, 65539]
SEEDS = [0, 20240611]
EPOCHS = [0, 1, 2]
# (n, num_replicas) beyond 1..4 for every size: more replicas than samples.
EXTRA = [(3, 5), (2, 7)]


def torch_perm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


def torch_share(n, reps, rank, shuffle, seed, epoch, drop_last):
    s = DistributedSampler(range(n), num_replicas=reps, rank=rank, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s)


def exact_share(n, reps, rank, shuffle, seed, epoch):
    order = torch_perm(n, seed + epoch) if shuffle else list(range(n))
    return order[rank:n:reps]


queries, wants, names = [], [], []


def add(query, want, name):
    queries.append(query)
    wants.append(want)
    names.append(name)


perm_sizes = list(range(0, 34)) + [100, 255, 256, 257, 1000, 4097, 65535, 65536, 65537, 99991, 100000]
for n in perm_sizes:
    for seed in [0, 1, 42, 2**31 - 1, 2**32 - 1, 2**32 + 5, 2**63 + 11, 2**64 - 1]:
        add(f"perm {n} {seed}", torch_perm(n, seed), f"randperm({n}, seed {seed})")

configs = [(n, r) for n in SIZES for r in range(1, 5)] + EXTRA
exact_sets = []  # (name, first query index, ranks, n) for the coverage check
for n, reps in configs:
    for shuffle in (0, 1):
        for seed in SEEDS:
            for epoch in EPOCHS:
                what = f"n {n} replicas {reps} shuffle {shuffle} seed {seed} epoch {epoch}"
                for drop, tail in ((False, PAD), (True, DROP)):
                    for rank in range(reps):
                        add(f"share {n} {reps} {rank} {shuffle} {seed} {epoch} {tail}",
                            torch_share(n, reps, rank, bool(shuffle), seed, epoch, drop),
                            f"{what} drop_last {drop} rank {rank}")
                exact_sets.append((what, len(queries), reps, n))
                for rank in range(reps):
                    add(f"share {n} {reps} {rank} {shuffle} {seed} {epoch} {EXACT}",
                        exact_share(n, reps, rank, shuffle, seed, epoch), f"{what} exact rank {rank}")

r = subprocess.run([tool], input="\n".join(queries) + "\n", capture_output=True, text=True)
if r.returncode != 0:
    print(f"sampler_dump failed ({r.returncode}): {r.stderr}")
    sys.exit(1)
lines = r.stdout.split("\n")
if len(lines) != len(queries) + 1 or lines[-1] != "":
    print(f"sampler_dump answered {len(lines) - 1} lines for {len(queries)} queries")
    sys.exit(1)
got = [[int(v) for v in line.split()] if not line.startswith("error") else line for line in lines[:-1]]

failures = 0
for g, w, name in zip(got, wants, names):
    if g != w:
        failures += 1
        if failures <= 20:
            where = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w))) \
                if isinstance(g, list) else 0
            print(f"FAIL {name}: {len(g)} indices, torch {len(w)}; first difference at {where}")

# The exact tail: every sample exactly once over the ranks, and no rank
# more than one sample ahead of another.
for what, first, reps, n in exact_sets:
    shares = got[first:first + reps]
    seen = sorted(i for s in shares if isinstance(s, list) for i in s)
    sizes = [len(s) for s in shares]
    if seen != list(range(n)) or max(sizes) - min(sizes) > 1:
        failures += 1
        print(f"FAIL {what} exact: ranks hold {sizes}, union is not 0..{n - 1} once each")

print(f"{len(queries)} orders compared with torch {torch.__version__}, {len(exact_sets)} exact splits checked, "
      f"{failures} failures")
sys.exit(1 if failures else 0)
