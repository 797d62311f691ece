"""Do the heads actually specialize? Role scores against nulls, causal selectivity, redundancy,
cross-seed consistency, and a verdict generated from the numbers.

The seeds warn that heads are not guaranteed distinct roles, that some are redundant or useless,
and that an attention map is a clue, not an explanation. This package turns each warning into a
measurement: one sub-package per question, a leaf of settings below them and an orchestration
floor above them (each layer imports only the ones before it; ``tests/test_architecture.py``
checks it):

====================  ======================================================================
``settings``          :class:`SpecializationSettings` and :class:`DivisionSettings`: every
                      threshold, validated; one family (the division's derive from the
                      labels'). ``nulls``: the names of the nulls, for the text
``where/``            where a head looks: role scores against the permutation null
                      (``roles``), the initialisation null and the combined p-values
                      (``nulls``)
``needed/``           whether it is needed: dead (``dead``), backed up by similar heads
                      (``redundancy``: pairs, and groups of 3 or more)
``whom/``             whom it serves: head x target damage and causal selectivity
                      (``causal``), :func:`division_of_labour` (``division``: token,
                      position, target class, target, against a null that keeps head
                      function)
``verdict/``          one label per head (``labels``: dead > backed up > role > unspecialized,
                      and the flags), the sentences, their stability under every threshold
                      (:func:`label_stability`, :func:`division_stability`), and
                      :class:`SpecializationResult` with save/load (``result``)
``seeds/``            over seeds: :func:`combine_results` and :func:`attach_division`
                      (``combine``), cross-seed consistency, the summary vs h
``run_analysis``      one run's tables and verdict
``battery``           :func:`specialization_test`: the tables, labels and verdict of runs
``folders``           :func:`sweep_specialization` (specialization, redundancy and accuracy
                      vs h) and :func:`specialize_folder` (compute and save what a report
                      reads)
``headline``          :func:`headline_stability`: does the verdict sentence survive moving
                      every gate
====================  ======================================================================

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> result = specialization_test(handbuilt_model(["previous", "uniform", "dead"]), task)
    >>> result.heads["label"].tolist()
    ['previous', 'unspecialized', 'dead']

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``attribution``, ``capture``, ``config``, ``data``, ``errors``,
``heads``, ``io``, ``model``, ``pretrained``, ``protocol``, ``provenance``, ``render``, ``runs``,
``runtime``, ``scoring``, ``similarity``, ``stats``, ``sweep``, ``tasks``, ``training``,
``validation``.
"""

from mhainterp.specialization.battery import specialization_test
from mhainterp.specialization.folders import (
    SweepSpecialization,
    cached_specialization,
    saved_specialization,
    specialize_folder,
    sweep_specialization,
)
from mhainterp.specialization.headline import headline_stability
from mhainterp.specialization.needed.redundancy import (
    redundancy_groups,
    redundancy_pairs,
    redundant_under,
    similar_groups,
)
from mhainterp.specialization.seeds.combine import attach_division, combine_results
from mhainterp.specialization.seeds.consistency import (
    cross_seed_consistency,
    profile_similarity,
    role_profiles,
)
from mhainterp.specialization.seeds.summary import specialization_summary, summary_columns
from mhainterp.specialization.settings import THRESHOLDS, DivisionSettings, SpecializationSettings
from mhainterp.specialization.verdict.labels import (
    LABELS_OTHER,
    decide_labels,
    label_heads,
    mixed_roles,
    role_targets,
)
from mhainterp.specialization.verdict.result import HEAD_COLUMNS, RUN_COLUMNS, SpecializationResult
from mhainterp.specialization.verdict.sentences import RunVerdict, Verdict
from mhainterp.specialization.verdict.stability import (
    division_stability,
    label_stability,
    stability_summary,
)
from mhainterp.specialization.where.nulls import (
    combine_nulls,
    init_models,
    init_null_pool,
    init_null_scores,
    init_null_summary,
    init_p_values,
    matched_seeds,
)
from mhainterp.specialization.where.roles import (
    DESCRIPTIVE_ROLES,
    GENERIC_ROLES,
    base_relation,
    generic_templates,
    nested_roles,
    permutation_null_samples,
    role_scores,
    role_templates,
)
from mhainterp.specialization.whom.causal import (
    CausalSelectivity,
    TargetDamage,
    causal_selectivity,
    model_selectivity,
    selectivity_index,
    target_damage,
)
from mhainterp.specialization.whom.division import division_of_labour
from mhainterp.specialization.whom.division_result import DivisionResult, saved_division
from mhainterp.stats import CORRECTIONS, adjust_pvalues, benjamini_hochberg, holm

__all__ = [
    "CORRECTIONS",
    "DESCRIPTIVE_ROLES",
    "GENERIC_ROLES",
    "HEAD_COLUMNS",
    "LABELS_OTHER",
    "RUN_COLUMNS",
    "THRESHOLDS",
    "CausalSelectivity",
    "DivisionResult",
    "RunVerdict",
    "SpecializationResult",
    "DivisionSettings",
    "SpecializationSettings",
    "SweepSpecialization",
    "TargetDamage",
    "Verdict",
    "adjust_pvalues",
    "attach_division",
    "decide_labels",
    "division_stability",
    "label_stability",
    "redundant_under",
    "stability_summary",
    "benjamini_hochberg",
    "cached_specialization",
    "causal_selectivity",
    "combine_nulls",
    "combine_results",
    "cross_seed_consistency",
    "division_of_labour",
    "generic_templates",
    "holm",
    "init_models",
    "init_null_pool",
    "init_null_scores",
    "init_null_summary",
    "init_p_values",
    "label_heads",
    "matched_seeds",
    "mixed_roles",
    "model_selectivity",
    "nested_roles",
    "permutation_null_samples",
    "profile_similarity",
    "redundancy_groups",
    "redundancy_pairs",
    "similar_groups",
    "role_profiles",
    "base_relation",
    "role_scores",
    "role_targets",
    "role_templates",
    "selectivity_index",
    "specialization_summary",
    "summary_columns",
    "specialization_test",
    "saved_division",
    "saved_specialization",
    "headline_stability",
    "specialize_folder",
    "sweep_specialization",
    "target_damage",
]
