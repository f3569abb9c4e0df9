"""Train the Qwen3 example as a causal language model.

    python examples/qwen/train.py --device tpu --steps 20            # tiny config, seconds
    python examples/qwen/train.py --device cpu --steps 20            # the same on the CPU
    python examples/qwen/train.py --compile                          # torch.compile(backend="tpu")
    python examples/qwen/train.py --save /tmp/qwen.pt --save-hf /tmp/qwen-hf
    torchrun --nproc-per-node 2 examples/qwen/train.py --dp 2       # data parallel
    torchrun --nproc-per-node 2 examples/qwen/train.py --tp 2       # tensor parallel

Data: a generated arithmetic text ("37+5=42\n", byte tokens) or --text-file.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from examples.common.lm import train_main  # noqa: E402
from examples.qwen.family import FAMILY  # noqa: E402


def main(argv=None):
    return train_main(FAMILY, argv)


if __name__ == "__main__":
    main()
