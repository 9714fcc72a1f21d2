"""What the coordinates look like at the freeze: reads the files of
`obcomm-fmnist --dump-freeze P` (P.adam: the optimizer at the freeze, as
obcomm_adam_save writes it; P.p0 and P.p1: the parameters before and after
the first compressed step) and prints, per band of sqrt(v), how many
coordinates there are and how far the first compressed step moved them.

    deploy/train.sh --mode onebit --steps 3000 --out /tmp/r --tag nomask \\
        -- --mask off --dump-freeze /tmp/r/nomask
    .venv/bin/python client/python/examples/freeze_evidence.py /tmp/r/nomask
"""
import struct
import sys

import numpy as np

prefix = sys.argv[1]
raw = open(prefix + ".adam", "rb").read()
# The fields read here, at the offsets include/obcomm.h gives for
# obcomm_adam_save's file (version 3): header bytes, count, step, lr, eps.
if raw[:8] != b"OBCMADAM" or struct.unpack_from("<I", raw, 8)[0] != 3:
    sys.exit(f"{prefix}.adam: not an obcomm_adam_save file of version 3")
(hbytes,) = struct.unpack_from("<I", raw, 12)
n, step = struct.unpack_from("<Qq", raw, 16)
(lr,) = struct.unpack_from("<f", raw, 40)
(eps,) = struct.unpack_from("<f", raw, 52)
a = np.frombuffer(raw[hbytes:hbytes + 8 * n], dtype=np.float32)
m, v = a[:n], a[n:]
p0 = np.fromfile(prefix + ".p0", dtype=np.float32)
p1 = np.fromfile(prefix + ".p1", dtype=np.float32)
d, sv = np.abs(p1 - p0), np.sqrt(v)
print(f"step {step}, {n} coordinates, lr {lr:g}, eps {eps:g}; "
      f"RMS of m {np.sqrt(np.mean(m.astype(np.float64) ** 2)):.3g}, "
      f"sqrt(mean v) {np.sqrt(np.mean(v.astype(np.float64))):.3g}")
print("| sqrt(v) at the freeze | coordinates | move in the first compressed "
      "step (median / max) | median |weight| |")
print("| --- | ---: | --- | --- |")
bands = [(None, 0), (0, 1e-8), (1e-8, 1e-7), (1e-7, 1e-6), (1e-6, 1e-5),
         (1e-5, 1e-4), (1e-4, None)]
for lo, hi in bands:
    if lo is None:
        sel, name = sv == 0, "0"
    elif hi is None:
        sel, name = sv > lo, f"above {lo:g}"
    else:
        sel, name = (sv > lo) & (sv <= hi), f"({lo:g}, {hi:g}]"
    if sel.any():
        print(f"| {name} | {sel.sum()} | {np.median(d[sel]):.2g} / "
              f"{d[sel].max():.2g} | {np.median(np.abs(p0[sel])):.2g} |")
