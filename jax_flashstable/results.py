"""Writing measured results: one JSON (rows + metadata) and one markdown table per benchmark."""

from __future__ import annotations

import datetime
import json
import os


def run_meta(**extra) -> dict:
  """Date, device and JAX version of this run, plus `extra`."""
  import jax

  dev = jax.devices()[0]
  return dict(
    date=datetime.date.today().isoformat(),
    device=getattr(dev, "device_kind", dev.platform),
    jax=jax.__version__,
    **extra,
  )


def write_results(out_dir, name, rows, table, meta) -> None:
  """out_dir/name.json ({meta, rows}) and out_dir/name.md (meta + table); prints the table."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
    f.write(f"# {name}\n\n{json.dumps(meta)}\n\n{table}\n")
  print(json.dumps(meta))
  print(table)
  print(f"\n{name}: {out_dir}/{name}.md, {out_dir}/{name}.json")
