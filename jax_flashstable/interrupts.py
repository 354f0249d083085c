"""Ctrl-C (SIGINT) for programs that run XLA computations: the training loop stops after its
step with a checkpoint (`deferred`), and the CLI takes the signal on a thread of its own
(`take_on_a_thread`) so that it interrupts no other thread.

Why a thread of its own: blocked in every thread and taken with `sigwait`, the signal
interrupts no thread and no wait (XLA's runtime threads included); the waiting thread passes it
on as a flag or as KeyboardInterrupt in the main thread. What led here (2026-12-01): the Ctrl-C
test timed out when the suite ran as a background job; its children had inherited SIGINT
ignored, so the old handler was never installed and training went on. That is now explicit (a
process started ignoring SIGINT keeps ignoring it; the tests start their child as from a
terminal). Whether a signal arriving mid-step can also stall XLA's CPU runtime, as one gdb
trace first suggested, is not established. No JAX here: the CLI sets this up before JAX starts
a thread (threads inherit the signal mask).
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading

_lock = threading.Lock()
_flags: list[threading.Event] = []  # the active `deferred` contexts' flags, innermost last
_taker: threading.Thread | None = None  # the thread that takes SIGINT, once started

NOTICE = "\nCtrl-C: stopping after this step, with a checkpoint (Ctrl-C again: at once)"


def _on_interrupt() -> None:
  """One Ctrl-C: the innermost `deferred` flag if it is not set yet, else KeyboardInterrupt in
  the main thread (the default behaviour), raised when that thread next runs Python code: a
  wait on a JAX computation checks every 200 ms, a blocking `time.sleep` or read only after."""
  with _lock:
    flag = _flags[-1] if _flags else None
  if flag is not None and not flag.is_set():
    flag.set()
    print(NOTICE, file=sys.stderr, flush=True)
  else:
    _thread.interrupt_main()


def _take() -> None:
  while True:
    signal.sigwait({signal.SIGINT})
    _on_interrupt()


def take_on_a_thread() -> bool:
  """Blocks SIGINT in the calling (main) thread and every thread started after, and starts a
  daemon thread that takes it (`signal.sigwait`) and acts as `_on_interrupt`. Call it first,
  before JAX starts threads (threads started before keep the signal unblocked). Idempotent.
  Returns whether SIGINT is taken on the thread: False off the main thread, off POSIX (then
  `deferred` installs a Python handler instead) and where the process was started ignoring
  SIGINT (a background job, nohup), which it goes on ignoring. Child processes inherit the
  block: start them inside `unblocked()`."""
  global _taker
  if _taker is not None:
    return True
  if (
    threading.current_thread() is not threading.main_thread()
    or not hasattr(signal, "pthread_sigmask")
    or signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # started to ignore it (nohup, &)
  ):
    return False
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  _taker = threading.Thread(target=_take, name="sigint", daemon=True)
  _taker.start()
  return True


@contextlib.contextmanager
def unblocked():
  """Within: SIGINT unblocked in the calling thread, for starting a child process that must
  answer Ctrl-C (a child inherits the thread's signal mask). Nothing to do without
  `take_on_a_thread`."""
  if _taker is None or threading.current_thread() is not threading.main_thread():
    yield
    return
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@contextlib.contextmanager
def deferred():
  """Within: the first Ctrl-C sets the yielded flag instead of raising, so that a loop can stop
  at the end of its step with consistent state and logs; a second raises KeyboardInterrupt at
  once. With `take_on_a_thread` the signal thread sets the flag; otherwise, in the main thread
  and over Python's default handler, a handler is installed for the duration (a handler the
  caller installed is left alone, and off the main thread the flag is never set)."""
  flag = threading.Event()
  if _taker is not None:
    with _lock:
      _flags.append(flag)
    try:
      yield flag
    finally:
      with _lock:
        _flags.remove(flag)
    return
  if (
    threading.current_thread() is not threading.main_thread()
    or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
  ):
    yield flag
    return

  def first(signum, frame):
    flag.set()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(NOTICE, file=sys.stderr, flush=True)

  signal.signal(signal.SIGINT, first)
  try:
    yield flag
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
