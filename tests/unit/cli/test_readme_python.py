"""The README's Python example runs as printed, on the CPU, and tunes a plan of more than one stage."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Your model, in ten lines") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's 'Your model' section has no Python block"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_python_example_tunes_and_applies_a_plan_of_several_stages(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    code = _example()
    assert len(code.strip().splitlines()) <= 10, "the README promises ten lines"
    script = tmp_path / "example.py"
    script.write_text(
        code
        + "\nassert tuned.plan is not None and len(tuned.plan.actions) > 1, tuned.plan\n"
        + "assert set(tuned.plan.actions) != {memtune.Action.KEEP}, tuned.plan.compact()\n"
        + "print('stages', len(tuned.plan.actions))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "must be `None` or an integer within the vocabulary" not in done.stderr  # the example's config is sound
    assert "best plan" in done.stdout
    assert "can step faster than" in done.stdout
    stages = int(done.stdout.rsplit("stages", 1)[1].split()[0])
    assert stages > 1
