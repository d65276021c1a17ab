"""RLlib-style callbacks: every hook fires with RLlib's keywords, custom metrics land under
RLlib's result keys with the right reduction, and the config round-trips (also through a
checkpoint)."""

from __future__ import annotations

import inspect
import math
import threading
from collections import Counter

import numpy as np
import pytest

from impala_jax import IMPALA, IMPALAConfig
from impala_jax.rllib.callbacks import (
    Episode,
    MetricsLogger,
    RLlibCallback,
    resolve,
)
from impala_jax.runtime.acting.episode_hooks import EpisodeCallbacks
from impala_jax.runtime.process import checkpoint
from tests.test_algorithm import small_config

# The keywords RLlib 2.60 passes to each hook (Algorithm / SingleAgentEnvRunner make_callback).
RLLIB_KWARGS = {
    "on_algorithm_init": {"algorithm", "metrics_logger"},
    "on_train_result": {"algorithm", "metrics_logger", "result"},
    "on_evaluate_start": {"algorithm", "metrics_logger"},
    "on_evaluate_end": {"algorithm", "metrics_logger", "evaluation_metrics"},
    "on_checkpoint_loaded": {"algorithm"},
    "on_episode_start": {
        "episode",
        "env_runner",
        "metrics_logger",
        "env",
        "env_index",
        "rl_module",
    },
    "on_episode_end": {
        "episode",
        "env_runner",
        "metrics_logger",
        "env",
        "env_index",
        "rl_module",
        "prev_episode_chunks",
    },
}


def cb_config(num_env_runners=0, **runners):
    # A huge smoothing window: episode_return_mean is then the mean over every episode so far.
    return small_config(num_env_runners=num_env_runners, **runners).reporting(
        metrics_num_episodes_for_smoothing=1_000_000
    )


class Recorder(RLlibCallback):
    """Records every call (hook, kwargs, thread) and logs custom metrics as RLlib users do."""

    def __init__(self):
        self.calls: list[tuple[str, dict, str]] = []

    def _record(self, hook, kwargs):
        self.calls.append((hook, kwargs, threading.current_thread().name))

    def on_algorithm_init(self, **kwargs):
        self._record("on_algorithm_init", kwargs)
        kwargs["metrics_logger"].log_value("init_marker", 7, reduce="item")

    def on_train_result(self, **kwargs):
        self._record("on_train_result", kwargs)
        result = kwargs["result"]
        kwargs["metrics_logger"].log_value(
            "previous_iteration", result["training_iteration"], reduce="max"
        )
        result["mutated_by_callback"] = result["training_iteration"]

    def on_evaluate_start(self, **kwargs):
        self._record("on_evaluate_start", kwargs)

    def on_evaluate_end(self, **kwargs):
        self._record("on_evaluate_end", kwargs)
        kwargs["evaluation_metrics"]["seen_by_on_evaluate_end"] = True

    def on_checkpoint_loaded(self, **kwargs):
        self._record("on_checkpoint_loaded", kwargs)

    def on_episode_start(self, **kwargs):
        self._record("on_episode_start", kwargs)
        kwargs["episode"].custom_data["started_in"] = threading.current_thread().name

    def on_episode_end(self, **kwargs):
        self._record("on_episode_end", kwargs)
        episode, logger = kwargs["episode"], kwargs["metrics_logger"]
        assert episode.custom_data["started_in"] == threading.current_thread().name
        logger.log_value(("custom", "return_sum"), episode.get_return(), reduce="sum")
        logger.log_value(("custom", "count"), 1, reduce="sum")
        logger.log_value(("custom", "len_max"), len(episode), reduce="max")
        logger.log_value(("custom", "len_mean"), episode.env_steps(), reduce="mean")
        logger.log_value("lifetime_count", 1, reduce="sum", clear_on_reduce=False)


def _calls(objects, hook):
    return [c for o in objects for c in o.calls if c[0] == hook]


def _custom(result, name):
    return result["env_runners"].get("custom", {}).get(name, math.nan)


def _num(x):
    return 0 if isinstance(x, float) and math.isnan(x) else x


@pytest.mark.timeout(300)
def test_hooks_kwargs_and_metrics_lockstep():
    config = (
        cb_config().callbacks(Recorder).evaluation(evaluation_interval=2, evaluation_duration=3)
    )
    with config.build() as algo:
        (algo_cb,) = algo.callbacks
        assert isinstance(algo_cb, Recorder)
        runner = algo.env_runner_group.local_runner
        results = [algo.train() for _ in range(4)]
        runner_cb = runner.episode_callbacks.hooks._callbacks.objects[0]
        eval_cb = algo._evaluator.episode_callbacks.hooks._callbacks.objects[0]
        assert len({id(algo_cb), id(runner_cb), id(eval_cb)}) == 3  # one instance each, as RLlib
        main = threading.current_thread().name

        # on_algorithm_init: once, at build, with the algorithm and its logger.
        (init,) = _calls([algo_cb], "on_algorithm_init")
        assert init[1] == {"algorithm": algo, "metrics_logger": algo.metrics}
        assert results[0]["init_marker"] == 7  # logged at init: top level of the first result

        # on_train_result: once per train(), with the very dict train() returned.
        train_calls = _calls([algo_cb], "on_train_result")
        assert [c[1]["result"] for c in train_calls] == results
        assert all(c[1]["result"] is r for c, r in zip(train_calls, results, strict=True))
        assert [r["mutated_by_callback"] for r in results] == [1, 2, 3, 4]
        # Logged in on_train_result: reduced before it runs (RLlib), so in the next result.
        assert "previous_iteration" not in results[0]
        assert [r["previous_iteration"] for r in results[1:]] == [1, 2, 3]

        # Episodes: on the main thread in lockstep, one call per counted episode, RLlib's kwargs.
        ends = _calls([runner_cb], "on_episode_end")
        total = sum(r["env_runners"]["num_episodes"] for r in results)
        assert total > 0 and len(ends) == total
        assert {c[2] for c in ends} == {main}
        for hook in ("on_episode_start", "on_episode_end"):
            assert {frozenset(c[1]) for c in _calls([runner_cb], hook)} == {
                frozenset(RLLIB_KWARGS[hook])
            }
        for _, kw, _ in ends:
            assert isinstance(kw["episode"], Episode) and kw["episode"].is_done
            assert kw["env_runner"] is runner and kw["metrics_logger"] is runner.metrics
            assert kw["env_index"] == kw["episode"].env_index
            assert 0 <= kw["env_index"] < 4 and kw["env"] is not None
            assert kw["rl_module"] is None and kw["prev_episode_chunks"] == []
        episodes = [kw["episode"] for _, kw, _ in ends]
        assert len({e.id_ for e in episodes}) == len(episodes)
        # Every episode ended was started, with the same object (custom_data carried over).
        started = {id(c[1]["episode"]) for c in _calls([runner_cb], "on_episode_start")}
        assert {id(e) for e in episodes} <= started
        # One start per episode: the ended ones, plus one running in each env not at a reset.
        running = sum(int((~g.prev_done).sum()) for g in runner.groups)
        assert len(started) == len(ends) + running
        assert all(e.is_terminated != e.is_truncated for e in episodes)

        # Custom metrics under env_runners/, reduced per iteration as RLlib does.
        returns_so_far = 0.0
        for r in results:
            er = r["env_runners"]
            n = er["num_episodes"]
            if n:
                assert er["custom"]["count"] == n
                returns_so_far += er["custom"]["return_sum"]
            else:
                # Never logged yet: absent; logged before: NaN for a period without values (RLlib).
                assert math.isnan(er.get("custom", {}).get("count", math.nan))
        assert np.isclose(returns_so_far / total, results[-1]["env_runners"]["episode_return_mean"])
        assert results[-1]["env_runners"]["lifetime_count"] == total
        n_last = results[-1]["env_runners"]["num_episodes"]
        if n_last:
            last = episodes[-n_last:]
            assert results[-1]["env_runners"]["custom"]["len_max"] == max(map(len, last))
            assert np.isclose(
                results[-1]["env_runners"]["custom"]["len_mean"], np.mean([len(e) for e in last])
            )

        # Evaluation: the hooks around it; its episodes' metrics under evaluation/env_runners.
        assert len(_calls([algo_cb], "on_evaluate_start")) == 2
        evals = _calls([algo_cb], "on_evaluate_end")
        assert [c[1]["evaluation_metrics"] for c in evals] == [
            results[1]["evaluation"],
            results[3]["evaluation"],
        ]
        assert results[1]["evaluation"]["seen_by_on_evaluate_end"] is True
        eval_ends = _calls([eval_cb], "on_episode_end")
        assert (
            len(eval_ends)
            == 6
            == sum(r["evaluation"]["env_runners"]["num_episodes"] for r in (results[1], results[3]))
        )
        assert all(c[1]["env_runner"] is algo._evaluator for c in eval_ends)
        for r in (results[1], results[3]):
            ev = r["evaluation"]["env_runners"]
            assert ev["custom"]["count"] == ev["num_episodes"] == 3
            assert np.isclose(ev["custom"]["return_sum"] / 3, ev["episode_return_mean"])
        for hook in ("on_evaluate_start", "on_evaluate_end"):
            assert {frozenset(c[1]) for c in _calls([algo_cb], hook)} == {
                frozenset(RLLIB_KWARGS[hook])
            }


@pytest.mark.timeout(300)
def test_episode_end_count_threaded():
    """Runner threads: every episode's callback and its metrics land in the same result."""
    config = cb_config(num_env_runners=2).callbacks(Recorder)
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
        runners = list(algo.env_runner_group.runners)
        counted = sum(r["env_runners"]["num_episodes"] for r in results)
        logged = sum(_num(_custom(r, "count")) for r in results)
        assert counted > 0 and logged == counted
        for r in results:
            assert _num(_custom(r, "count")) == r["env_runners"]["num_episodes"]
        returns = sum(_num(_custom(r, "return_sum")) for r in results)
        assert np.isclose(returns / counted, results[-1]["env_runners"]["episode_return_mean"])
        objects = [r.episode_callbacks.hooks._callbacks.objects[0] for r in runners]
        threads = {c[2] for c in _calls(objects, "on_episode_end")}
        assert threads <= {"EnvRunner-0", "EnvRunner-1"} and threads
        # Episodes finished after the last result are recorded for the next one: never fewer.
        assert len(_calls(objects, "on_episode_end")) >= counted


@pytest.mark.timeout(300)
def test_per_event_callables_and_class_list(tmp_path):
    order: list[str] = []
    counts: Counter = Counter()

    class First(RLlibCallback):
        def on_train_result(self, *, algorithm, metrics_logger=None, result, **kwargs):
            order.append("First")

    class Second(RLlibCallback):
        def on_train_result(self, *, algorithm, metrics_logger=None, result, **kwargs):
            order.append("Second")

    def fn_a(*, algorithm, metrics_logger, result):  # exactly RLlib's keywords, no **kwargs
        order.append("fn_a")

    def on_end(*, episode, env_runner, metrics_logger, env, env_index, rl_module, **kwargs):
        counts["end"] += 1
        metrics_logger.log_value("ret_max", episode.get_return(), reduce="max")
        metrics_logger.log_value("ret_min", episode.get_return(), reduce="min")

    config = cb_config().callbacks(
        [First, Second],
        on_train_result=[fn_a, lambda **kw: order.append("lambda")],
        on_episode_end=on_end,
        on_checkpoint_loaded=lambda *, algorithm: counts.update(["loaded"]),
    )
    assert config.callbacks_class == [First, Second] and config.on_episode_end is on_end
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
        assert order == ["First", "Second", "fn_a", "lambda"] * 3
        assert counts["end"] == sum(r["env_runners"]["num_episodes"] for r in results)
        returns = [r["env_runners"]["episode_return_max"] for r in results]
        assert results[-1]["env_runners"]["ret_max"] <= returns[-1]
        assert results[-1]["env_runners"]["ret_min"] <= results[-1]["env_runners"]["ret_max"]
        path = algo.save_to_path(tmp_path / "ckpt")
        algo.restore(path)
        assert counts["loaded"] == 1


@pytest.mark.timeout(300)
def test_no_callbacks_calls_nothing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("an episode callback path ran without callbacks")

    monkeypatch.setattr(EpisodeCallbacks, "step", boom)
    monkeypatch.setattr(EpisodeCallbacks, "begin", boom)
    # An algorithm-level hook alone does not put the episode path on the stepping loop.
    seen = []
    config = cb_config().callbacks(on_train_result=lambda **kw: seen.append(1))
    config.evaluation(evaluation_interval=1, evaluation_duration=2)
    with config.build() as algo:
        assert algo.callbacks == []
        assert algo.env_runner_group.local_runner.episode_callbacks is None
        assert algo._evaluator.episode_callbacks is None
        result = algo.train()
        assert seen == [1]
        assert "custom" not in result["env_runners"]
        assert set(result["evaluation"]["env_runners"]) >= {"episode_return_mean"}


class ModuleLevelCallbacks(RLlibCallback):
    """Importable by path: what a checkpoint stores for a callbacks class."""

    events: Counter = Counter()

    def on_algorithm_init(self, *, algorithm, metrics_logger=None, **kwargs):
        type(self).events["init"] += 1

    def on_checkpoint_loaded(self, *, algorithm, **kwargs):
        type(self).events["loaded"] += 1
        type(self).events["iteration"] = algorithm.iteration


def module_level_on_train_result(*, algorithm, metrics_logger, result):
    metrics_logger.log_value("fn_from_checkpoint", 1, reduce="lifetime_sum")


@pytest.mark.timeout(300)
def test_from_checkpoint_reimports_module_level_callbacks(tmp_path):
    ModuleLevelCallbacks.events.clear()
    config = cb_config().callbacks(
        ModuleLevelCallbacks, on_train_result=module_level_on_train_result
    )
    # to_dict keeps the class and the function (RLlib keeps classes in its dict too).
    assert config.to_dict()["callbacks_class"] is ModuleLevelCallbacks
    assert IMPALAConfig.from_dict(config.to_dict()) == config
    with config.build() as algo:
        algo.train()
        path = algo.save_to_path(tmp_path / "ckpt")
    _, meta = checkpoint.load(path)
    assert meta["config"]["callbacks_class"] == "tests.test_callbacks:ModuleLevelCallbacks"
    assert meta["config"]["on_train_result"] == "tests.test_callbacks:module_level_on_train_result"
    assert ModuleLevelCallbacks.events == Counter(init=1)
    with IMPALA.from_checkpoint(path) as restored:
        assert isinstance(restored.callbacks[0], ModuleLevelCallbacks)
        assert ModuleLevelCallbacks.events == Counter(init=2, loaded=1, iteration=1)
        restored.train()
        assert restored.train()["fn_from_checkpoint"] == 1


def test_unsupported_hooks_are_errors():
    class Steps(RLlibCallback):
        def on_episode_step(self, **kwargs):
            pass

    with pytest.raises(ValueError, match="on_episode_step"):
        IMPALAConfig().callbacks(Steps)

    class DuckTyped:  # not a subclass: any hook it defines counts
        def on_learn_on_batch(self, **kwargs):
            pass

    with pytest.raises(ValueError, match="on_learn_on_batch"):
        IMPALAConfig().callbacks([RLlibCallback, DuckTyped])
    config = IMPALAConfig().callbacks(on_sample_end=print, on_episode_created=print)
    with pytest.raises(ValueError, match="(?s)on_episode_created=.*on_sample_end="):
        config.validate()
    with pytest.raises(ValueError, match="callbacks_class"):
        IMPALAConfig().callbacks(RLlibCallback())  # an instance, not a class
    with pytest.raises(ValueError, match="on_train_result"):
        IMPALAConfig().callbacks(on_train_result=3).validate()
    # An attribute assignment that dodges the builder is still caught by validate().
    config = IMPALAConfig()
    config.callbacks_class = Steps
    with pytest.raises(ValueError, match="on_episode_step"):
        config.validate()
    config.callbacks_class = None
    config.validate()


def test_callbacks_config_fields():
    config = IMPALAConfig()
    assert config.callbacks_class is None and config.on_episode_end is None
    assert config.callbacks(None) is config and config.callbacks_class is None
    config.callbacks("tests.test_callbacks.ModuleLevelCallbacks")  # RLlib's dotted path
    config.validate()
    assert IMPALAConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    with pytest.raises(TypeError):
        config.callbacks(on_everything=print)
    frozen = config.copy(copy_frozen=True)
    with pytest.raises(AttributeError):
        frozen.callbacks(on_train_result=print)


def test_resolve_import_paths():
    assert resolve("tests.test_callbacks:ModuleLevelCallbacks", "x") is ModuleLevelCallbacks
    assert resolve("tests.test_callbacks.ModuleLevelCallbacks", "x") is ModuleLevelCallbacks
    assert resolve("impala_jax.rllib.callbacks:Episode.get_return", "x") is Episode.get_return
    with pytest.raises(ValueError, match="lambda or a function"):
        resolve("tests.test_callbacks:test_x.<locals>.<lambda>", "on_train_result")
    with pytest.raises(ValueError, match="cannot import"):
        resolve("tests.test_callbacks:NoSuchThing", "callbacks_class")
    # What a checkpoint stores for a lambda, and the error a build from it gives.
    stored = checkpoint.jsonable({"f": lambda **kw: None})["f"]
    config = IMPALAConfig().environment("CartPole-v1").callbacks(on_train_result=stored)
    with pytest.raises(ValueError, match="on_train_result=.*lambda"):
        IMPALA(config)


# -- the logger ------------------------------------------------------------------------------


def test_metrics_logger_reductions():
    log = MetricsLogger()
    for v in [1, 2, 3, 4, 5]:
        log.log_value("m", v, reduce="mean")
        log.log_value("mw", v, reduce="mean", window=3)
        log.log_value("s", v, reduce="sum")
        log.log_value("ls", v, reduce="lifetime_sum")
        log.log_value("sc", v, reduce="sum", clear_on_reduce=False)
        log.log_value("mx", np.int64(v), reduce="max")
        log.log_value("e", float(v))
        log.log_value(("a", "b"), v, reduce="min")
        log.log_value("it", v, reduce="item")
        log.log_value("series", v, reduce="item_series")
    assert log.peek("m") == 3.0 and log.peek(("a", "b")) == 1 and log.peek("a") == {"b": 1}
    assert "a" in log and ("a", "b") in log and "zz" not in log
    first = log.reduce()
    assert first == {
        "m": 3.0,
        "mw": 4.0,
        "s": 15,
        "ls": 15,
        "sc": 15,
        "mx": 5,
        "e": pytest.approx(1.099004990),
        "a": {"b": 1},
        "it": 5,
        "series": [1, 2, 3, 4, 5],
    }
    log.log_value("m", 10)
    log.log_value("s", 10)
    log.log_value("ls", 10)
    log.log_value("sc", 10, reduce="sum", clear_on_reduce=False)
    log.log_value("e", 10.0)
    second = log.reduce()
    assert second["m"] == 10.0 and second["s"] == 10 and second["ls"] == second["sc"] == 25
    assert second["e"] == pytest.approx(0.01 * 10 + 0.99 * 1.09900499)
    assert math.isnan(second["mw"]) and math.isnan(second["mx"])  # no values: NaN, as RLlib
    assert second["it"] is None and second["series"] == []
    assert log.peek("missing", default=-1) == -1
    with pytest.raises(KeyError):
        log.peek("missing")


def test_metrics_logger_matches_rllib():
    """The same calls into RLlib 2.60's MetricsLogger (leaf -> root) give the same values."""
    rllib_logger = pytest.importorskip("ray.rllib.utils.metrics.metrics_logger")
    leaf, root = rllib_logger.MetricsLogger(), rllib_logger.MetricsLogger(root=True)
    ours = MetricsLogger()
    calls = [
        ("mean", dict(reduce="mean")),
        ("mean_w", dict(reduce="mean", window=2)),
        ("max", dict(reduce="max")),
        ("min_w", dict(reduce="min", window=2)),
        ("sum", dict(reduce="sum")),
        ("life", dict(reduce="lifetime_sum")),
        ("ema", dict()),
    ]
    for period in ([3.0, 1.0, 4.0, 1.0, 5.0], [9.0, 2.0], [6.0]):
        for value in period:
            for key, kwargs in calls:
                leaf.log_value(key, value, **kwargs)
                ours.log_value(key, value, **kwargs)
        root.aggregate([leaf.reduce()])
        expected = root.reduce(compile=True)
        got = ours.reduce()
        assert set(got) == set(expected)
        for key in got:
            assert float(got[key]) == pytest.approx(float(expected[key])), key


def test_metrics_logger_errors_and_threads():
    log = MetricsLogger()
    log.log_value("x", 1, reduce="mean")
    with pytest.raises(ValueError, match="keeps its reduction"):
        log.log_value("x", 1, reduce="max")
    with pytest.raises(ValueError, match="nested"):
        log.log_value(("x", "y"), 1, reduce="mean")
    with pytest.raises(ValueError, match="reduce="):
        log.log_value("bad", 1, reduce="median")
    with pytest.raises(ValueError, match="percentiles"):
        log.log_value("p", 1, reduce="mean", window=10, percentiles=True)
    with pytest.raises(ValueError, match="clear_on_reduce"):
        log.log_value("c", 1, reduce="mean", clear_on_reduce=False)
    with pytest.raises(ValueError, match="window"):
        log.log_value("w", 1, reduce="ema", window=3)
    with pytest.raises(TypeError, match="single number"):
        log.log_value("arr", np.ones(3), reduce="mean")
    with pytest.raises(TypeError):
        log.log_value("s", "text", reduce="sum")
    log.log_dict({"a": 1.0, "b": {"c": 2.0}}, key="d")
    with log.log_time("t", reduce="mean"):
        pass
    assert log.peek("d") == {"a": 1.0, "b": {"c": 2.0}} and log.peek("t") >= 0

    def work():
        for _ in range(2000):
            log.log_value("n", 1, reduce="sum")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log.reduce()["n"] == 8000


# -- RLlib's own base class ------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_rllib_callback_subclass_from_ray():
    """A subclass of RLlib's RLlibCallback, with RLlib's exact signatures, runs unchanged."""
    rllib_callbacks = pytest.importorskip("ray.rllib.callbacks.callbacks")
    base = rllib_callbacks.RLlibCallback
    seen: Counter = Counter()

    class FromRay(base):
        def on_algorithm_init(self, *, algorithm, metrics_logger=None):
            seen["init"] += 1

        def on_train_result(self, *, algorithm, metrics_logger=None, result):
            seen["train"] += 1

        def on_episode_start(
            self,
            *,
            episode,
            env_runner=None,
            metrics_logger=None,
            env=None,
            env_index,
            rl_module=None,
        ):
            seen["start"] += 1

        def on_episode_end(
            self,
            *,
            episode,
            prev_episode_chunks=None,
            env_runner=None,
            metrics_logger=None,
            env=None,
            env_index,
            rl_module=None,
        ):
            seen["end"] += 1
            metrics_logger.log_value("ray_cb_return", episode.get_return(), reduce="mean")

    # Every keyword impala_jax passes is a parameter of RLlib's own hook.
    for hook, kwargs in RLLIB_KWARGS.items():
        params = inspect.signature(getattr(base, hook)).parameters
        assert kwargs <= set(params), hook
        required = {
            n for n, p in params.items() if p.default is p.empty and p.kind == p.KEYWORD_ONLY
        }
        assert required <= kwargs, hook

    with cb_config().callbacks(FromRay).build() as algo:
        results = [algo.train() for _ in range(3)]
    assert seen["init"] == 1 and seen["train"] == 3 and seen["start"] >= seen["end"] > 0
    assert seen["end"] == sum(r["env_runners"]["num_episodes"] for r in results)

    class StepsFromRay(base):
        def on_episode_step(self, **kwargs):
            pass

    with pytest.raises(ValueError, match="on_episode_step"):
        IMPALAConfig().callbacks(StepsFromRay)


def test_rllib_callback_is_on_the_face():
    """``from impala_jax import RLlibCallback``: the path that stays when modules move."""
    import impala_jax
    from impala_jax.rllib.callbacks import RLlibCallback

    assert impala_jax.RLlibCallback is RLlibCallback
