"""Data parallelism over the local devices through `jax.sharding`.

`data_mesh()` builds a one-axis ("data") `Mesh`; `train.make_steps(..., mesh)` splits each batch
over it with `jax.shard_map`, so the Pallas attention kernels (custom calls that XLA's SPMD
partitioner cannot split) run on each device's own shard instead of being gathered.

Several hosts: call `jax.distributed.initialize()` (coordinator address, number of processes
and process id from the environment or as arguments) in every process before anything else;
`jax.devices()` then lists the devices of all hosts and the same mesh spans them, each process
feeding its own slice of the batch (`jax.make_array_from_process_local_data`). Only the
single-host case is tested here.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh


def data_mesh(devices=None) -> Mesh:
  """A Mesh with one axis, "data", over `devices` (default: all devices)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), ("data",))
