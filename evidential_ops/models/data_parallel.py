"""Data-parallel training of the method models over torch.distributed (docs/distributed.md "Pipelines").

`enable_global_batch(model)` makes a model's `training_step` train data-parallel on the ranks of
a process group, each rank passing its own batch:

- the evidential term (TCL's L_u, DUQ's ISUM) becomes the loss of the global batch
  (`evidential_ops.distributed.evidential_loss`), every query against every rank's candidates;
- the parameters' gradients are averaged over the ranks by DistributedDataParallel: every forward
  pass whose outputs a training step backpropagates runs inside DDP's forward (`run_synced`), so
  DDP's reducer is armed for the backward that follows, however many updates the step makes (TCL:
  1 + T_max, each loss computed inside; DUQ: the model's forward inside, its losses computed from
  those outputs after `run_synced` returns, which DDP handles the same way).

Only models whose `training_step` is written this way can be made data-parallel: TCL, TcVSE and
DUQ (and any model class that sets `supports_global_batch = True`). UML, FUME and InfoNCEBaseline
never call `run_synced` or `loss_function`, so under `enable_global_batch` DDP's forward would never
run and every rank would train on its own gradients; `enable_global_batch` refuses them
(TypeError).

DDP averages; the global evidential loss is called with `ddp=True`, which scales each rank's share
of its gradient by the world size, so the average is its single-process gradient. Method terms
that stay per rank (TCL's belief consistency, DUQ's InfoNCE, IDUM and KL terms, batch norm
statistics) are averaged over the ranks as DDP always does.

The model's state_dict is unchanged (the DDP wrapper is held outside the module tree), so
checkpoints load in a single process.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist
from torch import nn

from .. import distributed
from ..losses import evidential_loss

__all__ = ["GlobalBatch", "enable_global_batch", "global_batch", "loss_function", "run_synced",
           "supports_global_batch"]

_ATTRIBUTE = "_evidential_global_batch"


class _Closure(nn.Module):
    """What DDP wraps: `forward(fn, *args)` runs the loss closure, so DDP prepares its reducer."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable, *args, **kwargs):
        return fn(*args, **kwargs)


class GlobalBatch:
    """The data-parallel state of one model: its process group and its DDP wrapper."""

    def __init__(self, model: nn.Module, group=None, **ddp_kwargs):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("enable_global_batch needs torch.distributed initialised (torchrun + "
                               "torch.distributed.init_process_group())")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.ddp = nn.parallel.DistributedDataParallel(_Closure(model), process_group=group, **ddp_kwargs)

    def evidential_loss(self, x, y, **keywords):
        """The global-batch loss, gradient scaled for DDP's average (`ddp=True`)."""
        return distributed.evidential_loss(x, y, group=self.group, ddp=True, **keywords)

    def run(self, fn: Callable, *args, **kwargs):
        return self.ddp(fn, *args, **kwargs)


def supports_global_batch(model: nn.Module) -> bool:
    """Whether `model.training_step` runs its forward passes through `run_synced` (and its
    evidential term through `loss_function` / the `GlobalBatch`), so that `enable_global_batch`
    makes it data-parallel: a `supports_global_batch` attribute of the model (class) when it has
    one, else True for TCL, TcVSE and DUQ and False for every other model."""
    declared = getattr(model, "supports_global_batch", None)
    if declared is not None:
        return bool(declared)
    from .duq import DUQ
    from .tcl import TCL  # TcVSE is a TCL

    return isinstance(model, (TCL, DUQ))


def enable_global_batch(model: nn.Module, group=None, **ddp_kwargs) -> GlobalBatch:
    """Make `model.training_step` data-parallel over `group` (None: the default group).

    Call it once the model is on its device, on every rank. ddp_kwargs go to
    DistributedDataParallel (e.g. device_ids=[local_rank] on GPUs). Parameters are broadcast from
    rank 0 on the way in. Returns the `GlobalBatch` (also `global_batch(model)`).

    Raises TypeError for a model whose training step does not go through `run_synced`
    (`supports_global_batch`: UML, FUME, InfoNCEBaseline), which DDP could not average.
    """
    if not supports_global_batch(model):
        raise TypeError(
            f"enable_global_batch: {type(model).__name__}.training_step does not run its forward passes through "
            "models.data_parallel.run_synced, so DistributedDataParallel would never average its gradients and "
            "every rank would train on its own batch; data-parallel training supports TCL, TcVSE and DUQ (a "
            "model class written with run_synced / loss_function can declare supports_global_batch = True)")
    state = GlobalBatch(model, group, **ddp_kwargs)
    object.__setattr__(model, _ATTRIBUTE, state)  # a plain attribute: not a submodule, not in state_dict
    return state


def global_batch(model: nn.Module) -> GlobalBatch | None:
    return getattr(model, _ATTRIBUTE, None)


def loss_function(model: nn.Module) -> Callable:
    """`evidential_ops.evidential_loss`, or the global-batch loss once `enable_global_batch` ran."""
    state = global_batch(model)
    return evidential_loss if state is None else state.evidential_loss


def run_synced(model: nn.Module, fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), inside DDP's forward when the model trains data-parallel."""
    state = global_batch(model)
    return fn(*args, **kwargs) if state is None else state.run(fn, *args, **kwargs)
