"""RLlib's Checkpointable for IMPALA: get_state / set_state, save / restore, from_checkpoint.

The format (arrays as one npz, config and counters as JSON, nothing pickled) is
checkpoint.py's. The config's class is stored by import path beside the config, so that
`from_checkpoint` rebuilds a user's subclass of `IMPALAConfig` as itself (RLlib's Checkpointable
restores its "class_and_ctor_args" the same way), and this module needs no import of the config.
Over several processes (distributed.py) process 0 alone writes, and a restore sends process 0's
checkpoint to every process.
"""

from __future__ import annotations

import tempfile
from typing import Any

import jax
import numpy as np

from impala_jax.runtime.process import agreement, checkpoint, collectives
from impala_jax.runtime.process.import_path import import_object, split_import_path

# state.json's key of the config's class ("module:qualname"); a checkpoint written before it
# existed holds an IMPALAConfig.
CONFIG_CLASS_KEY = "config_class"
DEFAULT_CONFIG_CLASS = "impala_jax.rllib.config:IMPALAConfig"


def import_path(path: str) -> Any:
    """The object at ``"pkg.mod:qualname"`` (as ``checkpoint.jsonable`` writes a class)."""
    parts = split_import_path(path) if ":" in path else None
    if parts is None:
        raise ValueError(
            f"{CONFIG_CLASS_KEY}={path!r} in the checkpoint is not an importable path "
            "'pkg.mod:Cls'; a config class defined inside a function cannot be restored, define "
            "it at module level."
        )
    try:
        return import_object(*parts)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"the checkpoint's config class {path!r} cannot be imported ({err}); import or "
            "define it where the checkpoint was written."
        ) from err


class Checkpointable:
    """The state methods of `IMPALA` (a mixin: they use its learner, engine and counters)."""

    def get_state(self) -> dict:
        """Learner state, replay slots, counters and the episode window as host values. Over
        several processes the replay slots (spread over every process's devices) are left
        out: a restored run starts with them empty, as on another device count."""
        learner, replay = self.learner.state_arrays(replay=self._processes == 1)
        return {
            "learner": learner,
            "replay": replay,
            "counters": {
                "training_iteration": self._iteration,
                "time_total_s": self._time_total,
                "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime,
                "num_env_steps_trained_lifetime": self._env_steps_trained,
                "num_updates_lifetime": self._num_updates,
                "num_episodes_lifetime": self._episodes[0].num_episodes_lifetime,
                **({"policy_ids": self.policy_ids} if hasattr(self, "policy_ids") else {}),
            },
            "episodes": self._episodes[0].get_state(),
        }

    def set_state(self, state: dict) -> None:
        """Learner state, counters and the episode window; the runners then sample with the
        restored params only (fragments and episodes begun before are dropped)."""
        saved = state["counters"].get("policy_ids")  # a multi-agent run's (multi_agent.py)
        mine = getattr(self, "policy_ids", None)
        if saved != mine:
            raise ValueError(
                f"the checkpoint holds the policies {saved or ['default_policy']}, this "
                f"algorithm {mine or ['default_policy']}: restore it into an algorithm built "
                "with the same multi_agent(policies=...), or with IMPALA.from_checkpoint(path)."
            )
        self.learner.load_state_arrays(state["learner"], state.get("replay"))
        self.engine.restart_for_restore()
        c = state["counters"]
        self._iteration = c["training_iteration"]
        self._time_total = c["time_total_s"]
        self.engine.set_num_env_steps_sampled_lifetime(c["num_env_steps_sampled_lifetime"])
        self._env_steps_trained = c["num_env_steps_trained_lifetime"]
        self._num_updates = c["num_updates_lifetime"]
        episodes = state.get("episodes") or {}
        self._episodes[0].set_state(
            dict(episodes, num_episodes_lifetime=c["num_episodes_lifetime"])
        )
        self._last_lag = []
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        self.engine.publish()

    def save_to_path(self, path=None) -> str:
        """Writes a checkpoint to ``path`` (a new temporary directory if None); its path.

        Over several processes only process 0 writes; the others write nothing and return
        ``path`` as given ("" for None). It involves no collective: process 0 may save alone.
        """
        if not self._primary:
            return "" if path is None else str(path)
        if path is None:
            path = tempfile.mkdtemp(prefix="impala_jax_checkpoint_")
        state = self.get_state()
        arrays = {f"learner_{i:05d}": x for i, x in enumerate(state["learner"])}
        arrays.update({f"replay_{i:05d}": x for i, x in enumerate(state["replay"])})
        config = checkpoint.jsonable(self.config.to_dict())
        env = config.get("env")
        if not isinstance(env, str | None):  # an env instance (gymnax's): no import path
            config["env"] = f"<instance of {type(env).__module__}:{type(env).__qualname__}>"
        meta = {
            "format": checkpoint.FORMAT,
            "config": config,
            CONFIG_CLASS_KEY: checkpoint.jsonable(type(self.config)),
            "counters": state["counters"],
            "episodes": state["episodes"],
        }
        files = {}
        if self.config.export_native_model_files:
            files[checkpoint.NATIVE_PARAMS_FILE] = checkpoint.native_params(
                self.learner.state.params
            )
        return str(checkpoint.save(path, arrays, meta, files=files))

    def save(self, checkpoint_dir=None) -> checkpoint.SaveResult:
        """RLlib's ``save``: a checkpoint in ``checkpoint_dir`` (None: a new temporary
        directory); the result has ``.checkpoint.path`` and is also usable as that path."""
        path = self.save_to_path(checkpoint_dir)
        return checkpoint.SaveResult(checkpoint.Checkpoint(path), metrics={})

    def restore_from_path(self, path) -> None:
        """Restores a checkpoint. Over several processes every process calls it together:
        process 0 reads ``path`` and sends the state to the others (their ``path`` is not
        read), so every process restores the same state."""
        if self._processes > 1:
            state = self._state_from_process_0(path)
        else:
            state = _state_of(*checkpoint.load(checkpoint.path_of(path)))
        self.set_state(state)
        self._callbacks.call("on_checkpoint_loaded", algorithm=self)

    def _state_from_process_0(self, path) -> dict:
        loaded = None

        def header():
            nonlocal loaded
            loaded = _state_of(*checkpoint.load(checkpoint.path_of(path)))
            shapes = [[list(np.shape(x)), np.asarray(x).dtype.str] for x in loaded["learner"]]
            return {k: loaded[k] for k in ("counters", "episodes")} | {"shapes": shapes}

        head = agreement.from_process_0(header, f"process 0's checkpoint {path}")
        mine, _ = self.learner.state_arrays(replay=False)
        same = [[list(np.shape(x)), np.asarray(x).dtype.str] for x in mine] == head["shapes"]
        agreed = collectives.allgather(np.bool_(same), "the checkpoint's shapes")
        if not agreed.all():
            differ = [int(i) for i in np.flatnonzero(~agreed)]
            raise ValueError(
                f"the checkpoint {path} that process 0 read does not match the network and "
                f"optimizer of process(es) {differ}: every process must build the same config."
            )
        leaves = loaded["learner"] if loaded is not None else mine
        leaves = collectives.broadcast_tree(leaves, "process 0's checkpoint arrays")
        return {"learner": leaves, "replay": [], **{k: head[k] for k in ("counters", "episodes")}}

    def restore(self, checkpoint_path) -> None:
        """Restores a path, a ``Checkpoint`` or what ``save()`` returned (RLlib's forms)."""
        self.restore_from_path(checkpoint_path)

    @classmethod
    def from_checkpoint(cls, path, *, env=None, policy_mapping_fn=None):
        """Builds the checkpoint's config and restores its state. ``env`` replaces the
        checkpoint's env: needed when that was a lambda or local function, which a checkpoint
        stores only by name (a name given to register_env must be registered again);
        ``policy_mapping_fn`` replaces a multi-agent run's mapping function, for the same
        reason."""
        from impala_jax.runtime.envs.env_registry import check_restorable

        path = checkpoint.path_of(path)
        if jax.process_count() > 1:  # process 0 reads it (restore_from_path)
            meta = agreement.from_process_0(
                lambda: checkpoint.load(path)[1], f"process 0's checkpoint {path}"
            )
        else:
            _, meta = checkpoint.load(path)
        config = dict(meta["config"])
        if env is not None:
            config["env"] = env
        else:
            check_restorable(config.get("env"), config.get("env_config"), f"checkpoint {path}")
        config["policy_mapping_fn"] = _mapping_fn(
            config.get("policy_mapping_fn"), policy_mapping_fn, path
        )
        config_class = import_path(meta.get(CONFIG_CLASS_KEY, DEFAULT_CONFIG_CLASS))
        algo = config_class.from_dict(config).build()
        algo.restore(path)
        return algo


def _mapping_fn(stored: Any, given: Any, path) -> Any:
    """The multi-agent mapping function to rebuild with: ``given``, else the stored one's
    import path resolved; a lambda or local function (stored by name only) must be given."""
    if given is not None or stored is None:
        return given
    parts = split_import_path(stored) if isinstance(stored, str) else None
    if parts is not None and "<" not in stored:
        try:
            return import_object(*parts)
        except (ImportError, AttributeError):
            pass
    raise ValueError(
        f"checkpoint {path} was trained with policy_mapping_fn={stored!r}, which a checkpoint "
        "stores only by its import path (no pickled code), and which does not import here. Pass "
        "it back: IMPALA.from_checkpoint(path, policy_mapping_fn=fn)."
    )


def _state_of(arrays: dict, meta: dict) -> dict:
    """``set_state``'s dict from what ``checkpoint.load`` returns."""
    return {
        "learner": [arrays[k] for k in sorted(arrays) if k.startswith("learner_")],
        "replay": [arrays[k] for k in sorted(arrays) if k.startswith("replay_")],
        "counters": meta["counters"],
        "episodes": meta.get("episodes"),
    }
