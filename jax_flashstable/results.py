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


def format_meta(meta: dict | None) -> str:
  """The header of a markdown results file: the command that made it (`command`, as typed),
  then its other single-valued facts on one line ("date: … · device: … · jax: …"); the parsed
  arguments (`args`) and every list or mapping (bench's targets, hashes, …) stay whole in the
  JSON beside it."""
  meta = meta or {}
  scalar = (str, int, float, bool)
  facts = format_facts(
    {k: v for k, v in meta.items() if k not in ("command", "args") and isinstance(v, scalar)}
  )
  command = f"Command: `{meta['command']}`" if meta.get("command") else ""
  return "\n\n".join(part for part in (command, facts) if part)


def format_facts(facts: dict) -> str:
  """One line of `key: value` facts joined by " · " (a list or mapping as compact JSON)."""
  show = lambda v: v if isinstance(v, str) else json.dumps(v, default=str)  # noqa: E731
  return " · ".join(f"{k}: {show(v)}" for k, v in facts.items())


def write_results(out_dir, name, rows, table, meta) -> None:
  """out_dir/name.json ({meta, rows}) and out_dir/name.md (`format_meta` + table); prints
  the markdown."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
    f.write(f"# {name}\n\n{format_meta(meta)}\n\n{table}\n")
  print(format_meta(meta) + "\n")
  print(table)
  print(f"\n{name}: {out_dir}/{name}.md, {out_dir}/{name}.json")
