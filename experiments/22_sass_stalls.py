"""Issue 19, on a CPU: where the Mosaic GPU kernels' warps stall, read from Nsight Compute's
SASS source page (`experiments/h200_dq_probe.sh` writes it as sass.csv: `ncu --import
dq.ncu-rep --page source --print-source sass --csv`, the SourceCounters section's stall
samples per SASS instruction).

For each kernel in the file (in launch order): its stall samples and executed instructions,
the stall reasons' shares, the instructions with the most samples (address, samples,
executions, the three largest reasons) and the samples by windows of `--window` consecutive
instructions (the prologue, the loops over tiles, the epilogue and the producer's loop show
as separate windows; an instruction's executions tell a loop body from the once-a-warp code).

    python3 experiments/22_sass_stalls.py SASS_CSV [--top 14] [--window 60]
"""

from __future__ import annotations

import argparse
import collections
import csv
import lzma
import pathlib

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(path: pathlib.Path):
  """[(header, rows)] per kernel of an ncu source-page CSV (plain or .xz)."""
  opener = lzma.open if path.suffix == ".xz" else open
  with opener(path, "rt", newline="") as f:
    rows = list(csv.reader(f))
  starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] + [len(rows)]
  out = []
  for a, b in zip(starts, starts[1:]):
    header = rows[a + 1]
    out.append((header, [r for r in rows[a + 2 : b] if len(r) == len(header)]))
  return out


def report(header, rows, top: int, window: int) -> str:
  col = {h: i for i, h in enumerate(header)}
  count = lambda r, h: int(r[col[h]] or 0)  # noqa: E731
  reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
  samples = sum(count(r, SAMPLES) for r in rows)
  executed = sum(count(r, EXECUTED) for r in rows)
  by_reason = collections.Counter({h[6:]: sum(count(r, h) for r in rows) for h in reasons})
  lines = [
    f"{len(rows)} SASS instructions, {samples} stall samples, {executed} instructions executed",
    "  reasons: "
    + ", ".join(f"{k} {v / max(samples, 1):.1%}" for k, v in by_reason.most_common(8) if v),
    "  most sampled instructions (index, address, samples, executions, reasons):",
  ]
  for i in sorted(range(len(rows)), key=lambda i: -count(rows[i], SAMPLES))[:top]:
    r = rows[i]
    why = sorted(((h[6:], count(r, h)) for h in reasons if count(r, h)), key=lambda x: -x[1])
    lines.append(
      f"    {i:5d} {r[col['Address']][-5:]} {count(r, SAMPLES):6d} {count(r, EXECUTED):8d}  "
      f"{r[col['Source']].strip()[:56]:56s} {why[:3]}"
    )
  lines.append(f"  samples by windows of {window} instructions (share, most executions in it):")
  for w in range(0, len(rows), window):
    part = rows[w : w + window]
    s = sum(count(r, SAMPLES) for r in part)
    if s:
      most = max(count(r, EXECUTED) for r in part)
      lines.append(f"    [{w:5d}, {w + window:5d})  {s:6d}  {s / samples:6.1%}  {most}")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("sass_csv", type=pathlib.Path)
  ap.add_argument("--top", type=int, default=14)
  ap.add_argument("--window", type=int, default=60)
  a = ap.parse_args()
  if not a.sass_csv.is_file():
    raise SystemExit(f"{a.sass_csv}: no such file")
  if a.top < 1 or a.window < 1:
    raise SystemExit(f"--top {a.top} / --window {a.window}: counts of at least 1")
  found = kernels(a.sass_csv)
  if not found:
    raise SystemExit(f"{a.sass_csv}: no kernel in it (not an ncu source-page CSV?)")
  for k, (header, rows) in enumerate(found):
    if "Source" not in header or SAMPLES not in header:
      raise SystemExit(f"{a.sass_csv}: kernel {k} has no SASS stall samples (SourceCounters)")
    print(f"## kernel {k}: " + report(header, rows, a.top, a.window))


if __name__ == "__main__":
  main()
