"""``python -m grpo_companion diagnose`` as a newcomer runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_companion.cli import main


@pytest.fixture
def files(tmp_path):
    (tmp_path / "cfg.json").write_text(json.dumps({"beta": 1.0, "max_steps": 200}))
    (tmp_path / "pref.csv").write_text("prompt,p_ref\na,0.8\nb,0.3\nc,0\n")
    return tmp_path


def test_it_prints_the_table_and_writes_the_plot(files):
    plot = files / "d.png"
    done = subprocess.run([sys.executable, "-m", "grpo_companion", "diagnose", "--config",
                           str(files / "cfg.json"), "--p-ref", str(files / "pref.csv"),
                           "--plot", str(plot)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "expected frac_reward_zero_std" in done.stdout and "absorbing" in done.stdout
    assert len([line for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]) == 3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def _run(capsys, *args):
    code = main(["diagnose", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_existing_plot_is_kept(files, capsys):
    plot = files / "d.png"
    plot.write_bytes(b"mine")
    code, _, err = _run(capsys, "--config", str(files / "cfg.json"), "--p-ref",
                        str(files / "pref.csv"), "--plot", str(plot))
    assert code == 2 and "exists" in err and len(err.strip().splitlines()) == 1
    assert plot.read_bytes() == b"mine"
    code, _, _ = _run(capsys, "--config", str(files / "cfg.json"), "--p-ref",
                      str(files / "pref.csv"), "--plot", str(plot), "--overwrite")
    assert code == 0 and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("config, rates, plot, words", [
    ('{"betta": 1}', "0.5\n", "d.png", "did you mean beta"),
    ('{"beta": 1}', "p_ref\n0.5\n7\n", "d.png", "row 3"),
    ('{"beta": 1', "0.5\n", "d.png", "not valid JSON"),
    ('{"beta": 1}', "0.5\n", "d.pdf", "must name a .png"),
    ('{"beta": 1}', "0.5\n", "no/such/d.png", "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(files, capsys, config, rates, plot, words):
    (files / "c.json").write_text(config)
    (files / "r.csv").write_text(rates)
    code, out, err = _run(capsys, "--config", str(files / "c.json"), "--p-ref",
                          str(files / "r.csv"), "--plot", str(files / plot))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and out == ""
    assert not (files / plot).exists()
