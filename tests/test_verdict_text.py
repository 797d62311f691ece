"""The verdict's sentences read the calibrated division calls of the contract (call, basis,
reason, CI, same-function null, p floor, per-method indices) and lead with one headline."""

from __future__ import annotations

import math

import pandas as pd

from mhainterp.render import format_p
from mhainterp.specialization import RunVerdict, Verdict
from mhainterp.specialization.verdict.division_words import axis_call, headline_call

NAN = math.nan


def _row(**changes):
    row = {
        "by": "position", "call": "divided", "basis": "kept",
        "reason": "every head is backed up; kept-head profiles: 0.41 vs 0.05",
        "index": 0.41, "ci_low": 0.35, "ci_high": 0.47, "null_index": 0.05, "null_high": 0.09,
        "p": 1 / 1001, "p_floor": 1 / 1001, "index_mean": 0.41, "index_zero": 0.38,
        "index_resample": 0.12, "call_mean": "divided", "call_zero": "divided",
        "call_resample": "not divided", "n_damaging": 0,
    }  # fmt: skip
    return {**row, **changes}


def _run(division, seed=0):
    return RunVerdict(run=f"r{seed}", task="reverse", n_heads=8, n_layers=1, seed=seed,
                      division=division)  # fmt: skip


def test_format_p_at_its_floor():
    assert format_p(1 / 1001, 1 / 1001) == "p < 0.001"
    assert format_p(0.004, 1 / 1001) == "p = 0.004"
    assert format_p(NAN) == "p n/a"


def test_a_kept_head_call_is_read_with_its_evidence():
    text = _run([_row()]).text
    assert (
        "Headline: the heads divide the work along position; basis: kept-head profiles under "
        "mean, zero and resample ablation." in text
    )
    assert (
        "by position divided (index 0.41 [95% CI 0.35, 0.47] vs same-function null's 95% "
        "quantile 0.09 (p < 0.001), on kept-head profiles)"
    ) in text


def test_method_dependent_shows_the_three_methods():
    row = _row(call="method-dependent")
    assert axis_call(row) == "method-dependent"
    text = _run([row]).text
    assert "depends on the ablation method" in text
    assert "by method: mean 0.41, zero 0.38, resample 0.12" in text


def test_zero_left_out_of_a_target_class_call_is_said():
    # Zero alone divides the target classes, mean does not: the call leaves zero out (the
    # default-class artefact), and the sentence says so with zero's index and its null.
    row = _row(by="target_class", call="not divided", index=0.0, ci_low=0.0, ci_high=0.01,
               index_mean=0.0, index_zero=0.56, null_high_zero=0.15, call_mean="not divided",
               call_zero="divided", call_resample="not divided")  # fmt: skip
    text = _run([row]).text
    assert "by target_class not divided (" in text
    assert "zero ablation left out of the call (its index 0.56 vs its null's 0.15)" in text
    assert "the default-class artefact" in text
    # A saved row from before (still "method-dependent") reads as it did.
    assert "left out" not in _run([{**row, "call": "method-dependent"}]).text


def test_cannot_tell_says_why():
    row = _row(call="cannot tell", index=NAN, ci_low=NAN, ci_high=NAN, basis="single",
               reason="fewer than 2 heads do damage and no kept profile decides")  # fmt: skip
    text = _run([row]).text
    assert "nan vs null nan" not in text
    assert (
        "by position cannot tell (undefined (fewer than 2 heads do damage); fewer than 2 heads "
        "do damage and no kept profile decides)"
    ) in text
    assert "Headline: cannot tell whether the heads divide the work" in text


def test_one_headline_per_head_count():
    runs = [_run([_row()], s) for s in range(2)] + [_run([_row(call="not divided")], 2)]
    assert Verdict(runs).headlines() == {
        "reverse": [
            "h=8 (8 heads, 3 seeds): the heads divide the work along position (2/3 seeds "
            "divided by position, index 0.41 ± 0.00 vs null q95 0.09 ± 0.00); basis: "
            "kept-head profiles under mean, zero and resample ablation."
        ]
    }
    assert headline_call({"token": "divided", "position": "method-dependent"}) == (
        "the heads divide the work along token (method-dependent along position)"
    )
    assert headline_call({"token": "not divided", "position": "cannot tell"}) == (
        "the heads do not divide the work along token (cannot tell along position)"
    )
    one = RunVerdict(run="r", task="t", n_heads=1, n_layers=1, seed=0)
    assert Verdict([one, one]).headline([one, one]).startswith("h=1 (1 head, 2 seeds)")


def test_seeds_split_between_two_calls_are_said_to_disagree_not_to_be_undefined():
    """6 seeds, every index defined, 3 divided and 3 not: no majority, and nothing undefined,
    so the group's call is "the seeds disagree" (with its counts), not "cannot tell ...
    (every axis undefined)". 3 divided and 3 undefined: "cannot tell", undefined in half the
    seeds."""
    split = [_run([_row(call="divided" if s < 3 else "not divided")], s) for s in range(6)]
    (line,) = Verdict(split).headlines()["reverse"]
    assert "the seeds disagree whether the heads divide the work along position" in line
    assert "3/6 seeds divided by position" in line and "undefined" not in line
    sentence = Verdict(split).group_sentence("reverse/8", split)
    assert "divided in 3/6 seeds: the seeds disagree whether the heads divide" in sentence
    half = [_run([_row(call="divided" if s < 3 else "cannot tell")], s) for s in range(6)]
    assert Verdict.group_calls(half) == {"position": "cannot tell"}
    (line,) = Verdict(half).headlines()["reverse"]
    assert "cannot tell whether the heads divide the work (no axis defined in most seeds)" in line
    undefined = [_run([_row(call="cannot tell")], s) for s in range(6)]  # as at h = 1
    (line,) = Verdict(undefined).headlines()["reverse"]
    assert "cannot tell whether the heads divide the work (every axis undefined)" in line
    assert headline_call({"token": "divided", "position": "seeds disagree"}, group=True) == (
        "the heads divide the work along token (the seeds disagree along position)"
    )


def test_per_head_findings_say_what_each_head_does_on_every_axis():
    import pandas as pd

    from mhainterp.model.handbuilt import handbuilt_model
    from mhainterp.specialization import attach_division, specialization_test
    from mhainterp.tasks import get_task

    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform", "dead"], d_head=18)
    result = specialization_test(model, task, n_eval=32, n_permutations=20)
    assert result.heads["finding"].tolist() == [
        "looks at previous; whom it serves not measured; needed",
        "looks at no known relation; whom it serves not measured; not needed",
        "dead",  # only that: it writes nothing and removing it costs nothing
    ]
    index = pd.DataFrame([_row(basis="single")])
    heads = pd.DataFrame({
        "head_label": ["L0H0", "L0H1", "L0H2"], "by": ["position"] * 3,
        "serves": ["1,2,3", "", ""], "specialized": [True, False, False],
    })  # fmt: skip
    attached = attach_division(result, index, heads)
    assert "Headline: the heads divide the work along position" in attached.verdict.text
    assert attached.heads["finding"].tolist() == [
        "looks at previous; serves position: 1,2,3; needed",
        "looks at no known relation; serves no subset shown; not needed",
        "dead",
    ]
    # The run's specialization.md: its per-head table leads with the finding, and its label
    # column and sentence say they are about where a head looks (issue 19 item 8: "divide the
    # work" above a table of "unspecialized" heads read as a contradiction).
    markdown = attached.to_markdown()
    header = next(line for line in markdown.splitlines() if line.startswith("| run |"))
    assert header.startswith("| run | head_label | finding | attention label |"), header
    assert "| looks at no known relation; serves no subset shown; not needed |" in markdown
    assert "1 unspecialized in where they look (L0H1)" in markdown


def test_an_axis_with_no_basis_names_none():
    """h = 1: every axis undefined, so no profile kind to name (was "basis: -head profiles")."""
    from mhainterp.specialization.verdict.division_words import basis_text as _basis_text

    assert _basis_text([{"by": "token", "basis": ""}, {"by": "position", "basis": ""}]) == ""
    assert _basis_text([{"basis": "kept"}, {"basis": ""}]) == "; basis: kept-head profiles"


def test_the_labels_count_only_the_backed_up_members_of_a_redundant_group():
    """A group lists the needed partners that carry a backed-up head's work: L0H1 backed up,
    L0H0, L0H2, L0H3 needed. The labels sentence says 1 backed up, as the needed sentence
    does, not the group's 4."""
    group = ["L0H0", "L0H1", "L0H2", "L0H3"]
    run = RunVerdict(
        run="r", task="reverse", n_heads=4, n_layers=1, seed=0, redundant_groups=[group],
        redundant_roles=["mirror"], backed_up=["L0H1"], needed=["L0H0", "L0H2", "L0H3"],
    )  # fmt: skip
    assert run.n_redundant == 1
    assert run.other_sentence().startswith("Labels: 1 backed up by a partner (L0H0 = L0H1")


def test_a_head_mixing_sink_roles_names_each_role_whole():
    """Role names hold "+" ("same_token+sink"), so mixed roles are listed with "and": joined
    by "+" they read "punctuation+sink+same_token+sink", four roles where there are two."""
    run = RunVerdict(
        run="r", task="text", n_heads=4, n_layers=1, seed=0, unspecialized=["L0H3"],
        mixed={"L0H3": "punctuation+sink;same_token+sink"},
    )  # fmt: skip
    assert "L0H3 mixes punctuation+sink and same_token+sink" in run.other_sentence()


def test_threshold_flips_read_as_counts_of_heads_and_shares_of_labels():
    """Per run, a threshold's flips are a count of heads ("backup_ratio: 2 heads"), never a
    bare number beside a threshold's name, which read as its value; over seeds, a share."""
    runs = [
        RunVerdict(
            run=f"r{seed}",
            task="reverse",
            n_heads=4,
            n_layers=1,
            seed=seed,
            flips={"backup_ratio": 2, "min_effect": 1},
            flip_heads=["L0H0", "L0H1"],
        )
        for seed in range(2)
    ]
    assert "(backup_ratio: 2 heads, min_effect: 1 head; heads L0H0, L0H1)" in runs[0].text
    sentence = Verdict(runs).group_sentence("reverse/4", runs)
    assert "(share per threshold: backup_ratio 0.50, min_effect 0.25)" in sentence


def test_a_perturbed_setting_without_its_ablations_is_named_as_not_tested():
    """On a pretrained model the looser similarity gate's pairs lie past the pair cap: its 1,155
    pair ablations were never run, so its "0 labels changed" showed nothing. Named, per
    setting, in the run's sentence and in the caveat, never "Labels are stable"."""
    from mhainterp.specialization.verdict.stability import flip_summary

    rows = pd.DataFrame(
        {
            "threshold": ["min_similarity", "min_similarity", "min_effect", "min_effect"],
            "factor": [0.8, 1.25, 0.8, 1.25],
            "changed": ["", "", "", ""],
            "n_untested": [1155, 0, 0, 0],
        }
    )
    summary = flip_summary(rows)
    assert summary["untested"] == {"min_similarity x 0.8": 1155}
    run = RunVerdict(run="r", task="text", n_heads=12, n_layers=6, seed=0, **summary)
    untested = (
        "not tested: min_similarity x 0.8 needs 1,155 pair or group ablations that were not "
        "run (counted as not redundant), so the labels are not shown to survive it"
    )
    assert run.stability_sentence() == (
        f"No label changes with a threshold x 0.8 or x 1.25 where tested ({untested})."
    )
    assert Verdict([run]).caveats[4].endswith(f"changes 0 of 72 head labels; {untested}.")
    assert "untested" not in RunVerdict(run="r", task="t", n_heads=1, n_layers=1, seed=0).to_dict()


def test_pretrained_wording_backed_up_by_groups_and_small_indices():
    """MiniLM's verdict said "14 backed up" and then "Labels: 0 backed up by a partner (none)";
    it asked a fixed checkpoint for ">= 3 seeds", kept a caveat on causal selectivity, which
    one target cannot have, and printed "index 0.01 [95% CI 0.01, 0.02] vs ... 0.01"."""
    row = {"by": "position", "call": "not divided", "index": 0.010521, "ci_low": 0.0098,
           "ci_high": 0.0151, "null_high": 0.0103, "p": 0.05, "basis": "single"}  # fmt: skip
    run = RunVerdict(
        run="m", task="text", n_heads=12, n_layers=6, seed=0, seed_shown=False,
        backed_up=["L1H0", "L2H3"], division=[row],
    )  # fmt: skip
    assert run.other_sentence().startswith(
        "Labels: 0 backed up by a partner (none), 2 more by a group of heads;"
    )
    assert "index 0.0105 [95% CI 0.0098, 0.0151] vs same-function null's 95% quantile 0.0103" in (
        run.text
    )
    caveats = Verdict([run]).caveats
    assert caveats[2].startswith("One pretrained checkpoint: there is no seed spread to know")
    assert caveats[3] == "Causal selectivity was not computed: every task here has one target."


def test_a_headline_names_every_divided_axis_through_chains_and_cycles():
    """Review: a follower of a follower vanished (token -> target_class -> position read
    "along position (target_class follows it)"), and so did a pair restating each other beside
    a division of its own ("along token" alone)."""
    divided = {"token": "divided", "position": "divided", "target_class": "divided"}
    chain = {"token": "target_class", "target_class": "position"}
    assert headline_call(divided, restated=chain) == (
        "the heads divide the work along position (token, target_class follow it in these data)"
    )
    pair = {"position": "target_class", "target_class": "position"}
    assert headline_call(divided, restated=pair) == (
        "the heads divide the work along token, position or target_class (these axes go "
        "together in the data: which one is not told apart)"
    )
    # a leader that is not divided leads nothing: the axis is a division of its own
    calls = {"position": "not divided", "target_class": "divided"}
    assert headline_call(calls, restated={"target_class": "position"}) == (
        "the heads divide the work along target_class"
    )


def test_the_restated_note_names_only_a_divided_leader():
    rows = [
        {"by": "position", "call": "not divided", "index": 0.015, "ci_low": 0.01,
         "ci_high": 0.02, "null_high": 0.02, "p": 0.3},
        {"by": "target_class", "call": "divided", "index": 0.2, "ci_low": 0.15, "ci_high": 0.25,
         "null_high": 0.05, "p": 0.001, "explained_by": "position", "index_explained": 0.3},
    ]  # fmt: skip
    run = RunVerdict(run="r", task="t", n_heads=4, n_layers=1, seed=0, division=rows)
    assert "may only restate" not in run.text
    rows[0].update(call="divided", index=0.5, ci_low=0.45, ci_high=0.55)
    assert "so this may only restate the division by position" in run.text
    # an interval above its index (a dispersion's bootstrap): the index itself is the bound
    rows[1].update(ci_low=0.35)
    assert "so this may only restate the division by position" in run.text
