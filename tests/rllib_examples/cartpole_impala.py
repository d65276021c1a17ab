"""RLlib's tuned example rllib/tuned_examples/impala/cartpole_impala.py, written the same way
(its own argument parser at module level, RLlib's runner under ``__main__``), with the IMPALAConfig
import swapped and the sizes cut down for a test."""

from ray.rllib.utils.test_utils import add_rllib_example_script_args

from impala_jax import IMPALAConfig  # RLlib: from ray.rllib.algorithms.impala import IMPALAConfig

parser = add_rllib_example_script_args(
    default_reward=450.0,
    default_timesteps=2000000,
)
parser.set_defaults(enable_new_api_stack=True)
# Use `parser` to add your own custom command line options to this script
# and (if needed) use their values to set up `config` below.
parser.add_argument("--hidden", type=int, default=8)
args = parser.parse_args()


config = (
    IMPALAConfig()
    .environment("CartPole-v1")
    .env_runners(
        num_env_runners=args.num_env_runners or 0,
        num_envs_per_env_runner=args.num_envs_per_env_runner or 4,
        rollout_fragment_length=8,
    )
    .training(
        train_batch_size_per_learner=64,
        grad_clip=40.0,
        grad_clip_by="global_norm",
        lr=0.0005 * ((args.num_learners or 1) ** 0.5),
        vf_loss_coeff=0.05,
        entropy_coeff=0.0,
    )
    .rl_module(model_config={"fcnet_hiddens": [args.hidden], "vf_share_layers": True})
    .reporting(min_time_s_per_iteration=0)
)


if __name__ == "__main__":
    from ray.rllib.utils.test_utils import run_rllib_example_script_experiment

    run_rllib_example_script_experiment(config, args)
