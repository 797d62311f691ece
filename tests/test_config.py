"""Tests of mhainterp.config: derived fields, validation messages, JSON round trips."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformer_lens.config import TransformerLensConfig

from mhainterp.config import ModelConfig, SweepConfig, TrainConfig, config_to_dict
from mhainterp.validation import ParameterError


def json_round_trip(d: dict) -> dict:
    return json.loads(json.dumps(d))


# ----- ModelConfig ------------------------------------------------------------------------------
def test_issue_example_works_without_d_head():
    cfg = ModelConfig(
        d_model=64, n_heads=4, n_layers=1, n_ctx=16, d_vocab=10, d_vocab_out=16,
        causal=False, attn_only=True,
    )  # fmt: skip
    assert isinstance(cfg, TransformerLensConfig)
    assert (cfg.d_head, cfg.d_vocab_out, cfg.n_targets) == (16, 16, 1)
    assert (cfg.causal, cfg.attn_only, cfg.normalization_type) == (False, True, None)
    assert cfg.d_mlp == 4 * 64  # filled by TransformerLensConfig


@pytest.mark.parametrize(
    ("d_model", "n_heads", "d_head"),
    [(64, 1, 64), (64, 4, 16), (64, 8, 8), (64, 16, 4), (48, 3, 16)],
)
def test_d_head_is_derived(d_model, n_heads, d_head):
    assert ModelConfig(d_model=d_model, n_heads=n_heads).d_head == d_head
    assert ModelConfig(d_model=d_model, n_heads=n_heads, d_head=d_head).d_head == d_head


def test_d_vocab_out_defaults_to_d_vocab():
    assert ModelConfig(d_vocab=7).d_vocab_out == 7
    assert ModelConfig(d_vocab=7, d_vocab_out=11).d_vocab_out == 11


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 16])
def test_attention_parameter_count_property(n_heads):
    assert ModelConfig(d_model=64, n_heads=n_heads).n_attn_params == 16_640


def test_n_heads_not_dividing_d_model_names_n_heads_and_lists_allowed_values():
    message = "n_heads=5 is invalid: a divisor of d_model=64: one of [1, 2, 4, 8, 16, 32, 64]"
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(d_model=64, n_heads=5)
    with pytest.raises(ValueError, match=re.escape("one of [1, 2, 3, 4, 6, 12]")):
        ModelConfig(d_model=12, n_heads=5)


def test_d_head_disagreeing_with_d_model_over_n_heads_raises():
    message = "d_head=8 is invalid: d_model // n_heads = 16 (or omitted)"
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(d_model=64, n_heads=4, d_head=8)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 0}, "d_model=0 is invalid: an integer >= 1"),
        ({"n_heads": 0}, "n_heads=0 is invalid: an integer >= 1"),
        ({"n_layers": 0}, "n_layers=0 is invalid: an integer >= 1"),
        ({"n_ctx": -3}, "n_ctx=-3 is invalid: an integer >= 1"),
        ({"d_vocab": 0}, "d_vocab=0 is invalid: an integer >= 1"),
        ({"n_targets": 0}, "n_targets=0 is invalid: an integer >= 1"),
        ({"n_heads": 4.0}, "n_heads=4.0 is invalid: an integer >= 1"),
        ({"n_layers": True}, "n_layers=True is invalid: an integer >= 1"),
        (
            {"seed": 1.5},
            "seed=1.5 is invalid: an integer >= 0 and <= 9223372036854775807 (2**63 - 1)",
        ),
        ({"d_vocab_out": 0}, "d_vocab_out=0 is invalid: an integer >= 1"),
        (
            {"normalization_type": "RMS"},
            "normalization_type='RMS' is invalid: one of None, 'LN'",
        ),
        ({"act_fn": "tanh"}, "act_fn='tanh' is invalid: one of 'relu', 'gelu'"),
        ({"positional_embedding_type": "rotary"}, "positional_embedding_type='rotary' is invalid"),
        ({"n_key_value_heads": 2}, "n_key_value_heads=2 is invalid: None (grouped-query attention"),
        ({"d_mlp": 0, "attn_only": False}, "d_mlp=0 is invalid: an integer >= 1"),
    ],
)
def test_invalid_model_fields_raise_value_error_naming_field_and_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(**kwargs)


def test_float_d_head_is_rejected():
    with pytest.raises(ValueError, match=r"d_head=16\.0 is invalid"):
        ModelConfig(d_model=64, n_heads=4, d_head=16.0)


@pytest.mark.parametrize("field", ["causal", "attn_only"])
def test_non_bool_flags_are_rejected(field):
    with pytest.raises(ValueError, match=rf"{field}='no' is invalid"):
        ModelConfig(**{field: "no"})


def test_dtype_may_be_given_by_name():
    assert ModelConfig(dtype="float64").dtype == torch.float64
    assert ModelConfig(dtype="torch.float64").dtype == torch.float64
    assert ModelConfig().dtype == torch.float32


def test_to_dict_from_dict_json_round_trip():
    cfg = ModelConfig(
        d_model=48, n_heads=3, n_layers=2, n_ctx=12, d_vocab=7, d_vocab_out=9, n_targets=3,
        causal=True, attn_only=False, normalization_type="LN", act_fn="gelu", seed=5,
        dtype=torch.float64, device="cpu",
    )  # fmt: skip
    d = cfg.to_dict()
    assert d["dtype"] == "float64" and d["d_head"] == 16 and d["n_targets"] == 3
    rebuilt = ModelConfig.from_dict(json_round_trip(d))
    assert rebuilt == cfg
    assert rebuilt.to_dict() == d
    assert rebuilt.dtype == torch.float64
    assert config_to_dict(cfg) == d
    assert repr(cfg).startswith('ModelConfig({"act_fn": "gelu"')


def test_from_dict_rejects_unknown_fields_listing_allowed_ones():
    d = ModelConfig().to_dict() | {"n_head": 4}
    with pytest.raises(
        ValueError, match=r"ModelConfig keys=\['n_head'\] is invalid: only .*'n_heads'"
    ):
        ModelConfig.from_dict(d)


def test_torch_device_is_json_serialisable():
    cfg = ModelConfig(device=torch.device("cpu"))
    assert json_round_trip(cfg.to_dict())["device"] == "cpu"
    assert "ModelConfig(" in repr(cfg)


# ----- TrainConfig ------------------------------------------------------------------------------
def test_train_config_defaults_and_json_round_trip():
    cfg = TrainConfig(steps=500, lr=1e-3, betas=[0.8, 0.95], grad_clip=None, seed=3)
    assert cfg.betas == (0.8, 0.95)  # lists become tuples, as after a JSON round trip
    assert cfg.batch_size == 128 and cfg.lr_schedule == "cosine"
    rebuilt = TrainConfig.from_dict(json_round_trip(cfg.to_dict()))
    assert rebuilt == cfg
    assert config_to_dict(cfg) == cfg.to_dict()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps=0 is invalid: an integer >= 1"),
        ({"steps": 10.0}, "steps=10.0 is invalid: an integer >= 1"),
        ({"batch_size": 0}, "batch_size=0 is invalid: an integer >= 1"),
        ({"lr": 0.0}, "lr=0.0 is invalid: a finite number > 0"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1 is invalid: a finite number >= 0"),
        (
            {"steps": 10, "warmup_steps": 20},
            "warmup_steps=20 is invalid: an integer >= 0 and <= 10",
        ),
        (
            {"lr_schedule": "linear"},
            "lr_schedule='linear' is invalid: one of 'constant', 'cosine'",
        ),
        ({"grad_clip": 0.0}, "grad_clip=0.0 is invalid: a finite number > 0"),
        ({"betas": (0.9, 1.0)}, "betas=(0.9, 1.0) is invalid: two numbers in [0, 1)"),
        ({"eval_every": -1}, "eval_every=-1 is invalid: an integer >= 0"),
        ({"log_every": 0}, "log_every=0 is invalid: an integer >= 1"),
    ],
)
def test_invalid_train_fields_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**kwargs)


@pytest.mark.parametrize("field", ["lr", "weight_decay", "grad_clip"])
def test_non_numeric_train_fields_name_the_field(field):
    with pytest.raises(ValueError, match=rf"{field}='x' is invalid"):
        TrainConfig(**{field: "x"})


def test_train_config_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"TrainConfig keys=\['step'\] is invalid: only .*'steps'"):
        TrainConfig.from_dict({"step": 10})


# ----- SweepConfig ------------------------------------------------------------------------------
def test_sweep_config_counts_runs_and_round_trips_through_json():
    cfg = SweepConfig(
        task="reverse", task_params={"seq_len": 8}, n_heads=[1, 4, 8], seeds=[0, 1, 2],
        model={"d_model": 64, "n_layers": 2}, train={"steps": 100, "warmup_steps": 10},
    )  # fmt: skip
    assert cfg.n_runs == 9
    assert isinstance(cfg.train, TrainConfig) and cfg.train.steps == 100
    d = cfg.to_dict()
    assert d["train"]["steps"] == 100
    rebuilt = SweepConfig.from_dict(json_round_trip(d))
    assert rebuilt == cfg
    assert config_to_dict(cfg) == d


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"n_heads": [3, 4]},
            "n_heads=[3, 4] is invalid: head counts that divide d_model; [3] do not divide "
            "d_model=64",
        ),
        (
            {"n_heads": [2, 3], "model": {"d_model": 10}},
            "[3] do not divide d_model=10",
        ),
        (
            {"n_heads": []},
            "n_heads=[] is invalid: a non-empty list of head counts, each an integer >= 1",
        ),
        (
            {"n_heads": [4, 4]},
            "n_heads=[4, 4] is invalid: a list of distinct head counts, each an integer >= 1 "
            "(no repeats)",
        ),
        (
            {"seeds": [0, 0]},
            "seeds=[0, 0] is invalid: a list of distinct seeds, each in [0, 9223372036854775807]",
        ),
        (
            {"seeds": []},
            "seeds=[] is invalid: a non-empty list of seeds, each in [0, 9223372036854775807]",
        ),
        (
            {"model": {"n_heads": 4}},
            "model['n_heads']=4 is invalid: not given: it is set per run by the sweep",
        ),
        (
            {"model": {"seed": 1}},
            "model['seed']=1 is invalid: not given: it is set per run by the sweep",
        ),
        ({"train": {"steps": 0}}, "steps=0 is invalid"),
    ],
)
def test_invalid_sweep_fields_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SweepConfig(**kwargs)


def test_sweep_config_rejects_unknown_model_fields():
    with pytest.raises(ValueError, match=r"d_modle"):
        SweepConfig(model={"d_modle": 64})


# ----- ranges (issue 19 item 7): seeds must fit torch's int64 ------------------------------------
@pytest.mark.parametrize("seed", [2**63, 2**64, -1])
def test_seeds_outside_torch_int64_are_refused_by_every_config(seed):
    message = f"seed={seed} is invalid: an integer >= 0 and <= 9223372036854775807 (2**63 - 1)"
    with pytest.raises(ParameterError, match=re.escape(message)):
        ModelConfig(seed=seed)
    with pytest.raises(ParameterError, match=re.escape(message)):
        TrainConfig(seed=seed)
    with pytest.raises(ParameterError, match=re.escape(f"seeds=[0, {seed}] is invalid")):
        SweepConfig(seeds=[0, seed])


def test_largest_seed_is_accepted_and_reaches_torch():
    assert ModelConfig(seed=2**63 - 1).seed == 2**63 - 1
    assert TrainConfig(seed=2**63 - 1).seed == 2**63 - 1


@pytest.mark.parametrize(("value", "message"), [(float("nan"), "lr=nan"), (float("inf"), "lr=inf")])
def test_non_finite_learning_rates_are_refused(value, message):
    with pytest.raises(
        ParameterError, match=re.escape(f"{message} is invalid: a finite number > 0")
    ):
        TrainConfig(lr=value)
