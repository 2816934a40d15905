"""Tabular datasets in their published formats: UCI credit default, bank marketing, RT-IoT2022,
Criteo (Display Advertising Challenge sample), and any CSV file.

None of these files comes with an official train/test split, so each loader makes the same
seeded stratified split as the embedded datasets (``SPLIT_SEED``; ``test_fraction`` of the
rows, 20% by default, go to the test set). String columns become ordinal codes: code ``i`` is
the ``i``-th value of the column's sorted list of distinct values (over the whole file), kept
in ``meta["categories"]``. Such codes are ordinary numeric features (they are standardised at
partitioning); only Criteo's hashed categorical columns are listed in ``meta["categorical"]``
for embedding models.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflbench.data.base import Dataset
from vflbench.data.embedded import _split
from vflbench.data.files import require_files
from vflbench.data.registry import DATASETS, SPLIT
from vflbench.errors import DataError

log = logging.getLogger(__name__)

CREDIT_FOLDER = "uci_credit_default"
CREDIT_FILE = "UCI_Credit_Card.csv"
CREDIT_SHA256 = {CREDIT_FILE: "a0f0ab49d6326671d6cd83be5c88dcf18007025fe9a53ecd699119c871176ca1"}
CREDIT_FEATURES = (
    "LIMIT_BAL",
    "SEX",
    "EDUCATION",
    "MARRIAGE",
    "AGE",
    "PAY_0",
    "PAY_2",
    "PAY_3",
    "PAY_4",
    "PAY_5",
    "PAY_6",
    "BILL_AMT1",
    "BILL_AMT2",
    "BILL_AMT3",
    "BILL_AMT4",
    "BILL_AMT5",
    "BILL_AMT6",
    "PAY_AMT1",
    "PAY_AMT2",
    "PAY_AMT3",
    "PAY_AMT4",
    "PAY_AMT5",
    "PAY_AMT6",
)
CREDIT_LABEL = "default.payment.next.month"
_CREDIT_SRC = (
    "the Kaggle CSV conversion of UCI dataset 350, "
    "https://archive.ics.uci.edu/dataset/350/default+of+credit+card+clients"
)

BANK_FOLDER = "bank_marketing"
BANK_FILE = "bank-full.csv"
BANK_FEATURES = (
    "age",
    "job",
    "marital",
    "education",
    "default",
    "balance",
    "housing",
    "loan",
    "contact",
    "day",
    "month",
    "duration",
    "campaign",
    "pdays",
    "previous",
    "poutcome",
)
BANK_CATEGORICAL = ("job", "marital", "education", "default", "housing", "loan", "contact", "month", "poutcome")
BANK_LABEL = "y"
_BANK_SRC = "https://archive.ics.uci.edu/dataset/222/bank+marketing"

RT_IOT_FOLDER = "rt_iot2022"
RT_IOT_FILE = "RT_IOT2022.csv"
RT_IOT_LABEL = "Attack_type"
RT_IOT_NUM_FEATURES = 83
_RT_IOT_SRC = "https://archive.ics.uci.edu/dataset/942/rt-iot2022"

CRITEO_FOLDER = "criteo"
CRITEO_FILE = "dac_sample.txt"
CRITEO_INT = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CAT = tuple(f"C{i}" for i in range(1, 27))
_CRITEO_SRC = "Criteo AI Lab as dac_sample.tar.gz, the Display Advertising Challenge sample"


def _read_csv(name: str, path: Path, **kwargs: Any) -> pd.DataFrame:
    """``pandas.read_csv`` with parse failures turned into a :class:`DataError` naming the file."""
    try:
        return pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{name}: cannot parse {path}: {exc}") from None


def _check_columns(name: str, path: Path, df: pd.DataFrame, expected: Sequence[str]) -> None:
    """Raise unless the file's columns are exactly ``expected``, in order."""
    found = [str(c) for c in df.columns]
    if found != list(expected):
        raise DataError(
            f"{name}: {path} has the columns {found}; expected exactly {list(expected)} (the published layout)."
        )


def _ordinal(values: pd.Series) -> tuple[np.ndarray, tuple[str, ...]]:
    """Ordinal codes of a string column over its sorted distinct values (missing -> "")."""
    text = values.fillna("").astype(str)
    categories = tuple(sorted(set(text)))
    codes = pd.Categorical(text, categories=categories).codes.astype(np.float64)
    return codes, categories


def _encode_features(
    name: str,
    path: Path,
    df: pd.DataFrame,
) -> tuple[np.ndarray, dict[str, tuple[str, ...]]]:
    """Float64 matrix of ``df``: numeric columns as they are, string columns as ordinal codes."""
    columns: list[np.ndarray] = []
    categories: dict[str, tuple[str, ...]] = {}
    bad: list[str] = []
    for col in df.columns:
        series = df[col]
        if pd.api.types.is_bool_dtype(series) or pd.api.types.is_numeric_dtype(series):
            values = series.to_numpy(dtype=np.float64)
            if not np.isfinite(values).all():
                bad.append(f"{col} ({int((~np.isfinite(values)).sum())} rows)")
            columns.append(values)
        else:
            codes, cats = _ordinal(series)
            categories[str(col)] = cats
            columns.append(codes)
    if bad:
        raise DataError(
            f"{name}: {path} has missing or non-finite values in the numeric "
            f"columns {', '.join(bad)}; fill or drop those rows first."
        )
    x = np.stack(columns, axis=1) if columns else np.zeros((len(df), 0))
    return x, categories


def _class_indices(name: str, path: Path, labels: pd.Series) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map a label column to indices over its sorted distinct values."""
    if labels.isna().any():
        raise DataError(
            f"{name}: the label column {labels.name!r} of {path} has {int(labels.isna().sum())} missing values"
        )
    classes, y = np.unique(labels.to_numpy(), return_inverse=True)
    return y.astype(np.int64), tuple(str(c) for c in classes)


def _split_checked(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    *,
    test_fraction: float,
    feature_names: tuple[str, ...],
    meta: dict[str, Any],
) -> Dataset:
    """Seeded stratified split (as the embedded datasets), with meta, errors as DataError."""
    counts = np.bincount(y) if len(y) else np.zeros(0, dtype=np.int64)
    if len(y) < 2 or (counts[counts > 0] < 2).any():
        raise DataError(
            f"{name}: a stratified train/test split needs at least 2 rows of every "
            f"class; the class counts are {counts.tolist()}"
        )
    try:
        ds = _split(name, "tabular", x, y, test_fraction=test_fraction, feature_names=feature_names)
    except ValueError as exc:
        raise DataError(f"{name}: cannot split {len(y)} rows with test_fraction={test_fraction}: {exc}") from None
    return replace(ds, meta=meta)


@DATASETS.register(
    "credit_default",
    constraints=SPLIT,
    summary="UCI default of credit card clients (CSV), 30,000 rows, 23 features, binary",
    kind="tabular",
    folder=CREDIT_FOLDER,
    files=(CREDIT_FILE,),
    sha256=CREDIT_SHA256,
    source=_CREDIT_SRC,
)
def load_credit_default(*, root: Path | None = None, test_fraction: float = 0.2, verify: bool = True) -> Dataset:
    """UCI "Default of Credit Card Clients" from ``UCI_Credit_Card.csv``.

    Drops ``ID``; the 23 features ``LIMIT_BAL`` ... ``PAY_AMT6`` stay in file order; the
    label is ``default.payment.next.month`` (1 = default). ``verify`` checks the file's SHA-256.
    """
    base = require_files(
        "credit_default",
        root,
        CREDIT_FOLDER,
        (CREDIT_FILE,),
        sha256=CREDIT_SHA256 if verify else None,
        source=_CREDIT_SRC,
    )
    path = base / CREDIT_FILE
    df = _read_csv("credit_default", path)
    _check_columns("credit_default", path, df, ("ID", *CREDIT_FEATURES, CREDIT_LABEL))
    y = df[CREDIT_LABEL].to_numpy()
    if not np.isin(y, (0, 1)).all():
        raise DataError(
            f"credit_default: {path}: {CREDIT_LABEL} must be 0 or 1, found {sorted(set(y.tolist()) - {0, 1})[:5]}"
        )
    x, _ = _encode_features("credit_default", path, df[list(CREDIT_FEATURES)])
    return _split_checked(
        "credit_default",
        x,
        y.astype(np.int64),
        test_fraction=test_fraction,
        feature_names=CREDIT_FEATURES,
        meta={"classes": ("no default", "default")},
    )


@DATASETS.register(
    "bank_marketing",
    constraints=SPLIT,
    summary="UCI bank marketing (bank-full.csv), 45,211 rows, 16 features, binary",
    kind="tabular",
    folder=BANK_FOLDER,
    files=(BANK_FILE,),
    source=_BANK_SRC,
)
def load_bank_marketing(*, root: Path | None = None, test_fraction: float = 0.2) -> Dataset:
    """UCI Bank Marketing from ``bank-full.csv`` (``;``-separated, quoted strings).

    The 16 features keep file order. The categorical columns (job, marital, education, default,
    housing, loan, contact, month, poutcome) become ordinal codes over each column's sorted
    distinct values (so ``month`` is alphabetical, ``apr`` = 0), listed in
    ``meta["categories"]``. Label ``y``: ``no`` = 0, ``yes`` = 1.
    """
    base = require_files("bank_marketing", root, BANK_FOLDER, (BANK_FILE,), source=_BANK_SRC)
    path = base / BANK_FILE
    df = _read_csv("bank_marketing", path, sep=";")
    _check_columns("bank_marketing", path, df, (*BANK_FEATURES, BANK_LABEL))
    labels = df[BANK_LABEL].astype(str)
    unknown = sorted(set(labels) - {"no", "yes"})
    if unknown:
        raise DataError(f"bank_marketing: {path}: y must be 'yes' or 'no', found {unknown[:5]}")
    frame = df[list(BANK_FEATURES)].copy()
    for col in BANK_CATEGORICAL:
        frame[col] = frame[col].astype(str)
    x, categories = _encode_features("bank_marketing", path, frame)
    return _split_checked(
        "bank_marketing",
        x,
        (labels == "yes").to_numpy(dtype=np.int64),
        test_fraction=test_fraction,
        feature_names=BANK_FEATURES,
        meta={"categories": categories, "classes": ("no", "yes")},
    )


@DATASETS.register(
    "rt_iot2022",
    constraints=SPLIT,
    summary="RT-IoT2022 network flows (CSV), 123,117 rows, 83 features, 12 classes",
    kind="tabular",
    folder=RT_IOT_FOLDER,
    files=(RT_IOT_FILE,),
    source=_RT_IOT_SRC,
)
def load_rt_iot2022(*, root: Path | None = None, test_fraction: float = 0.2) -> Dataset:
    """RT-IoT2022 from ``RT_IOT2022.csv`` (unnamed index column, 83 features, ``Attack_type``).

    The string columns ``proto`` and ``service`` become ordinal codes over their sorted
    distinct values (``meta["categories"]``); ``Attack_type`` values map to class indices in
    sorted order (``meta["classes"]``).
    """
    base = require_files("rt_iot2022", root, RT_IOT_FOLDER, (RT_IOT_FILE,), source=_RT_IOT_SRC)
    path = base / RT_IOT_FILE
    df = _read_csv("rt_iot2022", path, index_col=0)
    if RT_IOT_LABEL not in df.columns:
        raise DataError(
            f"rt_iot2022: {path} has no label column {RT_IOT_LABEL!r}; its columns are {[str(c) for c in df.columns]}"
        )
    features = df.drop(columns=[RT_IOT_LABEL])
    if features.shape[1] != RT_IOT_NUM_FEATURES:
        raise DataError(
            f"rt_iot2022: {path} has {features.shape[1]} feature columns besides the "
            f"index and {RT_IOT_LABEL!r}; the published file has {RT_IOT_NUM_FEATURES}"
        )
    x, categories = _encode_features("rt_iot2022", path, features)
    y, classes = _class_indices("rt_iot2022", path, df[RT_IOT_LABEL].astype(str))
    return _split_checked(
        "rt_iot2022",
        x,
        y,
        test_fraction=test_fraction,
        feature_names=tuple(str(c) for c in features.columns),
        meta={"categories": categories, "classes": classes},
    )


def _hash_codes(values: np.ndarray, buckets: int) -> np.ndarray:
    """Codes of one Criteo categorical column: 0 if missing, else 1 + crc32(value) % buckets."""
    codes, uniques = pd.factorize(values)
    table = np.array([0 if u == "" else 1 + zlib.crc32(u.encode("utf-8")) % buckets for u in uniques], dtype=np.int64)
    return table[codes] if len(table) else np.zeros(len(values), dtype=np.int64)


def _read_criteo(path: Path, *, max_rows: int | None) -> np.ndarray:
    """The fields of ``dac_sample.txt`` as an (N, 40) array of strings ("" = missing)."""
    n_fields = 1 + len(CRITEO_INT) + len(CRITEO_CAT)
    rows: list[list[str]] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if max_rows is not None and len(rows) >= max_rows:
                    break
                line = line.rstrip("\r\n")
                if not line:
                    continue
                fields = line.split("\t")
                if len(fields) != n_fields:
                    raise DataError(
                        f"criteo: {path}, line {number}: expected {n_fields} "
                        f"tab-separated fields (label, 13 integer, 26 categorical), "
                        f"found {len(fields)}"
                    )
                rows.append(fields)
    except UnicodeDecodeError as exc:
        raise DataError(f"criteo: {path} is not a text file: {exc}") from None
    raw = np.empty((len(rows), n_fields), dtype=object)
    if rows:
        raw[:] = rows
    return raw


@DATASETS.register(
    "criteo",
    constraints=SPLIT,
    summary="Criteo display advertising sample (dac_sample.txt), 100,000 rows, "
    "13 numeric + 26 categorical features, binary",
    kind="tabular",
    folder=CRITEO_FOLDER,
    files=(CRITEO_FILE,),
    source=_CRITEO_SRC,
)
def load_criteo(
    *, root: Path | None = None, hash_buckets: int = 1000, max_rows: int | None = None, test_fraction: float = 0.2
) -> Dataset:
    """Criteo click logs from ``dac_sample.txt`` (tab-separated: label, I1-I13, C1-C26).

    Integer features: missing -> 0, negatives clipped to 0, then ``log(1 + x)``. Categorical
    features (hex strings) are hashed per column: missing -> code 0, else
    ``1 + zlib.crc32(value) % hash_buckets``, so each has cardinality ``hash_buckets + 1``
    (columns 13..38, listed in ``meta["categorical"]`` / ``meta["cardinalities"]``).
    ``max_rows`` reads only the first rows of the file.
    """
    if isinstance(hash_buckets, bool) or not isinstance(hash_buckets, int) or hash_buckets < 1:
        raise DataError(f"criteo: hash_buckets must be a positive integer, got {hash_buckets!r}")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise DataError(f"criteo: max_rows must be a positive integer or null, got {max_rows!r}")
    base = require_files("criteo", root, CRITEO_FOLDER, (CRITEO_FILE,), source=_CRITEO_SRC)
    path = base / CRITEO_FILE
    raw = _read_criteo(path, max_rows=max_rows)
    labels = raw[:, 0]
    if not np.isin(labels, ("0", "1")).all():
        raise DataError(
            f"criteo: {path}: the first field (label) must be 0 or 1, found "
            f"{sorted(set(labels.tolist()) - {'0', '1'})[:5]}"
        )
    ints = np.empty((len(raw), len(CRITEO_INT)), dtype=np.float64)
    for j, col in enumerate(CRITEO_INT):
        field = raw[:, 1 + j]
        try:
            values = np.where(field == "", "0", field).astype(np.int64)
        except (ValueError, OverflowError):
            raise DataError(f"criteo: {path}: integer column {col} (field {2 + j}) holds non-integer values") from None
        ints[:, j] = np.log1p(np.clip(values, 0, None).astype(np.float64))
    cats = (
        np.stack([_hash_codes(raw[:, 1 + len(CRITEO_INT) + j], hash_buckets) for j in range(len(CRITEO_CAT))], axis=1)
        if len(raw)
        else np.zeros((0, len(CRITEO_CAT)), dtype=np.int64)
    )
    x = np.concatenate([ints, cats.astype(np.float64)], axis=1)
    categorical = tuple(range(len(CRITEO_INT), len(CRITEO_INT) + len(CRITEO_CAT)))
    meta = {
        "categorical": categorical,
        "cardinalities": (hash_buckets + 1,) * len(CRITEO_CAT),
        "hash_buckets": hash_buckets,
    }
    return _split_checked(
        "criteo",
        x,
        (labels == "1").astype(np.int64),
        test_fraction=test_fraction,
        feature_names=CRITEO_INT + CRITEO_CAT,
        meta=meta,
    )


@DATASETS.register(
    "csv",
    constraints=SPLIT,
    summary="any CSV file: options path, label, features, sep",
    kind="tabular",
    files=(),
    generic=True,
)
def load_csv(
    *,
    root: Path | None = None,
    path: str | Path | None = None,
    label: str | None = None,
    features: Sequence[str] | None = None,
    sep: str = ",",
    test_fraction: float = 0.2,
) -> Dataset:
    """Any CSV file with a header row: ``label`` names the class column.

    ``path`` is absolute or relative to the datasets root (to the working directory when no
    root is set). ``features`` lists the feature columns (default: every column but the
    label). String feature columns become ordinal codes (``meta["categories"]``); label values
    map to class indices in sorted order (``meta["classes"]``). Numeric features must have no
    missing values.
    """
    if path is None or label is None:
        raise DataError(
            "dataset 'csv' needs the options path (the CSV file, absolute or relative "
            "to the datasets root) and label (the name of its class column)."
        )
    file = Path(path).expanduser()
    if not file.is_absolute() and root is not None:
        file = root / file
    if not file.is_file():
        raise DataError(
            f"csv: no file {file} (path {str(path)!r}, datasets root {root}); give an "
            f"absolute path or one relative to the datasets root."
        )
    df = _read_csv("csv", file, sep=sep)
    present = [str(c) for c in df.columns]
    if df.empty:
        raise DataError(f"csv: {file} has no rows: only a header (columns {present}); add the data rows")
    if label not in df.columns:
        raise DataError(f"csv: {file} has no label column {label!r}; its columns are {present} (separator {sep!r}).")
    if features is None:
        chosen = [c for c in df.columns if c != label]
    else:
        if isinstance(features, str):
            raise DataError(f"csv: features must be a list of column names, got the string {features!r}")
        missing = [f for f in features if f not in df.columns]
        if missing:
            raise DataError(f"csv: {file} has no columns {missing}; its columns are {present}.")
        if label in features:
            raise DataError(f"csv: the label column {label!r} cannot also be a feature")
        chosen = list(features)
    if not chosen:
        raise DataError(f"csv: {file} has no feature columns besides the label {label!r}")
    x, categories = _encode_features("csv", file, df[chosen])
    y, classes = _class_indices("csv", file, df[label])
    if len(classes) < 2:
        raise DataError(
            f"csv: the label column {label!r} of {file} holds one class ({classes[0]!r}) in all "
            f"{len(y)} rows; a classifier needs at least two classes (is {label!r} the class column?)"
        )
    if categories:
        log.info("csv: %s: string columns %s encoded as ordinal codes", file, ", ".join(categories))
    return _split_checked(
        "csv",
        x,
        y,
        test_fraction=test_fraction,
        feature_names=tuple(str(c) for c in chosen),
        meta={"categories": categories, "classes": classes, "path": str(file)},
    )
