"""Evaluation: pass@k / best@k (unbiased, exact), maj@k, verl-named validation metrics and
reference-answer perplexity."""

from rljax.evaluation.pass_at_k import expected_max_at_k, expected_min_at_k, pass_at_k, pass_at_k_array
from rljax.evaluation.perplexity import nll_sums, perplexity, perplexity_from_sums
from rljax.evaluation.validation import prompt_metrics, sample_sizes, validation_metrics
from rljax.evaluation.voting import maj_at_k, majority_vote

__all__ = [
    "expected_max_at_k",
    "expected_min_at_k",
    "maj_at_k",
    "majority_vote",
    "nll_sums",
    "pass_at_k",
    "pass_at_k_array",
    "perplexity",
    "perplexity_from_sums",
    "prompt_metrics",
    "sample_sizes",
    "validation_metrics",
]
