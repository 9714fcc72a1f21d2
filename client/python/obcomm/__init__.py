"""obcomm: collectives and 1-bit Adam for data-parallel training over TCP,
for PyTorch.

    import obcomm, obcomm.torch
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=1e-3,
                                  freeze_step=1000)

A Communicator joins the node's obcommd (one per node) as a trainer of a
job; under torchrun every argument comes from the environment. Importing
obcomm.torch registers the torch.distributed backend "obcomm"
(init_process_group("obcomm"), backend.py), which shares that join. The C
library libobcomm does the work (see the project README and
include/obcomm.h); this package reaches it through ctypes.
"""

from .comm import Communicator, ObcommError, strerror  # noqa: F401
from ._lib import path as library_path  # noqa: F401
from . import torch  # noqa: F401,E402  (obcomm.torch.OneBitAdam)

__version__ = "0.1.0"
__all__ = ["Communicator", "ObcommError", "strerror", "torch"]
