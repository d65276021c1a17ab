"""impala_jax: IMPALA in JAX/Flax/optax behind Ray RLlib's IMPALAConfig."""

from impala_jax.config import IMPALAConfig, NotProvided

__all__ = ["IMPALA", "IMPALAConfig", "NotProvided"]


def __getattr__(name: str):
    # IMPALA is imported on first use, so `import impala_jax` stays light (no jax/flax/envpool).
    if name == "IMPALA":
        from impala_jax.algorithm import IMPALA

        return IMPALA
    raise AttributeError(f"module 'impala_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"IMPALA"})
