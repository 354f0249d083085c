"""`flashstable bench`: timing helpers, the CLI at CPU size, and the golden output hashes."""

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import platform
import re
import subprocess
import sys

import jax
import pytest

from jax_flashstable import bench, cli
from jax_flashstable.bench import runners, timing
from jax_flashstable.lab.shapes import Shape, make_inputs
from pallas_kernels.forward_mgpu import causal_miscompiled, on_hopper

HASHES = json.loads((pathlib.Path(__file__).parent / "golden_hashes.json").read_text())


class FakeClock:
  """A clock that moves only when the fake work says so: the timing helpers' arithmetic is
  checked exactly, whatever else the machine is doing (sleep-based timings failed under load)."""

  def __init__(self):
    self.now = 0.0

  def perf_counter(self):
    return self.now

  def work(self, seconds):
    self.now += seconds


def _experiment(name):
  """experiments/NAME.py as a module (their names start with a digit: no import statement)."""
  path = pathlib.Path(__file__).parents[1] / "experiments" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def clock(monkeypatch):
  c = FakeClock()
  monkeypatch.setattr(timing, "time", c)
  return c


def test_paired_overhead_measures_a_known_ratio(clock):
  fast = lambda calls=1: clock.work(0.002 * calls)
  slow = lambda calls=1: clock.work(0.004 * calls)
  assert bench.paired_overhead(fast, slow, pairs=6, inner=2) == pytest.approx(1.0, rel=1e-9)
  assert bench.paired_overhead(fast, fast, pairs=6, inner=2) == pytest.approx(0.0, abs=1e-9)
  assert bench.paired_overhead(slow, fast, pairs=6, inner=2) == pytest.approx(-0.5, rel=1e-9)


def test_timing_in_batches_spreads_a_fixed_wait_over_the_calls(clock):
  # 1 ms of "kernel" per call plus 2 ms of synchronisation per wait
  run = lambda calls=1: clock.work(0.002 + 0.001 * calls)
  assert bench.median_seconds(run, warmup=1, reps=3) == pytest.approx(0.003, rel=1e-9)
  assert bench.calls_per_timing(run) == 10  # 50 ms / 3 ms = 16, capped at 10
  assert bench.calls_per_timing(run, target_s=0.001) == 1  # one call is already longer
  per_call = bench.median_seconds(run, warmup=1, reps=3, calls=10)
  assert per_call == pytest.approx(0.0012, rel=1e-9)  # (2 + 10·1) ms / 10 calls
  assert bench.seconds_per_call(run, warmup=1, reps=3) == pytest.approx(0.0012, rel=1e-9)


def test_kernel_seconds_sums_the_gpu_streams_events_per_call(monkeypatch):
  """`timing.kernel_seconds`: run(calls) once under JAX's profiler; the GPU streams' event
  durations summed and divided by calls (other GPU lines and other planes not counted); None
  for a trace with no GPU kernels, which is what a CPU's real trace holds (a GPU's: the
  multiply's kernel, a few µs a call)."""
  seen = []
  run = bench.waiting(lambda x: seen.append(x) or jax.numpy.asarray(x) * 2, 3)
  real = bench.kernel_seconds(run, calls=3)
  assert seen == [3, 3, 3]
  if jax.default_backend() == "cpu":
    assert real is None
  else:  # 4.3 µs a call (H100, 2026-12-07)
    assert 0 < real < 1e-3, real
  lines = {
    "/device:GPU:0 Stream #14(Compute)": [("entry_mosaic_gpu_kernel", 120_000), ("copy", 30_000)],
    "/device:GPU:0 Stream #15(MemcpyH2D)": [("MemcpyH2D", 50_000)],
    "/device:GPU:0 XLA Ops": [],
  }
  monkeypatch.setattr(timing, "kernels_of_trace", lambda d: lines)
  assert bench.kernel_seconds(run, calls=4) == pytest.approx(200_000 / 4 / 1e9, rel=1e-12)
  with pytest.raises(ValueError, match=r"^calls=0 "):
    bench.kernel_seconds(run, calls=0)


def test_kernel_seconds_without_a_trace_warns_and_gives_none(monkeypatch, tmp_path):
  """With another trace running (one a process) or no trace file written, `kernel_seconds`
  warns and returns None, so that an A/B goes on without its kernel times; run still runs."""
  seen = []
  run = bench.waiting(lambda: seen.append(1) or jax.numpy.zeros(()))
  jax.profiler.start_trace(str(tmp_path))
  try:
    with pytest.warns(UserWarning, match=r"^kernel_seconds: no profiler trace \("):
      assert bench.kernel_seconds(run, calls=2) is None
  finally:
    jax.profiler.stop_trace()

  def no_file(d):
    raise IndexError("list index out of range")

  monkeypatch.setattr(timing, "kernels_of_trace", no_file)
  with pytest.warns(UserWarning, match=r"^kernel_seconds: the profiler wrote no trace under "):
    assert bench.kernel_seconds(run, calls=2) is None
  assert len(seen) == 2  # the second call's run; the first never started


@pytest.mark.parametrize("script", ["11_mgpu_forward_ab", "18_mgpu_backward_stages_ab"])
def test_the_ab_experiments_time_every_variant_on_the_same_inputs(monkeypatch, tmp_path, script):
  """Experiments 11 and 18 run each variant on the same query, keys and values (a variant's
  timings once overwrote the keys `k` with its kernel time, so every later variant failed on
  the GPU and printed one error line instead of its ratio): with the kernels stubbed on the
  CPU (each checks that its keys are the array it was given), every variant prints its line."""
  import jax_flashstable
  import pallas_kernels.backward_mgpu as bm
  import pallas_kernels.forward as fwd
  import pallas_kernels.forward_mgpu as fm

  given = {}

  def keys_checked(k):
    given.setdefault("k", k)
    assert k is given["k"], f"keys {type(k).__name__}, not the inputs' array"

  def attention(q, k, v, **kw):
    keys_checked(k)
    return q

  def forward(q, k, v, cfg):
    keys_checked(k)
    rows = jax.numpy.zeros((q.shape[0], q.shape[2], q.shape[1]), jax.numpy.float32)
    return q, rows, rows, None, None

  def backward(q, k, v, o, m, log_l, do, cfg):
    keys_checked(k)
    return q, k, v

  monkeypatch.setattr(fm, "on_hopper", lambda: True)
  monkeypatch.setattr(jax.nn, "dot_product_attention", lambda q, k, v, **kw: attention(q, k, v))
  monkeypatch.setattr(jax_flashstable, "flash_attention", attention)
  monkeypatch.setattr(fwd, "flash_forward", forward)
  monkeypatch.setattr(bm, "flash_backward_mgpu", backward)
  monkeypatch.setattr(jax, "jit", lambda f: f)  # the stubs see the arrays themselves
  out = tmp_path / "ab.txt"
  variants = (
    ["bk=64", "bk=64,comp=0"] if script.startswith("11") else ["2,2", "2,2,persistent_bwd=0"]
  )
  ab = _experiment(script)
  ab.main(["--shape", "1,128,2,2,32", "--pairs", "2", "--out", str(out), *variants])
  lines = out.read_text().splitlines()[1:]
  assert len(lines) == 2 + script.startswith("11"), lines  # 11: cuDNN's line first
  assert not [x for x in lines if "Error" in x], lines


def test_waiting_dispatches_the_calls_and_returns_the_last_output():
  seen = []
  run = bench.waiting(lambda x: seen.append(x) or jax.numpy.asarray(len(seen)), 7)
  assert int(run(4)) == 4 and seen == [7] * 4


def test_flops_convention():
  f = bench.attention_flops(2, 1024, 1024, 4, 64, causal=False)
  assert f == 4 * 2 * 4 * 1024 * 1024 * 64
  assert bench.attention_flops(2, 1024, 1024, 4, 64, causal=True) == f / 2
  assert bench.attention_flops(2, 1024, 1024, 4, 64, causal=False, backward=True) == 3.5 * f


def test_names_are_attention_specs_or_external():
  assert bench.name_error("fa2+comp+mgpu:block_k=128") is None
  assert bench.name_error("torch-math") is None and bench.name_error("pallas-mgpu") is None
  assert bench.name_error("flash-mgpu:fa2+stabilize@128") is None  # an older spelling
  for bad, why in (
    ("fa3", "'fa3'"),
    ("fa2+mgpu:block_k=32", "block_k=32"),
    ("torch-fast", "'torch-fast'"),
    ("paper+mgpu", "numerics='paper'"),
    ("fa2:block_k=12x", "block_k='12x'"),
  ):
    assert why in bench.name_error(bad), bad


def test_bench_cli_at_toy_size(tmp_path, capsys):
  with pytest.raises(SystemExit, match="'nope'"):
    cli.main(["bench", "--attention", "fa2,nope", "--out", str(tmp_path)])
  with pytest.raises(SystemExit, match="'fa3'"):
    cli.main(["bench", "--attention", "fa3", "--out", str(tmp_path)])
  with pytest.raises(SystemExit, match="'paper\\+mgpu'.*numerics='paper'"):
    cli.main(["bench", "--attention", "paper+mgpu", "--out", str(tmp_path)])
  with pytest.raises(SystemExit, match=r"heads=4 is not a multiple of kv_heads=3"):
    cli.main(["bench", "--shapes", "1,64,4,3,64,0", "--out", str(tmp_path)])
  with pytest.raises(SystemExit, match=r"shape '1,64,2,2,0,1': head_dim=0 \(sizes are ≥ 1\)"):
    cli.main(["bench", "--shapes", "1,64,2,2,0,1", "--out", str(tmp_path)])
  for option in ("--overhead xla", "--overhead fa2+comp"):  # its +comp twin is timed against it
    with pytest.raises(SystemExit, match=rf"{re.escape(option.replace(' ', " '"))}'"):
      cli.main(["bench", *option.split(), "--out", str(tmp_path)])
  # given but empty, an empty item, options of another mode, nothing measurable: refused
  refused = [
    (["--attention", ""], r"--attention '': empty"),
    (["--attention", "fa2,,paper"], r"--attention 'fa2,,paper': an empty item"),
    (["--shapes", ""], r"--shapes '': empty"),
    (["--step-batch", "2"], r"--step-model and --step-batch set the training step of --targets"),
    (["--paired", "fa2", "--overhead-pairs", "0"], r"--paired 'fa2' needs --overhead-pairs ≥ 1"),
    (["--targets", "bogus"], r"^flashstable bench: --targets 'bogus': unknown attention"),
  ]
  for extra, message in refused:
    with pytest.raises(SystemExit, match=message):
      cli.main(["bench", *extra, "--out", str(tmp_path)])
  if jax.default_backend() != "gpu":
    with pytest.raises(SystemExit, match=r"^flashstable bench: --attention 'cudnn' needs a CUDA"):
      cli.main(["bench", "--attention", "cudnn", "--out", str(tmp_path / "gpu")])
  # torch SDPA without torch (CI's .venv): refused at once, nothing written (a torch-flash
  # bench ran 47 s on a CPU before, every row then skipped)
  no_torch = importlib.util.find_spec("torch") is None
  with (
    pytest.raises(SystemExit, match=r"^flashstable bench: --attention 'torch-math' runs torch")
    if no_torch
    else contextlib.nullcontext()
  ):
    cli.main(
      [
        "bench",
        "--attention",
        "torch-math",
        "--shapes",
        "1,64,2,2,32,1",
        "--overhead-pairs",
        "0",
        "--out",
        str(tmp_path / "none"),
      ]
    )
  rc = cli.main(
    [
      "bench",
      "--shapes",
      "1,64,2,1,64,causal",  # the plumbing, at one tile (numerics: test_golden)
      "--attention",  # a Mosaic GPU spec runs the same path (its kernels: below), 21 s more here
      "fa2,paper+comp,xla,torch-math,pallas-mgpu",
      "--reps",
      "2",
      "--warmup",
      "1",
      "--overhead-pairs",
      "2",
      "--no-hashes",
      "--out",
      str(tmp_path),
      "--paired-impls",
      "fa2",
      "--paired-reference",
      "xla",
    ]
  )  # an older flag name
  assert rc == 0 and "--paired-impls is now --paired" in capsys.readouterr().err
  res = json.loads((tmp_path / "bench.json").read_text())
  rows = {r["impl"]: r for r in res["rows"]}
  assert "skipped" in rows["torch-math"] or rows["torch-math"]["ok"]  # torch is optional
  skipped = rows["pallas-mgpu"]["skipped"]  # one line, the reason
  if jax.default_backend() == "cpu":
    assert "needs a CUDA GPU" in skipped
  else:  # JAX's own kernel refuses the toy shape ("kv_seq_len=64 must be a multiple of …")
    assert re.fullmatch(r"ValueError: [^\n]+", skipped), skipped
  assert not (tmp_path / "bench_partial.json").exists()
  for name in ("fa2", "paper+comp", "xla"):
    r = rows[name]
    assert r["ok"] and r["max_err"] < 2**-5 and r["fwd_ms"] > 0 and r["fwdbwd_tflops"] > 0
  # backend="auto"'s choice for this causal shape: Mosaic GPU on Hopper, unless its CUDA's
  # ptxas miscompiles causal masks
  hopper = on_hopper() and causal_miscompiled() is None
  auto = "mosaic_gpu/mosaic_gpu" if hopper else "triton/triton"
  assert rows["fa2"]["kernels"] == auto and rows["xla"].get("kernels") is None
  shape = Shape(1, 64, 64, 2, 1, 64, True)
  mgpu = runners.kernels("fa2+comp+mgpu", shape, *make_inputs(shape, jax.numpy.bfloat16, 0)[:3])
  assert mgpu == "mosaic_gpu/mosaic_gpu"  # what its row would name (interpret mode on a CPU)
  r = res["meta"]["paired_ratios"][0]  # time(xla) / time(ours), same moment
  assert r["impl"] == "fa2" and r["reference"] == "xla" and r["pairs"] == 2
  assert 0 < r["fwd_ratio"] < 1e4 and 0 < r["fwdbwd_ratio"] < 1e4
  with pytest.raises(SystemExit, match=r"--paired-reference 'nope': unknown attention 'nope'"):
    cli.main(["bench", "--paired", "fa2", "--paired-reference", "nope", "--out", str(tmp_path)])
  with pytest.raises(SystemExit, match=r"'nope': unknown attention"):  # without --paired too
    cli.main(["bench", "--paired-reference", "nope", "--out", str(tmp_path)])
  o = res["meta"]["compensation_overhead"][0]
  assert o["attention"] == "fa2" and o["pairs"] == 2 and abs(o["fwd_overhead"]) < 5
  assert (tmp_path / "bench.png").stat().st_size > 0


def test_golden_hashes_unchanged():
  """The numerics of every layout, for fixed tiles, are pinned: a speed change must keep them.
  Per GPU and per class of XLA's CPU code generation (`bench.hash_key`: the bits of XLA's own
  attention name the class; float32 bits follow it). A CPU whose key is not recorded must
  give one whole record of another key (two machines of one class whose fingerprints differ);
  only a CPU that gives none of them is skipped: a new class or a changed numerics, which a
  recorded machine tells apart."""
  key = bench.hash_key()
  got = bench.golden_hashes()
  if key in HASHES:
    assert got == HASHES[key]
    return
  same = {k: sum(got.get(n) == h for n, h in r.items()) for k, r in HASHES.items() if k != "_about"}
  if not any(n == len(HASHES[k]) == len(got) for k, n in same.items()):
    pytest.skip(
      f"no golden hashes recorded for {key!r} and none of the records matches whole (hashes "
      f"in common: {same}): record bench.golden_hashes() under that key on a machine whose "
      f"numerics are known to be unchanged"
    )


def _key_in_subprocess(xla_flags):
  env = dict(os.environ, XLA_FLAGS=xla_flags)
  return subprocess.run(
    [sys.executable, "-c", "from jax_flashstable import bench; print(bench.hash_key())"],
    env=env,
    capture_output=True,
    text=True,
    check=True,
  ).stdout.split()[-1]


def test_xla_fingerprint_names_the_code_generation():
  """The CPU key is measured: another process with the same flags gives the same key (a record
  is looked up in another process than it was taken in), and capping XLA's instruction set at
  AVX (no FMA), which changes the golden hashes (all 16 on the machines seen), changes it
  (subprocesses: XLA_FLAGS are read once per process)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if jax.default_backend() != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
    pytest.skip("the fingerprint keys CPU records; the AVX cap is an x86 flag")
  if "--xla_cpu_max_isa" in flags:
    pytest.skip(f"XLA_FLAGS already caps the instruction set: {flags!r}")
  key = bench.hash_key()
  assert re.fullmatch(r"cpu-xla-[0-9a-f]{16}", key), key
  assert _key_in_subprocess(flags) == key
  capped = _key_in_subprocess(f"{flags} --xla_cpu_max_isa=AVX".strip())
  assert re.fullmatch(r"cpu-xla-[0-9a-f]{16}", capped) and capped != key


@pytest.mark.skipif(
  jax.default_backend() != "cpu",
  reason="toy size on a CPU; a GPU's bench --targets is the device scripts' (h200_env.sh: bench_targets)",
)
def test_bench_targets_on_cpu(tmp_path, capsys):
  """`flashstable bench --targets` at toy size on a CPU (XLA as the reference): every target has
  a row, measured or n/a with the reason (JAX's Mosaic GPU attention needs a GPU), and a
  'targets' table closes bench.md."""
  with pytest.raises(SystemExit, match="compensation"):
    cli.main(["bench", "--targets", "fa2", "--paired-reference", "xla", "--out", str(tmp_path)])
  rc = cli.main(
    [
      "bench",
      "--targets",
      "--paired-reference",
      "xla",
      "--shapes",
      "1,64,2,2,32,1",
      "--reps",
      "1",
      "--warmup",
      "1",
      "--overhead-pairs",
      "2",
      "--no-hashes",
      "--step-batch",
      "2",
      "--out",
      str(tmp_path),
    ]
  )
  assert rc == 0
  res = json.loads((tmp_path / "bench.json").read_text())
  assert {r["impl"] for r in res["rows"]} == {"fa2+comp", "pallas-mgpu", "xla"}
  targets = res["meta"]["targets"]
  assert targets["attention"] == "fa2+comp" and targets["shapes"][0]["kernels"] == "triton/triton"
  rows = {(r["target"], r["shape"]): r for r in targets["rows"]}
  shape = "b1 q64 kv64 h2/2 d32 causal"
  for target in (
    "forward ≥ 0.95× xla",
    "forward+backward ≥ 0.80× xla",
    "compensation overhead, forward ≤ 3%",
    "compensation overhead, forward+backward ≤ 1%",
  ):
    assert rows[(target, shape)]["met"] in (True, False), target  # measured
  rival = rows[("forward ahead of pallas-mgpu", shape)]
  assert rival["met"] is None and "needs a CUDA GPU" in rival["measured"]
  step = rows[("tiny training step ≤ xla's", "batch 2")]
  assert step["met"] in (True, False) and " ms against " in step["measured"]
  assert "interleaved rounds" in step["measured"]
  by = {r["attention"]: r for r in targets["step"]["rows"]}
  ratio = bench.step_table.paired_step_ratio(by["fa2+comp"], by["xla"])
  assert step["met"] is (ratio <= 1.0) and f"{ratio:.3f}×" in step["measured"]
  md = (tmp_path / "bench.md").read_text()
  assert "| target | shape | measured | met |" in md and "forward ≥ 0.95× xla" in md


def test_the_mosaic_gpu_ab_script_reads_variants_and_refuses_bad_ones():
  """experiments/11_mgpu_forward_ab.py (issue 19's A/B of the Mosaic GPU forward on the GPU):
  a variant's keys become flash_attention's block_k, num_stages, stabilize and
  MosaicGPUOptions fields; a bad item, or options the dataclass refuses together, is one
  ValueError naming the variant and the item, raised before any work (the script exits with
  it)."""
  import dataclasses

  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  ab = _experiment("11_mgpu_forward_ab")
  fields = [f.name for f in dataclasses.fields(MosaicGPUOptions)]
  assert ab.parse_variant("", MosaicGPUOptions) == dict(
    block_k=64, num_stages=2, stabilize=True, jax=False, options={}
  )
  got = ab.parse_variant("bk=128,st=3,comp=0,exp2=0,early_turn=1", MosaicGPUOptions)
  assert got == dict(
    block_k=128,
    num_stages=3,
    stabilize=False,
    jax=False,
    options=dict(exp2=False, early_turn=True),
  )
  assert ab.parse_variant("jax=1,bk=128,st=3", MosaicGPUOptions) == dict(
    block_k=128, num_stages=3, stabilize=True, jax=True, options={}
  )
  MosaicGPUOptions(**got["options"])  # the options are the dataclass's own fields
  assert set(ab.OPTIONS_CHANGING_FLOATS) <= set(fields)
  for bad, message in (
    ("bk=64,foo=1", "variant 'bk=64,foo=1': unknown key 'foo' (known: bk, st, comp, jax, pingpong"),
    ("st", "variant 'st': 'st' is not KEY=VALUE"),
    ("bk=-1", "variant 'bk=-1': bk='-1' is not a positive int"),
    ("exp2=yes", "variant 'exp2=yes': exp2='yes' is not 0 or 1"),
    ("overlap=1,k_wait_in_pv=1", "variant 'overlap=1,k_wait_in_pv=1': MosaicGPUOptions(overlap"),
    ("jax=1,tie_lanes=0", "variant 'jax=1,tie_lanes=0': jax=1 (JAX's attention_mgpu) takes bk"),
    ("jax=1,comp=1", "variant 'jax=1,comp=1': jax=1 (JAX's attention_mgpu) takes bk and st"),
    ("jax=2", "variant 'jax=2': jax='2' is not 0 or 1"),
    ("jax=1,st=1", "variant 'jax=1,st=1': jax=1 needs st ≥ 2"),
  ):
    with pytest.raises(ValueError) as e:
      ab.parse_variant(bad, MosaicGPUOptions)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_the_ab_scripts_read_shape_and_causal_as_the_bench_does():
  """`Shape.parse(text, causal=)`: the experiments' --shape (five sizes) beside --causal is the
  bench's shape with that mask; a sixth field, a missing one or a bad size is one ValueError
  naming the text; experiments 11 and 18 exit with it in one line, before any GPU work."""
  from jax_flashstable.lab.shapes import Shape

  assert Shape.parse("4,64,2,1,32", causal=True) == Shape(4, 64, 64, 2, 1, 32, True)
  assert Shape.parse("4,64,2,1,32", causal=False) == Shape.parse("4,64,2,1,32,full")
  with pytest.raises(TypeError, match=r"^causal must be a bool or None, got causal='false'$"):
    Shape.parse("4,64,2,1,32", causal="false")  # a string is not a mask, even a true one
  for text, message in (
    ("4,64,2,1,32,1", "shape '4,64,2,1,32,1' is not batch,len,heads,kv_heads,head_dim"),
    ("4,64,2,1", "shape '4,64,2,1' is not batch,len,heads,kv_heads,head_dim"),
    ("4,0,2,1,32", "shape '4,0,2,1,32': len=0 (sizes are ≥ 1)"),
  ):
    with pytest.raises(ValueError) as e:
      Shape.parse(text, causal=False)
    assert str(e.value) == message
  root = pathlib.Path(__file__).parents[1]
  for script, variant in (("11_mgpu_forward_ab", "bk=64"), ("18_mgpu_backward_stages_ab", "2,2")):
    done = subprocess.run(
      [sys.executable, f"experiments/{script}.py", "--causal", "--shape", "4,64,3,2,32", variant],
      cwd=root,
      env=dict(os.environ, PYTHONPATH=str(root)),
      capture_output=True,
      text=True,
      timeout=120,
    )
    want = f"{script}: --shape: shape '4,64,3,2,32': heads=3 is not a multiple of kv_heads=2\n"
    assert done.returncode == 1 and done.stderr == want, done.stderr


def test_the_backward_ab_reads_stages_and_the_backwards_options():
  """experiments/18_mgpu_backward_stages_ab.py's variants: DKV,DQ, then options the Mosaic GPU
  backward reads (longest_first, persistent_bwd) as 0/1 and the dQ key tile (bk_dq=64|128); anything else is
  refused naming the item."""

  ab = _experiment("18_mgpu_backward_stages_ab")
  assert ab.parse_stages("3,2") == ((3, 2), {})
  assert ab.parse_stages("3,2,longest_first=1") == ((3, 2), {"longest_first": True})
  assert ab.parse_stages("2,2,longest_first=0") == ((2, 2), {"longest_first": False})
  assert ab.parse_stages("2,2,persistent_bwd=1") == ((2, 2), {"persistent_bwd": True})
  got = ab.parse_stages("2,2,rounded_scores=0,bk_dq=128")  # a KernelConfig field too
  assert got == ((2, 2), {"rounded_scores": False, "bk_dq": 128})
  assert ab.split_fields(got[1]) == ({"rounded_scores": False}, {"block_k_dq_mgpu": 128})
  assert ab.split_fields({}) == ({}, {})
  for bad, match in (
    ("2,2,bk_dq=96", r"^variant '2,2,bk_dq=96': 'bk_dq=96' is not bk_dq=64 or bk_dq=128$"),
    ("2,2,wgs=3", r"^variant '2,2,wgs=3': 'wgs=3' is not OPTION=0\|1"),  # (removed)
    ("3", r"^variant '3' is not DKV,DQ"),
    ("3,9", r"^variant '3,9' is not DKV,DQ"),
    ("3,2,longest_first=2", r"^variant '3,2,longest_first=2': 'longest_first=2' is not OPTION"),
    (
      "3,2,skip_rescale=1",
      r"'skip_rescale=1' is not OPTION=0\|1 \(OPTION: longest_first, rounded_scores, "
      r"scale_in_exp2, persistent_bwd, delta_in_dq, o_by_tma, items_early\)$",
    ),
    ("3,2,longest_first", r"'longest_first' is not OPTION"),
  ):
    with pytest.raises(ValueError, match=match):
      ab.parse_stages(bad)


def test_the_ptxas_report_reads_forward_and_backward_variants():
  """experiments/20_ptxas_report.py's variants: fwd: takes experiment 11's, bwd: experiment
  18's (alone: the defaults); anything else is refused naming it; without the CUDA plugin
  (this project's .venv) it exits in one line naming the setup."""
  import importlib.util
  import subprocess
  import sys

  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  report = _experiment("20_ptxas_report")
  (_, kind, fwd), (_, _, bwd), (_, _, default) = report.parse_variants(
    ["fwd:bk=128,scale_in_exp2=1", "bwd:3,2,longest_first=0", "bwd:"], MosaicGPUOptions
  )
  assert kind == "fwd" and fwd["block_k"] == 128 and fwd["options"] == {"scale_in_exp2": True}
  assert bwd == ((3, 2), {"longest_first": False}) and default == (None, {})
  for bad, match in (
    ("dkv:3,2", r"^variant 'dkv:3,2' is not fwd:VARIANT or bwd:DKV,DQ$"),
    ("fwd:bk=96x", r"bk='96x' is not a positive int"),
    ("bwd:3", r"^variant '3' is not DKV,DQ"),
  ):
    with pytest.raises(ValueError, match=match):
      report.parse_variants([bad], MosaicGPUOptions)
  try:  # the CUDA 13 plugin (.venv-ptxas, a GPU image): then the script would compile kernels
    plugin = importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
  except ModuleNotFoundError:
    plugin = False
  if plugin:
    pytest.skip("the CUDA 13 plugin is installed: the missing-plugin line is not reachable")
  done = subprocess.run([sys.executable, report.__file__], capture_output=True, text=True)
  assert done.returncode == 1 and done.stderr.startswith("20_ptxas_report: needs the CUDA 13")


def test_the_timing_methods_script_primes_each_side_before_its_timing(monkeypatch):
  """experiments/19_timing_methods.py's primed pairs: per pair each side is called once (its
  priming call) and then timed over `inner` calls, the order alternating as in
  `timing.paired_overhead`; the ratio is time(b) / time(a) (here b takes three times a's time
  per call on a fake clock, so every ratio is exactly 3: a slept-for time failed under load)."""

  tm = _experiment("19_timing_methods")
  clock = FakeClock()
  monkeypatch.setattr(tm, "time", clock)
  log = []

  def fake(name, seconds):
    def run(calls=1):
      log.append((name, calls))
      clock.work(seconds * calls)

    return run

  ratios = tm.primed_pairs(fake("a", 0.002), fake("b", 0.006), pairs=3, inner=4)
  assert ratios == pytest.approx([3.0, 3.0, 3.0]), ratios
  assert log == [
    ("a", 1), ("a", 4), ("b", 1), ("b", 4),
    ("b", 1), ("b", 4), ("a", 1), ("a", 4),
    ("a", 1), ("a", 4), ("b", 1), ("b", 4),
  ]  # fmt: skip


def test_line_printer_prints_and_keeps_each_line_at_once(tmp_path, capsys):
  """`timing.line_printer`: each line printed and appended to the file before the next call
  (a run cut short keeps what it measured); an existing file is appended to; no path, no file."""
  path = tmp_path / "ab.txt"
  path.write_text("# before\n")
  say = timing.line_printer(path)
  say("first")
  assert path.read_text() == "# before\nfirst\n"  # flushed at once
  say("second")
  timing.line_printer(None)("third")
  assert path.read_text() == "# before\nfirst\nsecond\n"
  assert capsys.readouterr().out == "first\nsecond\nthird\n"


def test_interleaved_step_table_keeps_each_attentions_training_apart():
  """gpt2_step_table interleaves the choices' timed steps: each choice's training must still be
  its own, so two runs of the same attention end at the same loss as a table of it alone, and
  each row carries one time per round (their median is step_ms)."""
  import statistics

  kw = dict(model="tiny", batch_size=2, seq_len=32, steps=3, warmup=1)
  alone = bench.gpt2_step_table(attentions=("xla",), **kw)[0]
  rows = bench.gpt2_step_table(attentions=("xla", "reference-fp32", "xla"), **kw)
  assert rows[0]["last_loss"] == rows[2]["last_loss"] == alone["last_loss"]
  assert rows[1]["last_loss"] != rows[0]["last_loss"]  # a different attention, its own state
  for r in rows:
    assert len(r["step_ms_rounds"]) == 3
    assert r["step_ms"] == pytest.approx(statistics.median(r["step_ms_rounds"]))


def test_paired_step_ratio_is_the_median_of_the_rounds_ratios():
  from jax_flashstable.bench.step_table import paired_step_ratio

  ours = dict(step_ms_rounds=[10.0, 30.0, 12.0])
  theirs = dict(step_ms_rounds=[20.0, 10.0, 12.0])  # ratios 0.5, 3.0, 1.0
  assert paired_step_ratio(ours, theirs) == 1.0
  with pytest.raises(ValueError, match="rows of 3 and 1 rounds"):
    paired_step_ratio(ours, dict(step_ms_rounds=[1.0]))


def test_step_table_rotates_the_order_each_round_and_times_each_choice(monkeypatch):
  """Each round steps every choice once, the order rotating (ABC, BCA, CAB, …), warm-up rounds
  included and untimed; each row's `step_ms_rounds` are its own timed steps, in order; `around`
  (a profiler's switch) is called right before the first timed round and after the last."""
  from jax_flashstable.bench import step_table

  calls, base = [], {"xla": 1.0, "reference-fp32": 2.0, "fa2": 3.0}

  def fake_step(run, step, place):
    calls.append((run["attention"], step))
    return base[run["attention"]] + step / 100

  monkeypatch.setattr(step_table, "_step", fake_step)
  around = (lambda: calls.append(("start", None)), lambda: calls.append(("stop", None)))
  rows = step_table.gpt2_step_table(
    "tiny",
    ("xla", "reference-fp32", "fa2"),
    batch_size=2,
    seq_len=32,
    steps=3,
    warmup=1,
    around=around,
  )
  assert calls[3] == ("start", None) and calls[-1] == ("stop", None)
  del calls[3], calls[-1]
  a, b, c = "xla", "reference-fp32", "fa2"
  assert [name for name, _ in calls] == [a, b, c, b, c, a, c, a, b, a, b, c]
  assert [step for _, step in calls] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
  for row in rows:
    want = [1e3 * (base[row["attention"]] + r / 100) for r in (1, 2, 3)]
    assert row["step_ms_rounds"] == pytest.approx(want)


def test_counts_below_one_and_unknown_names_are_refused_before_any_work():
  """bench, compensation_overhead and paired_speed_ratio refuse reps/pairs below 1 (no median
  to take) and unknown names in one line naming them, before compiling anything; a single
  name is one implementation, not its characters."""
  from jax_flashstable.bench import compensation_overhead, paired_speed_ratio

  s = Shape(1, 32, 32, 2, 1, 16, True)
  with pytest.raises(ValueError, match=r"^pairs=0 must be an integer ≥ 1$"):
    compensation_overhead(s, "fa2", pairs=0)
  with pytest.raises(ValueError, match=r"^pairs=0 must be an integer ≥ 1$"):
    paired_speed_ratio(s, "fa2", "xla", pairs=0)
  with pytest.raises(ValueError, match=r"^reps=0 must be an integer ≥ 1$"):
    bench.bench([s], ["xla"], warmup=0, reps=0)
  with pytest.raises(ValueError, match="fa9"):
    bench.bench([s], ["xla", "fa9"])
  with pytest.raises(ValueError, match=r"^pairs=2.5 must be an integer ≥ 1$"):
    timing.paired_overhead(lambda n: None, lambda n: None, pairs=2.5)
  rows = bench.bench([s], "xla", warmup=0, reps=1)
  assert [r["impl"] for r in rows] == ["xla"] and rows[0]["ok"]


def test_gpu_only_names_off_a_gpu_are_refused_before_any_work(tmp_path):
  """On a CPU a bench of cuDNN or JAX's Mosaic GPU attention alone, pairs against cuDNN and
  targets judged against it could only end in 'skipped' rows after the other measurements:
  refused at once, in one line naming the option and what runs here."""
  from jax_flashstable.bench import suite

  if jax.default_backend() == "gpu":
    pytest.skip("off a GPU only")
  cases = [
    (dict(names=["cudnn", "pallas-mgpu"]), r"^--attention 'cudnn' needs a CUDA GPU"),
    (dict(names=["cudnn+center"]), r"^--attention 'cudnn\+center' needs a CUDA GPU"),
    (
      dict(paired=["fa2"]),
      r"^--paired-reference 'cudnn' needs a CUDA GPU.*--paired-reference xla\)$",
    ),
    (dict(targets="fa2+comp"), r"^--paired-reference 'cudnn' needs a CUDA GPU"),
  ]
  for kw, match in cases:
    with pytest.raises(ValueError, match=match):
      suite.run(str(tmp_path / "b"), **kw)
  assert not (tmp_path / "b").exists()  # nothing ran, nothing written
  assert suite.needs_gpu("cudnn") and not suite.needs_gpu("fa2+comp")


def test_the_step_kernels_summary_groups_and_ranks_kernel_times(tmp_path):
  """experiments/21_step_kernels.py: the per-step kernel time by group (attention, matrix
  products, XLA fusions, other) of each run, the kernels ranked by their per-step difference,
  and the HLO of a named fusion read from an XLA dump (the profiler's `_11` is HLO's `.11`)."""
  sk = _experiment("21_step_kernels")
  ours = dict(
    attention="ours",
    steps=2,
    step_ms=45.0,
    kernels=[("entry_mosaic_gpu_kernel", 300e3), ("input_concatenate_fusion_11", 212e3)]
    + [("nvjet_sm90_tst_256x128", 100e3)] * 2
    + [("Memset 0", 4e3)],
  )
  theirs = dict(
    attention="cudnn",
    steps=1,
    step_ms=44.0,
    kernels=[
      ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 82e3),
      ("input_concatenate_fusion_11", 48e3),
      ("nvjet_sm90_tst_256x128", 100e3),
    ],
  )
  text = sk.summarize([ours, theirs], top=2)
  assert "| attention | 150 | 82 |" in text  # µs a step: 300 over 2 steps
  assert "| matrix products | 100 | 100 |" in text
  assert "| XLA fusions | 106 | 48 |" in text and "| other | 2 | 0 |" in text
  assert "| all kernels | 358 | 230 |" in text and "| kernel launches a step | 2 | 3 |" in text
  ranked = text.split("(µs):")[1].strip().splitlines()
  assert ranked[0].split()[:2] == ["150.0", "0.0"] and ranked[1].split()[:2] == ["0.0", "82.0"]
  (tmp_path / "module_0001.jit_train_step.sm_9.0a_gpu_after_optimizations.txt").write_text(
    "%fused_concatenate.11 (p: f32[4]) -> f32[4] {\n  ROOT %p = f32[4]{0} parameter(0)\n}\n\n"
    "ENTRY %main {\n  %input_concatenate_fusion.11 = f32[4]{0} fusion(%x), kind=kInput, "
    "calls=%fused_concatenate.11\n}\n"
  )
  hlo = sk.fusions_in_dump(tmp_path, ["input_concatenate_fusion_11", "loop_add_fusion_3"])
  assert "kind=kInput, calls=%fused_concatenate.11" in hlo
  assert "ROOT %p = f32[4]{0} parameter(0)\n}" in hlo
  assert "loop_add_fusion_3: not in this module" in hlo
  for bad, line in (  # refused in one line before anything compiles
    (["--attention", "bogus"], "21_step_kernels: attention='bogus': unknown attention 'bogus'"),
    (["--attention", "fa2", "--steps", "0"], "21_step_kernels: --steps=0 must be an integer ≥ 1"),
  ):
    done = subprocess.run(
      [sys.executable, sk.__file__, "--model", "tiny", *bad, "--out", str(tmp_path / "o")],
      capture_output=True,
      text=True,
      env=dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parents[1])),
    )
    assert done.returncode == 1 and done.stderr.strip().startswith(line), done.stderr
  assert not (tmp_path / "o").exists()


def test_the_sass_stall_report_sums_ncu_source_pages(tmp_path, monkeypatch):
  """experiments/22_sass_stalls.py reads Nsight Compute's SASS source page (plain or xz): per
  kernel the samples, the reasons' shares, the most sampled instructions and the windows' sums,
  each from the rows given; a file with no kernel is refused in one line."""
  import lzma

  stalls = _experiment("22_sass_stalls")
  header = [
    "Address", "Source", stalls.SAMPLES, "Warp Stall Sampling (Not-issued Samples)",
    stalls.EXECUTED, "stall_long_sb", "stall_wait",
  ]  # fmt: skip
  rows = [  # kernel 0: 3 instructions, 10 + 30 + 0 samples; kernel 1: one of 5
    ["0x10", "  BRA 0x40", "10", "1", "100", "10", "0"],
    ["0x20", "  HGMMA.64x64x16.F32.BF16 R24", "30", "2", "200", "5", "25"],
    ["0x30", "  EXIT", "0", "0", "100", "0", "0"],
  ]
  lines = [
    ["Kernel Name", "k0"],
    header,
    *rows,
    ["Kernel Name", "k1"],
    header,
    rows[0][:2] + ["5", "0", "7", "5", "0"],
  ]
  text = "\n".join(",".join(f'"{c}"' for c in line) for line in lines) + "\n"
  path = tmp_path / "sass.csv.xz"
  path.write_bytes(lzma.compress(text.encode()))
  found = stalls.kernels(path)
  assert [len(r) for _, r in found] == [3, 1]
  report = stalls.report(*found[0], top=2, window=2)
  assert report.startswith("3 SASS instructions, 40 stall samples, 400 instructions executed")
  assert "wait 62.5%, long_sb 37.5%" in report  # 25 of 40, 15 of 40
  assert "HGMMA" in report.splitlines()[3]  # the most sampled first
  assert "[    0,     2)      40  100.0%  200" in report
  # --span: instructions 0–1 by opcode (predicate and modifiers dropped), the largest first
  span = stalls.by_opcode(*found[0], 0, 2).splitlines()
  assert span[0] == "  instructions [0, 2): 40 samples, by opcode (samples, share, count):"
  assert span[1].split()[:4] == ["HGMMA", "30", "75.0%", "1"] and "('wait', 25)" in span[1]
  assert span[2].split()[:4] == ["BRA", "10", "25.0%", "1"]
  assert stalls.opcode("@!P1  BRA 0x7f") == "BRA" and stalls.opcode("") == "?"
  monkeypatch.setattr("sys.argv", ["22_sass_stalls.py", str(path), "--span", "0:1:9"])
  with pytest.raises(
    SystemExit, match=r"^--span 0:1:9: the file's kernels \(instructions\) are 0: 3, 1: 1$"
  ):
    stalls.main()
  with pytest.raises(argparse.ArgumentTypeError, match="START < END"):
    stalls.parse_span("0:2:2")
  empty = tmp_path / "empty.csv"
  empty.write_text('"Address","Source"\n')
  monkeypatch.setattr("sys.argv", ["22_sass_stalls.py", str(empty)])
  with pytest.raises(SystemExit, match="no kernel in it"):
    stalls.main()


def test_the_mosaic_gpu_kernels_wait_on_barriers_in_the_uniform_form():
  """ptxas puts a barrier wait's retry out of line (a NANOSLEEP only after the kernel's last
  EXIT) where it can address the barrier from uniform registers; the forward of one item a CTA
  with its Q loaded by the producer warpgroup and no final wait for the Q releases (commits
  5e34c85–01b1166) had 15–21 inline sleeps (21 at this test's shape) and ran ~10% slower
  (H100, 2026-12-06). Compiled for sm_90a on this CPU by experiments/20_ptxas_report.py (needs
  `bash scripts/setup.sh ptxas`: .venv-ptxas, ~1 GB; skipped without it): the forward, one
  item a CTA and persistent, and both backward kernels, a CTA an item and persistent
  (`MosaicGPUOptions.persistent_bwd`), have at most one."""
  import pathlib
  import re
  import subprocess

  root = pathlib.Path(__file__).parents[1]
  python = root / ".venv-ptxas" / "bin" / "python"
  if not python.exists():
    pytest.skip("no .venv-ptxas (bash scripts/setup.sh ptxas)")
  done = subprocess.run(
    [python, "experiments/20_ptxas_report.py", "--causal", "--shape", "1,512,4,2,64",
     "fwd:persistent=0", "fwd:persistent=1", "bwd:2,2,persistent_bwd=0", "bwd:2,2,persistent_bwd=1"],
    capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-2000:]
  sleeps = [int(n) for n in re.findall(r"(\d+) inline barrier-wait sleeps", done.stdout)]
  assert len(sleeps) == 6 and max(sleeps) <= 1, done.stdout
