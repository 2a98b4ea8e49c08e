"""Helpers for the turbo kernel tests: Triton's interpreter on CPU, poisoned outputs, relative error vs float64."""
import os

import torch

if not torch.cuda.is_available():  # the real kernels on a GPU; Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first `import triton`

from primus.turbo import _common  # noqa: E402

_common.POISON = True  # every kernel output starts as NaN / int-min

ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"


def relerr(out, ref) -> float:
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "non-finite (unwritten / NaN-poisoned) elements in the output"
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den > 0 else 1.0)


# relative-error bands: fp32 arithmetic far under 1e-3; bf16 operands 1e-3..1e-2
BAND = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def assert_compiles_like_eager(fn, *inputs):
    """fn(*inputs) -> a scalar: under torch.compile(fullgraph=True; a graph break raises) equal to eager, and so are
    the gradients of the inputs (leaf tensors that require grad)."""
    import torch._dynamo

    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    out.backward()
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    ref = fn(*ref_inputs)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    for t, r in zip(inputs, ref_inputs):
        torch.testing.assert_close(t.grad, r.grad, rtol=1e-4, atol=1e-4)


def backward_ops(loss) -> set:
    """The aten ops dispatched by loss.backward(). A custom op that returns saved tensors as outputs gets a zero
    "gradient" filled for each of them before its backward runs, unless it calls ctx.set_materialize_grads(False):
    a test asserts no zeros / fill appear here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        loss.backward()
    return rec.ops


def fills(ops) -> list:
    return [o for o in ops if "zero" in o or "fill" in o]
