#!/usr/bin/env python3
"""Cuts each ping-pong leg of a diagnostic run at the engine's %globaltimer stamps.

Usage: timeline.py RUN_DIR [KIND...] after `tar xJf RUN_DIR/logs.tar.xz -C RUN_DIR`.
Each KIND has pp_KIND.<n> (the ranks' records: s0,d0,seen0,s1,d1,seen1) and eng_KIND.<n> (one line per
engine turn with work: t0 before the turn's PCIe reads, t1 once HEAD was read, tf (run1: after the
system-scope fence that followed; run4: 1 when the slots were read again after HEAD), tl once the first
command's words were in registers, c0..c3 after each command, t3 before DONE's fence, t4 after it, the
turn's first command index and count, and the first four commands' op words). A leg runs from the
sender's doorbell (d0 or d1) to the receiver seeing its semaphore (seen1 or seen0); legs served by one
engine turn are cut, medians printed in microseconds.
"""
import bisect, csv, glob, os, sys


def load(p):
    with open(p) as f:
        return [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]


def med(v):
    v = sorted(v)
    return v[len(v) // 2] / 1000 if v else float("nan")


run = sys.argv[1]
kinds = sys.argv[2:] or sorted({os.path.basename(p)[4:].split(".")[0] for p in glob.glob(f"{run}/eng_*")})
for kind in kinds:
    pp = load([g for g in glob.glob(f"{run}/pp_{kind}.*") if not g.endswith(".txt")][0])
    eng = sorted(load(glob.glob(f"{run}/eng_{kind}.*")[0]), key=lambda e: e["t1"])
    t1s = [e["t1"] for e in eng]
    for name, (sent, seen) in {"to rank 1": ("d0", "seen1"), "back": ("d1", "seen0")}.items():
        cut = {k: [] for k in ["doorbell->t0", "t0->t1", "t1->tl", "c0", "c1", "t3->t4", "seen-c0", "leg"]}
        one = 0
        for r in pp[-1000:]:
            i, j = bisect.bisect_left(t1s, r[sent]), bisect.bisect_right(t1s, r[seen])
            if j - i != 1:
                continue
            e = eng[i]
            one += 1
            cut["doorbell->t0"].append(e["t0"] - r[sent])
            cut["t0->t1"].append(e["t1"] - e["t0"])
            cut["t1->tl"].append(e["tl"] - e["t1"])
            cut["c0"].append(e["c0"] - e["tl"])
            cut["c1"].append(e["c1"] - e["c0"])
            cut["t3->t4"].append(e["t4"] - e["t3"])
            cut["seen-c0"].append(r[seen] - e["c0"])
            cut["leg"].append(r[seen] - r[sent])
        print(f"{kind} leg {name}: {one} of 1000 served by one turn; " + ", ".join(f"{k} {med(v):.2f}" for k, v in cut.items()))
