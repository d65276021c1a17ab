"""The table of current figures that ``make bench`` writes into benchmarks/README.md.

Rendered from fake results: no benchmark runs here.
"""

from pathlib import Path

import pytest

from benchmarks import run_all

BENCHMARKS_README = Path(__file__).resolve().parents[1] / "benchmarks" / "README.md"
# Current figures first, then what bounds them and the measurements the code cites; the
# history behind them stays in git (the README names the commits), not in this file.
MAX_README_LINES = 400

MACHINE = {"cpu_count": 2, "jax": "0.10.2", "jax_backend": "cpu"}
RESULTS = {
    "vtrace": {
        "date": "2026-01-02 03:04:05",
        "quick": False,
        "machine": MACHINE,
        "min_speedup_vs_rlax": 1.5,
        "sizes": [{"T": 20, "B": 32}, {"T": 20, "B": 256}],
        "goal_met": True,
    },
    "stability": {
        "date": "2026-01-03 00:00:00",
        "quick": True,
        "machine": MACHINE,
        "held": 4,
        "of": 5,
        "seeds": [{"lowest_mean_after": m} for m in (500, 480, 120, 499, 470)],
        "goal_met": False,
    },
    "tune_overhead": {
        "date": "2026-01-04 00:00:00",
        "quick": False,
        "machine": MACHINE,
        "median_wall_s_tune": 20.0,
        "median_wall_s_direct": 10.0,
        "median_overhead_s": 10.0,
        "median_train_s_tune": 7.0,
        "median_train_s_direct": 6.5,
    },
}

README = """# Benchmarks

Intro kept.

<!-- figures:start -->
| old | table |
|---|---|
| stale | row |
<!-- figures:end -->

## Method

Text after the table, kept | with a pipe.
"""


def test_the_table_has_one_row_per_goal_with_its_verdict_and_date():
    lines = run_all.figures_table(RESULTS).splitlines()
    assert lines[:2] == ["| goal | measured | met | date |", "|---|---|---|---|"]
    rows = [line for line in lines[2:] if line.startswith("|")]
    assert len(rows) == len(run_all.summarize(RESULTS)) == 3
    vtrace, stability, tune = rows
    assert "min speedup 1.50x over 20x32, 20x256" in vtrace
    assert vtrace.endswith("| yes | 2026-01-02 |")
    assert "4 of 5 seeds held" in stability
    assert stability.endswith("| no | 2026-01-03 (quick) |")
    assert "20.0 s vs 10.0 s" in tune and tune.endswith("| - | 2026-01-04 |")
    assert lines[-1] == "Machine: 2 CPU cores, jax 0.10.2, cpu backend."


def test_a_pipe_in_a_value_does_not_split_its_cell():
    results = {"vtrace": {**RESULTS["vtrace"], "sizes": [{"T": "20|1", "B": 32}]}}
    row = run_all.figures_table(results).splitlines()[2]
    assert "20\\|1x32" in row
    assert row.count(" | ") == 3


def test_rewriting_replaces_only_what_lies_between_the_markers(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(README)
    run_all.write_figures(RESULTS, path)
    text = path.read_text()
    head, rest = text.split(run_all.FIGURES_START)
    table, tail = rest.split(run_all.FIGURES_END)
    assert head == README.split(run_all.FIGURES_START)[0]
    assert tail == README.split(run_all.FIGURES_END)[1]
    assert table == "\n" + run_all.figures_table(RESULTS) + "\n"
    assert "stale" not in text
    run_all.write_figures(RESULTS, path)
    assert path.read_text() == text


def test_a_readme_without_both_markers_is_an_error():
    with pytest.raises(ValueError, match="figures:start"):
        run_all.replace_figures("# no markers\n", "| table |")
    with pytest.raises(ValueError):
        run_all.replace_figures(f"{run_all.FIGURES_END}\n{run_all.FIGURES_START}\n", "| t |")


def test_the_benchmarks_readme_stays_short_and_keeps_its_markers():
    text = BENCHMARKS_README.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_README_LINES, (
        f"benchmarks/README.md has {lines} lines, over {MAX_README_LINES}: condense the history "
        "(it stays in git) rather than raising the cap"
    )
    assert text.count(run_all.FIGURES_START) == text.count(run_all.FIGURES_END) == 1
