"""A first run of torch_tpu: tensors, a model, a training step on the `tpu` device."""

import torch
import torch_tpu  # noqa: F401  (also registered by `import torch` once installed)

print("tpu devices:", torch.tpu.device_count(), "-", torch.tpu.get_device_name())
x = torch.randn(8, 4, device="tpu")
print(x)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
target = torch.randn(8, 1, device="tpu")
for step in range(5):
    loss = torch.nn.functional.mse_loss(model(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step}: loss {loss.item():.4f}")
