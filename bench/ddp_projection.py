"""DDP step time and scaling from per-layer backward times and a ring
all-reduce cost model; checked against bench_ddp's 2-rank CPU measurement.

Inputs
  --cpu JSON...   bench_ddp --json files: the model's parameters (state
                  order, place in the gradient buffer), the backward's
                  grads_ready calls (which gradients each one makes final,
                  and when, on this CPU), the measured variants (compute
                  alone, DDP, communication alone) and the all-reduce sweep.
  --gpu-profile   a bench_train --profile log of a GPU run (per-layer
                  forward/backward medians between device syncs), e.g.
                  bench/results/2026-11-22-h100-6-profile.md.
  --gpu-img-s     the trainer's measured img/s for each model on that GPU
                  (the per-layer times include a sync each, so their sum is
                  not the step; they give the backward's shape).

The model (DESIGN.md, "Multi-device training")
  buckets    ddp.c's rule: parameters in reverse state order, greedily; a
             bucket closes once it holds its cap (the first 1 MB, the
             others 25 MB); it sends its slice of the gradient buffer
             (alignment gaps included).
  ready      a bucket's all-reduce may start when the backward has made its
             last gradient final (the grads_ready call covering it).
  cost       ring all-reduce of B bytes on N ranks:
             t = 2(N-1)·alpha + 2(N-1)/N · B / BW  (BW: bus bandwidth).
  link       buckets run one at a time, in order: start = max(ready, the
             previous bucket's end).
  step       T(N) = (step - backward) + max(end of backward, end of the last
             bucket); T(1) has no communication. Weak scaling (the per-GPU
             batch fixed): efficiency = T(1) / T(N).

numpy only (json and argparse from the standard library).
"""
import argparse
import json
import re
import sys

import numpy as np


def buckets_of(params, first_mb, mb):
    """ddp.c's buckets: list of dicts lo, hi (elements), total, names."""
    out = []
    for p in reversed(params):
        cap = (first_mb if len(out) <= 1 else mb) * 1e6 / 4
        if not out or out[-1]["total"] >= cap:
            out.append({"lo": p["first"], "hi": p["first"] + p["count"], "total": 0, "names": []})
        b = out[-1]
        b["lo"] = min(b["lo"], p["first"])
        b["hi"] = max(b["hi"], p["first"] + p["count"])
        b["total"] += p["count"]
        b["names"].append(p["name"])
    for b in out:
        b["bytes"] = 4 * (b["hi"] - b["lo"])
    return out


def ready_times(params, events, buckets, t_event):
    """When each bucket's last gradient is final: the latest t_event of the
    grads_ready calls covering its parameters."""
    pos = {p["name"]: p for p in params}
    out = []
    for b in buckets:
        t = 0.0
        for n in b["names"]:
            p = pos[n]
            hit = [i for i, e in enumerate(events) if e["first"] <= p["first"] < e["first"] + e["count"]]
            if not hit:
                sys.exit("ddp_projection: no grads_ready call covers %s" % n)
            t = max(t, t_event[hit[0]])
        out.append(t)
    return np.array(out)


def ring_ms(nbytes, n, alpha_us, bw_gbs):
    """Ring all-reduce of nbytes over n ranks, ms."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha_us * 1e-3 + 2 * (n - 1) / n * nbytes / (bw_gbs * 1e9) * 1e3


def schedule(ready, costs):
    """Buckets one at a time on the link, each no earlier than it is ready;
    returns the end of the last one (ms since the backward's start)."""
    t = 0.0
    for r, c in zip(ready, costs):
        t = max(t, r) + c
    return t


def fit_alpha_bw(sweep, n):
    """alpha from the smallest message (t = 2(N-1)alpha there), BW from a
    least-squares line through that intercept over the larger ones, in
    absolute time: the large messages, where the time goes, set it."""
    sw = sorted(sweep, key=lambda s: s["bytes"])
    a = sw[0]["ms"] * 1e-3
    x = np.array([s["bytes"] for s in sw[1:]], float)
    t = np.array([s["ms"] for s in sw[1:]], float) * 1e-3
    b = float(np.dot(x, t - a) / np.dot(x, x))
    alpha_us = a / (2 * (n - 1)) * 1e6
    bw = 2 * (n - 1) / n / b / 1e9
    resid = [(s["bytes"], s["ms"], (a + b * s["bytes"]) * 1e3) for s in sw]
    return alpha_us, bw, resid


def mb(x):
    return x / 1e6


def cpu_section(d):
    """The measurement, the fit and the check, for one bench_ddp JSON."""
    v = d["variants"]
    comp, ddp, comm = v["compute"]["step"], v["ddp"]["step"], v["comm"]["step"]
    exposed, hook = v["ddp"]["wait"], v["ddp"]["hook"]
    name = "%s %dx%dx%d, batch %d per rank" % (d["model"], *d["input"], d["batch"])
    row = {
        "name": name, "compute": comp, "ddp": ddp, "comm": comm, "exposed": exposed, "hook": hook,
        "hidden": 1 - exposed / comm if comm > 0 and d["world"] > 1 else float("nan"),
        "paired": d.get("paired", {}),
        "grad_mb": mb(sum(4 * e["count"] for e in d["events"])),
        "buckets": d["ddp_buckets"],
    }
    if d["world"] < 2:
        return row, None
    n = d["world"]
    bs = buckets_of(d["params"], d["first_bucket_mb"], d["bucket_mb"])
    if len(bs) != d["ddp_buckets"]:
        sys.exit("ddp_projection: %d buckets by the rule, ct_ddp made %d" % (len(bs), d["ddp_buckets"]))
    # Fitted over the sizes this model sends: the sweep's points up to twice
    # its largest bucket (at least two), since the cost per byte of shared
    # memory grows with the message (caches) and a line fits one range.
    big = max(b["bytes"] for b in bs)
    sw = sorted(d["sweep"], key=lambda s: s["bytes"])
    pts = [s for s in sw if s["bytes"] <= 2 * big]
    if len(pts) < 2:
        pts = sw[:2]
    if len(sw) < 2:
        sys.exit("ddp_projection: the fit needs a sweep of two sizes or more")
    alpha_us, bw, resid = fit_alpha_bw(pts, n)
    # The timeline's hook times, stretched to the compute-alone backward
    # (the same work; their difference is this VM's noise).
    t_bwd = v["compute"]["backward"]
    scale = t_bwd / v["timeline"]["backward"]
    t_ev = np.array([e["t_ms"] for e in d["events"]]) * scale
    ready = ready_times(d["params"], d["events"], bs, t_ev)
    costs = np.array([ring_ms(b["bytes"], n, alpha_us, bw) for b in bs])
    end = schedule(ready, costs)
    rest = comp - t_bwd
    pred_overlap = rest + max(t_bwd, end)
    pred_serial = comp + costs.sum()
    chk = {
        "name": name, "alpha_us": alpha_us, "bw": bw, "resid": resid, "buckets": bs, "ready": ready, "costs": costs,
        "comm_pred": costs.sum(), "comm_meas": comm, "overlap": pred_overlap, "serial": pred_serial, "meas": ddp,
        "end": end, "bwd": t_bwd, "scale": scale, "comp": comp,
        "extra_meas": d.get("paired", {}).get("ddp_minus_compute", ddp - comp),
        "noise": d.get("paired", {}).get("noise", float("nan")),
    }
    return row, chk


def parse_profile(path):
    """Per model: layer names with forward/backward ms, and the run's
    parameters+gradients MB, from a bench_train --profile log."""
    res, cur, in_table = {}, None, False
    head = re.compile(r"^## (\S+) (\S+) batch (\d+): ctrain ([^,\s]+)")
    line_re = re.compile(r"^\s+(\d+)\s+(\S+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)")
    with open(path) as f:
        for ln in f:
            m = head.match(ln)
            if m:
                cur = {"model": m.group(1), "input": m.group(2), "batch": int(m.group(3)), "precision": m.group(4),
                       "layers": [], "state_mb": None}
                res[m.group(1)] = cur
                in_table = False
                continue
            if cur is None:
                continue
            m = re.search(r"parameters\+gradients ([\d.]+) MB", ln)
            if m and cur["state_mb"] is None:
                cur["state_mb"] = float(m.group(1))
            if ln.startswith("per-layer medians") and not cur["layers"]:
                in_table = True
                continue
            if in_table:
                if ln.strip().startswith("sum"):
                    in_table = False
                    continue
                m = line_re.match(ln)
                if m:
                    cur["layers"].append({"i": int(m.group(1)), "kind": m.group(2), "name": m.group(3),
                                          "fwd": float(m.group(4)), "bwd": float(m.group(5))})
    return res


LINKS = [
    # name, alpha (us per ring step), bus bandwidth (GB/s per GPU): assumptions, see --help
    ("NVLink (H100 NVLink4)", 3.0, 360.0),
    ("400 Gb/s", 10.0, 50.0),
    ("100 Gb/s", 10.0, 12.5),
]


def gpu_section(prof, d, img_s, ns, links):
    """Projection of one model from its GPU profile, its parameters and
    grads_ready calls (from the CPU JSON) and the trainer's img/s."""
    layers = prof["layers"]
    fwd = sum(l["fwd"] for l in layers)
    bwd = sum(l["bwd"] for l in layers)
    step = prof["batch"] / img_s * 1e3
    # The per-layer times each include a launch and a device sync; their
    # sum is not the step. Assumed: the backward's share of the step is
    # its share of the per-layer sums, spread over layers as they are.
    t_bwd = step * bwd / (fwd + bwd)
    k = t_bwd / bwd
    by_name = {l["name"]: l for l in layers}
    cum, t_ev = 0.0, []
    # Backward order: a layer's grads_ready fires after its own backward.
    order = sorted(layers, key=lambda l: -l["i"])
    done = {}
    for l in order:
        cum += l["bwd"] * k
        done[l["name"]] = cum
    for e in d["events"]:
        if e["name"] not in by_name:
            sys.exit("ddp_projection: layer %s of the CPU run is not in the GPU profile" % e["name"])
        t_ev.append(done[e["name"]])
    t_ev = np.array(t_ev)
    bs = buckets_of(d["params"], d["first_bucket_mb"], d["bucket_mb"])
    ready = ready_times(d["params"], d["events"], bs, t_ev)
    grad_bytes = sum(b["bytes"] for b in bs)
    state_mb = 2 * sum(4 * p["count"] for p in d["params"]) / 1048576
    rows = []
    for lname, alpha, bw in links:
        for n in ns:
            costs = np.array([ring_ms(b["bytes"], n, alpha, bw) for b in bs])
            end = schedule(ready, costs)
            tn = step - t_bwd + max(t_bwd, end)
            rows.append({"link": lname, "n": n, "step": tn, "eff": step / tn, "comm": costs.sum(),
                         "exposed": max(0.0, end - t_bwd), "eff0": step / (step + costs.sum())})
    info = {"step": step, "t_bwd": t_bwd, "fwd_sum": fwd, "bwd_sum": bwd, "k": k, "buckets": bs, "ready": ready,
            "grad_mb": mb(grad_bytes), "state_mb_json": state_mb, "state_mb_prof": prof["state_mb"]}
    return info, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", nargs="+", required=True, help="bench_ddp --json files")
    ap.add_argument("--gpu-profile", help="bench_train --profile log of a GPU run")
    ap.add_argument("--gpu-img-s", nargs="*", default=[],
                    help="MODEL=IMG_S: the trainer's measured img/s on that GPU at the profile's batch")
    ap.add_argument("--gpu-name", default="H100")
    ap.add_argument("--n", default="2,4,8,16,32,64", help="GPU counts")
    ap.add_argument("--link", action="append", default=[],
                    help="NAME:ALPHA_US:BW_GBS (replaces the default links when given)")
    a = ap.parse_args()
    datas = [json.load(open(p)) for p in a.cpu]
    ns = [int(x) for x in a.n.split(",")]
    links = LINKS
    if a.link:
        links = [(s.split(":")[0], float(s.split(":")[1]), float(s.split(":")[2])) for s in a.link]

    rows, checks = [], []
    for d in datas:
        r, c = cpu_section(d)
        rows.append(r)
        if c:
            checks.append(c)
    w = datas[0]["world"]
    print("## Measured on this machine (%d rank(s), %d thread each)\n" % (w, datas[0]["threads"]))
    print("Medians in ms. compute: the step with no hooks (per step the slower rank). ddp: the step with "
          "ct_ddp's hooks. comm alone: DDP's hooks driven with no backward (the same buckets). exposed: "
          "ct_ddp_get_stats wait_seconds per step (the rank that waited least). in hooks: time inside DDP's "
          "grads_ready during the backward (starting and driving the all-reduces). hidden = 1 - exposed / comm "
          "alone. The last three are paired by round (each round's variants ran within seconds; the median over "
          "rounds of the round's difference): ddp - compute, effective = 1 - (ddp - compute) / comm alone, what "
          "the step actually saved (± noise / comm alone), and the noise, |timeline - compute|, the same work measured "
          "twice.\n")
    print("| model | grads MB | buckets | compute | ddp | comm alone | exposed | in hooks | hidden "
          "| ddp - compute | effective | noise |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        pr = r["paired"]
        below = pr and r["comm"] < pr["noise"]
        if np.isnan(r["hidden"]):
            pr, below = {}, False  # one rank: nothing was sent
        eff = "n/a (comm below the noise)" if below else (
            "%.2f ± %.2f" % (pr["effective"], pr["noise"] / r["comm"]) if pr else "")
        print("| %s | %.1f | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %s | %s | %s |" % (
            r["name"], r["grad_mb"], r["buckets"], r["compute"], r["ddp"], r["comm"], r["exposed"], r["hook"],
            r["hidden"], "%.1f" % pr["ddp_minus_compute"] if pr else "", eff, "%.1f" % pr["noise"] if pr else ""))
    print()

    if checks:
        print("## The model against the 2-rank CPU run\n")
        print("alpha and BW fitted per run to its blocking all-reduce sweep (t = 2(N-1)alpha + 2(N-1)/N bytes/BW, N = 2, "
              "alpha from the smallest size, BW from a least-squares line through it over the larger sizes up to twice the "
              "run's largest bucket):\n")
        print("| run | alpha (us) | BW (GB/s) | sweep: bytes, measured ms, fitted ms |")
        print("| --- | ---: | ---: | --- |")
        for c in checks:
            sw = "; ".join("%s: %.3f / %.3f" % (fmt_bytes(b), m, f) for b, m, f in c["resid"])
            print("| %s | %.1f | %.3f | %s |" % (c["name"], c["alpha_us"], c["bw"], sw))
        print()
        print("Predicted from the compute-alone run's phases and the timeline's grads_ready times (scaled to the "
              "compute-alone backward) with the fitted alpha and BW. *overlap*: the projection's model "
              "(communication progresses on its own, beside the backward; what it adds is the last bucket's end "
              "past the backward's); *serial*: communication adds to compute (one core per rank both computes "
              "and copies). The step's cost of DDP, ddp - compute, is compared paired by round (above).\n")
        print("| run | comm alone: predicted / measured | ddp - compute: overlap model | serial model | measured "
              "| ddp step: overlap model | serial model | measured |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for c in checks:
            print("| %s | %.1f / %.1f | %.1f | %.1f | %.1f (noise %.1f) | %.1f | %.1f | %.1f |" % (
                c["name"], c["comm_pred"], c["comm_meas"], c["overlap"] - c["comp"], c["serial"] - c["comp"],
                c["extra_meas"], c["noise"], c["overlap"], c["serial"], c["meas"]))
        print()
        for c in checks:
            eo, es = c["overlap"] - c["comp"], c["serial"] - c["comp"]
            if abs(es - eo) < c["noise"]:
                verdict = "the two models differ by less than the noise: this run cannot tell them apart"
            else:
                # 0: as the overlap model, 1: as the serial one
                f = (c["extra_meas"] - eo) / (es - eo)
                verdict = "%.2f ± %.2f of the way from the overlap model (0) to the serial one (1)" % (
                    f, c["noise"] / abs(es - eo))
            print("- %s: measured ddp - compute %.1f ms against %.1f (overlap) and %.1f (serial): %s." % (
                c["name"], c["extra_meas"], eo, es, verdict))
        print()
        for c in checks:
            print("Buckets of %s (ready: ms after the backward's start, which ends at %.1f; cost: fitted ring "
                  "time):\n" % (c["name"], c["bwd"]))
            print("| bucket | MB sent | parameters | ready | cost |")
            print("| ---: | ---: | --- | ---: | ---: |")
            for i, b in enumerate(c["buckets"]):
                names = b["names"][0] if len(b["names"]) == 1 else "%s .. %s (%d)" % (b["names"][0], b["names"][-1],
                                                                                    len(b["names"]))
                print("| %d | %.2f | %s | %.1f | %.1f |" % (i, mb(b["bytes"]), names, c["ready"][i], c["costs"][i]))
            print()

    if not a.gpu_profile:
        return
    prof = parse_profile(a.gpu_profile)
    img = {}
    for s in a.gpu_img_s:
        k, v = s.split("=")
        img[k] = float(v)
    print("## Projection to %s machines (weak scaling: the per-GPU batch fixed)\n" % a.gpu_name)
    print("Links (assumptions, not measurements):\n")
    print("| link | alpha per ring step (us) | bus bandwidth per GPU (GB/s) |")
    print("| --- | ---: | ---: |")
    for lname, alpha, bw in links:
        print("| %s | %g | %g |" % (lname, alpha, bw))
    print()
    for d in datas:
        m = d["model"]
        if m not in prof or m not in img:
            continue
        p = prof[m]
        info, prow = gpu_section(p, d, img[m], ns, links)
        print("### %s %s, batch %d per GPU, %s\n" % (m, p["input"], p["batch"], p["precision"]))
        print("- one-GPU step %.2f ms (the trainer's %.0f img/s); per-layer sums in the profile: forward %.2f, "
              "backward %.2f ms; backward taken as %.2f ms (its share of the sums, x%.3f per layer), the rest "
              "(forward, loss, optimizer) %.2f ms." % (info["step"], img[m], info["fwd_sum"], info["bwd_sum"],
                                                         info["t_bwd"], info["k"], info["step"] - info["t_bwd"]))
        print("- fp32 gradients, %.1f MB sent per step in %d buckets; parameters+gradients %.1f MB by this run's "
              "parameters, %.1f MB in the profile." % (info["grad_mb"], len(info["buckets"]), info["state_mb_json"],
                                                       info["state_mb_prof"] or float("nan")))
        print("- buckets (MB, ready ms): " + ", ".join("%.1f @ %.2f" % (mb(b["bytes"]), r)
                                                      for b, r in zip(info["buckets"], info["ready"])))
        print()
        print("| GPUs | link | communication alone (ms) | exposed (ms) | hidden | step (ms) | efficiency T(1)/T(N) "
              "| efficiency without overlap |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for l in links:
            for n in ns:
                r = [x for x in prow if x["link"] == l[0] and x["n"] == n][0]
                print("| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                    n, l[0], r["comm"], r["exposed"], 1 - r["exposed"] / r["comm"], r["step"], r["eff"], r["eff0"]))
        print()
        print("Without overlap: the same communication after the backward (step + communication alone).")
        print()


def fmt_bytes(b):
    if b >= 1e6:
        return "%gMB" % (b / 1e6)
    if b >= 1024:
        return "%gKiB" % (b / 1024)
    return "%dB" % b


if __name__ == "__main__":
    main()
