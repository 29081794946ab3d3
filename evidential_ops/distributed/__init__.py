"""The evidential loss over the global batch of data-parallel training (torch.distributed).

    import torch.distributed as dist
    import evidential_ops.distributed as eod

    dist.init_process_group()                    # torchrun: NCCL on GPUs, gloo on CPU
    loss = eod.evidential_loss(x, y, tau=0.05)   # x, y: this rank's (K_r, D); the loss of all ranks' pairs
    loss.backward()                              # x.grad, y.grad: ∂L/∂x_r, ∂L/∂y_r of the global loss

    model = DistributedDataParallel(model)       # DDP averages gradients over the ranks:
    loss = eod.evidential_loss(*model(batch), ddp=True)   # ddp=True makes that average exact

docs/distributed.md has the design, the DDP convention and the communication
volume; `loss.py` the algorithm, `comm.py` the collectives.
"""

from .comm import CommunicationCounter, PeerError, PeerInputError
from .loss import EvidentialLoss, communication_volume, evidential_loss

__all__ = ["CommunicationCounter", "EvidentialLoss", "PeerError", "PeerInputError", "communication_volume", "evidential_loss"]
