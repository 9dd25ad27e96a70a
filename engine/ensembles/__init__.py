"""Random ensembles (Garrison, DAC'24): an application's ensemble policy (`policy`), the per-query draw and
the frequency table of the sampler (`sampling`), the weighted vote (`vote`), query-size ranges (`sizes`)
and the schedulers with the learned scheduler's state and reward (`scheduler`). Pure: the router, the
simulator and the learned scheduler's environment use these same functions."""
from pathlib import Path

from engine.ensembles.policy import (
    ENSEMBLE_MODES,
    ENSEMBLE_VOTES,
    EnsembleError,
    EnsembleMember,
    EnsemblePolicy,
    ensemble_policy_from_dict,
    ensemble_policy_to_dict,
    ensemble_policy_validate,
)
from engine.ensembles.sampling import (
    SamplingFrequencies,
    ensemble_complete,
    ensemble_draw,
    ensemble_size_draw,
    inclusion_probabilities,
    randomness_bias,
)
from engine.ensembles.sizes import QuerySizeRange, query_size_ranges
from engine.ensembles.vote import EnsembleVoteResult, ensemble_vote

# Trained scheduler policies that ship with Tessera (`tessera scheduler train` writes here by default).
POLICIES_DIR = Path(__file__).resolve().parent / "policies"

__all__ = [
    "POLICIES_DIR",
    "ENSEMBLE_MODES", "ENSEMBLE_VOTES", "EnsembleError", "EnsembleMember", "EnsemblePolicy", "EnsembleVoteResult",
    "SamplingFrequencies", "ensemble_complete", "ensemble_draw", "ensemble_policy_from_dict", "ensemble_policy_to_dict",
    "ensemble_policy_validate", "ensemble_size_draw", "ensemble_vote", "inclusion_probabilities", "randomness_bias",
    "QuerySizeRange", "query_size_ranges",
]
