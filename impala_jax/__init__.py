"""impala_jax: IMPALA in JAX/Flax/optax behind Ray RLlib's IMPALAConfig."""

from impala_jax.rllib import tune_hook
from impala_jax.rllib.config import IMPALAConfig, NotProvided
from impala_jax.rllib.module_spec import RLModuleSpec

__all__ = [
    "IMPALA",
    "IMPALAConfig",
    "NotProvided",
    "Population",
    "PopulationBasedTraining",
    "RLModuleSpec",
    "RLlibCallback",
    "SeedGroup",
    "make_train",
    "register_env",
]


# Ray Tune's "IMPALA" is impala_jax's once ray.tune is imported, before or after this line;
# ray itself is not imported here (tune_hook.py).
tune_hook.install()


def __getattr__(name: str):
    # IMPALA is imported on first use, so `import impala_jax` stays light (no jax/flax/envpool).
    if name == "IMPALA":
        from impala_jax.rllib.algorithm import IMPALA

        return IMPALA
    if name == "SeedGroup":  # several seeds of an on-device run in one program
        from impala_jax.rllib.seed_group import SeedGroup

        return SeedGroup
    if name == "Population":  # members of an on-device run in one program, PBT inside
        from impala_jax.rllib.population import Population

        return Population
    if name == "PopulationBasedTraining":  # Ray Tune's scheduler's fields, without ray
        from impala_jax.rllib.pbt_spec import PopulationBasedTraining

        return PopulationBasedTraining
    if name == "register_env":  # RLlib's ray.tune.register_env, without ray
        from impala_jax.rllib.registry import register_env

        return register_env
    if name == "make_train":  # PureJaxRL's make_train: a run on device as one function
        from impala_jax.rllib.make_train import make_train

        return make_train
    if name == "RLlibCallback":  # RLlib's callbacks base class
        from impala_jax.rllib.callbacks import RLlibCallback

        return RLlibCallback
    raise AttributeError(f"module 'impala_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(
        set(globals())
        | {"IMPALA", "Population", "PopulationBasedTraining", "RLlibCallback", "SeedGroup"}
        | {"make_train", "register_env"}
    )
