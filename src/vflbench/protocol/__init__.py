"""The VFL protocol: parties, messages, channel, hooks, and the one training loop."""

from vflbench.protocol.channel import Channel, CommStats, Transcript
from vflbench.protocol.federation import Federation, History, Progress, classification_metrics
from vflbench.protocol.hooks import BindContext, Defense, StepState
from vflbench.protocol.messages import ACTIVE, Message, passive_name
from vflbench.protocol.objective import Objective, default_objective
from vflbench.protocol.party import ActiveParty, PassiveParty, aggregate

__all__ = ["ACTIVE", "ActiveParty", "BindContext", "Channel", "CommStats", "Defense", "Federation",
           "History", "Message", "Objective", "PassiveParty", "Progress", "StepState", "Transcript",
           "aggregate", "classification_metrics", "default_objective", "passive_name"]
