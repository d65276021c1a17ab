"""What ``train()`` says about the learner's updates: non-finite gradients, stalled steps,
RMSProp's warm-up, a blind encoder, diverging updates and a dead policy. Each check reads the
iteration's learner metrics (host floats) and returns its message, or None; `TrainingChecks`
runs them as ``train()`` does, and `DeadPolicyCheck` with the iteration's return."""

from __future__ import annotations

import math

from impala_jax.core.learner_metrics import read_metric

# Learner updates in a row with non-finite gradients (each skipped) before train() gives up.
MAX_CONSECUTIVE_NON_FINITE = 10
# After this many updates, one look at the optimizer's step size (stalled_step_message).
STEP_SIZE_CHECK_UPDATES = 10
# An update whose root mean square is below this fraction of lr is "orders of magnitude" small.
STALLED_STEP_RATIO = 1e-2
# RMSProp's mean square decaying from rmsprop_initial_scale for longer than this many updates is
# reported (the paper's epsilon 0.01 and 0.1 bound it at 458 and 229 updates at decay 0.99).
RMSPROP_WARM_UP_UPDATES = 1000
# A blind-encoder warning when at least this share of the encoder's units is dead (see below).
BLIND_DEAD_FRACTION = 0.9
# The run's first updates whose metrics the divergence check keeps (training_loop.py).
EARLY_UPDATES = 10
# Diverging updates: the gradient's norm and the total loss both this many times their values
# at the first update (computed on the initial params), ...
DIVERGENCE_GROWTH = 1e3
# ... each of those floored at this: a first value near 0 (a sparse reward not yet seen) is no
# scale to grow from.
DIVERGENCE_FLOOR = 1.0
# Or the entropy of a policy that started at least this share of its maximum ...
STOCHASTIC_START_FRACTION = 0.5
# ... below DEAD_ENTROPY_FRACTION of it within EARLY_UPDATES updates, and still there.


def non_finite_message(learner: dict) -> str | None:
    """The error that ends training after MAX_CONSECUTIVE_NON_FINITE skipped updates in a row."""
    bad = read_metric(learner, "num_consecutive_non_finite_updates", 0)
    if bad < MAX_CONSECUTIVE_NON_FINITE:
        return None
    return (
        f"the last {int(bad)} learner updates all had non-finite gradients and were "
        "skipped; training stopped. The params are those of the last finite update and "
        "checkpoints already written are intact. Check the env's rewards and "
        "observations, or lower training(lr=...) / set training(grad_clip=...)."
    )


def blind_encoder_message(learner: dict) -> str | None:
    """A warning when the policy's encoder gives (nearly) every observation the same features.

    ``encoder_dead_unit_fraction`` (the learner step's feature metrics) is the share of its
    output units that are <= 0 for every observation of the batch. A dead ReLU passes no
    gradient to its own weights (only the layers below can revive it), and with most of them
    dead the value and the policy cannot tell frames apart (issue 17: too large an Adam step on
    Pong's Nature CNN).
    """
    dead = read_metric(learner, "encoder_dead_unit_fraction")
    if dead is None or not dead >= BLIND_DEAD_FRACTION:
        return None
    spread = read_metric(learner, "encoder_feature_std", float("nan"))
    return (
        f"encoder_dead_unit_fraction={dead:.2f}: {dead:.0%} of the policy encoder's output units "
        f"are <= 0 for every observation of the last batch (dead ReLUs; the features' std across "
        f"observations is {spread:.2g}). The network barely tells observations apart any more, "
        "and dead units rarely recover: the value and the policy stop learning from what they "
        "see. The updates were too large for this network: restart with a smaller "
        "training(lr=...) (or a gradient clip that binds). See docs/config.md, 'Loss reduction'."
    )


def stalled_step_message(learner: dict, config, num_parameters: int) -> str | None:
    """A warning when the latest update moved the params orders of magnitude less than lr.

    Adam and RMSProp move each parameter by about lr per step once the gradient dominates
    their denominator. With a mean loss (RLlib's, the default here) the gradient is T x B
    times smaller than the IMPALA paper's summed loss, so the paper's RMSProp epsilon (inside
    the square root, and the mean square starting at 1 as in TF1) can swamp it: the policy
    then never moves (issue 17).
    """
    ratio = read_metric(learner, "update_rms_to_lr_ratio")
    lr = read_metric(learner, "curr_lr", 0.0)
    if ratio is None or not lr > 0 or read_metric(learner, "num_consecutive_non_finite_updates", 0):
        return None  # no lr to compare with, or the last update was skipped (zero)
    if not ratio < STALLED_STEP_RATIO:
        return None
    grad_norm = read_metric(learner, "gradients_default_optimizer_global_norm", float("nan"))
    if config.grad_clip is not None and config.grad_clip_by == "global_norm":
        grad_norm = min(grad_norm, config.grad_clip)  # what reaches the optimizer
    grad_rms = grad_norm / max(num_parameters, 1) ** 0.5
    if config.opt_type == "rmsprop" and grad_rms / (grad_rms**2 + config.epsilon) ** 0.5 >= (
        STALLED_STEP_RATIO
    ):
        # The mean square starts at 1 (TF1) and decays as decay^k: the first updates are small
        # by design. Once it has decayed the step is about lr * g / sqrt(g^2 + epsilon) per
        # parameter, which is not orders of magnitude below lr here, so nothing is stalled; a
        # warm-up that lasts thousands of updates is still reported.
        return rmsprop_warm_up_message(grad_rms, ratio, config)
    fixes = []
    if config.opt_type == "rmsprop":
        fixes.append(
            f"RMSProp adds epsilon={config.epsilon!r} to the mean square inside the square root "
            f"(and the mean square starts at 1, as in TF1): the gradient's root mean square per "
            f"parameter, {grad_rms:.2g}, is far below both"
        )
    if config.loss_reduction == "mean":
        fixes.append(
            "the loss is a mean over the batch's rows (RLlib's); constants tuned for a summed "
            "loss (the IMPALA paper's RMSProp lr, epsilon, grad_clip) need "
            "training(loss_reduction='sum')"
        )
    fixes.append("or use training(opt_type='adam') or a larger lr")
    return (
        f"The optimizer's updates are {ratio:.2g} x lr in root mean square after "
        f"{STEP_SIZE_CHECK_UPDATES}+ updates (lr={lr:.3g}, opt_type={config.opt_type!r}): the "
        "policy will barely move. " + "; ".join(fixes) + ". See docs/config.md, 'Loss reduction'."
    )


def rmsprop_warm_up_message(grad_rms: float, ratio: float, config) -> str | None:
    """A warning when RMSProp's mean square needs over RMSPROP_WARM_UP_UPDATES updates to decay
    from ``rmsprop_initial_scale`` to the gradient's scale (``g^2 + epsilon``, g the gradient's
    root mean square per parameter); until then every update is a fraction of its steady size."""
    steady = grad_rms**2 + config.epsilon
    initial = config.rmsprop_initial_scale
    if not initial > steady or config.decay == 0:
        return None
    updates = math.log(steady / initial) / math.log(config.decay)
    if updates <= RMSPROP_WARM_UP_UPDATES:
        return None
    whose = " (TF1's)" if initial == 1.0 else ""
    return (
        f"RMSProp's mean square starts at rmsprop_initial_scale={initial!r}{whose} and the "
        f"gradient's root mean square per parameter is {grad_rms:.2g}: at decay={config.decay!r} "
        f"it takes about {updates:,.0f} updates to decay to the gradient's scale, and until then "
        f"each update is a fraction of its steady size (now {ratio:.2g} x lr). "
        "training(rmsprop_initial_scale=0.0) starts at the gradient's scale (torch's and optax's "
        "RMSProp). See docs/config.md, 'Loss reduction'."
    )


def divergence_message(early: list, learner: dict, config, num_updates: int) -> str | None:
    """A warning when the updates are far too large: the loss and the gradient norm grown by
    orders of magnitude over their values at the first update, or the policy's entropy gone to
    ~0 within the first updates from a stochastic start.

    ``early``: the learner metrics of the run's first updates (up to EARLY_UPDATES, the first
    computed on the initial params); ``learner``: the iteration's. Neither shows as a
    non-finite gradient: an lr of 1e3 with Adam takes CartPole's loss from 27 to 1e8-1e10 and
    its entropy to 0 by the second update, every gradient finite (issue 56), and the policy
    collapses before its return has risen, so the dead-policy report (a return fallen from its
    best) says nothing either.
    """
    if not early:
        return None
    first = early[0]
    grad_key = "gradients_default_optimizer_global_norm"
    grad0 = read_metric(first, grad_key, math.nan)
    loss0 = abs(read_metric(first, "total_loss", math.nan))
    evidence = []
    for seen in [*early[1:], learner]:
        grad = read_metric(seen, grad_key, math.nan)
        loss = abs(read_metric(seen, "total_loss", math.nan))
        if grad >= DIVERGENCE_GROWTH * max(grad0, DIVERGENCE_FLOOR) and (
            loss >= DIVERGENCE_GROWTH * max(loss0, DIVERGENCE_FLOOR)
        ):
            evidence.append(
                f"the gradient's global norm reached {grad:.3g} and the total loss's magnitude "
                f"{loss:.3g}, from {grad0:.3g} and {loss0:.3g} at the first update (over "
                f"{DIVERGENCE_GROWTH:.0f} times as large)"
            )
            break
    fraction0 = read_metric(first, "entropy_fraction_of_max")
    fraction = read_metric(learner, "entropy_fraction_of_max")
    if fraction is not None and fraction0 is not None and fraction0 >= STOCHASTIC_START_FRACTION:
        fractions = [read_metric(e, "entropy_fraction_of_max") for e in early]
        if min(fractions) < DEAD_ENTROPY_FRACTION and fraction < DEAD_ENTROPY_FRACTION:
            k = next(i for i, f in enumerate(fractions) if f < DEAD_ENTROPY_FRACTION)
            evidence.append(
                f"the policy's entropy fell from {fraction0:.0%} of its maximum to "
                f"{fractions[k]:.2%} by update {k + 1} ({fraction:.2%} now): it takes (nearly) "
                "one action everywhere after fewer updates than a policy needs to learn which"
            )
    if not evidence:
        return None
    field = "lr_schedule" if config.lr_schedule is not None else "lr"
    value = config.resolved_lr
    default = type(config)().lr
    if isinstance(value, int | float):
        fix = f"restart with a smaller one, e.g. training(lr={value / 100:g})"
    else:
        now = read_metric(learner, "curr_lr", math.nan)
        fix = f"restart with smaller values, e.g. 100 times smaller (it is {now:.3g} now)"
    fix += f" (the default is {default!r})"
    skipped = int(read_metric(learner, "num_non_finite_updates", 0))
    return (
        f"The learner's updates are too large: after {num_updates} updates "
        f"{'; and '.join(evidence)}. "
        f"num_non_finite_updates is {skipped}: it counts only updates whose gradient is not "
        f"finite. The likely cause is the learning rate, training({field}={value!r}) with "
        f"opt_type={config.opt_type!r}: each update moves the params too far; {fix}. "
        "See docs/config.md, 'Loss reduction'."
    )


class TrainingChecks:
    """The warnings of one built algorithm: the step size is looked at once, after
    STEP_SIZE_CHECK_UPDATES updates; a blind encoder and diverging updates are reported at most
    once each."""

    def __init__(self):
        self.step_size_checked = False
        self.blind_warned = False
        self.divergence_warned = False

    def warnings(
        self, learner: dict, config, num_updates: int, num_parameters: int, early=()
    ) -> list:
        """The messages to warn with after an iteration that ended at ``num_updates``;
        ``early``: the learner metrics of the run's first updates (``divergence_message``)."""
        messages = []
        if not self.divergence_warned:
            message = divergence_message(list(early), learner, config, num_updates)
            if message:
                self.divergence_warned = True
                messages.append(message)
        if not self.step_size_checked and num_updates >= STEP_SIZE_CHECK_UPDATES:
            self.step_size_checked = True
            message = stalled_step_message(learner, config, num_parameters)
            if message:
                messages.append(message)
        if not self.blind_warned and num_updates >= STEP_SIZE_CHECK_UPDATES:
            message = blind_encoder_message(learner)
            if message:
                self.blind_warned = True
                messages.append(message)
        return messages


# A dead policy: the entropy below this share of its maximum ...
DEAD_ENTROPY_FRACTION = 0.01
# ... while the return is below this share of the best seen (smoothed, as the results report it)
DEAD_RETURN_FRACTION = 0.5
# ... for this many iterations in a row, the entropy not rising meanwhile (updates no longer
# move the policy out of it).
DEAD_POLICY_ITERATIONS = 5


class DeadPolicyCheck:
    """Reports, once, a policy that has collapsed onto one action and stays there: its entropy
    near 0 while the return has fallen far below its best, for DEAD_POLICY_ITERATIONS
    iterations in a row without the entropy rising. Nothing samples the other actions any
    more and a saturated softmax passes almost no gradient, so it may stay there for good; it
    can also climb back, slowly (the report says both)."""

    def __init__(self):
        self.best_return = -math.inf
        self.warned = False
        self._run: list[float] = []  # entropy fractions of the iterations in a row so far

    def message(self, learner: dict, episode_return: float | None, config) -> str | None:
        if self.warned or episode_return is None or not math.isfinite(episode_return):
            return None
        self.best_return = max(self.best_return, episode_return)
        fraction = read_metric(learner, "entropy_fraction_of_max")
        fallen = episode_return < DEAD_RETURN_FRACTION * self.best_return
        # A positive best only: a task whose returns are all negative has no "far below".
        if fraction is None or not self.best_return > 0 or not fallen:
            self._run = []
            return None
        if not fraction < DEAD_ENTROPY_FRACTION or (self._run and fraction > 2 * self._run[0]):
            self._run = []
            return None
        self._run.append(fraction)
        if len(self._run) < DEAD_POLICY_ITERATIONS:
            return None
        self.warned = True
        coeff = config.entropy_coeff
        return (
            f"The policy has collapsed: its entropy is {fraction:.2g} of the maximum for the "
            f"last {DEAD_POLICY_ITERATIONS} iterations while the return fell to "
            f"{episode_return:.4g} from a best of {self.best_return:.4g}. It takes (nearly) one "
            "action everywhere: the others are no longer sampled and a saturated softmax passes "
            "almost no gradient, so the updates barely move it: it may stay there for the rest "
            "of the run, or climb back slowly. Causes: nothing keeps the policy stochastic "
            f"(entropy_coeff={coeff!r}) and updates large enough to saturate it. Fixes: "
            "training(entropy_coeff=...) above 0 (e.g. 0.01, or a schedule that ends above 0), "
            "a smaller training(lr=...) or a schedule that anneals it; restore an earlier "
            "checkpoint to go on."
        )
