"""Data: the GPT-2 tokenizer (offline), nanoGPT `.bin` token files, reproducible batches.

- Tokenizer: tiktoken's GPT-2 BPE (`r50k_base`) built from the vocabulary file shipped in
  `jax_flashstable/assets/gpt2.tiktoken`; nothing is downloaded.
- Token files: raw little-endian uint16 ids (nanoGPT's `train.bin`/`val.bin`), read through a
  NumPy memmap. A `.bin.xz` file is decompressed once into a cache folder
  (`$FLASHSTABLE_CACHE`, default `~/.cache/jax_flashstable`).
- A data folder holds `train.bin[.xz]` and `val.bin[.xz]`; a folder of text files
  (.txt/.md/.rst) is tokenized once into the cache (`prepare_text_folder`).
- Batches: window starts drawn from NumPy's generator seeded by (seed, step), so a batch depends
  on nothing but its step: resuming needs only the step number.
"""

from __future__ import annotations

import hashlib
import lzma
import numbers
import os
import pathlib
import shutil
import warnings

import numpy as np

ASSETS = pathlib.Path(__file__).parents[1] / "assets"
SAMPLE_DIR = ASSETS / "sample"
EOT = 50256
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
TEXT_SUFFIXES = (".txt", ".md", ".rst")


def cache_dir() -> pathlib.Path:
  d = pathlib.Path(
    os.environ.get("FLASHSTABLE_CACHE", pathlib.Path.home() / ".cache" / "jax_flashstable")
  )
  d.mkdir(parents=True, exist_ok=True)
  return d


def gpt2_encoding():
  """tiktoken GPT-2 encoding from the shipped vocabulary file (no network)."""
  import tiktoken
  import tiktoken.load
  from tiktoken_ext.openai_public import r50k_pat_str

  ranks = tiktoken.load.load_tiktoken_bpe(
    str(ASSETS / "gpt2.tiktoken"), expected_hash=GPT2_TIKTOKEN_SHA256
  )
  return tiktoken.Encoding(
    name="gpt2",
    pat_str=r50k_pat_str,
    mergeable_ranks=ranks,
    special_tokens={"<|endoftext|>": EOT},
    explicit_n_vocab=50257,
  )


def _decompressed(path: pathlib.Path) -> pathlib.Path:
  """The cached .bin for a .bin.xz (decompressed once, keyed by path, size and mtime)."""
  st = path.stat()
  key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
  out = cache_dir() / f"{path.name[:-3]}.{key}"
  if not out.exists():
    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # concurrent processes may race here
    try:
      with lzma.open(path) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    except lzma.LZMAError as e:
      tmp.unlink(missing_ok=True)
      raise ValueError(f"{path} is not a valid .xz file: {e}") from e
    tmp.replace(out)
  return out


CHECK_CHUNK = 1 << 24  # tokens per vectorised max when a file is checked (32 MiB)


def load_tokens(path, vocab_size=50304) -> np.ndarray:
  """A read-only uint16 memmap of a nanoGPT token file (`.bin` or `.bin.xz`), every id of it
  checked against vocab_size once, here (a vectorised max per 16M-token chunk).

  Raises:
    FileNotFoundError: a missing file.
    ValueError: an empty file, an odd byte count (not uint16), or an id ≥ vocab_size (naming
      the first such position and its value).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"token file not found: {path}")
  raw = _decompressed(path) if path.suffix == ".xz" else path
  size = raw.stat().st_size
  if size == 0 or size % 2:
    raise ValueError(f"{path} is not a uint16 token file ({size} bytes)")
  tokens = np.memmap(raw, dtype=np.uint16, mode="r")
  for begin in range(0, len(tokens), CHECK_CHUNK):
    chunk = tokens[begin : begin + CHECK_CHUNK]
    if chunk.max() >= vocab_size:
      at = begin + int(np.argmax(chunk >= vocab_size))
      raise ValueError(
        f"{path} holds token id {int(tokens[at])} at position {at:,} (the first "
        f"id ≥ vocab_size={vocab_size}; {len(tokens):,} tokens)"
      )
  return tokens


def _find(folder: pathlib.Path, split: str) -> pathlib.Path | None:
  for name in (f"{split}.bin", f"{split}.bin.xz"):
    if (folder / name).is_file():
      return folder / name
  return None


def prepare_text_folder(src, out_dir, val_every=100) -> dict:
  """Tokenizes every .txt/.md/.rst file under `src` into `out_dir/{train,val}.bin`.

  Documents are taken in sorted path order, encoded with `encode_ordinary` and followed by
  one EOT; document i goes to val when i % val_every == 0 (as the shared corpus). Returns counts.

  Raises:
    FileNotFoundError: `src` does not exist.
    ValueError: `src` is not a folder or holds no text files, or files that leave a split
      empty; val_every < 1; `out_dir` holds a train.bin or val.bin already (not overwritten).
  """
  if not str(src).strip():
    raise ValueError("the text folder is an empty string")
  src, out_dir = pathlib.Path(src), pathlib.Path(out_dir)
  if held := [f"{x}.bin" for x in ("train", "val") if (out_dir / f"{x}.bin").exists()]:
    raise ValueError(
      f"{out_dir} holds {' and '.join(held)} already; to prepare another corpus, use another "
      "folder or remove them"
    )
  if not src.exists():
    raise FileNotFoundError(f"text folder not found: {src}")
  if not src.is_dir():
    raise ValueError(f"{src} is a file, not a folder of {'/'.join(TEXT_SUFFIXES)} files")
  # `checks.integer`'s rule, spelled here: the PyTorch twin loads this module with NumPy alone
  if isinstance(val_every, bool) or not isinstance(val_every, numbers.Integral) or val_every < 1:
    raise ValueError(f"val_every={val_every!r} must be an integer ≥ 1")
  if val_every > 2**63 - 1:
    raise ValueError(f"val_every={val_every!r} must be an integer below 2**63")
  val_every = int(val_every)
  files = sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
  if not files:
    raise ValueError(f"no {'/'.join(TEXT_SUFFIXES)} files under {src}")
  enc = gpt2_encoding()
  splits = {"train": [], "val": []}
  for i, p in enumerate(files):
    ids = enc.encode_ordinary(p.read_text(encoding="utf-8", errors="replace")) + [EOT]
    splits["val" if i % val_every == 0 and len(files) > 1 else "train"].append(
      np.asarray(ids, np.uint16)
    )
  if empty := [x for x, parts in splits.items() if not parts]:
    raise ValueError(
      f"{len(files)} text file{'s' * (len(files) > 1)} under {src} with val_every={val_every} "
      f"leave {empty[0]}.bin empty (file i goes to val when i % val_every == 0; at least two "
      "files)"
    )
  out_dir.mkdir(parents=True, exist_ok=True)
  counts = {}
  for split in ("val", "train"):  # each file whole or not at all; train.bin last (`_find`)
    parts = splits[split]
    arr = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    arr.astype("<u2").tofile(out_dir / f"{split}.bin.tmp")
    os.replace(out_dir / f"{split}.bin.tmp", out_dir / f"{split}.bin")
    counts[split] = int(arr.size)
  return counts


def _holds_texts(folder: pathlib.Path) -> bool:
  return any(p.suffix in TEXT_SUFFIXES for p in folder.rglob("*"))


def holds_data(folder) -> bool:
  """Whether the folder holds a corpus `resolve_data_dir` takes: train.bin[.xz] or text files
  (`TrainConfig.validate` asks before anything is written)."""
  folder = pathlib.Path(folder)
  return _find(folder, "train") is not None or _holds_texts(folder)


def resolve_data_dir(data) -> pathlib.Path:
  """None → the embedded sample; a folder with train/val .bin[.xz] → itself; a folder of text
  files → its tokenized copy in the cache."""
  if data is None:
    return SAMPLE_DIR
  folder = pathlib.Path(data)
  if not folder.is_dir():
    raise FileNotFoundError(f"data folder not found: {folder}")
  if _find(folder, "train") is not None:
    return folder
  if _holds_texts(folder):
    stamp = "".join(
      f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns};"
      for p in sorted(folder.rglob("*"))
      if p.is_file() and p.suffix in TEXT_SUFFIXES
    )
    key = hashlib.sha256(f"{folder.resolve()}|{stamp}".encode()).hexdigest()[:16]
    out = cache_dir() / f"text-{key}"
    if _find(out, "train") is None:
      shutil.rmtree(out, ignore_errors=True)  # our cache, cut short: made again
      prepare_text_folder(folder, out)
    return out
  raise FileNotFoundError(f"{folder} holds neither train.bin[.xz] nor text files")


class Dataset:
  """train/val token arrays of a data folder and reproducible batches from them."""

  def __init__(self, data=None, vocab_size=50304):
    folder = resolve_data_dir(data)
    self.folder = folder
    train, val = _find(folder, "train"), _find(folder, "val")
    if train is None:
      raise FileNotFoundError(f"no train.bin[.xz] in {folder}")
    self.train = load_tokens(train, vocab_size)
    if val is None:
      warnings.warn(f"no val.bin[.xz] in {folder}: validation losses use the training tokens")
    self.val = load_tokens(val, vocab_size) if val is not None else self.train

  def batch(self, split, seed, step, batch_size, seq_len):
    """(x, y) int32 [batch_size, seq_len]: windows whose starts depend only on (seed, step).

    Starts are drawn from [0, n − seq_len − 1), n the split's tokens: the last start (whose
    target is the split's last token) is never drawn, so a split needs seq_len + 2 tokens.
    nanoGPT draws from [0, n − seq_len); this sampler is kept as it is because every stored
    run, and the PyTorch twin's batches (`torch_crosscheck`), were drawn by it."""
    tokens = self.train if split == "train" else self.val
    if len(tokens) <= seq_len + 1:
      raise ValueError(
        f"{split} split has {len(tokens)} tokens, too few for seq_len={seq_len} "
        f"(at least {seq_len + 2})"
      )
    rng = np.random.default_rng([seed, step, 0 if split == "train" else 1])
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
    idx = starts[:, None] + np.arange(seq_len + 1)[None]
    w = np.asarray(tokens[idx], np.int32)
    return w[:, :-1], w[:, 1:]
