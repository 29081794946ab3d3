"""End-to-end CLI runs (python -m evidential_ops train|eval|demo) on tiny built-in data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from models_fixtures import single_thread

from evidential_ops.__main__ import main
from evidential_ops.pipelines.analysis import RETRIEVAL_KEYS, auroc
from evidential_ops.pipelines.runner import PLOT_FILES, PLOTS_HINT
from evidential_ops.pipelines.training import epoch_line, epoch_lines_enabled, progress_enabled

_one_thread = pytest.fixture(autouse=True)(single_thread)


TINY = ["--n-train", "40", "--n-val", "4", "--n-test", "10", "--n-ood", "6", "--epochs", "1",
        "--batch-size", "16", "--embed-dim", "16", "--quiet"]
# The same plot has the same file name for every method (clean vs corrupted queries: TCL, TcVSE, DUQ).
PLOTS = {"tcl": ["uncertainty_corruption.png"], "tcvse": ["uncertainty_corruption.png"],
         "uml": ["uncertainty_noisy_vs_clean.png"], "fume": ["map_vs_deletion.png", "uncertainty_ood.png"],
         "duq": ["uncertainty_corruption.png"]}
FIGURES = {"tcl": ["corruption", "model_a", "model_b"], "tcvse": ["corruption"], "uml": ["audit"],
           "fume": ["map", "map_filtered", "ood_cross_modal_uncertainty_median"], "duq": ["reranked", "rerank_readings"]}


@pytest.mark.parametrize("method", sorted(PLOTS))
def test_demo_writes_metrics_and_plots(method, tmp_path, capsys):
    assert main(["demo", "--method", method, "--out", str(tmp_path), "--no-bench", *TINY]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for key in RETRIEVAL_KEYS + tuple(FIGURES[method]) + ("done_when", "untrained", "train", "uncertainty_quality",
                                                          "infonce_baseline"):
        assert key in metrics, key
    assert metrics["train"]["epochs"] == 1 and metrics["method"] == method
    for name in PLOTS[method] + ["training_loss.png", "risk_coverage.png", "abstention_coverage.png"]:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # Exactly those: no method writes its own spelling of a plot another method also draws.
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(PLOTS[method] + ["training_loss.png",
                                                                                      "risk_coverage.png",
                                                                                      "abstention_coverage.png"])
    assert set(PLOTS[method]) <= set(PLOT_FILES.values())
    assert (tmp_path / "checkpoint.pt").is_file()
    out = capsys.readouterr().out
    assert f"== {method}" in out and "uncertainty quality of" in out
    # Each printed R@1 says how it judges a top-1: R@K by instance for every method, FUME's
    # uncertainty-quality R@1 (and mAP) by class, with a line on why the two differ.
    assert "retrieval (test, by instance): i2t_r1 " in out
    protocol = "by class: any result of the query's class is right" if method == "fume" else "instance-level"
    assert len(re.findall(rf"^  (?:i2t|t2i): R@1 \S+ \({protocol}", out, flags=re.M)) == 4  # method + baseline
    assert ("trained to match classes, not instances" in out) == (method == "fume")
    for direction in ("i2t", "t2i"):
        assert metrics["uncertainty_quality"][direction]["baselines"] == ["neg_top1_similarity", "neg_margin"]
    # The baseline is judged as its method is (by class beside FUME), so their AURCs compare.
    relevance = metrics["uncertainty_quality"]["relevance"]
    assert relevance == ("label" if method == "fume" else "instance")
    assert metrics["infonce_baseline"]["uncertainty_quality"]["relevance"] == relevance
    # The comparison with the baseline is the plain value comparison, and a failure says why.
    key = "map" if method == "fume" else "rsum"
    check = metrics["done_when"][f"{key}_vs_infonce"]
    mine, theirs = metrics[key], metrics["infonce_baseline"][key]
    assert check["value"] == [mine, theirs] and check["pass"] == (mine >= theirs)
    for name, check in metrics["done_when"].items():
        assert isinstance(check["pass"], bool), name
        assert check["pass"] or "note" in check or name.startswith(("median_", "ensemble_", "split_", "map_filtered",
                                                                       "uncertainty_noisy", "ood_vs")), name


def test_train_then_eval_reproduces_the_metrics(tmp_path):
    assert main(["train", "--method", "tcl", "--out", str(tmp_path / "run"), "--seed", "3", *TINY]) == 0
    trained = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "checkpoint.pt"), "--out", str(tmp_path / "ev")]) == 0
    evaluated = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    for key in RETRIEVAL_KEYS:
        assert evaluated[key] == pytest.approx(trained[key]), key
    assert evaluated["untrained"] == trained["untrained"]


def test_module_entry_point_runs_the_demo_with_the_speed_comparison(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "evidential_ops", "demo", "--method", "duq", "--out", str(tmp_path),
         "--bench-size", "64", *TINY],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "speed duq loss" in proc.stdout and "\r" not in proc.stdout  # no bars without a TTY
    speed = json.loads((tmp_path / "metrics.json").read_text())["speed"]
    assert speed[0]["k"] == 64 and speed[0]["reference_ms"] > 0


def test_make_demo_leaves_the_output_directory_to_the_cli():
    """`make demo` writes where `python -m evidential_ops demo` does (runs/<method>, runs/demo for
    all) unless OUT is given: one default, not two."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[1]

    def demo_command(*assignments):
        dry = subprocess.run(["make", "-n", "-s", "demo", *assignments], cwd=root, capture_output=True, text=True,
                             check=True).stdout
        return [line for line in dry.splitlines() if "-m evidential_ops demo" in line][-1].split()

    assert "--out" not in demo_command()
    assert "--out" not in demo_command("METHOD=all")
    command = demo_command("OUT=somewhere")
    assert command[command.index("--out") + 1] == "somewhere"


def test_bad_command_lines(tmp_path):
    with pytest.raises(SystemExit):
        main(["demo", "--method", "clip", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["train", "--method", "tcl", "--epochs", "0"])


# Values argparse itself refuses (exit status 2, the option named) before any data is built.
REFUSED_AT_PARSE = [
    (["train", "--method", "tcl", "--batch-size", "1"], "--batch-size: must be >= 2"),
    (["demo", "--method", "tcl", "--bench-size", "1"], "--bench-size: must be >= 2"),
    (["train", "--method", "tcl", "--n-train", "1"], "--n-train: must be >= 2"),
    (["train", "--method", "tcl", "--n-test", "1"], "--n-test: must be >= 2"),
    (["train", "--method", "tcl", "--n-ood", "-5"], "--n-ood: must be >= 0"),
    (["train", "--method", "tcl", "--seed", "-3"], "--seed: must be >= 0"),
    (["train", "--method", "tcl", "--device", "bogus"], "--device: not a torch device"),
    (["bench", "--repeats", "0"], "--repeats: must be >= 1"),
    (["bench", "--sizes", "1"], "--sizes: must be >= 2"),
    (["bench", "--dim", "0"], "--dim: must be >= 1"),
    (["abstain", "--checkpoint", "c.pt", "--score", "u", "--seed", "-1"], "--seed: must be >= 0"),
]


@pytest.mark.parametrize("argv, message", REFUSED_AT_PARSE, ids=[m.split(":")[0] for _, m in REFUSED_AT_PARSE])
def test_values_refused_when_parsed(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_device_this_torch_lacks_is_refused_when_parsed(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch has a CUDA device")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--method", "tcl", "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "--device: 'cuda' is not available here" in capsys.readouterr().err


def test_files_and_data_that_cannot_be_used_are_one_line(tmp_path):
    """A missing or foreign checkpoint or data directory: SystemExit with the option and the path,
    not a traceback."""
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a checkpoint")  # torch.load: UnpicklingError
    greeting = tmp_path / "hello.pt"
    greeting.write_text("hello\n")  # torch.load: KeyError
    cases = [
        (["eval", "--checkpoint", str(tmp_path / "missing.pt")], "--checkpoint: checkpoint .*missing.pt does not exist"),
        (["eval", "--checkpoint", str(foreign)], "--checkpoint: .*notes.txt is not an evidential_ops checkpoint"),
        (["eval", "--checkpoint", str(greeting)], "--checkpoint: .*hello.pt is not an evidential_ops checkpoint"),
        (["train", "--method", "tcl", "--resume", str(greeting), "--out", str(tmp_path), *TINY],
         "--resume: .*hello.pt is not an evidential_ops checkpoint"),
        (["train", "--method", "tcl", "--resume", str(tmp_path / "missing.pt"), "--out", str(tmp_path), *TINY],
         "--resume: .*missing.pt does not exist"),
        (["train", "--method", "tcl", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path)],
         "--data: .*nowhere is not a directory"),
        (["train", "--method", "uml", "--data", str(tmp_path), "--out", str(tmp_path)], "needs --alt-language"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            main(argv)


def test_precomputed_data_that_does_not_match_its_options_is_one_line(tmp_path):
    from models_fixtures import tiny_bench

    from evidential_ops.data import save_precomputed

    save_precomputed(tiny_bench(), tmp_path / "data")
    with pytest.raises(SystemExit, match=r"data .*data: train_caps.txt has \d+ captions"):
        main(["train", "--method", "tcl", "--data", str(tmp_path / "data"), "--captions-per-image", "3",
              "--out", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "16", "--quiet"])


@pytest.mark.parametrize("method", ["tcl", "fume"])
def test_a_diverging_learning_rate_names_the_step_and_the_option(method, tmp_path):
    with pytest.raises(SystemExit, match=r"training diverged at epoch 1, batch \d+: .* learning rate 1e\+30.*--lr"):
        main(["train", "--method", method, "--out", str(tmp_path), *TINY, "--lr", "1e30"])


def test_data_holding_nan_is_not_called_a_divergence():
    """fit tells the model's fault (finite batch) from the data's (NaN in the batch)."""
    import torch

    from evidential_ops.checks import NonFiniteError
    from evidential_ops.pipelines.training import TrainingDiverged, fit

    class Refusing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def training_step(self, batch, epoch, optimizer):
            raise NonFiniteError("x contains NaN or Inf")

    class OneEpoch:
        def set_epoch(self, epoch):
            pass

    # Neither error class derives from the other: pytest.raises tells them apart.
    assert not issubclass(TrainingDiverged, NonFiniteError) and not issubclass(NonFiniteError, TrainingDiverged)
    for features, expected in ((torch.tensor([float("nan")]), NonFiniteError), (torch.ones(1), TrainingDiverged)):
        model = Refusing()
        with pytest.raises(expected):
            fit(model, OneEpoch(), [{"features": features}], torch.optim.Adam(model.parameters()), epochs=1)


@pytest.mark.parametrize("command", ["train", "eval", "demo", "bench"])
def test_help_shows_the_defaults(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at any width
    assert "(default: cpu)" in text  # every subcommand has --device
    assert "(default: None)" not in text  # a None default is spelt out in words, not printed
    if command in ("train", "demo"):
        assert "(default: 0)" in text  # --seed
        assert "training epochs (default: the method's, tcl " in text  # --epochs, one value per method
        assert "(default: runs/<method>" in text and "(default: 2000)" in text
    if command == "demo":
        assert "(default: 1024)" in text and "with --method all, runs/demo" in text


def test_progress_bars_only_for_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert progress_enabled(False) and not progress_enabled(True)
    assert not epoch_lines_enabled(False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert not progress_enabled(False)
    assert epoch_lines_enabled(False) and not epoch_lines_enabled(True)


LOUD = [arg for arg in TINY if arg != "--quiet"]


def test_one_progress_line_per_epoch_without_a_terminal(tmp_path, capsys):
    """pytest's captured stdout is not a TTY: each epoch prints its loss and seconds, no bars;
    TCL's line also names the annealed KL weight λ and the loss's parts, so a loss that rises
    with λ is not mistaken for divergence."""
    assert main(["train", "--method", "tcl", "--out", str(tmp_path), *LOUD, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    lines = re.findall(r"^tcl train epoch (\d)/2: loss (\S+) = risk (\S+) \+ λ (\S+) × KL (\S+)"
                       r"(?: \+ consistency (\S+))?, (\S+) s$", out, flags=re.M)
    assert [int(line[0]) for line in lines] == [1, 2]
    for _, loss, risk, weight, kl, consistency, seconds in lines:
        assert float(seconds) >= 0
        total = float(risk) + float(weight) * float(kl) + (float(consistency) if consistency else 0.0)
        assert float(loss) == pytest.approx(total, abs=1e-3)  # the printed parts add up (4 decimals each)
    assert [float(line[3]) for line in lines] == [0.0, 0.005]  # λ = min(1, 0.005·epoch), 0-based
    assert not lines[0][5] and lines[1][5]  # the consistency step starts in the second epoch
    assert "\r" not in out
    assert main(["train", "--method", "tcl", "--out", str(tmp_path), *TINY]) == 0
    assert "train epoch" not in capsys.readouterr().out  # --quiet


def test_train_resume_continues_the_run_of_a_checkpoint(tmp_path, capsys):
    """--resume continues from the epochs the checkpoint holds (the bitwise equality with an
    uninterrupted run is test_training_loop.py's); another run's options are refused by name."""
    run = tmp_path / "run"
    assert main(["train", "--method", "fume", "--out", str(run), *TINY]) == 0
    checkpoint = str(run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["train", "--method", "fume", "--out", str(run), *LOUD, "--epochs", "2", "--resume", checkpoint]) == 0
    out = capsys.readouterr().out
    assert f"resuming fume from {checkpoint} after epoch 1 of 2" in out
    assert "fume train epoch 2/2" in out and "fume train epoch 1/2" not in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train"]["resumed_from"] == {"checkpoint": checkpoint, "epoch": 1}
    assert [h["epoch"] for h in metrics["train"]["history"]] == [0, 1]
    with pytest.raises(SystemExit, match=r"--resume: .* recipe\.lr 0\.001 \(this run: 0\.5\)"):
        main(["train", "--method", "fume", "--out", str(run), *TINY, "--epochs", "3", "--lr", "0.5",
              "--resume", checkpoint])


def test_epoch_line_adds_parts_only_where_the_model_reports_them():
    # DUQ also reports a "loss_kl" (its Gaussian KL), but no annealed weight: no parts then.
    duq = {"epoch": 2, "loss": 1.5, "loss_kl": 0.25, "seconds": 0.5}
    assert epoch_line("duq train", 6, duq) == "duq train epoch 3/6: loss 1.5000, 0.5 s"
    tcl = {"epoch": 0, "loss": 6.8, "loss_risk": 6.8, "loss_kl": 450.0, "kl_weight": 0.0, "loss_c": float("nan"),
           "seconds": 1.0}
    assert epoch_line("tcl train", 5, tcl) == ("tcl train epoch 1/5: loss 6.8000 = risk 6.8000 + λ 0 × KL 450.0000, "
                                               "1.0 s")


def test_without_matplotlib_runs_train_and_demo_and_skips_the_plots(tmp_path, capsys, monkeypatch):
    # A None entry in sys.modules is how Python marks a module as not importable.
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["train", "--method", "tcl", "--out", str(tmp_path / "train"), *LOUD]) == 0
    out = capsys.readouterr().out
    assert out.count(PLOTS_HINT) == 1
    assert out.index(PLOTS_HINT) < out.index("tcl train epoch 1/1")  # said before training, not after
    assert (tmp_path / "train" / "metrics.json").is_file() and not list((tmp_path / "train").glob("*.png"))
    assert main(["demo", "--method", "duq", "--out", str(tmp_path / "demo"), "--no-bench", *TINY]) == 0
    out = capsys.readouterr().out
    assert out.count(PLOTS_HINT) == 1 and "(no plots)" in out
    assert "uncertainty_quality" in json.loads((tmp_path / "demo" / "metrics.json").read_text())
    assert not list((tmp_path / "demo").glob("*.png"))


def test_evidence_and_tau_options_reach_the_model(tmp_path):
    assert main(["train", "--method", "uml", "--out", str(tmp_path), "--evidence", "exp", "--tau", "0.1", *TINY]) == 0
    recipe = json.loads((tmp_path / "metrics.json").read_text())["recipe"]
    assert recipe["model"]["evidence"] == "exp" and recipe["model"]["tau"] == 0.1
    with pytest.raises(SystemExit, match="apply to tcl, tcvse, uml"):
        main(["train", "--method", "duq", "--out", str(tmp_path), "--evidence", "exp", *TINY])


@pytest.mark.parametrize("method, evidence", [("tcl", "exp_tanh"), ("tcvse", "softplus"), ("tcvse", "exp_tanh")])
def test_evidence_a_method_does_not_take_is_refused_before_training(method, evidence, tmp_path):
    with pytest.raises(SystemExit, match=f"--evidence {evidence}: {method} takes exp, relu"):
        main(["train", "--method", method, "--out", str(tmp_path), "--evidence", evidence, *TINY])
    assert not any(tmp_path.iterdir())


def test_method_all_gives_evidence_and_tau_to_the_methods_that_take_them():
    from evidential_ops.pipelines.cli import _recipe
    from evidential_ops.pipelines.recipes import METHODS, get_recipe

    class Args:
        epochs = batch_size = lr = embed_dim = encoder_chunk = data = alt_language = None
        evidence, tau = "relu", 0.2

    recipes = {method: _recipe(Args, method, every_method=True) for method in METHODS}
    for method in ("tcl", "tcvse", "uml"):
        assert recipes[method].model["evidence"] == "relu" and recipes[method].model["tau"] == 0.2
    for method in ("fume", "duq"):
        assert recipes[method] == get_recipe(method)
    Args.evidence = "softplus"  # TcVSE takes exp or relu: one method refusing refuses the run
    with pytest.raises(SystemExit, match="--evidence softplus: tcvse takes exp, relu"):
        [_recipe(Args, method, every_method=True) for method in METHODS]


def test_auroc_by_hand():
    import torch

    assert auroc(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == 1.0
    assert auroc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5
    assert auroc(torch.tensor([1.0, 3.0]), torch.tensor([2.0])) == 0.5


def test_train_on_precomputed_features(tmp_path):
    from models_fixtures import tiny_bench

    from evidential_ops.data import save_precomputed

    save_precomputed(tiny_bench(noise_rate=0.4), tmp_path / "data")
    out = tmp_path / "run"
    assert main(["train", "--method", "uml", "--data", str(tmp_path / "data"), "--alt-language", "alt",
                 "--out", str(out), "--epochs", "1", "--batch-size", "16", "--embed-dim", "8", "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["kind"] == "precomputed" and "rsum" in metrics
    assert "audit" not in metrics  # real data carries no ground truth of the noise


@pytest.mark.parametrize("method", ["tcl", "uml", "duq"])
def test_training_uses_the_fused_backend(method, monkeypatch):
    """Every K×K evidential term of training goes through the public op on the fused backend."""
    import torch
    from models_fixtures import tiny_batch, tiny_bench

    from evidential_ops import backends
    from evidential_ops.pipelines import get_recipe

    if "cpu" not in backends.available_backends():
        pytest.skip("the C++ extension is not built")
    bench = tiny_bench(noise_rate=0.4, visual="frames" if method == "duq" else "regions")
    model = get_recipe(method).with_overrides(embed_dim=8).build(bench)
    used = []
    original = backends.resolve
    monkeypatch.setattr(backends, "resolve", lambda name, device: used.append(original(name, device).name)
                        or original(name, device))
    languages = ("en", "alt") if method == "uml" else ("en",)
    model.training_step(tiny_batch(bench, languages=languages), 1, torch.optim.SGD(model.parameters(), lr=0.0))
    assert used and set(used) == {"cpu"}, used


def test_encoder_chunk_option_reaches_the_recipe_and_the_model(tmp_path):
    from evidential_ops.pipelines import get_recipe
    from evidential_ops.pipelines.recipes import AUTO_CHUNK_ABOVE, AUTO_ENCODER_CHUNK

    assert main(["train", "--method", "fume", "--out", str(tmp_path), "--encoder-chunk", "7", *TINY]) == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["recipe"]["encoder_chunk"] == 7
    assert get_recipe("tcl").encoder_chunk_size() is None  # batch 128: auto leaves it off
    large = get_recipe("tcl").with_overrides(batch_size=AUTO_CHUNK_ABOVE + 1)
    assert large.encoder_chunk_size() == AUTO_ENCODER_CHUNK
    assert large.with_overrides(encoder_chunk=3).encoder_chunk_size() == 3
    from dataclasses import replace
    assert replace(large, encoder_chunk=None).encoder_chunk_size() is None
    with pytest.raises(ValueError, match="encoder_chunk"):
        replace(large, encoder_chunk=0)
    with pytest.raises(SystemExit):
        main(["train", "--method", "fume", "--out", str(tmp_path), "--encoder-chunk", "-2", *TINY])
