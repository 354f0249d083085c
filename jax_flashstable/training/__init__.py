"""Training GPT-2 with Optax (`train`), its data (`data`), in-step diagnostics (`diagnostics`), data parallelism (`parallel`) and run plots (`plot`)."""
