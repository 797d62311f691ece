"""Ablation methods and division axes are registries: one registration (a fourth method,
Gaussian noise from a fixed generator; a fifth axis, the query position's parity) reaches every
table, column list, CLI default, the report and the explorer, with no other file touched; the
built-ins' derived column lists keep the order the saved tables have always had."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from mhainterp.ablation import METHODS, head_importance
from mhainterp.ablation.replacement import Replacement, build_replacement, register_method
from mhainterp.analyze.tables import ablation_tables
from mhainterp.attribution import attribution_patching
from mhainterp.cli import build_parser
from mhainterp.cli import static as cli_static
from mhainterp.config import TrainConfig
from mhainterp.explore import Explorer
from mhainterp.model.handbuilt import split_heads_model
from mhainterp.report import write_report
from mhainterp.specialization import DivisionResult, division_of_labour, specialize_folder
from mhainterp.specialization.seeds.combine import verdict_division_columns
from mhainterp.specialization.seeds.summary import findings_measures, summary_columns
from mhainterp.specialization.settings import DivisionSettings
from mhainterp.specialization.whom.division_result import index_columns, text_columns
from mhainterp.tasks import AXES, DivisionAxis, get_task, register_axis, split_batch
from mhainterp.training import build_model, evaluate, save_run
from mhainterp.validation import ParameterError

N_EVAL = 32


class GaussianNoise(Replacement):
    """z replaced by standard normal noise, the same at every call (per layer and position)."""

    name = "gaussian"
    help = "the head's z set to standard normal noise (a fixed generator)"
    needs_reference = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @classmethod
    def build(cls, reference, generator):
        return cls(0 if generator is None else generator.initial_seed())

    def values(self, layer, rows, z):
        draw = torch.Generator().manual_seed(1000 * self.seed + layer)
        noise = torch.randn(z.shape[1:], generator=draw)  # (T, h, d_head): a prefix per T
        return noise.to(device=z.device, dtype=z.dtype)[None]


PARITY = DivisionAxis(
    "parity",
    "whether the query position is even or odd",
    lambda batch, i, t, j: t % 2,
    lambda value, target_names: ("even", "odd")[value],
    title="position parity",
)


@pytest.fixture
def extended():
    """The registries with the Gaussian method and the parity axis, restored afterwards."""
    with METHODS.temporary(), AXES.temporary():
        register_method(GaussianNoise)
        register_axis(PARITY)
        yield


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=8, d_vocab=10)


@pytest.fixture(scope="module")
def model(task):
    return build_model(task, d_model=16, n_heads=4, seed=0)


# ----------------------------------------------------------------------------- the built-ins


def test_builtin_column_lists_keep_their_order():
    """The derived lists equal the hand-written ones the saved tables have always had."""
    assert list(METHODS) == ["zero", "mean", "resample"]
    assert list(AXES) == ["token", "position", "target_class", "target"]
    per_method = [
        *("index_mean", "index_zero", "index_resample", "call_mean", "call_zero"),
        *("call_resample", "null_index_mean", "null_index_zero", "null_index_resample"),
        *("null_high_mean", "null_high_zero", "null_high_resample"),
    ]
    assert index_columns()[16:28] == per_method
    assert index_columns()[:2] == ["by", "index"] and index_columns()[-3] == "n_groups"
    assert index_columns()[-2:] == ["explained_by", "index_explained"]
    assert len(index_columns()) == 35
    assert verdict_division_columns()[8:14] == tuple(per_method[:6])
    assert verdict_division_columns()[-3:] == ("n_damaging", "explained_by", "index_explained")
    assert text_columns()[-3:] == ("call_zero", "call_mean", "call_resample")
    division = [c for c in summary_columns() if c.startswith("division_")]
    assert division[0] == "division_token_mean" and division[-1] == "division_target_basis"
    assert len(division) == 4 * 8
    assert [m[0] for m in findings_measures()][-4:] == [f"division_{a}" for a in AXES]


def test_the_cli_mirror_is_the_registry_until_then():
    assert list(cli_static.ablation_methods().items()) == [(n, m.help) for n, m in METHODS.items()]
    assert list(cli_static.division_axes().items()) == [(n, a.help) for n, a in AXES.items()]


def test_a_registration_is_checked_and_a_temporary_one_undone():
    with METHODS.temporary():
        register_method(GaussianNoise)
        with pytest.raises(ParameterError, match="a name not registered yet"):
            register_method(GaussianNoise)
        assert list(METHODS)[-1] == "gaussian"
    assert "gaussian" not in METHODS and list(METHODS) == ["zero", "mean", "resample"]
    with pytest.raises(ParameterError, match="subclass of Replacement"):
        register_method(object)
    with pytest.raises(ParameterError, match=r"method='gaussian' is invalid: one of 'zero'"):
        METHODS["gaussian"]


def test_a_method_without_values_is_refused_by_name():
    class Opaque(Replacement):
        name, help, needs_reference = "opaque", "no values of its own", False

    with METHODS.temporary(), pytest.raises(ParameterError, match="method='opaque' is invalid"):
        register_method(Opaque)
    assert "opaque" not in METHODS


def test_a_method_says_how_many_reference_sequences_it_needs(model, task):
    class Triples(GaussianNoise):
        name, help, needs_reference, min_sequences = "triples", "needs 3", True, 3

    with METHODS.temporary():
        register_method(Triples)
        message = r"reference is invalid: at least 3 sequences for method='triples', got 2"
        with pytest.raises(ParameterError, match=message):
            build_replacement(model, "triples", task.eval_batch(2))
        assert isinstance(build_replacement(model, "triples", task.eval_batch(3)), Triples)


# ----------------------------------------------------------------------------- one more of each


def test_head_importance_and_the_ablation_tables_take_the_new_method(extended, model, task):
    table = head_importance(model, task, method="gaussian", n_eval=N_EVAL)
    assert set(table["method"]) == {"gaussian"} and len(table) == 4
    again = head_importance(model, task, method="gaussian", n_eval=N_EVAL)
    pd.testing.assert_frame_equal(table, again)  # the fixed generator
    zero = head_importance(model, task, method="zero", n_eval=N_EVAL)
    assert not table["delta_loss"].equals(zero["delta_loss"])
    tables = ablation_tables(model, task, n_eval=N_EVAL)  # every registered method by default
    assert list(dict.fromkeys(tables["importance"]["method"])) == list(METHODS)
    assert list(METHODS)[-1] == "gaussian"


def test_attribution_asks_each_method_for_a_closed_form(extended, model, task):
    alone = attribution_patching(model, task, ("zero",), n_eval=N_EVAL)  # closed form
    mixed = attribution_patching(model, task, ("zero", "gaussian"), n_eval=N_EVAL)  # general
    assert list(dict.fromkeys(mixed["method"])) == ["zero", "gaussian"]
    general = mixed[mixed["method"] == "zero"]["attribution"].to_numpy()
    assert general == pytest.approx(alone["attribution"].to_numpy(), rel=1e-4, abs=1e-7)
    assert mixed[mixed["method"] == "gaussian"]["attribution"].abs().sum() > 0


def test_the_division_tables_and_combine_columns_take_both(extended, tmp_path):
    # Head 0 answers the queries 0-3, head 1 the queries 4-8: the token axis is divided under
    # the three built-ins; noise in place of a head's z leaves both heads' answers standing
    # half the time, so under the new method it is not, and the combined call says so.
    model = split_heads_model([("query", [0, 1, 2, 3]), ("query", [4, 5, 6, 7, 8])], seq_len=8)
    result = division_of_labour(
        model, split_batch(N_EVAL, seq_len=8), "token,parity", n_bootstrap=10
    )
    assert list(result.index.columns) == index_columns()
    assert {"index_gaussian", "call_gaussian", "null_index_gaussian"} <= set(index_columns())
    token, parity = (row for _, row in result.index.iterrows())
    assert (token.by, parity.by) == ("token", "parity")
    assert [token[f"call_{m}"] for m in METHODS] == ["divided"] * 3 + ["not divided"]
    assert token.call == "method-dependent" and parity.call == "not divided"
    assert token.index_gaussian == pytest.approx(0.054, abs=0.01)
    assert set(result.profiles.query("by == 'parity'")["value"]) == {"even", "odd"}
    assert DivisionSettings().methods == ("mean", "zero", "resample", "gaussian")
    result.save(tmp_path)
    loaded = DivisionResult.load(tmp_path)
    assert list(loaded.index.columns) == index_columns()
    assert {"index_gaussian", "call_gaussian"} <= set(verdict_division_columns())
    assert "division_parity_mean" in summary_columns()
    assert ("division_parity", "division index by parity", "whom") in findings_measures()


def test_the_cli_defaults_and_help_take_both(extended, capsys):
    parser = build_parser()
    args = parser.parse_args(["specialize", "some_run", "--ablation-method", "gaussian"])
    assert args.ablation_method == "gaussian"
    assert args.by == "token,position,target_class,target,parity"
    ablate = parser.parse_args(["ablate", "some_run", "--method", "gaussian"])
    assert ablate.method == "gaussian"
    with pytest.raises(SystemExit):
        parser.parse_args(["specialize", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "gaussian: the head's z set to standard normal noise" in shown
    assert "parity: whether the query position is even or odd" in shown


def test_the_report_and_the_explorer_take_both(extended, model, task, tmp_path):
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    saved = {**evaluate(model, task, n_eval=N_EVAL), "status": "finished"}
    run = save_run(model, task, tmp_path / "run", TrainConfig(steps=1), metrics, saved)
    specialize_folder(run, n_eval=N_EVAL, progress=False, by=("parity",))
    index = pd.read_csv(run / "analysis" / "division_index.csv")
    assert list(index["by"]) == ["parity"] and "index_gaussian" in index.columns
    md_path, _ = write_report(run, tmp_path / "report", n_eval=N_EVAL)
    md = md_path.read_text(encoding="utf-8")
    assert "by parity" in md

    explorer = Explorer.from_model(model, task, n_eval=N_EVAL, method="gaussian")
    state = explorer.state()
    assert state["methods"] == ["zero", "mean", "resample", "gaussian"]
    assert state["axes"][-1] == {"key": "parity", "name": "position parity"}
    by_parity = explorer.session.metrics()["by"]["parity"]
    assert [row["key"] for row in by_parity] == ["even", "odd"]
    importance = explorer.session.importance("gaussian")
    assert len(importance) == 4 and all(math.isfinite(v) for v in importance.values())
