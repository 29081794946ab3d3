"""Input validation of SPEC §5: every bad argument is a ValueError/TypeError that names it.

Nothing is broadcast silently: shapes must match exactly, dtypes must agree, tensors must share
a device. Checks that read tensor values (finiteness, target range, the reference's float32
overflow) go through `require`: in eager mode a ValueError right away on every device (on a GPU
this reads one bool back, a host synchronisation: `check_finite=False` skips the finiteness
checks and that read); where no value can be read (while torch.compile traces, on fake tensors,
while a CUDA graph is captured) an asynchronous assert (`torch._assert_async`) that neither
breaks the graph nor waits for the device: RuntimeError with the same message on CPU, a
device-side assert on CUDA. Meta tensors have no values and are not checked.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch
from torch import Tensor

from .config import (
    DEFAULT_WEIGHTS,
    DIRECTIONS,
    EVIDENCE_KINDS,
    MATMUL_PRECISIONS,
    REDUCTIONS,
    TERMS,
    LossConfig,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def values_unreadable(t: Tensor) -> bool:
    """Whether reading `t`'s values now is impossible or forbidden: while torch.compile traces, for
    a fake tensor, or while a CUDA graph is being captured."""
    from torch._subclasses.fake_tensor import is_fake

    if torch.compiler.is_compiling() or is_fake(t):
        return True
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# torch._assert_async on a CUDA tensor refuses a message of 255 bytes or more (RuntimeError
# "Message length must be smaller than 255", seen with torch 2.11 on an H200).
CUDA_ASSERT_MESSAGE_BYTES = 254


def async_assert_message(message: str, device: torch.device) -> str:
    """`message` as a device-side assert can carry it: on CUDA cut to CUDA_ASSERT_MESSAGE_BYTES
    bytes (UTF-8, ending "..."); every message starts with the argument and what is wrong with it."""
    data = message.encode()
    if device.type != "cuda" or len(data) <= CUDA_ASSERT_MESSAGE_BYTES:
        return message
    return data[: CUDA_ASSERT_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."


class NonFiniteError(ValueError):
    """A tensor that must be finite holds NaN or Inf (check_finite=True)."""


def require(condition: Tensor, message: str, error: type[ValueError] = ValueError) -> None:
    """Raise `error`(`message`) unless the 0-D bool tensor `condition` holds; an asynchronous
    assert where values cannot be read (see the module docstring; on CUDA its message is cut to
    what a device-side assert carries, `async_assert_message`)."""
    if condition.device.type == "meta":
        return
    if values_unreadable(condition):
        torch._assert_async(condition, async_assert_message(message, condition.device))
    elif not bool(_every_batch_member(condition)):
        raise error(message)


def _every_batch_member(condition: Tensor) -> Tensor:
    """`condition` as Python may branch on it: itself, outside torch.func transforms (no extra op
    on the hot path). Under them it is a wrapper: under vmap a batched tensor, whose bool() is
    refused as data-dependent control flow. The values are concrete there (eager), so the
    condition is read off the unwrapped tensor, over every member of the batch at once."""
    functorch = torch._C._functorch
    if not functorch.is_functorch_wrapped_tensor(condition):
        return condition
    while functorch.is_functorch_wrapped_tensor(condition):
        condition = functorch.get_unwrapped(condition)
    return condition.all()


def require_finite(t: Tensor, name: str) -> None:
    require(torch.isfinite(t).all(), f"{name} contains NaN or Inf (pass check_finite=False to skip this check)",
            NonFiniteError)


def real_number(
    value,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
) -> float:
    """A finite Python real in [minimum, maximum] (or (minimum, ...] with min_inclusive=False)."""
    if torch.compiler.is_compiling():
        # Under torch.compile a float argument (e.g. TCL's annealed λ) is symbolic so that a new
        # value does not recompile; reading its value would guard on it. Eager calls check it.
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None:
        if min_inclusive and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
        if not min_inclusive and value <= minimum:
            raise ValueError(f"{name} must be > {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def positive_number(value, name: str) -> float:
    return real_number(value, name, minimum=0.0, min_inclusive=False)


def integer(value, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def choice(value, name: str, choices: tuple[str, ...]) -> str:
    """A str among `choices` (TypeError for a non-str, ValueError naming the choices otherwise)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {choices}; got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def tau_value(tau) -> float:
    """τ > 0, finite, and with a finite 1/τ (every evidence map divides by it)."""
    tau = positive_number(tau, "tau")
    if not torch.compiler.is_compiling() and math.isinf(1.0 / tau):
        raise ValueError(f"tau={tau} is so small that 1/tau overflows double precision")
    return tau


def evidence_kind(evidence) -> str:
    return choice(evidence, "evidence", EVIDENCE_KINDS)


def _weight_value(value, term: str):
    """A float weight, or a 0-d floating CPU tensor (detached: weights are constants)."""
    name = f"weights[{term!r}]"
    if not isinstance(value, Tensor):
        return real_number(value, name)
    if value.dim() != 0 or not value.is_floating_point():
        raise TypeError(f"{name} must be a float or a 0-d floating tensor, got a {value.dtype} tensor of shape "
                        f"{tuple(value.shape)}")
    if value.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (the kernels read the weights on the host), got {value.device}")
    value = value.detach()
    require(torch.isfinite(value), f"{name} must be finite")
    return value


def weight_tuple(weights: Mapping[str, float | Tensor] | None) -> tuple[tuple, tuple[bool, ...]]:
    """(weights, enabled) per entry of TERMS from a {term: weight} dict (default DEFAULT_WEIGHTS).

    A weight is a float or a 0-d floating CPU tensor. A float term is enabled when its weight is
    non-zero; a tensor term whenever the dict names it (its value may change between calls
    without a new graph under torch.compile: anneal λ in place, `lam.fill_(value)`). Under
    torch.compile a float weight is symbolic, so every named term is enabled there too.
    """
    if weights is None:
        weights = DEFAULT_WEIGHTS
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights must be a dict term -> float, got {type(weights).__name__}")
    unknown = [key for key in weights if key not in TERMS]
    if unknown:
        raise ValueError(f"weights has unknown key(s) {unknown}; known terms are {TERMS}")
    values = tuple(_weight_value(weights.get(term, 0.0), term) for term in TERMS)
    if torch.compiler.is_compiling():
        # Symbolic weights were not checked above; a NaN λ must still be an error, in the graph.
        require(torch.isfinite(weights_as_tensor(values)).all(), "weights must be finite")
        return values, tuple(term in weights for term in TERMS)
    enabled = tuple(term in weights if isinstance(value, Tensor) else value != 0.0
                    for term, value in zip(TERMS, values))
    if not any(enabled):
        raise ValueError(f"weights must give at least one term a non-zero weight, got {dict(weights)}")
    return values, enabled


def weights_as_tensor(values, device: torch.device | None = None) -> Tensor:
    """The (len(values),) float64 tensor of float or 0-d tensor weights."""
    if not any(isinstance(v, Tensor) for v in values):
        return torch.tensor(values, dtype=torch.float64, device=device)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device) for v in values])


DEFAULT_TAU = 0.05


def _temperature_tensor(value: Tensor, name: str) -> Tensor:
    """A tensor tau or logit_scale: 0-d and floating."""
    if value.dim() != 0:
        raise ValueError(f"{name} must be a 0-d tensor (one temperature for the batch), got shape {tuple(value.shape)}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {value.dtype}")
    return value


def _scalar_tensor(value: Tensor, name: str, like: Tensor) -> Tensor:
    _temperature_tensor(value, name)
    if value.device != like.device:
        raise ValueError(f"{name} is on {value.device} but the inputs are on {like.device}")
    return value


def temperature_arguments(tau, logit_scale) -> None:
    """What `temperature` checks without the inputs: at most one of tau and logit_scale, a valid
    float, or a 0-d floating tensor (its device and value are checked per call)."""
    if tau is not None and logit_scale is not None:
        raise ValueError("pass tau or logit_scale, not both (logit_scale = −ln tau)")
    for value, name in ((tau, "tau"), (logit_scale, "logit_scale")):
        if isinstance(value, Tensor):
            _temperature_tensor(value, name)
    if tau is not None and not isinstance(tau, Tensor):
        tau_value(tau)
    if logit_scale is not None and not isinstance(logit_scale, Tensor):
        real_number(logit_scale, "logit_scale", minimum=-709.0, maximum=709.0)


def temperature_now(tau, logit_scale) -> None:
    """A criterion's construction: `temperature_arguments`, and the value of a tensor tau or
    logit_scale checked now as every call checks it (one read of a 0-d tensor)."""
    temperature_arguments(tau, logit_scale)
    if isinstance(tau, Tensor):
        temperature(tau, None, tau)
    elif isinstance(logit_scale, Tensor):
        temperature(None, logit_scale, logit_scale)


def temperature(tau, logit_scale, like: Tensor) -> tuple[float, Tensor | None]:
    """The temperature of a loss call: (τ for the kernels, 1/τ as a tensor or None).

    A float τ (or a float logit_scale, τ = exp(−logit_scale)) goes to the kernels as it is: (τ,
    None). A tensor τ or logit_scale (0-d, floating, on the inputs' device, possibly learnable)
    scales the inputs instead, s/τ = (x·(1/τ))·yᵀ, and the kernels run at τ = 1: ∂L/∂τ then comes
    from autograd through that product, on every backend and with no K×K buffer, and a new value
    never recompiles a torch.compile'd step. 1/τ = exp(logit_scale) (CLIP's learnable scale).
    """
    if tau is not None and logit_scale is not None:
        raise ValueError("pass tau or logit_scale, not both (logit_scale = −ln tau)")
    if logit_scale is None:
        if not isinstance(tau, Tensor):
            return tau_value(DEFAULT_TAU if tau is None else tau), None
        tau = _scalar_tensor(tau, "tau", like)
        require(torch.isfinite(tau) & (tau > 0) & torch.isfinite(1.0 / tau), "tau must be positive and finite with a finite 1/tau")
        return 1.0, 1.0 / tau
    if not isinstance(logit_scale, Tensor):
        logit_scale = real_number(logit_scale, "logit_scale")
        if not torch.compiler.is_compiling() and (logit_scale > 709.0 or logit_scale < -709.0):
            raise ValueError(f"logit_scale={logit_scale} overflows: tau = exp(-logit_scale) must be a finite, non-zero double")
        return tau_value(math.exp(-logit_scale)), None
    logit_scale = _scalar_tensor(logit_scale, "logit_scale", like)
    inv_tau = logit_scale.exp()
    require(torch.isfinite(inv_tau) & (inv_tau > 0), "logit_scale overflows: exp(logit_scale) must be finite and non-zero")
    return 1.0, inv_tau


def loss_config(
    *,
    evidence,
    tau=DEFAULT_TAU,
    weights,
    direction,
    reduction,
    check_finite=True,
    matmul_precision="ieee",
) -> LossConfig:
    flag(check_finite, "check_finite")
    values, enabled = weight_tuple(weights)
    return LossConfig(
        evidence=evidence_kind(evidence),
        tau=tau_value(DEFAULT_TAU if tau is None else tau),
        weights=values,
        enabled=enabled,
        direction=choice(direction, "direction", DIRECTIONS),
        reduction=choice(reduction, "reduction", REDUCTIONS),
        check_finite=check_finite,
        matmul_precision=choice(matmul_precision, "matmul_precision", MATMUL_PRECISIONS),
    )


def float_matrix(t, name: str, check_finite: bool, *, min_rows: int = 2) -> Tensor:
    """A 2-D floating tensor with at least `min_rows` rows (a loss needs K >= 2) and one column."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}"
        )
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (K, D), got shape {tuple(t.shape)}")
    if t.shape[0] < min_rows:
        what = "K >= 2 rows (a Dirichlet over >= 2 candidates)" if min_rows == 2 else f">= {min_rows} rows"
        raise ValueError(f"{name} needs {what}, got shape {tuple(t.shape)}")
    if t.shape[1] < 1:
        raise ValueError(f"{name} has an empty second dimension: shape {tuple(t.shape)}")
    if check_finite:
        require_finite(t, name)
    return t


def same_kind(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.device != b.device:
        raise ValueError(f"{name_b} is on {b.device} but {name_a} is on {a.device}")
    if a.dtype != b.dtype:
        raise TypeError(f"{name_b} has dtype {b.dtype} but {name_a} has {a.dtype}; cast one of them")


def embedding_pair(x, y, check_finite: bool, *, square: bool = True) -> tuple[Tensor, Tensor]:
    """x: (K, D) queries, y: (K, D) candidates; pair i = (x_i, y_i). With square=False the
    candidate count may differ and a single query is allowed (opinions over a gallery)."""
    x = float_matrix(x, "x", check_finite, min_rows=2 if square else 1)
    y = float_matrix(y, "y", check_finite)
    same_kind(x, y, "x", "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have the same embedding size D, got x {tuple(x.shape)} and y {tuple(y.shape)}")
    if square and x.shape[0] != y.shape[0]:
        raise ValueError(
            f"x and y must have the same number of rows K (positives on the diagonal), "
            f"got x {tuple(x.shape)} and y {tuple(y.shape)}"
        )
    return x, y


def similarity_matrix(s, check_finite: bool, *, square: bool = True) -> Tensor:
    """s: (K, K) with positives on the diagonal, or with square=False (N_q >= 1, N_g >= 2)."""
    s = float_matrix(s, "s", check_finite, min_rows=2 if square else 1)
    if s.shape[1] < 2:
        raise ValueError(f"s needs >= 2 candidates per row, got shape {tuple(s.shape)}")
    if square and s.shape[0] != s.shape[1]:
        raise ValueError(f"s must be square (K, K) with positives on the diagonal, got {tuple(s.shape)}")
    return s


def target_scale_vector(target_scale, k: int, like: Tensor, check_values: bool) -> Tensor | None:
    """c (K,) in [0, 1], or None for the plain one-hot target. Treated as a constant label."""
    if target_scale is None:
        return None
    if not isinstance(target_scale, Tensor):
        raise TypeError(f"target_scale must be a torch.Tensor of shape ({k},), got {type(target_scale).__name__}")
    if not target_scale.is_floating_point() and target_scale.dtype != torch.bool:
        raise TypeError(f"target_scale must be a floating or bool tensor, got {target_scale.dtype}")
    if target_scale.shape != (k,):
        raise ValueError(f"target_scale must have shape ({k},), got {tuple(target_scale.shape)}")
    if target_scale.device != like.device:
        raise ValueError(f"target_scale is on {target_scale.device} but the inputs are on {like.device}")
    target_scale = target_scale.detach()
    if check_values and target_scale.dtype != torch.bool:
        require(((target_scale >= 0) & (target_scale <= 1)).all(), "target_scale must lie in [0, 1] (and contain no NaN)")
    return target_scale


def output_dtype(input_dtype: torch.dtype) -> torch.dtype:
    """Losses are float32, or float64 for float64 inputs (SPEC §5)."""
    return torch.float64 if input_dtype == torch.float64 else torch.float32


def group_ids(group, k: int, like: Tensor, drop_self: bool) -> Tensor | None:
    """InfoNCE group ids (SPEC §2 "InfoNCE"): None, or a (K,) integer tensor on the inputs'
    device, returned as int64 (a constant: ids carry no gradient). With drop_self every line needs
    another member of its group, so no ids at all, or a group of one, is a ValueError naming group
    (checked with `require`: eagerly, or as an asynchronous assert while tracing)."""
    if group is None:
        if drop_self:
            raise ValueError("group is required with drop_self=True: without group ids a line's only positive is "
                             "itself, which drop_self removes")
        return None
    if not isinstance(group, Tensor):
        raise TypeError(f"group must be a torch.Tensor of integer ids of shape ({k},), got {type(group).__name__}")
    if group.is_floating_point() or group.is_complex() or group.dtype == torch.bool:
        raise TypeError(f"group must be an integer tensor of ids, got {group.dtype}")
    if group.shape != (k,):
        raise ValueError(f"group must have shape ({k},), got {tuple(group.shape)}")
    if group.device != like.device:
        raise ValueError(f"group is on {group.device} but the inputs are on {like.device}")
    group = group.detach().to(torch.int64)
    if drop_self:
        ids = group.sort().values
        differs = ids[1:] != ids[:-1]
        edge = torch.ones(1, dtype=torch.bool, device=ids.device)
        alone = torch.cat([edge, differs]) & torch.cat([differs, edge])
        require(~alone.any(), "group: with drop_self=True every line needs another member of its group (a group of "
                              "one leaves a line without positives)")
    return group
