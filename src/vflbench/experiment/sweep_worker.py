"""What a sweep worker needs before its first point, imported once by the workers' fork server
(:data:`vflbench.experiment.sweep.WORKER_PRELOAD`), so that every worker it forks starts with it imported.

Besides vflbench's experiment layer, attacks and defenses (torch, scikit-learn), this imports what the first
run of a process imports on its own: ``torch._dynamo`` (0.7 s here; torch's optimizers import it) and
scikit-learn's datasets (the embedded datasets). The garbage collector is paused during the imports (they
create about a million objects and no garbage: its passes over them cost a fifth of the import time) and the
imported objects are then frozen (:func:`gc.freeze`), as Python's documentation advises before forking: the
workers' collections skip them, and a worker neither copies their pages by touching them nor walks them again
when it collects or exits.

Import this module only in a process that forks workers: it leaves the imported objects frozen (never
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
    import vflbench.experiment.run
    import vflbench.experiment.sweep  # noqa: F401
finally:
    gc.enable()
gc.freeze()
