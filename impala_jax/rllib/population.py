"""``Population``: many runs of one on-device config, trained side by side in one program,
optionally with population-based training (PBT) inside it.

    pbt = PopulationBasedTraining(
        perturbation_interval=250_000,  # env steps per member
        hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-2), "entropy_coeff": [0.003, 0.01]},
    )
    population = Population(config, num_members=8, scheduler=pbt)
    results = population.train()  # one perturbation interval: a result per member

``config`` is an ``IMPALAConfig`` with an env written in JAX. Its hyperparameters that
core/hyperparams.py can trace (lr, entropy_coeff, gamma, ...) may hold Tune search spaces
(``tune.loguniform``, ``tune.choice``, ``tune.grid_search``, ...): each member starts from its
own draw (a grid: member i takes value ``i % len(grid)``). Without ``scheduler`` nothing is
exploited: a random or grid search in one program, where member i makes exactly the updates of
``config`` with its values and ``debugging(seed=seed + i)`` run alone. With a
``PopulationBasedTraining`` (rllib/pbt_spec.py: Ray Tune's names and meaning, or Tune's own
scheduler object), every ``perturbation_interval`` env steps the bottom ``quantile_fraction``
of the members, ranked by the mean return of the episodes that ended in the interval, copy a
top member's params, optimizer state and hyperparameters, then perturb or resample them
(runtime/ondevice/population.py says what is copied and what is not).

Each ``train()`` is one call of one compiled program (one interval of every member);
``lineage`` lists every copy (who copied whom, when, with which hyperparameters before and
after). ``save(path)``/``restore(path)`` keep the whole population without pickle.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from impala_jax.core import hyperparams as traceable
from impala_jax.core import pbt
from impala_jax.rllib import specs
from impala_jax.rllib.pbt_spec import PopulationBasedTraining, as_domain, from_tune
from impala_jax.rllib.values import find_search_space, is_search_space
from impala_jax.runtime.acting.policy import make_policy
from impala_jax.runtime.envs.env_registry import is_jax_env, make_jax_env
from impala_jax.runtime.learning import parallel, program_cache
from impala_jax.runtime.learning.learner import Learner, run_keys
from impala_jax.runtime.ondevice import device_engine
from impala_jax.runtime.ondevice import population as program
from impala_jax.runtime.process.jax_setup import initialize_lapack, use_compile_cache


def _attribute(name: str) -> str:
    """The config attribute of a traceable hyperparameter."""
    return "_lr_vf" if name == "lr_vf" else name


def _pure_functions(config, mesh: bool = True) -> tuple:
    """``(init, updates, env steps per update, description)`` of one member's run
    (device_engine's ``pure_functions``; ``mesh=False``: its learner without a mesh, for
    members spread over devices), built from the specs alone: no learner state, envs or
    program of a run of its own. ``description``: plain data deciding the trace of a program
    made of them (program_cache), None where nothing may be kept on disk."""
    env = make_jax_env(config.env, config.env_config)
    devices, local = parallel.learner_devices(config.num_learners)
    policy = make_policy(
        specs.policy_spec(config), env.observation_space, env.action_space, local[0]
    )
    step = specs.step_spec(config, len(devices))
    spaces = (env.observation_space, env.action_space)
    learner = Learner(
        policy.networks,
        policy.distribution,
        specs.optimizer_spec(config),
        specs.loss_spec(config),
        step,
        devices,
        run_keys(0)[0],  # for the state's shapes only: each member starts from its own key
        # What decides the networks: given, the interval's traced program is kept on disk.
        program_key=None
        if policy.custom
        else program_cache.model_description(config.model_config, *spaces),
        initial_state=False,
    )
    spec = specs.device_spec(config)
    _, _, per_update = device_engine.rollout_plan(spec, learner)
    init, updates = device_engine.pure_functions(spec, env, policy, learner, mesh=mesh)
    rollout = device_engine.rollout_description(spec, env)
    cached = learner.program_description is not None and rollout is not None
    description = [*learner.program_description, rollout] if cached else None
    return init, updates, per_update, description


def _static_value(name: str, values: np.ndarray, mutations: dict) -> Any:
    """The value the config is built with for a traced hyperparameter: member 0's, but for
    ``vtrace`` (a bool in the config) and ``policy_lag``, which sizes the ring of acting params:
    the largest lag a member starts with or a mutation can reach (a list's largest value; a
    Domain's high; traced lags beyond the ring are clamped to it)."""
    if name == "vtrace":
        return True
    if name != "policy_lag":
        return float(values[0])
    largest = float(np.max(values))
    mutation = mutations.get(name)
    if isinstance(mutation, list | tuple):
        largest = max(largest, *(float(v) for v in mutation))
    elif mutation is not None:
        high = getattr(as_domain(mutation, name), "high", None)
        largest = max(largest, float(high or 0))
    return max(1, int(math.ceil(largest)))


def _grid(space: Any) -> bool:
    return isinstance(space, dict) and "grid_search" in space


def _is_search_space(value: Any) -> bool:
    """A Tune search space or a core.pbt.Domain (rllib/values.py's rule)."""
    return is_search_space(value)


class Population:
    """``num_members`` runs of ``config`` side by side; see the module docstring."""

    def __init__(self, config, num_members: int, scheduler=None):
        if not isinstance(num_members, int) or num_members < 1:
            raise ValueError(f"Population(num_members={num_members!r}): expected an int >= 1.")
        if not is_jax_env(config.env, config.env_config):
            raise ValueError(
                f"Population: environment(env={config.env!r}) steps on the host; a population "
                "in one program needs an env written in JAX ('gymnax:<id>' or a gymnax "
                "Environment). Sweep host envs with Ray Tune (rllib/ray_tune.py)."
            )
        if jax.process_count() > 1:
            raise ValueError(
                f"Population(num_members={num_members}) trains its members in one process's "
                "program; over several processes (--num-processes) run one IMPALA per member."
            )
        use_compile_cache()  # as IMPALA: the compiled programs kept for the next process
        initialize_lapack()
        if scheduler is not None and not isinstance(scheduler, PopulationBasedTraining):
            scheduler = from_tune(scheduler)
        self.scheduler, self.num_members = scheduler, num_members
        base = config.seed if config.seed is not None else 0
        self.seeds = [base + i for i in range(num_members)]
        spaces = {
            name: getattr(config, _attribute(name))
            for name in traceable.TRACEABLE
            if _is_search_space(getattr(config, _attribute(name), None))
        }
        mutations = dict(scheduler.hyperparam_mutations) if scheduler else {}
        for name in mutations:
            if name not in traceable.TRACEABLE:
                raise ValueError(
                    f"PopulationBasedTraining(hyperparam_mutations={{{name!r}: ...}}): {name!r} "
                    f"is not a hyperparameter the program traces; those are "
                    f"{', '.join(traceable.TRACEABLE)}."
                )
        self.names = sorted(set(spaces) | set(mutations))
        for name in self.names:
            value = getattr(config, _attribute(name))
            if isinstance(value, list | tuple) and name not in spaces:
                raise ValueError(
                    f"Population: {name}={value!r} is a schedule; a population traces one "
                    f"number per member: set training({name}=<number or search space>)."
                )
        initial = self._initial_values(config, spaces)
        built = config.copy(copy_frozen=False)
        for name in self.names:  # the program reads every member's traced values
            setattr(built, _attribute(name), _static_value(name, initial[name], mutations))
        spaces_left = [k for k, v in built.to_dict().items() if find_search_space(v)]
        if spaces_left:
            raise ValueError(
                f"Population: {', '.join(spaces_left)} hold(s) a Tune search space, but only "
                f"{', '.join(traceable.TRACEABLE)} are traced in one program; sweep the others "
                "with Ray Tune (tune.Tuner('IMPALA', param_space=config))."
            )
        built.validate()
        self.config = built.freeze()
        self._learner_devices, _ = parallel.learner_devices(built.num_learners)
        # The devices the members are spread over (runtime/ondevice/population.py); None: one.
        self.mesh = program.member_mesh(num_members, len(self._learner_devices))
        init, updates, self.env_steps_per_update, description = _pure_functions(
            built, mesh=self.mesh is None
        )
        self._init, self._updates = init, updates
        self.plan = self._plan(scheduler, mutations)
        self._interval = self._interval_program(updates, description)
        self._base_seed = base
        self._initial = {k: jnp.asarray(v, jnp.float32) for k, v in initial.items()}
        keys, hparams, key = self.initial_inputs()  # the key: exploit/explore's
        score = jnp.full(num_members, jnp.nan, jnp.float32)
        self._carry, self._hparams, self._score, self._key = program.placed(
            (jax.jit(jax.vmap(init))(keys), hparams, score, key), self.mesh, self._learner_devices
        )
        self.iteration = 0
        self.lineage: list[dict] = []

    def _interval_program(self, updates, description):
        """One interval of every member, compiled; where ``description`` allows, its traced
        program is kept on disk (program_cache), as the learner step's is, so a later process
        skips tracing it."""
        interval = jax.jit(
            program.interval_function(updates, self.plan, self.mesh), donate_argnums=(0,)
        )
        if description is None:
            return interval
        names = {k: 0 for k in self.names}
        lineage = program.Lineage(0, 0, 0, {k: 0 for k, _ in self.plan.mutations}, names)
        return program_cache.CachedProgram(
            interval,
            "population_interval",
            # The arguments' shardings (spread over devices or not) are in the file's key too.
            [*description, self.plan, self.num_members, self.names],
            # The carry, hparams, scores and key like their arguments; the metrics; the lineage.
            outputs_like=(0, 1, 2, 3, None, jax.tree.structure(lineage)),
            donate_argnums=(0,),
        )

    def _initial_values(self, config, spaces: dict) -> dict[str, np.ndarray]:
        """Each traced hyperparameter's value per member: a draw from its search space, or the
        config's number for every member. Grids (``tune.grid_search``) combine as Tune's do,
        every combination once (the last name varying fastest), member i taking combination
        ``i % combinations``."""
        key = jax.random.key(0 if config.seed is None else config.seed)
        values = {}
        grids = {n: [float(v) for v in s["grid_search"]] for n, s in spaces.items() if _grid(s)}
        combinations = list(itertools.product(*grids.values()))
        if self.num_members % len(combinations):
            raise ValueError(
                f"Population(num_members={self.num_members}): the grids of "
                f"{', '.join(grids)} make {len(combinations)} combinations; num_members must be "
                f"a multiple of it (each combination that many times, as Tune's num_samples)."
            )
        for j, name in enumerate(grids):
            column = [c[j] for c in combinations]
            values[name] = np.array([column[m % len(column)] for m in range(self.num_members)])
        for i, name in enumerate(self.names):
            space = spaces.get(name)
            if name in grids:
                continue
            if space is None:
                value = getattr(config, _attribute(name))  # policy_lag None: 0
                values[name] = np.full(self.num_members, float(value or 0))
            else:
                domain = as_domain(space, name)
                if isinstance(domain, tuple):  # a list is a choice among its values
                    domain = pbt.Domain(kind="choice", categories=domain)
                draw = pbt.sample(jax.random.fold_in(key, i), domain, (self.num_members,))
                values[name] = np.asarray(draw, np.float64)
        return {k: v.astype(np.float32) for k, v in values.items()}

    def _plan(self, scheduler, mutations: dict) -> program.PopulationPlan:
        per_update = self.env_steps_per_update
        if scheduler is None:
            return program.PopulationPlan(updates_per_interval=1, mutations=(), exploit=False)
        updates = max(1, math.ceil(scheduler.perturbation_interval / per_update))
        burn_in = math.ceil(scheduler.burn_in_period / (updates * per_update))
        return program.PopulationPlan(
            updates_per_interval=updates,
            mutations=tuple((k, as_domain(v, k)) for k, v in sorted(mutations.items())),
            quantile_fraction=scheduler.quantile_fraction,
            resample_probability=scheduler.resample_probability,
            perturbation_factors=tuple(scheduler.perturbation_factors),
            burn_in_intervals=burn_in,
            sign=1.0 if scheduler.mode == "max" else -1.0,
        )

    def _counters_of(self, first: int, n: int) -> np.ndarray:
        return device_engine.counters(self.env_steps_per_update, first, n)

    @property
    def env_steps_per_iteration(self) -> int:
        """Env steps each member samples in one ``train()``."""
        return self.plan.updates_per_interval * self.env_steps_per_update

    def train(self) -> list[dict]:
        """One interval of every member (then exploit/explore): a result per member."""
        U = self.plan.updates_per_interval
        counters = jnp.asarray(self._counters_of(self.iteration * U, U))
        before = jax.device_get(self._hparams)
        exploit_now = jnp.asarray(self.iteration >= self.plan.burn_in_intervals)
        out = self._interval(
            self._carry, self._hparams, self._score, self._key, counters, exploit_now
        )
        self._carry, self._hparams, self._score, self._key, metrics, lineage = out
        self.iteration += 1
        metrics, lineage = jax.device_get((metrics, lineage))
        return [self._result(i, metrics, lineage, before) for i in range(self.num_members)]

    def _result(self, i: int, metrics: dict, lineage, before: dict) -> dict:
        steps = self.iteration * self.env_steps_per_iteration
        ended = int(metrics["num_episodes"][i].sum())
        mean = float(metrics["episode_return_sum"][i].sum()) / ended if ended else math.nan
        learner = {
            k: float(np.mean(v[i]))
            for k, v in metrics.items()
            if k not in ("num_episodes", "episode_return_sum")
        }
        config = {k: float(v[i]) for k, v in before.items()}
        result = {
            "member": i,
            "seed": self.seeds[i],
            "training_iteration": self.iteration,
            "num_env_steps_sampled_lifetime": steps,
            "env_runners": {"episode_return_mean": mean, "num_episodes": ended},
            "learners": {"default_policy": learner},
            "config": config,
        }
        if bool(lineage.copied[i]):
            event = {
                "training_iteration": self.iteration,
                "num_env_steps_sampled_lifetime": steps,
                "member": i,
                "copied_from": int(lineage.source[i]),
                "score": float(lineage.score[i]),
                "hparams_before": {k: float(v[int(lineage.source[i])]) for k, v in before.items()},
                "hparams_after": {k: float(v[i]) for k, v in lineage.hparams.items()},
                "operations": {
                    k: pbt.operation_name(int(v[i]), self.plan.perturbation_factors)
                    for k, v in lineage.operations.items()
                },
            }
            self.lineage.append(event)
            result["pbt"] = event
        return result

    def train_function(self, num_iterations: int):
        """The population's first ``num_iterations`` intervals as one pure function of nothing
        but its inputs, ``train(keys, hparams, key) -> (carry, hparams, metrics, lineage)``
        (runtime/ondevice/population.py), and those inputs for this population: ``train(
        *population.initial_inputs())`` makes the updates ``num_iterations`` calls of
        ``train()`` make from the start."""
        U = self.plan.updates_per_interval
        counters = self._counters_of(0, num_iterations * U).reshape(num_iterations, U, 2)
        counters = jnp.asarray(counters)
        return program.train_function(self._init, self._updates, counters, self.plan, self.mesh)

    def initial_inputs(self) -> tuple:
        """``(member keys, initial hyperparameters, exploit/explore key)`` of this population."""
        keys = jnp.stack([jax.random.key(s) for s in self.seeds])
        return keys, dict(self._initial), jax.random.key(self._base_seed + 7919)

    def hparams(self) -> list[dict[str, float]]:
        """Each member's hyperparameters for its next interval."""
        values = jax.device_get(self._hparams)
        return [{k: float(v[i]) for k, v in values.items()} for i in range(self.num_members)]

    def get_weights(self, member: int) -> dict:
        """``{"default_policy": params}`` of one member, as host arrays."""
        params = jax.device_get(self._carry.state.params)
        return {"default_policy": jax.tree.map(lambda x: x[member], params)}

    def save(self, path: str | Path) -> Path:
        """The whole population (every member's state, replay, envs and ring, their
        hyperparameters and scores, the lineage) as ``population.npz`` (no pickle) and
        ``population.json``; ``restore`` reads it into a population of the same config."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        arrays = _key_data((self._carry, self._hparams, self._score, self._key))
        leaves = jax.device_get(jax.tree.leaves(arrays))
        np.savez(path / "population.npz", *[np.asarray(x) for x in leaves])
        meta = {"iteration": self.iteration, "seeds": self.seeds, "names": self.names}
        meta["lineage"] = self.lineage
        (path / "population.json").write_text(json.dumps(meta, indent=1))
        return path

    def restore(self, path: str | Path) -> None:
        path = Path(path)
        meta = json.loads((path / "population.json").read_text())
        if meta["seeds"] != self.seeds or meta["names"] != self.names:
            raise ValueError(
                f"Population.restore({str(path)!r}): saved for seeds {meta['seeds']} and "
                f"hyperparameters {meta['names']}, not {self.seeds} and {self.names}; restore "
                "it into a Population made from the same config and num_members."
            )
        template = _key_data((self._carry, self._hparams, self._score, self._key))
        with np.load(path / "population.npz", allow_pickle=False) as saved:
            leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        shapes = [np.shape(x) for x in jax.tree.leaves(template)]
        if shapes != [x.shape for x in leaves]:
            raise ValueError(
                f"Population.restore({str(path)!r}): the saved arrays do not match this "
                "population's network, batch or envs; restore it with the config it was saved "
                "with."
            )
        restored = jax.tree.unflatten(jax.tree.structure(template), leaves)
        carry, hparams, score, key = _wrap_keys(restored, self._carry, self._key)
        hparams = {k: jnp.asarray(v) for k, v in hparams.items()}
        self._carry, self._hparams, self._score, self._key = program.placed(
            (carry, hparams, jnp.asarray(score), key), self.mesh, self._learner_devices
        )
        self.iteration, self.lineage = meta["iteration"], meta["lineage"]

    def stop(self) -> None:
        """Releases the population's device arrays; idempotent."""
        self._carry = None


def _key_data(tree):
    """``tree`` with every PRNG key as its raw key data (what a file can hold)."""
    is_key = lambda x: isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)  # noqa: E731
    return jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)


def _wrap_keys(restored, carry_like, key_like):
    """The inverse of ``_key_data`` for ``(carry, hparams, score, key)``."""
    carry, hparams, score, key = restored

    def wrap(x, like):
        if isinstance(like, jax.Array) and jnp.issubdtype(like.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(jnp.asarray(x))
        return jnp.asarray(x)

    carry = jax.tree.map(wrap, carry, carry_like)
    return carry, hparams, score, wrap(key, key_like)
