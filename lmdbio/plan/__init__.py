"""Who reads which records when: epoch orders, shuffles and last-batch policies.

Everything here is a pure function of the job's parameters, so every rank computes the same
plan without communication (see :mod:`lmdbio.plan.epoch`).
"""

from lmdbio.plan.epoch import (
    LAST_POLICIES,
    SHUFFLE_MODES,
    EpochPlan,
    block_order,
    iterations_per_epoch,
    job_epochs,
    permutation,
    plan_epoch,
)

__all__ = [
    "LAST_POLICIES",
    "SHUFFLE_MODES",
    "EpochPlan",
    "block_order",
    "iterations_per_epoch",
    "job_epochs",
    "permutation",
    "plan_epoch",
]
