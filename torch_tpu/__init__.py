"""torch_tpu: a PyTorch backend that gives PyTorch a real `tpu` device.

ATen ops on `tpu` tensors run as cached XLA executables through JAX's PJRT
runtime: on a Cloud TPU when present, otherwise on the GPU or the host CPU.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _autoload():
    """Entry point for PyTorch's device-backend autoload (`torch.backends`).

    Defined before anything else: when `import torch_tpu` runs first, torch's
    autoload re-enters this partially initialized module and needs it.
    Importing the package does the work.
    """


from .runtime import platform as _platform  # noqa: F401  (configures JAX first)
from .device import registration as _registration

_registration.register()

from . import ops as _ops  # noqa: E402

_ops.install()

from .device import module as tpu  # noqa: E402,F401
from . import precision as _precision, jax_op  # noqa: E402,F401  (torch.tpu precision/autocast API; torch_tpu.jax_op)
from . import compile as _compile_backend  # noqa: E402,F401  (torch.compile backend "tpu")

from . import distributed as _distributed  # noqa: E402,F401  (torch.distributed backend "tpu")
