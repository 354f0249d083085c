"""`flashstable crosscheck`: recompute a dump's outputs and gradients with our kernels and
report, per tensor, % bit-identical, the histogram of ulp differences, max abs error and signed
mean error. The dump format is `jax_flashstable/dumpfile.py`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention.api import flash_attention
from jax_flashstable.lab.dumpfile import load_dump

COMPARED = ("out", "d_query", "d_key", "d_value")


def _ordered(bits, nbits):
  """Sign-magnitude float bits → integers ordered like the floats (ulp distance = difference)."""
  bits = bits.astype(np.int64)
  sign = 1 << (nbits - 1)
  return np.where(bits & sign, -(bits & (sign - 1)), bits)


def ulp_difference(ours, theirs):
  """Signed ulp distance (ours − theirs) of two arrays of the same float dtype."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  nbits = ours.dtype.itemsize * 8
  view = {16: np.uint16, 32: np.uint32}[nbits]
  return _ordered(ours.view(view), nbits) - _ordered(theirs.view(view), nbits)


def compare_tensors(ours, theirs) -> dict:
  """% bit-identical, ulp histogram ({"0": n, "1": n, …, ">8": n} of |ulp|), max abs error and
  signed mean error (ours − theirs) of two same-dtype arrays."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
    raise ValueError(
      f"cannot compare {ours.dtype}{list(ours.shape)} with {theirs.dtype}{list(theirs.shape)}"
    )
  ulps = np.abs(ulp_difference(ours, theirs))
  hist = {str(i): int(np.sum(ulps == i)) for i in range(9)}
  hist[">8"] = int(np.sum(ulps > 8))
  diff = ours.astype(np.float64) - theirs.astype(np.float64)
  return dict(
    n=int(ours.size),
    pct_bit_identical=100.0 * float(np.mean(ulps == 0)),
    pct_within_1ulp=100.0 * float(np.mean(ulps <= 1)),
    ulp_histogram=hist,
    max_abs_error=float(np.abs(diff).max()),
    signed_mean_error=float(diff.mean()),
  )


INPUTS = ("query", "key", "value")


def dump_call(
  dump_path, *, numerics="fa2", stabilize=None, single_lse=None, block_q=None, block_k=None
):
  """(tensors, kwargs): the dump's tensors ([batch, seq, heads, dim]) and the `flash_attention`
  arguments that recompute them, checked before any computation: ValueError/TypeError in one
  line naming the dump's tensor or attr (a missing input, nothing to compare, gradients
  without d_out, an attr of the wrong type, a compared tensor of another shape or dtype than
  ours, and every `flash_attention` check). Arguments as `crosscheck`'s."""
  t, attrs = load_dump(dump_path, layout="bshd")
  said = f"{dump_path}:"
  if missing := [n for n in INPUTS if n not in t]:
    raise ValueError(f"{said} no tensor {missing[0]!r} (a dump needs {', '.join(INPUTS)})")
  if not any(n in t for n in COMPARED):
    raise ValueError(f"{said} nothing to compare (none of {', '.join(COMPARED)})")
  if (grads := [n for n in COMPARED[1:] if n in t]) and "d_out" not in t:
    raise ValueError(f"{said} {grads[0]!r} without 'd_out' to recompute it from")
  for name in ("causal", "stabilize", "single_lse"):
    if not isinstance(attrs.get(name, False), bool):
      raise TypeError(f"{said} attrs {name}={attrs[name]!r} is not a bool")
  kw = dict(
    causal=attrs.get("causal", False),
    softmax_scale=attrs.get("softmax_scale"),
    stabilize=bool(attrs.get("stabilize", False) if stabilize is None else stabilize),
    single_lse=bool(attrs.get("single_lse", False) if single_lse is None else single_lse),
    beta=attrs.get("beta", 2.0),
    tie_tolerance=attrs.get("tie_tolerance", 1e-3),
    block_q=block_q or attrs.get("block_q"),
    block_k=block_k or attrs.get("block_k"),
    numerics=numerics,
  )
  spec = {n: jax.ShapeDtypeStruct(x.shape, x.dtype) for n, x in t.items()}
  try:  # flash_attention's checks, and the shape and dtype of its out
    out = jax.eval_shape(lambda *a: flash_attention(*a, **kw), *map(spec.get, INPUTS))
  except (ValueError, TypeError) as e:
    raise type(e)(f"{said} {e}") from None
  ours = {"out": out}
  if "d_out" in t:
    ours |= dict(zip(COMPARED[1:], (spec[n] for n in INPUTS)))  # a gradient is its input's
    if t["d_out"].shape != out.shape:
      raise ValueError(f"{said} d_out has shape {list(t['d_out'].shape)}, out {list(out.shape)}")
  for name in COMPARED:
    if name in t and (t[name].shape, t[name].dtype) != (ours[name].shape, ours[name].dtype):
      raise ValueError(
        f"{said} {name} is {t[name].dtype}{list(t[name].shape)}, ours would be "
        f"{ours[name].dtype}{list(ours[name].shape)} (numerics={numerics!r})"
      )
  return t, kw


def crosscheck(
  dump_path, *, numerics="fa2", stabilize=None, single_lse=None, block_q=None, block_k=None
):
  """Recomputes `out` (and the gradients, when the dump has d_out) from the dump's query, key
  and value with our kernels; returns {tensor: compare_tensors(...)}. The dump is checked
  first (`dump_call`: ValueError/TypeError in one line).

  causal, softmax_scale, stabilize, beta, tie_tolerance, single_lse, block_q and block_k
  default to the dump's attrs (single_lse: False where the dump does not say; a dump of
  `torch_crosscheck/paper_fa2.py --single-lse`, the paper's own backward, says True, so it is
  compared with our single_lse backward, "paper+lse").
  """
  return recompute(
    *dump_call(
      dump_path,
      numerics=numerics,
      stabilize=stabilize,
      single_lse=single_lse,
      block_q=block_q,
      block_k=block_k,
    )
  )


def recompute(t, kw) -> dict:
  """{tensor: compare_tensors(ours, the dump's)} for `dump_call`'s (tensors, kwargs)."""
  q, k, v = (jnp.asarray(t[n]) for n in INPUTS)
  f = lambda q, k, v: flash_attention(q, k, v, **kw)
  ours = {}
  if "d_out" in t:
    out, vjp = jax.vjp(f, q, k, v)
    ours.update(
      zip(("d_query", "d_key", "d_value"), vjp(jnp.asarray(t["d_out"]).astype(out.dtype)))
    )
  else:
    out = f(q, k, v)
  ours["out"] = out
  return {
    name: compare_tensors(np.asarray(ours[name]), t[name])
    for name in COMPARED
    if name in t and name in ours
  }


def format_report(report) -> str:
  lines = [
    "| tensor | n | bit-identical % | within 1 ulp % | ulp histogram 0/1/2/3/>3 | max abs error | signed mean error |",
    "|---|---:|---:|---:|---|---:|---:|",
  ]
  for name, r in report.items():
    h = r["ulp_histogram"]
    tail = sum(v for k, v in h.items() if k not in ("0", "1", "2", "3"))
    lines.append(
      f"| {name} | {r['n']} | {r['pct_bit_identical']:.2f} | {r['pct_within_1ulp']:.2f} | "
      f"{h['0']}/{h['1']}/{h['2']}/{h['3']}/{tail} | {r['max_abs_error']:.3e} | "
      f"{r['signed_mean_error']:+.3e} |"
    )
  return "\n".join(lines)
