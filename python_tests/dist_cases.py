"""The cases test_distributed.py runs on 2 and 3 gloo ranks (through dist_harness.run_cases).

Each case is `fn(rank, world) -> dict` of plain numbers/strings, run on every rank of the group
in the same order. The global batch is drawn from a fixed seed on every rank, each rank takes its
strip (uneven sizes, SIZES[world]), and the single-process fused loss on the whole batch is
computed on every rank too: the results are errors against it, which the tests bound.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import evidential_ops as eo
import evidential_ops.distributed as eod

_spec = importlib.util.spec_from_file_location("_python_tests_conftest", Path(__file__).with_name("conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
hard_pairs = _conftest.hard_pairs

SIZES = {2: (29, 41), 3: (17, 1, 30)}  # uneven; a rank with a single row in the 3-rank group
EMPTY_SIZES = {2: (0, 37), 3: (20, 0, 27)}  # a rank with no pairs at all
MODEL_SIZES = {2: (13, 19), 3: (9, 2, 11)}  # model steps: within the tiny training split (48 pairs)
D = 24
ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}
# Every term once, each with an evidence kind (and τ) its paper uses.
TERM_CASES = {"risk": ("exp", 0.05), "kl": ("softplus", 0.1), "mse": ("relu", 1.0), "fmse": ("exp_tanh", 0.1),
              "logdet": ("exp", 0.1)}


def strip(t, sizes, rank):
    o = sum(sizes[:rank])
    return t[o: o + sizes[rank]]


def rel(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if ref.numel() == 0:
        return 0.0
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


def batch(world, dtype=torch.float64, seed=0, d=D, sizes=None):
    gen = torch.Generator().manual_seed(seed)
    x, y = hard_pairs(sum(sizes or SIZES[world]), d, generator=gen, dtype=dtype)
    c = torch.rand(x.shape[0], generator=gen, dtype=torch.float64).to(dtype)
    return x, y, c


def compare(rank, world, x, y, c=None, upstream_seed=None, sizes=None, **kw) -> dict:
    """Loss and gradients of x, y: distributed (this rank's strip) against one process (all rows).

    reduction "none": the objective is Σ u·rows + Σ v·cols with fixed random u, v (each rank
    backpropagates its own lines' share). sizes: the strips (default SIZES[world]).
    """
    sizes = sizes or SIZES[world]
    xr = strip(x, sizes, rank).clone().requires_grad_()
    yr = strip(y, sizes, rank).clone().requires_grad_()
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    cr = None if c is None else strip(c, sizes, rank)
    out = eod.evidential_loss(xr, yr, target_scale=cr, **kw)
    ref = eo.evidential_loss(xs, ys, target_scale=c, **kw)
    result = {}
    if kw.get("reduction") == "none":
        gen = torch.Generator().manual_seed(upstream_seed or 1)
        u, v = torch.rand(x.shape[0], generator=gen), torch.rand(x.shape[0], generator=gen)
        pieces = []
        for got, want, weight in zip(out, ref, (u, v)):
            if want.numel() == 0:
                assert got.numel() == 0
                continue
            result.setdefault("loss", 0.0)
            result["loss"] = max(result["loss"], rel(got, strip(want, sizes, rank)))
            pieces.append(((got * strip(weight, sizes, rank).to(got)).sum(), (want * weight.to(want)).sum()))
        sum(p[0] for p in pieces).backward()
        sum(p[1] for p in pieces).backward()
    else:
        out_value, ref_value = float(out.detach()), float(ref.detach())
        result["loss"] = abs(out_value - ref_value) / abs(ref_value)
        result["value"] = out_value
        out.backward()
        ref.backward()
    result["dx"] = rel(xr.grad, strip(xs.grad, sizes, rank))
    result["dy"] = rel(yr.grad, strip(ys.grad, sizes, rank))
    return result


# ----------------------------------------------------------------------------------------- cases


def f64_all_terms(rank, world):
    x, y, c = batch(world)
    return compare(rank, world, x, y, c, weights=ALL_WEIGHTS)


def f64_directions_and_terms(rank, world):
    x, y, _ = batch(world, seed=1)
    out = {}
    for direction in ("rows", "cols", "both"):
        for term, (evidence, tau) in TERM_CASES.items():
            out[f"{direction}/{term}/{evidence}"] = compare(rank, world, x, y, evidence=evidence, tau=tau,
                                                            weights={term: 1.0}, direction=direction)
    return out


def f64_reductions(rank, world):
    x, y, c = batch(world, seed=2)
    out = {"sum": compare(rank, world, x, y, c, weights=ALL_WEIGHTS, reduction="sum")}
    for direction in ("rows", "cols", "both"):
        out[f"none/{direction}"] = compare(rank, world, x, y, c, weights=ALL_WEIGHTS, reduction="none",
                                           direction=direction)
    return out


def f64_normalize(rank, world):
    x, y, _ = batch(world, seed=3)
    return compare(rank, world, 3.0 * x + 0.1, 0.5 * y, normalize=True, weights=ALL_WEIGHTS)


def f32_spec(rank, world):
    x, y, c = batch(world, dtype=torch.float32, seed=4)
    out = {"all": compare(rank, world, x, y, c, weights=ALL_WEIGHTS)}
    for term, (evidence, tau) in TERM_CASES.items():
        out[term] = compare(rank, world, x, y, evidence=evidence, tau=tau, weights={term: 1.0})
    return out


def bf16(rank, world):
    x, y, _ = batch(world, dtype=torch.bfloat16, seed=5)
    return compare(rank, world, x, y, weights={"risk": 1.0, "kl": 0.1})


def upstream_mean(rank, world):
    """Different upstream gradients of the replicated loss: the backward uses their mean."""
    x, y, _ = batch(world, seed=6)
    sizes = SIZES[world]
    xr, yr = strip(x, sizes, rank).clone().requires_grad_(), strip(y, sizes, rank).clone().requires_grad_()
    ((rank + 1.0) * eod.evidential_loss(xr, yr)).backward()
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    eo.evidential_loss(xs, ys).backward()
    mean = (world + 1) / 2
    return {"dx": rel(xr.grad, mean * strip(xs.grad, sizes, rank)), "dy": rel(yr.grad, mean * strip(ys.grad, sizes, rank))}


def ddp_flag(rank, world):
    """ddp=True: the same value, x and y gradients × W, for every reduction, fused and reference."""
    x, y, _ = batch(world, seed=13)
    sizes = SIZES[world]
    out = {}
    for backend in ("cpu", "reference"):
        for reduction in ("mean", "sum", "none"):
            grads, values = [], []
            for ddp in (False, True):
                xr, yr = strip(x, sizes, rank).clone().requires_grad_(), strip(y, sizes, rank).clone().requires_grad_()
                got = eod.evidential_loss(xr, yr, ddp=ddp, backend=backend, reduction=reduction)
                total = got[0].sum() + 2.0 * got[1].sum() if reduction == "none" else got
                total.backward()
                grads.append((xr.grad, yr.grad))
                values.append(float(total.detach()))
            (dx, dy), (dx_ddp, dy_ddp) = grads
            out[f"{backend}/{reduction}"] = {"value": abs(values[1] - values[0]) / abs(values[0]),
                                             "dx": rel(dx_ddp, world * dx), "dy": rel(dy_ddp, world * dy)}
    return out


def no_grad_and_module(rank, world):
    x, y, _ = batch(world, seed=7)
    sizes = SIZES[world]
    with torch.no_grad():
        value = eod.evidential_loss(strip(x, sizes, rank), strip(y, sizes, rank), weights=ALL_WEIGHTS)
    criterion = eod.EvidentialLoss(weights=ALL_WEIGHTS, tau=0.05)
    module_value = criterion(strip(x, sizes, rank), strip(y, sizes, rank)).detach()
    ref = float(eo.evidential_loss(x, y, weights=ALL_WEIGHTS))
    return {"no_grad": abs(float(value) - ref) / abs(ref), "requires_grad": value.requires_grad,
            "module": abs(float(module_value) - ref) / abs(ref), "repr": repr(criterion)}


def reference_backend(rank, world):
    """backend="reference": gathers x, y and materialises K × K; against the single-process reference."""
    x, y, c = batch(world, seed=8)
    out = {}
    for reduction in ("mean", "none"):
        sizes = SIZES[world]
        xr, yr = strip(x, sizes, rank).clone().requires_grad_(), strip(y, sizes, rank).clone().requires_grad_()
        xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
        kw = dict(weights=ALL_WEIGHTS, backend="reference", reduction=reduction)
        got = eod.evidential_loss(xr, yr, target_scale=strip(c, sizes, rank), **kw)
        ref = eo.evidential_loss(xs, ys, target_scale=c, **kw)
        if reduction == "none":
            loss = max(rel(got[0], strip(ref[0], sizes, rank)), rel(got[1], strip(ref[1], sizes, rank)))
            (got[0].sum() + got[1].sum()).backward()
            (ref[0].sum() + ref[1].sum()).backward()
        else:
            loss = abs(float(got.detach()) - float(ref.detach())) / abs(float(ref.detach()))
            got.backward()
            ref.backward()
        out[reduction] = {"loss": loss, "dx": rel(xr.grad, strip(xs.grad, sizes, rank)),
                          "dy": rel(yr.grad, strip(ys.grad, sizes, rank))}
    return out


def volume(rank, world):
    """Bytes handed to each kind of collective (measured at the dispatcher) against the formula."""
    sizes = SIZES[world]
    out = {}
    configs = {
        "mean/both/c": dict(dtype=torch.float32, target_scale=True),
        "none/both": dict(dtype=torch.float32, reduction="none"),
        "mean/rows/x-only": dict(dtype=torch.float64, direction="rows", need_dy=False),
        "sum/cols/bf16": dict(dtype=torch.bfloat16, direction="cols", reduction="sum"),
        "none/cols/normalize": dict(dtype=torch.bfloat16, direction="cols", reduction="none", normalize=True),
    }
    for name, cfg in configs.items():
        dtype = cfg.pop("dtype")
        need_dy = cfg.pop("need_dy", True)
        with_c = cfg.pop("target_scale", False)
        x, y, c = batch(world, dtype=dtype, seed=9)
        xr = strip(x, sizes, rank).clone().requires_grad_()
        yr = strip(y, sizes, rank).clone().requires_grad_(need_dy)
        with eod.CommunicationCounter() as counter:
            got = eod.evidential_loss(xr, yr, target_scale=strip(c, sizes, rank) if with_c else None, **cfg)
            if isinstance(got, tuple):
                sum(t.sum() for t in got).backward()
            else:
                got.backward()
        expected = eod.communication_volume(sizes, D, dtype=dtype, target_scale=with_c, need_dy=need_dy, **cfg)
        out[name] = {"measured": counter.bytes, "expected": expected,
                     "largest_all_reduce": max((n for kind, n in counter.calls if kind == "all_reduce"), default=0)}
    return out


def bad_inputs(rank, world):
    """Bad input on the last rank, scenario after scenario; every rank must raise, then the group
    must still compute a correct loss (no rank left behind in a collective)."""
    x, y, _ = batch(world, seed=10)
    sizes = SIZES[world]
    bad = rank == world - 1
    xr, yr = strip(x, sizes, rank).clone(), strip(y, sizes, rank).clone()
    nan_y = yr.clone()
    nan_y[0, 0] = math.nan
    scenarios = {
        "nan": lambda: eod.evidential_loss(xr, nan_y if bad else yr),
        "not_a_tensor": lambda: eod.evidential_loss(xr.tolist() if bad else xr, yr),
        "bad_weights": lambda: eod.evidential_loss(xr, yr, weights={"riks": 1.0} if bad else None),
        "other_tau": lambda: eod.evidential_loss(xr, yr, tau=0.07 if bad else 0.05),
        "other_dim": lambda: eod.evidential_loss(xr[:, :-1] if bad else xr, yr[:, :-1] if bad else yr),
        "requires_grad_differs": lambda: eod.evidential_loss(xr.requires_grad_(bad), yr),
        # Finite but unnormalised rows on one rank: exp(s/τ) overflows while that rank computes
        # its own rows, after the data has moved; the error flag of the all-reduce stops the others.
        "overflow_in_kernel": lambda: eod.evidential_loss(xr * (60.0 if bad else 1.0), yr, tau=0.05),
    }
    out = {}
    for name, call in scenarios.items():
        try:
            call()
            out[name] = ("no error", "")
        except Exception as e:  # the test checks the type and the text
            out[name] = (type(e).__name__, str(e))
        xr.requires_grad_(False)
    value = eod.evidential_loss(xr, yr)
    out["after"] = abs(float(value) - float(eo.evidential_loss(x, y))) / float(eo.evidential_loss(x, y))
    return out


@contextlib.contextmanager
def failing_op(name: str, active: bool, exc: Exception):
    """Within the block, the backend op torch.ops.evidential_ops.<name> raises `exc` (when active)."""
    namespace = torch.ops.evidential_ops
    original = getattr(namespace, name)

    def fail(*args, **kwargs):
        raise exc

    if active:
        setattr(namespace, name, fail)
    try:
        yield
    finally:
        setattr(namespace, name, original)


def failure_in_backward(rank, world):
    """loss_backward raises (out of memory) on the last rank only: every rank must raise promptly,
    the failing one its own error, the others a PeerError naming it, and the group stay usable.
    Also a failure of the forward's copies (after the all-gather) on that rank."""
    x, y, _ = batch(world, seed=14)
    sizes = SIZES[world]
    bad = rank == world - 1
    oom = torch.OutOfMemoryError("injected: out of memory allocating dy_parts")
    out = {}
    for reduction in ("mean", "sum", "none"):
        for direction in ("both", "rows"):
            xr = strip(x, sizes, rank).clone().requires_grad_()
            yr = strip(y, sizes, rank).clone().requires_grad_()
            got = eod.evidential_loss(xr, yr, reduction=reduction, direction=direction, weights=ALL_WEIGHTS)
            total = sum(t.sum() for t in got) if reduction == "none" else got
            start = time.monotonic()
            try:
                with failing_op("loss_backward", bad, oom):
                    total.backward()
                result = ("no error", "")
            except Exception as e:  # the test checks the type and the text
                result = (type(e).__name__, str(e))
            out[f"backward/{reduction}/{direction}"] = (*result, time.monotonic() - start)
    start = time.monotonic()
    try:
        with failing_op("line_stats", bad, oom):
            eod.evidential_loss(strip(x, sizes, rank), strip(y, sizes, rank))
        result = ("no error", "")
    except Exception as e:
        result = (type(e).__name__, str(e))
    out["forward/line_stats"] = (*result, time.monotonic() - start)
    out["after"] = compare(rank, world, x, y, weights=ALL_WEIGHTS)
    return out


def empty_strip(rank, world):
    """A rank with K_r = 0 (EMPTY_SIZES): every reduction and direction, float64 and float32, the
    reference backend, and the bytes against the formula."""
    sizes = EMPTY_SIZES[world]
    x, y, c = batch(world, seed=15, sizes=sizes)
    out = {"mean/c": compare(rank, world, x, y, c, sizes=sizes, weights=ALL_WEIGHTS),
           "sum": compare(rank, world, x, y, c, sizes=sizes, weights=ALL_WEIGHTS, reduction="sum"),
           "reference": compare(rank, world, x, y, c, sizes=sizes, weights=ALL_WEIGHTS, backend="reference")}
    for direction in ("rows", "cols", "both"):
        out[f"none/{direction}"] = compare(rank, world, x, y, c, sizes=sizes, weights=ALL_WEIGHTS,
                                           reduction="none", direction=direction)
        out[f"mean/{direction}/normalize"] = compare(rank, world, x, y, sizes=sizes, direction=direction,
                                                     normalize=True)
    x32, y32, _ = batch(world, dtype=torch.float32, seed=15, sizes=sizes)
    out["f32"] = compare(rank, world, x32, y32, sizes=sizes)
    xr, yr = strip(x32, sizes, rank).clone().requires_grad_(), strip(y32, sizes, rank).clone().requires_grad_()
    with eod.CommunicationCounter() as counter:
        eod.evidential_loss(xr, yr).backward()
    out["volume"] = {"measured": counter.bytes, "expected": eod.communication_volume(sizes, D)}
    return out


class Towers(nn.Module):
    """Two linear towers into a unit-norm joint space (a stand-in for any dual encoder)."""

    def __init__(self, f_in=12, d=8):
        super().__init__()
        self.image = nn.Linear(f_in, d, dtype=torch.float64)
        self.text = nn.Linear(f_in, d, dtype=torch.float64)

    def forward(self, a, b):
        return F.normalize(self.image(a), dim=1), F.normalize(self.text(b), dim=1)


def ddp_step(rank, world):
    """One SGD step of a DistributedDataParallel model with ddp=True against one process on the
    concatenated batch; and without ddp=True, DDP's average is the single-process gradient / W."""
    sizes = SIZES[world]
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(sum(sizes), 12, generator=gen, dtype=torch.float64)
    b = a + 0.3 * torch.randn(sum(sizes), 12, generator=gen, dtype=torch.float64)
    torch.manual_seed(0)
    model = Towers()
    single = copy.deepcopy(model)
    plain = copy.deepcopy(model)
    keywords = dict(weights={"risk": 1.0, "kl": 0.1}, tau=0.1, target_scale=None)

    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    loss = eod.evidential_loss(*ddp(strip(a, sizes, rank), strip(b, sizes, rank)), ddp=True, **keywords)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()

    single_opt = torch.optim.SGD(single.parameters(), lr=0.5)
    single_loss = eo.evidential_loss(*single(a, b), **keywords)
    single_loss.backward()
    single_grads = {n: p.grad.clone() for n, p in single.named_parameters()}
    single_opt.step()

    plain_ddp = nn.parallel.DistributedDataParallel(plain)
    eod.evidential_loss(*plain_ddp(strip(a, sizes, rank), strip(b, sizes, rank)), **keywords).backward()
    return {
        "loss": abs(float(loss.detach()) - float(single_loss.detach())) / abs(float(single_loss.detach())),
        "grad": max(rel(grads[n], single_grads[n]) for n in grads),
        "param": max(rel(p, q) for p, q in zip(model.parameters(), single.parameters())),
        "without_ddp_flag_is_grad_over_world": max(rel(p.grad * world, single_grads[n])
                                                    for n, p in plain.named_parameters()),
    }


def compiled(rank, world):
    """Under torch.compile the call is a graph break run eagerly: same loss and gradients."""
    x, y, _ = batch(world, seed=12)
    sizes = SIZES[world]
    weight = torch.linspace(0.5, 1.5, D, dtype=torch.float64)

    def step(xr, yr):
        return 2.0 * eod.evidential_loss(F.normalize(xr * weight, dim=1), yr, weights=ALL_WEIGHTS) + xr.sum()

    results = []
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=False)):
        xr, yr = strip(x, sizes, rank).clone().requires_grad_(), strip(y, sizes, rank).clone().requires_grad_()
        value = fn(xr, yr)
        value.backward()
        results.append((value.detach(), xr.grad, yr.grad))
    (v0, dx0, dy0), (v1, dx1, dy1) = results
    return {"loss": rel(v1, v0), "dx": rel(dx1, dx0), "dy": rel(dy1, dy0)}


def _split_batch(full, sizes, rank):
    out = {}
    for key, value in full.items():
        part = strip(value, sizes, rank)
        if key == "captions":  # trimmed to this rank's longest caption, as its own collate would
            part = part[:, : int(strip(full["lengths"], sizes, rank).max())]
        out[key] = part
    return out


def tcl_step(rank, world):
    """TCL.training_step after enable_global_batch (DDP, global L_u) against one process on the
    concatenated batch: epoch 0 (L_u only), no batch norm, so the step is the same mathematics."""
    from evidential_ops.models import TCL, enable_global_batch

    from models_fixtures import tiny_batch, tiny_bench

    sizes = MODEL_SIZES[world]
    bench = tiny_bench()
    full = tiny_batch(bench, k=sum(sizes))
    torch.manual_seed(0)
    model = TCL.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, bidirectional=False,
                        batch_norm=False)
    single = copy.deepcopy(model)
    enable_global_batch(model)
    lr = 0.1
    info = model.training_step(_split_batch(full, sizes, rank), 0, torch.optim.SGD(model.parameters(), lr=lr))
    single_info = single.training_step(full, 0, torch.optim.SGD(single.parameters(), lr=lr))
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), single.parameters()))
    step = max(float(p.grad.abs().max()) * lr for p in single.parameters())
    state_keys = sorted(model.state_dict()) == sorted(single.state_dict())
    return {"loss_u": abs(info["loss_u"] - single_info["loss_u"]) / abs(single_info["loss_u"]),
            "param_vs_step": moved / step, "state_dict_unchanged": state_keys}


def tcl_consistency_step(rank, world):
    """TCL.training_step past the consistency start (epoch 1: L_u with λ > 0, then T_max = 2 rounds
    of L_c) after enable_global_batch, against one process: the same L_u update on the
    concatenated batch, then each round's gradient the mean over the ranks' batches of ∇L_c (L_c
    stays per rank; DDP averages it), clipped, one SGD step."""
    from evidential_ops.models import TCL, enable_global_batch

    from models_fixtures import tiny_batch, tiny_bench

    sizes = MODEL_SIZES[world]
    bench = tiny_bench()
    full = tiny_batch(bench, k=sum(sizes))
    torch.manual_seed(0)
    model = TCL.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, bidirectional=False,
                        batch_norm=False, t_max=2, consistency_start_epoch=1)
    single = copy.deepcopy(model)
    initial = copy.deepcopy(model)
    enable_global_batch(model)
    lr, epoch = 0.1, 1
    info = model.training_step(_split_batch(full, sizes, rank), epoch, torch.optim.SGD(model.parameters(), lr=lr))

    opt = torch.optim.SGD(single.parameters(), lr=lr)
    params = list(single.parameters())
    loss_u = single.uncertainty_loss(full, epoch)
    opt.zero_grad(set_to_none=True)
    loss_u.backward()
    torch.nn.utils.clip_grad_norm_(params, single.grad_clip)
    opt.step()
    rounds = []
    for _ in range(single.t_max):
        opt.zero_grad(set_to_none=True)
        losses = [single.consistency_loss(_split_batch(full, sizes, r)) for r in range(world)]
        (sum(losses) / world).backward()
        torch.nn.utils.clip_grad_norm_(params, single.grad_clip)
        opt.step()
        rounds.append(float(losses[rank].detach()))
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), single.parameters()))
    step = max(float((p - q).detach().abs().max()) for p, q in zip(single.parameters(), initial.parameters()))
    return {"loss_u": abs(info["loss_u"] - float(loss_u)) / abs(float(loss_u)),
            "loss_c": abs(info["loss_c"] - sum(rounds) / len(rounds)) / abs(sum(rounds) / len(rounds)),
            "kl_weight": info["kl_weight"], "param_vs_step": moved / step}


def pipeline_ranks(rank, world):
    """pipelines.distributed.run_training_distributed with training replaced by a draw from the
    global RNG (what TcVSE's augmentation and DUQ's ε use) and rank 0's evaluation by an error:
    the draws differ between ranks, rank 0's are a single-process run's (runner.run_training), and
    the other ranks return promptly instead of waiting for rank 0 in a collective."""
    import tempfile
    from unittest import mock

    from evidential_ops.pipelines import distributed as pipeline
    from evidential_ops.pipelines import runner
    from evidential_ops.pipelines.recipes import get_recipe

    recipe = get_recipe("tcvse").with_overrides(epochs=1, batch_size=8, embed_dim=16)
    source = runner.DataSource.synthetic(recipe, seed=3, n_train=24, n_val=4, n_test=8, n_ood=4)
    draws = {}

    def fake_fit(key):
        def fit(model, *args, **kwargs):
            draws[key] = torch.rand(4).tolist()
            return []
        return fit

    def failing_evaluate(*args, **kwargs):
        raise RuntimeError("injected: rank 0's evaluation failed")

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        with mock.patch.object(runner, "fit", fake_fit("single")), mock.patch.object(runner, "_evaluate",
                                                                                     failing_evaluate):
            try:
                runner.run_training("tcvse", recipe, source, Path(tmp) / "single", seed=3, quiet=True, plots=False)
            except RuntimeError as e:
                assert "injected" in str(e)
        start = time.monotonic()
        with mock.patch.object(pipeline, "fit", fake_fit("distributed")), mock.patch.object(pipeline, "_evaluate",
                                                                                           failing_evaluate):
            try:
                out["returned"] = repr(pipeline.run_training_distributed("tcvse", recipe, source, Path(tmp) / "dist",
                                                                         seed=3, quiet=True, plots=False))
            except RuntimeError as e:
                out["returned"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.monotonic() - start
        out["checkpoint_written"] = (Path(tmp) / "dist" / "checkpoint.pt").is_file()
    out.update(draws)
    # ... and the group is still in step: every rank passed the barrier and nothing is pending.
    flag = torch.ones(1)
    dist.all_reduce(flag)
    out["after"] = float(flag)
    return out


def duq_steps(rank, world):
    """DUQ after enable_global_batch: two steps; parameters stay identical on every rank, and the
    reported ISUM is the global one (the same number on every rank)."""
    from models_fixtures import tiny_batch, tiny_bench

    from evidential_ops.models import DUQ, enable_global_batch

    bench = tiny_bench(visual="frames")
    torch.manual_seed(0)
    model = DUQ.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, bidirectional=False)
    enable_global_batch(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sizes = MODEL_SIZES[world]
    infos = []
    for epoch in range(2):
        full = tiny_batch(bench, k=sum(sizes), epoch=epoch)
        infos.append(model.training_step(_split_batch(full, sizes, rank), epoch, opt,
                                         generator=torch.Generator().manual_seed(rank)))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return {"max_param_difference": max(float((g - flat).abs().max()) for g in gathered),
            "loss_s_u": [i["loss_s_u"] for i in infos]}


CASES = {fn.__name__: fn for fn in (
    f64_all_terms, f64_directions_and_terms, f64_reductions, f64_normalize, f32_spec, bf16, upstream_mean,
    ddp_flag, no_grad_and_module, reference_backend, volume, bad_inputs, failure_in_backward, empty_strip, ddp_step,
    compiled, tcl_step, tcl_consistency_step, pipeline_ranks, duq_steps,
)}
