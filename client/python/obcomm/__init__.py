"""obcomm: collectives and 1-bit Adam for data-parallel training over TCP,
for PyTorch.

    import obcomm, obcomm.torch
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=1e-3,
                                  freeze_step=1000)

`import obcomm` needs no torch (a Communicator imports it at its first
tensor); `import obcomm.torch` imports torch. A Communicator joins the
node's obcommd (one per node) as a trainer of a job; under torchrun every
argument comes from the environment. Importing obcomm.torch registers the torch.distributed backend "obcomm"
(init_process_group("obcomm"), backend.py), which shares that join. The C
library libobcomm does the work (see the project README and
include/obcomm.h); this package reaches it through ctypes.
"""

from .comm import Communicator, ObcommError, strerror  # noqa: F401
from ._lib import path as library_path  # noqa: F401


def __getattr__(name):
    """obcomm.torch on its first use: `import obcomm` does not import
    torch; `import obcomm.torch` (or reading obcomm.torch) does, and
    registers the backend."""
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _version():
    """meson.build's project version: an installed package has it in
    _build_config.py (meson or pip wrote it), the source tree in
    meson.build itself."""
    try:
        from ._build_config import VERSION
        return VERSION
    except ImportError:
        pass
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    try:
        with open(os.path.join(root, "meson.build")) as f:
            m = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'",
                          f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


__version__ = _version()
__all__ = ["Communicator", "ObcommError", "strerror"]
