"""Data for evidential cross-modal retrieval (docs/api.md "Method pieces, metrics and data").

- `make_synthetic_benchmark` / `SyntheticConfig`: a deterministic synthetic benchmark exposing
  every protocol of the five papers (5 captions per image, class labels, two languages with noisy
  correspondence, corruption ratio, out-of-distribution samples, region or frame features).
- `load_precomputed` / `save_precomputed`: the `{split}_ims.npy` + `{split}_caps.txt` layout of the
  papers' released features (SCAN / VSE++ / TCL), with a vocabulary built from training captions.
- `CrossModalPairs`, `collate_pairs`, `pad_sequences`, `eval_batches`: torch Dataset/collate
  helpers for any training loop.
- `augment_batch`, `drop_regions`, `augment_tokens`: TcVSE's training augmentation (dropped
  regions; masked, swapped and discarded words).
- `concat_splits`: two splits as one (e.g. out-of-distribution queries over the test gallery).
Both sources return the same `CrossModalBenchmark` of `CrossModalSplit`s.
"""

from .augment import augment_batch, augment_tokens, drop_regions
from .combine import concat_splits
from .precomputed import load_precomputed, save_precomputed
from .synthetic import SyntheticConfig, corrupt_split, make_synthetic_benchmark
from .torch_data import CrossModalPairs, collate_pairs, eval_batches, pad_sequences
from .types import MASK_ID, PAD_ID, SPECIALS, UNK_ID, CrossModalBenchmark, CrossModalSplit, Vocabulary

__all__ = [
    "MASK_ID",
    "PAD_ID",
    "SPECIALS",
    "UNK_ID",
    "CrossModalBenchmark",
    "CrossModalPairs",
    "CrossModalSplit",
    "SyntheticConfig",
    "Vocabulary",
    "augment_batch",
    "augment_tokens",
    "collate_pairs",
    "concat_splits",
    "corrupt_split",
    "drop_regions",
    "eval_batches",
    "load_precomputed",
    "make_synthetic_benchmark",
    "pad_sequences",
    "save_precomputed",
]
