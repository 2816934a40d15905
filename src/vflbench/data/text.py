"""Text datasets in their published formats: TREC question classification and AG News.

Tokenisation is deliberately simple: lowercase, then tokens are the maximal runs of Unicode
letters and digits (everything else, punctuation and ``_`` included, separates tokens). The
vocabulary is built from the training split only: index 0 is padding, 1 is unknown, then the
tokens seen at least ``min_freq`` times in order of decreasing frequency (ties alphabetical).
Each text keeps its first ``max_len`` tokens and is right-padded with 0 to an int64 row.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch

from vflbench.data.base import Dataset
from vflbench.data.files import require_files
from vflbench.data.registry import DATASETS
from vflbench.errors import DataError

PAD, UNK = 0, 1
SPECIAL_TOKENS = ("<pad>", "<unk>")
_TOKEN = re.compile(r"[^\W_]+")

TREC_FOLDER = "trec"
TREC_FILES = ("train_5500.label", "TREC_10.label")
TREC_SHA256 = {
    "train_5500.label": "9e4c8bdcaffb96ed61041bd64b564183d52793a8e91d84fc3a8646885f466ec3",
    "TREC_10.label": "033f22c028c2bbba9ca682f68ffe204dc1aa6e1cf35dd6207f2d4ca67f0d0e8e",
}
_TREC_SRC = "https://cogcomp.seas.upenn.edu/Data/QA/QC/"
_TREC_LABEL = re.compile(r"^([A-Z]+):(\S+)$")

AG_NEWS_FOLDER = "ag_news"
AG_NEWS_FILES = ("train.csv", "test.csv")
AG_NEWS_CLASSES = ("World", "Sports", "Business", "Sci/Tech")
_AG_NEWS_SRC = "ag_news_csv.tar.gz by Zhang, Zhao & LeCun (2015), character-level CNNs"


def tokenize(text: str) -> list[str]:
    """Lowercase ``text`` and split it into runs of letters and digits."""
    return _TOKEN.findall(text.lower())


def build_vocab(texts: Sequence[list[str]], *, min_freq: int = 1) -> tuple[str, ...]:
    """Vocabulary of tokenised texts: pad, unk, then tokens by decreasing frequency."""
    counts = Counter(tok for toks in texts for tok in toks)
    kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
    return SPECIAL_TOKENS + tuple(kept)


def encode(texts: Sequence[list[str]], vocab: Sequence[str], *, max_len: int) -> torch.Tensor:
    """Token ids (N, max_len) int64: truncated to ``max_len``, unknown -> 1, padded with 0."""
    lengths = np.fromiter((min(len(toks), max_len) for toks in texts), dtype=np.int64, count=len(texts))
    flat = [tok for toks in texts for tok in toks[:max_len]]
    ids = pd.Index(vocab).get_indexer(flat).astype(np.int64)  # -1 where unknown
    ids[ids < 0] = UNK
    rows = np.repeat(np.arange(len(texts)), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out = np.full((len(texts), max_len), PAD, dtype=np.int64)
    out[rows, cols] = ids
    return torch.from_numpy(out)


def _check_sizes(name: str, max_len: int, min_freq: int) -> None:
    for option, value in (("max_len", max_len), ("min_freq", min_freq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"{name}: {option} must be a positive integer, got {value!r}")


def _text_dataset(
    name: str,
    train: tuple[list[str], list[str]],
    test: tuple[list[str], list[str]],
    classes: Sequence[str],
    *,
    max_len: int,
    min_freq: int,
) -> Dataset:
    """Tokenise, build the train-only vocabulary, and encode both splits."""
    index = {c: i for i, c in enumerate(classes)}
    tok_tr = [tokenize(t) for t in train[0]]
    tok_te = [tokenize(t) for t in test[0]]
    vocab = build_vocab(tok_tr, min_freq=min_freq)
    return Dataset(
        name=name,
        kind="text",
        x_train=encode(tok_tr, vocab, max_len=max_len),
        y_train=torch.tensor([index[c] for c in train[1]], dtype=torch.long),
        x_test=encode(tok_te, vocab, max_len=max_len),
        y_test=torch.tensor([index[c] for c in test[1]], dtype=torch.long),
        num_classes=len(classes),
        meta={"vocab_size": len(vocab), "vocab": vocab, "max_len": max_len, "classes": tuple(classes)},
    )


def read_trec(path: Path, *, fine: bool) -> tuple[list[str], list[str]]:
    """Questions and labels of a TREC ``.label`` file (latin-1, ``COARSE:fine question``).

    Labels are the coarse class (``HUM``) or, with ``fine``, the full ``COARSE:fine`` pair
    (fine names such as ``other`` recur under several coarse classes).
    """
    texts: list[str] = []
    labels: list[str] = []
    with path.open(encoding="latin-1") as fh:
        for number, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            head, _, question = line.partition(" ")
            match = _TREC_LABEL.match(head)
            if match is None:
                raise DataError(f"{path}, line {number}: expected 'COARSE:fine question...', got {line[:60]!r}")
            labels.append(head if fine else match.group(1))
            texts.append(question)
    return texts, labels


@DATASETS.register(
    "trec",
    summary="TREC question classification (Li & Roth), 5,452/500, 6 coarse or 50 fine classes",
    kind="text",
    folder=TREC_FOLDER,
    files=TREC_FILES,
    sha256=TREC_SHA256,
    source=_TREC_SRC,
)
def load_trec(
    *,
    root: Path | None = None,
    labels: Literal["coarse", "fine"] = "coarse",
    max_len: int = 32,
    min_freq: int = 1,
    verify: bool = True,
) -> Dataset:
    """TREC questions from ``train_5500.label`` (train) and ``TREC_10.label`` (test).

    ``labels``: ``"coarse"`` (6 classes) or ``"fine"`` (``COARSE:fine``, 50 classes); class
    indices follow the sorted label names of the training file (``meta["classes"]``).
    ``verify`` checks the files' SHA-256.
    """
    if labels not in ("coarse", "fine"):
        raise DataError(f"trec: labels must be 'coarse' or 'fine', got {labels!r}")
    _check_sizes("trec", max_len, min_freq)
    base = require_files(
        "trec", root, TREC_FOLDER, TREC_FILES, sha256=TREC_SHA256 if verify else None, source=_TREC_SRC
    )
    train = read_trec(base / TREC_FILES[0], fine=labels == "fine")
    test = read_trec(base / TREC_FILES[1], fine=labels == "fine")
    classes = sorted(set(train[1]))
    unseen = sorted(set(test[1]) - set(classes))
    if unseen:
        raise DataError(f"trec: {base / TREC_FILES[1]} has labels {unseen} that never occur in {base / TREC_FILES[0]}")
    return _text_dataset("trec", train, test, classes, max_len=max_len, min_freq=min_freq)


def read_ag_news(path: Path, *, max_rows: int | None) -> tuple[list[str], list[str]]:
    """Texts (title + " " + description) and class names of an AG News ``.csv`` file."""
    try:
        df = pd.read_csv(
            path, header=None, dtype=str, keep_default_na=False, na_filter=False, nrows=max_rows, encoding="utf-8"
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"ag_news: cannot parse {path}: {exc}") from None
    if df.shape[1] != 3:
        raise DataError(
            f"ag_news: {path} must have 3 quoted columns (class index 1-4, title, description); found {df.shape[1]}"
        )
    names = {str(i + 1): c for i, c in enumerate(AG_NEWS_CLASSES)}
    bad = sorted(set(df[0]) - set(names))
    if bad:
        raise DataError(f"ag_news: {path}: the class index must be 1-4, found {bad[:5]}")
    texts = (df[1] + " " + df[2]).tolist()
    return texts, [names[c] for c in df[0]]


@DATASETS.register(
    "ag_news",
    summary="AG News topics (ag_news_csv), 120,000/7,600, 4 classes",
    kind="text",
    folder=AG_NEWS_FOLDER,
    files=AG_NEWS_FILES,
    source=_AG_NEWS_SRC,
)
def load_ag_news(
    *, root: Path | None = None, max_len: int = 64, min_freq: int = 1, max_rows: int | None = None
) -> Dataset:
    """AG News from ``train.csv``/``test.csv`` (rows ``"class","title","description"``).

    Class index 1-4 (World, Sports, Business, Sci/Tech) -> 0-3; the text is title + " " +
    description. ``max_rows`` reads only the first rows of each file.
    """
    _check_sizes("ag_news", max_len, min_freq)
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise DataError(f"ag_news: max_rows must be a positive integer or null, got {max_rows!r}")
    base = require_files("ag_news", root, AG_NEWS_FOLDER, AG_NEWS_FILES, source=_AG_NEWS_SRC)
    train = read_ag_news(base / AG_NEWS_FILES[0], max_rows=max_rows)
    test = read_ag_news(base / AG_NEWS_FILES[1], max_rows=max_rows)
    return _text_dataset("ag_news", train, test, AG_NEWS_CLASSES, max_len=max_len, min_freq=min_freq)
