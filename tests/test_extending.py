"""A user's own norms and placements: found from their config folder and from installed packages,
refused in one line when unsound or misnamed, and checked by ``normbench check`` line by line."""

from __future__ import annotations

import collections
import json
import math
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import REPO, compose_cfg, tiny
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from typer.testing import CliRunner

from normbench.cli import app
from normbench.core.errors import ConfigError
from normbench.core.identity import config_hash
from normbench.data import corpus
from normbench.extending import conformance
from normbench.model import extensions
from normbench.model.gpt import GPT
from normbench.model.norms import NORMS, norm_class
from normbench.model.placements import PLACEMENTS
from normbench.training.config import conf_dir, load_group, parse_config

# The throwaway package: one sound norm and three unsound ones, each broken in one way, and two placements.
PACKAGE = '''
import torch
from torch import nn

from normbench import Block


class Sound(nn.Module):
    """RMSNorm written as a user would, statistics in float32."""

    statistics = "token"

    def __init__(self, dim, *, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        wide = x.float()
        return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


class Leaky(Sound):
    """Divides by the RMS over the whole sequence: every position sees the future."""

    def forward(self, x):
        wide = x.float()
        rms = torch.rsqrt(wide.pow(2).mean((-2, -1), keepdim=True) + self.eps)
        return (wide * rms * self.weight).to(x.dtype)


class BatchMixing(Sound):
    """Says "token" but centres each position across the batch."""

    def forward(self, x):
        return super().forward(x - x.mean(0, keepdim=True))


class DeadParameter(Sound):
    """A bias that the forward never uses."""

    def __init__(self, dim, *, eps: float = 1e-6):
        super().__init__(dim, eps=eps)
        self.bias = nn.Parameter(torch.zeros(dim))


class HalfStatistics(Sound):
    """Its statistics in the input's precision: wrong under bf16."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(x.dtype)


class NonFinite(Sound):
    """Logarithm of a signed output: NaN for every negative entry."""

    def forward(self, x):
        return super().forward(x).log()


class MaxAbs(Sound):
    """Divides by the largest magnitude; its float32 weight makes a bf16 input's output float32."""

    def forward(self, x):
        return x / x.abs().amax(-1, keepdim=True).clamp_min(self.eps) * self.weight


class Zero(Sound):
    """Returns zeros: nothing reaches the head but what the blocks add after the last norm."""

    def forward(self, x):
        return x * 0


class Constant(Sound):
    """Returns its weight whatever the input: the model can learn the tokens' frequencies, no more."""

    def forward(self, x):
        return self.weight.expand_as(x).to(x.dtype)


class NoDim(nn.Module):
    statistics = "token"

    def __init__(self):
        super().__init__()


class Half(Block):
    """Pre-LN with the sub-layers' outputs halved."""

    def __init__(self, spec, make_norm, *, scale: float = 0.5):
        super().__init__(spec, make_norm)
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")
        self.scale = scale

    def forward(self, x):
        x = x + self.scale * self.attn(self.norm_attn(x))
        return x + self.scale * self.mlp(self.norm_mlp(x))


class Narrowing(Half):
    """Returns half the channels: the residual stream's shape broken."""

    def forward(self, x):
        return super().forward(x)[..., : x.shape[-1] // 2]
'''


@pytest.fixture(scope="module")
def userpkg(tmp_path_factory):
    """``nb_userpkg`` on sys.path for this module's tests, with a conf/ folder per norm."""
    root = tmp_path_factory.mktemp("user")
    (root / "nb_userpkg.py").write_text(textwrap.dedent(PACKAGE))
    for name in (
        "Sound",
        "Leaky",
        "BatchMixing",
        "DeadParameter",
        "HalfStatistics",
        "MaxAbs",
        "Zero",
        "Constant",
    ):
        folder = root / f"conf_{name.lower()}" / "norm"
        folder.mkdir(parents=True)
        (folder / "mine.yaml").write_text(f"name: mine\n_target_: nb_userpkg.{name}\neps: 1.0e-06\n")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


@pytest.fixture(autouse=True)
def registries(monkeypatch):
    """Each test leaves normbench's registries and Hydra's ConfigStore as it found them: a user's norm
    must not turn up in another test's norm=glob(*)."""
    norms, placements = dict(NORMS), dict(PLACEMENTS)
    store = ConfigStore.instance().repo
    groups = {group: dict(store[group]) for group in ("norm", "placement") if group in store}
    monkeypatch.setattr(extensions, "_installed", {})
    yield
    for registry, saved in ((NORMS, norms), (PLACEMENTS, placements)):
        registry.clear()
        registry.update(saved)
    for group in ("norm", "placement"):
        store.pop(group, None)
        if group in groups:
            store[group] = groups[group]


def user_norm(cls: str, name: str = "mine") -> dict:
    return {"name": name, "_target_": f"nb_userpkg.{cls}", "eps": 1e-6}


def lines_of(cls: str) -> dict[str, conformance.Line]:
    run = parse_config(compose_cfg(tiny("model=micro")))
    norm = user_norm(cls)
    run.norm = norm
    name = norm_class("mine", norm["_target_"]) and "mine"
    lines = conformance.norm_lines(name, {"eps": 1e-6}, run.model.d_model) + conformance.model_lines(run)
    return {line.name: line for line in lines}


MUST_HOLD = (
    "output shape, finite values",
    "declared statistics",
    "gradients reach every parameter",
    "no future leak (train mode)",
    "no future leak (eval mode)",
    "gradients reach every parameter (model)",
)


def test_a_sound_user_norm_passes_every_line_that_must_hold(userpkg):
    lines = lines_of("Sound")
    assert [n for n in MUST_HOLD if not lines[n].ok] == []
    assert lines["float32 statistics under bf16"].ok and lines["state_dict round trip"].ok
    assert lines["gradients reach every parameter"].figure == "1 of 1 parameters"


@pytest.mark.parametrize(
    ("cls", "line"),
    [
        ("Leaky", "no future leak (train mode)"),
        ("BatchMixing", "declared statistics"),
        ("DeadParameter", "gradients reach every parameter"),
        ("NonFinite", "output shape, finite values"),
    ],
)
def test_each_unsound_norm_fails_its_own_line(userpkg, cls, line):
    lines = lines_of(cls)
    assert lines[line].ok is False and lines[line].mark == "FAIL"


def test_statistics_in_half_precision_are_flagged_not_failed(userpkg):
    line = lines_of("HalfStatistics")["float32 statistics under bf16"]
    assert line.ok is False and line.mark == "flag" and not line.must


def check_json(config_dir, steps: int) -> tuple[int, dict]:
    """normbench check --json of the folder's norm=mine at model=micro: exit code, lines by name."""
    args = ["check", "--config-dir", str(config_dir), "norm=mine", "model=micro", "--json"]
    result = CliRunner().invoke(app, [*args, "--no-compile", "--no-speed", "--steps", str(steps)])
    return result.exit_code, {line["name"]: line for line in json.loads(result.stdout)["lines"]}


def corpus_unigram_entropy() -> float:
    """By hand: the entropy of the default corpus's validation targets at model=micro."""
    run = parse_config(compose_cfg(["model=micro"]))
    data = corpus.build_dataset(run.data, run.model.block_size, run.train.eval_batches * run.train.batch_size)
    counts = collections.Counter(
        int(t) for _, y in data.val_batches(run.train.eval_batches, run.train.batch_size) for t in y.flatten()
    )
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


@pytest.mark.parametrize("cls", ["Zero", "Constant"])
def test_a_norm_that_does_not_learn_fails_the_learning_line(userpkg, cls):
    code, lines = check_json(userpkg / f"conf_{cls.lower()}", steps=40)
    learns = lines["a model=micro run learns"]
    assert code == 1 and learns["result"] == "FAIL", learns
    final = float(re.search(r"-> (\d+\.\d+)", learns["figure"]).group(1))
    assert final > corpus_unigram_entropy() - conformance.LEARN_MARGIN


def test_layernorm_ends_clearly_below_the_unigram_entropy(userpkg):
    result = CliRunner().invoke(
        app, ["check", "norm=ln", "model=micro", "--json", "--no-compile", "--no-speed", "--steps", "40"]
    )
    learns = {line["name"]: line for line in json.loads(result.stdout)["lines"]}["a model=micro run learns"]
    assert learns["result"] == "ok", learns
    assert f"unigram entropy {corpus_unigram_entropy():.3f}" in learns["figure"]
    final = float(re.search(r"-> (\d+\.\d+)", learns["figure"]).group(1))
    assert final < corpus_unigram_entropy() - conformance.LEARN_MARGIN


def test_a_wider_output_dtype_is_flagged_with_its_cost_and_check_exits_0(userpkg):
    code, lines = check_json(userpkg / "conf_maxabs", steps=30)
    assert code == 0, lines
    assert lines["output shape, finite values"]["result"] == "ok"
    assert lines["output dtype"]["result"] == "flag"
    figure = lines["output dtype"]["figure"]
    assert "returns float32 for bf16 input: twice the activation memory" in figure
    assert figure.endswith("cast back with .to(x.dtype)")
    assert [n for n in MUST_HOLD if lines[n]["result"] != "ok"] == []


def test_a_dead_parameter_names_it_and_check_exits_1_with_json(userpkg):
    code, lines = check_json(userpkg / "conf_deadparameter", steps=2)
    assert code == 1, lines
    assert lines["gradients reach every parameter"]["result"] == "FAIL"
    assert lines["gradients reach every parameter"]["figure"] == "1 of 2 parameters; none to bias"


def test_a_user_norm_from_the_config_folder_is_in_the_config_and_its_hash(userpkg):
    def composed(cls):
        return compose_cfg([f"hydra.searchpath=[file://{userpkg / f'conf_{cls.lower()}'}]", "norm=mine"])

    sound, leaky = composed("Sound"), composed("Leaky")
    assert sound.norm._target_ == "nb_userpkg.Sound" and leaky.norm.name == sound.norm.name == "mine"
    # Two classes under one name never share a run directory; the same class always finds its own.
    assert config_hash(sound) != config_hash(leaky) and config_hash(sound) == config_hash(composed("Sound"))


def test_a_user_placement_builds_and_one_that_breaks_the_stream_is_refused(userpkg):
    cfg = load_group("model", "micro")
    model = GPT(cfg, 32, {"name": "ln"}, {"name": "half", "_target_": "nb_userpkg.Half", "scale": 0.25})
    assert model.blocks[0].scale == 0.25 and type(model.blocks[0]).__name__ == "Half"
    with pytest.raises(
        ConfigError, match=r"placement 'narrowing' turns the residual stream \(1, 2, 64\) into \(1, 2, 32\)"
    ):
        GPT(cfg, 32, {"name": "ln"}, {"name": "narrowing", "_target_": "nb_userpkg.Narrowing"})


@pytest.mark.parametrize(
    ("norm", "message"),
    [
        (
            {"name": "mine2", "_target_": "nb_missing.norms.X"},
            r"norm 'mine2': cannot import nb_missing.norms .* looked in",
        ),
        ({"name": "mine2", "_target_": "nb_userpkg.Nothing"}, r"nb_userpkg has no class Nothing"),
        ({"name": "mine2", "_target_": "nb_userpkg.NoDim"}, r"must be built as NoDim\(dim, \*\*options\)"),
        (
            {"name": "ln", "_target_": "nb_userpkg.Sound"},
            r"norm 'ln' is normbench's own \(normbench.model.norms.LayerNorm\)",
        ),
    ],
)
def test_bad_user_norms_are_one_line_errors(userpkg, norm, message):
    with pytest.raises(ConfigError, match=message) as err:
        GPT(load_group("model", "micro"), 32, norm, {"name": "pre"})
    assert "\n" not in str(err.value)


def test_check_says_a_missing_target_in_one_line_and_exits_2(tmp_path):
    (tmp_path / "norm").mkdir()
    (tmp_path / "norm" / "gone.yaml").write_text("name: gone\n_target_: nb_nowhere.Gone\n")
    result = CliRunner().invoke(app, ["check", "--config-dir", str(tmp_path), "norm=gone", "--no-compile"])
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: norm 'gone': cannot import nb_nowhere for _target_ nb_nowhere.Gone"
    )
    assert result.output.count("\n") == 1 and "Traceback" not in result.output


def make_dist(site, name: str, entry_points: str) -> None:
    """An installed distribution as pip leaves it: a dist-info with METADATA and entry_points.txt."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_help_lists_the_norms_and_placements_a_user_adds(tmp_path, monkeypatch):
    make_dist(
        tmp_path,
        "nb-helpdist",
        "[normbench.norms]\nepnorm = nb_x:N\n[normbench.placements]\nepblock = nb_x:B\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "norm").mkdir(parents=True)
    (tmp_path / "conf" / "norm" / "folded.yaml").write_text("name: folded\n_target_: nb_x.F\n")
    for command in ("train", "sweep", "check"):
        shown = " ".join(
            CliRunner()
            .invoke(app, [command, "--config-dir", str(tmp_path / "conf"), "--help"])
            .output.split()
        )
        assert "rms, scale; yours: epnorm, folded" in shown, (command, shown)
        assert "rezero; yours: epblock" in shown, (command, shown)


def test_entry_point_packages_are_found_and_a_broken_one_is_named(userpkg, tmp_path, monkeypatch):
    make_dist(
        tmp_path,
        "nb-userpkg",
        """
        [normbench.norms]
        epnorm = nb_userpkg:Sound
        ln = nb_userpkg:Sound
        broken = nb_userpkg_missing:Norm

        [normbench.placements]
        ephalf = nb_userpkg:Half
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    warned = []
    skipped = extensions.install(warn=warned.append)
    assert warned == skipped and len(skipped) == 2
    assert any("'broken' (nb_userpkg_missing:Norm) is left out: ModuleNotFoundError" in s for s in skipped)
    assert any("'ln' (nb_userpkg:Sound) is left out: 'ln' is normbench's own norm" in s for s in skipped)
    assert NORMS["ln"].__module__ == "normbench.model.norms"
    cfg = compose_cfg(tiny("norm=epnorm", "placement=ephalf"))
    assert cfg.norm == {"name": "epnorm", "_target_": "nb_userpkg.Sound", "eps": 1e-6, "impl": "auto"}
    assert cfg.placement == {
        "name": "ephalf",
        "final_norm": True,
        "_target_": "nb_userpkg.Half",
        "scale": 0.5,
    }
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        # The options "norm=glob(*)" expands to in a sweep.
        assert "epnorm" in GlobalHydra.instance().config_loader().get_group_options("norm")
    run = parse_config(cfg)
    assert type(GPT(run.model, 16, run.norm, run.placement).blocks[0].norm_attn).__name__ == "Sound"
    assert extensions.install(warn=warned.append) == [] and len(warned) == 2  # said once


def test_new_writes_a_norm_and_a_placement_that_pass_their_lines(tmp_path, monkeypatch):
    from normbench.extending import scaffold

    for kind in ("norm", "placement"):
        written = scaffold.write(kind, "fresh", tmp_path)
        assert [p.name for p in written] == [f"fresh_{kind}.py", "fresh.yaml", f"test_fresh_{kind}.py"]
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose_cfg(
        tiny(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "norm=fresh", "placement=fresh", "model=micro")
    )
    run = parse_config(cfg)
    lines = conformance.norm_lines("fresh", {"eps": 1e-6}, run.model.d_model) + conformance.model_lines(run)
    assert [line.name for line in lines if not line.ok] == []
    speed = conformance.speed_line("fresh")  # eager ops against LayerNorm's fused op: measured, not flagged
    assert speed.mark == "n/a" and speed.figure.endswith("(no goal for your own norm)"), speed
    assert speed.name == "norm op alone: fwd+bwd time / LayerNorm's"  # not a training run's tokens/s
    assert re.fullmatch(r"\d+\.\d\dx at 256, \d+\.\d\dx at 1024 \(no goal for your own norm\)", speed.figure)
    with pytest.raises(ConfigError, match="overwrites nothing"):
        scaffold.write("norm", "fresh", tmp_path)
    with pytest.raises(ConfigError, match="'rms' is normbench's own norm"):
        scaffold.write("norm", "rms", tmp_path)
    with pytest.raises(ConfigError, match="not 'model'"):
        scaffold.write("model", "x", tmp_path)


def test_the_maxnorm_example_passes_its_lines(monkeypatch):
    """examples/maxnorm, the documented example outside the normbench tree."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "maxnorm" / "src"))
    cfg = compose_cfg(
        tiny(
            f"hydra.searchpath=[file://{REPO / 'examples' / 'maxnorm' / 'conf'}]",
            "norm=maxnorm",
            "model=micro",
        )
    )
    run = parse_config(cfg)
    run.placement = {"name": "scaledpre", "final_norm": True, "_target_": "normbench_maxnorm.ScaledPreBlock"}
    lines = conformance.norm_lines("maxnorm", {"eps": 1e-6}, run.model.d_model) + conformance.model_lines(run)
    assert [line.name for line in lines if not line.ok] == []
    # MaxNorm by hand: each vector over its largest absolute entry.
    x = torch.randn(3, 5, 64)
    expected = x / (x.abs().amax(-1, keepdim=True) + 1e-6)
    assert torch.allclose(norm_class("maxnorm")(64)(x), expected, atol=1e-6)


@pytest.mark.slow
def test_check_passes_a_sound_norm_on_every_line_and_the_example_trains_sweeps_and_reports(tmp_path):
    """The CLI end to end: check (exit 0, every line), a tiny sweep of maxnorm against ln, its report."""
    import os

    example = REPO / "examples" / "maxnorm"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(example / "src")])}
    cli = [sys.executable, "-m", "normbench.cli"]
    check = subprocess.run(
        [*cli, "check", "--config-dir", str(example / "conf"), "norm=maxnorm", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert check.returncode == 0, check.stderr
    lines = json.loads(check.stdout)["lines"]
    assert {line["result"] for line in lines if line["must"]} == {"ok"}
    sweep = subprocess.run(
        [
            *cli,
            "sweep",
            f"hydra.searchpath=[file://{example / 'conf'}]",
            "norm=maxnorm,ln",
            "model=micro",
            "train.steps=20",
            "train.eval_every=10",
            "train.progress=false",
            f"results_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert sweep.returncode == 0, sweep.stderr
    report = subprocess.run(
        [*cli, "report", str(tmp_path), "-o", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert report.returncode == 0, report.stderr
    table = (
        (tmp_path / "report" / "summary.md").read_text()
        if (tmp_path / "report" / "summary.md").exists()
        else report.stdout
    )
    assert "maxnorm" in table and "ln" in table
    assert all(
        math.isfinite(float(json.loads(p.read_text())["final_val_loss"]))
        for p in tmp_path.rglob("summary.json")
    )


@pytest.mark.slow
def test_the_example_installed_with_pip_is_found_through_its_entry_points(tmp_path):
    """pip install examples/maxnorm into a target folder: norm=maxnorm and placement=scaledpre appear."""
    import os

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO / "examples" / "maxnorm"),
        ],
        check=True,
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(target)])}
    code = (
        "from normbench.model import extensions; assert extensions.install() == []; "
        "from normbench.model.norms import NORMS; from normbench.model.placements import PLACEMENTS; "
        "print(NORMS['maxnorm'].__name__, PLACEMENTS['scaledpre'].__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.split() == ["MaxNorm", "ScaledPreBlock"], out.stderr
