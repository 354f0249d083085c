"""`flashstable` command line: thin wrappers over the library (parse, call, say where results went)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys


def _accuracy(args):
  import jax
  import jax.numpy as jnp

  from jax_flashstable.accuracy import accuracy_report, format_report
  dtypes = [jnp.dtype(d) for d in args.dtypes.split(",")]
  rows = accuracy_report(dtypes=dtypes, seed=args.seed)
  table = format_report(rows)
  dev = jax.devices()[0]
  header = (f"# flash_attention vs FP64 golden\n\n{datetime.date.today()} · "
            f"{getattr(dev, 'device_kind', dev.platform)} · jax {jax.__version__} · seed {args.seed}\n\n"
            "Rule: error(flash) ≤ 2·error(standard attention, same dtype) + 1 bf16 ulp at the "
            "reference's scale, for max and mean.\n\n")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "accuracy.md"), "w") as f:
    f.write(header + table + "\n")
  with open(os.path.join(args.out, "accuracy.json"), "w") as f:
    json.dump(rows, f, indent=1)
  print(table)
  failed = [r for r in rows if not r["passes"]]
  print(f"\n{len(rows) - len(failed)}/{len(rows)} rows pass; report in {args.out}/accuracy.md")
  return 1 if failed else 0


def build_parser():
  ap = argparse.ArgumentParser(prog="flashstable", description="BF16 flash attention numerics, "
                               "visible and verifiable.")
  sub = ap.add_subparsers(dest="command", required=True)
  p = sub.add_parser("accuracy", help="flash_attention vs the FP64 golden value on a fixed sweep")
  p.add_argument("--dtypes", default="bfloat16", help="comma-separated, e.g. bfloat16,float16")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="runs/accuracy")
  p.set_defaults(func=_accuracy)
  return ap


def main(argv=None):
  args = build_parser().parse_args(argv)
  return args.func(args)


if __name__ == "__main__":
  sys.exit(main())
