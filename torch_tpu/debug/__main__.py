"""`python -m torch_tpu.debug op OP [OP ...]`: print each op's record in the op
table (its lowering, storage kernel, graph-mode rule and padding rule, and
where each was registered); see `torch_tpu.debug.op_table`."""

from __future__ import annotations

import sys

from . import op_table

USAGE = "usage: python -m torch_tpu.debug op OP [OP ...]   (e.g. aten.cat.default)"


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] != "op":
        print(USAGE, file=sys.stderr)
        return 2
    return op_table.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
