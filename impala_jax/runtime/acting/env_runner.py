"""The actor side: a policy stepping vectorised envs into Trajectory fragments.

An EnvRunner owns ``num_envs_per_env_runner`` envs. When that is an even number of at least 8
and the machine has cores to spare, they are split into two envpool instances that are stepped
in turn: while one group's envs step in envpool's C++ threads, this thread runs inference for
the other (the double-buffering of Sebulba, Hessel et al. 2021). Each group yields its own
fragment of ``[T+1, B/2]``.

An ``EnvGroup`` is one such VecEnv with its episode bookkeeping; evaluation steps its envs
through the same class. Per env step the Python work is: recv, one ``act`` call, send, and
array writes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from impala_jax.core.policy import initial_carry, next_carry
from impala_jax.core.recurrent import num_chunks
from impala_jax.core.types import Trajectory, empty_trajectory
from impala_jax.runtime.acting.episode_hooks import (
    EpisodeCallbacks,
    EpisodeHooksFactory,
    MetricsSink,
)
from impala_jax.runtime.acting.host_actor import HostActor, no_gil_yield
from impala_jax.runtime.acting.user_code import UserCodeError
from impala_jax.runtime.envs.vec_env import (
    ActionAdapter,
    EnvpoolVecEnv,
    EnvSpec,
    VecEnv,
    make_runner_envs,
)
from impala_jax.runtime.learning.buffers import MAX_DROPPED_IN_A_ROW, FragmentDoor
from impala_jax.runtime.metrics import Timers


def actor_key(seed: int, params, act=None):
    """The first key an actor passes to ``act``: for a ``HostActor`` its Generator, else a PRNG
    key placed where ``params`` are. ``act`` returns its next key committed there, so a first
    key placed anywhere else (a fresh key is uncommitted) would compile ``act`` a second time
    on the second call."""
    if isinstance(act, HostActor):
        return act.key(seed)
    return jax.device_put(jax.random.key(seed), jax.tree.leaves(params)[0].sharding)


# How many versions a NumPy actor's params may trail the newest published while those are
# computed (EnvRunner._params): the learner dispatches steps ahead of their computation, and
# without a bound the runner kept acting with params 31 versions old.
MAX_ACTING_LAG = 2


@jax.jit
def _copy_leaves(leaves: list) -> list:
    """Fresh buffers holding ``leaves`` (on their devices): one dispatch for a whole tree."""
    return [jnp.copy(x) for x in leaves]


class ParamStore:
    """The newest params on the actor device, with a version that counts publications."""

    def __init__(self, params, device):
        self._device = device
        self._lock = threading.Lock()
        self.version = 0
        self._params = self._to_actor(params)
        self._previous: tuple[Any, int] = (None, -1)  # the publication before (get_computed)

    def _to_actor(self, params):
        # A copy, never an alias: the learner donates its buffers on the next step. One
        # compiled copy of every leaf, since a jnp.copy per leaf holds the main thread (and
        # the GIL) for a dispatch per leaf.
        leaves, treedef = jax.tree.flatten(params)
        return jax.tree.unflatten(treedef, _copy_leaves([self._on_device(x) for x in leaves]))

    def _on_device(self, x):
        # The params are replicated over the learner devices (over several processes: global
        # arrays); start from the copy on the actor's device when there is one (its buffer,
        # not a copy: _copy_leaves copies).
        if not isinstance(x, jax.Array):
            return jax.device_put(x, self._device)
        for shard in x.addressable_shards:
            if shard.device == self._device:
                return shard.data
        return jax.device_put(x.addressable_data(0), self._device, may_alias=False)

    def publish(self, params) -> None:
        params = self._to_actor(params)
        with self._lock:
            self._previous = (self._params, self.version)
            self._params = params
            self.version += 1

    def get(self) -> tuple[Any, int]:
        with self._lock:
            return self._params, self.version

    def get_computed(self) -> tuple[Any, int] | None:
        """The newest of the last two publications whose arrays are computed (the learner
        publishes a step's params as it dispatches it, so the newest often are not yet; the
        one before usually are), or None."""
        with self._lock:
            candidates = [(self._params, self.version), self._previous]
        for params, version in candidates:
            if params is not None and all(x.is_ready() for x in jax.tree.leaves(params)):
                return params, version
        return None


class EnvOutputError(ValueError):
    """An env returned something impala_jax cannot train on; restarting will not help."""


def check_env_output(env: VecEnv, obs: np.ndarray, reward, runner: int) -> None:
    """Raises EnvOutputError unless the observations have the space's shape (non-finite values
    meet the fragment door, buffers.FragmentDoor). ``reward`` is None for the reset
    observations."""
    space = env.observation_space
    if obs.shape[1:] != space.shape:
        raise EnvOutputError(
            f"env {env.name!r} (EnvRunner {runner}) returned observations of shape "
            f"{obs.shape[1:]}, but its observation space {space} says {space.shape}; fix "
            "the env or its observation_space."
        )


class EnvGroup:
    """One VecEnv stepped as a unit, and what is carried between its steps: the last
    observations, the episodes running in its envs and, for a recurrent policy, its carry.

    Training's EnvRunner and evaluation's Evaluator both step their envs through it: ``act``,
    ``send``, then ``receive`` what ``env.recv()`` returned (``step`` does the last two).
    ``act`` / ``act_greedy`` are the policy (a ``RecurrentActor`` carries a state per env);
    ``check(env, obs, reward)`` raises on env output that cannot be trained on (None: none).
    """

    def __init__(
        self,
        env: VecEnv,
        adapter: ActionAdapter,
        act: Callable,
        act_greedy: Callable,
        check: Callable | None = None,
    ):
        self.env = env
        self.adapter = adapter
        self._act, self._act_greedy = act, act_greedy
        self._recurrent = act if hasattr(act, "initial_state") else None
        self._check = check
        n = env.num_envs
        self.obs = None
        self.prev_done = np.zeros(n, bool)  # obs is a final observation: next row is a reset row
        self.episode_return = np.zeros(n, np.float64)
        self.episode_len = np.zeros(n, np.int64)
        # A recurrent policy's (core state, prev action, prev reward, reset) per env.
        self.carry = None

    def reset(self) -> None:
        """Resets every env (once, before the first step); a recurrent policy's carry starts."""
        self.env.async_reset()
        self.obs = self.env.recv()[0]
        if self._check is not None:
            self._check(self.env, self.obs, None)
        if self._recurrent is not None:
            self.carry = initial_carry(self._recurrent, self.env.num_envs, self.env.action_space)

    def act(self, params, key, explore: bool):
        """(action as a NumPy array, dist_inputs, next key) for the current observations."""
        rec = self._recurrent
        if rec is not None:
            if explore:
                action, dist_inputs, key, state = rec(params, self.obs, key, self.carry)
            else:
                action, dist_inputs, state = rec.greedy(params, self.obs, self.carry)
            action = np.asarray(action)
            # The reward comes with receive; obs being a final observation (prev_done) makes
            # the next row a reset row (next-step autoreset).
            self.carry = next_carry(state, action, None, self.prev_done.copy())
            return action, dist_inputs, key
        if explore:
            action, dist_inputs, key = self._act(params, self.obs, key)
        else:
            action, dist_inputs = self._act_greedy(params, self.obs)
        return np.asarray(action), dist_inputs, key

    def send(self, action: np.ndarray) -> None:
        """Steps every env with ``action``, adapted to the env's action space and checked."""
        self.env.send(self.adapter(action, self.env.num_envs))

    def receive(
        self,
        obs,
        reward,
        terminated,
        truncated,
        callbacks: EpisodeCallbacks | None = None,
        log: EpisodeLog | None = None,
        limit: int | None = None,
    ) -> np.ndarray:
        """Books what ``env.recv()`` returned after a send; returns which envs took a step of
        an episode (a reset row takes none: next-step autoreset, see types.py).

        The first ``limit`` (None: all) episodes that ended, in env order, go to ``log``, and
        with ``callbacks`` they end there (on_episode_end); reset rows start episodes.
        """
        if self._check is not None:
            self._check(self.env, obs, reward)
        # A reset row (prev_done) is not a step of any episode: its reward is 0 by construction;
        # its observation is the first of a new episode.
        started = self.prev_done
        real = ~started
        self.episode_return += reward * real
        self.episode_len += real
        done = terminated | truncated
        self.prev_done = done
        if callbacks is not None:  # records the finished episodes together with their metrics
            callbacks.step(self, started, done, terminated, log, limit)
        if done.any():
            if callbacks is None and log is not None:
                log.add(self.episode_return[done][:limit], self.episode_len[done][:limit])
            self.episode_return[done] = 0.0
            self.episode_len[done] = 0
        self.obs = obs
        if self.carry is not None:
            state, action, _, reset = self.carry
            self.carry = next_carry(state, action, np.asarray(reward, np.float32), reset)
        return real

    def step(self, action: np.ndarray, callbacks=None, log=None, limit=None) -> np.ndarray:
        """``send`` then ``receive``: one env step of this group alone."""
        self.send(action)
        return self.receive(*self.env.recv(), callbacks, log, limit)


class EpisodeLog:
    """Finished episodes (raw-reward return, length), appended by runners, drained by train()."""

    def __init__(self):
        self._lock = threading.Lock()
        self._episodes: deque = deque()

    def add(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        with self._lock:
            self._episodes.extend(zip(returns.tolist(), lengths.tolist(), strict=True))

    def drain(self) -> list[tuple[float, int]]:
        with self._lock:
            out = list(self._episodes)
            self._episodes.clear()
        return out


@dataclasses.dataclass(frozen=True)
class RunnerSpec:
    """What an EnvRunner and its group take from the config (rllib/specs.py builds it)."""

    env: EnvSpec
    rollout_fragment_length: int  # T, resolved (get_rollout_fragment_length())
    num_env_runners: int  # runner threads; 0: one runner, in lockstep in the caller's thread
    explore: bool
    disable_env_checking: bool
    callbacks: EpisodeHooksFactory  # rllib's CallbacksSpec


class EnvRunner:
    """Steps its envs with the newest params and produces Trajectory fragments."""

    def __init__(
        self,
        spec: RunnerSpec,
        index: int,
        act: Callable,
        act_greedy: Callable,
        param_store: ParamStore,
        seed: int,
        num_envs: int | None = None,
        metrics_logger: MetricsSink | None = None,
    ):
        self.index = index
        self.spec = spec
        self.T = spec.rollout_fragment_length
        self.explore = spec.explore
        self._act, self._act_greedy = act, act_greedy
        self.param_store = param_store
        self.timers = Timers()
        self.episodes = EpisodeLog()
        # RLlib's EnvRunner.config / .metrics, which episode callbacks read and log to.
        self.config = spec.callbacks.env_runner_config
        self.metrics = (
            metrics_logger if metrics_logger is not None else spec.callbacks.new_metrics()
        )
        # on_episode_start/_end; None without them, so stepping pays one `is None` per step.
        self.episode_callbacks = EpisodeCallbacks.make(spec.callbacks, self, self.metrics)
        self.env_steps = 0
        self._seed = seed
        self._check = not spec.disable_env_checking
        self.num_env_restarts = 0
        self.num_dropped_episodes = 0
        self.heartbeat = time.monotonic()
        num_envs = num_envs or spec.env.num_envs_per_env_runner
        self._sizes = self.group_sizes(num_envs)
        # Fragments with a non-finite value stop here, counted per env (disable_env_checking:
        # they pass, and the learner's gradient guard is the last line).
        self.door = FragmentDoor(len(self._sizes))
        self.groups: list[EnvGroup] = []
        self._key = actor_key(seed, param_store.get()[0], act)
        # A NumPy actor reads the params on the host, so it would wait for the learner step
        # still computing newly published ones; in a runner thread (not lockstep, which must
        # repeat exactly) it acts with computed ones at most MAX_ACTING_LAG behind (_params).
        self._acting: tuple[Any, int] | None = None
        self._waits_for_params = isinstance(act, HostActor) and spec.num_env_runners > 0
        # A RecurrentActor (core/policy.py) when the policy is recurrent: rows carry its state.
        self._recurrent = act if hasattr(act, "initial_state") else None
        self._make_envs(seed)
        self.observation_space = self.groups[0].env.observation_space
        self.action_space = self.groups[0].env.action_space

    # Two alternating groups overlap this thread's inference with envpool's stepping, which
    # pays only with a core to spare (benchmarks/README.md, "The runner thread and the GIL").
    # Class attribute, so tests can force either layout.
    split_min_cpus = 4

    @classmethod
    def group_sizes(cls, num_envs: int) -> list[int]:
        """Two groups stepped in turn when the envs split evenly and there are spare cores."""
        cpus = os.cpu_count() or 1
        if num_envs >= 8 and num_envs % 2 == 0 and cpus >= cls.split_min_cpus:
            return [num_envs // 2] * 2
        return [num_envs]

    def _make_envs(self, seed: int) -> None:
        spec = self.spec
        self.steps_since_rebuild = 0  # env steps (send/recv rounds) since the envs were built
        offset = 0
        for size in self._sizes:
            # envpool seeds env i with seed + i: space the seeds so no two envs share one.
            env, adapter = make_runner_envs(
                spec.env,
                size,
                seed + offset,
                # A creator's EnvContext, numbered as RLlib does: 0 is the main thread.
                worker_index=self.index + 1 if spec.num_env_runners and self.index >= 0 else 0,
                first_vector_index=offset,
            )
            check = functools.partial(check_env_output, runner=self.index)
            self.groups.append(EnvGroup(env, adapter, self._act, self._act_greedy, check))
            offset += size
        # envpool releases the GIL while it steps: a NumPy actor need not yield it as well.
        self._envs_release_gil = all(isinstance(g.env, EnvpoolVecEnv) for g in self.groups)
        for g in self.groups:
            g.reset()

    def restart_envs(self) -> None:
        """Closes and rebuilds every env after a failure; unfinished episodes are dropped."""
        for g in self.groups:
            self.num_dropped_episodes += int(np.count_nonzero(g.episode_len))
            try:
                g.env.close()
            except Exception:  # the env is already broken; its replacement matters
                pass
        self.groups = []
        self.num_env_restarts += 1
        # Fresh seeds, so a restarted env does not replay the episode that broke it.
        self._make_envs(self._seed + 7919 * self.num_env_restarts * sum(self._sizes))

    def sample(self) -> list[Trajectory]:
        """One fragment of T steps from every env group."""
        if self._envs_release_gil:
            with no_gil_yield():
                return self._sample()
        return self._sample()

    def _params(self) -> tuple[Any, int]:
        """(params, version) to act with for a fragment: the newest published, or for a NumPy
        actor in a runner thread the newest computed ones of the last two publications, else
        those it acted with last, but never more than MAX_ACTING_LAG versions behind the
        newest (then it waits for them). A fragment's version is what acted: policy lag
        counts it."""
        newest = self.param_store.get()
        if not self._waits_for_params or (self._acting and self._acting[1] == newest[1]):
            return newest  # nothing newer published: no arrays to check
        acting = self.param_store.get_computed() or self._acting
        if acting is None or newest[1] - acting[1] > MAX_ACTING_LAG:
            acting = newest
        self._acting = acting
        return acting

    def _sample(self) -> list[Trajectory]:
        T = self.T
        params, version = self._params()
        if self.episode_callbacks is not None:
            self.episode_callbacks.begin(self.groups)  # new envs start their episodes
        # Each group's fragment is allocated at its first action, whose shape and dtype it takes.
        bufs: list[Trajectory | None] = [None] * len(self.groups)
        timers = self.timers
        rec = self._recurrent
        for t in range(T):
            for i, g in enumerate(self.groups):
                with timers.time("inference"):
                    carry = g.carry  # what row t is acted from (a recurrent policy's)
                    action, dist_inputs, self._key = g.act(params, self._key, self.explore)
                    dist_inputs = np.asarray(dist_inputs)
                    if bufs[i] is None:
                        bufs[i] = self._fragment(g, action, dist_inputs)
                    if rec is not None:
                        self._record_carry(bufs[i], carry, t)
                buf = bufs[i]
                buf.obs[t] = g.obs
                buf.valid[t] = ~g.prev_done
                buf.action[t] = action
                buf.behaviour_logits[t] = dist_inputs
                with timers.time("env_send"):
                    g.send(action)
            for g, buf in zip(self.groups, bufs, strict=True):
                with timers.time("env_recv"):
                    obs, reward, terminated, truncated = g.env.recv()
                self.steps_since_rebuild += 1
                g.receive(obs, reward, terminated, truncated, self.episode_callbacks, self.episodes)
                buf.reward[t] = reward
                buf.terminated[t] = terminated
                buf.truncated[t] = truncated
        out = []
        offset = 0
        for i, (g, traj) in enumerate(zip(self.groups, bufs, strict=True)):
            traj.obs[T] = g.obs
            if rec is not None:
                self._record_carry(traj, g.carry, T)
            traj.param_version[:] = version
            n = g.env.num_envs
            self.env_steps += T * n
            if self._admit(traj, i, offset):
                out.append(traj)
            offset += n
        self.heartbeat = time.monotonic()
        return out

    def _fragment(self, g: EnvGroup, action: np.ndarray, dist_inputs: np.ndarray) -> Trajectory:
        """Group ``g``'s empty fragment, shaped like its first row (core.types)."""
        recurrent = {}
        if self._recurrent is not None:
            chunks = num_chunks(self.T, self._recurrent.max_seq_len)
            recurrent = dict(core_state=g.carry[0], chunks=chunks)
        return empty_trajectory(self.T, g.obs, action, dist_inputs, alloc=np.empty, **recurrent)

    def _admit(self, traj: Trajectory, group: int, offset: int) -> bool:
        """Whether the fragment passes the door; EnvOutputError once one env group's were
        dropped MAX_DROPPED_IN_A_ROW times in a row (a broken env, not an unlucky step)."""
        if not self._check or self.door.admit(traj, group, offset):
            return True
        what = self.door.hopeless(group)
        if what is None:
            return False
        raise EnvOutputError(
            f"env {self.groups[group].env.name!r} (EnvRunner {self.index}) returned a "
            f"non-finite {what} in {MAX_DROPPED_IN_A_ROW} fragments in a row (each dropped); fix "
            "the env, or allow it with environment(disable_env_checking=True)."
        )

    def _record_carry(self, buf: Trajectory, carry: tuple, t: int) -> None:
        """Row t's prev action, prev reward and reset flag from ``carry``, and its state when a
        chunk starts."""
        state, prev_action, prev_reward, reset = carry
        L = self._recurrent.max_seq_len
        if t % L == 0:
            for stored, leaf in zip(
                jax.tree.leaves(buf.core_state), jax.tree.leaves(state), strict=True
            ):
                stored[t // L] = np.asarray(leaf)
        buf.prev_action[t] = prev_action
        buf.prev_reward[t] = prev_reward
        buf.reset[t] = reset

    def close(self) -> None:
        groups, self.groups = self.groups, []
        for g in groups:
            g.env.close()


# A failure seen this many times in a row, identical each time (same error, same place, same env
# step since the envs were rebuilt), is a bug in the env, not bad luck: retrying cannot help.
IDENTICAL_FAILURES_TO_STOP = 3


def failure_signature(err: BaseException, runner: EnvRunner) -> tuple:
    """What makes two failures "the same": type, message, the raising line, and how many env
    steps after a rebuild it came (a flaky env fails at a random step, a broken one at one)."""
    frames = traceback.extract_tb(err.__traceback__)
    where = (frames[-1].filename, frames[-1].lineno) if frames else None
    steps = getattr(runner, "steps_since_rebuild", None)
    return (type(err).__name__, str(err)[:1000], where, steps)


class RepeatTracker:
    """Counts identical failures in a row (``failure_signature``); any other failure, or a
    fragment produced in between (``reset``), starts the count again."""

    def __init__(self):
        self.signature: tuple | None = None
        self.count = 0

    def add(self, signature: tuple) -> int:
        self.count = self.count + 1 if signature == self.signature else 1
        self.signature = signature
        return self.count

    def reset(self) -> None:
        self.signature, self.count = None, 0


class RunnerThread(threading.Thread):
    """Runs an EnvRunner until stopped or abandoned, putting fragments on the learner queue.

    With ``restart_failed_sub_environments`` an exception while sampling rebuilds the envs and
    sampling goes on (the partial fragment is dropped); otherwise, or after
    ``num_consecutive_env_runner_failures_tolerance`` failures in a row, the thread ends with
    ``error`` set and the algorithm decides (restart, ignore, or raise).
    """

    def __init__(self, runner: EnvRunner, put: Callable, restart_envs: bool, tolerance: int):
        super().__init__(name=f"EnvRunner-{runner.index}", daemon=True)
        self.runner = runner
        self._put = put
        self._restart_envs = restart_envs
        self._tolerance = tolerance
        self.stop_event = threading.Event()  # set by stop() or when the runner is abandoned
        self.error: BaseException | None = None
        self.error_traceback: str | None = None
        self.error_time: float | None = None  # time.time() of the failure
        self.waiting_on_queue = False
        # Identical failures in a row, across this thread's env rebuilds.
        self.repeats = RepeatTracker()
        self.fragments = 0  # fragments handed to the learner queue

    def run(self) -> None:
        failures = 0
        try:
            while not self.stop_event.is_set():
                try:
                    fragments = self.runner.sample()
                    failures = 0
                    self.repeats.reset()
                except (EnvOutputError, UserCodeError):
                    raise  # bad env output or a callback's bug: no rebuild fixes it
                except Exception as err:
                    failures += 1
                    same = self.repeats.add(failure_signature(err, self.runner))
                    if not self._restart_envs or failures > self._tolerance:
                        raise
                    if same >= IDENTICAL_FAILURES_TO_STOP:
                        raise  # rebuilding the envs again would fail the same way
                    self.runner.restart_envs()
                    continue
                for traj in fragments:
                    started = time.perf_counter()
                    # Waiting for room in the queue is back-pressure from the learner, not a hang.
                    self.waiting_on_queue = True
                    if not self._put(traj, self.stop_event):
                        return
                    self.waiting_on_queue = False
                    self.fragments += 1
                    self.runner.heartbeat = time.monotonic()
                    self.runner.timers.add("queue_put_wait", time.perf_counter() - started)
        except BaseException as err:  # reported by train(), which owns the run
            self.error_traceback = traceback.format_exc()
            self.error_time = time.time()
            if self.repeats.signature is None:  # a failure outside sampling (building the envs)
                self.repeats.add(failure_signature(err, self.runner))
            self.error = err
        finally:
            self.runner.close()
