"""Long 1-D convolutions on the CPU as products of spectra (the FFT form).

A convolution layer correlates: ``y[n, f, t] = sum_c sum_k w[f, c, k] x[n, c, t + k]``. With the
real FFT of length ``L`` at least the padded signal's, that is ``Y(w) = sum_c X_c(w)
conj(W_fc(w))`` at every frequency (no wrap-around reaches a kept sample), and the two gradients
are products too: the kernel's ``sum_n conj(G_nf(w)) X_nc(w)``, the input's ``sum_f G_nf(w)
W_fc(w)``. Each is one batched matrix product over the frequencies.

Why: a direct convolution costs ``K`` multiply-adds per output and channel pair, the FFT form
about one plus the transforms. C1's first layer (64 windows of 129 x 200, 40 filters of 25
taps), two threads: forward 7-11 against 22 ms, kernel gradient 6 against 25-32 ms; at 10 taps
the forward about even and the gradient 5 against 13 ms; at 5 taps the direct form wins. The
sums differ from oneDNN's by float rounding (about 5e-7 of the largest output, 4e-6 of the
largest gradient, fp32): the rewrites' first-batch check still applies. Memory: the backward
keeps the signal's spectrum (about one more copy of the input) where the kernel needs a
gradient, the kernel's where the input does.

Only fp32 on the CPU outside autocast (``fits``): on CUDA cuDNN's own algorithms are timed
instead, and under autocast the low precision is the point. First derivatives only: the saved
spectra are outside the graph, so a double backward (a gradient penalty) raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scipy.fft import next_fast_len

FFT_TAPS = 10  # taps from which the FFT form is used (the module docstring's measurements)


def fits(signal: torch.Tensor, kernel: torch.Tensor, stride: int = 1, dilation: int = 1) -> bool:
    """Whether ``FFTConv1d`` computes this convolution, and faster (the module docstring)."""
    return (stride == dilation == 1 and kernel.shape[-1] >= FFT_TAPS
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (signal, kernel))
            and not torch.is_autocast_enabled("cpu"))


def _spectrum(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` (A, B, T) as its real FFT, frequencies first (F, A, B), contiguous: a batched
    matrix product sums over B at every frequency."""
    return torch.fft.rfft(x, n=length).permute(2, 0, 1).contiguous()


def _signal(spectrum: torch.Tensor, length: int, keep: int) -> torch.Tensor:
    """The inverse of ``_spectrum``: (A, B, keep), the first ``keep`` samples, contiguous."""
    return torch.fft.irfft(spectrum.permute(1, 2, 0), n=length)[..., :keep].contiguous()


class FFTConv1d(torch.autograd.Function):
    """``F.conv1d(F.pad(signal, padding), kernel, bias)`` (stride and dilation 1) in the FFT
    form; ``padding`` is (left, right) zeros along time."""

    @staticmethod
    def forward(ctx, signal, kernel, bias, padding):
        left, right = padding
        padded = F.pad(signal, (left, right)) if left or right else signal
        width, taps = padded.shape[-1], kernel.shape[-1]
        length = next_fast_len(width, real=True)  # a prime length is slow
        signal_f, kernel_f = _spectrum(padded, length), _spectrum(kernel, length)
        out = _signal(torch.bmm(signal_f, kernel_f.transpose(1, 2).conj()), length,
                      width - taps + 1)
        if bias is not None:
            out += bias[:, None]
        ctx.save_for_backward(signal_f if ctx.needs_input_grad[1] else None,
                              kernel_f if ctx.needs_input_grad[0] else None)
        ctx.shape = (left, right, width, taps, length, bias is not None)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        signal_f, kernel_f = ctx.saved_tensors
        left, right, width, taps, length, has_bias = ctx.shape
        grad_f = _spectrum(grad.contiguous(), length)
        grad_signal = grad_kernel = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_signal = _signal(torch.bmm(grad_f, kernel_f), length, width)
            grad_signal = grad_signal[..., left:width - right].contiguous()
        if ctx.needs_input_grad[1]:
            grad_kernel = _signal(torch.bmm(grad_f.transpose(1, 2).conj(), signal_f), length, taps)
        if has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum((0, 2))
        return grad_signal, grad_kernel, grad_bias, None


conv1d = FFTConv1d.apply  # (signal, kernel, bias, (left, right) padding): check ``fits`` first
