"""Atari Breakout (envpool "Breakout-v5") with the IMPALA paper's Atari settings.

The settings and preprocessing are pong.py's (see its docstring, also for the summed loss and
how to size the run for a CPU): the paper used one setting for all 57 games, so this file takes
pong.py's config and changes only the game. Life loss does not end an episode here either:
returns are whole games. For a 2-core CPU: breakout_cpu.py (pong_cpu.py's settings).

Goal: a return of 400 within 10 M env steps (40 M frames; the stop below); not measured here,
and no tuned figure to hold it to.
"""

import runpy
from pathlib import Path

pong = runpy.run_path(str(Path(__file__).with_name("pong.py")))
BUDGET = pong["BUDGET"]

config = pong["config"].copy(copy_frozen=False).environment("Breakout-v5")

stop = {"env_runners/episode_return_mean": 400, "num_env_steps_sampled_lifetime": BUDGET}
