"""Tokenizer (offline), token files, text folders, reproducible batches, clear errors."""

import lzma

import numpy as np
import pytest

from jax_flashstable.training import data as data_module
from jax_flashstable.training.data import Dataset, gpt2_encoding, load_tokens, prepare_text_folder


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("FLASHSTABLE_CACHE", str(tmp_path / "cache"))


def test_tokenizer_is_gpt2_and_offline():
  enc = gpt2_encoding()
  assert enc.encode_ordinary("Hello world") == [15496, 995]
  assert enc.n_vocab == 50257


def test_embedded_sample_is_real_text():
  d = Dataset()
  assert len(d.train) == 615_863 and len(d.val) == 38_785
  text = gpt2_encoding().decode(np.asarray(d.train[:400]).tolist())
  assert "Python" in text and "documentation" in text


def test_batches_depend_only_on_seed_and_step():
  d = Dataset()
  x1, y1 = d.batch("train", 3, 17, 4, 32)
  x2, y2 = d.batch("train", 3, 17, 4, 32)
  x3, _ = d.batch("train", 3, 18, 4, 32)
  assert x1.shape == (4, 32) and x1.dtype == np.int32
  np.testing.assert_array_equal(x1, x2)
  np.testing.assert_array_equal(x1[:, 1:], y1[:, :-1])
  assert not np.array_equal(x1, x3)


def test_xz_decompressed_once_into_cache(tmp_path):
  tokens = np.arange(1000, dtype="<u2")
  (tmp_path / "train.bin.xz").write_bytes(lzma.compress(tokens.tobytes()))
  a = load_tokens(tmp_path / "train.bin.xz")
  np.testing.assert_array_equal(a, tokens)
  cached = list((tmp_path / "cache").iterdir())
  assert len(cached) == 1
  load_tokens(tmp_path / "train.bin.xz")
  assert list((tmp_path / "cache").iterdir()) == cached


def test_text_folder_is_tokenized(tmp_path):
  src = tmp_path / "texts"
  src.mkdir()
  for i in range(3):
    (src / f"doc{i}.txt").write_text(f"Document number {i}. " * 50)
  counts = prepare_text_folder(src, tmp_path / "bin", val_every=2)
  assert counts["train"] > 0 and counts["val"] > 0
  d = Dataset(str(src))  # a text folder works directly
  assert gpt2_encoding().decode(np.asarray(d.train[:5]).tolist()).startswith("Document number 1")
  assert d.val[-1] == data_module.EOT


def test_missing_and_malformed_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    Dataset(str(tmp_path / "nowhere"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="neither"):
    Dataset(str(tmp_path / "empty"))
  (tmp_path / "odd.bin").write_bytes(b"abc")
  with pytest.raises(ValueError, match="3 bytes"):
    load_tokens(tmp_path / "odd.bin")
  np.full(10, 60000, "<u2").tofile(tmp_path / "big.bin")
  with pytest.raises(ValueError, match="60000"):
    load_tokens(tmp_path / "big.bin")
  (tmp_path / "bad.bin.xz").write_bytes(b"not xz at all")
  with pytest.raises(ValueError, match="not a valid .xz"):
    load_tokens(tmp_path / "bad.bin.xz")
  np.arange(10, dtype="<u2").tofile(tmp_path / "short.bin")
  d = Dataset.__new__(Dataset)
  d.train = d.val = load_tokens(tmp_path / "short.bin")
  with pytest.raises(ValueError, match="too few"):
    d.batch("train", 0, 0, 2, 32)


def test_an_id_beyond_the_vocabulary_anywhere_is_named(tmp_path, monkeypatch):
  """The whole file is checked when it is opened (not only its first and last 64k tokens): the
  first offending position and its value are named."""
  tokens = np.zeros(300_000, "<u2")
  tokens[150_000], tokens[200_000] = 50_400, 60_000  # mid-file, two of them
  tokens.tofile(tmp_path / "mid.bin")
  with pytest.raises(
    ValueError,
    match=r"token id 50400 at position 150,000 \(the first id ≥ "
    r"vocab_size=50304; 300,000 tokens\)",
  ):
    load_tokens(tmp_path / "mid.bin")
  monkeypatch.setattr(data_module, "CHECK_CHUNK", 4096)  # a file of many checking chunks
  with pytest.raises(ValueError, match="at position 150,000"):
    load_tokens(tmp_path / "mid.bin")
  assert load_tokens(tmp_path / "mid.bin", vocab_size=60_001)[200_000] == 60_000


def test_prepare_names_a_missing_folder(tmp_path):
  with pytest.raises(FileNotFoundError, match="text folder not found: .*nonexistent"):
    prepare_text_folder(tmp_path / "nonexistent", tmp_path / "out")
  (tmp_path / "a.txt").write_text("x")
  with pytest.raises(ValueError, match="is a file, not a folder"):
    prepare_text_folder(tmp_path / "a.txt", tmp_path / "out")
  with pytest.raises(ValueError, match="val_every=0"):
    prepare_text_folder(tmp_path, tmp_path / "out", val_every=0)
  with pytest.raises(ValueError, match="the text folder is an empty string"):
    prepare_text_folder("", tmp_path / "out")  # (not the working directory)
  # one file: no val split (file 0 goes to val only when there are others); val_every=1: no
  # train split. Both refused, not written empty
  (tmp_path / "one").mkdir()
  (tmp_path / "one" / "a.txt").write_text("a document")
  with pytest.raises(ValueError, match=r"^1 text file under .*one .* leave val.bin empty"):
    prepare_text_folder(tmp_path / "one", tmp_path / "out")
  (tmp_path / "one" / "b.txt").write_text("another")
  with pytest.raises(ValueError, match=r"^2 text files .* val_every=1 leave train.bin empty"):
    prepare_text_folder(tmp_path / "one", tmp_path / "out", val_every=1)
  assert not (tmp_path / "out").exists()
  counts = prepare_text_folder(tmp_path / "one", tmp_path / "out")
  assert counts["train"] > 0 and counts["val"] > 0
  before = (tmp_path / "out" / "train.bin").read_bytes()
  with pytest.raises(ValueError, match=r"out holds train.bin and val.bin already"):
    prepare_text_folder(tmp_path / "texts-elsewhere", tmp_path / "out")
  assert (tmp_path / "out" / "train.bin").read_bytes() == before  # not overwritten
