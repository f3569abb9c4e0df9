"""complex32 (`chalf`) on tpu: complex64 storage carriers rounded to float16 parts.

Every value and every reinterpreted view must hold exactly CPU's bits.
"""

import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.usefixtures("no_cpu_fallback")]


def _bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.int32) if t.dtype is torch.complex32 else t


def assert_same(cpu, tpu):
    assert tpu.device.type == "tpu"
    assert cpu.dtype == tpu.dtype and cpu.shape == tpu.shape
    assert torch.equal(_bits(cpu), _bits(tpu))


@pytest.fixture
def pair():
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.cfloat) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x.chalf(), x.to("tpu").chalf()


OPS = {
    "chalf": lambda c: c,
    "to_float": lambda c: c.float(),
    "to_cfloat": lambda c: c.cfloat(),
    "add": lambda c: c + c,
    "mul": lambda c: c * c,
    "neg": lambda c: -c,
    "abs": lambda c: c.abs(),
    "conj": lambda c: c.conj().resolve_conj(),
    "view_as_real": torch.view_as_real,
    "view_float32": lambda c: c.view(torch.float32),
    "view_float16": lambda c: c.view(torch.float16),
    "slice": lambda c: c[1:, ::2],
    "transpose_contiguous": lambda c: c.T.contiguous(),
    "cat": lambda c: torch.cat([c, c]),
    "index": lambda c: c[[0, 2]],
    "where": lambda c: torch.where(c.real > 0, c, -c),
    "eq": lambda c: c == c.flip(0),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_cpu(pair, name):
    c, ct = pair
    assert_same(OPS[name](c), OPS[name](ct))


def test_reinterpreting_views_of_other_storages():
    r = torch.randn(4, 2)
    assert_same(r.view(torch.complex32), r.to("tpu").view(torch.complex32))
    assert_same(r.view(torch.complex32), r.view(torch.complex32).to("tpu"))
    z = torch.randn(3, 2, dtype=torch.cfloat)
    assert_same(z.view(torch.complex32), z.to("tpu").view(torch.complex32))


def test_writes_reach_every_view(pair):
    c, ct = pair
    y, yt = c.clone(), ct.clone()
    y[0] = 1 + 2j
    yt[0] = 1 + 2j
    torch.view_as_real(y)[1, :, 0] = 7.5
    torch.view_as_real(yt)[1, :, 0] = 7.5
    y.view(torch.float32)[2, 1] = 3.0
    yt.view(torch.float32)[2, 1] = 3.0
    assert_same(y, yt)


def test_factories_and_copies_round_to_half():
    v = 1.0001 + 0.1j  # not a float16 value: both parts round
    assert_same(torch.full((2,), v, dtype=torch.chalf),
                torch.full((2,), v, dtype=torch.chalf, device="tpu"))
    assert_same(torch.zeros(3, dtype=torch.chalf), torch.zeros(3, dtype=torch.chalf, device="tpu"))
    x = torch.randn(3, 4, dtype=torch.cfloat)
    for src in (x, x.to("tpu")):
        z = torch.empty(3, 4, dtype=torch.chalf, device="tpu")
        z.copy_(src)
        assert_same(x.chalf(), z)


def test_gradient_through_chalf():
    x = torch.randn(3, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    x.chalf().backward(torch.full((3,), 0.5 + 1j, dtype=torch.chalf))
    xt.chalf().backward(torch.full((3,), 0.5 + 1j, dtype=torch.chalf, device="tpu"))
    assert_same(x.grad, xt.grad)


def test_printing(pair):
    assert "dtype=torch.complex32" in repr(pair[1])
