"""The same-encoder InfoNCE baseline of each method (`models.InfoNCEBaseline`), built from the
method's own, still untrained, encoders: same architecture, same initial weights, same data
treatment (TcVSE's augmentation, UML's two caption languages), so that only the loss differs."""

from __future__ import annotations

import copy

from torch import nn

from ..models import DUQ, FUME, TCL, UML, DualEncoder, InfoNCEBaseline, TcVSE

__all__ = ["infonce_baseline"]


def infonce_baseline(method: str, model: nn.Module) -> InfoNCEBaseline:
    """An `InfoNCEBaseline` on deep copies of `model`'s encoders (call it before training).

    TCL / TcVSE: both query models as ensemble members (scores added, as TCL adds s_A + s_B);
    TcVSE's augmentation, at the model's rates, when the model uses it. UML: the visual and English encoders as the
    member plus the non-English encoder, trained on both languages and evaluated on the
    non-English captions (the paper's protocol). FUME, DUQ: their `DualEncoder`. The gradient
    clipping is the method's.
    """
    model = copy.deepcopy(model)
    if method in ("tcl", "tcvse") and isinstance(model, TCL):
        if isinstance(model, TcVSE) and model.augment:
            # The same augmentation as the model's, rates included (not the defaults).
            augment = dict(augment_vocab_size=model.vocab_size, augment_region_drop=model.region_drop,
                           augment_word_rate=model.word_rate)
        else:
            augment = {}
        return InfoNCEBaseline([model.model_a, model.model_b], grad_clip=model.grad_clip, **augment)
    if method == "uml" and isinstance(model, UML):
        member = DualEncoder(model.visual_encoder, model.english_encoder)
        return InfoNCEBaseline([member], alt_text_encoders=[model.other_encoder], eval_language="alt",
                               grad_clip=model.grad_clip)
    if method in ("fume", "duq") and isinstance(model, (FUME, DUQ)):
        return InfoNCEBaseline([model.model], grad_clip=model.grad_clip)
    raise ValueError(f"no InfoNCE baseline for method {method!r} with a {type(model).__name__} model")
