"""Experiment definitions (one TOML file per experiment), installed as `synthlab_experiments`.

Load them with `synthlab.sweeps.experiments.load(name)`; the format is described there.
"""
