"""The FFT form of a long 1-D convolution (``speedups/spectra.py``) computes what ``F.conv1d``
computes, output and all three gradients, with padding on either side and at lengths whose FFT
is padded to a fast size; and it is used only where it was measured: fp32 on the CPU, outside
autocast, stride and dilation 1, long kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridnb.speedups import spectra


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize(("shape", "padding", "bias"), [
    ((6, 5, 40, 3, 11), (0, 0), True),
    ((6, 5, 49, 3, 16), (7, 8), False),  # "same" with an even kernel; 64 samples: 2^6
    ((4, 1, 53, 8, 12), (2, 2), True),  # 57 samples: the FFT runs at 60
])
def test_the_fft_form_computes_conv1d_and_its_gradients(shape, padding, bias):
    n, chans, width, filters, taps = shape
    torch.manual_seed(0)
    x = torch.randn(n, chans, width, requires_grad=True)
    w = torch.randn(filters, chans, taps, requires_grad=True)
    b = torch.randn(filters, requires_grad=True) if bias else None
    inputs = [t for t in (x, w, b) if t is not None]
    stock = F.conv1d(F.pad(x, padding), w, b)
    fast = spectra.conv1d(x, w, b, padding)
    assert fast.shape == stock.shape and fast.is_contiguous()
    assert rel(fast, stock) < 1e-5
    grad = torch.randn_like(stock)
    for a, c in zip(torch.autograd.grad(stock, inputs, grad), torch.autograd.grad(fast, inputs, grad),
                    strict=True):
        assert rel(c, a) < 1e-5


def test_it_is_used_only_where_it_was_measured():
    x, w = torch.randn(2, 3, 50), torch.randn(4, 3, spectra.FFT_TAPS)
    assert spectra.fits(x, w)
    assert not spectra.fits(x, w[..., :-1])  # short kernel: the direct form wins
    assert not spectra.fits(x, w, stride=2) and not spectra.fits(x, w, dilation=2)
    assert not spectra.fits(x.double(), w.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not spectra.fits(x, w)



def test_a_frozen_kernel_still_gives_the_input_its_gradient():
    """Only the kernel's spectrum is kept then (the signal's would serve the kernel's gradient)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 30, requires_grad=True)
    w = torch.randn(5, 4, 12)
    stock = F.conv1d(F.pad(x, (2, 3)), w)
    fast = spectra.conv1d(x, w, None, (2, 3))
    grad = torch.randn_like(stock)
    assert rel(torch.autograd.grad(fast, x, grad)[0], torch.autograd.grad(stock, x, grad)[0]) < 1e-5
