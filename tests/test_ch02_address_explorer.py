"""The address-translation explorer's widget state (its in-browser rendering is a browser test)."""

from __future__ import annotations

import re

import pytest

from course.notebook.address_explorer import address_explorer
from course.v0.block_tables import locate, slot_id


def _hooks(html: str) -> dict[str, str]:
    root = re.search(r'<div class="kv-address-explorer"([^>]*)>', html).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', root))


@pytest.mark.parametrize(("position", "logical", "offset", "physical", "slot"), [
    (0, 0, 0, 5, 20), (6, 1, 2, 2, 10), (11, 2, 3, 9, 39),
])
def test_moving_the_slider_follows_the_position_to_its_slot(position, logical, offset,
                                                            physical, slot):
    explorer = address_explorer([5, 2, 9], 4, 12, locate, slot_id)
    slider, view = explorer.children
    assert (slider.min, slider.max) == (0, 11)
    slider.value = position
    assert _hooks(view.value) == {"position": str(position), "logical-block": str(logical),
                                  "offset": str(offset), "physical-block": str(physical),
                                  "slot": str(slot)}
    assert view.value.count('class="here"') == 3  # the position, its table entry, its slot


def test_a_failing_learner_function_is_shown_not_raised():
    def broken(position, block_table, block_size):
        raise KeyError("oops")

    explorer = address_explorer([5, 2, 9], 4, 12, broken, slot_id)
    assert 'data-error="1"' in explorer.children[1].value
    assert "KeyError" in explorer.children[1].value


def test_a_table_naming_blocks_outside_the_pool_is_refused():
    with pytest.raises(ValueError, match="only 4 blocks"):
        address_explorer([5, 2, 9], 4, 4, locate, slot_id)
