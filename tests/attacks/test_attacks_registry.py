"""The attack registry: every registered attack is built from its spec, round-trips, stays in
[0, 1] and in its ε-ball; a new attack is its class (its parameters and its computation) in the
two registries — the torch-free parameters' (:data:`ATTACK_PARAMETERS`, which the CLI reads) and
the attacks' (:data:`ATTACKS`) — for the spec parser, ``run_attack`` and the CLI alike."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from bayesgate.attacks.methods import ATTACKS, CWL2, FGS, PGD, Attack, AttackInput, TargetedFGS
from bayesgate.attacks.methods.base import attack_registry
from bayesgate.attacks.methods.parameters import (
    ATTACK_PARAMETERS,
    FGSParameters,
    check,
    parameter_defaults,
)
from bayesgate.attacks.methods.registry import check_implements
from bayesgate.attacks.model_fn import log_predictive_fn
from bayesgate.attacks.run import run_attack
from bayesgate.attacks.specs import build_attack, parse_attack, parse_parameters
from bayesgate.cli import main
from bayesgate.models.networks.registry import build_network, preset_architecture

# A spec with every parameter away from its default (and cheap to run), per registered attack: a
# new attack must add one here, which the first test enforces.
EXAMPLES = {
    "fgs": "fgs:eta=0.05",
    "targeted": "targeted:eta=0.02,steps=4,target=3",
    "pgd": "pgd:eps=0.1,eps_iter=0.03,steps=3",
    "cw": "cw:iterations=6,binary_steps=2,lr=0.05,const=5,confidence=0.5",
    "apgd": "apgd:eps=0.1,steps=5,loss=dlr",
    "pgd-restarts": "pgd-restarts:eps=0.1,eps_iter=0.02,steps=4,restarts=2",
    "square": "square:eps=0.1,queries=5,p_init=0.1,confidence=0.5",
    "slide": "slide:eps=2,eps_iter=0.5,steps=3,sparsity=90",
    "sparse-rs": "sparse-rs:pixels=3,queries=5,alpha_init=0.5,confidence=0.5",
}


def test_every_registered_attack_has_an_example() -> None:
    assert set(EXAMPLES) == set(ATTACKS)
    assert list(ATTACKS) == [
        "fgs",
        "targeted",
        "pgd",
        "cw",
        "apgd",
        "pgd-restarts",
        "square",
        "slide",
        "sparse-rs",
    ]  # the order help texts list them


@pytest.mark.parametrize("name", list(ATTACKS))
def test_spec_with_defaults_builds_the_class_with_its_defaults(name: str) -> None:
    cls = ATTACKS[name]
    attack = parse_attack(name)
    assert type(attack) is cls and attack == cls() == build_attack(name)
    assert attack.params == parameter_defaults(cls)
    assert attack.name == name and attack.label  # every attack has a label
    assert attack.key == name + ":" + ",".join(f"{k}={v}" for k, v in attack.params.items())


@pytest.mark.parametrize("name", list(ATTACKS))
def test_spec_object_spec_round_trip(name: str) -> None:
    attack = parse_attack(EXAMPLES[name])
    defaults = parameter_defaults(ATTACKS[name])
    assert all(attack.params[k] != defaults[k] for k in defaults)  # the example sets every one
    assert parse_attack(attack.key) == attack and parse_attack(attack.key).key == attack.key
    assert ATTACKS[name](**attack.params) == attack
    # values keep their declared types whichever way they come in
    for key, value in attack.params.items():
        assert type(value) is type(defaults[key]) or key == "target"


def test_values_are_coerced_when_the_class_is_built() -> None:
    assert FGS(eta="0.25") == FGS(eta=0.25) and isinstance(FGS(eta=1).eta, float)
    assert TargetedFGS(steps=3.0, target="4") == TargetedFGS(steps=3, target=4)
    with pytest.raises(ValueError, match="steps must be int"):
        PGD(steps=2.5)
    with pytest.raises(ValueError, match="steps must be int"):
        PGD(steps=True)


@pytest.mark.parametrize("text", ["fgs:eta=0.2,eta=0.3", "pgd:steps=3, steps =3"])
def test_a_parameter_given_twice_is_refused_not_last_wins(text: str) -> None:
    with pytest.raises(ValueError, match="given twice"):
        parse_parameters(text)


@pytest.mark.parametrize(
    ("text", "listed"),
    [
        ("nope:eta=1", list(ATTACKS)),  # every registered name
        ("pgd:eta=1", list(parameter_defaults(PGD))),  # every parameter of the attack
        ("cw:eps=1", list(parameter_defaults(CWL2))),
    ],
)
def test_errors_list_the_valid_choices(text: str, listed: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        parse_attack(text)
    message = str(err.value)
    assert all(name in message for name in listed)


def test_linf_radius_is_the_ball_of_the_update() -> None:
    assert FGS(eta=0.1).linf_radius == 0.1
    assert TargetedFGS(eta=0.02, steps=3).linf_radius == pytest.approx(0.06)
    assert PGD(eps=0.2).linf_radius == 0.2
    assert CWL2().linf_radius is None


def _dropout_net() -> torch.nn.Module:
    torch.manual_seed(0)
    arch = preset_architecture("mlp-2x32")
    arch["in_shape"] = [1, 4, 4]
    return build_network(arch)


def _images(n: int = 8) -> torch.Tensor:
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    x[:, 0, 0, :2], x[:, 0, 1, :2] = 0.0, 1.0  # pixels on the box edges exercise the clipping
    return x


@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_attack_stays_in_the_box_and_its_ball(name: str) -> None:
    net, x = _dropout_net(), _images()
    fn = log_predictive_fn(net, 3, generator=torch.Generator().manual_seed(1))
    attack = parse_attack(EXAMPLES[name])
    with torch.no_grad():
        own = fn(x).argmax(1)
    y = (own + 1) % 10 if attack.targeted else None
    adv = attack(fn, x, y, generator=torch.Generator().manual_seed(2))
    assert adv.shape == x.shape and adv.dtype == x.dtype and not adv.requires_grad
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    if attack.linf_radius is not None:
        assert float((adv - x).abs().max()) <= attack.linf_radius + 1e-6
    assert not torch.equal(adv, x) or name == "cw"  # CW may leave every image alone


def test_each_attack_class_is_built_on_its_declared_parameters() -> None:
    """One declaration per parameter: ``ATTACKS`` names the attacks of ``ATTACK_PARAMETERS``, in
    its order, each class deriving from its parameters class and adding no parameter; a spec
    checked without torch (:func:`parse_parameters`) builds the same attack."""
    assert list(ATTACKS) == list(ATTACK_PARAMETERS)
    for name, cls in ATTACKS.items():
        declared = ATTACK_PARAMETERS[name]
        assert issubclass(cls, declared) and issubclass(cls, Attack)
        assert parameter_defaults(cls) == parameter_defaults(declared)
        for attr in ("name", "targeted", "slow", "requires"):
            assert getattr(cls, attr) == getattr(declared, attr)
        parameters = parse_parameters(EXAMPLES[name])
        assert type(parameters) is declared
        assert parse_attack(EXAMPLES[name]).params == parameters.params
        assert parse_attack(EXAMPLES[name]).key == parameters.key


def test_the_two_registries_cannot_drift_apart() -> None:
    with pytest.raises(TypeError, match="not those whose parameters are declared"):
        check_implements({"fgs": FGS}, {"fgs": FGSParameters, "pgd": ATTACK_PARAMETERS["pgd"]})
    with pytest.raises(TypeError, match="PGD must derive from FGSParameters"):
        check_implements({"fgs": PGD}, {"fgs": FGSParameters})


# --- a new attack: one class in both registries --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UniformNoise(Attack):
    """``clip(x + U(−r, r))`` with the noise from the attack's generator (no gradient)."""

    name: ClassVar[str] = "noise"

    radius: float = 0.1

    def check(self) -> None:
        check(0.0 < self.radius <= 1.0, f"noise radius must be in (0, 1], got {self.radius}")

    @property
    def linf_radius(self) -> float:
        return self.radius

    @property
    def label(self) -> str:
        return f"noise r={self.radius:g}"

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        x = batch.x
        u = torch.rand(x.shape, generator=batch.generator, device=x.device)
        return (x + (2 * u - 1) * self.radius).clamp(0.0, 1.0)


@pytest.fixture
def with_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    # an Attack is its own parameters class (the real ones split theirs out, torch-free)
    monkeypatch.setitem(ATTACK_PARAMETERS, UniformNoise.name, UniformNoise)
    monkeypatch.setitem(ATTACKS, UniformNoise.name, UniformNoise)


def test_new_attack_reaches_parser_run_and_cli(
    with_noise: None, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    attack = parse_attack("noise:radius=0.05")
    assert attack == UniformNoise(radius=0.05) and attack.key == "noise:radius=0.05"
    net, x = _dropout_net(), _images()
    out = run_attack(net, x, torch.zeros(8, dtype=torch.int64), attack, k=2, k_eval=2, seed=5)
    assert float((out.x_adv - x).abs().max()) <= 0.05 + 1e-6
    # batch b draws from a generator seeded seed·100003 + b (one batch here)
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(5 * 100_003))
    torch.testing.assert_close(out.x_adv, (x + (2 * noise - 1) * 0.05).clamp(0, 1))

    with pytest.raises(SystemExit):
        main(["attack", "--help"])
    assert "--radius" in capsys.readouterr().out
    npz = tmp_path / "noise.npz"
    argv = ["attack", str(tiny_model_dir), "--attack", "noise", "--radius", "0.1"]
    argv += ["--limit", "6", "--k-eval", "3", "--out", str(npz), "--no-progress"]
    assert main(argv) == 0
    with np.load(npz, allow_pickle=False) as data:
        assert json.loads(str(data["meta"]))["attack"] == "noise:radius=0.1"


def test_attack_cli_flags_come_from_the_registry(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["attack", "--help"])
    text = capsys.readouterr().out
    assert "{" + ",".join(ATTACKS) + "}" in text
    for cls in ATTACKS.values():
        for key in parameter_defaults(cls):
            assert "--" + key.replace("_", "-") in text


def test_attack_cli_rejects_a_flag_the_attack_lacks(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["attack", str(tiny_model_dir), "--attack", "fgs", "--steps", "3", "--out", "x.npz"]
    assert main(argv) == 2
    assert "attack 'fgs' has no parameter(s) steps; known: eta" in capsys.readouterr().err


def test_registry_rejects_malformed_attacks() -> None:
    class Undecorated(FGS):  # its new annotations would not become parameters
        name: ClassVar[str] = "undecorated"

    @dataclasses.dataclass(frozen=True)
    class NoTarget(FGS):
        name: ClassVar[str] = "aimless"
        targeted: ClassVar[bool] = True

    with pytest.raises(ValueError, match="registered twice"):
        attack_registry(FGS, FGS)
    with pytest.raises(TypeError, match="frozen"):
        attack_registry(Undecorated)
    with pytest.raises(TypeError, match="'target' parameter"):
        attack_registry(NoTarget)
    with pytest.raises(TypeError, match="not an Attack"):
        attack_registry(dict)  # type: ignore[arg-type]


def test_specs_and_commands_work_without_the_attacks_extra() -> None:
    """cleverhans and matplotlib (the [attacks] extra) are imported only when an attack runs or
    a plot is drawn: parsing specs and building the command line need neither."""
    code = (
        "import sys\n"
        "sys.modules['cleverhans'] = sys.modules['matplotlib'] = None  # import fails\n"
        "from bayesgate.attacks.specs import parse_attack\n"
        "from bayesgate.cli import build_parser\n"
        "build_parser()\n"
        "print(parse_attack('cw').key)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == CWL2().key
