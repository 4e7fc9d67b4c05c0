"""The report's depth claims: the gradient-norm profile per placement (Mix-LN) and each layer's
residual variance and contribution (the curse of depth), on runs whose per-layer statistics and
layer-skip losses are planted by hand; the sentences' numbers are computed here from the plant.
"""

from __future__ import annotations

import json
import math

from test_report import make_run, only_charts, report

FINAL = 2.5


def depth_run(root, name, *, placement, seed, grads_init, grads_end, var_end=None, skip=None):
    """A 4-layer run: stats records at step 0 and 290 with the given per-layer gradient norms (all
    in mlp_out, so the layer's norm is that value) and residual variances; its layer-skip losses."""
    run = make_run(
        root, name, placement=placement, seed=seed, n_layer=len(grads_init), stats=False, final=FINAL
    )
    records = []
    for step, grads, var in ((0, grads_init, [1.0] * len(grads_init)), (290, grads_end, var_end)):
        layers = [
            {
                "grad_norm": {"attn_in": 0.0, "attn_out": 0.0, "mlp_in": 0.0, "mlp_out": g, "norm": None},
                "resid_rms": 1.0,
                **({"resid_var": var[i]} if var else {}),
            }
            for i, g in enumerate(grads)
        ]
        records.append({"kind": "stats", "step": step, "grad_norm": 1.0, "clipped": False, "layers": layers})
    with (run / "metrics.jsonl").open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    summary = json.loads((run / "summary.json").read_text())
    summary["layer_skip_loss"] = None if skip is None else [FINAL + s for s in skip]
    (run / "summary.json").write_text(json.dumps(summary))


def words(text: str) -> str:
    return " ".join(text.split())


def test_the_gradient_profile_sentence_gives_each_placements_last_over_first_layer(tmp_path, monkeypatch):
    only_charts(monkeypatch, "grad_profile")
    # pre: flat at init, the deep layers' gradients 4x and 2x smaller at the end (seeds 0 and 1)
    depth_run(tmp_path, "pre-0", placement="pre", seed=0, grads_init=[1, 1, 1, 1], grads_end=[4, 3, 2, 1])
    depth_run(tmp_path, "pre-1", placement="pre", seed=1, grads_init=[1, 1, 1, 1], grads_end=[2, 2, 1, 1])
    # post: the early layers' gradients the smaller, 8x at init, 2x at the end
    for seed in (0, 1):
        depth_run(
            tmp_path,
            f"post-{seed}",
            placement="post",
            seed=seed,
            grads_init=[1, 2, 4, 8],
            grads_end=[1, 1, 1, 2],
        )
    out, text = report([tmp_path])
    pre_end = math.exp((math.log(1 / 4) + math.log(1 / 2)) / 2)  # the geometric mean of the two runs
    flat = words(text)
    assert (
        f"post 8.00x at init, 2.00x at the last record; pre 1.00x at init, {pre_end:.2f}x at the last record"
        in flat
    )
    assert (out / "grad_profile.png").stat().st_size > 1000


def test_the_depth_sentence_gives_each_layers_contribution_and_the_variance_growth(tmp_path, monkeypatch):
    only_charts(monkeypatch, "depth_profile")
    for seed in (0, 1):
        depth_run(
            tmp_path,
            f"pre-{seed}",
            placement="pre",
            seed=seed,
            grads_init=[1, 1, 1, 1],
            grads_end=[1, 1, 1, 1],
            var_end=[1.0, 2.0, 3.0, 4.0],
            skip=[0.3, 0.1, 0.05, 0.05],
        )
    out, text = report([tmp_path])
    deep = (0.05 + 0.05) / (0.3 + 0.1 + 0.05 + 0.05)  # the deeper half's share of the summed rise
    assert (
        f"ln/pre: skipping the first layer +0.300, the last +0.050, the deeper half {100 * deep:.0f}% "
        "of the summed rise, residual variance last/first layer 4.0x" in words(text)
    )
    assert (out / "depth_profile.png").stat().st_size > 1000


def test_runs_without_per_layer_statistics_get_no_depth_sentences(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    for placement in ("pre", "post"):
        make_run(tmp_path, placement, placement=placement, stats=False)
    _, text = report([tmp_path])
    assert "Gradient norm by depth" not in text and "What each layer contributes" not in text
