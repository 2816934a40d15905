"""What an attacker receives: its :class:`PartyView` (its own models, transcript, data and the
embeddings its victims send at inference), built from a trained run."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from vflbench.attacks.base import (
    AuxData,
    FeatureAttack,
    PartyView,
    ReceivedEmbeddings,
    draws_of,
    victims_of,
)
from vflbench.data import VerticalData
from vflbench.experiment.plan import PlannedAttack, attacker_copy, aux_data, known_labels, scenario_of, wants_aux
from vflbench.models import build_bottom
from vflbench.models.finetune import EVAL_BATCH
from vflbench.protocol import ACTIVE, Federation
from vflbench.rng import generator

if TYPE_CHECKING:
    from vflbench.experiment.results import TrainedRun


log = logging.getLogger(__name__)


def _view(
    run: TrainedRun, planned: PlannedAttack, models: dict[str, nn.Module] | None = None, repeat: int = 0
) -> PartyView:
    """The attacker's view for repeat ``repeat`` of the attack (repeat 0: the draws of a single run; every further
    repeat its own known labels, unless the attack used them during training, and its own random stream)."""
    attack = planned.attack
    party = {p.name: p for p in run.federation.parties()}[attack.party]
    redraw = repeat if attack.phase != "malicious" else 0  # a malicious attack trained with its known labels
    known = known_labels(attack, run.data.y_train, run.config.seed, run.held_out, redraw)
    aux = planned.aux
    if aux is None and wants_aux(attack):
        aux = aux_data(
            attack, run.data, party.data.x_train if party.data is not None else None, run.config.seed, run.held_out
        )
    received = []
    if isinstance(attack, FeatureAttack) and "embedding" in attack.reads and party.name == ACTIVE:
        ids, split = feature_targets(attack, run.data, aux, run.config.seed, run.held_out)
        received += [query_embeddings(run.federation, victim, ids, split) for victim in victims_of(attack)]
    assert party.data is not None or isinstance(attack, FeatureAttack)
    stream = ("run",) if repeat == 0 else ("run", repeat)
    return PartyView(
        party=party.name,
        scenario=scenario_of(run.config, run.data),
        data=party.data,
        models=models if models is not None else {k: attacker_copy(m) for k, m in party.models().items()},
        transcript=party.transcript,
        records=planned.records,
        known=known,
        generator=generator(run.config.seed, "attack", draws_of(attack), *stream),
        aux=aux,
        received=received,
    )


def feature_targets(
    attack: FeatureAttack, vd: VerticalData, aux: AuxData | None, seed: int, pool: Tensor | None = None
) -> tuple[Tensor, str]:
    """The rows a feature attack is scored on: ``n_targets`` rows of ``target_split`` (all when
    ``None``), drawn with a seeded generator; training rows are rows the parties trained on (never the
    pool) and never the auxiliary rows."""
    split = attack.target_split
    n = len(vd.y_test) if split == "test" else len(vd.y_train)
    allowed = torch.ones(n, dtype=torch.bool)
    if split == "train":
        for rows in (aux.ids if aux is not None else None, pool):
            if rows is not None:
                allowed[rows] = False
    rows = torch.nonzero(allowed).flatten()
    if attack.n_targets is not None and attack.n_targets < len(rows):
        pick = torch.randperm(len(rows), generator=generator(seed, "attack", attack.name, "targets"))
        rows = rows[pick[: attack.n_targets]].sort().values
    return rows, split


def query_embeddings(fed: Federation, sender: str, ids: Tensor, split: str) -> ReceivedEmbeddings:
    """The embeddings ``sender`` sends the active party for rows ``ids`` at inference time.

    The same messages as :meth:`Federation.outputs` (through the transport, phase ``"eval"``,
    after the sender's own defenses), for the rows the active party asks about.
    """
    peer = fed.peer(sender)
    chunks = []
    for start in range(0, len(ids), EVAL_BATCH):
        batch = ids[start : start + EVAL_BATCH]
        chunks.append(peer.forward(batch, epoch=-1, step=-1, split=split, train=False))  # type: ignore[arg-type]
    embeddings = torch.cat(chunks) if chunks else torch.empty(0)
    return ReceivedEmbeddings(sender, split, ids, embeddings)  # type: ignore[arg-type]


def scratch_models(run: TrainedRun, party: str, repeat: int = 0) -> dict[str, nn.Module]:
    """A randomly initialised bottom model of the attacker's architecture (its own initialisation per repeat)."""
    cfg = run.config.resolved()
    parties = {p.name: p for p in run.federation.parties()}
    data = parties[party].data
    scenario = scenario_of(run.config, run.data)
    assert data is not None and cfg.model.bottom
    stream = ("scratch",) if repeat == 0 else ("scratch", repeat)
    bottom = build_bottom(
        cfg.model.bottom, data, scenario.embed_dim, generator(cfg.seed, party, *stream), **cfg.model.bottom_options
    )
    return {"bottom": bottom}
