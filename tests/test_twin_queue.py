"""experiments/h200_twin.sh's twin queue (JAX_PREVIOUS: the twin side alone) with a fake
`nvidia-smi` and a fake `python3` whose `crosscheck-train` prints what the real one prints of
each twin (its training line, a step line with the peak memory, done or out of GPU memory):
workers take the items in order, one per GPU; with TWINS_PER_GPU=2 a second joins once the
first's step line shows room for two; a twin out of memory stops the later items of its
attention, or, beside another twin, goes back to the queue and leaves one twin on the GPU."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from jax_flashstable.experiment import instability

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUEUE = "paper:29:3000 paper+comp:29:3000 paper:31:3000 paper+comp:31:3000 sdpa-flash:21:3000"

# FAKE_RUN_<kind>_<seed>: seconds of that twin's run (default 0.3); FAKE_OOM: "kind seed"
# twins that run out of memory, always ("always kind seed") or beside another running twin
FAKE_PYTHON = r"""#!/bin/bash
[[ $1 == -c ]] && exec "$REAL_PYTHON" "$@"  # the script's helpers (pairs held, pack) run
[[ "$*" == *--report-only* ]] && echo "$*" >> $FAKE_DIR/reports.log
[[ "$*" == *crosscheck-train* && "$*" != *--report-only* ]] || exit 0
pairs=$(sed -n 's/.*--pairs \([^ ]*\).*/\1/p' <<< "$*")
seeds=$(sed -n 's/.*--seeds \([^ ]*\).*/\1/p' <<< "$*")
out=$(sed -n 's/.*--out \([^ ]*\).*/\1/p' <<< "$*"); mkdir -p $out
for p in ${pairs//,/ }; do k=${p%%=*}; for s in ${seeds//,/ }; do
  echo "torch $k seed $s: training (GPU $CUDA_VISIBLE_DEVICES)"
  busy=$(ls $FAKE_DIR/running.* 2>/dev/null)
  if [[ " $FAKE_OOM " == *" always $k $s "* || ( -n $busy && " $FAKE_OOM " == *" $k $s "* ) ]]; then
    echo "torch $k seed $s: gpt_twin.py ran out of GPU memory at step 0:"
    echo "torch.OutOfMemoryError: CUDA out of memory."; continue
  fi
  touch $FAKE_DIR/running.$$; mkdir -p $out/torch/$k/seed$s
  echo "[torch $k seed $s] step 1: loss 10.7, grad_norm 1.0 (0.01 steps/s), peak memory $FAKE_PEAK GiB"
  v="FAKE_RUN_${k//[+-]/_}_$s"; sleep ${!v:-0.3}
  rm -f $FAKE_DIR/running.$$
  echo "torch $k seed $s: done at step 3000"
done; done
"""
FAKE_SMI = """#!/bin/bash
case "$*" in
  -L) for ((g = 0; g < $FAKE_NGPU; g++)); do echo "GPU $g: fake"; done ;;
  *memory.total*) echo 143771 ;;
esac
"""


def queue(tmp_path, ngpu=1, peak=50.0, oom="", **env):
  """Runs the queue; returns {label: [log lines]} of its workers' logs."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", FAKE_SMI)):
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  env = dict(
    os.environ,
    PATH=f"{bin_dir}:{os.environ['PATH']}",
    RUNS=str(tmp_path / "runs"),
    JAX_PREVIOUS="packs",
    BUDGET="600",
    QUEUE=QUEUE,
    POLL_S="0.5",
    FAKE_DIR=str(tmp_path),
    FAKE_NGPU=str(ngpu),
    FAKE_PEAK=str(peak),
    FAKE_OOM=oom,
    REAL_PYTHON=sys.executable,
    **env,
  )
  script = ROOT / "experiments" / "h200_twin.sh"
  subprocess.run(
    ["bash", str(script), "run", str(tmp_path / "out")],
    cwd=ROOT,
    env=env,
    capture_output=True,
    timeout=120,
  )
  logs = {}
  for f in sorted((tmp_path / "runs").glob("queue-torch*.log")):
    logs[f.stem.removeprefix("queue-")] = f.read_text().splitlines()
  return logs


def done(lines):
  """The twins a worker finished, as "kind seed"."""
  found = (re.search(r"torch (\S+) seed (\d+): done at step", line) for line in lines)
  return [f"{m[1]} {m[2]}" for m in found if m]


def all_done(logs):
  return sorted(t for lines in logs.values() for t in done(lines))


EVERY = sorted(["paper 29", "paper+comp 29", "paper 31", "paper+comp 31", "sdpa-flash 21"])


@pytest.mark.parametrize("peak,second", [(50.0, True), (70.0, False)])
def test_a_second_twin_joins_where_the_first_leaves_room(tmp_path, peak, second):
  """Two workers on one GPU take the queue's items in order, each item once, when the first
  twin's peak memory × 2 + 8 GiB is below the GPU's 140 GiB; else one does them all."""
  logs = queue(tmp_path, peak=peak, TWINS_PER_GPU="2", FAKE_RUN_paper_29="3")
  assert all_done(logs) == EVERY, logs
  said = " ".join(logs["torch0b"])
  if second:
    assert f"room for a second twin: the first's peak {peak} GiB of 140 GiB" in said, logs
    assert done(logs["torch0b"]) and done(logs["torch0"])[0] == "paper 29", logs
  else:
    assert f"no room for a second twin: the first's peak {peak} GiB" in said, logs
    assert done(logs["torch0"]) == [" ".join(it.split(":")[:2]) for it in QUEUE.split()], logs


def test_two_gpus_share_the_queue(tmp_path):
  """One worker per GPU, the items taken in order by whichever is free."""
  logs = queue(tmp_path, ngpu=2)
  assert set(logs) == {"torch0", "torch1"} and all_done(logs) == EVERY, logs
  assert done(logs["torch0"]) and done(logs["torch1"]), logs


def test_out_of_memory_alone_stops_that_attention(tmp_path):
  """A twin out of memory with no other on its GPU: the later items whose twins all ran out
  (here of the paper layout) are not started; the others are."""
  logs = queue(tmp_path, oom="always paper 29")
  lines = logs["torch0"]
  assert "[torch0] paper:31:3000 not started: its twins ran out of GPU memory (paper)" in lines
  assert all_done(logs) == sorted(["paper+comp 29", "paper+comp 31", "sdpa-flash 21"]), logs
  # the end's report names the pairs whose twin trained (a pair with none made crosscheck-train
  # refuse, 2026-12-05), and packs the runs
  (report,) = (tmp_path / "reports.log").read_text().splitlines()
  assert " --pairs paper+comp,sdpa-flash " in report and " --pack " in report, report


def test_a_queue_with_no_run_packs_its_folder_and_reports_nothing(tmp_path):
  """Every twin of the queue out of memory: no pair holds a run, so no report is asked for
  (one naming them would refuse) and the folder is packed as it is."""
  every = " ".join(f"always {k} {s}" for k, s in (t.split() for t in EVERY))
  logs = queue(tmp_path, oom=every)
  assert all_done(logs) == [], logs
  assert not (tmp_path / "reports.log").exists()
  # the pack of a folder without a run reads back (as none), for a later session's --runs
  assert instability.read_packs(tmp_path / "out" / "twin-anchor-b128-s3000.jsonl.xz") == {}


@pytest.mark.parametrize("who", ["second", "first"])
def test_out_of_memory_beside_another_twin_leaves_one_on_the_gpu(tmp_path, who):
  """Two twins on a GPU and one runs out of memory: its item goes back to the queue and the
  GPU goes down to one twin (the second stops; when the first ran out, it waits for the
  second's item first), and every item is done once. The second joins at ~0.5 s and takes
  paper+comp 29; the first's paper 29 runs 3 s; paper 31 is the first's next item."""
  timing = dict(TWINS_PER_GPU="2", FAKE_RUN_paper_29="3", FAKE_RUN_paper_comp_29="5")
  oom = "paper+comp 29" if who == "second" else "paper 31"
  logs = queue(tmp_path, oom=oom, **timing)
  kind, seed = oom.split()
  owner = "torch0b" if who == "second" else "torch0"
  back = f"[{owner}] out of GPU memory beside another twin: {kind}:{seed}:3000 back to the queue"
  assert any(line.startswith(back) for line in logs[owner]), logs
  assert "[torch0b] the second twin's worker stopped" in logs["torch0b"], logs
  assert all_done(logs) == EVERY, logs
  assert oom in done(logs["torch0"]), logs  # the first did it again, alone
  assert not (tmp_path / "runs" / "twin-oom").exists() or not (
    (tmp_path / "runs" / "twin-oom").read_text().strip()
  ), "an out-of-memory beside another twin does not stop its attention"
  if who == "first":
    assert done(logs["torch0b"]) == ["paper+comp 29"], logs
