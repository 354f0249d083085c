"""The finished runs of `experiment.pack_runs` files (those with a summary.json) put back under
OUT_DIR, as `flashstable experiment instability --out OUT_DIR` finds runs done before and skips
them; a run the pack holds unfinished is left out (its checkpoints do not travel in packs, so it
starts over). `h200_hold.sh start` runs it with PREVIOUS; prints what it kept and left out.

    python3 experiments/unpack_finished.py OUT_DIR PACK [PACK ...]
"""

import pathlib
import shutil
import sys
import tempfile

from jax_flashstable.experiment import instability


def main(argv):
  if len(argv) < 2:
    sys.exit("usage: unpack_finished.py OUT_DIR PACK [PACK ...]")
  out, packs = pathlib.Path(argv[0]), argv[1:]
  with tempfile.TemporaryDirectory() as tmp:  # all read (and checked) before anything is written
    try:
      runs = instability.unpack_runs(packs, tmp)
    except (ValueError, FileNotFoundError) as e:  # names the pack (and the entry)
      sys.exit(f"unpack_finished: {e}")
    for run in runs:
      src = pathlib.Path(tmp) / run
      if not (src / "summary.json").exists():
        print(f"unpack_finished: {run}: unfinished in the packs, starts over")
      elif (out / run).exists():
        print(f"unpack_finished: {run}: already under {out}, kept as it is")
      else:
        (out / run).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, out / run)
        print(f"unpack_finished: {run}: finished, skipped by the queues")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
