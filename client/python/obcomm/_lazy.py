"""torch, imported at its first use: `import obcomm` (a Communicator, its
error codes) needs no torch; a call that takes or makes a tensor imports
it then (the caller holding a tensor has it already). `import
obcomm.torch` imports torch at once."""

import importlib


class _Torch:
    """Stands for the torch module: the first attribute read imports it."""

    __slots__ = ("_module",)

    def __init__(self):
        self._module = None

    def __getattr__(self, name):
        module = self._module
        if module is None:
            module = self._module = importlib.import_module("torch")
        return getattr(module, name)


torch = _Torch()
