"""networks.py: shapes, dtypes, the params layout, preprocessing, determinism, compile count."""

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core.networks import Networks, is_channel_first, make_networks

SMALL_MLP = {"fcnet_hiddens": [8, 8]}
CARTPOLE = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
PENDULUM = (gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,)))
ATARI = (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))


def _obs(space, n, seed=0):
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return jnp.asarray(rng.integers(0, space.n, size=(n,)), jnp.int32)
    if space.dtype == np.uint8:
        return jnp.asarray(rng.integers(0, 256, size=(n, *space.shape)), jnp.uint8)
    return jnp.asarray(rng.normal(size=(n, *space.shape)), jnp.float32)


def _check_outputs(nets: Networks, obs, n, p):
    # Under jit: one compile is much cheaper than op-by-op dispatch for the Atari convs.
    params = jax.jit(nets.init)(jax.random.key(0))
    dist_inputs, value = jax.jit(nets.apply)(params, obs)
    assert nets.dist_size == p
    assert dist_inputs.shape == (n, p) and dist_inputs.dtype == jnp.float32
    assert value.shape == (n,) and value.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(dist_inputs))) and bool(jnp.all(jnp.isfinite(value)))
    return params, dist_inputs, value


def test_cartpole_shapes_and_params_layout():
    nets = make_networks(SMALL_MLP, *CARTPOLE)
    params, _, _ = _check_outputs(nets, _obs(CARTPOLE[0], 5), 5, 2)
    assert set(params) == {"encoder", "pi", "vf"}
    assert params["encoder"]["Dense_0"]["kernel"].shape == (4, 8)


def test_default_config_is_rllibs():
    # An empty config gives RLlib's default [256, 256] tanh MLP.
    nets = make_networks({}, *CARTPOLE)
    params = nets.init(jax.random.key(0))
    assert params["encoder"]["Dense_0"]["kernel"].shape == (4, 256)
    assert params["encoder"]["Dense_1"]["kernel"].shape == (256, 256)
    dist_inputs, value = nets.apply(params, _obs(CARTPOLE[0], 3))
    assert dist_inputs.shape == (3, 2) and value.shape == (3,)


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_atari_shapes(encoder):
    nets = make_networks({"encoder": encoder}, *ATARI)
    params, _, _ = _check_outputs(nets, _obs(ATARI[0], 2), 2, 6)
    # envpool's (4, 84, 84) is channel-first: the first conv sees 4 input channels.
    assert params["encoder"]["Conv_0"]["kernel"].shape[2] == 4


def test_mlp_encoder_flattens_images():
    # encoder="mlp" on frames: one row of 4 * 84 * 84 / 255-scaled pixels per observation (it
    # used to run the dense layers over the last image axis and return [N, 84, 84, 6] logits).
    nets = make_networks({"encoder": "mlp", "fcnet_hiddens": [8]}, *ATARI)
    obs = _obs(ATARI[0], 3)
    params, dist_inputs, _ = _check_outputs(nets, obs, 3, 6)
    kernel = params["encoder"]["Dense_0"]["kernel"]
    assert kernel.shape == (4 * 84 * 84, 8)
    x = np.asarray(obs, np.float32).reshape(3, -1) / 255.0
    features = np.tanh(x @ np.asarray(kernel) + np.asarray(params["encoder"]["Dense_0"]["bias"]))
    pi = params["pi"]
    pi_layer = pi[sorted(pi)[-1]]
    want = features @ np.asarray(pi_layer["kernel"]) + np.asarray(pi_layer["bias"])
    np.testing.assert_allclose(np.asarray(dist_inputs), want, rtol=2e-4, atol=1e-5)


def test_auto_encoder_picks_nature_cnn_for_images():
    nets = make_networks({}, *ATARI)
    params = jax.eval_shape(nets.init, jax.random.key(0))
    assert params["encoder"]["Conv_0"]["kernel"].shape == (8, 8, 4, 32)
    assert params["encoder"]["Dense_0"]["kernel"].shape == (7 * 7 * 64, 512)


@pytest.mark.parametrize("shape", [(10, 5), (2, 3, 4, 5), ()])
def test_auto_encoder_flattens_what_is_not_an_image(shape):
    # bsuite's Catch (10, 5) and DeepSea (8, 8) boards are 2-D: "auto" flattens them for the
    # MLP (it used to raise and ask for encoder="mlp").
    space = gym.spaces.Box(-1.0, 1.0, shape, np.float32)
    nets = make_networks({"fcnet_hiddens": [8]}, space, gym.spaces.Discrete(3))
    params, _, _ = _check_outputs(nets, _obs(space, 2), 2, 3)
    assert params["encoder"]["Dense_0"]["kernel"].shape == (int(np.prod(shape)), 8)


def test_conv_filters_override_and_channel_last_images():
    obs_space = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
    nets = make_networks(
        {"conv_filters": [[4, 4, 2], [8, 3, 1]]}, obs_space, gym.spaces.Discrete(3)
    )
    params, _, _ = _check_outputs(nets, _obs(obs_space, 2), 2, 3)
    assert params["encoder"]["Conv_0"]["kernel"].shape == (4, 4, 3, 4)
    assert params["encoder"]["Conv_1"]["kernel"].shape == (3, 3, 4, 8)
    # RLlib's default padding for given filters is "same": 16 -> 8 -> 8.
    assert params["encoder"]["Dense_0"]["kernel"].shape == (8 * 8 * 8, 512)


def test_conv_filters_take_rllibs_full_spec():
    obs_space = gym.spaces.Box(0, 255, (16, 12, 3), np.uint8)
    filters = [[4, [4, 3], [2, 1], "valid"], [8, 3, 2, "same"]]
    nets = make_networks({"conv_filters": filters}, obs_space, gym.spaces.Discrete(3))
    params, _, _ = _check_outputs(nets, _obs(obs_space, 2), 2, 3)
    assert params["encoder"]["Conv_0"]["kernel"].shape == (4, 3, 3, 4)
    # valid: (16 - 4) // 2 + 1 = 7, (12 - 3) // 1 + 1 = 10; then same, stride 2: 4 x 5.
    assert params["encoder"]["Dense_0"]["kernel"].shape == (4 * 5 * 8, 512)


def test_channel_first_rule():
    assert is_channel_first((4, 84, 84))
    assert is_channel_first((3, 64, 64))
    assert not is_channel_first((84, 84, 4))
    assert not is_channel_first((64, 64, 3))
    assert not is_channel_first((4,))


def test_channel_first_matches_transposed_channel_last():
    cf_space = gym.spaces.Box(0, 255, (2, 12, 12), np.uint8)
    cl_space = gym.spaces.Box(0, 255, (12, 12, 2), np.uint8)
    config = {"encoder": "impala_cnn", "impala_cnn_channels": [4]}
    cf = make_networks(config, cf_space, gym.spaces.Discrete(2))
    cl = make_networks(config, cl_space, gym.spaces.Discrete(2))
    params = cf.init(jax.random.key(1))
    obs = _obs(cf_space, 2)
    out_cf = cf.apply(params, obs)
    out_cl = cl.apply(params, jnp.transpose(obs, (0, 2, 3, 1)))
    chex.assert_trees_all_close(out_cf, out_cl, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("free_log_std", [False, True])
def test_box_actions(free_log_std):
    nets = make_networks({**SMALL_MLP, "free_log_std": free_log_std}, *PENDULUM)
    params, dist_inputs, _ = _check_outputs(nets, _obs(PENDULUM[0], 4), 4, 2)
    head_out = params["pi"]["Dense_0"]["kernel"].shape[-1]
    if free_log_std:
        assert head_out == 1
        np.testing.assert_array_equal(params["pi"]["log_std"], np.zeros(1))
        # State-independent: every row has the same log_std, the parameter's value.
        params["pi"]["log_std"] = jnp.asarray([-0.7])
        dist_inputs, _ = nets.apply(params, _obs(PENDULUM[0], 4))
        np.testing.assert_allclose(dist_inputs[:, 1], -0.7, rtol=1e-6)
    else:
        assert head_out == 2
        assert "log_std" not in params["pi"]


def test_log_std_is_clipped():
    nets = make_networks({**SMALL_MLP, "free_log_std": True, "log_std_clip_param": 2.0}, *PENDULUM)
    params = nets.init(jax.random.key(0))
    params["pi"]["log_std"] = jnp.asarray([-50.0])
    dist_inputs, _ = nets.apply(params, _obs(PENDULUM[0], 3))
    np.testing.assert_allclose(dist_inputs[:, 1], -2.0)


def test_head_hiddens():
    nets = make_networks({**SMALL_MLP, "head_fcnet_hiddens": [5]}, *CARTPOLE)
    params, _, _ = _check_outputs(nets, _obs(CARTPOLE[0], 2), 2, 2)
    assert params["pi"]["MLP_0"]["Dense_0"]["kernel"].shape == (8, 5)
    assert params["vf"]["MLP_0"]["Dense_0"]["kernel"].shape == (8, 5)


def test_post_fcnet_hiddens_follow_the_encoder():
    # RLlib's old-stack key (its tuned Pong example passes it): the dense layers after a CNN's
    # flatten, in place of its own dense layer, as in RLlib's old-stack vision network.
    nets = make_networks({"post_fcnet_hiddens": [6], "post_fcnet_activation": "tanh"}, *ATARI)
    params, _, _ = _check_outputs(nets, _obs(ATARI[0], 2), 2, 6)
    assert params["encoder"]["Dense_0"]["kernel"].shape == (7 * 7 * 64, 6)  # no dense 512
    assert "Dense_1" not in params["encoder"]
    assert params["pi"]["Dense_0"]["kernel"].shape[0] == 6
    # tanh, not the convs' relu: features can be negative.
    _, _, features = nets.apply(params, _obs(ATARI[0], 8), with_features=True)
    assert float(jnp.min(features)) < 0.0
    flat = make_networks({"post_fcnet_hiddens": []}, *ATARI)
    params, _, _ = _check_outputs(flat, _obs(ATARI[0], 2), 2, 6)
    assert not any(k.startswith("Dense") for k in params["encoder"])
    assert params["pi"]["Dense_0"]["kernel"].shape[0] == 7 * 7 * 64
    # After the MLP encoder they are added on top.
    small = make_networks({**SMALL_MLP, "post_fcnet_hiddens": [3, 5]}, *CARTPOLE)
    params, _, _ = _check_outputs(small, _obs(CARTPOLE[0], 2), 2, 2)
    assert params["encoder"]["post"]["Dense_1"]["kernel"].shape == (3, 5)
    assert params["vf"]["Dense_0"]["kernel"].shape[0] == 5


def _count(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def _dense(n_in, n_out):
    return n_in * n_out + n_out


def _conv(c_in, c_out, k):
    return k * k * c_in * c_out + c_out


MINATAR = (gym.spaces.Box(0, 1, (10, 10, 4), np.bool_), gym.spaces.Discrete(3))


@pytest.mark.parametrize(
    "name, model_config, spaces, expected",
    [
        # Mnih et al. 2015 (Methods): three convs (VALID), dense 512, then the outputs; the
        # policy's 6 logits and the value.
        (
            "nature",
            {"encoder": "nature_cnn"},
            ATARI,
            _conv(4, 32, 8)
            + _conv(32, 64, 4)
            + _conv(64, 64, 3)
            + _dense(7 * 7 * 64, 512)
            + _dense(512, 6)
            + _dense(512, 1),
        ),
        # Young & Tian 2019 (MinAtar): one 3x3 conv of 16 channels, stride 1, VALID on the 10x10
        # grid (8x8 out), dense 128, then the outputs: 132,308 params for Breakout's 3 actions.
        (
            "minatar",
            {
                "encoder": "nature_cnn",
                "conv_filters": [[16, 3, 1, "valid"]],
                "post_fcnet_hiddens": [128],
            },
            MINATAR,
            _conv(4, 16, 3) + _dense(8 * 8 * 16, 128) + _dense(128, 3) + _dense(128, 1),
        ),
        # Espeholt et al. 2018 (fig. 3): 3 stacks of conv + 2 residual blocks, dense 256.
        (
            "impala",
            {"encoder": "impala_cnn"},
            ATARI,
            sum(_conv(c_in, c, 3) + 4 * _conv(c, c, 3) for c_in, c in [(4, 16), (16, 32), (32, 32)])
            + _dense(11 * 11 * 32, 256)
            + _dense(256, 6)
            + _dense(256, 1),
        ),
        # PureJaxRL's MinAtar MLP (64-64) on the flattened grid, policy and value sharing it.
        (
            "mlp",
            {"encoder": "mlp", "fcnet_hiddens": [64, 64], "fcnet_activation": "relu"},
            MINATAR,
            _dense(400, 64) + _dense(64, 64) + _dense(64, 3) + _dense(64, 1),
        ),
    ],
)
def test_documented_networks_have_their_param_counts(name, model_config, spaces, expected):
    params = make_networks(model_config, *spaces).init(jax.random.key(0))
    assert _count(params) == expected, name


def test_separate_value_encoder_does_not_touch_policy():
    nets = make_networks({**SMALL_MLP, "vf_share_layers": False}, *CARTPOLE)
    params = nets.init(jax.random.key(0))
    assert set(params) == {"encoder", "pi", "vf", "vf_encoder"}
    # Everything of the value function, and only that, is under a key starting with "vf".
    assert [k for k in params if k.startswith("vf")] == ["vf", "vf_encoder"]
    obs = _obs(CARTPOLE[0], 3)
    logits, value = nets.apply(params, obs)
    changed = dict(params)
    changed["vf_encoder"] = jax.tree.map(lambda x: x + 1.0, params["vf_encoder"])
    logits2, value2 = nets.apply(changed, obs)
    np.testing.assert_array_equal(logits, logits2)
    assert not np.allclose(value, value2)


def test_shared_encoder_moves_both_outputs():
    nets = make_networks(SMALL_MLP, *CARTPOLE)
    params = nets.init(jax.random.key(0))
    obs = _obs(CARTPOLE[0], 3)
    logits, value = nets.apply(params, obs)
    changed = dict(params)
    changed["encoder"] = jax.tree.map(lambda x: x + 0.5, params["encoder"])
    logits2, value2 = nets.apply(changed, obs)
    assert not np.allclose(logits, logits2) and not np.allclose(value, value2)


def test_uint8_observations_are_scaled_inside():
    obs_space = gym.spaces.Box(0, 255, (2, 10, 10), np.uint8)
    nets = make_networks({"conv_filters": [[4, 3, 1]]}, obs_space, gym.spaces.Discrete(2))
    params = nets.init(jax.random.key(0))
    obs = _obs(obs_space, 2)
    out_uint8 = nets.apply(params, obs)
    out_float = nets.apply(params, obs.astype(jnp.float32) / 255.0)
    chex.assert_trees_all_close(out_uint8, out_float, rtol=1e-5, atol=1e-6)


def test_layernorm_and_activation_options():
    config = {"fcnet_hiddens": [6], "fcnet_use_layernorm": True, "fcnet_activation": "relu"}
    nets = make_networks(config, *CARTPOLE)
    params, _, _ = _check_outputs(nets, _obs(CARTPOLE[0], 2), 2, 2)
    assert "LayerNorm_0" in params["encoder"]


def test_discrete_observations_are_one_hot():
    obs_space = gym.spaces.Discrete(7)
    nets = make_networks(SMALL_MLP, obs_space, gym.spaces.Discrete(3))
    params, _, _ = _check_outputs(nets, _obs(obs_space, 4), 4, 3)
    assert params["encoder"]["Dense_0"]["kernel"].shape == (7, 8)
    # One-hot: observation k reads row k of the first kernel.
    params["encoder"]["Dense_0"]["kernel"] = jnp.zeros((7, 8)).at[2].set(1.0)
    a = nets.apply(params, jnp.asarray([2, 3], jnp.int32))[0]
    b = nets.apply(params, jnp.asarray([2, 2], jnp.int32))[0]
    np.testing.assert_array_equal(a[0], b[1])
    assert not np.allclose(a[0], a[1])


def test_init_is_deterministic_for_a_key():
    nets = make_networks({**SMALL_MLP, "vf_share_layers": False}, *CARTPOLE)
    chex.assert_trees_all_equal(nets.init(jax.random.key(3)), nets.init(jax.random.key(3)))
    a, b = nets.init(jax.random.key(3)), nets.init(jax.random.key(4))
    assert not np.allclose(a["encoder"]["Dense_0"]["kernel"], b["encoder"]["Dense_0"]["kernel"])


def test_small_policy_output_init():
    nets = make_networks(SMALL_MLP, *CARTPOLE)
    params = nets.init(jax.random.key(0))
    # Orthogonal with scale 0.01 for the policy output, 1.0 for the value output.
    assert float(jnp.abs(params["pi"]["Dense_0"]["kernel"]).max()) <= 0.01 + 1e-6
    np.testing.assert_allclose(jnp.linalg.norm(params["vf"]["Dense_0"]["kernel"]), 1.0, rtol=1e-5)


def test_apply_compiles_once_per_shape():
    nets = make_networks(SMALL_MLP, *CARTPOLE)
    params = nets.init(jax.random.key(0))
    apply = jax.jit(chex.assert_max_traces(nets.apply, n=1))
    for seed in range(3):
        apply(params, _obs(CARTPOLE[0], 4, seed))


@pytest.mark.parametrize(
    "config,spaces,match",
    [
        ({"use_lstm": True}, CARTPOLE, "recurrent.make_recurrent_networks"),
        ({"encoder": "resnet"}, CARTPOLE, "encoder"),
        ({"encoder": "nature_cnn"}, CARTPOLE, "nature_cnn"),
        ({"fcnet_activation": "gelu_tanh_x"}, CARTPOLE, "fcnet_activation"),
        ({}, (gym.spaces.MultiDiscrete([2, 3]), gym.spaces.Discrete(2)), "MultiDiscrete"),
        ({}, (CARTPOLE[0], gym.spaces.MultiBinary(3)), "MultiBinary"),
        ({}, (CARTPOLE[0], gym.spaces.Box(-1, 1, (2, 2))), "Box"),
    ],
)
def test_errors(config, spaces, match):
    with pytest.raises(ValueError, match=match):
        make_networks(config, *spaces)


def test_wrong_observation_shape_raises():
    nets = make_networks(SMALL_MLP, *CARTPOLE)
    params = nets.init(jax.random.key(0))
    with pytest.raises(ValueError, match="shape"):
        nets.apply(params, jnp.zeros((2, 5)))


def _kernels(params):
    return [x for path, x in jax.tree_util.tree_leaves_with_path(params) if "kernel" in str(path)]


def test_zeros_initializer_gives_zero_weights():
    config = {**SMALL_MLP, "fcnet_kernel_initializer": "zeros_", "fcnet_bias_initializer": "ones_"}
    params = make_networks(config, *CARTPOLE).init(jax.random.key(0))
    for layer in params["encoder"].values():
        np.testing.assert_array_equal(layer["kernel"], 0.0)
        np.testing.assert_array_equal(layer["bias"], 1.0)
    # The heads keep impala_jax's own init.
    assert float(jnp.abs(params["vf"]["Dense_0"]["kernel"]).max()) > 0


@pytest.mark.parametrize("name", ["orthogonal_", "Orthogonal", "orthogonal"])
def test_orthogonal_initializer_with_gain(name):
    config = {
        "fcnet_hiddens": [16, 16],
        "fcnet_kernel_initializer": name,
        "fcnet_kernel_initializer_kwargs": {"gain": 3.0},
    }
    params = make_networks(config, *CARTPOLE).init(jax.random.key(0))
    w = params["encoder"]["Dense_1"]["kernel"]
    np.testing.assert_allclose(w.T @ w, 9.0 * np.eye(16), atol=1e-4)


def test_initializer_distributions_match_torch_and_tf():
    def std(name, kwargs=None, hiddens=(256,)):
        config = {
            "fcnet_hiddens": list(hiddens),
            "fcnet_kernel_initializer": name,
            "fcnet_kernel_initializer_kwargs": kwargs,
        }
        obs = gym.spaces.Box(-1, 1, (256,), np.float32)
        params = make_networks(config, obs, gym.spaces.Discrete(2)).init(jax.random.key(0))
        return float(np.std(params["encoder"]["Dense_0"]["kernel"]))

    # torch: xavier_uniform_ bound gain * sqrt(6 / (in + out)), std = bound / sqrt(3).
    np.testing.assert_allclose(std("xavier_uniform_", {"gain": 2.0}), 2 / np.sqrt(256), rtol=0.02)
    # torch: kaiming_normal_ with relu: std = sqrt(2 / fan_in).
    kaiming = std("kaiming_normal_", {"nonlinearity": "relu"})
    np.testing.assert_allclose(kaiming, np.sqrt(2 / 256), rtol=0.02)
    np.testing.assert_allclose(std("normal_", {"mean": 0.0, "std": 0.3}), 0.3, rtol=0.02)
    # tf: RandomNormal's default stddev is 0.05; HeNormal is variance scaling 2 / fan_in.
    np.testing.assert_allclose(std("RandomNormal"), 0.05, rtol=0.02)
    np.testing.assert_allclose(std("HeNormal"), np.sqrt(2 / 256), rtol=0.03)


def test_head_initializer_and_layernorm():
    config = {
        **SMALL_MLP,
        "head_fcnet_hiddens": [4],
        "head_fcnet_use_layernorm": True,
        "head_fcnet_kernel_initializer": "constant_",
        "head_fcnet_kernel_initializer_kwargs": {"val": 0.25},
    }
    nets = make_networks(config, *CARTPOLE)
    params, _, _ = _check_outputs(nets, _obs(CARTPOLE[0], 2), 2, 2)
    for head in ("pi", "vf"):
        assert set(params[head]["MLP_0"]["LayerNorm_0"]) == {"scale", "bias"}
        for kernel in _kernels(params[head]):
            np.testing.assert_array_equal(kernel, 0.25)
    assert "LayerNorm_0" not in params["encoder"]


def test_conv_initializer_reaches_every_cnn_layer():
    obs_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    config = {
        "encoder": "impala_cnn",
        "impala_cnn_channels": [4],
        "conv_kernel_initializer": "zeros",
    }
    params = make_networks(config, obs_space, gym.spaces.Discrete(2)).init(jax.random.key(0))
    kernels = _kernels(params["encoder"])
    assert len(kernels) == 6  # conv, 2 x 2 residual convs, dense
    assert all(not np.any(k) for k in kernels)


def test_callable_initializer_is_a_jax_initializer():
    config = {**SMALL_MLP, "fcnet_kernel_initializer": jax.nn.initializers.ones}
    params = make_networks(config, *CARTPOLE).init(jax.random.key(0))
    np.testing.assert_array_equal(params["encoder"]["Dense_0"]["kernel"], 1.0)


@pytest.mark.parametrize(
    "config,match",
    [
        ({"fcnet_kernel_initializer": "sparse_"}, "not an initializer"),
        (
            {
                "fcnet_kernel_initializer": "orthogonal_",
                "fcnet_kernel_initializer_kwargs": {"g": 1},
            },
            "g",
        ),
        ({"fcnet_bias_initializer": "xavier_uniform_"}, "bias"),
        ({"fusionnet_hiddens": [64]}, "fusionnet"),
    ],
)
def test_initializer_errors(config, match):
    with pytest.raises(ValueError, match=match):
        make_networks({**SMALL_MLP, **config}, *CARTPOLE)


def test_mlp_without_hidden_layers():
    """fcnet_hiddens=[] (accepted by the config checks): the heads read the observation."""
    nets = make_networks({"fcnet_hiddens": []}, *CARTPOLE)
    params, _, _ = _check_outputs(nets, _obs(CARTPOLE[0], 3), 3, 2)
    assert params["encoder"] == {} and params["pi"]["Dense_0"]["kernel"].shape == (4, 2)
