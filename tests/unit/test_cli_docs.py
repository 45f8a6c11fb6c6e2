"""docs/cli.md is generated from the parsers (scripts/gen_cli_docs.py) and must stay in step."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_cli_docs.py"


def check(out: Path) -> subprocess.CompletedProcess:
    # A fresh interpreter: models or losses that other tests register must not reach the text.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_cli_reference_is_up_to_date():
    proc = check(ROOT / "docs" / "cli.md")
    assert proc.returncode == 0, proc.stderr.strip() or proc.stdout


def test_a_stale_reference_is_reported_with_the_command_that_fixes_it(tmp_path):
    stale = tmp_path / "cli.md"
    stale.write_text((ROOT / "docs" / "cli.md").read_text().replace("--epochs", "--epoch", 1))
    proc = check(stale)
    assert proc.returncode == 1
    assert "docs/cli.md is stale: run python scripts/gen_cli_docs.py" in proc.stderr


def test_reference_lists_every_flag_of_train_and_compare_by_section():
    text = (ROOT / "docs" / "cli.md").read_text()
    for heading in ("## hvdtrain train", "### train: data", "### train: ps", "## hvdtrain compare"):
        assert f"\n{heading}\n" in text, heading
    for flag in ("--epochs", "--staleness", "--stages", "--simulate", "--sweep-workers"):
        assert f"`{flag} " in text or f"`{flag}`" in text, flag
