"""One party of an experiment in its own process: a first, limited step (see docs/deployment.md).

The active party's process runs the usual training loop (:class:`~vflbench.protocol.Federation`),
in which each passive party is a :class:`RemotePassive`: its ``forward``, ``backward`` and
``end_epoch`` are requests over the transport, answered by :func:`serve_passive` in the passive
party's process. The loop's own in-process channel still counts the embeddings and cut gradients
exactly as in a one-process run; the :class:`~vflbench.net.NetChannel` counts what really crossed
the wire (the requests that carry the row ids down and the replies).

Limits of this step: every process loads the whole dataset and builds every party's models (from
the same seeds), then uses only its own; no defenses, no attacks, no VSNN (the active party must
hold features). :func:`run_party` refuses configs outside these limits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vflbench.errors import ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.net.errors import ProtocolError
from vflbench.net.policy import DEFAULT_RULES, Policy, Rule
from vflbench.net.transport import NetChannel
from vflbench.protocol.channel import Endpoint, Transcript
from vflbench.protocol.messages import ACTIVE, Message, Scalar, passive_name
from vflbench.protocol.party import PassiveParty

log = logging.getLogger(__name__)

#: The active party drives a remote passive party: requests down, replies up.
REMOTE_PASSIVE_RULES = (Rule("passive.*", "active", "passive", frozenset({"request"})),
                        Rule("passive.*", "passive", "active", frozenset({"reply"})))


def party_policy() -> Policy:
    """The protocol's table plus the remote passive party's requests."""
    return Policy((*DEFAULT_RULES, *REMOTE_PASSIVE_RULES))


class RemotePassive:
    """The active process's stand-in for passive party ``name``: what the training loop calls on a passive party,
    done by requests to that party's process through ``endpoint``."""

    def __init__(self, name: str, *, endpoint: Endpoint, transcript: Transcript) -> None:
        self.name = name
        self.endpoint = endpoint
        self.transcript = transcript
        self.data = None
        self.bottom = None
        self.defenses: list[Any] = []
        self._position = (-1, -1)

    def models(self) -> dict[str, nn.Module]:
        """None here: the passive party's models stay in its process."""
        return {}

    def forward(self, ids: Tensor, *, epoch: int, step: int, split: str = "train", train: bool = True) -> Tensor:
        """The remote party's embedding of rows ``ids``."""
        self._position = (epoch, step)
        reply = self.endpoint.call("passive.forward", self.name, ids=ids, epoch=epoch, step=step,
                                   phase="train" if train else "eval", meta={"split": split, "train": train})
        return reply.payload

    def backward(self, gradient: Tensor) -> bool:
        """Send the cut gradient of the last forward; ``False`` if the remote party's defenses refused it."""
        epoch, step = self._position
        reply = self.endpoint.call("passive.backward", self.name, gradient, epoch=epoch, step=step)
        return bool(reply.meta.get("applied"))

    def end_epoch(self, epoch: int) -> dict[str, object]:
        """The remote party's end-of-epoch report."""
        return dict(self.endpoint.call("passive.end_epoch", self.name, epoch=epoch).meta)


@dataclass
class _Served:
    party: PassiveParty
    pending: tuple[int, ...] | None = None
    rows: Mapping[str, int] = field(default_factory=dict)

    def __call__(self, request: Message) -> Message:
        if request.kind == "passive.forward":
            split, train = request.meta.get("split"), request.meta.get("train")
            if not isinstance(split, str) or split not in self.rows or not isinstance(train, bool):
                raise ProtocolError(f"passive.forward needs meta split in {sorted(self.rows)} and a bool train, got "
                                    f"{request.meta}")
            ids = request.ids
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.rows[split]):
                raise ProtocolError(f"passive.forward asks for rows outside 0..{self.rows[split] - 1} of {split}")
            out = self.party.forward(ids, epoch=request.epoch, step=request.step,
                                     split="train" if split == "train" else "test", train=train)
            self.pending = tuple(out.shape) if train else self.pending
            return request.reply(out)
        if request.kind == "passive.backward":
            g = request.payload
            if self.pending is None or tuple(g.shape) != self.pending or not g.dtype.is_floating_point:
                raise ProtocolError(f"passive.backward: a cut gradient of shape {tuple(g.shape)} ({g.dtype}) does "
                                    f"not fit the pending embedding ({self.pending})")
            self.pending = None
            return request.reply(meta={"applied": self.party.backward(g)})
        if request.kind == "passive.end_epoch":
            report = self.party.end_epoch(request.epoch)
            meta: dict[str, Scalar] = {k: v for k, v in report.items()
                                       if v is None or isinstance(v, bool | int | float | str)}
            return request.reply(meta=meta)
        raise ProtocolError(f"{self.party.name} serves passive.forward, passive.backward and passive.end_epoch, "
                            f"not {request.kind!r}")


def serve_passive(party: PassiveParty, channel: NetChannel) -> None:
    """Answer the active party's requests for ``party`` until it says goodbye."""
    assert party.data is not None
    served = _Served(party, rows={"train": len(party.data.x_train), "test": len(party.data.x_test)})
    channel.endpoint(party.name).serve("passive", served)
    channel.serve_forever()


def check_party_config(cfg: ExperimentConfig) -> None:
    """Refuse what :func:`run_party` cannot run yet (see the module docstring)."""
    problems = []
    if cfg.defenses:
        problems.append(f"defenses ({', '.join(d.name for d in cfg.defenses)})")
    if cfg.attacks:
        problems.append(f"attacks ({', '.join(a.name for a in cfg.attacks)})")
    if cfg.train.algorithm == "vsnn":
        problems.append("VSNN (the active party holds no features)")
    if problems:
        raise ConfigError(f"`vflbench party run` cannot run {' or '.join(problems)} yet; it runs VLR and VHNN "
                          "without defenses or attacks. Use `vflbench run` for everything in one process")


def party_names(cfg: ExperimentConfig) -> list[str]:
    """The parties of ``cfg``'s run: the active party and its passive parties."""
    return [ACTIVE, *(passive_name(i + 1) for i in range(cfg.data.parties - 1))]


def run_party(cfg: ExperimentConfig, *, party: str, channel: NetChannel, out_dir: Path | None = None,
              data_root: str | Path | None = None) -> dict[str, Any]:
    """Run ``party``'s side of ``cfg`` over ``channel`` (started here, and closed -- or aborted on an error -- before
    returning); returns (and writes to ``out_dir/<party>.json``) its summary with the channel's final counts, and
    saves its models' state dicts under ``out_dir/checkpoints``."""
    from vflbench.experiment.results import write_json
    from vflbench.experiment.run import utility_of
    from vflbench.experiment.scenario import build_federation, load_vertical_data
    from vflbench.rng import generator

    cfg = cfg.resolved()
    check_party_config(cfg)
    if party not in party_names(cfg):
        raise ConfigError(f"party {party!r} is not in this config's run ({', '.join(party_names(cfg))})")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads)
    try:
        vd = load_vertical_data(cfg, data_root)
        fed = build_federation(cfg, vd)
        summary: dict[str, Any] = {"party": party, "run": channel.run}
        with channel:
            if party == ACTIVE:
                endpoint = channel.endpoint(ACTIVE)
                fed.passives = [RemotePassive(p.name, endpoint=endpoint,  # type: ignore[misc]
                                              transcript=p.transcript) for p in fed.passives]
                history = fed.fit(epochs=cfg.train.epochs, batch_size=cfg.train.batch_size,
                                  generator=generator(cfg.seed, "active", "batches"), y_test=vd.y_test,
                                  eval_every=cfg.train.eval_every)
                summary.update(utility=utility_of(cfg, history).__dict__, epochs=history.epochs,
                               comm=fed.channel.train.as_dict())
                models = fed.active.models()
            else:
                mine = next(p for p in fed.passives if p.name == party)
                serve_passive(mine, channel)
                models = mine.models()
        summary["net"] = {"stats": {k: v.as_dict() for k, v in channel.stats.items()},
                          "wire": {k: v.as_dict() for k, v in channel.wire.items()}}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            for role, model in models.items():
                path = out_dir / "checkpoints" / f"{party}.{role}.pt"
                path.parent.mkdir(exist_ok=True)
                torch.save(model.state_dict(), path)
            write_json(out_dir / f"{party}.json", summary)
        return summary
    finally:
        torch.set_num_threads(previous_threads)
