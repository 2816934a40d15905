"""What a party process of `vflbench launch` needs before it starts, imported once by the launcher's fork server
(:func:`vflbench.experiment.launch.party_context`), so that every party process it forks starts with it imported:
the start-up is paid once per launch, not once per process.

It is :mod:`vflbench.experiment.sweep_worker`'s list (the experiment layer, the attacks and defenses, and what a
first run imports on its own) with the party's side of the protocol and the transport (gRPC, which is only
imported here: no channel or thread exists before the fork). The collector is paused during the imports and the
imported objects are frozen afterwards, for the reasons :mod:`~vflbench.experiment.sweep_worker` gives.

Import this module only in a process that forks party processes: it leaves the imported objects frozen (never
collected) for the rest of the process.
"""

from __future__ import annotations

import gc

gc.disable()
try:
    import sklearn.datasets  # noqa: F401
    import torch._dynamo  # noqa: F401

    import vflbench.attacks
    import vflbench.defenses
    import vflbench.experiment.party
    import vflbench.experiment.run
    import vflbench.net.provision  # noqa: F401
finally:
    gc.enable()
gc.freeze()
