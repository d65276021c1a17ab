"""On device: the engine that rolls out envs written in JAX and updates in one program."""
