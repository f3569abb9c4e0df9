"""Builds torch_tpu's native fast path (csrc/*.cpp -> torch_tpu.runtime._native).

Everything else is in pyproject.toml. The extension compiles against the
torch `import torch` finds here: the build backend
(build_backend/torch_tpu_backend.py) makes it the one already installed in
the target environment, or, where that has none in the supported range,
the range's newest release, installed for the build. TORCH_TPU_NATIVE=0 at install time skips
it (a platform without a C++ compiler); torch_tpu then runs its pure-Python
path, and `torch_tpu.runtime.fastpath.ACTIVE` says which one is in use.
"""

import glob
import os

from setuptools import setup

ext_modules = []
cmdclass = {}
if os.environ.get("TORCH_TPU_NATIVE", "").strip().lower() not in ("0", "false", "no", "off"):
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext_modules.append(CppExtension(
        "torch_tpu.runtime._native",
        # csrc/README.md: which file holds what.
        ["csrc/fastpath.cpp", "csrc/classify.cpp", "csrc/tensors.cpp", "csrc/call.cpp",
         "csrc/entry.cpp", "csrc/kernel.cpp", "csrc/register.cpp", "csrc/device_guard.cpp"],
        # (a header change rebuilds the extension too)
        depends=sorted(glob.glob("csrc/*.h")),
        # runtime/fastpath.py loads it only into this torch (the C++ ABI).
        define_macros=[("TORCH_TPU_TORCH_VERSION", f'"{torch.__version__}"')],
        extra_compile_args=["-O2", "-g0"]))
    cmdclass["build_ext"] = BuildExtension.with_options(no_python_abi_suffix=False)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
