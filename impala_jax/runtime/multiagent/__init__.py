"""Multi-agent envs on the host: RLlib's and PettingZoo's dict protocol, and per-agent lanes."""
