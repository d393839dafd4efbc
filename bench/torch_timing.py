"""Timing of a PyTorch training step for the cpu benchmarks (torch_train.py,
recompute_torch.py): `warmup` untimed steps, then `steps` timed ones; the
wall-clock median and the median cpu time per thread (an uncontended
estimate on a shared machine), the peak RSS and the 1-minute load."""
import resource
import statistics
import time


def time_steps(step, warmup, steps, threads):
    """Runs step() warmup + steps times; returns (wall times, median wall,
    median cpu/threads, last loss)."""
    for _ in range(warmup):
        step()
    ts, cs, loss = [], [], None
    for _ in range(steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        loss = step()
        ts.append(time.perf_counter() - t0)
        cs.append((time.process_time() - c0) / threads)
    return ts, statistics.median(ts), statistics.median(cs), loss


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])
