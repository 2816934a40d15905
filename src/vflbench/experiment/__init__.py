"""The experiment layer: configs, building a federation, training, planning and scoring attacks, sweeps, tuning.

It sits above the components (data, models, protocol, mpc/he, defenses, attacks) and below the
report and the command line; it is the only layer that holds ground truth.
"""
