"""Seeds trained as one batched model (normbench.training.batched) against their sequential runs."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch
from conftest import compose_cfg, read_metrics, run_cli, tiny
from test_checkpoint import assert_same_run

from normbench.core.identity import config_hash
from normbench.core.provenance import NUMERICS
from normbench.core.runs import RunDir
from normbench.sweeps import batching
from normbench.sweeps.batching import launched, summary_line
from normbench.sweeps.planning import plan_sweep
from normbench.training import batched
from normbench.training.batched import Group, train_batched, why_not
from normbench.training.config import parse_config
from normbench.training.loop import Run, train
from normbench.training.sinks import MetricSinks


def runs_of(seeds, *overrides, batched_=True):
    extra = ["train.threads=1", *(["train.batched=true"] if batched_ else []), *overrides]
    return [parse_config(compose_cfg(tiny(f"seed={s}", *extra))) for s in seeds]


def train_losses(run_dir) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]


def test_each_seed_starts_as_its_sequential_run(tmp_path):
    """Same initialisation and same first batch: the first step's loss is the sequential run's."""
    overrides = ("train.steps=2", "train.log_every=1", "train.stats_every=0")
    seeds = [0, 1, 2]
    train_batched(runs_of(seeds, *overrides), [tmp_path / f"b{s}" for s in seeds])
    for s, run in zip(seeds, runs_of(seeds, *overrides, batched_=False)):
        train(run, tmp_path / f"s{s}")
        assert train_losses(tmp_path / f"b{s}")[0] == pytest.approx(
            train_losses(tmp_path / f"s{s}")[0], abs=1e-5
        )
    firsts = [train_losses(tmp_path / f"b{s}")[0] for s in seeds]
    assert len(set(firsts)) == len(seeds)  # each seed its own weights and batches, not one copied


def test_seeds_end_where_their_sequential_runs_end(tmp_path):
    overrides = ("train.steps=150", "train.eval_every=50", "train.log_every=25")
    seeds = [0, 1]
    out = train_batched(runs_of(seeds, *overrides), [tmp_path / f"b{s}" for s in seeds])
    for s, summary, run in zip(seeds, out, runs_of(seeds, *overrides, batched_=False)):
        alone = train(run, tmp_path / f"s{s}")
        assert summary["status"] == alone["status"] == "completed"
        assert summary["final_val_loss"] == pytest.approx(alone["final_val_loss"], abs=0.02)
        # per-layer statistics are measured per seed, as a sequential run measures them
        assert summary["max_attn_logit"] == pytest.approx(alone["max_attn_logit"], rel=0.05)


def test_each_run_directory_is_a_sequential_runs_format(tmp_path):
    seeds = [3, 4]
    out = train_batched(runs_of(seeds), [tmp_path / f"b{s}" for s in seeds])
    alone = train(runs_of([3], batched_=False)[0], tmp_path / "alone")
    for s, summary in zip(seeds, out):
        stored = RunDir(tmp_path / f"b{s}").read_summary()
        assert stored["config_hash"] == summary["config_hash"]
        assert set(stored) == set(alone)
        assert stored["provenance"]["batched"] == 2
        assert stored["provenance"]["norm_impl"] == {"ln": "eager"}
        kinds = {r["kind"] for r in read_metrics(tmp_path / f"b{s}")}
        assert kinds == {r["kind"] for r in read_metrics(tmp_path / "alone")}
        assert (tmp_path / f"b{s}" / "config.yaml").exists()
    assert "batched" not in alone["provenance"]


def test_a_diverging_seed_stops_alone(tmp_path, monkeypatch):
    """A seed whose weights turn to NaN is recorded diverged; the others train on, bit for bit as
    they would have without it."""
    overrides = ("train.steps=20", "train.stats_every=0")
    seeds = [0, 1, 2]
    clean = train_batched(runs_of(seeds, *overrides), [tmp_path / f"c{s}" for s in seeds])
    real_step = Group.train_step

    def poisoned(self):
        out = real_step(self)
        if self.scheduler.last_epoch == 3:
            with torch.no_grad():
                self.params["tok_emb.weight"][1].fill_(float("nan"))
        return out

    monkeypatch.setattr(Group, "train_step", poisoned)
    out = train_batched(runs_of(seeds, *overrides), [tmp_path / f"p{s}" for s in seeds])
    assert [s["status"] for s in out] == ["completed", "diverged", "completed"]
    assert out[1]["steps"] == 5  # the first log window after the NaN (train.log_every=5)
    assert RunDir(tmp_path / "p1").read_summary()["status"] == "diverged"
    for i in (0, 2):
        assert out[i]["final_val_loss"] == clean[i]["final_val_loss"]
        assert train_losses(tmp_path / f"p{i}") == train_losses(tmp_path / f"c{i}")


def test_clipping_uses_each_seeds_own_norm(tmp_path):
    """Two seeds, gradient norms 0.5 and 4, clip at 1: the first is left alone, the second scaled to
    norm 1, as clip_grad_norm_ treats each model by itself."""
    states = [Run(run, tmp_path / f"r{run.seed}") for run in runs_of([0, 1], "train.grad_clip=1.0")]
    group = Group(states)
    for p in group.params.values():
        p.grad = torch.randn_like(p)
    wanted = []
    for k, target in enumerate((0.5, 4.0)):
        own = torch.sqrt(sum(p.grad[k].pow(2).sum() for p in group.params.values()))
        for p in group.params.values():
            p.grad[k].mul_(target / own)
        copies = [p.grad[k].clone().requires_grad_() for p in group.params.values()]
        for c in copies:
            c.grad = c.detach().clone()
        torch.nn.utils.clip_grad_norm_(copies, 1.0)
        wanted.append([c.grad for c in copies])
    norms = group.clip_per_seed()
    assert norms.tolist() == pytest.approx([0.5, 4.0], rel=1e-5)
    for k in range(2):
        for p, want in zip(group.params.values(), wanted[k]):
            torch.testing.assert_close(p.grad[k], want)
    after = [math.sqrt(sum(p.grad[k].pow(2).sum().item() for p in group.params.values())) for k in range(2)]
    assert after == pytest.approx([0.5, 1.0], rel=1e-5)


def test_batched_is_part_of_the_identity():
    plain = compose_cfg(tiny())
    assert config_hash(compose_cfg(tiny("train.batched=false"))) == config_hash(plain)
    assert config_hash(compose_cfg(tiny("train.batched=true"))) != config_hash(plain)


def test_what_cannot_train_batched_says_why():
    assert why_not(runs_of([0])[0]) is None
    assert why_not(runs_of([0], "norm=bn")[0]) is None  # its running statistics stacked per seed
    assert "weights rewritten" in why_not(runs_of([0], "placement=ngpt")[0])
    assert "compile" in why_not(runs_of([0], "train.compile=auto")[0])
    assert "gradient scaler" in why_not(runs_of([0], "train.precision=fp16")[0])
    assert why_not(runs_of([0], "train.precision=bf16")[0]) is None


def test_batchnorm_seeds_keep_their_own_running_statistics(tmp_path):
    """BatchNorm batched: each seed normalizes over its own batch and updates its own running
    statistics, which evaluation (eval mode) then reads: both as its sequential run's."""
    overrides = ("norm=bn", "train.steps=20", "train.log_every=1")
    seeds = [0, 1]
    out = train_batched(runs_of(seeds, *overrides), [tmp_path / f"b{s}" for s in seeds])
    for s, summary, run in zip(seeds, out, runs_of(seeds, *overrides, batched_=False)):
        alone = train(run, tmp_path / f"s{s}")
        assert train_losses(tmp_path / f"b{s}")[0] == pytest.approx(
            train_losses(tmp_path / f"s{s}")[0], abs=1e-5
        )
        assert summary["final_val_loss"] == pytest.approx(alone["final_val_loss"], abs=2e-3)
    assert out[0]["final_val_loss"] != out[1]["final_val_loss"]


def test_bf16_seeds_start_as_their_sequential_runs(tmp_path):
    """bf16 autocast batched as a sequential run's: the same first loss, up to bf16's rounding."""
    overrides = ("train.precision=bf16", "train.steps=2", "train.log_every=1")
    seeds = [0, 1]
    train_batched(runs_of(seeds, *overrides), [tmp_path / f"b{s}" for s in seeds])
    for s, run in zip(seeds, runs_of(seeds, *overrides, batched_=False)):
        train(run, tmp_path / f"s{s}")
        assert train_losses(tmp_path / f"b{s}")[0] == pytest.approx(
            train_losses(tmp_path / f"s{s}")[0], abs=1e-3
        )
        assert RunDir(tmp_path / f"b{s}").read_summary()["provenance"]["precision"] == "bf16"


def test_only_seeds_of_one_config_train_together(tmp_path):
    with pytest.raises(ValueError, match="seed only"):
        batched.check_group([*runs_of([0]), *runs_of([1], "train.lr=0.01")])
    with pytest.raises(ValueError, match="must differ"):
        batched.check_group(runs_of([0, 0]))


# ----------------------------------------------------------------------------- normbench sweep --batch-seeds

BATCH_SEEDS = batching.OPTION  # what --batch-seeds adds to the overrides


def test_the_plan_groups_each_configs_seeds_and_says_what_cannot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_sweep(["placement=pre,ngpt", "seed=0,1,2", *tiny(), BATCH_SEEDS])
    pre = [j for j in plan.jobs if "placement=pre" in j.overrides]
    ngpt = [j for j in plan.jobs if "placement=ngpt" in j.overrides]
    assert all(
        "train.batched=true" in j.overrides and j.batch == [pre[0].num, pre[1].num, pre[2].num] for j in pre
    )
    assert all(j.batch is None and "weights rewritten" in j.unbatched for j in ngpt)
    assert [j.num for j in launched(plan.jobs)] == sorted([pre[0].num, *(j.num for j in ngpt)])
    # a batched grid is other configs: its own sweep directory, and its runs their own directories
    plain = plan_sweep(["placement=pre,ngpt", "seed=0,1,2", *tiny()])
    assert plain.sweep_dir != plan.sweep_dir
    alone = {j.run_dir.name for j in plain.jobs if "placement=ngpt" in j.overrides}
    assert alone == {j.run_dir.name for j in ngpt}
    assert not {j.run_dir.name for j in plain.jobs} & {j.run_dir.name for j in pre}
    line = summary_line(plan.jobs)
    assert line.startswith(
        "--batch-seeds: 3 runs in 1 batched group; 3 one at a time (placement=ngpt: weights rewritten"
    )


def test_a_finished_seed_stays_out_of_its_group(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["seed=0,1,2", *tiny(), BATCH_SEEDS]
    first = plan_sweep(args).jobs[0]
    RunDir(first.run_dir).write_config(compose_cfg(tiny("seed=0", "train.batched=true")))
    RunDir(first.run_dir).write_summary({"status": "completed", "provenance": {"numerics": NUMERICS}})
    jobs = plan_sweep(args).jobs
    assert jobs[0].state == "completed" and jobs[0].batch is None
    assert jobs[1].batch == jobs[2].batch == [1, 2]


@pytest.mark.slow  # a sweep through the CLI in a subprocess
def test_a_batch_seeds_sweep_writes_every_runs_directory(tmp_path):
    args = ["sweep", "--batch-seeds", "placement=pre,ngpt", "seed=0,1", *tiny("train.threads=1")]
    result = run_cli(*args, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "--batch-seeds: 2 runs in 1 batched group; 2 one at a time (placement=ngpt" in out
    summaries = {p.name: RunDir(p).read_summary() for p in (tmp_path / "sweep").iterdir() if p.is_dir()}
    assert len(summaries) == 4 and all(s["status"] == "completed" for s in summaries.values())
    batched_ = {name: s["provenance"].get("batched") for name, s in summaries.items()}
    assert sorted(batched_.values(), key=str) == [2, 2, None, None]
    assert all(("-pre-" in name) == (k == 2) for name, k in batched_.items())


def test_claims_batch_seeds_by_default_on_cuda_alone():
    """claims run batches a config's seeds by default where it pays (a CUDA device), not on a CPU."""
    assert batching.pays(["train.device=cuda:1"])
    assert not batching.pays(["train.device=cpu"])
    assert not batching.pays(["train.device=cuda", "train.device=cpu"])  # the last override wins
    assert batching.pays([]) == torch.cuda.is_available()


def stopped_at_step_10(monkeypatch, runs, dirs) -> list[dict]:
    """The group trained with a SIGTERM sent as it logs step 10 (as a scheduler's preemption would)."""
    log, sent = MetricSinks.log, []

    def log_and_signal(self, record):
        log(self, record)
        if (record.get("kind"), record.get("step")) == ("train", 10) and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as m:
        m.setattr(MetricSinks, "log", log_and_signal)
        return train_batched(runs, dirs)


def test_a_stopped_group_checkpoints_every_seed_and_resumes_exactly(tmp_path, monkeypatch):
    """SIGTERM in step 10: each seed's checkpoint (its weights, its share of AdamW's state, the shared
    dropout RNG), then the same group resumes to the uninterrupted group's losses, bit for bit."""
    overrides = ("model.dropout=0.1", "train.stats_every=4")
    seeds = [0, 1]
    train_batched(runs_of(seeds, *overrides, "train.checkpoint_every=0"), [tmp_path / f"r{s}" for s in seeds])
    dirs = [tmp_path / f"b{s}" for s in seeds]
    stopped = stopped_at_step_10(monkeypatch, runs_of(seeds, *overrides), dirs)
    assert [s["status"] for s in stopped] == ["interrupted"] * 2 and {s["steps"] for s in stopped} == {10}
    saved = [torch.load(d / "checkpoint.pt", weights_only=True) for d in dirs]
    assert [s["step"] for s in saved] == [10, 10]
    assert not torch.equal(saved[0]["model"]["tok_emb.weight"], saved[1]["model"]["tok_emb.weight"])
    resumed = train_batched(runs_of(seeds, *overrides), dirs)
    for s, summary in zip(seeds, resumed):
        assert summary["resumed_at"] == [10]
        assert_same_run(tmp_path / f"b{s}", tmp_path / f"r{s}")


def test_seeds_checkpointed_at_different_steps_start_the_group_afresh(tmp_path, monkeypatch):
    """One seed's checkpoint gone: the group cannot resume as one, so every seed starts again and ends
    where an uninterrupted group ends."""
    seeds = [0, 1]
    train_batched(runs_of(seeds, "train.checkpoint_every=0"), [tmp_path / f"r{s}" for s in seeds])
    dirs = [tmp_path / f"b{s}" for s in seeds]
    stopped_at_step_10(monkeypatch, runs_of(seeds), dirs)
    RunDir(dirs[1]).remove_checkpoints()
    again = train_batched(runs_of(seeds), dirs)
    assert [s.get("resumed_at") for s in again] == [[], []]
    for s in seeds:
        assert_same_run(tmp_path / f"b{s}", tmp_path / f"r{s}")
