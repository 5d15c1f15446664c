"""k3model.common's whole-vector sigmoid and depth softmax: an element's bits do not depend on the
length of the tensor it sits in (torch's own kernels put a remainder through scalar code)."""

import torch

from k3model.common import sigmoid_vectorized, softmax0_vectorized


def test_sigmoid_bits_do_not_depend_on_the_tensor_length():
    torch.manual_seed(0)
    x = torch.randn(200) * 3
    # Where torch.sigmoid parts from itself (a 16-value tensor through its scalar path, a long one through
    # vectors: seen with AVX-512, not on an AVX2 EPYC with torch 2.13), the whole-vector form must not.
    whole = sigmoid_vectorized(x)
    for n in (1, 4, 16, 31, 33, 100):
        assert torch.equal(sigmoid_vectorized(x[:n]), whole[:n])
        assert torch.equal(sigmoid_vectorized(x[:n].view(n, 1)), whole[:n].view(n, 1))
    torch.testing.assert_close(whole, torch.sigmoid(x), rtol=1e-6, atol=0)


def test_depth_softmax_bits_do_not_depend_on_the_number_of_columns():
    torch.manual_seed(1)
    x = torch.randn(3, 100) * 3
    whole = softmax0_vectorized(x)
    for n in (1, 4, 9, 31, 64):
        assert torch.equal(softmax0_vectorized(x[:, :n].contiguous()), whole[:, :n])
    torch.testing.assert_close(whole, x.softmax(0), rtol=1e-6, atol=0)
    x3 = x[:, :36].reshape(3, 4, 9)
    assert torch.equal(softmax0_vectorized(x3), whole[:, :36].reshape(3, 4, 9))


def test_gradients_flow_like_torch():
    x = torch.randn(7, 3, requires_grad=True)
    sigmoid_vectorized(x).sum().backward()
    ref = torch.sigmoid(x.detach()) * (1 - torch.sigmoid(x.detach()))
    torch.testing.assert_close(x.grad, ref, rtol=1e-5, atol=1e-7)
