"""DMAVFL options that follow the paper (Table 10, §6.2) and the authors' URVFL code.

Each test fails on the behaviour before these options existed: a sigmoid-only image decoder, an
MLP-only DAC, a DAC stepped on Eq. (5) only, and Gradients Scrutinizer only in its original
configuration. Runs on scikit-learn's digits with one VFL epoch (a few seconds).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import minimal

from vflbench.attacks.feature.common import BNConvDAC, ConvDAC, ImageDecoder, MapDecoder
from vflbench.defenses import create_defense
from vflbench.defenses.detectors import GradientScrutinizer, GradientScrutinizerDMAVFL
from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.run import train_run
from vflbench.experiment.scenario import load_vertical_data
from vflbench.protocol import BindContext, Channel, StepState

PARTIES = ("active", "passive_1")

DATA = {"name": "digits", "parties": 2, "aux_pool": 200}  # DMAVFL's aux rows: held out of training
SMALL = {"name": "dmavfl", "aux_batch_size": 200, "lr": 1e-3, "disc_lr": 3e-4, "pretrain_epochs": 1}
TRAIN = {"epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 1e-3}


def _attack(**params):
    """One epoch of DMAVFL on digits (16-dim embeddings); the attack object after training."""
    cfg = build_config(minimal(data=DATA, train=TRAIN, attacks=[{**SMALL, **params}]))
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    train_run(cfg, vd, attacks=plan)
    [planned] = plan.attacks
    return planned.attack, vd


def test_tanh_decoder_is_urvfls_tanh_mapped_onto_the_pixel_range():
    torch.manual_seed(0)
    dec = ImageDecoder(16, (1, 8, 4), 8, output="tanh").eval()
    z = 3 * torch.randn(5, 16)
    pre = dec.net(dec.fc(z).view(-1, 8, 2, 1))[:, :, :8, :4]
    out = dec(z)
    assert torch.allclose(out, (1 + torch.tanh(pre)) / 2)
    assert not torch.allclose(out, torch.sigmoid(pre))  # the old (sigmoid-only) decoder
    with pytest.raises(ValueError, match="'sigmoid' or 'tanh'"):
        ImageDecoder(16, (1, 8, 4), 8, output="relu")


@pytest.mark.slow
def test_dmavfl_decodes_with_tanh_by_default_and_builds_a_cnn_dac_on_the_embedding_map():
    attack, vd = _attack(dac_map=[1, 4, 4])
    state = attack.state_
    assert isinstance(state.decoder, ImageDecoder) and state.decoder.output == "tanh"
    assert isinstance(state.discriminator, ConvDAC)
    h = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)).to(vd.device)
    assert state.discriminator(h).shape == (3, 2 * 10)
    convs = [m for m in state.discriminator.features if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 2 and all(c.stride == (2, 2) for c in convs)  # Table 10: "CNN layer * 2"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"dac": "cnn"}, "needs dac_map"),
        ({"dac_map": [2, 4, 4]}, "holds 32 values"),
        ({"dac_map": [4, 4]}, "three positive sizes"),
        ({"dac_update": "both"}, "dac_update.*expected one of"),
        ({"decoder_output": "relu"}, "decoder_output.*expected one of"),
    ],
)
def test_bad_dmavfl_fidelity_options_fail_early(params, message):
    with pytest.raises(ConfigError, match=message):
        _attack(**params)


@pytest.mark.parametrize("update", ["paper", "urvfl"])
def test_dac_steps_on_eq5_or_on_eq5_plus_the_malicious_loss_like_urvfl(update):
    attack, vd = _attack(dac_update=update)
    state = attack.state_
    before = copy.deepcopy(state.discriminator)
    g = torch.Generator().manual_seed(1)  # drawn on the CPU, then put where the run's embeddings and labels are
    h = torch.randn(16, 16, generator=g).to(vd.device).requires_grad_()
    y = torch.randint(0, 10, (16,), generator=g).to(vd.device)
    attack.attack_step(state, torch.arange(16), h, y)
    # the aux batch is the whole aux set (aux_batch_size = aux_size), so its order does not matter
    with torch.no_grad():
        h_aux = state.shadow(state.aux.victim)
    logits = before(h)
    eq5 = F.cross_entropy(logits, 2 * y) + F.cross_entropy(before(h_aux), 2 * state.aux.labels + 1)
    loss_m = F.cross_entropy(logits, 2 * y + 1)
    expected = torch.autograd.grad(eq5 + loss_m if update == "urvfl" else eq5, list(before.parameters()))
    got = [p.grad for p in state.discriminator.parameters()]
    for e, a in zip(expected, got, strict=True):
        assert torch.allclose(e, a, atol=1e-6)


CONV_MAP = {"bottom": "conv_map", "top": "mlp2", "embed_dim": 64, "bottom_options": {"channels": [4, 2]}}
MAP_ATTACK = {
    "shadow_options": {"channels": [4, 2]},
    "decoder_map": [2, 8, 4],
    "dac_map": [2, 8, 4],
    "decoder_width": 8,
}


def test_pixel_aligned_maps_get_urvfls_local_map_decoder_and_a_cnn_dac():
    """Before decoder_map, every image decoder started with a Linear layer over the whole embedding: a
    change of one map position reached every output pixel. URVFL's fullDecoder is three 3x3 convs."""
    cfg = build_config(minimal(data=DATA, model=CONV_MAP, train=TRAIN, attacks=[{**SMALL, **MAP_ATTACK}]))
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    train_run(cfg, vd, attacks=plan)
    state = plan.attacks[0].attack.state_
    dec = state.decoder.eval()
    assert isinstance(dec, MapDecoder) and isinstance(state.discriminator, ConvDAC)
    assert dec.own_width == 64 and not any(isinstance(m, torch.nn.Linear) for m in dec.modules())
    x_own, x_vic = vd.active.x_test[:3], vd.passive[0].x_test[:3]
    with torch.no_grad():
        z = torch.cat([state.own.eval()(x_own), state.shadow.eval()(x_vic)], 1)
        out = dec(z)
        assert out.shape == (3, 1, 8, 4)
        maps = torch.cat([z[:, 64:].view(3, 2, 8, 4), z[:, :64].view(3, 2, 8, 4)], 3)  # victim left, own right
        assert torch.allclose(out, (1 + torch.tanh(dec.net(maps)[..., :4])) / 2)
        # locality: the victim's map value at (7, 0) reaches output pixels within 3 rows/columns only
        z2 = z.clone()
        z2[:, 64 + 7 * 4] += 5.0
        moved = (dec(z2) - out).abs()
    assert moved[:, :, 4:, :].sum() > 0 and moved[:, :, :4, :].sum() == 0


@pytest.mark.parametrize(
    ("model", "params", "message"),
    [
        (CONV_MAP, {**MAP_ATTACK, "decoder_map": [2, 4, 8]}, "aligned with the victim's 8x4 strip"),
        (CONV_MAP, {**MAP_ATTACK, "decoder_map": [1, 8, 4]}, "holds 32 values"),
        ({}, {"decoder_map": [1, 4, 4]}, "aligned with the victim's 8x4 strip"),
    ],
)
def test_bad_decoder_maps_fail_early(model, params, message):
    cfg = build_config(minimal(data=DATA, model=model, train=TRAIN, attacks=[{**SMALL, **params}]))
    vd = load_vertical_data(cfg)
    with pytest.raises(ConfigError, match=message):
        train_run(cfg, vd, attacks=validate_attacks(cfg, vd))


# -- Gradients Scrutinizer in DMAVFL's configuration ------------------------------------------


def _passive(defense):
    defense = defense.for_role("passive")  # the passive party's half
    channel = Channel(PARTIES)
    channel.endpoint("active").post("gradient_scrutinizer.labels", "passive_1", torch.zeros(4, dtype=torch.long))
    defense.bind(
        BindContext(
            "passive_1",
            "vhnn",
            10,
            2,
            torch.Generator().manual_seed(0),
            torch.Generator().manual_seed(0),
            link=channel.endpoint("passive_1"),
        )
    )
    return defense


def _detects(defense, scores) -> bool:
    for i, s in enumerate(scores):
        defense.record(StepState(0, i, torch.arange(4), "passive_1"), s)
    return defense.detected_step_ is not None


def test_gradient_scrutinizer_dmavfl_preset_averages_five_scores_against_0_8():
    preset = create_defense("gradient_scrutinizer_dmavfl")
    assert isinstance(preset, GradientScrutinizerDMAVFL)
    assert preset.get_params() == {
        "every": 50,
        "start": 50,
        "threshold": 0.8,
        "window": 5,
        "variant": "urvfl",
        "lag": 49,
        "min_scores": 6,
        "halt": True,
    }
    # a lone low score after high ones: the original rule (each score against 0.5) flags it, the average does not
    assert _detects(_passive(GradientScrutinizer()), [0.95, 0.95, 0.95, 0.95, 0.4])
    assert not _detects(_passive(create_defense("gradient_scrutinizer_dmavfl")), [0.95, 0.95, 0.95, 0.95, 0.4])
    # scores steady at 0.75: above the original's 0.5 and the URVFL code's 0.7, below DMAVFL's 0.8
    assert not _detects(_passive(GradientScrutinizer()), [0.75] * 5)
    assert _detects(_passive(create_defense("gradient_scrutinizer_dmavfl")), [0.75] * 6)
    # URVFL decides only when it holds more than k = 5 scores (len(scores) > k)
    assert not _detects(_passive(create_defense("gradient_scrutinizer_dmavfl")), [0.75] * 5)


def _labelled_passive(defense, y):
    defense = defense.for_role("passive")  # the passive party's half
    channel = Channel(PARTIES)
    channel.endpoint("active").post("gradient_scrutinizer.labels", "passive_1", y)
    defense.bind(
        BindContext(
            "passive_1",
            "vhnn",
            10,
            2,
            torch.Generator().manual_seed(0),
            torch.Generator().manual_seed(0),
            link=channel.endpoint("passive_1"),
        )
    )
    return defense


def test_gradient_scrutinizer_dmavfl_scores_and_decides_on_urvfls_schedule():
    """URVFL's ``gradient_scru`` recomputes the scores of records 50, 100, ... only at records 100,
    150, ... and decides with more than 5 scores: label-free gradients are flagged at the 350th
    received gradient (scores of records 100..300), not at the 250th; the score values are the same."""
    y = torch.arange(64) % 10
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, 32, generator=g) for _ in range(400)]  # no label structure: hijacking-like
    preset = _labelled_passive(create_defense("gradient_scrutinizer_dmavfl"), y)
    at_once = _labelled_passive(create_defense("gradient_scrutinizer_dmavfl", lag=0, min_scores=5), y)
    for step, grad in enumerate(grads):
        state = StepState(0, step, torch.arange(64), "passive_1")
        preset.on_received_gradient(grad, state)
        at_once.on_received_gradient(grad, state)
    assert [s for s, _, _ in preset.scores_][:2] == [100, 150]  # record 50 (the 51st) scored at the 100th
    assert [s for s, _, _ in at_once.scores_][:2] == [51, 101]
    assert preset.detected_step_ == 350 and at_once.detected_step_ == 251
    # both keep scoring after they halt: records 50, 100, ..., 350 scored, at once or 49 records later
    assert len(preset.scores_) == len(at_once.scores_) == 7
    assert [v for _, _, v in preset.scores_] == pytest.approx([v for _, _, v in at_once.scores_])
    assert max(v for _, _, v in preset.scores_) < 0.8
    # decisions from the 6th (URVFL) or the 5th score, every one flagged
    assert preset.details()["decisions"] == 2 and at_once.details()["decisions"] == 3
    assert preset.details()["rate"] == at_once.details()["rate"] == 1.0


# -- Figure 6 plot ------------------------------------------------------------------------------


def test_figure6_decision_curve_is_the_detectors_rule_and_the_plot_is_written(tmp_path):
    from vflbench.report.figure6 import Panel, decision_curve, detector_scores

    scores = [0.95, 0.95, 0.95, 0.95, 0.4, 0.7]
    assert decision_curve(scores, 5).tolist() == pytest.approx([0.84, 0.79])
    assert decision_curve(scores, 1).tolist() == pytest.approx(scores) and len(decision_curve(scores[:3], 5)) == 0
    # the curve agrees with the preset's own decision: flagged exactly when a value is below 0.8
    for n in (5, 6):  # mean 0.84 (not flagged), then 0.79 (flagged)
        preset = _passive(create_defense("gradient_scrutinizer_dmavfl"))
        assert _detects(preset, scores[:n]) == bool((decision_curve(scores[:n], 5) < 0.8).any()) == (n == 6)
    from vflbench.report.figure6 import decision_points

    # the preset decides from its 6th score on (URVFL's schedule): the plotted decisions start there
    at, stat = decision_points([50 * (i + 1) for i in range(6)], scores, Panel("g", "GS", 0.8, 5, min_scores=6))
    assert at.tolist() == [300] and stat.tolist() == pytest.approx([0.79])
    record = {"scores": [(50 * (i + 1), 0, s) for i, s in enumerate(scores)]}
    path = detector_scores(
        {"honest": {"gradient_scrutinizer_dmavfl": record}, "FSHA": {}},
        [Panel("gradient_scrutinizer_dmavfl", "GS (DMAVFL)", 0.8, 5)],
        tmp_path / "fig6.png",
    )
    assert path.exists() and path.read_bytes()[:4] == b"\x89PNG"


# -- URVFL's detection-run DAC and an honestly trained victim (issue 14, Gradients Scrutinizer) -----


def test_cnn_bn_dac_is_urvfls_clsdiscriminator2_normalising_each_pass_by_its_own_batch():
    attack, vd = _attack(dac="cnn_bn", dac_map=[1, 4, 4])
    dac = attack.state_.discriminator
    assert isinstance(dac, BNConvDAC)
    convs = [m for m in dac.features if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128, 64] and [c.stride[0] for c in convs] == [2, 2, 1]
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in dac.features) == 3
    g = torch.Generator().manual_seed(0)
    h, others = (torch.randn(4, 16, generator=g).to(vd.device) for _ in range(2))
    dac.train()
    assert dac(h).shape == (4, 20)
    # training mode: a row's logits depend on the batch it comes with (batch statistics), as in URVFL's passes
    assert not torch.allclose(dac(torch.cat([h[:2], others[:2]]))[:2], dac(h)[:2])
    dac.eval()
    assert torch.allclose(dac(torch.cat([h[:2], others[:2]]))[:2], dac(h)[:2], atol=1e-6)


@pytest.mark.parametrize("honest_epochs", [0, 1])
def test_honest_epochs_train_the_victim_honestly_before_the_attack_takes_over(honest_epochs):
    cfg = build_config(
        minimal(data=DATA, train={**TRAIN, "epochs": 2}, attacks=[{**SMALL, "honest_epochs": honest_epochs}])
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    state = plan.attacks[0].attack.state_
    per_epoch = -(-(len(vd.y_train) - 200) // TRAIN["batch_size"])  # the 200 aux rows are held out of training

    def steps(opt):
        return max((int(s["step"]) for s in opt.state.values()), default=0)

    # the DAC steps only in the attack's epochs; the active party's own top/bottom only in the honest ones
    assert steps(state.optimizers["discriminator"]) == (2 - honest_epochs) * per_epoch
    assert steps(run.federation.active.optimizer) == honest_epochs * per_epoch


def test_negative_honest_epochs_fail_early():
    with pytest.raises((ConfigError, ValueError), match="honest_epochs"):
        _attack(honest_epochs=-1)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_shadow_mode_train_embeds_the_aux_batch_with_its_own_batchnorm_statistics(mode):
    """URVFL's detection runs leave f_e in training mode (its attack puts it in eval mode): the DAC's
    "real" embeddings are then normalised by each aux batch's statistics, like the victim's."""
    cfg = build_config(
        minimal(data=DATA, model=CONV_MAP, train=TRAIN, attacks=[{**SMALL, **MAP_ATTACK, "shadow_mode": mode}])
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    train_run(cfg, vd, attacks=plan)
    attack = plan.attacks[0].attack
    state = attack.state_
    before = copy.deepcopy(state.shadow)
    old = [b.running_mean.clone() for b in before.modules() if isinstance(b, torch.nn.BatchNorm2d)]
    dac = copy.deepcopy(state.discriminator)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(16, 64, generator=g).to(vd.device).requires_grad_()
    y = torch.randint(0, 10, (16,), generator=g).to(vd.device)
    attack.attack_step(state, torch.arange(16), h, y)
    assert not state.shadow.training  # back in eval mode for everything else
    with torch.no_grad():  # the aux batch is the whole aux set (aux_batch_size = aux_size)
        h_aux = before.train(mode == "train")(state.aux.victim)
    dac.train()
    logits = dac(h)
    eq5 = F.cross_entropy(logits, 2 * y) + F.cross_entropy(dac(h_aux), 2 * state.aux.labels + 1)
    expected = torch.autograd.grad(eq5, list(dac.parameters()))
    for e, a in zip(expected, [p.grad for p in state.discriminator.parameters()], strict=True):
        assert torch.allclose(e, a, atol=1e-6)
    stats = [b.running_mean for b in state.shadow.modules() if isinstance(b, torch.nn.BatchNorm2d)]
    assert stats and all(torch.equal(a, b) for a, b in zip(stats, old, strict=True)) == (mode == "eval")
