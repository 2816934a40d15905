"""The training loop against references: unsplit-model gradients, hooks, channel accounting."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import minimal
from torch import nn

from vflbench.experiment.config import build_config
from vflbench.experiment.scenario import DefensePlan, build_federation, load_vertical_data
from vflbench.protocol import Channel, Defense, aggregate


def _federation(**sections):
    cfg = build_config(minimal(**sections))
    vd = load_vertical_data(cfg)
    return cfg, vd


@pytest.mark.parametrize("aggregation", ["sum", "concat", "mean"])
def test_split_model_gradients_equal_the_unsplit_model(aggregation):
    cfg, vd = _federation(data={"parties": 3}, train={"aggregation": aggregation})
    fed = build_federation(cfg, vd)
    bottoms = [copy.deepcopy(p.bottom) for p in fed.passives] + [copy.deepcopy(fed.active.bottom)]
    top = copy.deepcopy(fed.active.top)
    xs = [p.data.x_train for p in fed.passives] + [fed.active.data.x_train]
    ids = torch.arange(32)

    class Unsplit(nn.Module):
        def __init__(self):
            super().__init__()
            self.bottoms, self.top = nn.ModuleList(bottoms), top

        def forward(self, parts):
            passive = [b(x) for b, x in zip(self.bottoms[:-1], parts[:-1], strict=True)]
            return self.top(aggregate([self.bottoms[-1](parts[-1]), *passive], aggregation))

    unsplit = Unsplit()
    loss = nn.functional.cross_entropy(unsplit([x[ids] for x in xs]), vd.y_train[ids])
    loss.backward()
    fed.train_step(ids, epoch=0, step=0)
    split_models = [p.bottom for p in fed.passives] + [fed.active.bottom, fed.active.top]
    for ref, got in zip([*bottoms, top], split_models, strict=True):
        for (name, p_ref), p_got in zip(ref.named_parameters(), got.parameters(), strict=True):
            torch.testing.assert_close(p_got.grad, p_ref.grad, rtol=1e-5, atol=1e-7, msg=name)


class Recorder(Defense):
    """A test defense that exercises every hook and counts the calls."""

    name = "recorder"

    def __init__(self, *, side="active", refuse=False, scale=1.0):
        self.side = side
        self.refuse = refuse
        self.scale = scale
        self.calls: dict[str, int] = {}

    def _hit(self, hook):
        self.calls[hook] = self.calls.get(hook, 0) + 1

    def transform_labels(self, objective):
        self._hit("transform_labels")
        return objective

    def wrap_bottom(self, model, party):
        self._hit("wrap_bottom")
        return model

    def wrap_top(self, model):
        self._hit("wrap_top")
        return model

    def regularizer(self, state):
        self._hit("regularizer")
        return None

    def transform_embedding(self, embedding, state):
        self._hit("transform_embedding")
        return embedding * self.scale

    def transform_cut_gradient(self, gradient, state):
        self._hit("transform_cut_gradient")
        assert state.receiver == "passive_1" and state.targets is not None
        return gradient * self.scale

    def on_received_gradient(self, gradient, state):
        self._hit("on_received_gradient")
        return None if self.refuse else gradient

    def on_epoch_end(self, epoch):
        self._hit("on_epoch_end")
        return {"seen": epoch}


def test_every_hook_point_is_called():
    cfg, vd = _federation(train={"epochs": 2})
    active, passive = Recorder(side="active"), Recorder(side="passive")
    plan = DefensePlan([active], {"passive_1": [passive]})
    fed = build_federation(cfg, vd, defenses=plan)
    history = fed.fit(epochs=2, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    steps = 2 * ((len(vd.y_train) + 63) // 64)
    assert active.calls["transform_labels"] == 1 and active.calls["wrap_top"] == 1
    assert active.calls["transform_cut_gradient"] == steps and active.calls["regularizer"] == steps
    assert passive.calls["on_received_gradient"] == steps and passive.calls["regularizer"] == steps
    assert passive.calls["transform_embedding"] >= steps  # plus evaluation passes
    assert passive.calls["wrap_bottom"] == 1 and passive.calls["on_epoch_end"] == 2
    assert history.epochs[-1]["recorder.seen"] == 1


def test_refused_gradients_leave_the_passive_model_unchanged():
    cfg, vd = _federation(train={"epochs": 1})
    plan = DefensePlan([], {"passive_1": [Recorder(side="passive", refuse=True)]})
    fed = build_federation(cfg, vd, defenses=plan)
    before = copy.deepcopy(fed.passives[0].bottom.state_dict())
    history = fed.fit(epochs=1, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    for k, v in fed.passives[0].bottom.state_dict().items():
        assert torch.equal(v, before[k])
    assert history.refused_updates == (len(vd.y_train) + 63) // 64


def test_channel_counts_messages_and_bytes_and_transcript_keeps_what_is_asked():
    cfg, vd = _federation(train={"epochs": 1})
    fed = build_federation(cfg, vd, keep={"passive_1": {"cut_gradient"}})
    fed.fit(epochs=1, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    steps = (len(vd.y_train) + 63) // 64
    stats = fed.traffic()
    assert stats.messages == 2 * steps
    assert stats.bytes_up == stats.bytes_down == len(vd.y_train) * 16 * 4
    kept = fed.passives[0].transcript.of_kind("cut_gradient")
    assert len(kept) == steps and kept[0].payload.shape == (64, 16)
    assert fed.passives[0].transcript.of_kind("embedding") == []
    assert fed.active.transcript.messages == []


def test_requests_replies_and_mailboxes_are_counted_per_kind_and_direction():
    """Every way of talking goes through the one counter (issue 18): a request and its reply, a posted
    message, per phase, direction (up = towards the active party) and kind."""
    channel = Channel(("active", "passive_1"))
    active, passive = channel.endpoint("active"), channel.endpoint("passive_1")
    active.serve("demo", lambda request: request.reply(request.payload * 2, meta={"seen": True}))
    reply = passive.call("demo.double", "active", torch.ones(3, dtype=torch.float32), meta={"layer": 1})
    assert torch.equal(reply.payload, torch.full((3,), 2.0)) and reply.meta == {"seen": True}
    assert reply.sender == "active" and reply.receiver == "passive_1" and reply.role == "reply"
    active.post("demo.labels", "passive_1", torch.arange(4))
    assert torch.equal(passive.take("demo.labels", "active").payload, torch.arange(4))
    train, setup = channel.stats["train"].as_dict(), channel.stats["setup"].as_dict()
    # the request (up) is the round trip; its reply (down) is a message of its own, no second round
    assert train["by_kind"]["demo.double"] == {
        "down": {"messages": 1, "bytes": 12, "rounds": 0},
        "up": {"messages": 1, "bytes": 12, "rounds": 1},
    }
    assert (train["messages"], train["bytes_up"], train["bytes_down"]) == (2, 12, 12)
    assert (train["rounds"], train["rounds_up"], train["rounds_down"]) == (1, 1, 0)
    # a posted (one-way) message is a message, not a round trip
    assert setup["by_kind"]["demo.labels"] == {"down": {"messages": 1, "bytes": 32, "rounds": 0}}
    assert setup["rounds"] == 0


def test_rounds_are_counted_in_the_requests_direction():
    """A request from the active party to a passive one is a round trip down (issue 26: rounds per direction
    and kind, besides messages and bytes)."""
    channel = Channel(("active", "passive_1"))
    active, passive = channel.endpoint("active"), channel.endpoint("passive_1")
    passive.serve("demo", lambda request: request.reply())
    for _ in range(3):
        active.call("demo.ping", "passive_1", torch.ones(2))
    stats = channel.stats["train"]
    assert (stats.rounds_up, stats.rounds_down, stats.rounds, stats.messages) == (0, 3, 3, 6)
    assert stats.by_kind["demo.ping"]["down"].rounds == 3 and stats.by_kind["demo.ping"]["up"].rounds == 0


def test_a_party_cannot_take_what_was_not_sent_nor_reach_what_nobody_serves():
    channel = Channel(("active", "passive_1"))
    passive = channel.endpoint("passive_1")
    with pytest.raises(RuntimeError, match="expected a 'demo.labels' message from 'active'"):
        passive.take("demo.labels", "active")
    with pytest.raises(RuntimeError, match="serves no 'demo' requests"):
        passive.call("demo.double", "active", torch.ones(1))
    with pytest.raises(ValueError, match="unregistered party 'dealer'"):
        passive.call("dealer.triple", "dealer")
    channel.endpoint("active").serve("demo", lambda request: request.reply())
    with pytest.raises(ValueError, match="already serves 'demo'"):
        channel.endpoint("active").serve("demo", lambda request: request.reply())
    channel.endpoint("active").serve("bad", lambda request: request)  # answers with the request itself
    with pytest.raises(RuntimeError, match="did not answer its request"):
        passive.call("bad.echo", "active")
