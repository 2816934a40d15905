"""The VFL protocol: parties, messages, channel, hooks, and the one training loop."""

from vflbench.protocol.channel import Channel, CommStats, Endpoint, InMemoryTransport, Transcript, Transport
from vflbench.protocol.federation import Federation, History, Progress, classification_metrics
from vflbench.protocol.hooks import BindContext, Defense, DefenseAux, StepState, TopLayout, TopPart, TrainSettings
from vflbench.protocol.messages import ACTIVE, Message, passive_name
from vflbench.protocol.objective import Objective, default_objective
from vflbench.protocol.party import ActiveParty, PassiveParty, aggregate

__all__ = [
    "ACTIVE",
    "ActiveParty",
    "BindContext",
    "Channel",
    "CommStats",
    "Defense",
    "DefenseAux",
    "Endpoint",
    "Federation",
    "History",
    "InMemoryTransport",
    "Message",
    "Objective",
    "PassiveParty",
    "Progress",
    "StepState",
    "TopLayout",
    "TopPart",
    "TrainSettings",
    "Transcript",
    "Transport",
    "aggregate",
    "classification_metrics",
    "default_objective",
    "passive_name",
]
