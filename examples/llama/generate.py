"""Generate text with the Llama 3 example: KV-cache greedy or top-p/top-k sampling.

    python examples/llama/generate.py --device tpu --prompt "12+34=" --steps 16
    python examples/llama/generate.py --load /tmp/llama.pt --prompt "12+34="          # after train.py --save
    python examples/llama/generate.py --checkpoint /path/to/hf-dir --dtype bfloat16 \
        --prompt "The capital of France is" --temperature 0.7 --top-p 0.9
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from examples.common.lm import generate_main  # noqa: E402
from examples.llama.family import FAMILY  # noqa: E402


def main(argv=None):
    return generate_main(FAMILY, argv)


if __name__ == "__main__":
    main()
