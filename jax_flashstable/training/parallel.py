"""Data parallelism over the local devices through `jax.sharding`.

`data_mesh()` builds a one-axis ("data") `Mesh`; `train.make_steps(..., mesh)` splits each batch
over it with `jax.shard_map`, so the Pallas attention kernels (custom calls that XLA's SPMD
partitioner cannot split) run on each device's own shard instead of being gathered.
`replicate` places the parameters and optimizer state on every device of the mesh
(`NamedSharding(mesh, P())`); `shard_batch` places a batch split along its batch axis
(`NamedSharding(mesh, P(..., "data"))`).

Several hosts: call `jax.distributed.initialize()` (coordinator address, number of processes
and process id from the environment or as arguments) in every process before anything else;
`jax.devices()` then lists the devices of all hosts and the same mesh spans them. Every process
computes the same global batch (the data order depends only on seed and step) and
`shard_batch` hands each process's devices their slices (`jax.make_array_from_callback`).
Only the single-host case is tested here (4 simulated CPU devices; 2 H200s).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def data_mesh(devices=None) -> Mesh:
  """A Mesh with one axis, "data", over `devices` (default: all devices)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), ("data",))


def replicate(mesh: Mesh, tree):
  """`tree` (arrays) copied to every device of `mesh`."""
  return jax.device_put(tree, NamedSharding(mesh, P()))


def shard_batch(mesh: Mesh, x, batch_axis: int = 0) -> jax.Array:
  """The global batch `x` (a NumPy array, the same in every process) split along `batch_axis`
  over the "data" axis of `mesh`. Raises ValueError if that axis does not divide evenly."""
  x = np.asarray(x)
  if x.shape[batch_axis] % mesh.size:
    raise ValueError(
      f"batch size {x.shape[batch_axis]} (axis {batch_axis} of shape {x.shape}) "
      f"is not a multiple of the {mesh.size} devices of the mesh"
    )
  sharding = NamedSharding(mesh, P(*([None] * batch_axis), "data"))
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def collective_counts(hlo_text: str) -> dict:
  """How many instructions of each collective a compiled HLO text has (async start/done pairs
  count once): a data-parallel step should all-reduce gradients and move nothing else —
  no all-gather, reduce-scatter, all-to-all or collective-permute."""
  import re

  ops = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
  return {
    op.replace("-", "_") + "s": len(re.findall(rf"\b{op}(?:-start)?\(", hlo_text)) for op in ops
  }
