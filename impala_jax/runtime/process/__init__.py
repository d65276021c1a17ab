"""The process: jax.distributed and the agreements between processes, JAX settings, checkpoints,
import paths.
"""
