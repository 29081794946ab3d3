"""End-to-end pipelines behind `python -m evidential_ops train|eval|demo` (issue 4).

`recipes` (per-method defaults on the built-in data), `training` (seeded loaders, the epoch
loop with progress bars or per-epoch lines, checkpoints), `analysis` (retrieval metrics, each
paper's uncertainty experiments and the acceptance checks), `quality` (the uncertainty quality
of every score and direction, SPEC §6), `baseline` (the same-encoder InfoNCE baseline of each
method), `plots` (PNGs), `runner` (train / eval / demo end to end), `cli`.
"""

from .recipes import METHODS, RECIPES, Recipe, get_recipe
from .runner import DataSource, load_data, run_demo, run_evaluation, run_training

__all__ = ["METHODS", "RECIPES", "DataSource", "Recipe", "get_recipe", "load_data", "run_demo", "run_evaluation",
           "run_training"]
