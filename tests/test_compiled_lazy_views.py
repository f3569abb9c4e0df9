"""Lazy conj/neg views inside compiled graphs are computed, not aliased.

Eager keeps `x.conj()` as a view with a conjugate bit; inside a graph an
array is a value, so `aten._conj` must conjugate (a compiled `fft.ifft` of a
real input returned its conjugate when `_conj` was read as an alias).
"""

import torch

import torch_tpu  # noqa: F401


def _check(f, *args):
    torch._dynamo.reset()
    want = f(*args)
    got = torch.compile(f, backend="tpu")(*[a.to("tpu") for a in args])
    torch.testing.assert_close(got.cpu(), want)


def test_ifft_of_real_input():
    _check(lambda a: torch.fft.ifft(a), torch.randn(7))
    _check(lambda a: torch.fft.ihfft(a), torch.randn(6))


def test_conj_and_neg_views():
    z = torch.randn(4, dtype=torch.complex64)
    _check(lambda a: a.conj() * 2, z)
    _check(lambda a: (a.conj().imag + 1), z)
    _check(lambda a: torch.view_as_real(a.conj().resolve_conj()), z)
