"""torch.fft on tpu vs CPU: the three ATen FFT primitives behind every function."""

import pytest
import torch

import torch_tpu  # noqa: F401

CASES = {
    "fft": lambda t: torch.fft.fft(t),
    "ifft_ortho": lambda t: torch.fft.ifft(t, norm="ortho"),
    "rfft": lambda t: torch.fft.rfft(t),
    "irfft": lambda t: torch.fft.irfft(torch.fft.rfft(t), n=6),
    "fft2_forward": lambda t: torch.fft.fft2(t, norm="forward"),
    "hfft": lambda t: torch.fft.hfft(t.to(torch.complex64)),
    "ihfft": lambda t: torch.fft.ihfft(t),
    "rfftn_padded": lambda t: torch.fft.rfftn(t, s=(3, 8)),
    "fftshift_ifftn": lambda t: torch.fft.fftshift(torch.fft.ifftn(t)),
    "stft": lambda t: torch.stft(t.reshape(-1), 8, return_complex=True),
}


@pytest.fixture(autouse=True)
def _native(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fft_matches_cpu(name):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    expected = CASES[name](x)
    got = CASES[name](x.to("tpu"))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_fft_gradient_matches_cpu():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    grads = []
    for device in ("cpu", "tpu"):
        t = x.to(device).detach().requires_grad_()
        torch.fft.rfft(t).abs().sum().backward()
        grads.append(t.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-4)


def test_conjugate_views_read_as_their_value():
    x = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    t = x.to("tpu").conj()
    assert t.is_conj()
    torch.testing.assert_close(t.cpu(), x.conj())
    torch.testing.assert_close(t.clone().cpu(), x.conj())
    torch.testing.assert_close((t * 2).cpu(), x.conj() * 2)
