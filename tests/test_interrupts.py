"""`jax_flashstable.interrupts`: Ctrl-C taken on a thread of its own (the CLI's set-up), in a
fresh interpreter each, since the set-up blocks SIGINT for the whole process."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = r"""
import os, signal, subprocess, sys, time
from jax_flashstable import interrupts

def wait_for(flag):
  t = time.monotonic()
  while not flag.is_set() and time.monotonic() - t < 20:
    time.sleep(0.01)
  return flag.is_set()

# a process started ignoring SIGINT (a background job, nohup) goes on ignoring it
signal.signal(signal.SIGINT, signal.SIG_IGN)
assert not interrupts.take_on_a_thread()
assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
signal.signal(signal.SIGINT, signal.default_int_handler)  # as started from a terminal
assert interrupts.take_on_a_thread() and interrupts.take_on_a_thread()  # idempotent
assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
# the first Ctrl-C inside `deferred` sets its flag; no exception, the notice on stderr
with interrupts.deferred() as flag:
  os.kill(os.getpid(), signal.SIGINT)
  print("flag", wait_for(flag), flush=True)
  try:  # a second: KeyboardInterrupt at once
    os.kill(os.getpid(), signal.SIGINT)
    t = time.monotonic()
    while time.monotonic() - t < 60:  # KeyboardInterrupt comes when this thread runs Python
      time.sleep(0.01)
    print("second: nothing", flush=True)
  except KeyboardInterrupt:
    print("second: KeyboardInterrupt", flush=True)
# outside `deferred`: KeyboardInterrupt, as Python's default
try:
  os.kill(os.getpid(), signal.SIGINT)
  t = time.monotonic()
  while time.monotonic() - t < 60:
    time.sleep(0.01)
  print("outside: nothing", flush=True)
except KeyboardInterrupt:
  print("outside: KeyboardInterrupt", flush=True)
# a child started inside `unblocked` answers SIGINT; outside it inherits the block
mask = [sys.executable, "-c", "import signal; print(int(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"]
with interrupts.unblocked():
  inside = subprocess.run(mask, capture_output=True, text=True).stdout.strip()
outside = subprocess.run(mask, capture_output=True, text=True).stdout.strip()
print("child blocked: inside", inside, "outside", outside, flush=True)
print("main still blocked", signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
"""


def test_ctrl_c_on_a_thread_sets_the_flag_then_interrupts():
  proc = subprocess.run(
    [sys.executable, "-c", SCRIPT],
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
    "flag True",
    "second: KeyboardInterrupt",
    "outside: KeyboardInterrupt",
    "child blocked: inside 0 outside 1",
    "main still blocked True",
  ], (proc.stdout, proc.stderr)
  assert proc.stderr.count("Ctrl-C: stopping after this step") == 1, proc.stderr
