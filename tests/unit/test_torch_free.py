"""The tuner runs without torch: a simulation and a search of a shipped profile with ``import torch`` failing.

The service's search processes import the tuner, never torch (``memtune/tuner/__init__.py``;
``memtune/profiler/__init__.py`` loads its torch names on first use). ``test_layering`` checks the tuner's own imports;
this runs the code, so a torch
import reached through a call (``memtune.profiler.loss_model.profile_loss_ms`` estimating a missing ``loss_ms``, once
``memtune.profiler.loss`` -> ``memtune.profiler.modeled`` -> ``memtune.profiler.chain``) fails here too. The profile's
``loss_ms`` is stripped so that the estimate runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "memtune" / "profiler" / "data" / "resnet50-b128-float32-h100.json"

CODE = f"""
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"torch is blocked: {{name}}", name=name)
        return None


sys.meta_path.insert(0, NoTorch())
sys.modules.pop("torch", None)

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)

from memtune.profiler.loss_model import profile_loss_ms
from memtune.profiler._profile import Profile
from memtune.tuner.plan import Plan
from memtune.tuner.search import tune
from memtune.tuner.simulator import simulate

profile = Profile.load({str(PROFILE)!r}).model_copy(update={{"loss_ms": None}})
loss_ms = profile_loss_ms(profile)
assert loss_ms > 0, loss_ms  # the roofline estimate ran (the profile's GPU is a known one)
result = simulate(profile, Plan.uniform(profile.n_stages))
tuned = tune(profile, int(result.peak_bytes * 0.8), trials=10)
assert tuned.best is not None and tuned.best.feasible
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print(f"step_ms={{result.step_ms:.3f}} loss_ms={{loss_ms:.3f}} tuned_ms={{tuned.best.step_ms:.3f}}")
"""


def test_simulate_and_tune_run_without_torch() -> None:
    run = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    found = re.search(r"step_ms=(\d+\.\d+) loss_ms=(\d+\.\d+) tuned_ms=(\d+\.\d+)", run.stdout)
    assert found, run.stdout
    assert float(found[1]) > 0


TUNE = """
import sys
{blocker}
from typer.testing import CliRunner

from memtune.api.cli import app

args = ["tune", "vgg16", "--batch", "256", "--gpu", "h200", "--budget", "13GiB", "--trials", "3", "--json"]
done = CliRunner().invoke(app, args)
assert done.exit_code == 0, (done.output, done.exception)
assert '"profile_source": "measured"' in done.output, done.output
print("torch", sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


@pytest.mark.slow  # a fresh interpreter and a three-trial search: about four seconds on two cores
def test_tune_finds_a_zoo_models_committed_profile_without_torch() -> None:
    """``memtune tune vgg16 …`` without a GPU finds the committed profile from the zoo model's name and parameters
    and searches it with torch blocked (NOTE [ Zoo names without torch ] in ``memtune.profiler.zoo``): importing torch
    and building the model on the meta device took about 5 s of the README job's 21."""
    blocker = CODE.split("import optuna", 1)[0]
    run = subprocess.run([sys.executable, "-c", TUNE.format(blocker=blocker)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.strip().endswith("torch []"), run.stdout


HELP = """
import sys

from typer.main import get_command
from typer.testing import CliRunner

from memtune.api.cli import app

runner = CliRunner()
group = get_command(app)
names = [[]] + [[name] for name in group.commands] + [
    [name, sub] for name, cmd in group.commands.items() for sub in getattr(cmd, "commands", {})
]
for args in names:
    done = runner.invoke(app, [*args, "--help"])
    assert done.exit_code == 0 and "Usage" in done.output, (args, done.output)
heavy = sorted(m for m in ("torch", "optuna", "sqlalchemy", "alembic", "fastapi") if m in sys.modules)
print("commands", len(names), "heavy", heavy)
"""


@pytest.mark.slow  # a fresh interpreter showing every command's help: about three seconds on two cores
def test_help_imports_no_torch() -> None:
    """``memtune --help`` and every subcommand's ``--help`` load neither torch nor the search's or the database's
    libraries (each command imports them when it runs), so the help comes in about a second, not two."""
    run = subprocess.run([sys.executable, "-c", HELP], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split("heavy", 1)[1].strip() == "[]", run.stdout
    assert int(run.stdout.split()[1]) > 10, run.stdout  # every command was shown
