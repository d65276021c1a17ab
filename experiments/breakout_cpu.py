"""Atari Breakout (envpool "Breakout-v5") sized for a 2-core CPU: pong_cpu.py's settings (42 x 42
frames, the IMPALA ResNet [8, 16, 16], Adam 4e-4 on the mean loss, 32 envs, 640-row batches
in 160-row minibatches, 2 epochs, entropy 0.005; see its docstring for why each) with only the
game changed, as breakout.py takes pong.py's. Rewards are clipped to [-1, 1] for training
(`clip_rewards=True`, from pong.py); the reported returns are the game's score.

No tuned CPU figure to hold it to; a random policy scores about 1.5. Seed 0 on 2 cores (run
b42, 2026-12-03, ~360 env steps/s): return (100 episodes) 1.7 at 100 K env steps, 3.0 at 600 K,
4.3 at 1 M, 6.5 at 1.5 M, 10-11 at 1.6-1.7 M (best episode 26), then a dip to 1.5 at 1.8 M that
recovered within 80 K env steps, 7.2 at 2 M; entropy 1.30 -> 0.8-0.9 (ln 4 = 1.39).
benchmarks/README.md has the table.

Goal: a return of 8 within 2 M env steps (8 M frames; the stop below), about five times random
play's; measured: 10.75 at 1.70 M env steps (run b42, the one seed run; it passed 8 between 1.5
and 1.6 M).
"""

import runpy
from pathlib import Path

pong_cpu = runpy.run_path(str(Path(__file__).with_name("pong_cpu.py")))

config = pong_cpu["config"].copy(copy_frozen=False).environment("Breakout-v5")

stop = {"env_runners/episode_return_mean": 8, "num_env_steps_sampled_lifetime": 2_000_000}
