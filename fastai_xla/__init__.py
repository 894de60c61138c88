__version__ = "0.1.0"
# the backends, which register themselves with `backend.BACKENDS` when imported (00_backend: the interface names no
# implementation); neither imports its runtime (torch_xla, torch-tpu) before it is chosen and used
from . import backend_xla, backend_native  # noqa: F401, E402
