"""Vertical partitioning: give each party a slice of every sample's features.

Slices go, in order, to ``passive_1`` ... ``passive_{K-1}`` and then to the active party when
it holds features (VLR, VHNN). In VSNN the active party holds only labels, so the features
are cut into K-1 slices. Images are cut into strips along the width (left/right halves as in
the papers) or the height; tabular columns evenly or by explicit column lists; text token
sequences into contiguous segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from vflbench.data.base import Dataset, PartySlice, VerticalData
from vflbench.errors import DataError

Split = Literal["auto", "width", "height", "even", "columns"]
MIN_PARTIES, MAX_PARTIES = 2, 10


def subsample(ds: Dataset, *, train_size: int | None, test_size: int | None, generator: torch.Generator) -> Dataset:
    """Keep a random subset of train and/or test rows (order preserved) for quick runs."""

    def pick(n: int, size: int | None, which: str) -> Tensor | None:
        if size is None or size >= n:
            return None
        if size < 1:
            raise DataError(f"data.{which}_size must be a positive integer, got {size}")
        return torch.randperm(n, generator=generator)[:size].sort().values

    tr = pick(len(ds.y_train), train_size, "train")
    te = pick(len(ds.y_test), test_size, "test")
    if tr is None and te is None:
        return ds
    return replace(
        ds,
        x_train=ds.x_train if tr is None else ds.x_train[tr],
        y_train=ds.y_train if tr is None else ds.y_train[tr],
        x_test=ds.x_test if te is None else ds.x_test[te],
        y_test=ds.y_test if te is None else ds.y_test[te],
    )


def _cuts(length: int, parts: int, what: str, name: str) -> list[tuple[int, int]]:
    if parts > length:
        raise DataError(
            f"{name}: cannot split {length} {what} among {parts} feature-holding parties; "
            f"use at most {length} parties holding features."
        )
    bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(length), parts)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _column_groups(ds: Dataset, parts: int, split: Split, columns: Sequence[Sequence[int]] | None) -> list[list[int]]:
    n_features = ds.x_train.shape[1]
    if split == "columns" or columns is not None:
        if columns is None:
            raise DataError(
                "data.split 'columns' needs data.columns: one list of column indices per feature-holding party."
            )
        if len(columns) != parts:
            raise DataError(
                f"{ds.name}: data.columns has {len(columns)} lists but {parts} parties hold "
                f"features; give one list per party "
                f"(passive parties first, then the active party when it holds features)."
            )
        seen: set[int] = set()
        for group in columns:
            if not group:
                raise DataError("data.columns: every party needs at least one column")
            for c in group:
                if not 0 <= c < n_features:
                    raise DataError(f"data.columns: column {c} is out of range 0..{n_features - 1}")
                if c in seen:
                    raise DataError(f"data.columns: column {c} is given to two parties")
                seen.add(c)
        return [list(g) for g in columns]
    return [list(range(a, b)) for a, b in _cuts(n_features, parts, "features", ds.name)]


def _standardise(x_tr: Tensor, x_te: Tensor, skip: Sequence[int]) -> tuple[Tensor, Tensor]:
    mean = x_tr.mean(0)
    std = x_tr.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    if skip:
        mean[list(skip)] = 0.0
        std[list(skip)] = 1.0
    return (x_tr - mean) / std, (x_te - mean) / std


def partition(
    ds: Dataset,
    *,
    parties: int,
    active_has_features: bool,
    split: Split = "auto",
    columns: Sequence[Sequence[int]] | None = None,
    standardise: bool = True,
) -> VerticalData:
    """Partition ``ds`` vertically among ``parties`` parties (the active party included).

    ``standardise``: standardise each party's tabular columns with the training rows' statistics
    (categorical columns excepted); refused for a dataset its loader already put at a chosen
    scale (``meta["feature_scale"]``, e.g. ``synthetic``'s ``feature_scale``), which it would undo.
    """
    if not MIN_PARTIES <= parties <= MAX_PARTIES:
        raise DataError(f"data.parties must be between {MIN_PARTIES} and {MAX_PARTIES}, got {parties}")
    holders = parties if active_has_features else parties - 1
    slices: list[PartySlice] = []
    if columns is not None and ds.kind != "tabular":
        raise DataError(
            f"{ds.name} is a {ds.kind} dataset: data.columns applies to tabular datasets only; "
            "remove it (data.split chooses how an image or text is cut)"
        )
    if ds.kind == "image":
        if split not in ("auto", "width", "height"):
            raise DataError(
                f"{ds.name} is an image dataset: data.split must be 'width' or 'height' (or 'auto'), got {split!r}"
            )
        dim = 2 if split == "height" else 3
        for a, b in _cuts(ds.x_train.shape[dim], holders, "pixel columns" if dim == 3 else "pixel rows", ds.name):
            index = [slice(None)] * 4
            index[dim] = slice(a, b)
            slices.append(
                PartySlice(
                    ds.x_train[tuple(index)].contiguous(),
                    ds.x_test[tuple(index)].contiguous(),
                    "image",
                    meta={"range": (a, b), "axis": "height" if dim == 2 else "width"},
                )
            )
    elif ds.kind == "text":
        if split not in ("auto", "even"):
            raise DataError(f"{ds.name} is a text dataset: data.split must be 'even' (or 'auto'), got {split!r}")
        for a, b in _cuts(ds.x_train.shape[1], holders, "tokens", ds.name):
            slices.append(
                PartySlice(
                    ds.x_train[:, a:b].contiguous(),
                    ds.x_test[:, a:b].contiguous(),
                    "text",
                    meta=dict(ds.meta, range=(a, b)),
                )
            )
    else:
        if split not in ("auto", "even", "columns"):
            raise DataError(f"{ds.name} is tabular: data.split must be 'even' or 'columns' (or 'auto'), got {split!r}")
        if standardise and "feature_scale" in ds.meta:
            raise DataError(
                f"{ds.name} was scaled to feature_scale={ds.meta['feature_scale']:g} by its loader, "
                "which standardising each party's columns would undo; set data.standardise: false"
            )
        categorical = set(ds.meta.get("categorical", ()))
        cards = dict(zip(ds.meta.get("categorical", ()), ds.meta.get("cardinalities", ()), strict=False))
        for group in _column_groups(ds, holders, split, columns):
            x_tr, x_te = ds.x_train[:, group], ds.x_test[:, group]
            local_cat = [i for i, c in enumerate(group) if c in categorical]
            if standardise:
                x_tr, x_te = _standardise(x_tr, x_te, local_cat)
            meta = (
                {"categorical": tuple(local_cat), "cardinalities": tuple(cards[group[i]] for i in local_cat)}
                if local_cat
                else {}
            )
            slices.append(PartySlice(x_tr.contiguous(), x_te.contiguous(), "tabular", tuple(group), meta))
    passive = tuple(slices[: parties - 1])
    active = slices[parties - 1] if active_has_features else None
    return VerticalData(
        ds.name,
        ds.num_classes,
        passive,
        active,
        ds.y_train,
        ds.y_test,
        info={"n_train": len(ds.y_train), "n_test": len(ds.y_test)},
    )
