"""SPEC §5: every bad input is a ValueError/TypeError that names the offending argument."""

from __future__ import annotations

import re

import pytest
import torch

import evidential_ops as eo
from conftest import random_pairs


@pytest.fixture
def xy(gen):
    return random_pairs(6, 8, generator=gen)


def raises(exc, name):
    return pytest.raises(exc, match=re.escape(name))


def cpu_backends() -> list[str]:
    """The available backends that run on CPU tensors (a CUDA build also lists "cuda")."""
    names = []
    for name in eo.available_backends():
        try:
            eo.backends.resolve(name, torch.device("cpu"))
        except ValueError:
            continue
        names.append(name)
    return names


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        ({"tau": 0.0}, ValueError, "tau"),
        ({"tau": -0.1}, ValueError, "tau"),
        ({"tau": float("nan")}, ValueError, "tau"),
        ({"tau": "0.05"}, TypeError, "tau"),
        ({"tau": True}, TypeError, "tau"),
        ({"evidence": "sigmoid"}, ValueError, "evidence"),
        ({"evidence": None}, TypeError, "evidence"),
        ({"weights": {"risk": 1.0, "klx": 0.1}}, ValueError, "weights"),
        ({"weights": {"risk": "1"}}, TypeError, "weights['risk']"),
        ({"weights": {"risk": float("inf")}}, ValueError, "weights['risk']"),
        ({"weights": {"risk": 0.0}}, ValueError, "weights"),
        ({"weights": [("risk", 1.0)]}, TypeError, "weights"),
        ({"direction": "row"}, ValueError, "direction"),
        ({"reduction": "avg"}, ValueError, "reduction"),
        ({"backend": "gpu"}, ValueError, "backend"),
        ({"backend": 3}, TypeError, "backend"),
        ({"normalize": 1}, TypeError, "normalize"),
        ({"check_finite": "yes"}, TypeError, "check_finite"),
        ({"matmul_precision": "fast"}, ValueError, "matmul_precision"),
    ],
)
def test_bad_keyword(xy, kwargs, exc, name):
    x, y = xy
    with raises(exc, name):
        eo.evidential_loss(x, y, **kwargs)


def test_bad_shapes_and_sizes(xy):
    x, y = xy
    with raises(ValueError, "x and y must have the same number of rows"):
        eo.evidential_loss(x, y[:5])
    with raises(ValueError, "embedding size D"):
        eo.evidential_loss(x, y[:, :7])
    with raises(ValueError, "x must be 2-D"):
        eo.evidential_loss(x[0], y[0])
    with raises(ValueError, "y must be 2-D"):
        eo.evidential_loss(x, y[None])
    with raises(ValueError, "K >= 2"):
        eo.evidential_loss(x[:1], y[:1])
    with raises(TypeError, "x must be a torch.Tensor"):
        eo.evidential_loss(x.numpy(), y)


def test_bad_dtypes(xy):
    x, y = xy
    with raises(TypeError, "x must be float32"):
        eo.evidential_loss(x.to(torch.int64), y.to(torch.int64))
    with raises(TypeError, "y has dtype torch.float64 but x has torch.float32"):
        eo.evidential_loss(x, y.double())
    with raises(TypeError, "s must be float32"):
        eo.evidential_loss_from_similarity(torch.ones(3, 3, dtype=torch.int32))


def test_non_finite_inputs(xy):
    x, y = xy
    x_nan = x.clone()
    x_nan[2, 3] = float("nan")
    with raises(ValueError, "x contains NaN or Inf"):
        eo.evidential_loss(x_nan, y)
    y_inf = y.clone()
    y_inf[0, 0] = float("inf")
    with raises(ValueError, "y contains NaN or Inf"):
        eo.evidential_loss(x, y_inf)
    s = x @ y.T
    s[1, 1] = float("nan")
    with raises(ValueError, "s contains NaN or Inf"):
        eo.evidential_loss_from_similarity(s)


def test_check_finite_false_skips_the_value_check(xy):
    x, y = xy
    x_nan = x.clone()
    x_nan[0, 0] = float("nan")
    loss = eo.evidential_loss(x_nan, y, check_finite=False)
    assert torch.isnan(loss)  # garbage in, garbage out, but no exception and no host sync


def test_bad_similarity_shape(xy):
    x, y = xy
    with raises(ValueError, "s must be square"):
        eo.evidential_loss_from_similarity((x @ y.T)[:, :5])


def test_bad_target_scale(xy):
    x, y = xy
    with raises(ValueError, "target_scale must have shape (6,)"):
        eo.evidential_loss(x, y, target_scale=torch.ones(5))
    with raises(ValueError, "target_scale must have shape (6,)"):
        eo.evidential_loss(x, y, target_scale=torch.ones(6, 1))
    with raises(ValueError, "target_scale must lie in [0, 1]"):
        eo.evidential_loss(x, y, target_scale=torch.full((6,), 1.5))
    with raises(ValueError, "target_scale must lie in [0, 1]"):
        eo.evidential_loss(x, y, target_scale=torch.full((6,), float("nan")))
    with raises(TypeError, "target_scale must be a floating or bool tensor"):
        eo.evidential_loss(x, y, target_scale=torch.ones(6, dtype=torch.int64))
    with raises(TypeError, "target_scale must be a torch.Tensor"):
        eo.evidential_loss(x, y, target_scale=[1.0] * 6)


def test_device_mismatch_is_named(xy):
    x, y = xy
    meta_y = y.to("meta")
    with raises(ValueError, "y is on meta but x is on cpu"):
        eo.evidential_loss(x, meta_y, check_finite=False)
    with raises(ValueError, "target_scale is on meta"):
        eo.evidential_loss(x, y, target_scale=torch.ones(6, device="meta"))


def test_unavailable_backend_is_named(xy):
    x, y = xy
    missing = [b for b in ("triton", "cuda") if b not in eo.available_backends()]
    for name in missing:
        with raises(ValueError, f"backend={name!r} is not available"):
            eo.evidential_loss(x, y, backend=name)


def test_reference_overflow_names_tau(gen):
    """The materialised float32 reference cannot hold e^100 (τ = 0.01): it must say so, not NaN."""
    x, y = random_pairs(6, 8, generator=gen, positive_cos=0.99)
    with raises(ValueError, "tau=0.01 is too small"):
        eo.evidential_loss(x, y, tau=0.01, backend="reference")
    loss64 = eo.reference.evidential_loss(x, y, tau=0.01)  # float64 holds it
    assert torch.isfinite(loss64)


def test_module_validates_at_construction():
    with raises(ValueError, "tau"):
        eo.EvidentialLoss(tau=-1.0)
    with raises(ValueError, "weights"):
        eo.EvidentialLoss(weights={"nope": 1.0})
    with raises(ValueError, "backend"):
        eo.EvidentialLoss(backend="tpu")


def test_opinion_and_belief_validation(xy):
    x, y = xy
    with raises(ValueError, "embedding size D"):
        eo.opinion(x, y[:, :3])
    with raises(ValueError, "tau"):
        eo.opinion(x, y, tau=0)
    op = eo.opinion(x, y[:4])
    with raises(ValueError, "log_strength must have shape"):
        eo.belief(x @ y.T, op.row_log_strength[:3])
    with raises(ValueError, "dim must be 0 or 1"):
        eo.belief(x @ y.T, op.row_log_strength, dim=2)
    with raises(TypeError, "normalize"):
        eo.opinion(x, y, normalize="yes")
    with raises(TypeError, "check_finite"):
        eo.opinion_from_similarity(x @ y.T, check_finite=1)
    with raises(TypeError, "s must be a torch.Tensor"):
        eo.belief([[0.1, 0.2]], op.row_log_strength)
    with raises(TypeError, "s must be float32"):
        eo.belief((x @ y.T).long(), op.row_log_strength)
    with raises(ValueError, "s contains NaN"):
        eo.belief(torch.full((x.shape[0], 4), float("nan")), op.row_log_strength)
    with raises(TypeError, "log_strength must be a floating"):
        eo.belief(x @ y[:4].T, op.row_log_strength.long())


def test_opinion_of_a_single_query_over_a_gallery(xy):
    """One query is a normal inference call; a gallery still needs >= 2 candidates."""
    x, y = xy
    for backend in cpu_backends():
        op = eo.opinion(x[:1], y, backend=backend)
        assert op.row_uncertainty.shape == (1,) and op.col_uncertainty.shape == (y.shape[0],)
        torch.testing.assert_close(op.row_log_strength.double(), eo.reference.opinion(x[:1], y).row_log_strength,
                                   rtol=1e-5, atol=1e-5)
    with raises(ValueError, "y needs K >= 2"):
        eo.opinion(x, y[:1])
    with raises(ValueError, "x needs K >= 2"):
        eo.evidential_loss(x[:1], y[:1])


def test_tau_whose_inverse_overflows_is_named(xy):
    x, y = xy
    for backend in cpu_backends():
        with raises(ValueError, "tau"):
            eo.evidential_loss(x, y, tau=1e-320, backend=backend)
        with raises(ValueError, "tau"):
            eo.opinion(x, y, tau=5e-324, backend=backend)
    with raises(ValueError, "tau"):
        eo.belief(x @ y.T, torch.zeros(6), tau=1e-320)


def test_belief_rejects_a_nan_log_strength(xy):
    x, y = xy
    log_strength = eo.opinion(x, y).row_log_strength.clone()
    log_strength[2] = float("nan")
    with raises(ValueError, "log_strength contains NaN"):
        eo.belief(x @ y.T, log_strength)


def test_meta_tensors_flow_through_the_public_api_on_the_reference():
    x = torch.empty(10, 4, device="meta")
    loss = eo.evidential_loss(x, x, weights={"risk": 1.0, "kl": 0.1, "logdet": -0.01}, target_scale=torch.ones(10, device="meta"))
    assert loss.device.type == "meta" and loss.shape == ()
    op = eo.opinion(x, x)
    assert op.row_uncertainty.device.type == "meta" and op.row_uncertainty.shape == (10,)
    assert eo.belief(torch.empty(10, 3, device="meta"), op.row_log_strength).shape == (10, 3)
    s = torch.empty(10, 10, device="meta")
    assert eo.evidential_loss_from_similarity(s, backend="reference").device.type == "meta"


def test_torch_compile_fullgraph_on_the_reference_with_every_value_check(gen):
    """What `auto` runs on CUDA tensors where no GPU backend is built: compiled with the default
    check_finite=True, a target_scale and the float32 overflow check, all inside one graph."""
    x, y = random_pairs(24, 8, generator=gen)
    scale = torch.rand(24, generator=gen)

    def step(x, y, tau):
        return eo.evidential_loss(x, y, tau=tau, weights={"risk": 1.0, "kl": 0.1, "fmse": 1.0}, target_scale=scale,
                                  backend="reference")

    compiled = torch.compile(step, fullgraph=True)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = step(xe, y, 0.05)
    eager.backward()
    result = compiled(xc, y, 0.05)
    result.backward()
    torch.testing.assert_close(result, eager)
    torch.testing.assert_close(xc.grad, xe.grad)
    bad = x.clone()
    bad[1, 1] = float("inf")
    with pytest.raises(RuntimeError, match="x contains NaN or Inf"):
        compiled(bad, y, 0.05)
    with pytest.raises(RuntimeError, match="too small"):  # e^(1/0.01) overflows float32 row sums
        compiled(random_pairs(24, 8, generator=gen, positive_cos=0.99)[0], y, 0.01)
    with pytest.raises(RuntimeError, match="target_scale must lie in"):
        torch.compile(lambda x: eo.evidential_loss(x, y, target_scale=scale * 3, backend="reference"),
                      fullgraph=True)(x)


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        ({"tau": torch.tensor([0.05])}, ValueError, "tau must be a 0-d tensor"),
        ({"tau": torch.tensor(1)}, TypeError, "tau must be a floating tensor"),
        ({"tau": torch.tensor(-0.05)}, ValueError, "tau must be positive"),
        ({"tau": torch.tensor(0.0)}, ValueError, "tau must be positive"),
        ({"tau": torch.tensor(0.05, device="meta")}, ValueError, "tau is on meta"),
        ({"logit_scale": torch.tensor(1000.0)}, ValueError, "logit_scale overflows"),
        ({"logit_scale": 1000.0}, ValueError, "logit_scale"),
        ({"logit_scale": torch.ones(2)}, ValueError, "logit_scale must be a 0-d tensor"),
        ({"tau": 0.05, "logit_scale": 2.0}, ValueError, "pass tau or logit_scale, not both"),
        ({"weights": {"risk": torch.ones(2)}}, TypeError, "weights['risk']"),
        ({"weights": {"risk": torch.tensor(1)}}, TypeError, "weights['risk']"),
        ({"weights": {"risk": torch.tensor(1.0, device="meta")}}, ValueError, "weights['risk'] must be a CPU tensor"),
        ({"weights": {"risk": torch.tensor(float("nan"))}}, ValueError, "weights['risk'] must be finite"),
        ({"reduction": "average"}, ValueError, "reduction"),
    ],
)
def test_bad_temperature_and_weight_tensors(xy, kwargs, exc, name):
    x, y = xy
    for backend in cpu_backends():
        with raises(exc, name):
            eo.evidential_loss(x, y, backend=backend, **kwargs)


def test_clip_criterion_and_module_validate_temperature(xy):
    x, y = xy
    with raises(ValueError, "pass tau or logit_scale, not both"):
        eo.EvidentialLoss(tau=0.05, logit_scale=1.0)
    with raises(ValueError, "tau must be a 0-d tensor"):
        eo.EvidentialLoss(tau=torch.ones(3))
    with raises(TypeError, "output_dict"):
        eo.EvidentialClipLoss()(x, y, torch.tensor(2.0), output_dict="yes")
    with raises(ValueError, "logit_scale is on meta"):
        eo.EvidentialClipLoss()(x, y, torch.tensor(2.0, device="meta"))


def test_overflow_with_a_tensor_tau_names_its_value():
    """With a tensor τ the kernels run at τ = 1 on x/τ: the overflow error still gives τ's value."""
    x = torch.randn(8, 4) * 100
    for backend in cpu_backends():
        with raises(ValueError, "tau (a tensor) = 0.01"):
            eo.evidential_loss(x, x, tau=torch.tensor(0.01), backend=backend)


def test_async_assert_messages_fit_a_cuda_device_side_assert():
    # torch._assert_async on CUDA refuses a message of 255 bytes or more: the graph-mode checks
    # (launch._overflow_check's is 330 bytes, with "Σα") are cut, on CUDA only, at a character.
    long = "tau=0.05 is too small for evidence='exp': the line strength Σα overflows. " * 5
    cut = eo.checks.async_assert_message(long, torch.device("cuda"))
    assert len(cut.encode()) <= eo.checks.CUDA_ASSERT_MESSAGE_BYTES
    assert cut.endswith("...") and long.startswith(cut[:-3])
    assert eo.checks.async_assert_message(long, torch.device("cpu")) == long
    short = "x contains NaN or Inf"
    assert eo.checks.async_assert_message(short, torch.device("cuda")) == short
