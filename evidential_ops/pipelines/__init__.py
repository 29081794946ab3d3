"""End-to-end pipelines behind `python -m evidential_ops train|eval|demo` (issue 4).

`recipes` (per-method defaults on the built-in data), `training` (seeded loaders, the epoch
loop with progress bars, checkpoints), `analysis` (retrieval metrics and each paper's
uncertainty experiments), `plots` (PNGs), `runner` (train / eval / demo end to end), `cli`.
"""

from .recipes import METHODS, RECIPES, Recipe, get_recipe
from .runner import DataSource, load_data, run_demo, run_evaluation, run_training

__all__ = ["METHODS", "RECIPES", "DataSource", "Recipe", "get_recipe", "load_data", "run_demo", "run_evaluation",
           "run_training"]
