"""The project's differential fuzzer: random short PyTorch programs on CPU and
on `tpu` (strict eager, `torch_tpu.fused()`, `torch.compile(backend="tpu")`),
compared value by value; a difference is shrunk to a minimal reproducer.

- generator.py: programs as data (inputs with their values, one line per step);
- runner.py: running them on each path and comparing (what is compared, and
  the tolerances, are in its docstring);
- shrink.py: the shrinker;
- known.py: the classes found and not fixed yet, each with its reason and issue;
- `python -m tests.fuzz --help`: the command line.

tests/test_fuzz.py runs a seeded bounded run in the default test run and a
longer one in the slow set (docs/troubleshooting.md, "The differential fuzzer").
"""
