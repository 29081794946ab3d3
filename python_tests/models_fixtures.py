"""Tiny built-in data and batches shared by the model tests (test_models_*.py, test_cli.py)."""

from __future__ import annotations

import functools

from evidential_ops.data import collate_pairs, make_synthetic_benchmark
from evidential_ops.data.torch_data import CrossModalPairs

TINY = dict(n_train=48, n_val=4, n_test=12, n_ood=6, n_regions=6, feat_dim=16, n_classes=4,
            concepts_per_class=4, n_attributes=4)


@functools.cache
def tiny_bench(**overrides):
    """A small synthetic benchmark (deterministic; cached per configuration)."""
    return make_synthetic_benchmark(**{**TINY, **overrides})


def tiny_batch(bench, k: int = 12, languages=("en",), epoch: int = 0) -> dict:
    """The first k training pairs (one caption per sample) as a collated batch."""
    ds = CrossModalPairs(bench.train, languages=languages, mode="images", seed=0)
    ds.set_epoch(epoch)
    return collate_pairs([ds[i] for i in range(k)])


def single_thread():
    """Generator for an autouse fixture: the tiny models of these tests run 2-3x faster on one
    intra-op thread (a 2-thread OpenMP team costs more in barriers than the work it shares,
    worse on a loaded CI machine); the previous setting is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
