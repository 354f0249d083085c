"""Issue 19, on a CPU: where the Mosaic GPU kernels' warps stall, read from Nsight Compute's
SASS source page (`experiments/h200_dq_probe.sh` writes it as sass.csv: `ncu --import
dq.ncu-rep --page source --print-source sass --csv`, the SourceCounters section's stall
samples per SASS instruction).

For each kernel in the file (in launch order): its stall samples and executed instructions,
the stall reasons' shares, the instructions with the most samples (address, samples,
executions, the three largest reasons) and the samples by windows of `--window` consecutive
instructions (the prologue, the loops over tiles, the epilogue and the producer's loop show
as separate windows; an instruction's executions tell a loop body from the once-a-warp code).

    python3 experiments/22_sass_stalls.py SASS_CSV [--top 14] [--window 60] \
      [--span KERNEL:START:END ...]

--span: also the samples of kernel KERNEL's instructions START to END − 1 (a loop's body, read
off the windows) by opcode: each opcode's samples, share, count of instructions and its three
largest reasons, so that one instruction class's part of a loop's time can be read.
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


def opcode(source: str) -> str:
  """The opcode of a SASS line, without its predicate and modifiers ("@!P1 BRA …" → BRA)."""
  words = source.split()
  if words and words[0].startswith("@"):
    words = words[1:]
  return words[0].split(".")[0] if words else "?"


def by_opcode(header, rows, start: int, end: int) -> str:
  """The samples of rows[start:end] by opcode (`--span`)."""
  col = {h: i for i, h in enumerate(header)}
  count = lambda r, h: int(r[col[h]] or 0)  # noqa: E731
  reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
  samples, n, why = collections.Counter(), collections.Counter(), {}
  for r in rows[start:end]:
    op = opcode(r[col["Source"]])
    samples[op] += count(r, SAMPLES)
    n[op] += 1
    why.setdefault(op, collections.Counter()).update({h[6:]: count(r, h) for h in reasons})
  total = sum(samples.values())
  lines = [f"  instructions [{start}, {end}): {total} samples, by opcode (samples, share, count):"]
  for op, s in samples.most_common():
    top3 = [(k, v) for k, v in why[op].most_common(3) if v]
    lines.append(f"    {op:10s} {s:6d} {s / max(total, 1):6.1%} {n[op]:5d}  {top3}")
  return "\n".join(lines)


def parse_span(text: str) -> tuple[int, int, int]:
  """KERNEL:START:END → three ints, START < END (argparse type; argparse.ArgumentTypeError
  naming it)."""
  parts = text.split(":")
  if len(parts) != 3 or not all(x.isdecimal() for x in parts) or int(parts[1]) >= int(parts[2]):
    raise argparse.ArgumentTypeError(f"--span {text!r}: KERNEL:START:END, integers, START < END")
  return int(parts[0]), int(parts[1]), int(parts[2])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("sass_csv", type=pathlib.Path)
  ap.add_argument("--top", type=int, default=14)
  ap.add_argument("--window", type=int, default=60)
  ap.add_argument("--span", type=parse_span, action="append", default=[], metavar="K:START:END")
  a = ap.parse_args()
  if not a.sass_csv.is_file():
    raise SystemExit(f"{a.sass_csv}: no such file")
  if a.top < 1 or a.window < 1:
    raise SystemExit(f"--top {a.top} / --window {a.window}: counts of at least 1")
  found = kernels(a.sass_csv)
  if not found:
    raise SystemExit(f"{a.sass_csv}: no kernel in it (not an ncu source-page CSV?)")
  for kernel, start, end in a.span:
    if kernel >= len(found) or end > len(found[kernel][1]):
      sizes = ", ".join(f"{k}: {len(rows)}" for k, (_, rows) in enumerate(found))
      raise SystemExit(
        f"--span {kernel}:{start}:{end}: the file's kernels (instructions) are {sizes}"
      )
  for k, (header, rows) in enumerate(found):
    if "Source" not in header or SAMPLES not in header:
      raise SystemExit(f"{a.sass_csv}: kernel {k} has no SASS stall samples (SourceCounters)")
    print(f"## kernel {k}: " + report(header, rows, a.top, a.window))
    for kernel, start, end in a.span:
      if kernel == k:
        print(by_opcode(header, rows, start, end))


if __name__ == "__main__":
  main()
