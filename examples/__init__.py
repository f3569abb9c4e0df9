"""Example models for torch_tpu, written in plain PyTorch.

Each example lives in its own folder (llama, qwen, resnet, dlrm, mingpt,
unet) with a model file, a training script and an inference script; see
examples/README.md. `examples.registry.get_example(name)` gives benchmark
tools a model, example inputs and a loss function for each of them.
"""
