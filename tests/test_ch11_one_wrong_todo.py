"""One bug costs one TODO in chapter 11: a scheduler half right but for
``get_num_new_matched_tokens`` keeps ``build_connector_meta``'s hidden points, since its hidden
check lends the course's lookup where the learner's class fails; and the admission is checked
with connectors that are none of the learner's, so a wrong scheduler half costs it nothing."""

from __future__ import annotations

import pytest
from mutants.ch11 import MUTANTS

from autograder.hidden import ch11 as hidden
from course.v1.offloading_connector import OffloadingConnectorScheduler


def _ids(todo: str) -> list:
    return [pytest.param(mutant, id=mutant.__name__.strip("_")) for mutant, _ in MUTANTS[todo]]


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize("mutant", _ids("get_num_new_matched_tokens"))
def test_a_wrong_lookup_costs_build_connector_meta_nothing(mutant):
    learners = type("OffloadingConnectorScheduler", (OffloadingConnectorScheduler,),
                    {"get_num_new_matched_tokens": mutant})
    hidden.check_build_connector_meta_thoroughly(learners)


def test_without_the_lending_a_wrong_lookup_changes_the_engines_orders():
    """Else the lending above would be proved on mutants whose bug never reaches
    ``build_connector_meta``'s check: half of them change its loads and saves in a run that
    loads (the other half only in cases the run does not reach)."""
    run = hidden._loading_run(2, 32, 2)
    reached = 0
    for mutant, _ in MUTANTS["get_num_new_matched_tokens"]:
        learners = type("OffloadingConnectorScheduler", (OffloadingConnectorScheduler,),
                        {"get_num_new_matched_tokens": mutant})
        try:
            hidden._same_metadata(learners, run)
        except AssertionError:
            reached += 1
    assert reached >= len(MUTANTS["get_num_new_matched_tokens"]) // 2
