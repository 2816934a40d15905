"""Bottom models with embeddings: emb_mlp (Criteo-style tabular) and text_cnn (Kim 2014).

Embedding layers are not Linear/Conv layers, so :func:`vflbench.models.base.linear_layers`
lists only the fully connected and convolution layers, in forward order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vflbench.models.registry import EMBEDDING, MODELS
from vflbench.registry import MAX_WIDTH, WIDTH, Param


class EmbeddingMLP(nn.Module):
    """Embeddings for categorical columns + 2 fully connected layers (Criteo bottom model).

    Kang et al. ("A Framework for Evaluating Privacy-Utility Trade-off in Vertical Federated
    Learning", Table 9: "emb. + 2 FC") and VMask (Tan et al., NDSS 2025) embed each categorical
    Criteo feature and feed the numeric features with the embeddings to an MLP. Each column
    listed in ``meta["categorical"]`` (indices within the slice, integer codes stored as
    floats) gets an ``nn.Embedding(cardinality, embedding_dim)``; the numeric columns (in
    slice order) and the embeddings (in ``meta["categorical"]`` order) are concatenated ->
    Linear(hidden) -> ReLU -> Linear(out_dim). Without categorical columns it is an MLP2.
    """

    numeric_index: Tensor
    categorical_index: Tensor

    def __init__(
        self,
        input_shape: Sequence[int],
        out_dim: int,
        meta: dict[str, Any] | None,
        embedding_dim: int = 8,
        hidden: int = 64,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"emb_mlp needs a tabular slice of shape (F,), got {tuple(input_shape)}")
        n_features = int(input_shape[0])
        meta = meta or {}
        categorical = [int(i) for i in meta.get("categorical", ())]
        cardinalities = [int(c) for c in meta.get("cardinalities", ())]
        if len(categorical) != len(cardinalities):
            raise ValueError(
                f"emb_mlp: meta lists {len(categorical)} categorical columns but {len(cardinalities)} cardinalities"
            )
        in_range = all(0 <= i < n_features for i in categorical)
        if len(set(categorical)) != len(categorical) or not in_range:
            raise ValueError(
                f"emb_mlp: meta['categorical'] must hold distinct column indices in "
                f"[0, {n_features}), got {tuple(categorical)}"
            )
        if any(c < 1 for c in cardinalities):
            raise ValueError(f"emb_mlp: cardinalities must be positive, got {tuple(cardinalities)}")
        numeric = [i for i in range(n_features) if i not in set(categorical)]
        self.register_buffer("numeric_index", torch.tensor(numeric, dtype=torch.long), persistent=False)
        self.register_buffer("categorical_index", torch.tensor(categorical, dtype=torch.long), persistent=False)
        self.embeddings = nn.ModuleList(nn.Embedding(c, embedding_dim) for c in cardinalities)
        in_dim = len(numeric) + embedding_dim * len(categorical)
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))

    def forward(self, x: Tensor) -> Tensor:
        """Map (N, F) float rows (categorical columns hold integer codes) to (N, out_dim)."""
        parts = [x.index_select(1, self.numeric_index).float()]
        codes = x.index_select(1, self.categorical_index).long()
        parts += [emb(codes[:, j]) for j, emb in enumerate(self.embeddings)]
        return self.mlp(torch.cat(parts, dim=1))


@MODELS.register(
    "emb_mlp",
    constraints={"embedding_dim": EMBEDDING, "hidden": WIDTH},
    summary="embeddings for categorical columns + 2 FC layers (Criteo)",
)
def emb_mlp(
    *,
    input_shape: Sequence[int],
    out_dim: int,
    meta: dict[str, Any] | None = None,
    embedding_dim: int = 8,
    hidden: int = 64,
) -> nn.Module:
    """Embed meta['categorical'] columns, concat with numeric ones -> Linear -> ReLU -> Linear."""
    return EmbeddingMLP(input_shape, out_dim, meta, embedding_dim, hidden)


class TextCNN(nn.Module):
    """Convolutional sentence classifier (Kim, "Convolutional Neural Networks for Sentence
    Classification", EMNLP 2014), single static-or-trained embedding channel.

    Token ids (N, L) -> Embedding(vocab_size, embedding_dim, padding_idx=0) -> one Conv1d per
    filter width (widths longer than L are left out) -> ReLU -> max over time -> concat ->
    dropout -> Linear(out_dim). Padding tokens (id 0) are zeroed after the lookup, so they
    contribute nothing whatever the embedding table's row 0 holds (``init_parameters`` draws
    every row from a normal distribution).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        out_dim: int,
        meta: dict[str, Any] | None,
        embedding_dim: int = 64,
        filter_widths: Sequence[int] = (3, 4, 5),
        n_filters: int = 64,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        meta = meta or {}
        if "vocab_size" not in meta:
            raise ValueError(
                "text_cnn needs the vocabulary size in the slice's meta['vocab_size'] "
                "(a text dataset provides it; index 0 is padding)"
            )
        vocab_size = int(meta["vocab_size"])
        if vocab_size < 2:
            raise ValueError(f"text_cnn: meta['vocab_size'] must be at least 2, got {vocab_size}")
        if len(input_shape) != 1:
            raise ValueError(f"text_cnn needs token ids of shape (L,), got {tuple(input_shape)}")
        length = int(input_shape[0])
        widths = [int(w) for w in filter_widths if 1 <= int(w) <= length]
        if not widths:
            shortest = min(filter_widths, default=1)
            raise ValueError(
                f"text_cnn needs at least {shortest} tokens for its filter widths {tuple(filter_widths)}, got {length}"
            )
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(embedding_dim, n_filters, w) for w in widths)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(n_filters * len(widths), out_dim)

    def forward(self, x: Tensor) -> Tensor:
        """Map (N, L) token ids to (N, out_dim)."""
        emb = self.embedding(x.long()).transpose(1, 2)  # (N, embedding_dim, L)
        pooled = [torch.relu(conv(emb)).amax(dim=2) for conv in self.convs]
        return self.classifier(self.dropout(torch.cat(pooled, dim=1)))


@MODELS.register(
    "text_cnn",
    constraints={
        "embedding_dim": EMBEDDING,
        "filter_widths": Param("tokens each convolution spans", ge=1),
        "n_filters": Param("filters per width", ge=1, le=MAX_WIDTH),
        "dropout": Param("dropout rate", ge=0, lt=1),
    },
    summary="Kim (2014) CNN: embedding, conv widths 3/4/5, max over time",
)
def text_cnn(
    *,
    input_shape: Sequence[int],
    out_dim: int,
    meta: dict[str, Any] | None = None,
    embedding_dim: int = 64,
    filter_widths: Sequence[int] = (3, 4, 5),
    n_filters: int = 64,
    dropout: float = 0.0,
) -> nn.Module:
    """Kim's text CNN on token ids (L,); needs meta['vocab_size']."""
    return TextCNN(input_shape, out_dim, meta, embedding_dim, filter_widths, n_filters, dropout)
