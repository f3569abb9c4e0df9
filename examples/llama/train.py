"""Train the Llama 3 example as a causal language model.

    python examples/llama/train.py --device tpu --steps 20            # tiny config, seconds
    python examples/llama/train.py --device cpu --steps 20            # the same on the CPU
    python examples/llama/train.py --compile                          # torch.compile(backend="tpu")
    python examples/llama/train.py --save /tmp/llama.pt --save-hf /tmp/llama-hf
    torchrun --nproc-per-node 2 examples/llama/train.py --dp 2       # data parallel
    torchrun --nproc-per-node 2 examples/llama/train.py --tp 2       # tensor parallel

Data: a generated arithmetic text ("37+5=42\n", byte tokens) or --text-file.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from examples.common.lm import train_main  # noqa: E402
from examples.llama.family import FAMILY  # noqa: E402


def main(argv=None):
    return train_main(FAMILY, argv)


if __name__ == "__main__":
    main()
